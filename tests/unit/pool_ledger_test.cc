// PoolLedger: used and reserved figures with their high-water marks, reuse of
// idle regions, what a trim or a release threshold gives back, the maximum
// size, and a destroyed pool that goes with its last region.
#include "server/pool_ledger.h"

#include <gtest/gtest.h>

namespace flyt::server {
namespace {

constexpr uint64_t kG = 2 << 20;  // one granule

TEST(PoolLedger, CountsUsedAndReservedWithHighMarks) {
  PoolLedger l;
  l.AddPool(7, 0);
  l.AddRegion(7, 0x1000000, 2 * kG, false);
  l.Place(7, 0x1000000, 2 * kG);
  l.AddRegion(7, 0x2000000, kG, true);
  l.Place(7, 0x2000000, 512);
  l.Place(7, 0x2000000, 1024);
  const PoolLedger::Pool* p = l.Find(7);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->reserved, 3 * kG);
  EXPECT_EQ(p->used, 2 * kG + 1536);
  l.Unplace(7, 0x1000000, 2 * kG);
  EXPECT_EQ(p->used, 1536u);
  EXPECT_EQ(p->used_high, 2 * kG + 1536);
  l.ResetUsedHigh(7);
  EXPECT_EQ(p->used_high, 1536u);
  EXPECT_EQ(p->regions.at(0x2000000).live, 2u);
  EXPECT_EQ(l.PoolOfRegion(0x2000000), 7u);
  EXPECT_EQ(l.PoolOfRegion(0x3000000), 0u);
}

TEST(PoolLedger, ReusesTheSmallestIdleRegionThatFits) {
  PoolLedger l;
  l.AddPool(1, 0);
  l.AddRegion(1, 0x10000000, 8 * kG, false);
  l.AddRegion(1, 0x20000000, 4 * kG, false);
  l.AddRegion(1, 0x30000000, kG, true);  // small: never for a whole allocation
  EXPECT_EQ(l.IdleFit(1, 3 * kG), 0x20000000u);
  EXPECT_EQ(l.IdleFit(1, kG), 0u);  // 4 granules is more than twice one
  EXPECT_EQ(l.IdleFit(1, 5 * kG), 0x10000000u);
  l.Place(1, 0x20000000, 4 * kG);
  EXPECT_EQ(l.IdleFit(1, 3 * kG), 0u);  // busy now; 8 is more than twice 3
  EXPECT_EQ(l.IdleFit(2, 3 * kG), 0u);  // no such pool
}

TEST(PoolLedger, ReleasesIdleRegionsLargestFirstDownToWhatItKeeps) {
  PoolLedger l;
  l.AddPool(1, 0);
  l.AddRegion(1, 0x10000000, kG, false);
  l.AddRegion(1, 0x20000000, 4 * kG, false);
  l.AddRegion(1, 0x30000000, 2 * kG, false);
  l.AddRegion(1, 0x40000000, 8 * kG, false);
  l.Place(1, 0x40000000, 8 * kG);  // busy: never given back
  EXPECT_TRUE(l.ToRelease(1, 15 * kG).empty());
  EXPECT_EQ(l.ToRelease(1, 12 * kG), (std::vector<uint64_t>{0x20000000}));
  EXPECT_EQ(l.ToRelease(1, 0), (std::vector<uint64_t>{0x20000000, 0x30000000, 0x10000000}));
  for (uint64_t b : l.ToRelease(1, 0)) l.RemoveRegion(1, b);
  EXPECT_EQ(l.Find(1)->reserved, 8 * kG);
  EXPECT_EQ(l.Find(1)->reserved_high, 15 * kG);
  l.ResetReservedHigh(1);
  EXPECT_EQ(l.Find(1)->reserved_high, 8 * kG);
}

TEST(PoolLedger, MaximumSize) {
  PoolLedger l;
  l.AddPool(3, 4 * kG);
  EXPECT_FALSE(l.OverMax(3, 4 * kG));
  EXPECT_TRUE(l.OverMax(3, 5 * kG));
  l.AddRegion(3, 0x10000000, 3 * kG, false);
  EXPECT_FALSE(l.OverMax(3, kG));
  EXPECT_TRUE(l.OverMax(3, 2 * kG));
  l.AddPool(4, 0);  // no limit
  EXPECT_FALSE(l.OverMax(4, ~0ull));
}

TEST(PoolLedger, DestroyedPoolGoesWithItsLastRegion) {
  PoolLedger l;
  l.AddPool(5, 0);
  l.AddRegion(5, 0x10000000, kG, false);
  l.AddRegion(5, 0x20000000, kG, false);
  l.Place(5, 0x20000000, kG);
  EXPECT_EQ(l.Destroy(5), (std::vector<uint64_t>{0x10000000}));  // idle: at once
  ASSERT_TRUE(l.Has(5));
  EXPECT_TRUE(l.Find(5)->destroyed);
  l.Unplace(5, 0x20000000, kG);
  l.RemoveRegion(5, 0x20000000);
  EXPECT_FALSE(l.Has(5));
  l.AddPool(6, 0);
  EXPECT_TRUE(l.Destroy(6).empty());
  EXPECT_FALSE(l.Has(6));
}

}  // namespace
}  // namespace flyt::server
