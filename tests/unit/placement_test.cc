// Placement index (src/cluster/placement.h): host preference, policies, refusals,
// oversubscription, drain, resize checks, release, and a randomized check of the index
// against a brute-force scan.
#include "cluster/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace flyt::cluster {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

GpuCapacity Gpu(const std::string& uuid, const std::string& node, const std::string& host,
                int sm = 132, int64_t memory = 141 * kGiB) {
  return GpuCapacity{uuid, node, host, sm, memory};
}

// n1 (10.0.0.1): GPU-a, GPU-b; n2 (10.0.0.2): GPU-c, GPU-d. All 132 SMs, 141 GiB.
void AddTwoNodes(Placement* p) {
  p->AddGpu(Gpu("GPU-a", "n1", "10.0.0.1"));
  p->AddGpu(Gpu("GPU-b", "n1", "10.0.0.1"));
  p->AddGpu(Gpu("GPU-c", "n2", "10.0.0.2"));
  p->AddGpu(Gpu("GPU-d", "n2", "10.0.0.2"));
}

std::string PlaceOrDie(const Placement& p, const PlacementRequest& r) {
  std::string uuid;
  Status s = p.Place(r, &uuid);
  EXPECT_TRUE(s.ok()) << s.message();
  return uuid;
}

std::string Refusal(const Placement& p, const PlacementRequest& r) {
  std::string uuid;
  Status s = p.Place(r, &uuid);
  EXPECT_FALSE(s.ok()) << "placed on " << uuid;
  return s.message();
}

std::string Name(const char* prefix, int n) {
  std::string s = prefix;
  s += std::to_string(n);
  return s;
}

PlacementRequest Req(int sm, int64_t memory, const std::string& host = "") {
  return PlacementRequest{"192.168.0.10", host, sm, memory};
}

TEST(PlacementTest, EmptyClusterRefuses) {
  Placement p;
  EXPECT_EQ(p.gpu_count(), 0u);
  EXPECT_EQ(Refusal(p, Req(8, 4 * kGiB)), "no GPU has 8 SMs and 4.0 GiB free (no GPU registered)");
}

TEST(PlacementTest, PrefersGpusOfTheVmsHost) {
  Placement p;
  AddTwoNodes(&p);
  // n1 is emptier, but the VM lives on n2's host.
  p.Reserve("GPU-c", 64, 10 * kGiB);
  p.Reserve("GPU-d", 32, 10 * kGiB);
  EXPECT_EQ(PlaceOrDie(p, Req(16, 8 * kGiB, "10.0.0.2")), "GPU-d");
  // Nothing on the host fits: fall back to the rest of the cluster.
  std::string uuid = PlaceOrDie(p, Req(120, 8 * kGiB, "10.0.0.2"));
  EXPECT_TRUE(uuid == "GPU-a" || uuid == "GPU-b") << uuid;
  // An unknown host or none: the whole cluster by policy.
  p.Reserve("GPU-a", 8, 0);
  EXPECT_EQ(PlaceOrDie(p, Req(8, kGiB, "10.9.9.9")), "GPU-b");
  EXPECT_EQ(PlaceOrDie(p, Req(8, kGiB)), "GPU-b");
}

TEST(PlacementTest, SpreadTakesMostFree) {
  Placement p(PlacementOptions{Policy::kSpread});
  AddTwoNodes(&p);
  p.Reserve("GPU-a", 64, 10 * kGiB);
  p.Reserve("GPU-b", 32, 10 * kGiB);
  p.Reserve("GPU-c", 16, 100 * kGiB);
  p.Reserve("GPU-d", 16, 120 * kGiB);
  EXPECT_EQ(PlaceOrDie(p, Req(8, 4 * kGiB)), "GPU-c");   // most free SMs, then memory
  EXPECT_EQ(PlaceOrDie(p, Req(8, 50 * kGiB)), "GPU-b");  // c and d lack the memory
  // Placing the same request repeatedly spreads it over all GPUs.
  Placement q;
  AddTwoNodes(&q);
  std::vector<std::string> picks;
  for (int i = 0; i < 4; ++i) {
    std::string uuid = PlaceOrDie(q, Req(16, 8 * kGiB));
    q.Reserve(uuid, 16, 8 * kGiB);
    picks.push_back(uuid);
  }
  std::sort(picks.begin(), picks.end());
  EXPECT_EQ(picks, (std::vector<std::string>{"GPU-a", "GPU-b", "GPU-c", "GPU-d"}));
}

