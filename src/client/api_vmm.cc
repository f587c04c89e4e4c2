// Virtual memory management entry points (cuMemAddressReserve, cuMemCreate,
// cuMemMap, ...), as PyTorch's expandable segments use them, and the client
// state behind them: reserved ranges (host memory kept out of them), mapped
// ranges (device memory to copies and pointer queries), the references the
// app holds on allocation handles, and the GPU of each handle and mapping
// (pointer attributes). With several servers, where each call goes (below).
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
#include <map>
#include <mutex>
#include <utility>

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

void Client::AddReservation(uint64_t base, uint64_t size, int server) {
  // As for allocations (AddDeviceRange). A range already taken here is still
  // tracked, just not held.
  const bool held = HoldAddressRange(base, size);
  std::lock_guard<std::mutex> lock(state_mu_);
  vmm_reserved_[base] = VmmReservation{size, held, server};
}

bool Client::RemoveReservation(uint64_t base, uint64_t size, bool force) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = vmm_reserved_.find(base);
  if (it == vmm_reserved_.end() || it->second.size != size) return false;
  auto first = vmm_mapped_.lower_bound(base);
  auto last = vmm_mapped_.lower_bound(base + size);
  if (first != last && !force) return false;
  vmm_mapped_.erase(first, last);
  if (it->second.held) munmap(reinterpret_cast<void*>(base), size);
  vmm_reserved_.erase(it);
  return true;
}

bool Client::FindReservation(uint64_t p, uint64_t* base, uint64_t* size) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = vmm_reserved_.upper_bound(p);
  if (it == vmm_reserved_.begin()) return false;
  --it;
  if (p - it->first >= it->second.size) return false;
  *base = it->first;
  *size = it->second.size;
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

bool Client::DropVmmHandleRef(uint64_t handle, bool* last) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = vmm_handle_refs_.find(handle);
  if (it == vmm_handle_refs_.end()) return false;
  const bool gone = --it->second == 0;
  if (gone) vmm_handle_refs_.erase(it);
  if (last != nullptr) *last = gone;
  return true;
}

void Client::ForgetVmmLocked() {
  for (auto& [base, r] : vmm_reserved_)
    if (r.held) munmap(reinterpret_cast<void*>(base), r.size);
  vmm_reserved_.clear();
  vmm_mapped_.clear();
  vmm_handle_refs_.clear();
}

}  // namespace flyt::client

// --- several servers (client/multi_server.cc): a reservation is the server's that made
// it (Client::ServerOfPointer answers for it), an allocation handle of server k >= 1
// carries k in its top byte as other handles do (two servers' handles never meet), and
// device locations travel as that server's ordinals. A call naming two servers (memory
// of one GPU mapped into another server's reservation, access for another server's GPU)
// is refused: nothing joins two servers' address spaces.

namespace {

// The server a call on allocation handle `h` goes to (-1: one server, no change).
int HandleRoute(CUmemGenericAllocationHandle h) {
  return Client::Get().multi() ? Client::TagOf(h) : -1;
}

// The server of a device location, whose ordinal becomes that server's own; -1 for
// another kind of location (host memory, which every server reaches as its own).
int LocationServer(CUmemLocation* loc) {
  Client& c = Client::Get();
  if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE) return -1;
  const int server = c.DeviceServer(loc->id);
  loc->id = c.DeviceLocal(loc->id);
  return server;
}

// Several servers: the server of the GPU allocation properties name (-1: one server, or
// not a device location), *prop then pointing at `local`, a copy with that server's
// ordinal.
int PropServer(const CUmemAllocationProp** prop, CUmemAllocationProp* local) {
  if (!Client::Get().multi() || *prop == nullptr) return -1;
  *local = **prop;
  *prop = local;
  return LocationServer(&local->location);
}

// The server of the reservation holding `p`, else the current context's.
int RangeServer(uint64_t p) {
  Client& c = Client::Get();
  const int server = c.ServerOfPointer(p);
  return server >= 0 ? server : c.RouteNow();
}

