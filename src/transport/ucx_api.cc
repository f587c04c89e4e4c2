// Implementation of transport/ucx_api.h: dlopen of UCX and the process's UCP context.
#include "transport/ucx_api.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/log.h"

namespace flyt::transport::ucx {
namespace {

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Folders that may hold a carried copy of UCX (tests/gpu/stage_build.sh puts it in
// lib/ucx/): beside flyt-server (bin/../lib/ucx) or beside the client library
// (lib/flyt/../ucx), wherever the object that holds this code lives.
std::vector<std::string> CandidateDirs() {
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("FLYT_UCX_LIB_DIR"); d != nullptr && *d != '\0') {
    dirs.emplace_back(d);
  }
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&CandidateDirs), &info) != 0 && info.dli_fname != nullptr &&
      info.dli_fname[0] == '/') {
    const std::string here = DirName(info.dli_fname);
    dirs.push_back(here + "/../lib/ucx");
    dirs.push_back(here + "/../ucx");
  }
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    dirs.push_back(DirName(exe) + "/../lib/ucx");
  }
  return dirs;
}

struct Loaded {
  std::once_flag libs_once;
  Status libs_status;
  void* ucp = nullptr;
  void* ucs = nullptr;
  std::string dir;
  std::once_flag context_once;
  Status context_status;
  Api api{};
};

Loaded& State() {
  static Loaded* loaded = new Loaded();  // never destroyed: UCX outlives atexit handlers
  return *loaded;
}