TEST(PlacementTest, PackTakesFullestThatFits) {
  Placement p(PlacementOptions{Policy::kPack});
  AddTwoNodes(&p);
  p.Reserve("GPU-a", 64, 10 * kGiB);
  p.Reserve("GPU-b", 124, 10 * kGiB);   // 8 SMs left
  p.Reserve("GPU-c", 100, 130 * kGiB);  // 32 SMs, 11 GiB left
  EXPECT_EQ(PlaceOrDie(p, Req(8, 4 * kGiB)), "GPU-b");
  EXPECT_EQ(PlaceOrDie(p, Req(16, 4 * kGiB)), "GPU-c");
  EXPECT_EQ(PlaceOrDie(p, Req(16, 20 * kGiB)), "GPU-a");  // c has SMs, not memory
  EXPECT_EQ(PlaceOrDie(p, Req(100, 20 * kGiB)), "GPU-d");
  // Host preference still comes first; within the host, pack.
  EXPECT_EQ(PlaceOrDie(p, Req(8, 4 * kGiB, "10.0.0.2")), "GPU-c");
  // Repeated placements fill one GPU before the next.
  Placement q(PlacementOptions{Policy::kPack});
  AddTwoNodes(&q);
  std::string first = PlaceOrDie(q, Req(32, 8 * kGiB));
  for (int i = 0; i < 4; ++i) {
    std::string uuid = PlaceOrDie(q, Req(32, 8 * kGiB));
    EXPECT_EQ(uuid, first) << i;
    q.Reserve(uuid, 32, 8 * kGiB);
  }
  EXPECT_NE(PlaceOrDie(q, Req(32, 8 * kGiB)), first);  // 4 SMs left on it
}

TEST(PlacementTest, SetOptionsSwitchesPolicy) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-a", 100, 0);
  EXPECT_NE(PlaceOrDie(p, Req(8, kGiB)), "GPU-a");
  p.set_options(PlacementOptions{Policy::kPack});
  EXPECT_EQ(p.options().policy, Policy::kPack);
  EXPECT_EQ(PlaceOrDie(p, Req(8, kGiB)), "GPU-a");
}

TEST(PlacementTest, RefusalSaysWhatWasAskedAndBestFree) {
  Placement p;
  p.AddGpu(Gpu("GPU-xx", "n3", "10.0.0.3"));
  p.Reserve("GPU-xx", 100, 101 * kGiB);
  EXPECT_EQ(Refusal(p, Req(64, 80 * kGiB)),
            "no GPU has 64 SMs and 80.0 GiB free (most free: 32 SMs, 40.0 GiB on GPU-xx of "
            "node n3)");
  // When another GPU has more memory free, both are named.
  p.AddGpu(Gpu("GPU-yy", "n4", "10.0.0.4"));
  p.Reserve("GPU-yy", 124, 20 * kGiB);
  EXPECT_EQ(Refusal(p, Req(64, 80 * kGiB)),
            "no GPU has 64 SMs and 80.0 GiB free (most free: 32 SMs, 40.0 GiB on GPU-xx of "
            "node n3; 8 SMs, 121.0 GiB on GPU-yy of node n4)");
  // Both dimensions individually available, never together.
  EXPECT_EQ(Refusal(p, Req(16, 100 * kGiB)).substr(0, 37), "no GPU has 16 SMs and 100.0 GiB free ");
  // Sub-GiB amounts print in MiB.
  p.Reserve("GPU-xx", 32, 0);
  p.Reserve("GPU-yy", 8, 0);
  EXPECT_EQ(Refusal(p, Req(1, 512 << 20)).substr(0, 34), "no GPU has 1 SM and 512.0 MiB free");
  // Bad requests.
  std::string uuid;
  EXPECT_FALSE(p.Place(Req(-1, 0), &uuid).ok());
  EXPECT_FALSE(p.Place(Req(1, 1), nullptr).ok());
}

