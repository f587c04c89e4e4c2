// The app's own virtual memory in a moved session's snapshot: its
// reservations, its allocations (size, properties, contents), its mappings
// (offsets) and the access it set, recreated on the target at the same
// addresses and under the same allocation handle values (docs/architecture.md
// §7.4).
//
// Owns: the VMM sections of the snapshot (their framing is
// session_snapshot.h's, their place in it session_migrate.cc's) and what
// refuses a move of VMM state. Must not touch: the VMM calls themselves
// (session_vmm.cc), the movable range's own memory (session_movable.cc),
// other sessions.
//
// Reservations move only when they lie in the session's movable range
// (--movable-memory carves the app's reservations out of it): the driver
// grants another process an address it asks for only inside such a large,
// far reservation (tests/gpu/migrate/va_probe.cc). Allocations shared with
// another process (shareable handles) stay. Contents are copied through a
// mapping of each whole allocation in a window of its own, so parts the app
// has not mapped, or mapped read-only, move too.
#include <algorithm>
#include <cstdio>

#include "common/log.h"
#include "server/session.h"
#include "server/session_snapshot.h"

namespace flyt::server {

namespace {

constexpr size_t kChunk = 8u << 20;  // the caller's pinned bounce buffer

std::string Range(uint64_t base, uint64_t size) {
  char where[80];
  std::snprintf(where, sizeof(where), "0x%llx (%llu bytes)", static_cast<unsigned long long>(base),
                static_cast<unsigned long long>(size));
  return where;
}

std::string Err(const char* what, CUresult rc) {
  return std::string(what) + ": CUDA error " + std::to_string(rc);
}

}  // namespace

std::string Session::VmmUnmovable() const {
  for (const auto& [base, size] : vmm_reserved_) {
    if (vmm_carved_.count(base) != 0) continue;
    if (!state_->movable_memory)
      return "it reserved device addresses with cuMemAddressReserve at " + Range(base, size) +
             ", which the driver placed where another server cannot reserve them (a "
             "flyt-server with --movable-memory serves such reservations from addresses that "
             "move)";
    return "it holds a VMM reservation at " + Range(base, size) +
           " outside its movable range (asked for at that fixed address, or the range was "
           "full); another server cannot reserve it there";
  }
  for (const auto& [handle, h] : vmm_handles_) {
    if (h.shared)
      return "it shares VMM memory with another process (cuMemExportToShareableHandle / "
             "cuMemImportFromShareableHandle)";
    if (h.size == 0) return "it holds a VMM allocation of unknown size";
    if (h.prop.type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        h.prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        h.prop.location.id != primary_device_)
      return "it holds VMM memory that is not device memory of its GPU (location type " +
             std::to_string(h.prop.location.type) + ", id " + std::to_string(h.prop.location.id) +
             ")";
  }
  return "";
}

// reservations: count, {u64 base, u64 size}
// handles:      count, {u64 handle, u64 size, u64 charged, u32 refs, CUmemAllocationProp}
// mappings:     count, {u64 base, u64 size, u64 offset, u64 handle,
//                       count, {u64 offset, u64 size, count, {CUmemAccessDesc}}}
// (contents, at the snapshot's end: each handle's bytes in the order above)
Status Session::WriteVmmLayout(SnapshotWriter& out) {
  out.Put<uint64_t>(vmm_reserved_.size());
  for (const auto& [base, size] : vmm_reserved_) {
    out.Put(base);
    out.Put(size);
  }
  vmm_order_.clear();
  for (const auto& [handle, h] : vmm_handles_) vmm_order_.push_back(handle);
  std::sort(vmm_order_.begin(), vmm_order_.end());
  out.Put<uint64_t>(vmm_order_.size());
  for (uint64_t handle : vmm_order_) {
    const VmmHandle& h = vmm_handles_.at(handle);
    out.Put(handle);
    out.Put(h.size);
    out.Put(h.charged);
    out.Put<uint32_t>(h.refs);
    out.Put(h.prop);
  }
  out.Put<uint64_t>(vmm_mapped_.size());
  for (const auto& [base, m] : vmm_mapped_) {
    out.Put(base);
    out.Put(m.size);
    out.Put(m.offset);
    out.Put(m.handle);
    out.Put<uint64_t>(m.access.size());
    for (const VmmAccess& set : m.access) {
      out.Put(set.offset);
      out.Put(set.size);
      out.Put<uint64_t>(set.descs.size());
      for (const CUmemAccessDesc& d : set.descs) out.Put(d);
    }
  }
  return out.status();
}

Status Session::CopyVmmHandle(uint64_t real, uint64_t size, int device, uint64_t window, bool write,
                              SnapshotWriter* out, SnapshotReader* in, void* bounce) {
  DriverApi& a = state_->api;
  CUresult rc = a.cuMemMap(window, size, 0, real, 0);
  if (rc != CUDA_SUCCESS) return Status::Error(Err("mapping VMM memory to copy it", rc));
  CUmemAccessDesc rw{};
  rw.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  rw.location.id = device;
  rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Status st;
  rc = a.cuMemSetAccess(window, size, &rw, 1);
  if (rc != CUDA_SUCCESS) st = Status::Error(Err("cuMemSetAccess of a copy window", rc));
  for (uint64_t off = 0; st.ok() && off < size; off += kChunk) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, size - off));
    if (write) {
      rc = a.cuMemcpyDtoH_v2(bounce, window + off, n);
      if (rc != CUDA_SUCCESS) {
        st = Status::Error(Err("reading VMM memory", rc));
        break;
      }
      out->Bytes(bounce, n);
      st = out->status();
    } else {
      if (!in->Bytes(bounce, n)) {
        st = in->status();
        break;
      }
      rc = a.cuMemcpyHtoD_v2(window + off, bounce, n);
      if (rc != CUDA_SUCCESS) st = Status::Error(Err("writing VMM memory", rc));
    }
  }
  rc = a.cuMemUnmap(window, size);
  if (rc != CUDA_SUCCESS && st.ok()) st = Status::Error(Err("unmapping a copy window", rc));
  return st;
}

