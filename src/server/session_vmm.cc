// Virtual memory management of one session: cuMemAddressReserve, cuMemCreate,
// cuMemMap, cuMemSetAccess and the calls that undo them (server/session.h).
//
// Owns: the session's reservations, mappings and allocation handles, the
// checks that a client names only its own (the driver crashes on a bogus
// handle, and another session's ranges are not this one's to touch), the
// quota charge of physical memory, and the release of it all when the session
// ends, however it ends. Most calls arrive through the generic handler
// (server/session_vmm.h); cuMemSetAccess and cuMemRetainAllocationHandle are
// hand-written (protocol/ops.h). Must not touch other sessions' state.
//
// Quota: cuMemCreate charges its size before the driver allocates. The
// driver frees physical memory once it is released AND unmapped, and the
// refund comes then: at the cuMemRelease that drops the client's last
// reference when nothing maps it any more, or at the cuMemUnmap of its last
// mapping after that. Reservations are address space only and charge nothing.
//
// Moving: with --movable-memory a reservation the app asks for is carved out
// of the session's movable range (session_movable.cc) instead of the driver's
// address space, so a restore can reserve it again at the same address; the
// session keeps what a snapshot needs and the driver does not tell (sizes and
// properties of allocations, mapping offsets, access set). Allocation handles
// are the client's values: a restored session's driver made others (VmmReal).
// The snapshot side is session_vmm_move.cc.
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <vector>

#include "common/log.h"
#include "server/session.h"
#include "server/worker.h"

namespace flyt::server {

namespace {

unsigned long long Id(uint64_t v) { return static_cast<unsigned long long>(v); }

// [base, base+size) holds [p, p+n); n > 0, no overflow.
bool Holds(uint64_t base, uint64_t size, uint64_t p, uint64_t n) {
  return p >= base && p - base <= size && n <= size - (p - base);
}

}  // namespace

std::map<uint64_t, VmmMapping>::iterator Session::VmmMappingAt(uint64_t ptr) {
  auto it = vmm_mapped_.upper_bound(ptr);
  if (it == vmm_mapped_.begin()) return vmm_mapped_.end();
  --it;
  return ptr - it->first < it->second.size ? it : vmm_mapped_.end();
}

bool Session::VmmUnmappable(uint64_t ptr, uint64_t size,
                            std::map<uint64_t, VmmMapping>::iterator* first,
                            std::map<uint64_t, VmmMapping>::iterator* last) {
  auto r = vmm_reserved_.upper_bound(ptr);
  if (size == 0 || r == vmm_reserved_.begin() ||
      !Holds(std::prev(r)->first, std::prev(r)->second, ptr, size))
    return false;
  *first = vmm_mapped_.lower_bound(ptr);
  *last = vmm_mapped_.lower_bound(ptr + size);
  // No mapping may stick out at either end.
  if (*first != vmm_mapped_.begin() &&
      ptr - std::prev(*first)->first < std::prev(*first)->second.size)
    return false;
  return *last == *first || std::prev(*last)->second.size <= ptr + size - std::prev(*last)->first;
}

void Session::VmmDropHandleIfUnused(uint64_t handle) {
  auto it = vmm_handles_.find(handle);
  if (it == vmm_handles_.end() || it->second.refs > 0 || it->second.mappings > 0) return;
  RefundMemory(it->second.charged, it->second.device);  // the driver has freed it
  vmm_handles_.erase(it);
  VmmForgetHandleValue(handle);
}

uint64_t Session::VmmClient(uint64_t real) {
  if (vmm_real_.empty()) return real;
  auto known = vmm_client_.find(real);
  if (known != vmm_client_.end()) return known->second;
  // The driver's new value may be one the client still uses for another
  // allocation: the client gets a value no live handle has.
  uint64_t client = vmm_real_.count(real) != 0 ? next_synthetic_++ : real;
  vmm_real_[client] = real;
  vmm_client_[real] = client;
  return client;
}

void Session::VmmForgetHandleValue(uint64_t client) {
  auto it = vmm_real_.find(client);
  if (it == vmm_real_.end()) return;
  vmm_client_.erase(it->second);
  vmm_real_.erase(it);
}

CUresult Session::VmmAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags) {
  if (PlacesMemory() && ptr != nullptr) {
    bool handled = false;
    CUresult rc = VmmCarve(ptr, size, alignment, addr, flags, &handled);
    if (handled || rc != CUDA_SUCCESS) return rc;
  }
  CUresult rc = api().cuMemAddressReserve(ptr, size, alignment, addr, flags);
  if (rc == CUDA_SUCCESS && ptr != nullptr) vmm_reserved_[*ptr] = size;
  return rc;
}

