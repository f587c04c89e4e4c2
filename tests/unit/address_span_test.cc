// AddressSpan: first fit, alignment, merging on give-back, exhaustion.
#include "server/address_span.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace flyt::server {
namespace {

TEST(AddressSpan, TakesFirstFitAligned) {
  AddressSpan s;
  s.Reset(0x1000, 0x10000);
  EXPECT_EQ(s.Take(0x100, 0x1000), 0x1000u);
  EXPECT_EQ(s.Take(0x100, 0x1000), 0x2000u);  // aligned past the first
  EXPECT_EQ(s.Take(0x80, 0x80), 0x1100u);     // the gap the alignment left
  EXPECT_FALSE(s.AllFree());
}

TEST(AddressSpan, RefusesWhatDoesNotFit) {
  AddressSpan s;
  s.Reset(0x1000, 0x1000);
  EXPECT_EQ(s.Take(0x2000, 0x10), 0u);
  EXPECT_EQ(s.Take(0, 0x10), 0u);
  EXPECT_EQ(s.Take(0x10, 3), 0u);  // not a power of two
  EXPECT_EQ(s.Take(0x1000, 0x1000), 0x1000u);
  EXPECT_EQ(s.Take(1, 1), 0u);  // full
}

TEST(AddressSpan, GivingBackMergesNeighbours) {
  AddressSpan s;
  s.Reset(0x10000, 0x4000);
  uint64_t a = s.Take(0x1000, 0x1000), b = s.Take(0x1000, 0x1000), c = s.Take(0x1000, 0x1000);
  ASSERT_EQ(a, 0x10000u);
  ASSERT_EQ(c, 0x12000u);
  s.Give(b, 0x1000);
  EXPECT_EQ(s.Take(0x2000, 0x1000), 0u);  // b and the tail are free, but apart
  s.Give(c, 0x1000);                      // joins them
  EXPECT_EQ(s.Take(0x3000, 0x1000), 0x11000u);
  s.Give(0x11000, 0x3000);
  s.Give(a, 0x1000);
  EXPECT_TRUE(s.AllFree());
  EXPECT_EQ(s.Take(0x4000, 0x1000), 0x10000u);
}

TEST(AddressSpan, TakesExactRanges) {
  AddressSpan s;
  s.Reset(0x10000, 0x10000);
  EXPECT_TRUE(s.TakeAt(0x14000, 0x2000));
  EXPECT_FALSE(s.TakeAt(0x15000, 0x2000));      // overlaps what was taken
  EXPECT_FALSE(s.TakeAt(0x1f000, 0x2000));      // past the end
  EXPECT_FALSE(s.TakeAt(0x8000, 0x1000));       // before the start
  EXPECT_EQ(s.Take(0x5000, 0x1000), 0x16000u);  // the first hole is 0x4000 long
  s.Give(0x14000, 0x2000);
  s.Give(0x16000, 0x5000);
  EXPECT_TRUE(s.AllFree());
}

TEST(AddressSpan, RandomTakesNeverOverlapAndAllComeBack) {
  AddressSpan s;
  const uint64_t base = 0x100000000000ull, size = 16ull << 30;
  s.Reset(base, size);
  std::mt19937_64 rng(7);
  std::map<uint64_t, uint64_t> live;
  for (int i = 0; i < 5000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      s.Give(it->first, it->second);
      live.erase(it);
      continue;
    }
    uint64_t bytes = 512 * (1 + rng() % 4096);
    uint64_t at = s.Take(bytes, 512);
    ASSERT_NE(at, 0u);
    ASSERT_GE(at, base);
    ASSERT_LE(at + bytes, base + size);
    auto next = live.lower_bound(at);
    if (next != live.end()) {
      ASSERT_LE(at + bytes, next->first);
    }
    if (next != live.begin()) {
      ASSERT_LE(std::prev(next)->first + std::prev(next)->second, at);
    }
    live[at] = bytes;
  }
  for (auto& [a, n] : live) s.Give(a, n);
  EXPECT_TRUE(s.AllFree());
}

}  // namespace
}  // namespace flyt::server
