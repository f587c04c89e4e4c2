// Free ranges of one stretch of addresses, first fit.
//
// Owns: which parts of [base, base+size) are free, with neighbours merged.
// A session places its movable memory with it (server/session_movable.cc):
// once for its reservation of device addresses, once per small-allocation
// chunk. Must not call the driver nor know what the addresses hold.
#pragma once

#include <cstdint>
#include <map>

namespace flyt::server {

class AddressSpan {
 public:
  // Everything in [base, base + size) free; what was there is forgotten.
  void Reset(uint64_t base, uint64_t size);
  // The lowest free address aligned to `align` (a power of two) with `bytes`
  // free from it, now taken; 0 when none (or bytes is 0).
  uint64_t Take(uint64_t bytes, uint64_t align);
  // Takes exactly [addr, addr + bytes); false when any of it is not free.
  bool TakeAt(uint64_t addr, uint64_t bytes);
  // Gives back what Take returned (or part of the span); merges neighbours.
  void Give(uint64_t addr, uint64_t bytes);
  // Whether nothing is taken.
  bool AllFree() const;
  uint64_t base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  uint64_t base_ = 0, size_ = 0;
  std::map<uint64_t, uint64_t> free_;  // start -> length
};

}  // namespace flyt::server
