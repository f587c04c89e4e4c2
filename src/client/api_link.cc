// The JIT linker's entry points: cuLinkCreate_v2, cuLinkAddData_v2,
// cuLinkAddFile_v2 (and the 5.5 ABIs cuLinkCreate, cuLinkAddData,
// cuLinkAddFile, the same calls), cuLinkComplete and cuLinkDestroy.
//
// Owns: the process's link states (the CUlinkState the app holds is one of
// ours, validated on every use): the server's handle, the app's create
// options, its option-value array and log buffers, which the driver would
// write through, and the cubin of cuLinkComplete (valid until cuLinkDestroy,
// as natively). The link itself runs in the server's driver
// (server/session_link.cc); the logs and output options come back with the
// replies and are written here into the app's memory. cuLinkAddFile reads the
// app's file here and sends it as data. Options that point into the app's
// memory other than the log buffers are refused with CUDA_ERROR_NOT_SUPPORTED
// (logged once). With several servers (client/multi_server.cc) a state is
// made on the current context's server, its server handle carries that
// server's tag, and every later call on it goes there, whichever context is
// current then. Must not touch the code images of api_code.cc.
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "client/client.h"
#include "client/proc_address.h"

// cuda.h names the current ABIs cuLinkCreate etc.; the 5.5 ones are exported too.
#undef cuLinkCreate
#undef cuLinkAddData
#undef cuLinkAddFile

