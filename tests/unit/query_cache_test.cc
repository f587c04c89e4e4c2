// QueryCache: which answers stay and which rules make them stale.
#include "client/query_cache.h"

#include <gtest/gtest.h>

namespace flyt::client {
namespace {

constexpr int kMaxDyn = 8;    // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kRegs = 4;      // CU_FUNC_ATTRIBUTE_NUM_REGS
constexpr int kCarveout = 9;  // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT

class QueryCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { q.Clear(); }
  QueryCache& q = QueryCache::Get();
};

TEST_F(QueryCacheTest, AttributesAreKeptPerHandleKindAndDevice) {
  int v = 0;
  EXPECT_FALSE(q.FindAttribute(0x10, true, kRegs, 0, &v));
  q.PutAttribute(0x10, true, kRegs, 0, 40);
  ASSERT_TRUE(q.FindAttribute(0x10, true, kRegs, 0, &v));
  EXPECT_EQ(v, 40);
  EXPECT_FALSE(q.FindAttribute(0x10, true, kRegs, 1, &v)) << "another device";
  EXPECT_FALSE(q.FindAttribute(0x10, false, kRegs, -1, &v)) << "a CUfunction of the same value";
  q.PutAttribute(0x20, false, kRegs, 7, 32);  // functions ignore the device
  ASSERT_TRUE(q.FindAttribute(0x20, false, kRegs, -1, &v));
  EXPECT_EQ(v, 32);
}

TEST_F(QueryCacheTest, SettingTheHeldValueKeepsEverything) {
  q.PutAttribute(0x10, true, kMaxDyn, 0, 1024);
  q.PutAttribute(0x30, false, kMaxDyn, -1, 2048);
  q.PutOccupancy(0x30, 256, 1024, 0, 8);
  q.AttributeSet(0x10, true, kMaxDyn, 0, 1024);
  int v = 0;
  EXPECT_TRUE(q.FindAttribute(0x10, true, kMaxDyn, 0, &v));
  EXPECT_TRUE(q.FindAttribute(0x30, false, kMaxDyn, -1, &v));
  EXPECT_TRUE(q.FindOccupancy(0x30, 256, 1024, 0, &v));
}

TEST_F(QueryCacheTest, SettingANewValueForgetsThatAttributeAndOccupancy) {
  q.PutAttribute(0x10, true, kMaxDyn, 0, 1024);
  q.PutAttribute(0x11, true, kMaxDyn, 0, 512);
  q.PutAttribute(0x10, true, kRegs, 0, 40);
  q.PutAttribute(0x30, false, kMaxDyn, -1, 1024);  // perhaps a function of kernel 0x10
  q.PutAttribute(0x30, false, kRegs, -1, 40);
  q.PutOccupancy(0x30, 256, 0, 0, 8);
  q.AttributeSet(0x10, true, kMaxDyn, 0, 4096);
  int v = 0;
  EXPECT_FALSE(q.FindAttribute(0x10, true, kMaxDyn, 0, &v));
  EXPECT_TRUE(q.FindAttribute(0x11, true, kMaxDyn, 0, &v)) << "another kernel keeps its own";
  EXPECT_TRUE(q.FindAttribute(0x10, true, kRegs, 0, &v)) << "another attribute stays";
  EXPECT_FALSE(q.FindAttribute(0x30, false, kMaxDyn, -1, &v)) << "functions share settings";
  EXPECT_TRUE(q.FindAttribute(0x30, false, kRegs, -1, &v));
  EXPECT_FALSE(q.FindOccupancy(0x30, 256, 0, 0, &v));
}

TEST_F(QueryCacheTest, SettingAnUncachedAttributeForgetsOccupancy) {
  q.PutOccupancy(0x30, 128, 0, 1, 16);
  q.AttributeSet(0x30, false, kCarveout, -1, 50);
  int v = 0;
  EXPECT_FALSE(q.FindOccupancy(0x30, 128, 0, 1, &v));
}

TEST_F(QueryCacheTest, OccupancyKeysOnBlockSharedMemoryAndFlags) {
  q.PutOccupancy(0x30, 256, 1024, 0, 8);
  int v = 0;
  ASSERT_TRUE(q.FindOccupancy(0x30, 256, 1024, 0, &v));
  EXPECT_EQ(v, 8);
  EXPECT_FALSE(q.FindOccupancy(0x30, 128, 1024, 0, &v));
  EXPECT_FALSE(q.FindOccupancy(0x30, 256, 2048, 0, &v));
  EXPECT_FALSE(q.FindOccupancy(0x30, 256, 1024, 1, &v));
  q.CacheConfigChanged();
  EXPECT_FALSE(q.FindOccupancy(0x30, 256, 1024, 0, &v));
}

TEST_F(QueryCacheTest, FunctionsArePerContextAndClearForgetsAll) {
  q.PutFunction(0x10, 0xc1, 0x99);
  uint64_t f = 0;
  ASSERT_TRUE(q.FindFunction(0x10, 0xc1, &f));
  EXPECT_EQ(f, 0x99u);
  EXPECT_FALSE(q.FindFunction(0x10, 0xc2, &f));
  q.PutAttribute(0x10, true, kRegs, 0, 40);
  q.PutOccupancy(0x30, 256, 0, 0, 8);
  q.Clear();
  int v = 0;
  EXPECT_FALSE(q.FindFunction(0x10, 0xc1, &f));
  EXPECT_FALSE(q.FindAttribute(0x10, true, kRegs, 0, &v));
  EXPECT_FALSE(q.FindOccupancy(0x30, 256, 0, 0, &v));
}

}  // namespace
}  // namespace flyt::client
