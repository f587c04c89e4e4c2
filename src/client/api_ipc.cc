// CUDA IPC entry points: cuIpcGetMemHandle, cuIpcOpenMemHandle (the 4.1 ABI
// and _v2, which cudart asks for), cuIpcCloseMemHandle, cuIpcGetEventHandle and
// cuIpcOpenEventHandle.
//
// Owns: the memory this process opened over IPC (base -> size and opens not
// yet closed), which copies and pointer queries know as device memory while it
// is open. Handles are the server's driver's 64 bytes, carried unopened: two
// processes served on one GPU host share memory and events as they would
// natively (protocol/ops.h, server/session_ipc.cc). Errors are the driver's.
#include <cuda.h>

#include <map>
#include <mutex>

#include "client/client.h"

// cuda.h names the current ABI cuIpcOpenMemHandle; the 4.1 one is exported too.
#undef cuIpcOpenMemHandle

using flyt::client::Client;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace {

struct Opened {
  uint64_t size = 0;
  uint32_t refs = 0;  // opens not yet closed (the driver counts them too)
};
std::mutex g_mu;
std::map<uint64_t, Opened> g_opened;  // under g_mu

// The open IPC mapping at `base`, if the process still has it: cudaDeviceReset
// unmaps everything, and the client forgets its device ranges then.
std::map<uint64_t, Opened>::iterator FindOpenedLocked(uint64_t base) {
  auto it = g_opened.find(base);
  if (it != g_opened.end() && !Client::Get().FindDeviceRange(base, 1)) {
    g_opened.erase(it);
    return g_opened.end();
  }
  return it;
}

CUresult OpenMem(const char* name, CUdeviceptr* out, const CUipcMemHandle& handle, unsigned flags) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put(handle);
  w.Put<uint32_t>(flags);
  std::vector<uint8_t> reply;
  CUresult rc = c.Call(name, ops::kOpIpcOpenMemHandle, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint64_t base = 0, size = 0;
  if (!r.Get(&base) || !r.Get(&size) || r.remaining() != 0 || size == 0) return CUDA_ERROR_UNKNOWN;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = FindOpenedLocked(base);
  if (it == g_opened.end()) {
    // Reserved like an allocation, so that no host memory of ours lands there.
    c.AddDeviceRange(base, size, true);
    it = g_opened.emplace(base, Opened{size, 0}).first;
  }
  it->second.refs++;
  *out = base;
  return CUDA_SUCCESS;
}

}  // namespace

namespace flyt::client {

bool IsIpcMapping(uint64_t base) {
  std::lock_guard<std::mutex> lock(g_mu);
  return FindOpenedLocked(base) != g_opened.end();
}

}  // namespace flyt::client

FLYT_API CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint64_t>(ptr);
  return c.Call("cuIpcGetMemHandle", ops::kOpIpcGetMemHandle, w,
                ReplySink{nullptr, handle, sizeof(*handle)});
}

FLYT_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* out, CUipcMemHandle handle,
                                        unsigned int flags) {
  return OpenMem("cuIpcOpenMemHandle_v2", out, handle, flags);
}

FLYT_API CUresult cuIpcOpenMemHandle(CUdeviceptr* out, CUipcMemHandle handle, unsigned int flags) {
  return OpenMem("cuIpcOpenMemHandle", out, handle, flags);
}

// Closing an open the process knows is fire-and-forget (its errors come with
// the next synchronous call, as for cuMemFree); anything else is judged by the
// server at once.
FLYT_API CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  wire::Writer w;
  w.Put<uint64_t>(ptr);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = FindOpenedLocked(ptr);
    if (it != g_opened.end()) {
      if (--it->second.refs == 0) {
        c.RemoveDeviceRange(ptr);
        g_opened.erase(it);
      }
      return c.Post("cuIpcCloseMemHandle", ops::kOpIpcCloseMemHandle, w);
    }
  }
  return c.Call("cuIpcCloseMemHandle", ops::kOpIpcCloseMemHandle, w, ReplySink{});
}

FLYT_API CUresult cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent event) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(event));
  return c.Call("cuIpcGetEventHandle", ops::kOpIpcGetEventHandle, w,
                ReplySink{nullptr, handle, sizeof(*handle)});
}

FLYT_API CUresult cuIpcOpenEventHandle(CUevent* out, CUipcEventHandle handle) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put(handle);
  uint64_t event = 0;
  CUresult rc = c.Call("cuIpcOpenEventHandle", ops::kOpIpcOpenEventHandle, w,
                       ReplySink{nullptr, &event, sizeof(event)});
  if (rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUevent>(static_cast<uintptr_t>(event));
  return CUDA_SUCCESS;
}
