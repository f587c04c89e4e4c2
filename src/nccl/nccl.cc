// Flyt's libnccl.so.2: NCCL for programs whose GPUs are remote. Every call is
// run by the flyt-server of the communicator's GPU (server/session_nccl.cc)
// with NVIDIA's NCCL there, so a collective's bytes go between the GPU servers
// over NCCL's own transports, never through this process. Preloaded by
// `flyt run` (frameworks find NVIDIA's libnccl.so.2 through their RPATH).
//
// Owns: the communicators as this process sees them (the server's value, the
// server, rank, size and device, whether the app asked for blocking calls), the
// calling thread's NCCL group (which servers it touched, which communicators),
// and the last error's text. The servers make every communicator non-blocking
// (so that no server thread waits on other ranks); a blocking communicator's
// calls are made blocking here, by waiting until NCCL no longer answers
// ncclInProgress, as NCCL itself does in blocking mode.
// Must not: write to stdout, or call into libcuda other than through its Flyt
// table (common/nccl_abi.h) and the driver entry points named below.
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

extern char** environ;  // NOLINT: POSIX

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/nccl_abi.h"
#include "protocol/codec.h"
#include "protocol/ops.h"

#define FLYT_NCCL_API extern "C" __attribute__((visibility("default")))

namespace flyt::nccl {
namespace {

using wire::Reader;
using wire::Writer;

constexpr uint32_t kCommMagic = 0x46594e43;  // "FYNC"

// A communicator as the app holds it (ncclComm_t points at one).
struct Comm {
  uint32_t magic = kCommMagic;
  int server = 0;       // the server that runs it
  uint64_t remote = 0;  // its value there
  int nranks = 0, rank = 0;
  int device = 0;        // this process's ordinal of its GPU
  bool blocking = true;  // the app's mode; the server's is non-blocking
  // Splits and shrinks of this communicator NCCL is still making: the server's token
  // and the app's variable that gets the new communicator when it is made.
  struct Child {
    uint64_t token;
    void** out;
    bool blocking;
  };
  std::vector<Child> children;
  std::set<int> ops;  // its PreMulSum ops
};

// NCCL's data types (ncclInt8 .. ncclFloat8e5m2) and built-in reductions (ncclSum ..
// ncclAvg).
constexpr int kNumTypes = 12;
constexpr int kNumOps = 5;

void VLog(const char* fmt, va_list ap) {
  const char* level = std::getenv("FLYT_LOG");
  if (level != nullptr && std::strcmp(level, "off") == 0) return;
  char line[512];
  std::vsnprintf(line, sizeof line, fmt, ap);
  std::fprintf(stderr, "flyt-nccl: %s\n", line);
}

void Log(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VLog(fmt, ap);
  va_end(ap);
}

thread_local std::string t_last_error;

int Fail(int result, const char* fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  t_last_error = text;
  return result;
}

// Flyt's libcuda: its NCCL table and the driver entry points used here (by
// dlsym: the app's cudart may have opened libcuda.so.1 locally).
struct Libcuda {
  const Table* table = nullptr;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGetCount) device_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease_v2) primary_release = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set = nullptr;
  decltype(&::cuMemAlloc_v2) mem_alloc = nullptr;
  decltype(&::cuMemFree_v2) mem_free = nullptr;
};

template <typename F>
bool Resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

const Libcuda* Cuda() {
  static const Libcuda* cuda = []() -> const Libcuda* {
    using GetTable = CUresult (*)(const void**, const CUuuid*);
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_NOW);
    GetTable get = nullptr;
    const void* t = nullptr;
    CUuuid id;
    std::memcpy(id.bytes, kTableUuid, sizeof id.bytes);
    auto* c = new Libcuda;
    if (driver == nullptr || !Resolve(driver, "cuGetExportTable", &get) ||
        get(&t, &id) != CUDA_SUCCESS || t == nullptr ||
        static_cast<const Table*>(t)->size < sizeof(Table) ||
        !Resolve(driver, "cuInit", &c->init) ||
        !Resolve(driver, "cuDeviceGetCount", &c->device_count) ||
        !Resolve(driver, "cuDeviceGet", &c->device_get) ||
        !Resolve(driver, "cuDevicePrimaryCtxRetain", &c->primary_retain) ||
        !Resolve(driver, "cuDevicePrimaryCtxRelease_v2", &c->primary_release) ||
        !Resolve(driver, "cuCtxGetCurrent", &c->ctx_get) ||
        !Resolve(driver, "cuCtxSetCurrent", &c->ctx_set) ||
        !Resolve(driver, "cuMemAlloc_v2", &c->mem_alloc) ||
        !Resolve(driver, "cuMemFree_v2", &c->mem_free)) {
      delete c;
      Log("this libnccl.so.2 is Flyt's and needs Flyt's libcuda.so.1 (run the program with "
          "`flyt run`); NCCL calls fail with ncclSystemError");
      return nullptr;
    }
    c->table = static_cast<const Table*>(t);
    return c;
  }();
  return cuda;
}

const Table* Driver() {
  const Libcuda* c = Cuda();
  return c != nullptr ? c->table : nullptr;
}

