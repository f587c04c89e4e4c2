// CUDA IPC entry points: cuIpcGetMemHandle, cuIpcOpenMemHandle (the 4.1 ABI
// and _v2, which cudart asks for), cuIpcCloseMemHandle, cuIpcGetEventHandle and
// cuIpcOpenEventHandle.
//
// Owns: the memory this process opened over IPC (base -> size and opens not
// yet closed), which copies and pointer queries know as device memory while it
// is open. Handles are the server's driver's 64 bytes, carried unopened: two
// processes served on one GPU host share memory and events as they would
// natively (protocol/ops.h, server/session_ipc.cc). Errors are the driver's.
//
// With several servers (client/multi_server.cc): a handle is got from the server of
// the memory or event, and opened by the current device's server (natively the opener
// maps it for its current device), which is the server that memory is then known on;
// an opened event is tagged with that server. Handles this process exported are
// refused here as the driver refuses them (another server would not know them).
#include <cuda.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "common/log.h"

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
std::set<std::string> g_exported;     // under g_mu: handles exported (several servers)

template <typename H>
std::string Bytes(const H& handle) {
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(H));
}

// Several servers: the handle was this process's own (CUDA_ERROR_INVALID_CONTEXT, as
// the driver answers a process its own handles), or it is noted as such.
template <typename H>
bool OwnHandle(const H& handle) {
  if (!Client::Get().multi()) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  return g_exported.count(Bytes(handle)) != 0;
}
template <typename H>
void NoteExported(const H& handle) {
  if (!Client::Get().multi()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_exported.insert(Bytes(handle));
}

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
  if (OwnHandle(handle)) return CUDA_ERROR_INVALID_CONTEXT;
  wire::Writer w;
  w.Put(handle);
  w.Put<uint32_t>(flags);
  std::vector<uint8_t> reply;
  CUresult rc = c.Call(name, ops::kOpIpcOpenMemHandle, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint64_t base = 0, size = 0;
  if (!r.Get(&base) || !r.Get(&size) || r.remaining() != 0 || size == 0) return CUDA_ERROR_UNKNOWN;
  if (c.multi()) {
    // The mapping lies where the opening server's driver put it: refused when
    // another server of this process has device memory there.
    const int server = Client::LastRoute();
    const int there = c.ServerOfPointer(base);
    if ((there >= 0 && there != server) || c.CollidesAcrossServers(base, size, server)) {
      FLYT_WARN(
          "%s: server %d mapped the memory where another server of this process has device "
          "memory (0x%llx, %llu bytes); refused (CUDA_ERROR_NOT_SUPPORTED)",
          name, server, static_cast<unsigned long long>(base),
          static_cast<unsigned long long>(size));
      wire::Writer close;
      close.Put<uint64_t>(base);
      Client::RouteScope route(server);
      c.Call(name, ops::kOpIpcCloseMemHandle, close, ReplySink{});
      return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
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
  Client::RouteScope route(c.multi() ? c.ServerOfPointer(ptr) : -1);  // the memory's server
  CUresult rc = c.Call("cuIpcGetMemHandle", ops::kOpIpcGetMemHandle, w,
                       ReplySink{nullptr, handle, sizeof(*handle)});
  if (rc == CUDA_SUCCESS) NoteExported(*handle);
  return rc;
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
  // The server that opened it, asked before the range is forgotten.
  Client::RouteScope route(c.multi() ? c.ServerOfPointer(ptr) : -1);
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
  w.Put<uint64_t>(Client::WireHandle(event));
  const uint64_t raw = reinterpret_cast<uintptr_t>(event);
  Client::RouteScope route(c.multi() && raw != 0 ? Client::TagOf(raw) : -1);  // the event's
  CUresult rc = c.Call("cuIpcGetEventHandle", ops::kOpIpcGetEventHandle, w,
                       ReplySink{nullptr, handle, sizeof(*handle)});
  if (rc == CUDA_SUCCESS) NoteExported(*handle);
  return rc;
}

FLYT_API CUresult cuIpcOpenEventHandle(CUevent* out, CUipcEventHandle handle) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (OwnHandle(handle)) return CUDA_ERROR_INVALID_CONTEXT;
  wire::Writer w;
  w.Put(handle);
  uint64_t event = 0;
  CUresult rc = c.Call("cuIpcOpenEventHandle", ops::kOpIpcOpenEventHandle, w,
                       ReplySink{nullptr, &event, sizeof(event)});
  if (rc != CUDA_SUCCESS) return rc;
  if (c.multi()) event = Client::Tag(event, Client::LastRoute());
  *out = reinterpret_cast<CUevent>(static_cast<uintptr_t>(event));
  return CUDA_SUCCESS;
}