TEST(PlacementTest, NeverExceedsCapacityByDefault) {
  Placement p;
  AddTwoNodes(&p);
  for (const char* uuid : {"GPU-a", "GPU-b", "GPU-c", "GPU-d"}) p.Reserve(uuid, 128, 10 * kGiB);
  EXPECT_EQ(PlaceOrDie(p, Req(4, 131 * kGiB)).substr(0, 4), "GPU-");
  std::string uuid;
  EXPECT_FALSE(p.Place(Req(5, kGiB), &uuid).ok());
  EXPECT_FALSE(p.Place(Req(4, 132 * kGiB), &uuid).ok());
  EXPECT_FALSE(p.Place(Req(133, 0), &uuid).ok());
}

TEST(PlacementTest, OversubscribeSmIgnoresOnlySms) {
  Placement p(PlacementOptions{Policy::kSpread, /*oversubscribe_sm=*/true, false});
  p.AddGpu(Gpu("GPU-a", "n1", "10.0.0.1"));
  p.Reserve("GPU-a", 132, 100 * kGiB);
  EXPECT_EQ(PlaceOrDie(p, Req(66, 40 * kGiB)), "GPU-a");
  EXPECT_EQ(Refusal(p, Req(66, 42 * kGiB)),
            "no GPU has 42.0 GiB free for 66 SMs (SMs oversubscribed; most free: 0 SMs, 41.0 "
            "GiB on GPU-a of node n1)");
  // A share larger than the whole GPU never fits.
  std::string uuid;
  EXPECT_FALSE(p.Place(Req(133, kGiB), &uuid).ok());
  // Pack too.
  p.set_options(PlacementOptions{Policy::kPack, true, false});
  EXPECT_EQ(PlaceOrDie(p, Req(66, 40 * kGiB)), "GPU-a");
}

TEST(PlacementTest, OversubscribeMemoryIgnoresOnlyMemory) {
  Placement p(PlacementOptions{Policy::kSpread, false, /*oversubscribe_memory=*/true});
  p.AddGpu(Gpu("GPU-a", "n1", "10.0.0.1"));
  p.Reserve("GPU-a", 100, 141 * kGiB);
  EXPECT_EQ(PlaceOrDie(p, Req(32, 100 * kGiB)), "GPU-a");
  EXPECT_EQ(Refusal(p, Req(33, kGiB)),
            "no GPU has 33 SMs free for 1.0 GiB (memory oversubscribed; most free: 32 SMs, 0.0 "
            "GiB on GPU-a of node n1)");
  std::string uuid;
  EXPECT_FALSE(p.Place(Req(1, 142 * kGiB), &uuid).ok());
  p.set_options(PlacementOptions{Policy::kPack, true, true});
  EXPECT_EQ(PlaceOrDie(p, Req(132, 141 * kGiB)), "GPU-a");
}

