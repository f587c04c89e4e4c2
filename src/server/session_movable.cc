// Device memory the session maps itself with the driver's VMM calls: memory
// a restore put back at the client's old addresses (session_migrate.cc), and,
// with `flyt-server --movable-memory`, every cuMemAlloc/cuMemAllocPitch and
// the stream-ordered cuMemAllocAsync and cuMemAllocFromPoolAsync of the pools
// the session serves (session_pools.cc; cuMemFreeAsync gives the addresses
// back once the stream's earlier work is done: an event per free).
//
// Owns: the session's reservation of device addresses for movable memory,
// the regions mapped in it or restored (physical handle, allocations inside),
// small allocations packed into shared chunks (a pool's chunks its own; a
// pool's regions stay mapped while idle until its books say to give them
// back), the address ranges it carves
// out of that reservation for the app's own cuMemAddressReserve (VmmCarve),
// stream-ordered frees waiting for their streams, and freeing all of it.
// Must not touch: memory the driver allocated itself (cuMemAlloc without
// --movable-memory, pools the driver serves, managed memory), a pool's
// books beyond placing and freeing (session_pools.cc), the app's mappings and handles
// (session_vmm.cc), other sessions.
//
// Why: the driver places cuMemAlloc memory inside address pools of its own
// whose place depends on everything the process mapped before, and it will
// not hand out an address inside its pools on request. A restore needs the
// client's addresses free in another process; addresses far from the pools,
// in a reservation of the session's own, are (docs/architecture.md §7.4).
#include <algorithm>
#include <cstdio>
#include <random>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

namespace {

// Where sessions reserve addresses for movable memory: one of kSlots slots
// of kSlotBytes from kFirstSlot, far below the driver's pools (near the top
// of the user address space) and the sim's fixed range (0x600000000000). A
// random slot: two sessions, even of two servers, rarely pick the same one,
// so a session moved in finds its addresses free.
constexpr uint64_t kFirstSlot = 0x100000000000ull;
constexpr uint64_t kSlotBytes = 1ull << 40;
constexpr int kSlots = kMovableSlots;
constexpr uint64_t kReservationBytes = 1ull << 39;  // 512 GiB: beyond any one GPU's memory
constexpr int kTries = 16;
// cuMemAlloc's alignment for allocations that share a chunk, and the largest
// of them (the rest get regions of their own).
constexpr uint64_t kSmallAlign = 512;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// The base of the slot whose reservation holds `addr`, or 0.
uint64_t SlotBase(uint64_t addr) {
  if (addr < kFirstSlot || addr >= kFirstSlot + kSlots * kSlotBytes) return 0;
  uint64_t base = kFirstSlot + (addr - kFirstSlot) / kSlotBytes * kSlotBytes;
  return addr - base < kReservationBytes ? base : 0;
}

}  // namespace

CUresult Session::MapNewRegion(uint64_t at, uint64_t size, int device, bool own_reservation) {
  DriverApi& a = state_->api;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  MappedRegion reg;
  reg.size = size;
  reg.own_reservation = own_reservation;
  reg.device = device;
  CUresult rc = a.cuMemCreate(&reg.handle, size, &prop, 0);
  if (rc == CUDA_SUCCESS) {
    rc = a.cuMemMap(at, size, 0, reg.handle, 0);
    if (rc == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      rc = a.cuMemSetAccess(at, size, &access, 1);
      if (rc == CUDA_SUCCESS) {
        mapped_regions_[at] = reg;
        return CUDA_SUCCESS;
      }
      a.cuMemUnmap(at, size);
    }
    a.cuMemRelease(reg.handle);
  }
  if (own_reservation) a.cuMemAddressFree(at, size);
  return rc;
}

CUresult Session::ReserveSlot(uint64_t base, uint64_t gran) {
  CUdeviceptr got = 0;
  CUresult rc = state_->api.cuMemAddressReserve(&got, kReservationBytes, gran, base, 0);
  if (rc != CUDA_SUCCESS) return rc;
  if (got != base) {
    state_->api.cuMemAddressFree(got, kReservationBytes);
    return CUDA_ERROR_ALREADY_MAPPED;
  }
  movable_.Reset(base, kReservationBytes);
  granularity_ = gran;
  return CUDA_SUCCESS;
}

