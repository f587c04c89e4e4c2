// Stream-ordered memory pools the session serves itself, so that they move
// (docs/architecture.md §7.4): with `flyt-server --movable-memory`, the
// device's default pool and every pool the app creates for device memory
// that is not for export (handle types none) hand out their allocations
// (cuMemAllocAsync, cuMemAllocFromPoolAsync) from the session's movable range
// (session_movable.cc). The driver still makes each pool, so that its handle,
// its properties and the attributes the app sets are the driver's and checked
// by it; the pool's memory and the figures the driver reports of it (used and
// reserved, current and high) are the session's (server/pool_ledger.h).
//
// Owns: which pools the session serves and where they came from (device,
// default or created, properties); the pool calls that go through the session
// (create, destroy, trim, allocation from a pool, attributes); giving idle
// pool memory back at the release threshold; the pools' part of a snapshot and
// their restore under the client's handle values at the same addresses; why a
// pool cannot move.
// Must not touch: the movable range's layout and mapping (session_movable.cc),
// pools the driver serves (exportable pools, pools without --movable-memory),
// graph memory (session_graph_nodes.cc), other sessions.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "server/session.h"
#include "server/session_snapshot.h"

namespace flyt::server {

using marshal::HandleKind;

namespace {

bool IsCounter(CUmemPool_attribute attr) {
  return attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ||
         attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT ||
         attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH;
}

// The attributes an app sets that a restore sets again (ints, then the threshold).
constexpr CUmemPool_attribute kReuseAttributes[3] = {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
};

std::string Describe(CUresult rc) { return "CUDA error " + std::to_string(rc); }

}  // namespace

uint64_t Session::ServedPool(uint64_t real) {
  if (real == 0) return 0;
  const uint64_t client = ClientHandle(HandleKind::kMemPool, real);
  if (pool_ledger_.Has(client)) {
    const PoolLedger::Pool* p = pool_ledger_.Find(client);
    return p != nullptr && !p->destroyed ? client : 0;
  }
  if (!PlacesMemory() || movable_failed_ || pool_origin_.count(client) != 0) return 0;
  // A device's default pool, at its first use.
  DriverApi& a = state_->api;
  for (int dev = 0; dev < static_cast<int>(state_->devices.size()); ++dev) {
    CUmemoryPool d = nullptr;
    if (a.cuDeviceGetDefaultMemPool(&d, dev) != CUDA_SUCCESS ||
        reinterpret_cast<uintptr_t>(d) != real)
      continue;
    PoolOrigin origin;
    origin.device = dev;
    origin.is_default = true;
    origin.props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    origin.props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    origin.props.location.id = dev;
    pool_origin_[client] = origin;
    pool_ledger_.AddPool(client, 0);
    return client;
  }
  return 0;
}

CUresult Session::MemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  CUresult rc = api().cuMemPoolCreate(pool, props);
  if (rc != CUDA_SUCCESS || pool == nullptr || props == nullptr || *pool == nullptr) return rc;
  const uint64_t client = ClientHandle(HandleKind::kMemPool, reinterpret_cast<uintptr_t>(*pool));
  pool_origin_[client] = PoolOrigin{props->location.id, false, *props};
  // Device memory that is not for export: the session serves it. A pool
  // for export needs memory the driver can hand to another process: the
  // driver's (and it does not move).
  if (PlacesMemory() && !movable_failed_ && props->allocType == CU_MEM_ALLOCATION_TYPE_PINNED &&
      props->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
      props->handleTypes == CU_MEM_HANDLE_TYPE_NONE && props->usage == 0)
    pool_ledger_.AddPool(client, props->maxSize);
  return CUDA_SUCCESS;
}

