// Implementation of server/pool_ledger.h: bookkeeping only, no driver calls.
#include "server/pool_ledger.h"

#include <algorithm>

namespace flyt::server {

void PoolLedger::AddPool(uint64_t pool, uint64_t max_size) {
  Pool& p = pools_[pool];
  p.max_size = max_size;
  p.destroyed = false;
}

PoolLedger::Pool* PoolLedger::Find(uint64_t pool) {
  auto it = pools_.find(pool);
  return it == pools_.end() ? nullptr : &it->second;
}

const PoolLedger::Pool* PoolLedger::Find(uint64_t pool) const {
  auto it = pools_.find(pool);
  return it == pools_.end() ? nullptr : &it->second;
}

std::vector<uint64_t> PoolLedger::Destroy(uint64_t pool) {
  std::vector<uint64_t> idle;
  Pool* p = Find(pool);
  if (p == nullptr) return idle;
  p->destroyed = true;
  for (const auto& [base, r] : p->regions)
    if (r.live == 0) idle.push_back(base);
  for (uint64_t base : idle) RemoveRegion(pool, base);
  if (p->regions.empty()) pools_.erase(pool);
  return idle;
}

bool PoolLedger::OverMax(uint64_t pool, uint64_t size) const {
  const Pool* p = Find(pool);
  return p != nullptr && p->max_size != 0 &&
         (size > p->max_size || p->reserved > p->max_size - size);
}

void PoolLedger::AddRegion(uint64_t pool, uint64_t base, uint64_t size, bool small) {
  Pool* p = Find(pool);
  if (p == nullptr) return;
  Region& r = p->regions[base];
  r.size = size;
  r.small = small;
  r.live = 0;
  p->reserved += size;
  p->reserved_high = std::max(p->reserved_high, p->reserved);
}

void PoolLedger::RemoveRegion(uint64_t pool, uint64_t base) {
  Pool* p = Find(pool);
  if (p == nullptr) return;
  auto it = p->regions.find(base);
  if (it == p->regions.end()) return;
  p->reserved -= std::min(p->reserved, it->second.size);
  p->regions.erase(it);
  if (p->destroyed && p->regions.empty()) pools_.erase(pool);
}

uint64_t PoolLedger::PoolOfRegion(uint64_t base) const {
  for (const auto& [pool, p] : pools_)
    if (p.regions.count(base) != 0) return pool;
  return 0;
}

void PoolLedger::Place(uint64_t pool, uint64_t base, uint64_t used) {
  Pool* p = Find(pool);
  if (p == nullptr) return;
  auto it = p->regions.find(base);
  if (it != p->regions.end()) it->second.live++;
  p->used += used;
  p->used_high = std::max(p->used_high, p->used);
}

void PoolLedger::Unplace(uint64_t pool, uint64_t base, uint64_t used) {
  Pool* p = Find(pool);
  if (p == nullptr) return;
  auto it = p->regions.find(base);
  if (it != p->regions.end() && it->second.live > 0) it->second.live--;
  p->used -= std::min(p->used, used);
}

uint64_t PoolLedger::IdleFit(uint64_t pool, uint64_t size) const {
  const Pool* p = Find(pool);
  if (p == nullptr || size == 0) return 0;
  uint64_t best = 0, best_size = 0;
  for (const auto& [base, r] : p->regions) {
    if (r.small || r.live != 0 || r.size < size || r.size / 2 > size) continue;
    if (best == 0 || r.size < best_size) {
      best = base;
      best_size = r.size;
    }
  }
  return best;
}

std::vector<uint64_t> PoolLedger::ToRelease(uint64_t pool, uint64_t keep) const {
  std::vector<uint64_t> out;
  const Pool* p = Find(pool);
  if (p == nullptr || p->reserved <= keep) return out;
  std::vector<std::pair<uint64_t, uint64_t>> idle;  // size, base
  for (const auto& [base, r] : p->regions)
    if (r.live == 0) idle.emplace_back(r.size, base);
  std::sort(idle.begin(), idle.end(), [](auto& x, auto& y) {
    return x.first != y.first ? x.first > y.first : x.second < y.second;
  });
  uint64_t reserved = p->reserved;
  for (const auto& [size, base] : idle) {
    if (reserved <= keep) break;
    out.push_back(base);
    reserved -= size;
  }
  return out;
}

void PoolLedger::ResetUsedHigh(uint64_t pool) {
  if (Pool* p = Find(pool)) p->used_high = p->used;
}

void PoolLedger::ResetReservedHigh(uint64_t pool) {
  if (Pool* p = Find(pool)) p->reserved_high = p->reserved;
}

}  // namespace flyt::server
