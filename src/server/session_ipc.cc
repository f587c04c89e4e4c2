// CUDA IPC of one session: cuIpcGetMemHandle, cuIpcOpenMemHandle,
// cuIpcCloseMemHandle, cuIpcGetEventHandle and cuIpcOpenEventHandle
// (hand-written ops, protocol/ops.h; server/session.h).
//
// Owns: the memory the session opened over IPC (base -> size, opens not yet
// closed), which it closes, never frees, when the client leaves, and which is
// not charged to the tenant's quota (the exporter's allocation is); the
// handles its client exported, so that opening one of them is refused with
// CUDA_ERROR_INVALID_CONTEXT as the driver refuses a process its own handles
// (needed where one server process serves several clients, and by the sim
// backend, which opens handles of its own process). An opened event is an
// ordinary event handle of the session. Handles are the driver's 64 bytes,
// passed through: clients served by different server processes on one host
// share memory and events as natively. Must not touch other sessions' state.
#include <atomic>
#include <cstring>
#include <string>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

namespace {

unsigned long long Id(uint64_t v) { return static_cast<unsigned long long>(v); }

template <typename H>
std::string Bytes(const H& handle) {
  static_assert(sizeof(H) == ops::kIpcHandleBytes);
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(H));
}

}  // namespace

bool Session::IpcMapped(uint64_t p, uint64_t n) const {
  auto it = ipc_opened_.upper_bound(p);
  if (it == ipc_opened_.begin()) return false;
  --it;
  return p - it->first < it->second.size && n <= it->second.size - (p - it->first);
}

// Request: u64 device pointer. Reply: the handle. Any address inside one of
// the session's own allocations names it, as with the driver.
bool Session::IpcGetMemHandle(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint64_t ptr = 0;
  if (!in.Get(&ptr) || in.remaining() != 0) return false;
  DriverApi& a = api();
  if (a.cuIpcGetMemHandle == nullptr || a.cuMemGetAddressRange_v2 == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  // Memory the session mapped itself (movable, or restored after a move) is
  // not the driver's cuMemAlloc memory, which alone has legacy IPC handles.
  if (InMappedRegion(ptr)) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      if (placed_slot_ >= 0)  // kOpPlaceMemory: a client of several servers
        FLYT_WARN(
            "session %llu: cuIpcGetMemHandle refused: the client uses several servers, which "
            "place its memory apart as movable memory (no legacy IPC handle)",
            Id(id_));
      else
        FLYT_WARN(
            "session %llu: cuIpcGetMemHandle refused: the memory is movable (this server runs "
            "with --movable-memory, or the session was moved here); run the tenant without "
            "--movable-memory to share memory by CUDA IPC",
            Id(id_));
    }
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  *rc = a.cuMemGetAddressRange_v2(&base, &size, ptr);
  if (*rc == CUDA_ERROR_NOT_FOUND || *rc == CUDA_ERROR_INVALID_VALUE ||
      (*rc == CUDA_SUCCESS && !Owns(marshal::HandleKind::kMemory, base))) {
    *rc = CUDA_ERROR_INVALID_VALUE;  // not an allocation of this client's
    return true;
  }
  if (*rc != CUDA_SUCCESS) return true;
  CUipcMemHandle handle{};
  *rc = a.cuIpcGetMemHandle(&handle, ptr);
  if (*rc != CUDA_SUCCESS) return true;
  ipc_exported_mem_.insert(Bytes(handle));
  out.Put(handle);
  return true;
}

