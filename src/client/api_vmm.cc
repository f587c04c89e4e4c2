// Virtual memory management entry points (cuMemAddressReserve, cuMemCreate,
// cuMemMap, ...), as PyTorch's expandable segments use them, and the client
// state behind them: reserved ranges (host memory kept out of them), mapped
// ranges (device memory to copies and pointer queries) and the references the
// app holds on allocation handles.
//
// Owns: the hand-written client side of the VMM calls. The server checks that
// every range and handle is the session's own and charges the quota
// (server/session_vmm.cc); this file only decides which calls may go
// asynchronously: tear-downs of what it knows to exist. Must not touch other
// device ranges (cuMemAlloc's) or the transport.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "client/client.h"
#include "client/proc_address.h"
#include "common/log.h"

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

// --- client state (members of Client, kept here with the calls that use them)

namespace flyt::client {

void Client::AddReservation(uint64_t base, uint64_t size) {
  // As for allocations (AddDeviceRange). A range already taken here is still
  // tracked, just not held.
  const bool held = HoldAddressRange(base, size);
  std::lock_guard<std::mutex> lock(state_mu_);
  vmm_reserved_[base] = {size, held};
}

bool Client::RemoveReservation(uint64_t base, uint64_t size, bool force) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = vmm_reserved_.find(base);
  if (it == vmm_reserved_.end() || it->second.first != size) return false;
  auto first = vmm_mapped_.lower_bound(base);
  auto last = vmm_mapped_.lower_bound(base + size);
  if (first != last && !force) return false;
  vmm_mapped_.erase(first, last);
  if (it->second.second) munmap(reinterpret_cast<void*>(base), size);
  vmm_reserved_.erase(it);
  return true;
}

bool Client::FindReservation(uint64_t p, uint64_t* base, uint64_t* size) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = vmm_reserved_.upper_bound(p);
  if (it == vmm_reserved_.begin()) return false;
  --it;
  if (p - it->first >= it->second.first) return false;
  *base = it->first;
  *size = it->second.first;
  return true;
}

void Client::AddMappedRange(uint64_t base, uint64_t size) {
  std::lock_guard<std::mutex> lock(state_mu_);
  vmm_mapped_[base] = size;
}

bool Client::RemoveMappedRanges(uint64_t base, uint64_t size, bool force) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (force) {  // the driver unmapped the range: whatever lay inside is gone
    vmm_mapped_.erase(vmm_mapped_.lower_bound(base), vmm_mapped_.lower_bound(base + size));
    return true;
  }
  auto first = vmm_mapped_.find(base);
  if (first == vmm_mapped_.end() || size == 0) return false;
  uint64_t end = base;
  auto it = first;
  while (it != vmm_mapped_.end() && it->first == end && end - base < size) {
    end += it->second;
    ++it;
  }
  if (end - base != size) return false;  // not whole mappings, or a hole
  vmm_mapped_.erase(first, it);
  return true;
}

void Client::AddVmmHandleRef(uint64_t handle) {
  std::lock_guard<std::mutex> lock(state_mu_);
  vmm_handle_refs_[handle]++;
}

bool Client::DropVmmHandleRef(uint64_t handle) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = vmm_handle_refs_.find(handle);
  if (it == vmm_handle_refs_.end()) return false;
  if (--it->second == 0) vmm_handle_refs_.erase(it);
  return true;
}

void Client::ForgetVmmLocked() {
  for (auto& [base, r] : vmm_reserved_)
    if (r.second) munmap(reinterpret_cast<void*>(base), r.first);
  vmm_reserved_.clear();
  vmm_mapped_.clear();
  vmm_handle_refs_.clear();
}

}  // namespace flyt::client

// --- entry points. Op ids and call classes: protocol/api_list.h (245-253)
// and protocol/ops.h (kOpMemSetAccess, kOpMemRetainAllocationHandle).

FLYT_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                      CUdeviceptr addr, unsigned long long flags) {
  CUresult rc = Forward<245, true, false>("cuMemAddressReserve", ptr, size, alignment, addr, flags);
  if (rc == CUDA_SUCCESS && ptr != nullptr) Client::Get().AddReservation(*ptr, size);
  return rc;
}

FLYT_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Client& c = Client::Get();
  if (c.RemoveReservation(ptr, size, false))
    return Forward<246, false, false>("cuMemAddressFree", ptr, size);
  // Unknown, or still holding mappings: the server's driver decides now.
  CUresult rc = Forward<246, true, false>("cuMemAddressFree", ptr, size);
  if (rc == CUDA_SUCCESS) c.RemoveReservation(ptr, size, true);
  return rc;
}

FLYT_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                              const CUmemAllocationProp* prop, unsigned long long flags) {
  CUresult rc = Forward<247, true, false>("cuMemCreate", handle, size, prop, flags);
  if (rc == CUDA_SUCCESS && handle != nullptr) Client::Get().AddVmmHandleRef(*handle);
  return rc;
}