using flyt::client::Client;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace {

struct Link {
  uint64_t server = 0;  // the server's handle (with several servers: tagged with its index)
  std::vector<CUjit_option> options;  // as given to cuLinkCreate
  void** values = nullptr;            // the app's array: outputs are written there
  char* info_log = nullptr;           // the app's log buffers and their sizes
  size_t info_size = 0;
  char* error_log = nullptr;
  size_t error_size = 0;
  std::vector<uint8_t> cubin;  // cuLinkComplete's result
};

// Under g_mu, held for the whole call: link calls are few, and a state must
// not go away while another thread uses it.
std::mutex g_mu;
std::unordered_map<Link*, std::unique_ptr<Link>> g_links;

// With several servers: routes the calling thread's calls to the state's server
// (-1 with one server: no change).
int LinkRoute(const Link& link) { return Client::Get().multi() ? Client::TagOf(link.server) : -1; }

Link* FindLocked(CUlinkState state) {
  auto it = g_links.find(reinterpret_cast<Link*>(state));
  return it == g_links.end() ? nullptr : it->second.get();
}

// Checks the options and puts them (u32 n, n x (u32 option, u64 value)).
// `create`: the log buffers are allowed (their value is the server's affair).
CUresult PutOptions(unsigned n, const CUjit_option* options, void** values, bool create,
                    wire::Writer& w) {
  if (n > 0 && (options == nullptr || values == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (n > ops::kMaxLinkOptions) return CUDA_ERROR_INVALID_VALUE;
  w.Put<uint32_t>(n);
  for (unsigned i = 0; i < n; ++i) {
    CUjit_option o = options[i];
    if (static_cast<int>(o) < 0 || o >= CU_JIT_NUM_OPTIONS) return CUDA_ERROR_INVALID_VALUE;
    const char* refused = nullptr;
    switch (o) {
      case CU_JIT_GLOBAL_SYMBOL_NAMES:
        refused = "JIT option CU_JIT_GLOBAL_SYMBOL_NAMES";
        break;
      case CU_JIT_GLOBAL_SYMBOL_ADDRESSES:
        refused = "JIT option CU_JIT_GLOBAL_SYMBOL_ADDRESSES";
        break;
      case CU_JIT_REFERENCED_KERNEL_NAMES:
        refused = "JIT option CU_JIT_REFERENCED_KERNEL_NAMES";
        break;
      case CU_JIT_REFERENCED_VARIABLE_NAMES:
        refused = "JIT option CU_JIT_REFERENCED_VARIABLE_NAMES";
        break;
      case CU_JIT_INFO_LOG_BUFFER:
      case CU_JIT_ERROR_LOG_BUFFER:
        if (!create) refused = "cuLinkAddData/cuLinkAddFile with a log buffer option";
        break;
      default:
        break;
    }
    if (refused != nullptr) {
      flyt::client::ReportUnsupported(refused);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    bool pointer = o == CU_JIT_INFO_LOG_BUFFER || o == CU_JIT_ERROR_LOG_BUFFER;
    w.Put<uint32_t>(static_cast<uint32_t>(o));
    w.Put<uint64_t>(pointer ? 0 : reinterpret_cast<uintptr_t>(values[i]));
  }
  return CUDA_SUCCESS;
}

// Writes what the driver wrote on the server (outputs of the create options,
// the logs) into the app's memory. False: the reply is not such outputs.
bool ApplyOutputs(Link& link, wire::Reader& r) {
  uint32_t n = 0;
  if (!r.Get(&n) || n != link.options.size()) return false;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    if (!r.Get(&v)) return false;
    switch (link.options[i]) {
      case CU_JIT_THREADS_PER_BLOCK:
      case CU_JIT_WALL_TIME:
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        link.values[i] = reinterpret_cast<void*>(static_cast<uintptr_t>(v));
        break;
      default:
        break;
    }
  }
  auto take_log = [&](char* dst, size_t cap) {
    const uint8_t* text = nullptr;
    uint32_t len = 0;
    if (!r.GetBlob(&text, &len)) return false;
    if (dst == nullptr || cap == 0) return true;
    size_t k = len < cap - 1 ? len : cap - 1;
    if (k > 0) std::memcpy(dst, text, k);
    dst[k] = '\0';
    return true;
  };
  return take_log(link.info_log, link.info_size) && take_log(link.error_log, link.error_size);
}

CUresult Create(const char* name, unsigned n, CUjit_option* options, void** values,
                CUlinkState* out) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  CUresult rc = PutOptions(n, options, values, true, w);
  if (rc != CUDA_SUCCESS) return rc;
  auto link = std::make_unique<Link>();
  if (n > 0) {
    link->options.assign(options, options + n);
    link->values = values;
  }
  for (unsigned i = 0; i < n; ++i) {
    auto size = static_cast<size_t>(static_cast<unsigned>(reinterpret_cast<uintptr_t>(values[i])));
    switch (options[i]) {
      case CU_JIT_INFO_LOG_BUFFER:
        link->info_log = static_cast<char*>(values[i]);
        break;
      case CU_JIT_ERROR_LOG_BUFFER:
        link->error_log = static_cast<char*>(values[i]);
        break;
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        link->info_size = size;
        break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        link->error_size = size;
        break;
      default:
        break;
    }
  }
  uint64_t server = 0;
  rc = c.Call(name, ops::kOpLinkCreate, w, ReplySink{nullptr, &server, sizeof(server)});
  if (rc != CUDA_SUCCESS) return rc;
  link->server = c.multi() ? Client::Tag(server, Client::LastRoute()) : server;
  std::lock_guard<std::mutex> lock(g_mu);
  Link* key = link.get();
  g_links.emplace(key, std::move(link));
  *out = reinterpret_cast<CUlinkState>(key);
  return CUDA_SUCCESS;
}

CUresult AddBytes(const char* name, CUlinkState state, CUjitInputType type, const void* data,
                  size_t size, const char* input_name, unsigned n, CUjit_option* options,
                  void** values) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(g_mu);
  Link* link = FindLocked(state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (data == nullptr && size > 0) return CUDA_ERROR_INVALID_VALUE;
  if (size > wire::kMaxPayload - 64 * 1024) {
    flyt::client::ReportUnsupported("cuLinkAddData of an input over 64 MiB");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  size_t name_len = input_name != nullptr ? strnlen(input_name, ops::kMaxNameLen) : 0;
  if (name_len >= ops::kMaxNameLen) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint64_t>(Client::WireValue(link->server));
  w.Put<uint32_t>(static_cast<uint32_t>(type));
  w.Put<uint8_t>(input_name != nullptr ? 1 : 0);
  w.PutBlob(input_name, name_len);
  w.PutBlob(data, size);
  CUresult rc = PutOptions(n, options, values, false, w);
  if (rc != CUDA_SUCCESS) return rc;
  std::vector<uint8_t> reply;
  Client::RouteScope route(LinkRoute(*link));
  rc = c.Call(name, ops::kOpLinkAddData, w, ReplySink{&reply});
  // A failing add still brings the logs (the error log says why).
  if (!reply.empty()) {
    wire::Reader r(reply.data(), reply.size());
    if (!ApplyOutputs(*link, r) || r.remaining() != 0) return CUDA_ERROR_UNKNOWN;
  }
  return rc;
}

CUresult AddFile(const char* name, CUlinkState state, CUjitInputType type, const char* path,
                 unsigned n, CUjit_option* options, void** values) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (FindLocked(state) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The app's file, read here: the server has no access to it.
  std::vector<uint8_t> bytes;
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  uint8_t buf[64 * 1024];
  size_t got = 0;
  bool too_big = false;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    bytes.insert(bytes.end(), buf, buf + got);
    if (bytes.size() > wire::kMaxPayload) {
      too_big = true;
      break;
    }
  }
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return CUDA_ERROR_FILE_NOT_FOUND;
  if (too_big) {
    flyt::client::ReportUnsupported("cuLinkAddFile of a file over 64 MiB");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // PTX and NVVM text: the driver reads a string, so the file gets its NUL.
  if (type == CU_JIT_INPUT_PTX) bytes.push_back(0);
  return AddBytes(name, state, type, bytes.data(), bytes.size(), path, n, options, values);
}

}  // namespace

FLYT_API CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option* options,
                                  void** optionValues, CUlinkState* stateOut) {
  return Create("cuLinkCreate_v2", numOptions, options, optionValues, stateOut);
}

FLYT_API CUresult cuLinkCreate(unsigned int numOptions, CUjit_option* options, void** optionValues,
                               CUlinkState* stateOut) {
  return Create("cuLinkCreate", numOptions, options, optionValues, stateOut);
}

FLYT_API CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data, size_t size,
                                   const char* name, unsigned int numOptions, CUjit_option* options,
                                   void** optionValues) {
  return AddBytes("cuLinkAddData_v2", state, type, data, size, name, numOptions, options,
                  optionValues);
}