void Append(void* opaque, const void* data, size_t n) {
  auto* v = static_cast<std::vector<uint8_t>*>(opaque);
  v->insert(v->end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
}

// One call to `server` (-1: the current device's). On return, *outs reads the
// call's outputs (when it ran), and the result is NCCL's (or why it did not run).
struct Reply {
  std::vector<uint8_t> bytes;
  size_t outs_at = 0;
  int server = 0;
  Reader Outs() const { return Reader(bytes.data() + outs_at, bytes.size() - outs_at); }
};

int SendOnce(int server, const Writer& req, Reply* reply, const char* name);

// The app's NCCL settings go to each server before its first NCCL call
// (nccl::ForwardedEnv says which), so that its NCCL runs as the app asked.
void SendEnvOnce(int server) {
  static std::atomic<uint64_t> sent{0};
  if (server < 0 || server >= 64 || (sent.load() >> server & 1) != 0) return;
  Writer w;
  w.Put<uint8_t>(ops::kNcclEnv);
  std::vector<std::pair<std::string, std::string>> vars;
  for (char** e = environ; e != nullptr && *e != nullptr && vars.size() < kMaxForwardedEnv; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr || eq - *e > 63) continue;
    std::string var(*e, static_cast<size_t>(eq - *e));
    if (ForwardedEnv(var.c_str()) && std::strlen(eq + 1) <= 1024) vars.emplace_back(var, eq + 1);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(vars.size()));
  for (const auto& [var, value] : vars) {
    w.PutString(var);
    w.PutString(value);
  }
  Reply r;
  // Sent again with the next call when this one did not reach the server.
  if (SendOnce(server, w, &r, "ncclGetVersion") == kSuccess) sent.fetch_or(uint64_t{1} << server);
}

// The current device's server (a default stream's).
int CurrentServer(const Table* t) {
  uint64_t unused = 0;
  return t != nullptr ? t->stream_server(nullptr, &unused) : 0;
}

int Send(int server, const Writer& req, Reply* reply, const char* name) {
  const Table* t = Driver();
  if (t == nullptr)
    return Fail(kSystemError, "%s: Flyt's libnccl.so.2 was loaded without Flyt's libcuda.so.1",
                name);
  if (server < 0) server = CurrentServer(t);
  SendEnvOnce(server);
  return SendOnce(server, req, reply, name);
}

int SendOnce(int server, const Writer& req, Reply* reply, const char* name) {
  const Table* t = Driver();
  reply->bytes.clear();
  CUresult rc = t->call(server, req.data(), req.size(), Append, &reply->bytes, &reply->server);
  if (rc != CUDA_SUCCESS)
    return Fail(rc == CUDA_ERROR_NOT_INITIALIZED ? kUnhandledCudaError : kSystemError,
                "%s: the call could not reach the GPU server (CUDA error %d)", name,
                static_cast<int>(rc));
  Reader r(reply->bytes.data(), reply->bytes.size());
  int32_t result = 0;
  std::string message;
  if (!r.Get(&result) || !r.GetString(&message, 1 << 16))
    return Fail(kInternalError, "%s: malformed reply from the GPU server", name);
  reply->outs_at = reply->bytes.size() - r.remaining();
  if (result != kSuccess && result != kInProgress)
    t_last_error = message.empty() ? std::string(name) + " failed on the GPU server" : message;
  return result;
}

Comm* CommOf(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  return c != nullptr && c->magic == kCommMagic ? c : nullptr;
}

// The thread's group: the servers it started one on, and the communicators its
// calls named (a blocking one is waited for at the end).
struct Group {
  int depth = 0;
  std::set<int> servers;
  std::vector<Comm*> comms;
};
thread_local Group t_group;

int WaitReady(Comm* c, const char* name);

// A call on `server` that a group may hold: the server's group is opened first.
int SendInGroup(int server, const Writer& req, Reply* reply, const char* name, Comm* c) {
  if (t_group.depth > 0 && t_group.servers.count(server) == 0) {
    Writer start;
    start.Put<uint8_t>(ops::kNcclGroupStart);
    Reply r;
    int rc = Send(server, start, &r, "ncclGroupStart");
    if (rc != kSuccess) return rc;
    t_group.servers.insert(server);
  }
  int rc = Send(server, req, reply, name);
  if (t_group.depth > 0) {
    if (c != nullptr) t_group.comms.push_back(c);
    return rc == kInProgress ? kSuccess : rc;
  }
  if (rc == kInProgress && c != nullptr && c->blocking) return WaitReady(c, name);
  return rc;
}

void ResolveChildren(Comm* parent);

int AsyncError(Comm* c, int* async) {
  Writer w;
  w.Put<uint8_t>(ops::kNcclAsyncError);
  w.Put<uint64_t>(c->remote);
  Reply r;
  int rc = Send(c->server, w, &r, "ncclCommGetAsyncError");
  if (rc != kSuccess) return rc;
  Reader o = r.Outs();
  int32_t v = 0;
  if (!o.Get(&v)) return Fail(kInternalError, "ncclCommGetAsyncError: malformed reply");
  *async = v;
  if (!c->children.empty()) ResolveChildren(c);
  return kSuccess;
}

// The pause between two polls of a communicator's state: 20 us, doubling up to 2 ms.
class Backoff {
 public:
  void Wait() {
    std::this_thread::sleep_for(pause_);
    if (pause_ < std::chrono::milliseconds(2)) pause_ *= 2;
  }

 private:
  std::chrono::microseconds pause_{20};
};

// Blocking mode: waits until the communicator's last operation is no longer in
// progress, as NCCL's blocking calls do.
int WaitReady(Comm* c, const char* name) {
  Backoff backoff;
  for (;;) {
    int async = kSuccess;
    int rc = AsyncError(c, &async);
    if (rc != kSuccess) return rc;
    if (async != kInProgress) {
      if (async != kSuccess && t_last_error.empty())
        Fail(async, "%s: the communicator failed on the GPU server", name);
      return async;
    }
    backoff.Wait();
  }
}