// The GPU (a global ordinal) of each allocation handle and mapped range, for pointer
// attributes (DEVICE_ORDINAL names the GPU of the memory, not the current one).
std::mutex& DeviceMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::map<uint64_t, int>& HandleDevice() {  // handle -> device
  static auto* m = new std::map<uint64_t, int>();
  return *m;
}
std::map<uint64_t, std::pair<uint64_t, int>>& MappedDevice() {  // base -> size, device
  static auto* m = new std::map<uint64_t, std::pair<uint64_t, int>>();
  return *m;
}
void NoteHandleDevice(uint64_t handle, int device) {  // -1: forget it
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (device < 0) {
    HandleDevice().erase(handle);
  } else {
    HandleDevice()[handle] = device;
  }
}
// Forgets what lay in [base, base+size), then (`mapped`) notes a mapping there of
// `handle`'s GPU.
void NoteMapped(uint64_t base, uint64_t size, uint64_t handle, bool mapped) {
  std::lock_guard<std::mutex> lock(DeviceMutex());
  auto& m = MappedDevice();
  auto first = m.lower_bound(base);
  if (first != m.begin() && std::prev(first)->first + std::prev(first)->second.first > base)
    --first;
  m.erase(first, m.lower_bound(base + size));
  if (!mapped) return;
  auto h = HandleDevice().find(handle);
  if (h != HandleDevice().end()) m[base] = {size, h->second};
}

}  // namespace

namespace flyt::client {

bool VmmMappedDevice(uint64_t p, int* device) {
  std::lock_guard<std::mutex> lock(DeviceMutex());
  auto& m = MappedDevice();
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  if (p - it->first >= it->second.first) return false;
  *device = it->second.second;
  return true;
}

}  // namespace flyt::client

// --- entry points. Op ids and call classes: protocol/api_list.h (245-253)
// and protocol/ops.h (kOpMemSetAccess, kOpMemRetainAllocationHandle).

FLYT_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                      CUdeviceptr addr, unsigned long long flags) {
  Client& c = Client::Get();
  CUresult rc = Forward<245, true, false>("cuMemAddressReserve", ptr, size, alignment, addr, flags);
  if (rc == CUDA_SUCCESS && ptr != nullptr)
    c.AddReservation(*ptr, size, c.multi() ? Client::LastRoute() : 0);
  return rc;
}

FLYT_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Client& c = Client::Get();
  // The reservation's server, asked before it is forgotten here.
  Client::RouteScope route(c.multi() ? c.ServerOfPointer(ptr) : -1);
  if (c.RemoveReservation(ptr, size, false))
    return Forward<246, false, false>("cuMemAddressFree", ptr, size);
  // Unknown, or still holding mappings: the server's driver decides now.
  CUresult rc = Forward<246, true, false>("cuMemAddressFree", ptr, size);
  if (rc == CUDA_SUCCESS) c.RemoveReservation(ptr, size, true);
  return rc;
}

FLYT_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                              const CUmemAllocationProp* prop, unsigned long long flags) {
  Client& c = Client::Get();
  CUmemAllocationProp local{};
  Client::RouteScope route(PropServer(&prop, &local));  // made by the server of its GPU
  CUresult rc = Forward<247, true, false>("cuMemCreate", handle, size, prop, flags);
  if (rc != CUDA_SUCCESS || handle == nullptr) return rc;
  if (c.multi()) *handle = Client::Tag(*handle, Client::LastRoute());
  c.AddVmmHandleRef(*handle);
  int device = 0;
  if (prop != nullptr && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    device = c.multi() ? c.GlobalDevice(Client::LastRoute(), prop->location.id) : prop->location.id;
  } else if (cuCtxGetDevice(&device) != CUDA_SUCCESS) {
    device = 0;
  }
  NoteHandleDevice(*handle, device);
  return rc;
}