// Request: handle, u32 flags. Reply: u64 base, u64 bytes mapped.
bool Session::IpcOpenMemHandle(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  CUipcMemHandle handle{};
  uint32_t flags = 0;
  if (!in.Get(&handle) || !in.Get(&flags) || in.remaining() != 0) return false;
  DriverApi& a = api();
  if (a.cuIpcOpenMemHandle_v2 == nullptr || a.cuIpcCloseMemHandle == nullptr ||
      a.cuMemGetAddressRange_v2 == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  // The flags are checked first, as by the driver.
  if (!(flags & CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (ipc_exported_mem_.count(Bytes(handle)) != 0) {
    FLYT_INFO("session %llu: cuIpcOpenMemHandle of a handle this client exported itself", Id(id_));
    *rc = CUDA_ERROR_INVALID_CONTEXT;
    return true;
  }
  CUdeviceptr base = 0;
  *rc = a.cuIpcOpenMemHandle_v2(&base, handle, flags);
  if (*rc != CUDA_SUCCESS) return true;
  CUdeviceptr start = 0;
  size_t size = 0;
  CUresult range = a.cuMemGetAddressRange_v2(&start, &size, base);
  if (range != CUDA_SUCCESS || start != base || size == 0) {
    FLYT_WARN("session %llu: memory opened over IPC at 0x%llx has no range (error %d)", Id(id_),
              Id(base), range);
    CUresult closed = a.cuIpcCloseMemHandle(base);
    if (closed != CUDA_SUCCESS)
      FLYT_WARN("session %llu: cuIpcCloseMemHandle(0x%llx) failed with error %d", Id(id_), Id(base),
                closed);
    *rc = range != CUDA_SUCCESS ? range : CUDA_ERROR_UNKNOWN;
    return true;
  }
  IpcOpened& opened = ipc_opened_[base];
  opened.size = size;
  opened.refs++;
  out.Put<uint64_t>(base);
  out.Put<uint64_t>(size);
  return true;
}

// Request: u64 base (as the open returned it).
bool Session::IpcCloseMemHandle(wire::Reader& in, CUresult* rc) {
  uint64_t base = 0;
  if (!in.Get(&base) || in.remaining() != 0) return false;
  auto it = ipc_opened_.find(base);
  if (it == ipc_opened_.end()) {  // another client's opens are not this one's to close
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  *rc = api().cuIpcCloseMemHandle(base);
  if (*rc == CUDA_SUCCESS && --it->second.refs == 0) ipc_opened_.erase(it);
  return true;
}

// Request: u64 event. Reply: the handle.
bool Session::IpcGetEventHandle(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint64_t event = 0;
  if (!in.Get(&event) || in.remaining() != 0) return false;
  if (api().cuIpcGetEventHandle == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  if (!Owns(marshal::HandleKind::kEvent, event)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  event = RealHandle(marshal::HandleKind::kEvent, event);
  CUipcEventHandle handle{};
  *rc = api().cuIpcGetEventHandle(&handle, reinterpret_cast<CUevent>(event));
  if (*rc != CUDA_SUCCESS) return true;
  ipc_exported_events_.insert(Bytes(handle));
  out.Put(handle);
  return true;
}

// Request: handle. Reply: u64 event, a handle of this session from now on.
bool Session::IpcOpenEventHandle(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  CUipcEventHandle handle{};
  if (!in.Get(&handle) || in.remaining() != 0) return false;
  if (api().cuIpcOpenEventHandle == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  if (ipc_exported_events_.count(Bytes(handle)) != 0) {
    FLYT_INFO("session %llu: cuIpcOpenEventHandle of a handle this client exported itself",
              Id(id_));
    *rc = CUDA_ERROR_INVALID_CONTEXT;
    return true;
  }
  CUevent event = nullptr;
  *rc = api().cuIpcOpenEventHandle(&event, handle);
  if (*rc != CUDA_SUCCESS) return true;
  Adopt(marshal::HandleKind::kEvent, reinterpret_cast<uintptr_t>(event));
  out.Put<uint64_t>(reinterpret_cast<uintptr_t>(event));
  return true;
}

void Session::ReleaseIpc() {
  size_t mappings = ipc_opened_.size();
  for (auto& [base, opened] : ipc_opened_) {
    for (; opened.refs > 0; --opened.refs) {
      CUresult rc = api().cuIpcCloseMemHandle(base);
      if (rc != CUDA_SUCCESS) {
        FLYT_WARN("session %llu: cuIpcCloseMemHandle(0x%llx) failed with error %d", Id(id_),
                  Id(base), rc);
        break;
      }
    }
  }
  ipc_opened_.clear();
  ipc_exported_mem_.clear();
  ipc_exported_events_.clear();
  if (mappings > 0) FLYT_INFO("session %llu: closed %zu IPC memory mappings", Id(id_), mappings);
}

}  // namespace flyt::server