namespace {

// A window of device addresses as large as the largest allocation, aligned
// for mappings, freed on scope exit.
struct CopyWindow {
  DriverApi& a;
  CUdeviceptr base = 0;
  uint64_t size = 0;
  explicit CopyWindow(DriverApi& api) : a(api) {}
  CUresult Reserve(uint64_t bytes, int device) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t gran = 0;
    CUresult rc = a.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc != CUDA_SUCCESS) return rc;
    rc = a.cuMemAddressReserve(&base, bytes, gran, 0, 0);
    if (rc == CUDA_SUCCESS) size = bytes;
    return rc;
  }
  ~CopyWindow() {
    if (size == 0) return;
    CUresult rc = a.cuMemAddressFree(base, size);
    if (rc != CUDA_SUCCESS) FLYT_WARN("freeing a VMM copy window failed with error %d", rc);
  }
};

}  // namespace

Status Session::WriteVmmContents(SnapshotWriter& out, void* bounce) {
  if (vmm_order_.empty()) return Status::Ok();
  uint64_t largest = 0;
  for (uint64_t handle : vmm_order_) largest = std::max(largest, vmm_handles_.at(handle).size);
  CopyWindow window(state_->api);
  if (CUresult rc = window.Reserve(largest, primary_device_); rc != CUDA_SUCCESS)
    return Status::Error(Err("reserving a window to copy VMM memory", rc));
  DriverApi& a = state_->api;
  for (uint64_t handle : vmm_order_) {
    const VmmHandle& h = vmm_handles_.at(handle);
    uint64_t real = VmmReal(handle);
    if (h.driver_refs == 0) {
      // Released but still mapped: a reference for the copy, from a mapping.
      uint64_t at = 0;
      for (const auto& [base, m] : vmm_mapped_)
        if (m.handle == handle) at = base;
      CUmemGenericAllocationHandle again = 0;
      CUresult rc = a.cuMemRetainAllocationHandle(
          &again, reinterpret_cast<void*>(static_cast<uintptr_t>(at)));
      if (rc != CUDA_SUCCESS) return Status::Error(Err("cuMemRetainAllocationHandle", rc));
      real = again;
    }
    Status st =
        CopyVmmHandle(real, h.size, primary_device_, window.base, true, &out, nullptr, bounce);
    if (h.driver_refs == 0) {
      CUresult rc = a.cuMemRelease(real);
      if (rc != CUDA_SUCCESS && st.ok()) st = Status::Error(Err("cuMemRelease", rc));
    }
    if (!st.ok()) return st;
  }
  return out.status();
}