FLYT_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  Client::RouteScope route(HandleRoute(handle));
  const auto sent = static_cast<CUmemGenericAllocationHandle>(Client::WireValue(handle));
  bool last = false;
  if (Client::Get().DropVmmHandleRef(handle, &last)) {
    if (last) NoteHandleDevice(handle, -1);  // the app cannot map it any more
    return Forward<248, false, false>("cuMemRelease", sent);
  }
  return Forward<248, true, false>("cuMemRelease", sent);  // unknown: judged now
}

FLYT_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                           CUmemGenericAllocationHandle handle, unsigned long long flags) {
  Client& c = Client::Get();
  const int server = HandleRoute(handle);
  if (server >= 0) {
    const int reserved = c.ServerOfPointer(ptr);
    if (reserved >= 0 && reserved != server) return flyt::client::RefuseAcrossServers("cuMemMap");
  }
  Client::RouteScope route(server);
  CUresult rc = Forward<249, true, false>(
      "cuMemMap", ptr, size, offset,
      static_cast<CUmemGenericAllocationHandle>(Client::WireValue(handle)), flags);
  if (rc == CUDA_SUCCESS) {
    c.AddMappedRange(ptr, size);
    NoteMapped(ptr, size, handle, true);
  }
  return rc;
}

FLYT_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  Client& c = Client::Get();
  if (c.RemoveMappedRanges(ptr, size, false)) {
    NoteMapped(ptr, size, 0, false);
    return Forward<250, false, false>("cuMemUnmap", ptr, size);
  }
  // Not exactly whole mappings (a hole, say): the server's driver judges now.
  CUresult rc = Forward<250, true, false>("cuMemUnmap", ptr, size);
  if (rc == CUDA_SUCCESS) {
    c.RemoveMappedRanges(ptr, size, true);
    NoteMapped(ptr, size, 0, false);
  }
  return rc;
}

FLYT_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                 size_t count) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((desc == nullptr && count > 0) || count > ops::kMaxAccessDescs)
    return CUDA_ERROR_INVALID_VALUE;
  const int server = c.multi() ? RangeServer(ptr) : -1;
  wire::Writer w;
  w.Put<uint64_t>(ptr);
  w.Put<uint64_t>(size);
  w.Put<uint32_t>(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) {
    CUmemAccessDesc d = desc[i];
    if (server >= 0) {
      const int s = LocationServer(&d.location);
      if (s >= 0 && s != server) return flyt::client::RefuseAcrossServers("cuMemSetAccess");
    }
    w.Put(d);
  }
  Client::RouteScope route(server);
  return c.Call("cuMemSetAccess", ops::kOpMemSetAccess, w, ReplySink{});
}

FLYT_API CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                 CUdeviceptr ptr) {
  Client& c = Client::Get();
  CUmemLocation local{};
  int server = -1;
  if (c.multi() && location != nullptr) {
    local = *location;
    server = RangeServer(ptr);
    const int s = LocationServer(&local);
    if (s >= 0 && s != server) return flyt::client::RefuseAcrossServers("cuMemGetAccess");
    location = &local;
  }
  Client::RouteScope route(server);
  return Forward<251, true, false>("cuMemGetAccess", flags, location, ptr);
}

FLYT_API CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                const CUmemAllocationProp* prop,
                                                CUmemAllocationGranularity_flags option) {
  CUmemAllocationProp local{};
  Client::RouteScope route(PropServer(&prop, &local));  // asked of the server of its GPU
  return Forward<252, true, false>("cuMemGetAllocationGranularity", granularity, prop, option);
}