Status Session::EnsureMovableSlot(uint64_t addr, uint64_t gran) {
  char where[48];
  std::snprintf(where, sizeof(where), "0x%llx", static_cast<unsigned long long>(addr));
  if (addr < kFirstSlot || addr >= kFirstSlot + kSlots * kSlotBytes)
    return Status::Error(std::string("a damaged snapshot (movable memory at ") + where +
                         " outside the movable ranges)");
  uint64_t base = kFirstSlot + (addr - kFirstSlot) / kSlotBytes * kSlotBytes;
  if (movable_.size() == 0) {
    // The whole reservation the client's memory came from, as one: the driver
    // grants an address asked for only to a reservation that large.
    CUresult rc = ReserveSlot(base, gran);
    if (rc != CUDA_SUCCESS) {
      std::snprintf(where, sizeof(where), "0x%llx", static_cast<unsigned long long>(base));
      return Status::Error(
          std::string("the device addresses from ") + where + " are taken here" +
          (rc == CUDA_ERROR_ALREADY_MAPPED ? "" : " (error " + std::to_string(rc) + ")"));
    }
  }
  if (movable_.base() != base || gran != granularity_)
    return Status::Error(std::string("a damaged snapshot (memory at ") + where +
                         " outside its movable range)");
  return Status::Ok();
}

Status Session::RestoreMovableRegion(uint64_t lo, uint64_t size, uint64_t gran, bool* handled) {
  *handled = false;
  if (lo < kFirstSlot || lo >= kFirstSlot + kSlots * kSlotBytes) return Status::Ok();
  *handled = true;
  if (Status st = EnsureMovableSlot(lo, gran); !st.ok()) return st;
  if (!movable_.TakeAt(lo, size))
    return Status::Error("a damaged snapshot (memory outside its reservation)");
  CUresult rc = MapNewRegion(lo, size, primary_device_, /*own_reservation=*/false);
  if (rc != CUDA_SUCCESS) {
    movable_.Give(lo, size);
    return Status::Error("mapping device memory: error " + std::to_string(rc));
  }
  return Status::Ok();
}