Status Session::RestoreVmmLayout(SnapshotReader& in) {
  DriverApi& a = state_->api;
  uint64_t n = 0;
  if (!in.Count(&n)) return in.status();
  std::vector<std::pair<uint64_t, uint64_t>> reservations(n);
  for (auto& [base, size] : reservations)
    if (!in.Get(&base) || !in.Get(&size)) return in.status();
  struct Handle {
    uint64_t client = 0, size = 0, charged = 0;
    uint32_t refs = 0;
    CUmemAllocationProp prop{};
  };
  if (!in.Count(&n)) return in.status();
  std::vector<Handle> handles(n);
  for (Handle& h : handles)
    if (!in.Get(&h.client) || !in.Get(&h.size) || !in.Get(&h.charged) || !in.Get(&h.refs) ||
        !in.Get(&h.prop))
      return in.status();
  struct Mapping {
    uint64_t base = 0;
    VmmMapping m;
  };
  if (!in.Count(&n)) return in.status();
  std::vector<Mapping> mappings(n);
  for (Mapping& x : mappings) {
    uint64_t sets = 0;
    if (!in.Get(&x.base) || !in.Get(&x.m.size) || !in.Get(&x.m.offset) || !in.Get(&x.m.handle) ||
        !in.Count(&sets))
      return in.status();
    x.m.access.resize(sets);
    for (VmmAccess& set : x.m.access) {
      uint64_t descs = 0;
      if (!in.Get(&set.offset) || !in.Get(&set.size) || !in.Count(&descs)) return in.status();
      if (descs > ops::kMaxAccessDescs) return Status::Error("a damaged snapshot (access list)");
      set.descs.resize(descs);
      for (CUmemAccessDesc& d : set.descs)
        if (!in.Get(&d)) return in.status();
    }
  }
  vmm_order_.clear();
  if (reservations.empty() && handles.empty() && mappings.empty()) return Status::Ok();
  CUmemAllocationProp device_prop{};
  device_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  device_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  device_prop.location.id = primary_device_;
  size_t gran = 0;
  CUresult rc =
      a.cuMemGetAllocationGranularity(&gran, &device_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (rc != CUDA_SUCCESS || gran == 0)
    return Status::Error(Err("cuMemGetAllocationGranularity", rc));
  // The app's reservations, in the movable range they came from.
  for (const auto& [base, size] : reservations) {
    if (Status st = EnsureMovableSlot(base, gran); !st.ok()) return st;
    if (!movable_.TakeAt(base, size))
      return Status::Error("the VMM reservation at " + Range(base, size) +
                           " overlaps other memory of the session here (a damaged snapshot?)");
    vmm_reserved_[base] = size;
    vmm_carved_.insert(base);
  }
  for (const Handle& h : handles) {
    if (h.size == 0 || h.prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        h.prop.location.id != primary_device_)
      return Status::Error("a damaged snapshot (a VMM allocation of another location)");
    if (!ChargeMemory(h.charged, primary_device_))
      return Status::Error("the tenant's memory quota here cannot take VMM memory of " +
                           std::to_string(h.charged) + " bytes");
    CUmemAllocationProp prop = h.prop;
    prop.win32HandleMetaData = nullptr;  // (a pointer of the source's; Windows only)
    CUmemGenericAllocationHandle real = 0;
    rc = a.cuMemCreate(&real, h.size, &prop, 0);
    if (rc != CUDA_SUCCESS) {
      RefundMemory(h.charged, primary_device_);
      return Status::Error(Err("cuMemCreate", rc));
    }
    vmm_real_[h.client] = real;
    vmm_client_[real] = h.client;
    VmmHandle& mine = vmm_handles_[h.client];
    mine.charged = h.charged;
    mine.device = primary_device_;
    mine.refs = h.refs;
    mine.driver_refs = 1;
    mine.size = h.size;
    mine.prop = h.prop;
    vmm_order_.push_back(h.client);
  }
  for (Mapping& x : mappings) {
    auto h = vmm_handles_.find(x.m.handle);
    auto r = vmm_reserved_.upper_bound(x.base);
    if (h == vmm_handles_.end() || r == vmm_reserved_.begin() ||
        x.base - std::prev(r)->first + x.m.size > std::prev(r)->second)
      return Status::Error("a damaged snapshot (a VMM mapping outside the reservations)");
    rc = a.cuMemMap(x.base, x.m.size, x.m.offset, VmmReal(x.m.handle), 0);
    if (rc != CUDA_SUCCESS)
      return Status::Error(Err(("cuMemMap at " + Range(x.base, x.m.size)).c_str(), rc));
    h->second.mappings++;
    const VmmMapping& m = vmm_mapped_[x.base] = std::move(x.m);
    for (const VmmAccess& set : m.access) {
      rc = a.cuMemSetAccess(x.base + set.offset, set.size, set.descs.data(), set.descs.size());
      if (rc != CUDA_SUCCESS)
        return Status::Error(
            Err(("cuMemSetAccess at " + Range(x.base + set.offset, set.size)).c_str(), rc));
    }
  }
  for (uint64_t client : vmm_order_) {
    const VmmHandle& h = vmm_handles_.at(client);
    if (h.refs == 0 && h.mappings == 0)
      return Status::Error("a damaged snapshot (an unused VMM allocation)");
  }
  return Status::Ok();
}

Status Session::RestoreVmmContents(SnapshotReader& in, void* bounce) {
  if (vmm_order_.empty()) return Status::Ok();
  uint64_t largest = 0;
  for (uint64_t handle : vmm_order_) largest = std::max(largest, vmm_handles_.at(handle).size);
  CopyWindow window(state_->api);
  if (CUresult rc = window.Reserve(largest, primary_device_); rc != CUDA_SUCCESS)
    return Status::Error(Err("reserving a window to copy VMM memory", rc));
  for (uint64_t handle : vmm_order_) {
    Status st = CopyVmmHandle(VmmReal(handle), vmm_handles_.at(handle).size, primary_device_,
                              window.base, false, nullptr, &in, bounce);
    if (!st.ok()) return st;
  }
  // Allocations the app released while they stay mapped: the driver frees
  // them with their last mapping, as on the source.
  for (uint64_t client : vmm_order_) {
    VmmHandle& h = vmm_handles_.at(client);
    if (h.refs != 0) continue;
    CUresult rc = state_->api.cuMemRelease(VmmReal(client));
    if (rc != CUDA_SUCCESS) return Status::Error(Err("cuMemRelease", rc));
    h.driver_refs = 0;
  }
  vmm_order_.clear();
  return Status::Ok();
}

}  // namespace flyt::server