FLYT_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                         CUmemGenericAllocationHandle handle) {
  const int server = HandleRoute(handle);
  Client::RouteScope route(server);
  CUresult rc = Forward<253, true, false>(
      "cuMemGetAllocationPropertiesFromHandle", prop,
      static_cast<CUmemGenericAllocationHandle>(Client::WireValue(handle)));
  // The GPU it names, as this process numbers them.
  if (rc == CUDA_SUCCESS && server >= 0 && prop != nullptr &&
      prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
    prop->location.id = Client::Get().GlobalDevice(server, prop->location.id);
  return rc;
}

FLYT_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  wire::Writer w;
  w.Put<uint8_t>(handle != nullptr);
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(addr));
  CUmemGenericAllocationHandle got = 0;
  Client::RouteScope route(c.multi() ? RangeServer(reinterpret_cast<uintptr_t>(addr)) : -1);
  CUresult rc = c.Call("cuMemRetainAllocationHandle", ops::kOpMemRetainAllocationHandle, w,
                       ReplySink{nullptr, &got, sizeof(got)});
  if (rc == CUDA_SUCCESS && handle != nullptr) {
    if (c.multi()) got = Client::Tag(got, Client::LastRoute());
    *handle = got;
    c.AddVmmHandleRef(got);
    int device = 0;
    if (flyt::client::VmmMappedDevice(reinterpret_cast<uintptr_t>(addr), &device))
      NoteHandleDevice(got, device);
  }
  return rc;
}

// --- shareable handles (POSIX file descriptors) between processes of one server

namespace {

// What the descriptor the app gets holds: the main process's key and secret for
// the driver's descriptor, which stays on the GPU host, and the server's place in
// FLYT_SERVER (an importer with the same list asks that server; a file without the
// field, from an older library, is server 0's).
struct ShareableHandleFile {
  char magic[8] = {'F', 'L', 'Y', 'T', 'V', 'M', 'M', '1'};
  uint64_t key = 0;
  uint64_t secret = 0;
  uint32_t server = 0;
  uint32_t reserved = 0;
};
constexpr size_t kShareableFileV1 = 24;  // the bytes before `server`

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
  w.Put<uint64_t>(Client::WireValue(handle));
  w.Put<uint32_t>(static_cast<uint32_t>(type));
  w.Put<uint64_t>(flags);
  uint64_t reply[2] = {0, 0};
  const int server = HandleRoute(handle);
  Client::RouteScope route(server);
  CUresult rc = c.Call("cuMemExportToShareableHandle", ops::kOpMemExportShareable, w,
                       ReplySink{nullptr, reply, sizeof(reply)});
  if (rc != CUDA_SUCCESS) return rc;
  ShareableHandleFile file;
  file.key = reply[0];
  file.secret = reply[1];
  file.server = server > 0 ? static_cast<uint32_t>(server) : 0;
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
  const ssize_t got_bytes = pread(fd, &file, sizeof(file), 0);
  if (got_bytes < static_cast<ssize_t>(kShareableFileV1) ||
      std::memcmp(file.magic, magic, sizeof(magic)) != 0) {
    FLYT_INFO("cuMemImportFromShareableHandle: descriptor %d is not one a Flyt process exported",
              fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (file.server >= static_cast<uint32_t>(c.server_count())) {
    FLYT_INFO(
        "cuMemImportFromShareableHandle: descriptor %d names server %u of its exporter's "
        "FLYT_SERVER, which this process does not have",
        fd, file.server);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int server = static_cast<int>(file.server);
  Client::RouteScope route(c.multi() ? server : -1);
  wire::Writer w;
  w.Put<uint64_t>(file.key);
  w.Put<uint64_t>(file.secret);
  w.Put<uint32_t>(static_cast<uint32_t>(type));
  CUmemGenericAllocationHandle got = 0;
  CUresult rc = c.Call("cuMemImportFromShareableHandle", ops::kOpMemImportShareable, w,
                       ReplySink{nullptr, &got, sizeof(got)});
  if (rc != CUDA_SUCCESS) return rc;
  if (c.multi()) got = Client::Tag(got, server);
  *handle = got;
  c.AddVmmHandleRef(got);
  CUmemAllocationProp prop{};  // its GPU, for pointer attributes of its mappings
  if (cuMemGetAllocationPropertiesFromHandle(&prop, got) == CUDA_SUCCESS &&
      prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
    NoteHandleDevice(got, prop.location.id);
  return CUDA_SUCCESS;
}
