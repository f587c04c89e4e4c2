// Tests of src/cluster/gpu_group: the endpoint list a multi-GPU VM's client is given and the
// placement sentence the events carry.
#include "cluster/gpu_group.h"

#include <gtest/gtest.h>

namespace flyt::cluster {
namespace {

TEST(GpuGroup, OneEndpointIsUnchanged) {
  EXPECT_EQ(JoinEndpoints({"tcp://127.0.0.1:4000"}), "tcp://127.0.0.1:4000");
  EXPECT_EQ(JoinEndpoints({}), "");
}

TEST(GpuGroup, EndpointsJoinInOrdinalOrder) {
  EXPECT_EQ(JoinEndpoints({"tcp://10.0.0.2:5", "tcp://10.0.0.1:7", "tcp://10.0.0.1:6"}),
            "tcp://10.0.0.2:5,tcp://10.0.0.1:7,tcp://10.0.0.1:6");
}

TEST(GpuGroup, DistinctNodesKeepFirstAppearance) {
  EXPECT_EQ(DistinctNodes({"n2", "n1", "n2", "n3", "n1"}),
            (std::vector<std::string>{"n2", "n1", "n3"}));
}

TEST(GpuGroup, DescribeOneNodeOrSeveral) {
  EXPECT_EQ(DescribeGpuNodes({"n1"}), "1 GPU on node n1");
  EXPECT_EQ(DescribeGpuNodes({"n1", "n1"}), "2 GPUs on node n1");
  EXPECT_EQ(DescribeGpuNodes({"n1", "n2"}), "2 GPUs across nodes n1, n2");
  EXPECT_EQ(DescribeGpuNodes({"b", "b", "a", "c"}), "4 GPUs across nodes b, a, c");
}

}  // namespace
}  // namespace flyt::cluster