TEST(PlacementTest, DrainedNodesAreSkipped) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-c", 8, kGiB);
  p.SetNodeSchedulable("n2", false);
  EXPECT_FALSE(p.Find("GPU-c")->schedulable);
  EXPECT_EQ(p.Find("GPU-c")->sm_used, 8);  // usage kept while drained
  // Even the VM's own host is skipped while drained.
  std::string uuid = PlaceOrDie(p, Req(8, kGiB, "10.0.0.2"));
  EXPECT_TRUE(uuid == "GPU-a" || uuid == "GPU-b") << uuid;
  p.SetNodeSchedulable("n1", false);
  EXPECT_EQ(Refusal(p, Req(8, kGiB)),
            "no GPU has 8 SMs and 1.0 GiB free (no schedulable GPU: all 4 are on drained or "
            "down nodes)");
  // Reserve/Release while drained keep the accounting right.
  p.Release("GPU-c", 8, kGiB);
  p.Reserve("GPU-d", 100, 0);
  p.SetNodeSchedulable("n2", true);
  EXPECT_TRUE(p.Find("GPU-c")->schedulable);
  EXPECT_EQ(PlaceOrDie(p, Req(8, kGiB, "10.0.0.2")), "GPU-c");
  EXPECT_EQ(PlaceOrDie(p, Req(64, kGiB)), "GPU-c");
  // A node drained before it registers keeps its GPUs out when they arrive.
  p.SetNodeSchedulable("n5", false);
  p.AddGpu(Gpu("GPU-e", "n5", "10.0.0.5"));
  EXPECT_FALSE(p.Find("GPU-e")->schedulable);
  EXPECT_EQ(PlaceOrDie(p, Req(8, kGiB, "10.0.0.5")), "GPU-c");
}

TEST(PlacementTest, CanResize) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-a", 100, 101 * kGiB);
  EXPECT_TRUE(p.CanResize("GPU-a", 32, 40 * kGiB).ok());
  EXPECT_TRUE(p.CanResize("GPU-a", -64, -100 * kGiB).ok());
  EXPECT_TRUE(p.CanResize("GPU-a", 0, 0).ok());
  EXPECT_TRUE(p.CanResize("GPU-a", -8, 40 * kGiB).ok());
  Status s = p.CanResize("GPU-a", 64, 8 * kGiB);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "cannot grow by 64 SMs and 8.0 GiB on GPU-a of node n1 (free: 32 SMs, 40.0 GiB of "
            "132 SMs, 141.0 GiB)");
  s = p.CanResize("GPU-a", -8, 41 * kGiB);
  EXPECT_EQ(s.message(),
            "cannot grow by 41.0 GiB on GPU-a of node n1 (free: 32 SMs, 40.0 GiB of 132 SMs, "
            "141.0 GiB)");
  s = p.CanResize("GPU-zz", 1, 0);
  EXPECT_EQ(s.message(), "unknown GPU GPU-zz");
  p.set_options(PlacementOptions{Policy::kSpread, true, false});
  EXPECT_TRUE(p.CanResize("GPU-a", 64, 0).ok());
  EXPECT_FALSE(p.CanResize("GPU-a", 64, 41 * kGiB).ok());
  p.set_options(PlacementOptions{Policy::kSpread, false, true});
  EXPECT_TRUE(p.CanResize("GPU-a", 0, 100 * kGiB).ok());
  EXPECT_FALSE(p.CanResize("GPU-a", 33, 0).ok());
  // Drained does not matter for a resize.
  p.SetNodeSchedulable("n1", false);
  EXPECT_TRUE(p.CanResize("GPU-a", 32, 0).ok());
}

TEST(PlacementTest, ReleaseFreesCapacity) {
  Placement p;
  p.AddGpu(Gpu("GPU-a", "n1", "10.0.0.1"));
  p.Reserve("GPU-a", 66, 70 * kGiB);
  p.Reserve("GPU-a", 66, 70 * kGiB);
  EXPECT_EQ(p.Find("GPU-a")->allocations, 2);
  std::string uuid;
  EXPECT_FALSE(p.Place(Req(8, kGiB), &uuid).ok());
  p.Release("GPU-a", 66, 70 * kGiB);
  EXPECT_EQ(p.Find("GPU-a")->allocations, 1);
  EXPECT_EQ(p.Find("GPU-a")->sm_used, 66);
  EXPECT_EQ(p.Find("GPU-a")->memory_used, 70 * kGiB);
  EXPECT_EQ(PlaceOrDie(p, Req(66, 71 * kGiB)), "GPU-a");
  // A resize is Release(old) + Reserve(new): the allocation count stays.
  p.Release("GPU-a", 66, 70 * kGiB);
  p.Reserve("GPU-a", 100, 100 * kGiB);
  EXPECT_EQ(p.Find("GPU-a")->allocations, 1);
  EXPECT_EQ(p.Find("GPU-a")->sm_used, 100);
  // Over-release never goes below zero.
  p.Release("GPU-a", 200, 200 * kGiB);
  p.Release("GPU-a", 1, 1);
  const GpuUsage* u = p.Find("GPU-a");
  EXPECT_EQ(u->sm_used, 0);
  EXPECT_EQ(u->memory_used, 0);
  EXPECT_EQ(u->allocations, 0);
  EXPECT_EQ(PlaceOrDie(p, Req(132, 141 * kGiB)), "GPU-a");
  // Unknown uuids are no-ops.
  p.Release("GPU-zz", 1, 1);
  EXPECT_EQ(p.Find("GPU-zz"), nullptr);
}