// Whether the app asked for a blocking communicator: its config's `blocking`,
// else NCCL_COMM_BLOCKING of its environment, else blocking.
bool WantsBlocking(const void* config) {
  if (config != nullptr) {
    const auto* head = static_cast<const ConfigHead*>(config);
    if (head->size >= offsetof(ConfigHead, blocking) + sizeof(int) && head->blocking != INT_MIN)
      return head->blocking != 0;
  }
  const char* env = std::getenv("NCCL_COMM_BLOCKING");
  return env == nullptr || std::atoi(env) != 0;
}

void PutConfig(Writer& w, const void* config) {
  if (config == nullptr) {
    w.Put<uint32_t>(0);
    w.Put<uint8_t>(0);
    w.PutString("");
    w.Put<uint8_t>(0);
    w.PutString("");
    return;
  }
  const auto* head = static_cast<const ConfigHead*>(config);
  size_t n = head->size;
  if (n < sizeof(ConfigHead)) n = sizeof(ConfigHead);  // an older struct: its leading fields
  if (n > kMaxConfigBytes) n = kMaxConfigBytes;
  w.Put<uint32_t>(static_cast<uint32_t>(n));
  w.PutBytes(config, n);
  w.Put<uint8_t>(head->net_name != nullptr);
  w.PutString(head->net_name != nullptr ? head->net_name : "");
  w.Put<uint8_t>(head->comm_name != nullptr);
  w.PutString(head->comm_name != nullptr ? head->comm_name : "");
}

// A communicator the reply describes (nullptr: none, as a split's NOCOLOR).
Comm* MadeComm(Reader& o, int server, bool blocking, int* bad) {
  uint64_t remote = 0;
  int32_t nranks = 0, rank = 0, device = 0;
  if (!o.Get(&remote) || !o.Get(&nranks) || !o.Get(&rank) || !o.Get(&device)) {
    *bad = 1;
    return nullptr;
  }
  if (remote == 0) return nullptr;
  auto* c = new Comm;
  c->server = server;
  c->remote = remote;
  c->nranks = nranks;
  c->rank = rank;
  c->blocking = blocking;
  c->device = device;
  return c;
}

// A split or shrink NCCL makes in the background: the new communicator once NCCL
// has named it (nullptr while it has not; *failed when the server cannot say).
Comm* ResolveChild(Comm* parent, const Comm::Child& child, int* failed) {
  Writer w;
  w.Put<uint8_t>(ops::kNcclResolve);
  w.Put<uint64_t>(child.token);
  Reply r;
  *failed = Send(parent->server, w, &r, "ncclCommSplit");
  if (*failed != kSuccess) return nullptr;
  Reader o = r.Outs();
  int bad = 0;
  Comm* made = MadeComm(o, parent->server, child.blocking, &bad);
  if (bad != 0) *failed = Fail(kInternalError, "ncclCommSplit: malformed reply");
  if (made != nullptr) made->device = parent->device;
  return made;
}

// The parent is no longer busy: the communicators NCCL has named since reach the
// app's variables, as NCCL writes them when done; the others stay pending.
void ResolveChildren(Comm* parent) {
  std::vector<Comm::Child> pending;
  for (const Comm::Child& child : parent->children) {
    int failed = kSuccess;
    Comm* made = ResolveChild(parent, child, &failed);
    if (made != nullptr)
      *child.out = made;
    else if (failed == kSuccess)
      pending.push_back(child);
  }
  parent->children.swap(pending);
}

// A blocking split: waits until NCCL has named the new communicator or the parent
// failed, as NCCL's blocking split returns only then.
int WaitChild(Comm* parent, const char* name) {
  Backoff backoff;
  while (!parent->children.empty()) {
    int async = kSuccess;
    int rc = AsyncError(parent, &async);  // resolves what NCCL has named
    if (rc != kSuccess) return rc;
    if (async != kSuccess && async != kInProgress) {
      parent->children.clear();
      if (t_last_error.empty()) Fail(async, "%s: the communicator failed on the GPU server", name);
      return async;
    }
    if (parent->children.empty()) break;
    backoff.Wait();
  }
  return kSuccess;
}

// The app's ordinal of the server's device `local` on `server`.
int GlobalDevice(int server, int local) {
  const Table* t = Driver();
  if (t == nullptr) return local;
  int count = 0;
  if (Cuda()->device_count(&count) != CUDA_SUCCESS) return local;
  for (int d = 0; d < count; ++d) {
    int there = -1;
    if (t->device_server(d, &there) == server && there == local) return d;
  }
  return local;
}

int InitComm(void** out, int nranks, const UniqueId* ids, int nids, int rank, void* config,
             const char* name) {
  if (out == nullptr) return Fail(kInvalidArgument, "%s: comm is NULL", name);
  *out = nullptr;
  Writer w;
  w.Put<uint8_t>(ops::kNcclInit);
  w.Put<int32_t>(nranks);
  w.Put<int32_t>(rank);
  w.Put<uint32_t>(static_cast<uint32_t>(nids));
  w.PutBytes(ids, static_cast<size_t>(nids) * sizeof(UniqueId));
  PutConfig(w, config);
  Reply r;
  int rc = SendInGroup(CurrentServer(Driver()), w, &r, name, nullptr);
  if (rc != kSuccess && rc != kInProgress) return rc;
  Reader o = r.Outs();
  int bad = 0;
  Comm* c = MadeComm(o, r.server, WantsBlocking(config), &bad);
  if (bad != 0 || c == nullptr) return Fail(kInternalError, "%s: malformed reply", name);
  c->device = GlobalDevice(r.server, c->device);
  c->nranks = nranks;  // known before NCCL has made it (non-blocking)
  c->rank = rank;
  *out = c;
  if (t_group.depth > 0) {
    t_group.comms.push_back(c);
    return kSuccess;
  }
  if (rc == kInProgress && c->blocking) return WaitReady(c, name);
  return rc;
}