FLYT_API CUresult cuLinkAddData(CUlinkState state, CUjitInputType type, void* data, size_t size,
                                const char* name, unsigned int numOptions, CUjit_option* options,
                                void** optionValues) {
  return AddBytes("cuLinkAddData", state, type, data, size, name, numOptions, options,
                  optionValues);
}

FLYT_API CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char* path,
                                   unsigned int numOptions, CUjit_option* options,
                                   void** optionValues) {
  return AddFile("cuLinkAddFile_v2", state, type, path, numOptions, options, optionValues);
}

FLYT_API CUresult cuLinkAddFile(CUlinkState state, CUjitInputType type, const char* path,
                                unsigned int numOptions, CUjit_option* options,
                                void** optionValues) {
  return AddFile("cuLinkAddFile", state, type, path, numOptions, options, optionValues);
}

FLYT_API CUresult cuLinkComplete(CUlinkState state, void** cubinOut, size_t* sizeOut) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(g_mu);
  Link* link = FindLocked(state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (cubinOut == nullptr || sizeOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint64_t>(Client::WireValue(link->server));
  std::vector<uint8_t> reply;
  Client::RouteScope route(LinkRoute(*link));
  CUresult rc = c.Call("cuLinkComplete", ops::kOpLinkComplete, w, ReplySink{&reply});
  if (reply.empty()) return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_UNKNOWN;
  wire::Reader r(reply.data(), reply.size());
  if (!ApplyOutputs(*link, r)) return CUDA_ERROR_UNKNOWN;
  if (rc != CUDA_SUCCESS) return rc;
  uint64_t size = 0;
  if (!r.Get(&size) || size == 0 || size != r.remaining()) return CUDA_ERROR_UNKNOWN;
  const uint8_t* bytes = r.Skip(size);
  link->cubin.assign(bytes, bytes + size);
  *cubinOut = link->cubin.data();
  *sizeOut = link->cubin.size();
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuLinkDestroy(CUlinkState state) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_links.find(reinterpret_cast<Link*>(state));
  if (it == g_links.end()) return CUDA_ERROR_INVALID_HANDLE;
  wire::Writer w;
  w.Put<uint64_t>(Client::WireValue(it->second->server));
  Client::RouteScope route(LinkRoute(*it->second));
  CUresult rc = c.Call("cuLinkDestroy", ops::kOpLinkDestroy, w, ReplySink{});
  g_links.erase(it);  // gone on the server too (or the server is)
  return rc;
}