// Opens the UCX libraries from `dir`: dependencies first, by path, so that libucp's own
// DT_NEEDED entries (matched by soname) find them already loaded. libucm cannot go first
// (it calls into libucs, which needs it): libucs finds it through the DT_RPATH that
// flyt-server and libcuda.so.1 carry for lib/ucx/ (CMakeLists.txt), or the system's.
bool OpenFrom(const std::string& dir, Loaded* l, std::string* why) {
  for (const char* lib : {"libnuma.so.1", "libucs.so.0", "libuct.so.0"}) {
    const std::string path = dir + "/" + lib;
    if (IsFile(path) && ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
      *why = ::dlerror();
      return false;
    }
  }
  const std::string ucp = dir + "/libucp.so.0";
  const std::string ucs = dir + "/libucs.so.0";
  l->ucp = ::dlopen(ucp.c_str(), RTLD_NOW | RTLD_LOCAL);
  l->ucs = l->ucp != nullptr ? ::dlopen(ucs.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (l->ucp == nullptr || l->ucs == nullptr) {
    *why = ::dlerror();
    return false;
  }
  return true;
}

template <typename F>
bool Sym(void* lib, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  if (*out == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *out != nullptr;
}

Status LoadLibraries(Loaded* l) {
  // UCX logs to stdout unless told otherwise, and the client library must never write
  // there: send its messages to stderr, unless the user chose a place (read by libucs
  // when it loads, hence before the dlopen).
  if (std::getenv("UCX_LOG_FILE") == nullptr) ::setenv("UCX_LOG_FILE", "stderr", 0);
  std::string tried;
  for (const std::string& dir : CandidateDirs()) {
    if (!IsFile(dir + "/libucp.so.0")) continue;
    std::string why;
    if (OpenFrom(dir, l, &why)) {
      l->dir = dir;
      break;
    }
    tried += "; " + dir + ": " + why;
  }
  if (l->ucp == nullptr) {
    l->ucp = ::dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
    if (l->ucp != nullptr) l->ucs = ::dlopen("libucs.so.0", RTLD_NOW | RTLD_LOCAL);
  }
  if (l->ucp == nullptr || l->ucs == nullptr) {
    const char* err = ::dlerror();
    return Status::Error(
        std::string("ucx:// is not available: libucp.so.0 not found (install libucx0, or carry "
                    "lib/ucx/ beside bin/ as tests/gpu/stage_build.sh does, or set "
                    "FLYT_UCX_LIB_DIR)") +
        (err != nullptr ? std::string(": ") + err : "") + tried);
  }
  Api& a = l->api;
  std::string missing;
  Sym(l->ucp, "ucp_get_version", &a.get_version, &missing);
  Sym(l->ucp, "ucp_config_read", &a.config_read, &missing);
  Sym(l->ucp, "ucp_config_release", &a.config_release, &missing);
  Sym(l->ucp, "ucp_init_version", &a.init_version, &missing);
  Sym(l->ucp, "ucp_context_query", &a.context_query, &missing);
  Sym(l->ucp, "ucp_worker_create", &a.worker_create, &missing);
  Sym(l->ucp, "ucp_worker_destroy", &a.worker_destroy, &missing);
  Sym(l->ucp, "ucp_worker_get_address", &a.worker_get_address, &missing);
  Sym(l->ucp, "ucp_worker_release_address", &a.worker_release_address, &missing);
  Sym(l->ucp, "ucp_worker_progress", &a.worker_progress, &missing);
  Sym(l->ucp, "ucp_worker_get_efd", &a.worker_get_efd, &missing);
  Sym(l->ucp, "ucp_worker_arm", &a.worker_arm, &missing);
  Sym(l->ucp, "ucp_ep_create", &a.ep_create, &missing);
  Sym(l->ucp, "ucp_ep_close_nbx", &a.ep_close_nbx, &missing);
  Sym(l->ucp, "ucp_tag_send_nbx", &a.tag_send_nbx, &missing);
  Sym(l->ucp, "ucp_tag_probe_nb", &a.tag_probe_nb, &missing);
  Sym(l->ucp, "ucp_tag_msg_recv_nbx", &a.tag_msg_recv_nbx, &missing);
  Sym(l->ucp, "ucp_request_check_status", &a.request_check_status, &missing);
  Sym(l->ucp, "ucp_request_cancel", &a.request_cancel, &missing);
  Sym(l->ucp, "ucp_request_free", &a.request_free, &missing);
  Sym(l->ucs, "ucs_status_string", &a.status_string, &missing);
  Sym(l->ucp, "ucp_mem_map", &a.mem_map, &missing);
  Sym(l->ucp, "ucp_mem_unmap", &a.mem_unmap, &missing);
  Sym(l->ucp, "ucp_rkey_pack", &a.rkey_pack, &missing);
  Sym(l->ucp, "ucp_rkey_buffer_release", &a.rkey_buffer_release, &missing);
  Sym(l->ucp, "ucp_ep_rkey_unpack", &a.ep_rkey_unpack, &missing);
  Sym(l->ucp, "ucp_rkey_destroy", &a.rkey_destroy, &missing);
  Sym(l->ucp, "ucp_get_nbx", &a.get_nbx, &missing);
  Sym(l->ucp, "ucp_put_nbx", &a.put_nbx, &missing);
  Sym(l->ucp, "ucp_ep_flush_nbx", &a.ep_flush_nbx, &missing);
  a.ep_print_info =
      reinterpret_cast<decltype(a.ep_print_info)>(::dlsym(l->ucp, "ucp_ep_print_info"));
  if (!missing.empty()) {
    return Status::Error("ucx:// is not available: the UCX found (" +
                         (l->dir.empty() ? std::string("the system's") : l->dir) + ") lacks " +
                         missing + "; Flyt needs UCX 1.10 or newer");
  }
  unsigned major = 0, minor = 0, release = 0;
  a.get_version(&major, &minor, &release);
  a.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
  a.library_dir = l->dir;
  return Status::Ok();
}

Status CreateContext(Api* a) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = a->config_read(nullptr, nullptr, &config);  // UCX_* from the environment
  if (s != UCS_OK) return Status::Error("ucx: reading UCX_* settings: " + a->Why(s));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // RMA: the server reads and writes registered client memory (transport/ucx_rma.h).
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // each connection has its own worker, on its own thread
  s = a->init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &a->context);
  a->config_release(config);
  if (s != UCS_OK) {
    return Status::Error("ucx: cannot create a UCP context (UCX " + a->version + "): " + a->Why(s) +
                         " (check UCX_TLS / UCX_NET_DEVICES)");
  }
  // Which memory UCX can reach here: host always; CUDA only in a UCX built with it.
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  a->memory_types = a->context_query(a->context, &attr) == UCS_OK ? attr.memory_types
                                                                  : UCS_BIT(UCS_MEMORY_TYPE_HOST);
  FLYT_DEBUG("ucx: UCX %s from %s; memory types 0x%llx", a->version.c_str(),
             a->library_dir.empty() ? "the system" : a->library_dir.c_str(),
             static_cast<unsigned long long>(a->memory_types));
  return Status::Ok();
}

}  // namespace