CUresult Session::MemPoolDestroy(CUmemoryPool pool) {
  const uint64_t client = ClientHandle(HandleKind::kMemPool, reinterpret_cast<uintptr_t>(pool));
  // A pool of the driver's with memory still allocated: the driver would
  // release it with its last allocation, and that path of the driver kills
  // the worker now and then inside a later cuStreamSynchronize (H200, driver
  // 580; never natively). The session keeps the pool until its memory is
  // freed, then destroys it; the app's handle is gone at once, as natively.
  uint64_t used = 0;
  if (ServedPool(reinterpret_cast<uintptr_t>(pool)) == 0 &&
      api().cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) == CUDA_SUCCESS &&
      used > 0) {
    doomed_pools_.push_back(pool);
    pool_origin_.erase(client);
    return CUDA_SUCCESS;
  }
  CUresult rc = api().cuMemPoolDestroy(pool);
  if (rc != CUDA_SUCCESS) return rc;
  pool_origin_.erase(client);
  // As the driver: idle memory goes now, the rest once its allocations are
  // freed (ReleasePlace).
  ReapFrees(false);
  for (uint64_t base : pool_ledger_.Destroy(client)) ReleasePoolRegion(base);  // off the books
  return CUDA_SUCCESS;
}

void Session::DestroyDrainedPools() {
  DriverApi& a = state_->api;
  for (auto it = doomed_pools_.begin(); it != doomed_pools_.end();) {
    uint64_t used = 0;
    CUresult rc = a.cuMemPoolGetAttribute(*it, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
    if (rc == CUDA_SUCCESS && used > 0) {
      ++it;
      continue;
    }
    rc = a.cuMemPoolDestroy(*it);
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("session %llu: destroying a pool the app destroyed failed with error %d",
                static_cast<unsigned long long>(id_), rc);
    it = doomed_pools_.erase(it);
  }
}

CUresult Session::MemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  CUresult rc = api().cuMemPoolTrimTo(pool, keep);
  if (rc != CUDA_SUCCESS) return rc;
  const uint64_t client = ServedPool(reinterpret_cast<uintptr_t>(pool));
  if (client == 0) return CUDA_SUCCESS;
  ReapFrees(false);  // frees whose streams got there are idle memory now
  CUresult first = CUDA_SUCCESS;
  for (uint64_t base : pool_ledger_.ToRelease(client, keep)) {
    CUresult r = ReleasePoolRegion(base);
    if (first == CUDA_SUCCESS) first = r;
  }
  return first;
}

CUresult Session::MemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                        CUstream stream) {
  DriverApi& a = state_->api;
  CUstream s = stream == nullptr && pt_call_ ? CU_STREAM_PER_THREAD : stream;
  const uint64_t client = ServedPool(reinterpret_cast<uintptr_t>(pool));
  bool served = client != 0 && dptr != nullptr && bytes > 0 && !movable_failed_ && !Capturing(s);
  if (served) {  // on the device of the current context only (the movable range's)
    CUdevice device = 0;
    auto origin = pool_origin_.find(client);
    served = a.cuCtxGetDevice(&device) == CUDA_SUCCESS && origin != pool_origin_.end() &&
             origin->second.device == device;
  }
  if (!served) return a.cuMemAllocFromPoolAsync(dptr, bytes, pool, s);
  ReapFrees(false);
  uint64_t at = 0;
  CUresult rc = MovableAlloc(bytes, &at, client);
  if (rc == CUDA_SUCCESS) *dptr = at;
  TrimPools();
  return rc;
}

CUresult Session::PoolAttribute(uint64_t pool, CUmemPool_attribute attr, bool set,
                                uint64_t* value) {
  DriverApi& a = state_->api;
  auto fn = set ? a.cuMemPoolSetAttribute : a.cuMemPoolGetAttribute;
  if (!Owns(HandleKind::kMemPool, pool)) return CUDA_ERROR_INVALID_HANDLE;
  if (fn == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t real = RealHandle(HandleKind::kMemPool, pool);
  const uint64_t served = ServedPool(real);
  if (served != 0 && !set && IsCounter(attr)) {
    // The figures of memory the session holds for the pool, as of now.
    ReapFrees(false);
    TrimPools();
    const PoolLedger::Pool* p = pool_ledger_.Find(served);
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *value = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ? p->reserved
             : attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH  ? p->reserved_high
             : attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT   ? p->used
                                                          : p->used_high;
    return CUDA_SUCCESS;
  }
  // The driver checks and keeps the rest (its answer to a high-water mark
  // other than 0 included).
  const bool is_int = attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
  int as_int = static_cast<int>(*value);
  void* p = is_int ? static_cast<void*>(&as_int) : static_cast<void*>(value);
  CUresult rc = fn(reinterpret_cast<CUmemoryPool>(real), attr, p);
  if (is_int) *value = static_cast<uint64_t>(static_cast<int64_t>(as_int));
  if (rc != CUDA_SUCCESS || served == 0 || !set) return rc;
  if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
    if (PoolLedger::Pool* pl = pool_ledger_.Find(served)) pl->release_threshold = *value;
  } else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
    pool_ledger_.ResetUsedHigh(served);
  } else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
    pool_ledger_.ResetReservedHigh(served);
  }
  return CUDA_SUCCESS;
}

