// Tests for the sim backend's CUDA graphs (server/sim_backend.cc): graphs built
// node by node run their copies, memsets and conditional nodes at each launch,
// the modelled kernels set conditional values, allocation and free nodes keep the
// driver's rules, and clones, exec updates and exec SetParams act on the right
// nodes.
//
// Owns: nothing but these tests.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "server/driver_api.h"

namespace flyt::server {
namespace {

constexpr char kPtx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry flyt_sim_set_conditional(.param .u64 h, .param .u32 v) { ret; }\n"
    ".visible .entry flyt_sim_countdown(.param .u64 h, .param .u64 c) { ret; }\n";

class SimGraphs : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(LoadSimDriver(SimOptions{}, &a_).ok());
    ASSERT_EQ(a_.cuInit(0), CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    ASSERT_EQ(a_.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(a_.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    ASSERT_EQ(a_.cuLibraryLoadData(&lib_, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0),
              CUDA_SUCCESS);
    unsigned n = 0;
    ASSERT_EQ(a_.cuLibraryGetKernelCount(&n, lib_), CUDA_SUCCESS);
    std::vector<CUkernel> ks(n);
    ASSERT_EQ(a_.cuLibraryEnumerateKernels(ks.data(), n, lib_), CUDA_SUCCESS);
    for (CUkernel k : ks) {
      const char* name = nullptr;
      ASSERT_EQ(a_.cuKernelGetName(&name, k), CUDA_SUCCESS);
      (std::strcmp(name, "flyt_sim_countdown") == 0 ? countdown_ : set_) =
          reinterpret_cast<CUfunction>(k);
    }
    ASSERT_NE(set_, nullptr);
    ASSERT_NE(countdown_, nullptr);
    ASSERT_EQ(a_.cuGraphCreate(&g_, 0), CUDA_SUCCESS);
  }
  void TearDown() override {
    EXPECT_EQ(a_.cuGraphDestroy(g_), CUDA_SUCCESS);
    EXPECT_EQ(a_.cuLibraryUnload(lib_), CUDA_SUCCESS);
  }

  CUgraphNode AddKernel(CUgraph g, CUfunction f, void** args, const CUgraphNode* deps, size_t n) {
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = f;
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = args;
    CUgraphNode node = nullptr;
    EXPECT_EQ(a_.cuGraphAddKernelNode_v2(&node, g, deps, n, &p), CUDA_SUCCESS);
    return node;
  }
  CUgraphNode AddMemset32(CUgraph g, CUdeviceptr dst, unsigned value, const CUgraphNode* deps,
                          size_t n) {
    CUDA_MEMSET_NODE_PARAMS p{};
    p.dst = dst;
    p.value = value;
    p.elementSize = 4;
    p.width = 1;
    p.height = 1;
    CUgraphNode node = nullptr;
    EXPECT_EQ(a_.cuGraphAddMemsetNode(&node, g, deps, n, &p, nullptr), CUDA_SUCCESS);
    return node;
  }
  CUgraphNode AddConditional(CUgraph g, CUgraphConditionalHandle h, CUgraphConditionalNodeType type,
                             unsigned size, const CUgraphNode* deps, size_t n, CUgraph** bodies) {
    CUgraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    CUgraphNode node = nullptr;
    EXPECT_EQ(a_.cuGraphAddNode_v2(&node, g, deps, nullptr, n, &p), CUDA_SUCCESS);
    *bodies = p.conditional.phGraph_out;
    return node;
  }
  unsigned Launch(CUgraph g, CUdeviceptr flag) {
    CUgraphExec exec = nullptr;
    EXPECT_EQ(a_.cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
    EXPECT_EQ(a_.cuGraphLaunch(exec, nullptr), CUDA_SUCCESS);
    unsigned v = 0;
    EXPECT_EQ(a_.cuMemcpyDtoH_v2(&v, flag, 4), CUDA_SUCCESS);
    EXPECT_EQ(a_.cuGraphExecDestroy(exec), CUDA_SUCCESS);
    return v;
  }

  DriverApi a_;
  CUlibrary lib_ = nullptr;
  CUfunction set_ = nullptr, countdown_ = nullptr;
  CUgraph g_ = nullptr;
};

TEST_F(SimGraphs, SwitchRunsTheBodyTheKernelChose) {
  CUdeviceptr flag = 0;
  ASSERT_EQ(a_.cuMemAlloc_v2(&flag, 4), CUDA_SUCCESS);
  CUgraphConditionalHandle h = 0;
  ASSERT_EQ(a_.cuGraphConditionalHandleCreate(&h, g_, nullptr, 0, 0), CUDA_SUCCESS);
  unsigned value = 2;
  void* args[] = {&h, &value};
  CUgraphNode zero = AddMemset32(g_, flag, 0, nullptr, 0);
  CUgraphNode k = AddKernel(g_, set_, args, &zero, 1);
  CUgraph* bodies = nullptr;
  AddConditional(g_, h, CU_GRAPH_COND_TYPE_SWITCH, 3, &k, 1, &bodies);
  ASSERT_NE(bodies, nullptr);
  for (unsigned i = 0; i < 3; ++i) AddMemset32(bodies[i], flag, 10 + i, nullptr, 0);
  EXPECT_EQ(Launch(g_, flag), 12u);
  value = 7;  // no such body: nothing runs
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = set_;
  p.gridDimX = p.gridDimY = p.gridDimZ = p.blockDimX = p.blockDimY = p.blockDimZ = 1;
  p.kernelParams = args;
  ASSERT_EQ(a_.cuGraphKernelNodeSetParams_v2(k, &p), CUDA_SUCCESS);
  EXPECT_EQ(Launch(g_, flag), 0u);
  EXPECT_EQ(a_.cuMemFree_v2(flag), CUDA_SUCCESS);
}

TEST_F(SimGraphs, WhileLoopsUntilTheCountdownKernelClearsTheCondition) {
  CUdeviceptr counter = 0;
  ASSERT_EQ(a_.cuMemAlloc_v2(&counter, 8), CUDA_SUCCESS);
  int init[2] = {4, 0};
  ASSERT_EQ(a_.cuMemcpyHtoD_v2(counter, init, 8), CUDA_SUCCESS);
  CUgraphConditionalHandle h = 0;
  ASSERT_EQ(a_.cuGraphConditionalHandleCreate(&h, g_, nullptr, 1, CU_GRAPH_COND_ASSIGN_DEFAULT),
            CUDA_SUCCESS);
  CUgraph* bodies = nullptr;
  AddConditional(g_, h, CU_GRAPH_COND_TYPE_WHILE, 1, nullptr, 0, &bodies);
  void* args[] = {&h, &counter};
  AddKernel(bodies[0], countdown_, args, nullptr, 0);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(a_.cuGraphInstantiateWithFlags(&exec, g_, 0), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuGraphLaunch(exec, nullptr), CUDA_SUCCESS);
  int out[2] = {-1, -1};
  ASSERT_EQ(a_.cuMemcpyDtoH_v2(out, counter, 8), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 4);  // iterations
  // The default value applies again at the next launch: one more iteration.
  ASSERT_EQ(a_.cuGraphLaunch(exec, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuMemcpyDtoH_v2(out, counter, 8), CUDA_SUCCESS);
  EXPECT_EQ(out[1], 5);
  EXPECT_EQ(a_.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(a_.cuMemFree_v2(counter), CUDA_SUCCESS);
}

TEST_F(SimGraphs, FreeNodesTakeOnlyGraphMemoryOnce) {
  CUDA_MEM_ALLOC_NODE_PARAMS p{};
  p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.bytesize = 1 << 20;
  CUgraphNode alloc = nullptr, f = nullptr, f2 = nullptr, bad = nullptr;
  ASSERT_EQ(a_.cuGraphAddMemAllocNode(&alloc, g_, nullptr, 0, &p), CUDA_SUCCESS);
  ASSERT_NE(p.dptr, 0u);
  cuuint64_t used = 0;
  ASSERT_EQ(a_.cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used),
            CUDA_SUCCESS);
  EXPECT_EQ(used, 1u << 20);
  CUdeviceptr plain = 0;
  ASSERT_EQ(a_.cuMemAlloc_v2(&plain, 4096), CUDA_SUCCESS);
  EXPECT_EQ(a_.cuGraphAddMemFreeNode(&bad, g_, &alloc, 1, plain), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(a_.cuGraphAddMemFreeNode(&f, g_, &alloc, 1, p.dptr), CUDA_SUCCESS);
  EXPECT_EQ(a_.cuGraphAddMemFreeNode(&f2, g_, &f, 1, p.dptr), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr freed = 0;
  ASSERT_EQ(a_.cuGraphMemFreeNodeGetParams(f, &freed), CUDA_SUCCESS);
  EXPECT_EQ(freed, p.dptr);
  EXPECT_EQ(a_.cuMemFree_v2(plain), CUDA_SUCCESS);
  // The graph's memory goes with the graph.
  ASSERT_EQ(a_.cuGraphDestroy(g_), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used),
            CUDA_SUCCESS);
  EXPECT_EQ(used, 0u);
  ASSERT_EQ(a_.cuGraphCreate(&g_, 0), CUDA_SUCCESS);
}

TEST_F(SimGraphs, CloneUpdateAndExecSetParamsActOnTheirOwnNodes) {
  CUdeviceptr flag = 0;
  ASSERT_EQ(a_.cuMemAlloc_v2(&flag, 4), CUDA_SUCCESS);
  CUgraphNode set = AddMemset32(g_, flag, 1, nullptr, 0);
  CUgraph clone = nullptr;
  ASSERT_EQ(a_.cuGraphClone(&clone, g_), CUDA_SUCCESS);
  CUgraphNode cloned = nullptr;
  ASSERT_EQ(a_.cuGraphNodeFindInClone(&cloned, set, clone), CUDA_SUCCESS);
  CUgraphNodeType type{};
  ASSERT_EQ(a_.cuGraphNodeGetType(cloned, &type), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_GRAPH_NODE_TYPE_MEMSET);
  CUDA_MEMSET_NODE_PARAMS p{};
  ASSERT_EQ(a_.cuGraphMemsetNodeGetParams(cloned, &p), CUDA_SUCCESS);
  p.value = 2;
  ASSERT_EQ(a_.cuGraphMemsetNodeSetParams(cloned, &p), CUDA_SUCCESS);
  EXPECT_EQ(Launch(g_, flag), 1u);  // the original is unchanged
  EXPECT_EQ(Launch(clone, flag), 2u);

  CUgraphExec exec = nullptr;
  ASSERT_EQ(a_.cuGraphInstantiateWithFlags(&exec, g_, 0), CUDA_SUCCESS);
  CUgraphExecUpdateResultInfo info{};
  ASSERT_EQ(a_.cuGraphExecUpdate_v2(exec, clone, &info), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuGraphLaunch(exec, nullptr), CUDA_SUCCESS);
  unsigned v = 0;
  ASSERT_EQ(a_.cuMemcpyDtoH_v2(&v, flag, 4), CUDA_SUCCESS);
  EXPECT_EQ(v, 2u);
  p.value = 3;
  ASSERT_EQ(a_.cuGraphExecMemsetNodeSetParams(exec, set, &p, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuGraphLaunch(exec, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuMemcpyDtoH_v2(&v, flag, 4), CUDA_SUCCESS);
  EXPECT_EQ(v, 3u);
  // Another shape cannot update the exec.
  AddMemset32(clone, flag, 4, nullptr, 0);
  EXPECT_EQ(a_.cuGraphExecUpdate_v2(exec, clone, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
  EXPECT_EQ(a_.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(a_.cuGraphDestroy(clone), CUDA_SUCCESS);
  EXPECT_EQ(a_.cuMemFree_v2(flag), CUDA_SUCCESS);
}

TEST_F(SimGraphs, BogusHandlesAreRefused) {
  CUgraphNode node = nullptr;
  int junk = 0;
  EXPECT_EQ(a_.cuGraphAddEmptyNode(&node, reinterpret_cast<CUgraph>(&junk), nullptr, 0),
            CUDA_ERROR_INVALID_VALUE);
  CUgraphNode dep = reinterpret_cast<CUgraphNode>(&junk);
  EXPECT_EQ(a_.cuGraphAddEmptyNode(&node, g_, &dep, 1), CUDA_ERROR_INVALID_VALUE);
  CUgraphNodeParams p{};
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = reinterpret_cast<uintptr_t>(&junk);
  p.conditional.type = CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = 1;
  EXPECT_EQ(a_.cuGraphAddNode_v2(&node, g_, nullptr, nullptr, 0, &p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(a_.cuGraphLaunch(reinterpret_cast<CUgraphExec>(&junk), nullptr),
            CUDA_ERROR_INVALID_VALUE);
}

// A capture's dependency set: what the next captured node depends on follows
// cuStreamUpdateCaptureDependencies (set, add), and a capture into a given graph
// starts after the nodes it is given and ends with that graph.
TEST_F(SimGraphs, CaptureFollowsItsDependencySet) {
  CUstream s = nullptr;
  ASSERT_EQ(a_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUgraphNode root = nullptr, other = nullptr;
  ASSERT_EQ(a_.cuGraphAddEmptyNode(&root, g_, nullptr, 0), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuGraphAddEmptyNode(&other, g_, nullptr, 0), CUDA_SUCCESS);
  ASSERT_EQ(
      a_.cuStreamBeginCaptureToGraph(s, g_, &root, nullptr, 1, CU_STREAM_CAPTURE_MODE_RELAXED),
      CUDA_SUCCESS);
  CUstreamCaptureStatus st{};
  CUgraph g = nullptr;
  const CUgraphNode* deps = nullptr;
  size_t n = 0;
  ASSERT_EQ(a_.cuStreamGetCaptureInfo_v3(s, &st, nullptr, &g, &deps, nullptr, &n), CUDA_SUCCESS);
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(g, g_);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(deps[0], root);
  // Add `other`, then capture a memset: it depends on both.
  ASSERT_EQ(a_.cuStreamUpdateCaptureDependencies_v2(s, &other, nullptr, 1,
                                                    CU_STREAM_ADD_CAPTURE_DEPENDENCIES),
            CUDA_SUCCESS);
  ASSERT_EQ(a_.cuStreamUpdateCaptureDependencies_v2(s, &other, nullptr, 1,
                                                    CU_STREAM_ADD_CAPTURE_DEPENDENCIES),
            CUDA_SUCCESS);  // once in the set, however often added
  ASSERT_EQ(a_.cuStreamGetCaptureInfo_v3(s, &st, nullptr, nullptr, &deps, nullptr, &n),
            CUDA_SUCCESS);
  EXPECT_EQ(n, 2u);
  CUdeviceptr d = 0;
  ASSERT_EQ(a_.cuMemAlloc_v2(&d, 64), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuMemsetD8Async(d, 1, 64, s), CUDA_SUCCESS);
  ASSERT_EQ(a_.cuStreamGetCaptureInfo_v3(s, &st, nullptr, nullptr, &deps, nullptr, &n),
            CUDA_SUCCESS);
  ASSERT_EQ(n, 1u);
  CUgraphNode memset = deps[0];
  size_t count = 0;
  ASSERT_EQ(a_.cuGraphNodeGetDependencies_v2(memset, nullptr, nullptr, &count), CUDA_SUCCESS);
  EXPECT_EQ(count, 2u);
  // Set: back to `root` alone.
  ASSERT_EQ(a_.cuStreamUpdateCaptureDependencies_v2(s, &root, nullptr, 1,
                                                    CU_STREAM_SET_CAPTURE_DEPENDENCIES),
            CUDA_SUCCESS);
  ASSERT_EQ(a_.cuStreamGetCaptureInfo_v3(s, &st, nullptr, nullptr, &deps, nullptr, &n),
            CUDA_SUCCESS);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(deps[0], root);
  EXPECT_EQ(a_.cuStreamUpdateCaptureDependencies_v2(s, &root, nullptr, 1, 7),
            CUDA_ERROR_INVALID_VALUE);
  CUgraph ended = nullptr;
  ASSERT_EQ(a_.cuStreamEndCapture(s, &ended), CUDA_SUCCESS);
  EXPECT_EQ(ended, g_);
  EXPECT_EQ(a_.cuStreamUpdateCaptureDependencies_v2(s, &root, nullptr, 1,
                                                    CU_STREAM_SET_CAPTURE_DEPENDENCIES),
            CUDA_ERROR_ILLEGAL_STATE);  // no capture any more
  EXPECT_EQ(a_.cuMemFree_v2(d), CUDA_SUCCESS);
  EXPECT_EQ(a_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

}  // namespace
}  // namespace flyt::server
