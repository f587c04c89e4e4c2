// GPU inventory: simulated GPUs, inventory files, and the NVML path's errors.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>

#include <gtest/gtest.h>

#include "node/gpu_inventory.h"

namespace flyt::node {
namespace {

const std::regex kUuidFormat("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");

TEST(NodeInventory, SimulatedGpusLookLikeH200s) {
  auto gpus = SimulatedGpus(3, "node-a");
  ASSERT_EQ(gpus.size(), 3u);
  std::set<std::string> uuids;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(gpus[i].index, i);
    EXPECT_EQ(gpus[i].name, "Simulated H200");
    EXPECT_EQ(gpus[i].sm_count, 132);
    EXPECT_EQ(gpus[i].memory_bytes, 141LL << 30);
    EXPECT_TRUE(std::regex_match(gpus[i].uuid, kUuidFormat)) << gpus[i].uuid;
    uuids.insert(gpus[i].uuid);
  }
  EXPECT_EQ(uuids.size(), 3u);
}

TEST(NodeInventory, SimulatedUuidsAreStablePerNodeAndDifferBetweenNodes) {
  EXPECT_EQ(SimulatedUuid("node-a", 0), SimulatedUuid("node-a", 0));
  EXPECT_NE(SimulatedUuid("node-a", 0), SimulatedUuid("node-b", 0));
  EXPECT_NE(SimulatedUuid("node-a", 0), SimulatedUuid("node-a", 1));
}

TEST(NodeInventory, SimSpecCountsGpus) {
  std::vector<GpuInfo> gpus;
  ASSERT_TRUE(LoadInventory("sim:2", "n", &gpus).ok());
  EXPECT_EQ(gpus.size(), 2u);
  EXPECT_TRUE(IsSimulatedInventory("sim:2"));
  EXPECT_FALSE(IsSimulatedInventory("nvml"));
  Status st = LoadInventory("sim:0", "n", &gpus);
  EXPECT_FALSE(st.ok());
}

TEST(NodeInventory, ParsesAnInventoryFile) {
  std::vector<GpuInfo> gpus;
  Status st = ParseSimInventory(
      R"({"gpus":[{"name":"Small","sm_count":66,"memory_gb":80,"uuid":"GPU-x"},{}]})", "n", "f",
      &gpus);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].name, "Small");
  EXPECT_EQ(gpus[0].sm_count, 66);
  EXPECT_EQ(gpus[0].memory_bytes, 80LL << 30);
  EXPECT_EQ(gpus[0].uuid, "GPU-x");
  EXPECT_EQ(gpus[1].name, "Simulated H200");  // defaults fill what is absent
  EXPECT_EQ(gpus[1].uuid, SimulatedUuid("n", 1));

  ASSERT_TRUE(
      ParseSimInventory(R"([{"memory_bytes":1024,"cuda_version":12040}])", "n", "f", &gpus).ok());
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].memory_bytes, 1024);
  EXPECT_EQ(gpus[0].cuda_version, "12.4");
}

TEST(NodeInventory, InventoryFileErrorsNameTheProblem) {
  std::vector<GpuInfo> gpus;
  Status st = ParseSimInventory("{", "n", "inv.json", &gpus);
  EXPECT_NE(st.message().find("inv.json is not valid JSON"), std::string::npos) << st.message();
  st = ParseSimInventory(R"({"gpus":[{"sms":3}]})", "n", "inv.json", &gpus);
  EXPECT_NE(st.message().find("unknown field \"sms\""), std::string::npos) << st.message();
  st = ParseSimInventory(R"({"gpus":[{"sm_count":-1}]})", "n", "inv.json", &gpus);
  EXPECT_NE(st.message().find("bad value for \"sm_count\""), std::string::npos) << st.message();
  st = ParseSimInventory(R"({"gpus":[{"uuid":"GPU-a"},{"uuid":"GPU-a"}]})", "n", "inv.json", &gpus);
  EXPECT_NE(st.message().find("same uuid"), std::string::npos) << st.message();
  st = ParseSimInventory(R"({"devices":[]})", "n", "inv.json", &gpus);
  EXPECT_NE(st.message().find("no \"gpus\" list"), std::string::npos) << st.message();
}

TEST(NodeInventory, LoadsAnInventoryFileFromDisk) {
  char path[] = "/tmp/node_inventory_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << R"({"gpus":[{"name":"File GPU"}]})";
  std::vector<GpuInfo> gpus;
  Status st = LoadInventory(std::string("sim:") + path, "n", &gpus);
  std::remove(path);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].name, "File GPU");
  st = LoadInventory("sim:/nonexistent/inv.json", "n", &gpus);
  EXPECT_NE(st.message().find("/nonexistent/inv.json"), std::string::npos) << st.message();
}

TEST(NodeInventory, UnknownSpecIsAnError) {
  std::vector<GpuInfo> gpus;
  Status st = LoadInventory("nvlm", "n", &gpus);
  EXPECT_NE(st.message().find("unknown inventory 'nvlm'"), std::string::npos) << st.message();
}

TEST(NodeInventory, NvmlWithoutADriverSaysWhatToDo) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  std::vector<GpuInfo> gpus;
  Status st = LoadInventory("nvml", "n", &gpus);
  if (lib != nullptr) {  // a GPU host: the real inventory must load
    ASSERT_TRUE(st.ok()) << st.message();
    for (const auto& g : gpus) {
      EXPECT_TRUE(std::regex_match(g.uuid, kUuidFormat)) << g.uuid;
      EXPECT_GT(g.sm_count, 0);
      EXPECT_GT(g.memory_bytes, 0);
      EXPECT_FALSE(g.cuda_version.empty());
    }
    return;
  }
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot load NVML"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("sim:N"), std::string::npos) << st.message();
}

TEST(NodeInventory, JsonHasTheContractFields) {
  auto j = ToJson(SimulatedGpus(1, "n")[0]);
  for (const char* key :
       {"uuid", "index", "name", "sm_count", "memory_bytes", "driver_version", "cuda_version"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["sm_count"], 132);
  EXPECT_EQ(j["cuda_version"], "13.0");  // a string, as the cluster manager stores it
  EXPECT_EQ(CudaVersionText(12080), "12.8");
}

}  // namespace
}  // namespace flyt::node