CUresult Session::ReserveMovable(int device, uint64_t prefer) {
  if (movable_.size() != 0) return CUDA_SUCCESS;
  if (movable_failed_) return CUDA_ERROR_OUT_OF_MEMORY;
  DriverApi& a = state_->api;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t gran = 0;
  CUresult rc = a.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (rc != CUDA_SUCCESS || gran == 0 || (gran & (gran - 1)) != 0) {
    FLYT_WARN(
        "session %llu: no movable memory (allocation granularity: error %d); cuMemAlloc "
        "memory comes from the driver and may not move",
        static_cast<unsigned long long>(id_), rc);
    movable_failed_ = true;
    return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_NOT_SUPPORTED;
  }
  std::vector<int> slots(kSlots);
  for (int i = 0; i < kSlots; ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(std::random_device{}()));
  if (SlotBase(prefer) != 0) {  // the app asked for an address in this slot: it first
    int want = static_cast<int>((SlotBase(prefer) - kFirstSlot) / kSlotBytes);
    std::iter_swap(slots.begin(), std::find(slots.begin(), slots.end(), want));
  }
  // A client of several servers chose the slot (kOpPlaceMemory): that one only,
  // so that its servers' addresses never meet.
  if (placed_slot_ >= 0 && placed_slot_ < kSlots) slots.assign(1, placed_slot_);
  int tries = 0;
  for (int slot : slots) {
    uint64_t base = kFirstSlot + static_cast<uint64_t>(slot) * kSlotBytes;
    // Not over memory a restore mapped here (the client's old addresses).
    auto after = mapped_regions_.lower_bound(base);
    bool clash = after != mapped_regions_.end() && after->first < base + kReservationBytes;
    if (after != mapped_regions_.begin()) {
      auto before = std::prev(after);
      clash = clash || before->first + before->second.size > base;
    }
    if (clash) continue;
    if (++tries > kTries) break;
    rc = ReserveSlot(base, gran);
    if (rc == CUDA_SUCCESS) return CUDA_SUCCESS;
    if (rc != CUDA_ERROR_ALREADY_MAPPED) break;
  }
  FLYT_WARN(
      "session %llu: no free range for movable memory (last error %d); cuMemAlloc memory "
      "comes from the driver and may not move",
      static_cast<unsigned long long>(id_), rc);
  movable_failed_ = true;
  return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult Session::MovableAlloc(uint64_t bytes, uint64_t* out, uint64_t pool) {
  CUdevice device = 0;
  CUresult rc = api().cuCtxGetDevice(&device);
  if (rc != CUDA_SUCCESS) return rc;
  rc = ReserveMovable(device);
  if (rc != CUDA_SUCCESS) return rc;
  // Placed in region `region`: counted there (and in its pool).
  auto place = [&](uint64_t at, uint64_t region) {
    RefundIdleRegion(region);  // in use again: the allocation is charged itself
    mapped_regions_[region].live++;
    mapped_allocs_[at] = MappedPlace{region, bytes};
    if (pool != 0) pool_ledger_.Place(pool, region, PoolUse(mapped_allocs_[at]));
    *out = at;
    return CUDA_SUCCESS;
  };
  // A new region of `size` for the pool: within its maximum size (idle
  // regions of the pool go first to make room).
  auto room_for = [&](uint64_t size) {
    if (pool == 0 || !pool_ledger_.OverMax(pool, size)) return true;
    for (uint64_t base : pool_ledger_.ToRelease(pool, 0)) ReleasePoolRegion(base);
    return !pool_ledger_.OverMax(pool, size);
  };
  const bool small = bytes <= granularity_ / 2;  // shares a chunk with other small ones
  if (small) {
    uint64_t need = RoundUp(bytes, kSmallAlign);
    for (auto& [chunk, span] : small_chunks_) {
      if (mapped_regions_[chunk].pool != pool) continue;  // a pool's chunks are its own
      uint64_t at = span.Take(need, kSmallAlign);
      if (at != 0) return place(at, chunk);
    }
  }
  const uint64_t size = small ? granularity_ : RoundUp(bytes, granularity_);
  if (size < bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!small && pool != 0) {  // an idle region of the pool that fits
    uint64_t at = pool_ledger_.IdleFit(pool, size);
    if (at != 0) return place(at, at);
  }
  if (!room_for(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t at = movable_.Take(size, granularity_);
  if (at == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  rc = MapNewRegion(at, size, device, /*own_reservation=*/false);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY && ReleaseIdlePoolMemory()) {
    // The GPU is full: idle memory of the pools (kept under a high release
    // threshold, in sizes that did not fit) goes first, then once more.
    rc = MapNewRegion(at, size, device, /*own_reservation=*/false);
  }
  if (rc != CUDA_SUCCESS) {
    movable_.Give(at, size);
    return rc;
  }
  mapped_regions_[at].pool = pool;
  if (pool != 0) pool_ledger_.AddRegion(pool, at, size, small);
  if (!small) return place(at, at);
  AddressSpan& span = small_chunks_[at];
  span.Reset(at, granularity_);
  return place(span.Take(RoundUp(bytes, kSmallAlign), kSmallAlign), at);
}

CUresult Session::VmmCarve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                           unsigned long long flags, bool* handled) {
  *handled = false;
  // What the driver would refuse gets the driver's answer (it reserves then).
  if (flags != 0 || size == 0 || (alignment & (alignment - 1)) != 0) return CUDA_SUCCESS;
  CUdevice device = 0;
  if (api().cuCtxGetDevice(&device) != CUDA_SUCCESS) return CUDA_SUCCESS;
  if (ReserveMovable(device, addr) != CUDA_SUCCESS || size % granularity_ != 0) return CUDA_SUCCESS;
  const uint64_t align = std::max<uint64_t>(alignment, granularity_);
  DriverApi& a = api();
  CUdeviceptr driver_placed = 0;
  if (addr != 0 && SlotBase(addr) != movable_.base()) {
    // An address outside the session's range: the driver may grant it there,
    // and then it is the app's fixed address (which another server cannot
    // reserve: a move refuses it). Where the driver puts it elsewhere, the
    // app takes any address, and one in the session's range can move.
    CUresult rc = a.cuMemAddressReserve(&driver_placed, size, alignment, addr, flags);
    if (rc != CUDA_SUCCESS) return rc;
    if (driver_placed == addr) {
      vmm_reserved_[driver_placed] = size;
      *ptr = driver_placed;
      *handled = true;  // (by the driver: reserved all the same)
      return CUDA_SUCCESS;
    }
  }
  uint64_t at = 0;
  if (addr != 0 && addr % align == 0 && movable_.TakeAt(addr, size)) {
    at = addr;
  } else {
    at = movable_.Take(size, align);
  }
  if (at == 0) {
    FLYT_WARN(
        "session %llu: the movable range has no room for a reservation of %zu bytes; the "
        "driver places it, and the session cannot move while it holds it",
        static_cast<unsigned long long>(id_), size);
    if (driver_placed != 0) {  // the driver's, where it put it
      vmm_reserved_[driver_placed] = size;
      *ptr = driver_placed;
      *handled = true;
    }
    return CUDA_SUCCESS;
  }
  if (driver_placed != 0) {
    CUresult rc = a.cuMemAddressFree(driver_placed, size);
    if (rc != CUDA_SUCCESS) {
      movable_.Give(at, size);
      FLYT_WARN("session %llu: cuMemAddressFree of a reservation just made failed with error %d",
                static_cast<unsigned long long>(id_), rc);
      vmm_reserved_[driver_placed] = size;
      *ptr = driver_placed;
      *handled = true;
      return CUDA_SUCCESS;
    }
  }
  vmm_reserved_[at] = size;
  vmm_carved_.insert(at);
  *ptr = at;
  *handled = true;
  return CUDA_SUCCESS;
}

bool Session::PlaceMemory(wire::Reader& in, CUresult* rc) {
  uint32_t slot = 0;
  if (!in.Get(&slot) || in.remaining() != 0) return false;
  if (slot >= static_cast<uint32_t>(kSlots)) {
    *rc = CUDA_ERROR_INVALID_VALUE;
  } else if (movable_.size() != 0 &&
             movable_.base() != kFirstSlot + static_cast<uint64_t>(slot) * kSlotBytes) {
    *rc = CUDA_ERROR_ALREADY_MAPPED;  // memory was placed elsewhere already
  } else {
    placed_slot_ = static_cast<int>(slot);
    *rc = CUDA_SUCCESS;
  }
  return true;
}

CUresult Session::MemAlloc(CUdeviceptr* dptr, size_t bytes) {
  if (!PlacesMemory() || movable_failed_ || dptr == nullptr || bytes == 0)
    return api().cuMemAlloc_v2(dptr, bytes);
  uint64_t at = 0;
  CUresult rc = MovableAlloc(bytes, &at);
  if (rc == CUDA_SUCCESS) *dptr = at;
  return rc;
}

CUresult Session::MemAllocPitch(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                unsigned element) {
  DriverApi& a = api();
  if (!PlacesMemory() || movable_failed_ || dptr == nullptr || pitch == nullptr)
    return a.cuMemAllocPitch_v2(dptr, pitch, width, height, element);
  // The driver's own pitch (and its checks of the arguments), then the same
  // bytes as movable memory.
  CUdeviceptr probe = 0;
  size_t p = 0;
  CUresult rc = a.cuMemAllocPitch_v2(&probe, &p, width, height, element);
  if (rc != CUDA_SUCCESS) return rc;
  rc = a.cuMemFree_v2(probe);
  if (rc != CUDA_SUCCESS) return rc;
  uint64_t at = 0;
  rc = MovableAlloc(static_cast<uint64_t>(p) * height, &at);
  if (rc != CUDA_SUCCESS) return rc;
  *dptr = at;
  *pitch = p;
  return CUDA_SUCCESS;
}

CUresult Session::MemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  auto it = mapped_allocs_.upper_bound(p);
  if (it != mapped_allocs_.begin()) {
    --it;
    if (p - it->first < std::max<uint64_t>(it->second.size, 1)) {
      if (base != nullptr) *base = it->first;
      if (size != nullptr) *size = it->second.size;
      return CUDA_SUCCESS;
    }
  }
  return api().cuMemGetAddressRange_v2(base, size, p);
}

bool Session::InMappedRegion(uint64_t p) const {
  auto it = mapped_regions_.upper_bound(p);
  if (it == mapped_regions_.begin()) return false;
  --it;
  return p - it->first < it->second.size;
}

CUresult Session::ReleaseRegion(uint64_t base, const MappedRegion& reg) {
  DriverApi& a = state_->api;
  CUresult rc = a.cuMemUnmap(base, reg.size);
  CUresult r = a.cuMemRelease(reg.handle);
  if (rc == CUDA_SUCCESS) rc = r;
  if (reg.own_reservation) {
    r = a.cuMemAddressFree(base, reg.size);
    if (rc == CUDA_SUCCESS) rc = r;
  } else {
    movable_.Give(base, reg.size);
  }
  return rc;
}

CUresult Session::FreeMapped(uint64_t ptr) {
  auto it = mapped_allocs_.find(ptr);
  if (it == mapped_allocs_.end()) return CUDA_ERROR_INVALID_VALUE;
  MappedPlace place = it->second;
  mapped_allocs_.erase(it);
  // As cuMemFree: after the work that may still use the memory.
  CUresult rc = SynchronizeSession();
  CUresult r = ReleasePlace(ptr, place);
  return rc == CUDA_SUCCESS ? r : rc;
}

uint64_t Session::PoolUse(const MappedPlace& place) const {
  if (small_chunks_.count(place.region) != 0) return RoundUp(place.size, kSmallAlign);
  auto reg = mapped_regions_.find(place.region);
  return reg != mapped_regions_.end() ? reg->second.size : place.size;
}

CUresult Session::ReleasePlace(uint64_t ptr, const MappedPlace& place) {
  auto reg = mapped_regions_.find(place.region);
  if (reg == mapped_regions_.end()) return CUDA_SUCCESS;
  auto chunk = small_chunks_.find(place.region);
  const uint64_t pool = reg->second.pool;
  if (pool != 0) pool_ledger_.Unplace(pool, place.region, PoolUse(place));
  if (reg->second.live > 0) reg->second.live--;
  if (chunk != small_chunks_.end()) chunk->second.Give(ptr, RoundUp(place.size, kSmallAlign));
  if (reg->second.live > 0) return CUDA_SUCCESS;
  if (pool != 0) {
    // A pool keeps its idle memory for reuse until a trim or its release
    // threshold gives it back (TrimPools); a destroyed pool's goes now.
    const PoolLedger::Pool* p = pool_ledger_.Find(pool);
    if (p == nullptr || p->destroyed) return ReleasePoolRegion(place.region);
    ChargeIdleRegion(place.region);
    return CUDA_SUCCESS;
  }
  if (chunk != small_chunks_.end()) small_chunks_.erase(chunk);
  CUresult rc = ReleaseRegion(reg->first, reg->second);
  mapped_regions_.erase(reg);
  return rc;
}

// --- stream-ordered allocations (cuMemAllocAsync / cuMemFreeAsync) in movable memory

bool Session::ServesAsyncAlloc(CUstream stream, uint64_t* pool) {
  if (!PlacesMemory() || movable_failed_) return false;
  // Captured, an allocation is a graph's allocation node: the driver's.
  if (Capturing(stream == nullptr && pt_call_ ? CU_STREAM_PER_THREAD : stream)) return false;
  // From the device's current pool, when the session serves it (session_pools.cc).
  CUdevice device = 0;
  CUmemoryPool current = nullptr;
  if (api().cuCtxGetDevice(&device) != CUDA_SUCCESS ||
      api().cuDeviceGetMemPool(&current, device) != CUDA_SUCCESS || current == nullptr)
    return false;
  *pool = ServedPool(reinterpret_cast<uintptr_t>(current));
  return *pool != 0;
}

CUresult Session::MemAllocAsync(CUdeviceptr* dptr, size_t bytes, uint64_t pool) {
  ReapFrees(false);
  uint64_t at = 0;
  CUresult rc = MovableAlloc(bytes, &at, pool);  // usable at once: before the stream needs it
  if (rc == CUDA_SUCCESS) *dptr = at;
  TrimPools();  // what frees left beyond the pools' thresholds, once reuse had its chance
  return rc;
}

CUresult Session::FreeMappedAsync(uint64_t ptr, CUstream stream, bool* kept) {
  DriverApi& a = state_->api;
  *kept = false;
  auto it = mapped_allocs_.find(ptr);
  if (it == mapped_allocs_.end()) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = stream == nullptr && pt_call_ ? CU_STREAM_PER_THREAD : stream;
  if (Capturing(s)) {
    // A graph's free node of memory the graph did not allocate: the driver's
    // memory only.
    FLYT_WARN(
        "session %llu: cuMemFreeAsync of movable memory inside a stream capture is not "
        "supported (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); free it outside the capture",
        static_cast<unsigned long long>(id_));
    *kept = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  const MappedPlace place = it->second;
  mapped_allocs_.erase(it);
  // Freed once the stream's work before it is done: its addresses are not
  // handed out again until then.
  CUevent done = nullptr;
  CUresult rc = a.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING);
  if (rc == CUDA_SUCCESS) {
    rc = a.cuEventRecord(done, s);
    if (rc == CUDA_SUCCESS) {
      pending_frees_.push_back(PendingFree{done, ptr, place});
      return CUDA_SUCCESS;
    }
    CUresult d = a.cuEventDestroy_v2(done);
    if (d != CUDA_SUCCESS) FLYT_WARN("cuEventDestroy failed with error %d", d);
  }
  // No event: the stream's work first, then the free (the same order, later).
  CUresult sync = a.cuStreamSynchronize(s);
  CUresult r = ReleasePlace(ptr, place);
  return sync != CUDA_SUCCESS ? sync : r;
}

void Session::ReapFrees(bool wait) {
  DriverApi& a = state_->api;
  for (auto it = pending_frees_.begin(); it != pending_frees_.end();) {
    CUresult rc = wait ? a.cuEventSynchronize(it->done) : a.cuEventQuery(it->done);
    if (rc != CUDA_SUCCESS) {
      // Not done yet, or the context failed: the memory stays (freed with the session).
      if (rc != CUDA_ERROR_NOT_READY)
        FLYT_DEBUG("session %llu: a stream-ordered free waits (event error %d)",
                   static_cast<unsigned long long>(id_), rc);
      ++it;
      continue;
    }
    CUresult r = ReleasePlace(it->ptr, it->place);
    if (r != CUDA_SUCCESS)
      FLYT_WARN("session %llu: releasing memory of a stream-ordered free failed with error %d",
                static_cast<unsigned long long>(id_), r);
    r = a.cuEventDestroy_v2(it->done);
    if (r != CUDA_SUCCESS) FLYT_WARN("cuEventDestroy failed with error %d", r);
    it = pending_frees_.erase(it);
  }
}

void Session::ReleaseMappedMemory() {
  for (PendingFree& p : pending_frees_) {
    CUresult rc = state_->api.cuEventDestroy_v2(p.done);
    if (rc != CUDA_SUCCESS) FLYT_WARN("cuEventDestroy failed with error %d", rc);
  }
  pending_frees_.clear();
  pool_ledger_.Clear();
  pool_origin_.clear();
  for (auto& [base, reg] : mapped_regions_) ReleaseRegion(base, reg);
  mapped_regions_.clear();
  mapped_allocs_.clear();
  small_chunks_.clear();
  if (movable_.size() != 0) {
    CUresult rc = state_->api.cuMemAddressFree(movable_.base(), movable_.size());
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("session %llu: freeing the movable-memory reservation failed with error %d",
                static_cast<unsigned long long>(id_), rc);
    movable_.Reset(0, 0);
  }
}

}  // namespace flyt::server