void Session::ChargeIdleRegion(uint64_t base) {
  auto reg = mapped_regions_.find(base);
  if (reg == mapped_regions_.end() || reg->second.pool == 0 || reg->second.idle_charged) return;
  // Not ChargeMemory: that would give back idle regions, this one among them.
  if (!ChargeShare(reg->second.size, reg->second.device)) {
    ReleasePoolRegion(base);
    return;
  }
  reg->second.idle_charged = true;
}

void Session::RefundIdleRegion(uint64_t base) {
  auto reg = mapped_regions_.find(base);
  if (reg == mapped_regions_.end() || !reg->second.idle_charged) return;
  RefundMemory(reg->second.size, reg->second.device);
  reg->second.idle_charged = false;
}

CUresult Session::ReleasePoolRegion(uint64_t base) {
  auto reg = mapped_regions_.find(base);
  if (reg == mapped_regions_.end()) return CUDA_SUCCESS;
  RefundIdleRegion(base);
  const uint64_t pool = reg->second.pool;
  small_chunks_.erase(base);
  CUresult rc = ReleaseRegion(base, reg->second);
  mapped_regions_.erase(reg);
  pool_ledger_.RemoveRegion(pool, base);
  if (rc != CUDA_SUCCESS)
    FLYT_WARN("session %llu: giving back idle pool memory failed with error %d",
              static_cast<unsigned long long>(id_), rc);
  return rc;
}

bool Session::ReleaseIdlePoolMemory() {
  std::vector<uint64_t> release;
  for (const auto& [pool, p] : pool_ledger_.pools())
    for (uint64_t base : pool_ledger_.ToRelease(pool, 0)) release.push_back(base);
  for (uint64_t base : release) ReleasePoolRegion(base);
  return !release.empty();
}

void Session::TrimPools() {
  std::vector<uint64_t> release;
  for (const auto& [pool, p] : pool_ledger_.pools()) {
    if (p.destroyed) continue;
    for (uint64_t base : pool_ledger_.ToRelease(pool, p.release_threshold)) release.push_back(base);
  }
  for (uint64_t base : release) ReleasePoolRegion(base);
}

// --- moving pools ----------------------------------------------------------------

std::string Session::PoolsUnmovable() {
  for (uint64_t h : handles_[static_cast<int>(HandleKind::kMemPool)]) {
    if (ServedPool(RealHandle(HandleKind::kMemPool, h)) != 0) continue;
    auto origin = pool_origin_.find(h);
    if (origin != pool_origin_.end() &&
        origin->second.props.handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
      char types[32];
      std::snprintf(types, sizeof(types), "0x%x",
                    static_cast<unsigned>(origin->second.props.handleTypes));
      return std::string(
                 "it holds a memory pool made for export to other processes "
                 "(cuMemPoolCreate with handleTypes ") +
             types + "): pools shared over IPC do not move";
    }
    if (!state_->movable_memory)
      return "it uses memory pools by handle (cuMemPoolCreate, cuDeviceGetDefaultMemPool): a "
             "flyt-server with --movable-memory serves pools that move";
    return "it holds a memory pool the driver serves (not device memory of the session's GPU, "
           "or made with a usage flag)";
  }
  return "";
}