TEST(PlacementTest, ReserveBeforeRegistrationIsKept) {
  Placement p;
  p.Reserve("GPU-a", 64, 10 * kGiB);  // a restarted manager loads allocations first
  p.Reserve("GPU-a", 32, 10 * kGiB);
  p.Reserve("GPU-b", 8, kGiB);
  p.Release("GPU-b", 8, kGiB);
  EXPECT_EQ(p.gpu_count(), 0u);
  EXPECT_EQ(p.Find("GPU-a"), nullptr);
  p.AddGpu(Gpu("GPU-a", "n1", "10.0.0.1"));
  p.AddGpu(Gpu("GPU-b", "n1", "10.0.0.1"));
  EXPECT_EQ(p.Find("GPU-a")->sm_used, 96);
  EXPECT_EQ(p.Find("GPU-a")->memory_used, 20 * kGiB);
  EXPECT_EQ(p.Find("GPU-a")->allocations, 2);
  EXPECT_EQ(p.Find("GPU-b")->sm_used, 0);
  EXPECT_EQ(p.Find("GPU-b")->allocations, 0);
  EXPECT_EQ(PlaceOrDie(p, Req(64, kGiB)), "GPU-b");
}

TEST(PlacementTest, AddGpuUpdatesCapacityAndKeepsUsage) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-a", 64, 40 * kGiB);
  p.AddGpu(Gpu("GPU-a", "n1", "10.0.0.1", 80, 80 * kGiB));  // e.g. MIG or a smaller report
  EXPECT_EQ(p.gpu_count(), 4u);
  const GpuUsage* u = p.Find("GPU-a");
  EXPECT_EQ(u->capacity.sm_total, 80);
  EXPECT_EQ(u->sm_used, 64);
  EXPECT_EQ(u->memory_used, 40 * kGiB);
  EXPECT_TRUE(p.CanResize("GPU-a", 16, 0).ok());
  EXPECT_FALSE(p.CanResize("GPU-a", 17, 0).ok());
  // Moving a GPU to another node and host moves its host preference and drain state.
  p.SetNodeSchedulable("n3", false);
  p.AddGpu(Gpu("GPU-b", "n3", "10.0.0.3"));
  EXPECT_FALSE(p.Find("GPU-b")->schedulable);
  p.SetNodeSchedulable("n3", true);
  EXPECT_EQ(PlaceOrDie(p, Req(8, kGiB, "10.0.0.3")), "GPU-b");
  p.RemoveNode("n3");
  EXPECT_EQ(p.Find("GPU-b"), nullptr);
  EXPECT_NE(p.Find("GPU-a"), nullptr);
  EXPECT_EQ(p.gpu_count(), 3u);
}

TEST(PlacementTest, RemoveNodeDropsItsGpus) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-c", 8, kGiB);
  p.RemoveNode("n2");
  p.RemoveNode("n9");  // unknown: no-op
  EXPECT_EQ(p.gpu_count(), 2u);
  EXPECT_EQ(p.Find("GPU-c"), nullptr);
  std::string uuid = PlaceOrDie(p, Req(8, kGiB, "10.0.0.2"));
  EXPECT_TRUE(uuid == "GPU-a" || uuid == "GPU-b");
  // Re-registration starts from zero usage (the manager re-reserves what survives).
  p.AddGpu(Gpu("GPU-c", "n2", "10.0.0.2"));
  EXPECT_EQ(p.Find("GPU-c")->sm_used, 0);
  EXPECT_TRUE(p.Find("GPU-c")->schedulable);
}

