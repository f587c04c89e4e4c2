#include "server/address_span.h"

#include <iterator>

namespace flyt::server {

void AddressSpan::Reset(uint64_t base, uint64_t size) {
  base_ = base;
  size_ = size;
  free_.clear();
  if (size != 0) free_[base] = size;
}

uint64_t AddressSpan::Take(uint64_t bytes, uint64_t align) {
  if (bytes == 0 || align == 0 || (align & (align - 1)) != 0) return 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    uint64_t start = it->first, len = it->second;
    uint64_t at = (start + align - 1) & ~(align - 1);
    if (at < start || at - start >= len || len - (at - start) < bytes) continue;
    uint64_t tail = len - (at - start) - bytes;
    free_.erase(it);
    if (at > start) free_[start] = at - start;
    if (tail != 0) free_[at + bytes] = tail;
    return at;
  }
  return 0;
}

bool AddressSpan::TakeAt(uint64_t addr, uint64_t bytes) {
  if (bytes == 0 || addr + bytes < addr) return false;
  auto it = free_.upper_bound(addr);
  if (it == free_.begin()) return false;
  --it;
  uint64_t start = it->first, len = it->second;
  if (addr - start >= len || len - (addr - start) < bytes) return false;
  uint64_t tail = len - (addr - start) - bytes;
  free_.erase(it);
  if (addr > start) free_[start] = addr - start;
  if (tail != 0) free_[addr + bytes] = tail;
  return true;
}

void AddressSpan::Give(uint64_t addr, uint64_t bytes) {
  if (bytes == 0) return;
  auto next = free_.lower_bound(addr);
  if (next != free_.end() && next->first == addr + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == addr) {
      prev->second += bytes;
      return;
    }
  }
  free_[addr] = bytes;
}

bool AddressSpan::AllFree() const {
  return size_ == 0 ||
         (free_.size() == 1 && free_.begin()->first == base_ && free_.begin()->second == size_);
}

}  // namespace flyt::server