// pools:   count, {u64 client, u8 default, u8 destroyed, i32 device, props,
//                  u64 release threshold, i32 reuse[3], u64 used high,
//                  u64 reserved high, count, {u64 base, u64 size, u8 small}}
// current: count, {i32 device, u64 client pool} (where not the default)
Status Session::WritePools(SnapshotWriter& out) {
  DriverApi& a = state_->api;
  out.Put<uint64_t>(pool_ledger_.pools().size());
  for (const auto& [client, p] : pool_ledger_.pools()) {
    auto origin = pool_origin_.find(client);
    PoolOrigin o = origin != pool_origin_.end() ? origin->second : PoolOrigin{};
    int32_t reuse[3] = {1, 1, 1};
    if (!p.destroyed) {
      const auto real = reinterpret_cast<CUmemoryPool>(RealHandle(HandleKind::kMemPool, client));
      for (int i = 0; i < 3; ++i) {
        int v = 0;
        CUresult r = a.cuMemPoolGetAttribute(real, kReuseAttributes[i], &v);
        if (r != CUDA_SUCCESS)
          return Status::Error("reading a memory pool's attribute: " + Describe(r));
        reuse[i] = v;
      }
    }
    out.Put(client);
    out.Put<uint8_t>(o.is_default ? 1 : 0);
    out.Put<uint8_t>(p.destroyed ? 1 : 0);
    out.Put<int32_t>(o.device);
    out.Put(o.props);
    out.Put(p.release_threshold);
    for (int32_t v : reuse) out.Put(v);
    out.Put(p.used_high);
    out.Put(p.reserved_high);
    out.Put<uint64_t>(p.regions.size());
    for (const auto& [base, r] : p.regions) {
      out.Put(base);
      out.Put(r.size);
      out.Put<uint8_t>(r.small ? 1 : 0);
    }
  }
  std::vector<std::pair<int32_t, uint64_t>> current;
  if (primary_ != nullptr) {
    CUmemoryPool cur = nullptr, def = nullptr;
    CUresult r = a.cuDeviceGetMemPool(&cur, primary_device_);
    if (r == CUDA_SUCCESS) r = a.cuDeviceGetDefaultMemPool(&def, primary_device_);
    if (r != CUDA_SUCCESS) return Status::Error("reading the device's memory pool: " + Describe(r));
    if (cur != def) {
      const uint64_t client = ServedPool(reinterpret_cast<uintptr_t>(cur));
      if (client == 0) return Status::Error("the device's current memory pool is the driver's");
      current.emplace_back(primary_device_, client);
    }
  }
  out.Put<uint64_t>(current.size());
  for (auto& [dev, client] : current) {
    out.Put(dev);
    out.Put(client);
  }
  return out.status();
}

Status Session::ReadPools(SnapshotReader& in, RestoredPools* pools) {
  uint64_t n = 0;
  if (!in.Count(&n)) return in.status();
  pools->pools.resize(n);
  for (RestoredPool& p : pools->pools) {
    uint64_t nregions = 0;
    if (!in.Get(&p.client) || !in.Get(&p.is_default) || !in.Get(&p.destroyed) ||
        !in.Get(&p.device) || !in.Get(&p.props) || !in.Get(&p.release_threshold) ||
        !in.Get(&p.reuse[0]) || !in.Get(&p.reuse[1]) || !in.Get(&p.reuse[2]) ||
        !in.Get(&p.used_high) || !in.Get(&p.reserved_high) || !in.Count(&nregions))
      return in.status();
    p.regions.resize(nregions);
    for (auto& r : p.regions)
      if (!in.Get(&r.base) || !in.Get(&r.size) || !in.Get(&r.small)) return in.status();
  }
  if (!in.Count(&n)) return in.status();
  pools->current.resize(n);
  for (auto& [dev, client] : pools->current)
    if (!in.Get(&dev) || !in.Get(&client)) return in.status();
  return Status::Ok();
}