TEST(PlacementTest, ListIsOrderedByNodeThenUuid) {
  Placement p;
  p.AddGpu(Gpu("GPU-z", "n2", "h2"));
  p.AddGpu(Gpu("GPU-b", "n1", "h1"));
  p.AddGpu(Gpu("GPU-a", "n1", "h1"));
  p.Reserve("GPU-z", 8, kGiB);
  std::vector<GpuUsage> list = p.List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].capacity.uuid, "GPU-a");
  EXPECT_EQ(list[1].capacity.uuid, "GPU-b");
  EXPECT_EQ(list[2].capacity.uuid, "GPU-z");
  EXPECT_EQ(list[2].sm_used, 8);
  EXPECT_EQ(list[2].allocations, 1);
}

// The index must pick what a brute-force scan over List() would: a fitting GPU of the VM's
// host if there is one, else any fitting GPU, and none that is strictly better by policy.
// --- several GPUs for one tenant (PlaceGroup)

std::vector<std::string> GroupOrDie(const Placement& p, const PlacementRequest& r, int count,
                                    bool* one_node) {
  std::vector<std::string> uuids;
  Status s = p.PlaceGroup(r, count, &uuids, one_node);
  EXPECT_TRUE(s.ok()) << s.message();
  return uuids;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(PlacementTest, GroupPrefersOneNode) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-a", 100, 10 * kGiB);  // n1 has less free: spread picks n2 whole
  bool one_node = false;
  auto uuids = GroupOrDie(p, {"vm", "", 20, 10 * kGiB}, 2, &one_node);
  EXPECT_TRUE(one_node);
  EXPECT_EQ(Sorted(uuids), (std::vector<std::string>{"GPU-c", "GPU-d"}));
  p.set_options({Policy::kPack});  // pack takes the fuller node that still fits
  uuids = GroupOrDie(p, {"vm", "", 20, 10 * kGiB}, 2, &one_node);
  EXPECT_TRUE(one_node);
  EXPECT_EQ(uuids, (std::vector<std::string>{"GPU-a", "GPU-b"}));  // fullest first
}

TEST(PlacementTest, GroupPrefersTheVmsHostWhenItTakesThemAll) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-a", 10, kGiB);  // n1 less free, but it is the VM's host
  bool one_node = false;
  auto uuids = GroupOrDie(p, {"vm", "10.0.0.1", 20, kGiB}, 2, &one_node);
  EXPECT_TRUE(one_node);
  EXPECT_EQ(uuids, (std::vector<std::string>{"GPU-b", "GPU-a"}));  // spread: most free first
}

TEST(PlacementTest, GroupSpreadsAcrossNodesOnlyWhenItMust) {
  Placement p;
  AddTwoNodes(&p);
  p.AddGpu(Gpu("GPU-e", "n3", "10.0.0.3"));
  p.Reserve("GPU-a", 130, kGiB);  // n1 keeps one GPU that fits, n2 two, n3 one
  bool one_node = true;
  auto uuids = GroupOrDie(p, {"vm", "", 64, kGiB}, 3, &one_node);
  EXPECT_FALSE(one_node);
  ASSERT_EQ(uuids.size(), 3u);
  std::vector<std::string> sorted = uuids;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "distinct GPUs";
  // The node with most fitting GPUs comes first and whole: n2's two, then one more
  // that fits (not GPU-a, which has 2 SMs free).
  EXPECT_EQ(Sorted({uuids[0], uuids[1]}), (std::vector<std::string>{"GPU-c", "GPU-d"}));
  EXPECT_TRUE(uuids[2] == "GPU-b" || uuids[2] == "GPU-e") << uuids[2];
}

