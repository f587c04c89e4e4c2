// The books of the stream-ordered memory pools a session serves itself
// (server/session_pools.cc): which regions of device memory back each pool,
// which of them hold no allocation (kept for reuse), and the figures the
// driver reports for a pool (cuMemPoolGetAttribute: used and reserved memory,
// current and high).
//
// Owns: per pool, its regions (base, size, whether it packs small
// allocations, how many allocations it holds), its used and reserved bytes and
// their high-water marks, its release threshold and maximum size; which idle
// regions to reuse for an allocation and which to give back for a trim.
// Must not call the driver, nor know addresses' contents or other sessions:
// the session maps and unmaps what the ledger names.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace flyt::server {

class PoolLedger {
 public:
  struct Region {
    uint64_t size = 0;
    bool small = false;  // packs allocations of up to half a granule
    uint32_t live = 0;   // allocations inside
  };
  struct Pool {
    uint64_t used = 0, used_high = 0;
    uint64_t reserved = 0, reserved_high = 0;
    uint64_t release_threshold = 0;
    uint64_t max_size = 0;               // 0: no limit (CUmemPoolProps::maxSize)
    bool destroyed = false;              // cuMemPoolDestroy: gone once its last region is
    std::map<uint64_t, Region> regions;  // by base
  };

  // A pool the session serves from now on (under the client's handle value).
  void AddPool(uint64_t pool, uint64_t max_size);
  bool Has(uint64_t pool) const { return pools_.count(pool) != 0; }
  Pool* Find(uint64_t pool);
  const Pool* Find(uint64_t pool) const;
  const std::map<uint64_t, Pool>& pools() const { return pools_; }
  // cuMemPoolDestroy: the idle regions to give back now (they leave the
  // books); regions with allocations stay until those are freed. The pool
  // itself leaves the books with its last region.
  std::vector<uint64_t> Destroy(uint64_t pool);

  // Whether `size` more bytes would pass the pool's maximum size.
  bool OverMax(uint64_t pool, uint64_t size) const;
  // A region of `size` bytes the session mapped for the pool (no allocation yet).
  void AddRegion(uint64_t pool, uint64_t base, uint64_t size, bool small);
  // The region at `base` left the books (unmapped).
  void RemoveRegion(uint64_t pool, uint64_t base);
  // The pool that holds the region at `base`, or 0.
  uint64_t PoolOfRegion(uint64_t base) const;
  // An allocation of `used` bytes placed in / gone from the region at `base`.
  void Place(uint64_t pool, uint64_t base, uint64_t used);
  void Unplace(uint64_t pool, uint64_t base, uint64_t used);
  // The smallest idle region for a whole allocation (not a small one) of
  // `size` bytes: at least `size`, at most twice it; 0 when none.
  uint64_t IdleFit(uint64_t pool, uint64_t size) const;
  // Idle regions to give back, largest first, until the pool reserves at
  // most `keep` bytes (what may be given back: idle regions only).
  std::vector<uint64_t> ToRelease(uint64_t pool, uint64_t keep) const;
  // cuMemPoolSetAttribute of a high-water mark (the driver takes only 0):
  // back to the current figure.
  void ResetUsedHigh(uint64_t pool);
  void ResetReservedHigh(uint64_t pool);
  // Forgets everything (the session's end).
  void Clear() { pools_.clear(); }

 private:
  std::map<uint64_t, Pool> pools_;  // by the client's pool handle
};

}  // namespace flyt::server