Status Session::RestorePoolRegions(const RestoredPools& pools, uint64_t gran) {
  for (const RestoredPool& p : pools.pools) {
    pool_ledger_.AddPool(p.client, p.props.maxSize);
    for (const auto& r : p.regions) {
      if (r.size == 0 || r.size % gran != 0 || r.base % gran != 0)
        return Status::Error("a damaged snapshot (a pool's region is not whole granules)");
      bool handled = false;
      Status st = RestoreMovableRegion(r.base, r.size, gran, &handled);
      if (!st.ok()) return st;
      if (!handled)
        return Status::Error("a damaged snapshot (pool memory outside the movable range)");
      mapped_regions_[r.base].pool = p.client;
      pool_ledger_.AddRegion(p.client, r.base, r.size, r.small != 0);
      if (r.small != 0) small_chunks_[r.base].Reset(r.base, r.size);
    }
    if (PoolLedger::Pool* l = pool_ledger_.Find(p.client)) {
      l->destroyed = p.destroyed != 0;
      l->release_threshold = p.release_threshold;
    }
  }
  return Status::Ok();
}

void Session::RestorePoolAllocation(uint64_t base, uint64_t size) {
  auto place = mapped_allocs_.find(base);
  if (place == mapped_allocs_.end()) return;
  auto reg = mapped_regions_.find(place->second.region);
  if (reg == mapped_regions_.end() || reg->second.pool == 0) return;
  auto chunk = small_chunks_.find(reg->first);
  if (chunk != small_chunks_.end() && !chunk->second.TakeAt(base, (size + 511) / 512 * 512))
    FLYT_WARN("session %llu: a restored pool allocation overlaps another",
              static_cast<unsigned long long>(id_));
  pool_ledger_.Place(reg->second.pool, reg->first, PoolUse(place->second));
}

Status Session::RestorePools(const RestoredPools& pools) {
  DriverApi& a = state_->api;
  for (const RestoredPool& p : pools.pools) {
    if (!pool_ledger_.Has(p.client)) {  // a pool that held no memory
      if (p.destroyed != 0) continue;
      pool_ledger_.AddPool(p.client, p.props.maxSize);
    }
    PoolLedger::Pool* l = pool_ledger_.Find(p.client);
    l->release_threshold = p.release_threshold;
    // What the app saw before the move stays the high-water mark.
    l->used_high = std::max(l->used_high, p.used_high);
    l->reserved_high = std::max(l->reserved_high, p.reserved_high);
    if (p.destroyed != 0) continue;
    if (p.device < 0 || p.device >= static_cast<int32_t>(state_->devices.size()))
      return Status::Error("a memory pool of GPU " + std::to_string(p.device) +
                           ", which this server does not have");
    CUmemoryPool real = nullptr;
    CUresult r = p.is_default != 0 ? a.cuDeviceGetDefaultMemPool(&real, p.device)
                                   : a.cuMemPoolCreate(&real, &p.props);
    if (r != CUDA_SUCCESS || real == nullptr)
      return Status::Error(
          std::string(p.is_default != 0 ? "cuDeviceGetDefaultMemPool" : "cuMemPoolCreate") + ": " +
          Describe(r));
    const auto value = reinterpret_cast<uintptr_t>(real);
    xlate_[static_cast<int>(HandleKind::kMemPool)][p.client] = value;
    rev_[static_cast<int>(HandleKind::kMemPool)][value] = p.client;
    Adopt(HandleKind::kMemPool, p.client);
    pool_origin_[p.client] = PoolOrigin{p.device, p.is_default != 0, p.props};
    cuuint64_t threshold = p.release_threshold;
    r = a.cuMemPoolSetAttribute(real, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    for (int i = 0; i < 3 && r == CUDA_SUCCESS; ++i) {
      int v = p.reuse[i];
      r = a.cuMemPoolSetAttribute(real, kReuseAttributes[i], &v);
    }
    if (r != CUDA_SUCCESS)
      return Status::Error("setting a memory pool's attributes: " + Describe(r));
  }
  for (const auto& [dev, client] : pools.current) {
    if (dev < 0 || dev >= static_cast<int32_t>(state_->devices.size()) || !pool_ledger_.Has(client))
      return Status::Error("a damaged snapshot (the device's current pool)");
    CUresult r = a.cuDeviceSetMemPool(
        dev, reinterpret_cast<CUmemoryPool>(RealHandle(HandleKind::kMemPool, client)));
    if (r != CUDA_SUCCESS) return Status::Error("cuDeviceSetMemPool: " + Describe(r));
  }
  return Status::Ok();
}

}  // namespace flyt::server