FLYT_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (Client::Get().DropVmmHandleRef(handle))
    return Forward<248, false, false>("cuMemRelease", handle);
  return Forward<248, true, false>("cuMemRelease", handle);  // unknown: judged now
}

FLYT_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                           CUmemGenericAllocationHandle handle, unsigned long long flags) {
  CUresult rc = Forward<249, true, false>("cuMemMap", ptr, size, offset, handle, flags);
  if (rc == CUDA_SUCCESS) Client::Get().AddMappedRange(ptr, size);
  return rc;
}

FLYT_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  Client& c = Client::Get();
  if (c.RemoveMappedRanges(ptr, size, false))
    return Forward<250, false, false>("cuMemUnmap", ptr, size);
  // Not exactly whole mappings (a hole, say): the server's driver judges now.
  CUresult rc = Forward<250, true, false>("cuMemUnmap", ptr, size);
  if (rc == CUDA_SUCCESS) c.RemoveMappedRanges(ptr, size, true);
  return rc;
}

FLYT_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                 size_t count) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((desc == nullptr && count > 0) || count > ops::kMaxAccessDescs)
    return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint64_t>(ptr);
  w.Put<uint64_t>(size);
  w.Put<uint32_t>(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) w.Put(desc[i]);
  return c.Call("cuMemSetAccess", ops::kOpMemSetAccess, w, ReplySink{});
}

FLYT_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  wire::Writer w;
  w.Put<uint8_t>(handle != nullptr);
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(addr));
  CUmemGenericAllocationHandle got = 0;
  CUresult rc = c.Call("cuMemRetainAllocationHandle", ops::kOpMemRetainAllocationHandle, w,
                       ReplySink{nullptr, &got, sizeof(got)});
  if (rc == CUDA_SUCCESS && handle != nullptr) {
    *handle = got;
    c.AddVmmHandleRef(got);
  }
  return rc;
}

// --- shareable handles (POSIX file descriptors) between processes of one server

namespace {

// What the descriptor the app gets holds: the main process's key and secret for
// the driver's descriptor, which stays on the GPU host.
struct ShareableHandleFile {
  char magic[8] = {'F', 'L', 'Y', 'T', 'V', 'M', 'M', '1'};
  uint64_t key = 0;
  uint64_t secret = 0;
};

bool ServedHandleType(CUmemAllocationHandleType type) {
  return type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

}  // namespace

FLYT_API CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                               CUmemAllocationHandleType type,
                                               unsigned long long flags) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (shareable == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ServedHandleType(type))  // fabric and Win32 handles leave the host: not served
    return static_cast<CUresult>(flyt::client::ReportUnsupported("cuMemExportToShareableHandle"));
  wire::Writer w;
  w.Put<uint64_t>(handle);
  w.Put<uint32_t>(static_cast<uint32_t>(type));
  w.Put<uint64_t>(flags);
  uint64_t reply[2] = {0, 0};
  CUresult rc = c.Call("cuMemExportToShareableHandle", ops::kOpMemExportShareable, w,
                       ReplySink{nullptr, reply, sizeof(reply)});
  if (rc != CUDA_SUCCESS) return rc;
  ShareableHandleFile file;
  file.key = reply[0];
  file.secret = reply[1];
  // Not close-on-exec, like the driver's descriptor: apps hand it on as they like.
  const int fd = memfd_create("flyt-vmm-handle", MFD_ALLOW_SEALING);
  if (fd < 0 || pwrite(fd, &file, sizeof(file), 0) != static_cast<ssize_t>(sizeof(file)) ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    FLYT_ERROR("cuMemExportToShareableHandle: cannot make the descriptor (%s)",
               std::strerror(errno));
    if (fd >= 0) close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                 void* os_handle, CUmemAllocationHandleType type) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ServedHandleType(type))
    return static_cast<CUresult>(flyt::client::ReportUnsupported("cuMemImportFromShareableHandle"));
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  ShareableHandleFile file;
  char magic[sizeof(file.magic)];
  std::memcpy(magic, file.magic, sizeof(magic));
  if (pread(fd, &file, sizeof(file), 0) != static_cast<ssize_t>(sizeof(file)) ||
      std::memcmp(file.magic, magic, sizeof(magic)) != 0) {
    FLYT_INFO("cuMemImportFromShareableHandle: descriptor %d is not one a Flyt process exported",
              fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  wire::Writer w;
  w.Put<uint64_t>(file.key);
  w.Put<uint64_t>(file.secret);
  w.Put<uint32_t>(static_cast<uint32_t>(type));
  CUmemGenericAllocationHandle got = 0;
  CUresult rc = c.Call("cuMemImportFromShareableHandle", ops::kOpMemImportShareable, w,
                       ReplySink{nullptr, &got, sizeof(got)});
  if (rc != CUDA_SUCCESS) return rc;
  *handle = got;
  c.AddVmmHandleRef(got);
  return CUDA_SUCCESS;
}