// NCCL's own argument checks, made here: on the servers' non-blocking communicators
// NCCL would also record such an error as the communicator's (sticky) state, where a
// blocking one only returns it.
int CheckArgs(uint8_t kind, const void* send, const void* recv, size_t count, int type, int op,
              int root, Comm* c, const char* name) {
  if (type < 0 || type >= kNumTypes)
    return Fail(kInvalidArgument, "%s: invalid type %d", name, type);
  const bool reduces =
      kind == ops::kNcclAllReduce || kind == ops::kNcclReduce || kind == ops::kNcclReduceScatter;
  if (reduces && (op < 0 || (op >= kNumOps && c->ops.count(op) == 0)))
    return Fail(kInvalidArgument, "%s: invalid reduction operation %d", name, op);
  const bool p2p = kind == ops::kNcclSend || kind == ops::kNcclRecv;
  const bool rooted = kind == ops::kNcclBroadcast || kind == ops::kNcclReduce || p2p;
  if (rooted && c->nranks > 0 && (root < 0 || root >= c->nranks))
    return Fail(kInvalidArgument, "%s: invalid %s %d (communicator of %d ranks)", name,
                p2p ? "peer" : "root", root, c->nranks);
  if (count > 0) {
    const bool needs_send =
        kind != ops::kNcclRecv && !(kind == ops::kNcclBroadcast && root != c->rank);
    const bool needs_recv =
        kind != ops::kNcclSend && !(kind == ops::kNcclReduce && root != c->rank);
    if ((needs_send && send == nullptr) || (needs_recv && recv == nullptr))
      return Fail(kInvalidArgument, "%s: %s is NULL", name,
                  needs_send && send == nullptr ? "sendbuff" : "recvbuff");
  }
  return kSuccess;
}

int Collective(uint8_t kind, const void* send, void* recv, size_t count, int type, int op, int root,
               void* comm, CUstream stream, const char* name) {
  Comm* c = CommOf(comm);
  if (c == nullptr) return Fail(kInvalidArgument, "%s: invalid communicator", name);
  if (int bad = CheckArgs(kind, send, recv, count, type, op, root, c, name); bad != kSuccess)
    return bad;
  const Table* t = Driver();
  if (t == nullptr) return Fail(kSystemError, "%s: Flyt's libcuda.so.1 is not loaded", name);
  uint64_t wire_stream = 0;
  int server = t->stream_server(stream, &wire_stream);
  if (reinterpret_cast<uintptr_t>(stream) > 2 && server != c->server)
    return Fail(kInvalidArgument, "%s: the stream belongs to another GPU than the communicator",
                name);
  Writer w;
  w.Put<uint8_t>(ops::kNcclCollective);
  w.Put<uint8_t>(kind);
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(send));
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(recv));
  w.Put<uint64_t>(count);
  w.Put<int32_t>(type);
  w.Put<int32_t>(op);
  w.Put<int32_t>(root);
  w.Put<uint64_t>(c->remote);
  w.Put<uint64_t>(wire_stream);
  Reply r;
  return SendInGroup(c->server, w, &r, name, c);
}

// A call that names one communicator and has no outputs.
int OnComm(uint8_t sub, void* comm, const char* name) {
  Comm* c = CommOf(comm);
  if (c == nullptr) return Fail(kInvalidArgument, "%s: invalid communicator", name);
  Writer w;
  w.Put<uint8_t>(sub);
  w.Put<uint64_t>(c->remote);
  Reply r;
  int rc = Send(c->server, w, &r, name);
  if (rc == kInProgress && c->blocking) return WaitReady(c, name);
  return rc;
}

int SplitOrShrink(void* comm, int color, int key, const int* exclude, int nexclude, void** out,
                  void* config, int flags, bool split, const char* name) {
  Comm* c = CommOf(comm);
  if (c == nullptr) return Fail(kInvalidArgument, "%s: invalid communicator", name);
  if (out == nullptr) return Fail(kInvalidArgument, "%s: newcomm is NULL", name);
  *out = nullptr;
  Writer w;
  w.Put<uint8_t>(split ? ops::kNcclSplit : ops::kNcclShrink);
  w.Put<uint64_t>(c->remote);
  if (split) {
    w.Put<int32_t>(color);
    w.Put<int32_t>(key);
  } else {
    if (nexclude < 0 || (nexclude > 0 && exclude == nullptr))
      return Fail(kInvalidArgument, "%s: bad list of excluded ranks", name);
    w.Put<uint32_t>(static_cast<uint32_t>(nexclude));
    for (int i = 0; i < nexclude; ++i) w.Put<int32_t>(exclude[i]);
  }
  PutConfig(w, config);
  if (!split) w.Put<int32_t>(flags);
  // A config of NCCL_CONFIG_UNDEF values inherits the parent's blocking mode.
  const bool blocking =
      config != nullptr && static_cast<const ConfigHead*>(config)->blocking != INT_MIN
          ? WantsBlocking(config)
          : c->blocking;
  Reply r;
  int rc = SendInGroup(c->server, w, &r, name, c);
  if (rc != kSuccess && rc != kInProgress) return rc;
  Reader o = r.Outs();
  int bad = 0;
  Comm* made = MadeComm(o, c->server, blocking, &bad);
  uint64_t token = 0;
  if (bad != 0 || !o.Get(&token)) return Fail(kInternalError, "%s: malformed reply", name);
  if (made != nullptr) made->device = c->device;
  *out = made;
  // NCCL makes it in the background and names it when done: the parent's state says
  // when (a blocking parent is waited for here, a group's at its end).
  if (made == nullptr && token != 0) c->children.push_back({token, out, blocking});
  if (t_group.depth > 0) return kSuccess;
  if (c->blocking && !c->children.empty()) return WaitChild(c, name);
  if (rc == kInProgress && c->blocking) return WaitReady(c, name);
  return rc;
}