TEST(PlacementTest, GroupSkipsDrainedNodesAndSaysHowManyFit) {
  Placement p;
  AddTwoNodes(&p);
  p.SetNodeSchedulable("n2", false);
  bool one_node = false;
  auto uuids = GroupOrDie(p, {"vm", "", 10, kGiB}, 2, &one_node);
  EXPECT_TRUE(one_node);
  EXPECT_EQ(Sorted(uuids), (std::vector<std::string>{"GPU-a", "GPU-b"}));
  std::vector<std::string> none;
  Status s = p.PlaceGroup({"vm", "", 10, kGiB}, 3, &none, &one_node);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("only 2 of the 3 GPUs"), std::string::npos) << s.message();
  EXPECT_TRUE(none.empty());
  s = p.PlaceGroup({"vm", "", 10, kGiB}, 0, &none, &one_node);
  EXPECT_FALSE(s.ok());
}

TEST(PlacementTest, GroupOfOneMatchesPlace) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-c", 50, kGiB);
  for (Policy policy : {Policy::kSpread, Policy::kPack}) {
    p.set_options({policy});
    bool one_node = false;
    auto uuids = GroupOrDie(p, {"vm", "", 40, kGiB}, 1, &one_node);
    ASSERT_EQ(uuids.size(), 1u);
    EXPECT_TRUE(one_node);
    EXPECT_EQ(uuids[0], PlaceOrDie(p, {"vm", "", 40, kGiB}));
  }
}

TEST(PlacementTest, MatchesBruteForceUnderRandomOperations) {
  std::mt19937 rng(12345);
  for (int variant = 0; variant < 8; ++variant) {
    PlacementOptions options{variant % 2 ? Policy::kPack : Policy::kSpread, (variant & 2) != 0,
                             (variant & 4) != 0};
    Placement p(options);
    const int kNodes = 12;
    for (int n = 0; n < kNodes; ++n) {
      for (int g = 0; g < 3; ++g) {
        p.AddGpu(Gpu(Name("GPU-", n) + Name("-", g), Name("n", n), Name("10.0.0.", n),
                     g == 2 ? 78 : 132, g == 2 ? 80 * kGiB : 141 * kGiB));
      }
    }
    struct Alloc {
      std::string uuid;
      int sm;
      int64_t memory;
    };
    std::vector<Alloc> allocs;
    const int sms[] = {8, 16, 32, 66, 100};
    for (int step = 0; step < 3000; ++step) {
      const int op = static_cast<int>(rng() % 100);
      if (op < 3) {
        p.SetNodeSchedulable(Name("n", static_cast<int>(rng() % kNodes)), rng() % 3 != 0);
        continue;
      }
      if (op < 40 && !allocs.empty()) {
        size_t i = rng() % allocs.size();
        p.Release(allocs[i].uuid, allocs[i].sm, allocs[i].memory);
        allocs[i] = allocs.back();
        allocs.pop_back();
        continue;
      }
      PlacementRequest r =
          Req(sms[rng() % 5], static_cast<int64_t>(1 + rng() % 60) * kGiB,
              rng() % 4 ? Name("10.0.0.", static_cast<int>(rng() % (kNodes + 2))) : "");
      auto fits = [&](const GpuUsage& u) {
        if (!u.schedulable || r.sm > u.capacity.sm_total) return false;
        if (r.memory_bytes > u.capacity.memory_total) return false;
        if (!options.oversubscribe_sm && u.capacity.sm_total - u.sm_used < r.sm) return false;
        return options.oversubscribe_memory ||
               u.capacity.memory_total - u.memory_used >= r.memory_bytes;
      };
      auto key = [](const GpuUsage& u) {
        return std::make_tuple(int64_t{u.capacity.sm_total} - u.sm_used,
                               u.capacity.memory_total - u.memory_used);
      };
      std::vector<GpuUsage> list = p.List();
      bool host_fits = false, any_fits = false;
      for (const GpuUsage& u : list) {
        if (!fits(u)) continue;
        any_fits = true;
        host_fits = host_fits || (!r.host_ip.empty() && u.capacity.host_ip == r.host_ip);
      }
      std::string uuid;
      Status s = p.Place(r, &uuid);
      ASSERT_EQ(s.ok(), any_fits) << "variant " << variant << " step " << step << ": "
                                  << s.message();
      if (!s.ok()) continue;
      const GpuUsage* chosen = p.Find(uuid);
      ASSERT_NE(chosen, nullptr);
      ASSERT_TRUE(fits(*chosen));
      if (host_fits) {
        ASSERT_EQ(chosen->capacity.host_ip, r.host_ip);
      }
      for (const GpuUsage& u : list) {
        if (!fits(u) || (host_fits && u.capacity.host_ip != r.host_ip)) continue;
        if (options.policy == Policy::kSpread) {
          ASSERT_FALSE(key(u) > key(*chosen)) << "variant " << variant << " step " << step << ": "
                                              << u.capacity.uuid << " is freer than " << uuid;
        } else {
          ASSERT_FALSE(key(u) < key(*chosen)) << "variant " << variant << " step " << step << ": "
                                              << u.capacity.uuid << " is fuller than " << uuid;
        }
      }
      p.Reserve(uuid, r.sm, r.memory_bytes);
      allocs.push_back({uuid, r.sm, r.memory_bytes});
    }
    // Usage equals the sum of the live allocations.
    for (const GpuUsage& u : p.List()) {
      int sm = 0, n = 0;
      int64_t memory = 0;
      for (const Alloc& a : allocs) {
        if (a.uuid != u.capacity.uuid) continue;
        sm += a.sm;
        memory += a.memory;
        ++n;
      }
      EXPECT_EQ(u.sm_used, sm);
      EXPECT_EQ(u.memory_used, memory);
      EXPECT_EQ(u.allocations, n);
    }
  }
}