CUresult Session::VmmAddressFree(CUdeviceptr ptr, size_t size) {
  auto it = vmm_reserved_.find(ptr);
  if (it == vmm_reserved_.end() || it->second != size) {
    FLYT_INFO(
        "session %llu: cuMemAddressFree(0x%llx, %zu) refused: not a range this client "
        "reserved with that size",
        Id(id_), Id(ptr), size);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (vmm_carved_.count(ptr) != 0) {
    // Part of the session's own reservation: the driver's answer for a range
    // that still maps memory (measured on an H100), else back to the range.
    auto inside = vmm_mapped_.lower_bound(ptr);
    if (inside != vmm_mapped_.end() && inside->first - ptr < size) return CUDA_ERROR_INVALID_VALUE;
    movable_.Give(ptr, size);
    vmm_carved_.erase(ptr);
    vmm_reserved_.erase(it);
    return CUDA_SUCCESS;
  }
  CUresult rc = api().cuMemAddressFree(ptr, size);
  if (rc != CUDA_SUCCESS) return rc;
  vmm_reserved_.erase(it);
  // Whatever the driver did with mappings still inside, they are gone for the client.
  VmmForgetMappings(vmm_mapped_.lower_bound(ptr), vmm_mapped_.lower_bound(ptr + size));
  return CUDA_SUCCESS;
}

CUresult Session::VmmCreate(CUmemGenericAllocationHandle* handle, size_t size,
                            const CUmemAllocationProp* prop, unsigned long long flags) {
  // Charged to the device the memory is on.
  const int device = prop != nullptr && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                         ? prop->location.id
                         : CurrentDevice();
  if (!ChargeMemory(size, device)) {
    FLYT_INFO("session %llu: cuMemCreate of %zu bytes refused: over the tenant's memory quota",
              Id(id_), size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult rc = api().cuMemCreate(handle, size, prop, flags);
  if (rc != CUDA_SUCCESS || handle == nullptr) {
    RefundMemory(size, device);
    return rc;
  }
  *handle = VmmClient(*handle);
  VmmHandle& h = vmm_handles_[*handle];
  h.charged += size;  // (+=: were the driver to hand out a value still in the table)
  h.device = device;
  h.refs++;
  h.driver_refs++;
  h.size = size;
  if (prop != nullptr) h.prop = *prop;
  return CUDA_SUCCESS;
}

CUresult Session::VmmRelease(CUmemGenericAllocationHandle handle) {
  auto it = vmm_handles_.find(handle);
  if (it == vmm_handles_.end() || it->second.refs == 0) {
    FLYT_INFO(
        "session %llu: cuMemRelease(0x%llx) refused: not an allocation handle this client "
        "holds (released already, or never made by cuMemCreate here)",
        Id(id_), Id(handle));
    return CUDA_ERROR_INVALID_VALUE;
  }
  // A restored handle's driver references: one for all the client holds.
  VmmHandle& h = it->second;
  if (h.driver_refs >= h.refs) {
    CUresult rc = api().cuMemRelease(VmmReal(handle));
    if (rc != CUDA_SUCCESS) return rc;
    h.driver_refs--;
  }
  h.refs--;
  VmmDropHandleIfUnused(handle);
  return CUDA_SUCCESS;
}

CUresult Session::VmmMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
  auto h = vmm_handles_.find(handle);
  if (h == vmm_handles_.end() || h->second.refs == 0) {
    FLYT_INFO(
        "session %llu: cuMemMap of handle 0x%llx refused: not an allocation handle this "
        "client holds",
        Id(id_), Id(handle));
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The range must lie in one of this session's reservations and overlap none
  // of its mappings: another session's addresses are not this one's to map.
  auto r = vmm_reserved_.upper_bound(ptr);
  bool reserved = size > 0 && r != vmm_reserved_.begin() &&
                  Holds(std::prev(r)->first, std::prev(r)->second, ptr, size);
  auto next = vmm_mapped_.lower_bound(ptr);
  bool overlaps =
      (next != vmm_mapped_.end() && next->first - ptr < size) ||
      (next != vmm_mapped_.begin() && ptr - std::prev(next)->first < std::prev(next)->second.size);
  if (!reserved || overlaps) {
    FLYT_INFO("session %llu: cuMemMap(0x%llx, %zu) refused: %s", Id(id_), Id(ptr), size,
              !reserved ? "the range is not inside a reservation of this client"
                        : "the range overlaps a mapping");
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult rc = api().cuMemMap(ptr, size, offset, VmmReal(handle), flags);
  if (rc != CUDA_SUCCESS) return rc;
  vmm_mapped_[ptr] = VmmMapping{size, handle, offset, {}};
  h->second.mappings++;
  return CUDA_SUCCESS;
}

CUresult Session::VmmUnmap(CUdeviceptr ptr, size_t size) {
  // Inside one of this session's reservations, cutting no mapping in two; the
  // driver accepts a range that maps nothing (measured on H100/H200).
  std::map<uint64_t, VmmMapping>::iterator first, last;
  if (!VmmUnmappable(ptr, size, &first, &last)) {
    FLYT_INFO(
        "session %llu: cuMemUnmap(0x%llx, %zu) refused: the range is not whole mappings "
        "inside a reservation of this client",
        Id(id_), Id(ptr), size);
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult rc = api().cuMemUnmap(ptr, size);
  if (rc != CUDA_SUCCESS) return rc;
  VmmForgetMappings(first, last);
  return CUDA_SUCCESS;
}

void Session::VmmForgetMappings(std::map<uint64_t, VmmMapping>::iterator first,
                                std::map<uint64_t, VmmMapping>::iterator last) {
  std::vector<uint64_t> handles;
  for (auto m = first; m != last; ++m) handles.push_back(m->second.handle);
  vmm_mapped_.erase(first, last);
  for (uint64_t handle : handles) {
    auto it = vmm_handles_.find(handle);
    if (it != vmm_handles_.end() && it->second.mappings > 0) it->second.mappings--;
    VmmDropHandleIfUnused(handle);
  }
}

CUresult Session::VmmGetAccess(unsigned long long* flags, const CUmemLocation* location,
                               CUdeviceptr ptr) {
  if (VmmMappingAt(ptr) == vmm_mapped_.end()) return CUDA_ERROR_INVALID_VALUE;
  return api().cuMemGetAccess(flags, location, ptr);
}

CUresult Session::VmmGetProperties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  // A released handle still mapped is still known to the driver, which answers.
  if (vmm_handles_.count(handle) == 0) return CUDA_ERROR_INVALID_VALUE;
  return api().cuMemGetAllocationPropertiesFromHandle(prop, VmmReal(handle));
}

// Request: u64 ptr, u64 size, u32 count, count x CUmemAccessDesc.
bool Session::VmmSetAccess(wire::Reader& in, CUresult* rc) {
  uint64_t ptr = 0, size = 0;
  uint32_t count = 0;
  if (!in.Get(&ptr) || !in.Get(&size) || !in.Get(&count) || count > ops::kMaxAccessDescs)
    return false;
  CUmemAccessDesc descs[ops::kMaxAccessDescs];
  if (!in.GetBytes(descs, sizeof(CUmemAccessDesc) * count) || in.remaining() != 0) return false;
  // The range must lie in this session's mappings (following one another);
  // whether a part of a mapping will do is the driver's to judge.
  auto at = VmmMappingAt(ptr);
  bool covered = at != vmm_mapped_.end() && size > 0;
  if (covered) {
    uint64_t end = at->first + at->second.size;
    for (auto it = std::next(at); end - ptr < size && it != vmm_mapped_.end() && it->first == end;
         ++it)
      end += it->second.size;
    covered = end - ptr >= size;
  }
  if (!covered) {
    FLYT_INFO(
        "session %llu: cuMemSetAccess(0x%llx, %llu) refused: the range is not mapped by "
        "this client",
        Id(id_), Id(ptr), Id(size));
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (api().cuMemSetAccess == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  *rc = api().cuMemSetAccess(ptr, size, count > 0 ? descs : nullptr, count);
  if (*rc != CUDA_SUCCESS) return true;
  // What a restore sets again, per mapping (the part of it this call covered).
  for (auto it = at; it != vmm_mapped_.end() && it->first < ptr + size; ++it) {
    VmmMapping& m = it->second;
    const uint64_t lo = std::max(ptr, it->first);
    const uint64_t hi = std::min(ptr + size, it->first + m.size);
    VmmAccess set{lo - it->first, hi - lo, std::vector<CUmemAccessDesc>(descs, descs + count)};
    if (set.offset == 0 && set.size == m.size) {
      // Over the whole mapping: earlier settings for the same devices are moot.
      auto covered = [&](const VmmAccess& old) {
        for (const CUmemAccessDesc& d : old.descs) {
          bool found = false;
          for (const CUmemAccessDesc& n : set.descs)
            found = found || (n.location.type == d.location.type && n.location.id == d.location.id);
          if (!found) return false;
        }
        return true;
      };
      m.access.erase(std::remove_if(m.access.begin(), m.access.end(), covered), m.access.end());
    }
    m.access.push_back(std::move(set));
  }
  return true;
}

// Request: u8 want handle, u64 address. Reply: u64 handle.
bool Session::VmmRetainHandle(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint8_t want = 0;
  uint64_t addr = 0;
  if (!in.Get(&want) || !in.Get(&addr) || in.remaining() != 0) return false;
  auto at = VmmMappingAt(addr);
  if (at == vmm_mapped_.end()) {
    *rc = CUDA_ERROR_INVALID_VALUE;  // the driver's answer for an address it did not map
    return true;
  }
  if (api().cuMemRetainAllocationHandle == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  CUmemGenericAllocationHandle handle = 0;
  *rc = api().cuMemRetainAllocationHandle(want ? &handle : nullptr,
                                          reinterpret_cast<void*>(static_cast<uintptr_t>(addr)));
  if (*rc != CUDA_SUCCESS) return true;
  // The handle of the mapping: the driver gave it a reference more.
  handle = VmmClient(handle);
  VmmHandle& h = vmm_handles_[handle];
  h.refs++;
  h.driver_refs++;
  out.Put<uint64_t>(handle);
  return true;
}

bool Session::VmmExportShareable(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint64_t handle = 0, flags = 0;
  uint32_t type = 0;
  if (!in.Get(&handle) || !in.Get(&type) || !in.Get(&flags) || in.remaining() != 0) return false;
  auto known = vmm_handles_.find(handle);
  if (known == vmm_handles_.end()) {
    *rc = CUDA_ERROR_INVALID_VALUE;  // not a handle of this session: the driver would crash
    return true;
  }
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      api().cuMemExportToShareableHandle == nullptr || state_->link == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  int fd = -1;
  *rc = api().cuMemExportToShareableHandle(&fd, VmmReal(handle),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, flags);
  if (*rc != CUDA_SUCCESS) return true;
  known->second.shared = true;  // another process may map it now: it does not move
  uint64_t key = 0, secret = 0;
  Status st = state_->link->PutShareable(fd, &key, &secret);
  close(fd);
  if (!st.ok()) {
    FLYT_WARN("session %llu: cannot keep a shareable handle: %s", Id(id_), st.message().c_str());
    *rc = CUDA_ERROR_OUT_OF_MEMORY;
    return true;
  }
  out.Put(key);
  out.Put(secret);
  return true;
}

bool Session::VmmImportShareable(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint64_t key = 0, secret = 0;
  uint32_t type = 0;
  if (!in.Get(&key) || !in.Get(&secret) || !in.Get(&type) || in.remaining() != 0) return false;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      api().cuMemImportFromShareableHandle == nullptr || state_->link == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  // Unknown (never exported, or its exporter has ended): what the driver says
  // of a descriptor that is not a shareable handle.
  const int fd = state_->link->GetShareable(key, secret);
  if (fd < 0) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  CUmemGenericAllocationHandle handle = 0;
  *rc = api().cuMemImportFromShareableHandle(&handle,
                                             reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(fd);
  if (*rc != CUDA_SUCCESS) return true;
  handle = VmmClient(handle);
  VmmHandle& h = vmm_handles_[handle];  // the exporter's memory: charged to the quota there
  h.refs++;
  h.driver_refs++;
  h.shared = true;
  out.Put<uint64_t>(handle);
  return true;
}

void Session::ReleaseVmm() {
  if (VmmEmpty()) return;
  DriverApi& a = api();
  size_t mappings = vmm_mapped_.size(), handles = vmm_handles_.size(),
         reservations = vmm_reserved_.size();
  for (auto& [base, m] : vmm_mapped_) {
    CUresult rc = a.cuMemUnmap(base, m.size);
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("session %llu: cuMemUnmap(0x%llx) at the session's end failed with error %d",
                Id(id_), Id(base), rc);
  }
  vmm_mapped_.clear();
  for (auto& [handle, h] : vmm_handles_) {
    for (uint32_t i = 0; i < h.driver_refs; ++i) {
      CUresult rc = a.cuMemRelease(VmmReal(handle));
      if (rc != CUDA_SUCCESS) {
        FLYT_WARN("session %llu: cuMemRelease(0x%llx) at the session's end failed with error %d",
                  Id(id_), Id(handle), rc);
        break;
      }
    }
    RefundMemory(h.charged, h.device);
  }
  vmm_handles_.clear();
  vmm_real_.clear();
  vmm_client_.clear();
  for (auto& [base, size] : vmm_reserved_) {
    if (vmm_carved_.count(base) != 0) {  // the session's own range: freed with it
      movable_.Give(base, size);
      continue;
    }
    CUresult rc = a.cuMemAddressFree(base, size);
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("session %llu: cuMemAddressFree(0x%llx) at the session's end failed with error %d",
                Id(id_), Id(base), rc);
  }
  vmm_reserved_.clear();
  vmm_carved_.clear();
  FLYT_INFO("session %llu: released %zu mappings, %zu allocation handles, %zu reservations",
            Id(id_), mappings, handles, reservations);
}

}  // namespace flyt::server