void LogUnsupportedOnce(const char* name) {
  static std::mutex mu;
  static std::set<std::string>* seen = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  if (seen->insert(name).second) Log("%s is not served by Flyt yet (ncclInvalidUsage)", name);
}

int Unsupported(const char* name) {
  LogUnsupportedOnce(name);
  return Fail(kInvalidUsage, "%s is not served by Flyt yet", name);
}

}  // namespace
}  // namespace flyt::nccl

using namespace flyt::nccl;  // NOLINT: the C entry points below are NCCL's
namespace ops = flyt::ops;
using flyt::wire::Reader;
using flyt::wire::Writer;

FLYT_NCCL_API int flyt_nccl_marker() { return 1; }
FLYT_NCCL_API int ncclGroupStart();
FLYT_NCCL_API int ncclGroupEnd();

FLYT_NCCL_API const char* ncclGetErrorString(int result) {
  switch (result) {
    case kSuccess:
      return "no error";
    case kUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case kSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case kInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case kInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case kInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case kRemoteError:
      return "remote process exited or there was a network error";
    case kInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

FLYT_NCCL_API const char* ncclGetLastError(void* comm) {
  // The server's text for the communicator when the thread has none of its own.
  Comm* c = CommOf(comm);
  if (t_last_error.empty() && c != nullptr) {
    Writer w;
    w.Put<uint8_t>(ops::kNcclLastError);
    w.Put<uint64_t>(c->remote);
    Reply r;
    if (Send(c->server, w, &r, "ncclGetLastError") == kSuccess) {
      Reader o = r.Outs();
      std::string text;
      if (o.GetString(&text, 1 << 16)) t_last_error = text;
    }
  }
  return t_last_error.c_str();
}

FLYT_NCCL_API int ncclGetVersion(int* version) {
  if (version == nullptr) return Fail(kInvalidArgument, "ncclGetVersion: version is NULL");
  static std::atomic<int> known{0};
  if (int v = known.load(); v != 0) {
    *version = v;
    return kSuccess;
  }
  if (const Libcuda* cu = Cuda(); cu != nullptr) cu->init(0);
  Writer w;
  w.Put<uint8_t>(ops::kNcclVersion);
  Reply r;
  int rc = Send(-1, w, &r, "ncclGetVersion");
  if (rc != kSuccess) return rc;
  Reader o = r.Outs();
  int32_t v = 0;
  if (!o.Get(&v)) return Fail(kInternalError, "ncclGetVersion: malformed reply");
  known.store(v);
  *version = v;
  return kSuccess;
}

FLYT_NCCL_API int ncclGetUniqueId(UniqueId* id) {
  if (id == nullptr) return Fail(kInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  if (const Libcuda* cu = Cuda(); cu != nullptr) cu->init(0);
  Writer w;
  w.Put<uint8_t>(ops::kNcclUniqueId);
  Reply r;
  int rc = Send(-1, w, &r, "ncclGetUniqueId");
  if (rc != kSuccess) return rc;
  Reader o = r.Outs();
  if (!o.GetBytes(id, sizeof(*id))) return Fail(kInternalError, "ncclGetUniqueId: malformed reply");
  return kSuccess;
}

FLYT_NCCL_API int ncclCommInitRankConfig(void** comm, int nranks, UniqueId id, int rank,
                                         void* config) {
  return InitComm(comm, nranks, &id, 1, rank, config, "ncclCommInitRankConfig");
}

FLYT_NCCL_API int ncclCommInitRank(void** comm, int nranks, UniqueId id, int rank) {
  return InitComm(comm, nranks, &id, 1, rank, nullptr, "ncclCommInitRank");
}

FLYT_NCCL_API int ncclCommInitRankScalable(void** comm, int nranks, int rank, int nids,
                                           UniqueId* ids, void* config) {
  if (nids < 1 || nids > static_cast<int>(ops::kMaxNcclIds) || ids == nullptr)
    return Fail(kInvalidArgument, "ncclCommInitRankScalable: bad list of unique ids");
  return InitComm(comm, nranks, ids, nids, rank, config, "ncclCommInitRankScalable");
}

FLYT_NCCL_API int ncclCommInitAll(void** comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1 || ndev > static_cast<int>(ops::kMaxNcclDevices))
    return Fail(kInvalidArgument, "ncclCommInitAll: bad arguments");
  const Libcuda* cu = Cuda();
  if (cu == nullptr)
    return Fail(kSystemError, "ncclCommInitAll: Flyt's libcuda.so.1 is not loaded");
  const Table* t = cu->table;
  cu->init(0);
  // GPUs of one server: that server's NCCL makes them all. Across servers: an id
  // and one rank per device in a group, as NCCL does it itself.
  std::vector<int> devices(static_cast<size_t>(ndev)), local(devices.size());
  int server = -2;
  for (int i = 0; i < ndev; ++i) {
    devices[i] = devlist != nullptr ? devlist[i] : i;
    int s = t->device_server(devices[i], &local[i]);
    if (s < 0)
      return Fail(kInvalidArgument, "ncclCommInitAll: device %d does not exist", devices[i]);
    server = server == -2 || server == s ? s : -1;
  }
  if (server >= 0) {
    Writer w;
    w.Put<uint8_t>(ops::kNcclInitAll);
    w.Put<int32_t>(ndev);
    for (int d : local) w.Put<int32_t>(d);
    Reply r;
    int rc = Send(server, w, &r, "ncclCommInitAll");
    if (rc != kSuccess) return rc;
    Reader o = r.Outs();
    for (int i = 0; i < ndev; ++i) {
      int bad = 0;
      Comm* c = MadeComm(o, server, true, &bad);
      if (bad != 0 || c == nullptr) return Fail(kInternalError, "ncclCommInitAll: malformed reply");
      c->device = devices[i];
      comms[i] = c;
    }
    // The server made them non-blocking: ready once none is in progress.
    for (int i = 0; i < ndev; ++i)
      if (int w2 = WaitReady(static_cast<Comm*>(comms[i]), "ncclCommInitAll"); w2 != kSuccess)
        return w2;
    return kSuccess;
  }
  // Each rank is made with its device's primary context current (as NCCL's
  // cudaSetDevice does), the id by the first device's server.
  CUcontext saved = nullptr;
  if (cu->ctx_get(&saved) != CUDA_SUCCESS) saved = nullptr;
  auto use = [&](int device) {
    CUdevice d = 0;
    CUcontext p = nullptr;
    if (cu->device_get(&d, device) != CUDA_SUCCESS || cu->primary_retain(&p, d) != CUDA_SUCCESS)
      return false;
    bool ok = cu->ctx_set(p) == CUDA_SUCCESS;
    cu->primary_release(d);  // cudart's own reference keeps it (the app's device)
    return ok;
  };
  UniqueId id{};
  int rc = use(devices[0])
               ? ncclGetUniqueId(&id)
               : Fail(kUnhandledCudaError, "ncclCommInitAll: cannot use device %d", devices[0]);
  if (rc == kSuccess) rc = ncclGroupStart();
  const bool grouped = rc == kSuccess;
  for (int i = 0; rc == kSuccess && i < ndev; ++i) {
    rc = use(devices[i])
             ? InitComm(&comms[i], ndev, &id, 1, i, nullptr, "ncclCommInitAll")
             : Fail(kUnhandledCudaError, "ncclCommInitAll: cannot use device %d", devices[i]);
  }
  int end = grouped ? ncclGroupEnd() : kSuccess;
  cu->ctx_set(saved);
  return rc != kSuccess ? rc : end;
}

FLYT_NCCL_API int ncclCommSplit(void* comm, int color, int key, void** newcomm, void* config) {
  return SplitOrShrink(comm, color, key, nullptr, 0, newcomm, config, 0, true, "ncclCommSplit");
}

FLYT_NCCL_API int ncclCommShrink(void* comm, int* exclude, int nexclude, void** newcomm,
                                 void* config, int flags) {
  return SplitOrShrink(comm, 0, 0, exclude, nexclude, newcomm, config, flags, false,
                       "ncclCommShrink");
}

FLYT_NCCL_API int ncclCommFinalize(void* comm) {
  return OnComm(ops::kNcclFinalize, comm, "ncclCommFinalize");
}

// Destroy and abort free this process's record too, whatever the server says.
FLYT_NCCL_API int ncclCommDestroy(void* comm) {
  if (comm == nullptr) return kSuccess;  // as NCCL
  int rc = OnComm(ops::kNcclDestroy, comm, "ncclCommDestroy");
  if (Comm* c = CommOf(comm); c != nullptr) {
    c->magic = 0;
    delete c;
  }
  return rc;
}

FLYT_NCCL_API int ncclCommAbort(void* comm) {
  if (comm == nullptr) return kSuccess;
  int rc = OnComm(ops::kNcclAbort, comm, "ncclCommAbort");
  if (Comm* c = CommOf(comm); c != nullptr) {
    c->magic = 0;
    delete c;
  }
  return rc;
}

FLYT_NCCL_API int ncclCommGetAsyncError(void* comm, int* async) {
  Comm* c = CommOf(comm);
  if (c == nullptr || async == nullptr)
    return Fail(kInvalidArgument, "ncclCommGetAsyncError: invalid argument");
  return AsyncError(c, async);
}

namespace {
// Size and rank of a communicator a split or shrink made are asked once NCCL knows them.
int Describe(Comm* c, const char* name) {
  if (c->nranks > 0) return kSuccess;
  Writer w;
  w.Put<uint8_t>(ops::kNcclCommInfo);
  w.Put<uint64_t>(c->remote);
  Reply r;
  int rc = Send(c->server, w, &r, name);
  if (rc != kSuccess) return rc;
  Reader o = r.Outs();
  uint64_t remote = 0;
  int32_t nranks = 0, rank = 0, device = 0;
  if (!o.Get(&remote) || !o.Get(&nranks) || !o.Get(&rank) || !o.Get(&device))
    return Fail(kInternalError, "%s: malformed reply", name);
  if (nranks == 0) return kInProgress;
  c->nranks = nranks;
  c->rank = rank;
  return kSuccess;
}
}  // namespace

FLYT_NCCL_API int ncclCommCount(const void* comm, int* count) {
  Comm* c = CommOf(const_cast<void*>(comm));
  if (c == nullptr || count == nullptr)
    return Fail(kInvalidArgument, "ncclCommCount: invalid argument");
  if (int rc = Describe(c, "ncclCommCount"); rc != kSuccess) return rc;
  *count = c->nranks;
  return kSuccess;
}

FLYT_NCCL_API int ncclCommCuDevice(const void* comm, int* device) {
  Comm* c = CommOf(const_cast<void*>(comm));
  if (c == nullptr || device == nullptr)
    return Fail(kInvalidArgument, "ncclCommCuDevice: invalid argument");
  *device = c->device;
  return kSuccess;
}

FLYT_NCCL_API int ncclCommUserRank(const void* comm, int* rank) {
  Comm* c = CommOf(const_cast<void*>(comm));
  if (c == nullptr || rank == nullptr)
    return Fail(kInvalidArgument, "ncclCommUserRank: invalid argument");
  if (int rc = Describe(c, "ncclCommUserRank"); rc != kSuccess) return rc;
  *rank = c->rank;
  return kSuccess;
}

FLYT_NCCL_API int ncclAllReduce(const void* send, void* recv, size_t count, int type, int op,
                                void* comm, CUstream stream) {
  return Collective(ops::kNcclAllReduce, send, recv, count, type, op, 0, comm, stream,
                    "ncclAllReduce");
}

FLYT_NCCL_API int ncclBroadcast(const void* send, void* recv, size_t count, int type, int root,
                                void* comm, CUstream stream) {
  return Collective(ops::kNcclBroadcast, send, recv, count, type, 0, root, comm, stream,
                    "ncclBroadcast");
}

FLYT_NCCL_API int ncclBcast(void* buff, size_t count, int type, int root, void* comm,
                            CUstream stream) {
  return Collective(ops::kNcclBroadcast, buff, buff, count, type, 0, root, comm, stream,
                    "ncclBcast");
}

FLYT_NCCL_API int ncclReduce(const void* send, void* recv, size_t count, int type, int op, int root,
                             void* comm, CUstream stream) {
  return Collective(ops::kNcclReduce, send, recv, count, type, op, root, comm, stream,
                    "ncclReduce");
}

FLYT_NCCL_API int ncclAllGather(const void* send, void* recv, size_t send_count, int type,
                                void* comm, CUstream stream) {
  return Collective(ops::kNcclAllGather, send, recv, send_count, type, 0, 0, comm, stream,
                    "ncclAllGather");
}

FLYT_NCCL_API int ncclReduceScatter(const void* send, void* recv, size_t recv_count, int type,
                                    int op, void* comm, CUstream stream) {
  return Collective(ops::kNcclReduceScatter, send, recv, recv_count, type, op, 0, comm, stream,
                    "ncclReduceScatter");
}

FLYT_NCCL_API int ncclAlltoAll(const void* send, void* recv, size_t count, int type, void* comm,
                               CUstream stream) {
  return Collective(ops::kNcclAlltoAll, send, recv, count, type, 0, 0, comm, stream,
                    "ncclAlltoAll");
}

FLYT_NCCL_API int ncclSend(const void* send, size_t count, int type, int peer, void* comm,
                           CUstream stream) {
  return Collective(ops::kNcclSend, send, nullptr, count, type, 0, peer, comm, stream, "ncclSend");
}

FLYT_NCCL_API int ncclRecv(void* recv, size_t count, int type, int peer, void* comm,
                           CUstream stream) {
  return Collective(ops::kNcclRecv, nullptr, recv, count, type, 0, peer, comm, stream, "ncclRecv");
}

FLYT_NCCL_API int ncclGroupStart() {
  ++t_group.depth;  // the servers' groups open at their first call (SendInGroup)
  return kSuccess;
}

FLYT_NCCL_API int ncclGroupEnd() {
  if (t_group.depth == 0) return Fail(kInvalidUsage, "ncclGroupEnd: no group was started");
  if (--t_group.depth > 0) return kSuccess;
  Group g = std::move(t_group);
  t_group = Group{};
  // Each server's part of the group ends at once, from a thread of its own when
  // there are several: ranks of this process on two servers must meet, and a
  // server's NCCL may wait for the others' ranks in its group end.
  std::vector<int> servers(g.servers.begin(), g.servers.end());
  std::vector<int> ends(servers.size(), kSuccess);
  std::vector<std::string> errors(servers.size());
  auto end_on = [&](size_t i) {
    Writer w;
    w.Put<uint8_t>(ops::kNcclGroupEnd);
    Reply r;
    ends[i] = Send(servers[i], w, &r, "ncclGroupEnd");
    errors[i] = t_last_error;
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < servers.size(); ++i) threads.emplace_back(end_on, i);
  if (!servers.empty()) end_on(0);
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < servers.size(); ++i) {
    if (ends[i] != kSuccess && ends[i] != kInProgress) {
      t_last_error = errors[i];
      return ends[i];
    }
  }
  std::set<Comm*> waited;
  for (Comm* c : g.comms) {
    if (!c->blocking || !waited.insert(c).second) continue;
    if (int w = WaitReady(c, "ncclGroupEnd"); w != kSuccess) return w;
    if (int w = WaitChild(c, "ncclGroupEnd"); w != kSuccess) return w;
  }
  return kSuccess;
}

FLYT_NCCL_API int ncclRedOpCreatePreMulSum(int* op, void* scalar, int type, int residence,
                                           void* comm) {
  Comm* c = CommOf(comm);
  if (c == nullptr || op == nullptr || scalar == nullptr)
    return Fail(kInvalidArgument, "ncclRedOpCreatePreMulSum: invalid argument");
  const size_t bytes = DataTypeBytes(type);
  if (bytes == 0 || bytes > 8)
    return Fail(kInvalidArgument, "ncclRedOpCreatePreMulSum: bad datatype");
  uint64_t value = 0;
  if (residence == kScalarHostImmediate)
    std::memcpy(&value, scalar, bytes);  // the value now, as NCCL reads it
  else if (residence == kScalarDevice)
    value = reinterpret_cast<uintptr_t>(scalar);
  else
    return Fail(kInvalidArgument, "ncclRedOpCreatePreMulSum: bad residence");
  Writer w;
  w.Put<uint8_t>(ops::kNcclRedOpCreate);
  w.Put<uint64_t>(c->remote);
  w.Put<int32_t>(type);
  w.Put<int32_t>(residence);
  w.Put<uint64_t>(value);
  Reply r;
  int rc = Send(c->server, w, &r, "ncclRedOpCreatePreMulSum");
  if (rc != kSuccess) return rc;
  Reader o = r.Outs();
  int32_t v = 0;
  if (!o.Get(&v)) return Fail(kInternalError, "ncclRedOpCreatePreMulSum: malformed reply");
  c->ops.insert(v);
  *op = v;
  return kSuccess;
}

FLYT_NCCL_API int ncclRedOpDestroy(int op, void* comm) {
  Comm* c = CommOf(comm);
  if (c == nullptr) return Fail(kInvalidArgument, "ncclRedOpDestroy: invalid communicator");
  Writer w;
  w.Put<uint8_t>(ops::kNcclRedOpDestroy);
  w.Put<uint64_t>(c->remote);
  w.Put<int32_t>(op);
  Reply r;
  int rc = Send(c->server, w, &r, "ncclRedOpDestroy");
  if (rc == kSuccess) c->ops.erase(op);
  return rc;
}

FLYT_NCCL_API int ncclCommRegister(const void* comm, void* buff, size_t size, void** handle) {
  Comm* c = CommOf(const_cast<void*>(comm));
  if (c == nullptr || handle == nullptr)
    return Fail(kInvalidArgument, "ncclCommRegister: invalid argument");
  Writer w;
  w.Put<uint8_t>(ops::kNcclRegister);
  w.Put<uint64_t>(c->remote);
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(buff));
  w.Put<uint64_t>(size);
  Reply r;
  int rc = Send(c->server, w, &r, "ncclCommRegister");
  if (rc != kSuccess) return rc;
  Reader o = r.Outs();
  uint64_t h = 0;
  if (!o.Get(&h)) return Fail(kInternalError, "ncclCommRegister: malformed reply");
  *handle = reinterpret_cast<void*>(h);
  return kSuccess;
}