// --- a tenant that moves (PlaceGroup with a PlacementFilter)

TEST(PlacementTest, AFilterNarrowsThePick) {
  Placement p;
  AddTwoNodes(&p);
  p.Reserve("GPU-c", 100, kGiB);  // n2's GPU-d is the most free of n2
  std::vector<std::string> uuids;
  bool one_node = false;
  PlacementFilter only_n2;
  only_n2.nodes = {"n2"};
  // The VM's host (n1) would win without the filter.
  ASSERT_TRUE(p.PlaceGroup(Req(16, kGiB, "10.0.0.1"), 1, &uuids, &one_node, &only_n2).ok());
  EXPECT_EQ(uuids, std::vector<std::string>{"GPU-d"});
  // Its own GPU is never picked; one GPU by name; other nodes avoided.
  only_n2.avoid_gpus = {"GPU-d"};
  ASSERT_TRUE(p.PlaceGroup(Req(16, kGiB), 1, &uuids, &one_node, &only_n2).ok());
  EXPECT_EQ(uuids, std::vector<std::string>{"GPU-c"});
  PlacementFilter gpu_b;
  gpu_b.gpu = "GPU-b";
  ASSERT_TRUE(p.PlaceGroup(Req(16, kGiB), 1, &uuids, &one_node, &gpu_b).ok());
  EXPECT_EQ(uuids, std::vector<std::string>{"GPU-b"});
  PlacementFilter not_n1;
  not_n1.avoid_nodes = {"n1"};
  ASSERT_TRUE(p.PlaceGroup(Req(16, kGiB), 2, &uuids, &one_node, &not_n1).ok());
  EXPECT_EQ(std::set<std::string>(uuids.begin(), uuids.end()),
            (std::set<std::string>{"GPU-c", "GPU-d"}));
  EXPECT_TRUE(one_node);
  // Too little room where it may go: the refusal counts what the filter let through.
  Status s = p.PlaceGroup(Req(64, kGiB), 2, &uuids, &one_node, &not_n1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("only 1 of the 2 GPU(s) that may take it"), std::string::npos)
      << s.message();
  // A drained node is not a target either.
  p.SetNodeSchedulable("n2", false);
  EXPECT_FALSE(p.PlaceGroup(Req(16, kGiB), 1, &uuids, &one_node, &only_n2).ok());
}

}  // namespace
}  // namespace flyt::cluster
