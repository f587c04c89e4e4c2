// Test helper: n pseudo-random bytes from a seed (xorshift), the same for a seed on every
// run, for tests that copy bytes and compare (parallel_copy_test, session_staged_copy_test).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flyt::test_support {

inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

}  // namespace flyt::test_support