FLYT_NCCL_API int ncclCommDeregister(const void* comm, void* handle) {
  Comm* c = CommOf(const_cast<void*>(comm));
  if (c == nullptr) return Fail(kInvalidArgument, "ncclCommDeregister: invalid communicator");
  Writer w;
  w.Put<uint8_t>(ops::kNcclDeregister);
  w.Put<uint64_t>(c->remote);
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(handle));
  Reply r;
  return Send(c->server, w, &r, "ncclCommDeregister");
}

// NCCL's allocator: device memory of the current device (NVIDIA's picks memory
// NVLink SHARP can register; plain device memory serves every collective).
FLYT_NCCL_API int ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return Fail(kInvalidArgument, "ncclMemAlloc: ptr is NULL");
  if (size == 0) {
    *ptr = nullptr;
    return kSuccess;
  }
  const Libcuda* cu = Cuda();
  if (cu == nullptr) return Fail(kSystemError, "ncclMemAlloc: Flyt's libcuda.so.1 is not loaded");
  CUdeviceptr p = 0;
  CUresult rc = cu->mem_alloc(&p, size);
  if (rc != CUDA_SUCCESS)
    return Fail(kUnhandledCudaError, "ncclMemAlloc: cuMemAlloc of %zu bytes failed (%d)", size,
                static_cast<int>(rc));
  *ptr = reinterpret_cast<void*>(p);
  return kSuccess;
}