bool WantPeerErrors() {
  const char* tls = std::getenv("UCX_TLS");
  if (tls == nullptr || *tls == '\0' || *tls == '^') return true;
  static const char* const kShared[] = {"sm",  "shm",  "posix", "sysv",
                                        "cma", "knem", "xpmem", "self"};
  std::string list(tls);
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, comma - at);
    bool shared = name.empty();
    for (const char* k : kShared) shared = shared || name == k;
    if (!shared) return true;
    at = comma + 1;
  }
  return false;
}

Status CheckWorkerAddress(const void* address, size_t n) {
  // The largest address worth trying (real ones are a few hundred bytes).
  constexpr size_t kMax = size_t{64} << 10;
  if (address == nullptr || n < 2 || n > kMax)
    return Status::Error("ucx: a worker address of " + std::to_string(n) + " bytes");
  // UCX 1.10 and later: version in the low 4 bits of the first byte, 0 (v1) or 1 (v2).
  const unsigned version = *static_cast<const uint8_t*>(address) & 0x0f;
  if (version > 1)
    return Status::Error("ucx: a worker address of format version " + std::to_string(version) +
                         " (not one UCX writes)");
  return Status::Ok();
}

Status CreateEndpoint(const Api& api, ucp_worker_h worker, const void* address, size_t n,
                      ucp_err_handler_cb_t cb, void* arg, const std::string& peer, ucp_ep_h* ep,
                      bool* peer_errors) {
  *ep = nullptr;
  Status st = CheckWorkerAddress(address, n);
  if (!st.ok()) return Status::Error(st.message() + " from " + peer);
  std::vector<uint8_t> padded(n + 4096, 0);
  std::memcpy(padded.data(), address, n);
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(padded.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = cb;
  p.err_handler.arg = arg;
  *peer_errors = true;
  if (!WantPeerErrors()) {
    p.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
    *peer_errors = false;
  }
  ucs_status_t s = api.ep_create(worker, &p, ep);
  if (s == UCS_ERR_UNREACHABLE && *peer_errors) {
    // UCX 1.13's shared-memory transports cannot report a failed peer; without that
    // guarantee they are usable, and the socket tells of the peer's death.
    p.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
    *peer_errors = false;
    s = api.ep_create(worker, &p, ep);
  }
  if (s != UCS_OK) {
    *ep = nullptr;
    return Status::Error("ucx: cannot reach " + peer + " over UCX: " + api.Why(s) +
                         " (do both sides allow a common transport? UCX_TLS)");
  }
  return Status::Ok();
}

Status CheckAvailable() {
  Loaded& l = State();
  std::call_once(l.libs_once, [&] { l.libs_status = LoadLibraries(&l); });
  return l.libs_status;
}

Status Get(const Api** out) {
  Status st = CheckAvailable();
  if (!st.ok()) return st;
  Loaded& l = State();
  std::call_once(l.context_once, [&] { l.context_status = CreateContext(&l.api); });
  if (!l.context_status.ok()) return l.context_status;
  *out = &l.api;
  return Status::Ok();
}

}  // namespace flyt::transport::ucx