FLYT_NCCL_API int ncclMemFree(void* ptr) {
  if (ptr == nullptr) return kSuccess;
  const Libcuda* cu = Cuda();
  if (cu == nullptr) return Fail(kSystemError, "ncclMemFree: Flyt's libcuda.so.1 is not loaded");
  CUresult rc = cu->mem_free(reinterpret_cast<CUdeviceptr>(ptr));
  return rc == CUDA_SUCCESS ? kSuccess
                            : Fail(kUnhandledCudaError, "ncclMemFree: cuMemFree failed (%d)",
                                   static_cast<int>(rc));
}

// Not served yet: named once in the log, ncclInvalidUsage (NCCL has no "not supported").
FLYT_NCCL_API int ncclCommWindowRegister(void*, void*, size_t, void**, int) {
  return Unsupported("ncclCommWindowRegister");
}
FLYT_NCCL_API int ncclCommWindowDeregister(void*, void*) {
  return Unsupported("ncclCommWindowDeregister");
}
FLYT_NCCL_API int ncclDevCommCreate(void*, const void*, void*) {
  return Unsupported("ncclDevCommCreate");
}
FLYT_NCCL_API int ncclDevCommDestroy(void*, const void*) {
  return Unsupported("ncclDevCommDestroy");
}
FLYT_NCCL_API int ncclGroupSimulateEnd(void*) { return Unsupported("ncclGroupSimulateEnd"); }
FLYT_NCCL_API int ncclCommSuspend(void*, int) { return Unsupported("ncclCommSuspend"); }
FLYT_NCCL_API int ncclCommResume(void*) { return Unsupported("ncclCommResume"); }
FLYT_NCCL_API int ncclCommMemStats(void*, int, uint64_t*) {
  return Unsupported("ncclCommMemStats");
}
