// migrate_state: GPU state a move must carry beyond cuMemAlloc memory, kept busy while
// flyt-server migrates, checkpoints and restores the process under it:
//
//   vmm      the app's own virtual memory as PyTorch's expandable segments use it: a
//            reservation that grows by one mapped chunk per step (cuMemCreate, cuMemMap,
//            cuMemSetAccess), a chunk made read-only, an allocation of two chunks mapped
//            whole in a second reservation and whole again at the end of the first (the
//            driver maps only from offset 0), then released while mapped, a counter in VMM memory
//            that a kernel counts down; every step reads all of it back, and asks the driver
//            whether the handles it holds are still what they were (retain, properties, access).
//   graphs   a captured graph (a copy from pinned host memory, a kernel, a memset, a
//            device copy, a copy back to host memory, a host function, an event record)
//            and a graph built by hand (memset, a host copy, two kernels, a child graph,
//            an empty node, event record and wait nodes, copies back, a host node), both
//            launched every step; the executable graph is changed in place as the steps
//            go (a memset value, a node disabled and enabled again, a kernel's arguments,
//            cudaGraphExecUpdate), its graph is queried through the node handles the app
//            holds, and a second executable graph is made from it late in the run.
//   async    stream-ordered allocations (cudaMallocAsync / cudaFreeAsync on a stream of
//            its own), a few kept alive across steps, the oldest freed each step.
//   pools    memory pools by handle: the device's default pool and a pool of its own
//            (cudaMemPoolCreate), each with attributes set (release threshold, a reuse
//            flag); every step allocates from both (cudaMallocAsync while the default
//            pool is current, cudaMallocFromPoolAsync, then cudaMallocAsync again once
//            its own pool is made the device's current pool), copies, counts down a
//            counter in pool memory with a kernel, frees the oldest in stream order,
//            trims once, and checks that the pool handles, the attributes, the pool a
//            pointer belongs to and the used/reserved figures still hold.
//   textures texture objects over linear and pitch-2D memory (four made, the second
//            destroyed: the values have a hole); every step changes the memory under
//            them, checks that the driver still knows each value the app holds as the
//            object it made (resource and texture descriptors read back: device pointer,
//            size, pitch, address mode), makes and destroys one more, reads the memory
//            back and, on a GPU (not the sim), reads each through its texture in a
//            kernel (tex1Dfetch, tex2D) and compares.
//
//   migrate_state STEPS PAUSE_MS [vmm] [graphs] [async] [pools] [textures]
//       (none named: all five)
//       prints "step N ..." per step (checksums and counters, no addresses), then PASS.
//   migrate_state refuse DIR PHASE...
//       per phase, sets up state that refuses a move, prints "phase P ready" and waits
//       (calling CUDA) until the file DIR/P exists, then frees it; then "phase end ready",
//       waits for DIR/end and passes. Phases: graph-alloc (a graph with a memory
//       allocation node), graph-cond (a conditional node), vmm-fixed (a reservation at a
//       fixed address outside the movable range), vmm (any reservation: on a server
//       without --movable-memory), async (a cudaMallocAsync allocation: likewise),
//       pool-ipc (an allocation from a pool made for export to other processes),
//       surface (a surface object over a CUDA array), texture-array (a texture object
//       over a CUDA array; textures over linear and pitch-2D memory move).
//
// What kernels compute is only checked through flyt_sim_countdown, which the sim models,
// and on a GPU through the texture fetches.
#include <cuda.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <tuple>
#include <vector>

#include "e2e_driver.h"
#include "e2e_vmm.h"

// On a GPU: counter[0] -= 1, counter[1] += 1 (server/sim_backend.cc does the same).
__global__ void flyt_sim_countdown(unsigned long long /*unused handle*/, int* counter) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    counter[0] -= 1;
    counter[1] += 1;
  }
}

namespace {

uint64_t Sum(const void* p, size_t n, uint64_t s = 1469598103934665603ull) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) s = (s ^ b[i]) * 1099511628211ull;
  return s;
}

// --- the app's own virtual memory

e2e::VmmDriver& g_cu = e2e::g_vmm;
using e2e::DeviceProp;
using e2e::ResolveVmm;
using e2e::SetAccess;

unsigned long long GetAccess(CUdeviceptr p) {
  CUmemLocation loc;
  memset(&loc, 0, sizeof(loc));
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = 0;
  unsigned long long flags = 0;
  CU(g_cu.get_access(&flags, &loc, p));
  return flags;
}

void* Ptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

constexpr int kChunks = 6;     // grown one per step
constexpr int kReadOnly = 3;   // this chunk becomes read-only once written
constexpr int kAliasSlot = 6;  // seg + 6 and 7 granules: `big` again

struct Vmm {
  size_t gran = 0;
  CUdeviceptr seg = 0, alias = 0;
  size_t seg_size = 0;
  std::vector<CUmemGenericAllocationHandle> chunks;
  std::vector<std::vector<unsigned char>> host;  // what each chunk holds
  CUmemGenericAllocationHandle big = 0;          // two granules, released while mapped
  std::vector<unsigned char> big_host;
  int counter[2] = {1000, 0};

  void Setup() {
    e2e::Step("vmm setup");
    ResolveVmm();
    const CUmemAllocationProp prop = DeviceProp();
    CU(g_cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    seg_size = 8 * gran;
    CU(g_cu.reserve(&seg, seg_size, 0, 0, 0));
    CU(g_cu.reserve(&alias, 2 * gran, 0, 0, 0));
    CU(g_cu.create(&big, 2 * gran, &prop, 0));
    CU(g_cu.map(alias, 2 * gran, 0, big, 0));
    SetAccess(alias, 2 * gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU(g_cu.map(seg + kAliasSlot * gran, 2 * gran, 0, big, 0));  // big again
    SetAccess(seg + kAliasSlot * gran, 2 * gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU(g_cu.release(big));  // still mapped twice: the memory stays
    big_host.resize(2 * gran);
    e2e::Fill(big_host.data(), big_host.size(), 77);
    CK(cudaMemcpy(Ptr(alias), big_host.data(), big_host.size(), cudaMemcpyHostToDevice));
  }

  void Step(int i, cudaStream_t s, std::string* line) {
    e2e::Step("vmm step");
    const CUmemAllocationProp prop = DeviceProp();
    if (i < kChunks) {  // the segment grows
      CUmemGenericAllocationHandle h = 0;
      CU(g_cu.create(&h, gran, &prop, 0));
      CUdeviceptr at = seg + i * gran;
      CU(g_cu.map(at, gran, 0, h, 0));
      SetAccess(at, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
      chunks.push_back(h);
      host.emplace_back(gran);
      e2e::Fill(host.back().data(), gran, 100 + i);
      if (i == 0) memcpy(host[0].data(), counter, sizeof(counter));
      CK(cudaMemcpy(Ptr(at), host.back().data(), gran, cudaMemcpyHostToDevice));
      if (i == kReadOnly) SetAccess(at, gran, CU_MEM_ACCESS_FLAGS_PROT_READ);
    }
    // A kernel counts down in VMM memory (chunk 0 holds the counter).
    flyt_sim_countdown<<<1, 32, 0, s>>>(0, static_cast<int*>(Ptr(seg)));
    CK(cudaGetLastError());
    counter[0] -= 1;
    counter[1] += 1;
    memcpy(host[0].data(), counter, sizeof(counter));
    // A write through the mapping at an offset shows through the other one.
    const size_t off = (static_cast<size_t>(i) * 65537) % (gran - 4096);
    std::vector<unsigned char> patch(4096);
    e2e::Fill(patch.data(), patch.size(), 500 + i);
    CK(cudaMemcpyAsync(Ptr(seg + (kAliasSlot + 1) * gran + off), patch.data(), patch.size(),
                       cudaMemcpyHostToDevice, s));
    memcpy(big_host.data() + gran + off, patch.data(), patch.size());
    CK(cudaStreamSynchronize(s));
    // Everything read back.
    uint64_t sum = Sum(nullptr, 0);
    std::vector<unsigned char> got(gran);
    for (size_t c = 0; c < chunks.size(); ++c) {
      CK(cudaMemcpy(got.data(), Ptr(seg + c * gran), gran, cudaMemcpyDeviceToHost));
      EXPECT_SAME(got.data(), host[c].data(), gran, "a VMM chunk");
      sum = Sum(got.data(), gran, sum);
    }
    std::vector<unsigned char> whole(2 * gran);
    CK(cudaMemcpy(whole.data(), Ptr(alias), whole.size(), cudaMemcpyDeviceToHost));
    EXPECT_SAME(whole.data(), big_host.data(), whole.size(), "the allocation mapped twice");
    sum = Sum(whole.data(), whole.size(), sum);
    // The handles the app holds are still the driver's names for its memory.
    CUmemGenericAllocationHandle again = 0;
    CU(g_cu.retain(&again, Ptr(seg + gran / 2)));
    EXPECT(again == chunks[0], "cuMemRetainAllocationHandle gave %llu, the app holds %llu",
           static_cast<unsigned long long>(again), static_cast<unsigned long long>(chunks[0]));
    CU(g_cu.release(again));
    CUmemAllocationProp got_prop;
    memset(&got_prop, 0, sizeof(got_prop));
    CU(g_cu.properties(&got_prop, chunks.back()));
    EXPECT(got_prop.type == CU_MEM_ALLOCATION_TYPE_PINNED &&
               got_prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && got_prop.location.id == 0,
           "properties of a chunk");
    EXPECT(GetAccess(seg) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access of chunk 0");
    if (chunks.size() > kReadOnly)
      EXPECT(GetAccess(seg + kReadOnly * gran) == CU_MEM_ACCESS_FLAGS_PROT_READ,
             "access of the read-only chunk");
    char buf[128];
    snprintf(buf, sizeof(buf), " vmm=%llu chunks=%zu vcounter=%d",
             static_cast<unsigned long long>(sum), chunks.size(), counter[1]);
    *line += buf;
  }

  void Teardown() {
    e2e::Step("vmm teardown");
    CU(g_cu.unmap(seg, chunks.size() * gran));
    CU(g_cu.unmap(seg + kAliasSlot * gran, 2 * gran));
    for (CUmemGenericAllocationHandle h : chunks) CU(g_cu.release(h));
    CU(g_cu.unmap(alias, 2 * gran));  // big goes with its last mapping
    CU(g_cu.address_free(seg, seg_size));
    CU(g_cu.address_free(alias, 2 * gran));
  }
};

// --- graphs

constexpr size_t kCap = 48 << 10;   // the captured graph's buffers
constexpr size_t kHand = 24 << 10;  // the hand-built graph's buffers

// MIGRATE_STATE_HOSTFN_US: host functions take that long, as they do when a remote
// client runs them (a diagnostic for timing-dependent driver behaviour).
void CountCall(void* p) {
  static const int slow_us = [] {
    const char* v = getenv("MIGRATE_STATE_HOSTFN_US");
    return v != nullptr ? atoi(v) : 0;
  }();
  if (slow_us > 0) usleep(slow_us);
  ++*static_cast<int*>(p);
}

struct Graphs {
  cudaStream_t s = nullptr;
  // captured
  cudaGraph_t cap_graph = nullptr;
  cudaGraphExec_t cap_exec = nullptr;
  unsigned char *cap_in = nullptr, *cap_out = nullptr;  // pinned: captured copies
  unsigned char *d_a = nullptr, *d_b = nullptr;
  int* cap_counter = nullptr;
  int cap_calls = 0;
  cudaEvent_t cap_event = nullptr;
  // built by hand
  cudaGraph_t g = nullptr, child = nullptr;
  cudaGraphExec_t e = nullptr, e2 = nullptr;
  cudaGraphNode_t mset, h2d, k1, k2, child_node, empty, rec, wait, back_m, back_x, back_y, host;
  unsigned char *d_m = nullptr, *d_x = nullptr, *d_y = nullptr;
  std::vector<unsigned char> h_x, h_m, h_xb, h_y;
  int *cA = nullptr, *cB = nullptr;
  int a[2] = {500, 0}, b[2] = {700, 0};
  int hand_calls = 0;
  cudaEvent_t ev = nullptr;
  decltype(&::cuGraphKernelNodeGetParams_v2) kernel_params = nullptr;
  CUfunction k1_func = nullptr;
  CUkernel k1_kern = nullptr;
  int cap_count[2] = {900, 0};

  // flyt_sim_countdown(0, *counter); `args` and `unused` outlive the call that takes it.
  static cudaKernelNodeParams Kernel(int** counter, void** args, unsigned long long* unused) {
    *unused = 0;
    args[0] = unused;
    args[1] = counter;
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(flyt_sim_countdown);
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(32);
    kp.kernelParams = args;
    return kp;
  }

  void Setup() {
    e2e::Step("graphs setup");
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&cap_event, cudaEventDisableTiming));
    CK(cudaEventCreate(&ev));
    CK(cudaMallocHost(&cap_in, kCap));
    CK(cudaMallocHost(&cap_out, kCap));
    CK(cudaMalloc(&d_a, kCap));
    CK(cudaMalloc(&d_b, kCap));
    CK(cudaMalloc(&cap_counter, 2 * sizeof(int)));
    CK(cudaMemcpy(cap_counter, cap_count, sizeof(cap_count), cudaMemcpyHostToDevice));
    // Captured: every copy to and from this process's memory re-reads / re-writes it.
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(d_a, cap_in, kCap, cudaMemcpyHostToDevice, s));
    flyt_sim_countdown<<<1, 32, 0, s>>>(0, cap_counter);
    CK(cudaGetLastError());
    CK(cudaMemsetAsync(d_b, 0x5a, kCap / 2, s));
    CK(cudaMemcpyAsync(d_b + kCap / 2, d_a, kCap / 2, cudaMemcpyDeviceToDevice, s));
    CK(cudaMemcpyAsync(cap_out, d_b, kCap, cudaMemcpyDeviceToHost, s));
    CK(cudaLaunchHostFunc(s, CountCall, &cap_calls));
    CK(cudaEventRecord(cap_event, s));
    CK(cudaStreamEndCapture(s, &cap_graph));
    CK(cudaGraphInstantiateWithFlags(&cap_exec, cap_graph,
                                     cudaGraphInstantiateFlagUseNodePriority));

    // Built by hand.
    h_x.resize(kHand);
    h_m.resize(kHand);
    h_xb.resize(kHand);
    h_y.resize(kHand);
    CK(cudaMalloc(&d_m, kHand));
    CK(cudaMalloc(&d_x, kHand));
    CK(cudaMalloc(&d_y, kHand));
    CK(cudaMalloc(&cA, 2 * sizeof(int)));
    CK(cudaMalloc(&cB, 2 * sizeof(int)));
    CK(cudaMemcpy(cA, a, sizeof(a), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cB, b, sizeof(b), cudaMemcpyHostToDevice));
    CK(cudaGraphCreate(&g, 0));
    cudaMemsetParams ms{};
    ms.dst = d_m;
    ms.value = 0x11;
    ms.elementSize = 1;
    ms.width = kHand;
    ms.height = 1;
    CK(cudaGraphAddMemsetNode(&mset, g, nullptr, 0, &ms));
    CK(cudaGraphAddMemcpyNode1D(&h2d, g, nullptr, 0, d_x, h_x.data(), kHand,
                                cudaMemcpyHostToDevice));
    void* args1[2];
    void* args2[2];
    unsigned long long u1, u2;
    cudaKernelNodeParams kp1 = Kernel(&cA, args1, &u1);
    CK(cudaGraphAddKernelNode(&k1, g, &mset, 1, &kp1));
    cudaKernelNodeParams kp2 = Kernel(&cB, args2, &u2);
    CK(cudaGraphAddKernelNode(&k2, g, &k1, 1, &kp2));
    CK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t inner;
    cudaMemsetParams ys = ms;
    ys.dst = d_y;
    ys.value = 0x77;
    CK(cudaGraphAddMemsetNode(&inner, child, nullptr, 0, &ys));
    CK(cudaGraphAddChildGraphNode(&child_node, g, &k2, 1, child));
    cudaGraphNode_t before_empty[2] = {child_node, h2d};
    CK(cudaGraphAddEmptyNode(&empty, g, before_empty, 2));
    CK(cudaGraphAddEventRecordNode(&rec, g, &empty, 1, ev));
    CK(cudaGraphAddEventWaitNode(&wait, g, &rec, 1, ev));
    CK(cudaGraphAddMemcpyNode1D(&back_m, g, &wait, 1, h_m.data(), d_m, kHand,
                                cudaMemcpyDeviceToHost));
    CK(cudaGraphAddMemcpyNode1D(&back_x, g, &wait, 1, h_xb.data(), d_x, kHand,
                                cudaMemcpyDeviceToHost));
    CK(cudaGraphAddMemcpyNode1D(&back_y, g, &wait, 1, h_y.data(), d_y, kHand,
                                cudaMemcpyDeviceToHost));
    cudaHostNodeParams hp{};
    hp.fn = CountCall;
    hp.userData = &hand_calls;
    cudaGraphNode_t host_deps[3] = {back_m, back_x, back_y};
    CK(cudaGraphAddHostNode(&host, g, host_deps, 3, &hp));
    CK(cudaGraphInstantiate(&e, g, 0));
    // The driver's names of k1's code, which a move must keep.
    e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
    e2e::ResolveDriver("cuGraphKernelNodeGetParams", &kernel_params);
    CUDA_KERNEL_NODE_PARAMS kp{};
    CU(kernel_params(reinterpret_cast<CUgraphNode>(k1), &kp));
    k1_func = kp.func;
    k1_kern = kp.kern;
  }

  // What the hand-built executable graph's memset writes at step i.
  static unsigned char MemsetValue(int i) { return i < 1 ? 0x11 : i < 7 ? 0x22 : 0x33; }

  void Change(int i) {
    e2e::Step("graphs: change");
    if (i == 1) {  // in place, in the executable graph only
      cudaMemsetParams ms{};
      ms.dst = d_m;
      ms.value = 0x22;
      ms.elementSize = 1;
      ms.width = kHand;
      ms.height = 1;
      CK(cudaGraphExecMemsetNodeSetParams(e, mset, &ms));
      CK(cudaGraphNodeSetEnabled(e, k2, 0));
    }
    if (i == 4) {  // k1 counts cB down in the executable graph
      void* args[2];
      unsigned long long u;
      cudaKernelNodeParams kp = Kernel(&cB, args, &u);
      CK(cudaGraphExecKernelNodeSetParams(e, k1, &kp));
    }
    if (i == 7) {  // the graph changes, and the executable graph takes it whole
      CK(cudaGraphNodeSetEnabled(e, k2, 1));
      cudaMemsetParams ms;
      CK(cudaGraphMemsetNodeGetParams(mset, &ms));
      ms.value = 0x33;
      CK(cudaGraphMemsetNodeSetParams(mset, &ms));
      cudaGraphExecUpdateResultInfo info{};
      CK(cudaGraphExecUpdate(e, g, &info));
      EXPECT(info.result == cudaGraphExecUpdateSuccess, "cudaGraphExecUpdate result %d",
             static_cast<int>(info.result));
    }
    if (i == 9) CK(cudaGraphInstantiate(&e2, g, 0));  // a new one from the moved graph
  }

  void Step(int i, std::string* line) {
    Change(i);
    e2e::Step("graphs: launch");
    e2e::Fill(cap_in, kCap, 1000 + i);
    e2e::Fill(h_x.data(), kHand, 2000 + i);
    CK(cudaGraphLaunch(cap_exec, s));
    CK(cudaGraphLaunch(e, s));
    if (e2 != nullptr) CK(cudaGraphLaunch(e2, s));
    CK(cudaStreamSynchronize(s));
    // cap_event was recorded only inside the capture (no External flag: a capture-internal
    // record, no node); the driver answers cudaEventSynchronize on it with invalid value.
    // The captured graph: memset half, then the first half of what was copied in.
    cap_count[0] -= 1;
    cap_count[1] += 1;
    EXPECT(e2e::FirstNot(cap_out, 0x5a, kCap / 2) < 0, "captured memset");
    EXPECT_SAME(cap_out + kCap / 2, cap_in, kCap / 2, "captured copies");
    EXPECT(cap_calls == i + 1, "captured host function ran %d times after %d steps", cap_calls,
           i + 1);
    // The hand-built graph (and its second executable graph, the same by now).
    const bool k1_on_b = i >= 4 && i < 7;
    const bool k2_on = i < 1 || i >= 7;
    for (int run = 0; run < (e2 != nullptr ? 2 : 1); ++run) {
      const bool first = run == 0;
      ((first && k1_on_b) ? b : a)[0] -= 1;
      ((first && k1_on_b) ? b : a)[1] += 1;
      if (!first || k2_on) {
        b[0] -= 1;
        b[1] += 1;
      }
    }
    EXPECT(e2e::FirstNot(h_m.data(), MemsetValue(i), kHand) < 0, "memset node value at step %d", i);
    EXPECT_SAME(h_xb.data(), h_x.data(), kHand, "hand-built copies");
    EXPECT(e2e::FirstNot(h_y.data(), 0x77, kHand) < 0, "the child graph's memset");
    EXPECT(hand_calls == i + 1 + (e2 != nullptr ? i - 8 : 0), "hand-built host node ran %d times",
           hand_calls);
    int got[2];
    CK(cudaMemcpy(got, cA, sizeof(got), cudaMemcpyDeviceToHost));
    EXPECT(got[0] == a[0] && got[1] == a[1], "counter A %d,%d, want %d,%d", got[0], got[1], a[0],
           a[1]);
    CK(cudaMemcpy(got, cB, sizeof(got), cudaMemcpyDeviceToHost));
    EXPECT(got[0] == b[0] && got[1] == b[1], "counter B %d,%d, want %d,%d", got[0], got[1], b[0],
           b[1]);
    CK(cudaMemcpy(got, cap_counter, sizeof(got), cudaMemcpyDeviceToHost));
    EXPECT(got[0] == cap_count[0] && got[1] == cap_count[1], "captured counter %d,%d", got[0],
           got[1]);
    // The handles the app holds still name its graph's nodes.
    e2e::Step("graphs: queries");
    size_t n = 0;
    CK(cudaGraphGetNodes(g, nullptr, &n));
    EXPECT(n == 12, "%zu nodes in the hand-built graph", n);
    std::vector<cudaGraphNode_t> nodes(n);
    CK(cudaGraphGetNodes(g, nodes.data(), &n));
    int known = 0;
    for (cudaGraphNode_t x : nodes) known += x == mset || x == k1 || x == host || x == child_node;
    EXPECT(known == 4, "%d of the app's node handles in the graph's list", known);
    cudaGraphNodeType t;
    CK(cudaGraphNodeGetType(k1, &t));
    EXPECT(t == cudaGraphNodeTypeKernel, "k1's type %d", static_cast<int>(t));
    CK(cudaGraphNodeGetType(child_node, &t));
    EXPECT(t == cudaGraphNodeTypeGraph, "the child node's type %d", static_cast<int>(t));
    CK(cudaGraphNodeGetType(h2d, &t));
    EXPECT(t == cudaGraphNodeTypeMemcpy, "h2d's type %d", static_cast<int>(t));
    cudaMemsetParams ms;
    CK(cudaGraphMemsetNodeGetParams(mset, &ms));
    EXPECT(ms.value == (i < 7 ? 0x11u : 0x33u), "the graph's memset value %u", ms.value);
    CUDA_KERNEL_NODE_PARAMS kp{};
    CU(kernel_params(reinterpret_cast<CUgraphNode>(k1), &kp));
    EXPECT(kp.func == k1_func && kp.kern == k1_kern, "k1's function %p/%p, was %p/%p",
           static_cast<void*>(kp.func), static_cast<void*>(kp.kern), static_cast<void*>(k1_func),
           static_cast<void*>(k1_kern));
    EXPECT(kp.kernelParams != nullptr && *static_cast<int**>(kp.kernelParams[1]) == cA,
           "k1's argument in the graph");
    cudaGraphNode_t deps[4];
    size_t nd = 4;
    CK(cudaGraphNodeGetDependencies(empty, deps, nullptr, &nd));
    EXPECT(nd == 2 && ((deps[0] == child_node && deps[1] == h2d) ||
                       (deps[0] == h2d && deps[1] == child_node)),
           "the empty node's dependencies");
    unsigned int enabled = 9;
    CK(cudaGraphNodeGetEnabled(e, k2, &enabled));
    EXPECT(enabled == (k2_on ? 1u : 0u), "k2 enabled %u at step %d", enabled, i);
    unsigned long long flags = 9;
    CK(cudaGraphExecGetFlags(cap_exec, &flags));
    // Instantiated with UseNodePriority: the H200's driver (580) reports 0 for it, the sim
    // the flag; never another flag.
    EXPECT((flags & ~static_cast<unsigned long long>(cudaGraphInstantiateFlagUseNodePriority)) == 0,
           "the captured exec's flags %llu", flags);
    char buf[160];
    snprintf(buf, sizeof(buf), " cap=%llu hand=%llu a=%d b=%d calls=%d,%d",
             static_cast<unsigned long long>(Sum(cap_out, kCap)),
             static_cast<unsigned long long>(
                 Sum(h_y.data(), kHand, Sum(h_xb.data(), kHand, Sum(h_m.data(), kHand)))),
             a[1], b[1], cap_calls, hand_calls);
    *line += buf;
  }

  void Teardown() {
    e2e::Step("graphs teardown");
    if (e2 != nullptr) CK(cudaGraphExecDestroy(e2));
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphExecDestroy(cap_exec));
    CK(cudaGraphDestroy(g));
    CK(cudaGraphDestroy(child));
    CK(cudaGraphDestroy(cap_graph));
    for (void* p :
         {static_cast<void*>(d_a), static_cast<void*>(d_b), static_cast<void*>(cap_counter),
          static_cast<void*>(d_m), static_cast<void*>(d_x), static_cast<void*>(d_y),
          static_cast<void*>(cA), static_cast<void*>(cB)})
      CK(cudaFree(p));
    CK(cudaFreeHost(cap_in));
    CK(cudaFreeHost(cap_out));
    CK(cudaEventDestroy(ev));
    CK(cudaEventDestroy(cap_event));
    CK(cudaStreamDestroy(s));
  }
};

// --- stream-ordered allocations

struct Async {
  cudaStream_t s = nullptr;
  std::vector<std::pair<unsigned char*, std::vector<unsigned char>>> live;

  void Setup() { CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }

  void Step(int i, std::string* line) {
    e2e::Step("async step");
    // Large ones (their own granules) and small ones (sharing chunks), in turn.
    const size_t n = (i % 2 == 0) ? (3u << 20) + 4096 * i + 5 : 1000 + 77 * i;
    unsigned char* p = nullptr;
    CK(cudaMallocAsync(reinterpret_cast<void**>(&p), n, s));
    std::vector<unsigned char> host(n);
    e2e::Fill(host.data(), n, 3000 + i);
    CK(cudaMemcpyAsync(p, host.data(), n, cudaMemcpyHostToDevice, s));
    live.emplace_back(p, std::move(host));
    if (live.size() > 3) {  // the oldest goes, in stream order
      CK(cudaFreeAsync(live.front().first, s));
      live.erase(live.begin());
    }
    CK(cudaStreamSynchronize(s));
    uint64_t sum = Sum(nullptr, 0);
    for (const auto& [dev, want] : live) {
      std::vector<unsigned char> got(want.size());
      CK(cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost));
      EXPECT_SAME(got.data(), want.data(), got.size(), "a stream-ordered allocation");
      sum = Sum(got.data(), got.size(), sum);
    }
    char buf[64];
    snprintf(buf, sizeof(buf), " async=%llu", static_cast<unsigned long long>(sum));
    *line += buf;
  }

  void Teardown() {
    e2e::Step("async teardown");
    for (const auto& [dev, want] : live) CK(cudaFreeAsync(dev, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
  }
};

// --- memory pools by handle

constexpr uint64_t kDefaultThreshold = 64ull << 20;
constexpr uint64_t kMineThreshold = 32ull << 20;
constexpr uint64_t kIdleThreshold = 16ull << 20;

uint64_t PoolFigure(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  uint64_t v = 0;
  CK(cudaMemPoolGetAttribute(pool, attr, &v));
  return v;
}

// MIGRATE_STATE_POOLS_SKIP: words naming parts of the pools steps to leave out
// (setpool, trim, doomed, early-destroy, idle, kernel), a diagnostic for narrowing a failure down.
bool PoolsSkip(const char* what) {
  static const std::string skip = [] {
    const char* v = getenv("MIGRATE_STATE_POOLS_SKIP");
    return std::string(v != nullptr ? v : "");
  }();
  return skip.find(what) != std::string::npos;
}

struct Pools {
  cudaStream_t s = nullptr;
  cudaMemPool_t def = nullptr, mine = nullptr;
  cudaMemPool_t idle = nullptr;  // holds no memory until the last step (moved empty)
  // A pool destroyed at step 4 while an allocation of it lives on (moved so at step 5),
  // freed at step 6: the driver releases the pool with its last allocation.
  unsigned char* orphan = nullptr;
  std::vector<unsigned char> orphan_want;
  cudaMemPool_t doomed_later = nullptr;  // MIGRATE_STATE_POOLS_SKIP=early-destroy
  int* counter = nullptr;                // in `mine`, for the whole run
  int count[2] = {400, 0};
  struct Live {
    unsigned char* p;
    std::vector<unsigned char> want;
    bool mine;
  };
  std::vector<Live> live;
  decltype(&::cuPointerGetAttribute) pointer_attribute = nullptr;

  void Setup() {
    e2e::Step("pools setup");
    e2e::ResolveDriver("cuPointerGetAttribute", &pointer_attribute);
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaDeviceGetDefaultMemPool(&def, 0));
    uint64_t threshold = kDefaultThreshold;
    CK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    CK(cudaMemPoolCreate(&mine, &props));
    threshold = kMineThreshold;
    CK(cudaMemPoolSetAttribute(mine, cudaMemPoolAttrReleaseThreshold, &threshold));
    int no = 0;
    CK(cudaMemPoolSetAttribute(mine, cudaMemPoolReuseAllowOpportunistic, &no));
    CK(cudaMemPoolCreate(&idle, &props));
    threshold = kIdleThreshold;
    CK(cudaMemPoolSetAttribute(idle, cudaMemPoolAttrReleaseThreshold, &threshold));
    CK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&counter), sizeof(count), mine, s));
    CK(cudaMemcpyAsync(counter, count, sizeof(count), cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
  }

  void Check(int i) {
    e2e::Step("pools: handles and attributes");
    cudaMemPool_t got = nullptr;
    CK(cudaDeviceGetDefaultMemPool(&got, 0));
    EXPECT(got == def, "the default pool's handle changed at step %d", i);
    CK(cudaDeviceGetMemPool(&got, 0));
    // Made current at step 6 and given back at step 10, after these checks.
    EXPECT(got == (i > 6 && i <= 10 ? mine : def), "the device's current pool at step %d", i);
    EXPECT(PoolFigure(def, cudaMemPoolAttrReleaseThreshold) == kDefaultThreshold,
           "the default pool's release threshold");
    EXPECT(PoolFigure(mine, cudaMemPoolAttrReleaseThreshold) == kMineThreshold,
           "the pool's release threshold");
    EXPECT(PoolFigure(idle, cudaMemPoolAttrReleaseThreshold) == kIdleThreshold,
           "the empty pool's release threshold");
    int flag = 9;
    CK(cudaMemPoolGetAttribute(mine, cudaMemPoolReuseAllowOpportunistic, &flag));
    EXPECT(flag == 0, "the pool's opportunistic reuse %d", flag);
    CK(cudaMemPoolGetAttribute(mine, cudaMemPoolReuseFollowEventDependencies, &flag));
    EXPECT(flag == 1, "the pool's event-dependency reuse %d", flag);
  }

  void Step(int i, std::string* line) {
    Check(i);
    e2e::Step("pools step");
    if (i == 6 && !PoolsSkip("setpool")) CK(cudaDeviceSetMemPool(0, mine));  // from `mine` now
    if (i == 10 && !PoolsSkip("setpool")) CK(cudaDeviceSetMemPool(0, def));
    const size_t big = (2u << 20) + 8192 * i + 3, small = 700 + 33 * i;
    const bool current_is_mine = i >= 6 && i < 10;
    unsigned char* a = nullptr;  // from the current pool
    CK(cudaMallocAsync(reinterpret_cast<void**>(&a), i % 2 == 0 ? big : small, s));
    unsigned char* b = nullptr;  // from `mine`, named
    CK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&b), i % 2 == 0 ? small : big, mine, s));
    for (auto [p, n, from_mine] : {std::make_tuple(a, i % 2 == 0 ? big : small, current_is_mine),
                                   std::make_tuple(b, i % 2 == 0 ? small : big, true)}) {
      std::vector<unsigned char> host(n);
      e2e::Fill(host.data(), n, 4000 + i * 2 + (p == b));
      CK(cudaMemcpyAsync(p, host.data(), n, cudaMemcpyHostToDevice, s));
      live.push_back(Live{p, std::move(host), from_mine});
    }
    CUmemoryPool of = nullptr;
    CU(pointer_attribute(&of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                         reinterpret_cast<CUdeviceptr>(b)));
    EXPECT(of == reinterpret_cast<CUmemoryPool>(mine), "the pool of an allocation from it");
    CU(pointer_attribute(&of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                         reinterpret_cast<CUdeviceptr>(a)));
    EXPECT(of == reinterpret_cast<CUmemoryPool>(current_is_mine ? mine : def),
           "the pool of a cudaMallocAsync allocation at step %d", i);
    if (!PoolsSkip("kernel")) flyt_sim_countdown<<<1, 32, 0, s>>>(0, counter);
    CK(cudaGetLastError());
    count[0] -= 1;
    count[1] += 1;
    while (live.size() > 5) {  // the oldest go, in stream order
      CK(cudaFreeAsync(live.front().p, s));
      live.erase(live.begin());
    }
    CK(cudaStreamSynchronize(s));
    if (i == 7 && !PoolsSkip("trim")) CK(cudaMemPoolTrimTo(mine, 0));  // only idle memory goes
    if (i == 3 && !PoolsSkip("doomed")) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = 0;
      cudaMemPool_t doomed;
      CK(cudaMemPoolCreate(&doomed, &props));
      orphan_want.resize(3 << 20);
      e2e::Fill(orphan_want.data(), orphan_want.size(), 77);
      CK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&orphan), orphan_want.size(), doomed, s));
      CK(cudaMemcpyAsync(orphan, orphan_want.data(), orphan_want.size(), cudaMemcpyHostToDevice,
                         s));
      CK(cudaStreamSynchronize(s));
      if (PoolsSkip("early-destroy")) {
        doomed_later = doomed;
      } else {
        CK(cudaMemPoolDestroy(doomed));  // with `orphan` still allocated
      }
    }
    if (orphan != nullptr) {
      std::vector<unsigned char> got(orphan_want.size());
      CK(cudaMemcpy(got.data(), orphan, got.size(), cudaMemcpyDeviceToHost));
      EXPECT_SAME(got.data(), orphan_want.data(), got.size(), "memory of a destroyed pool");
      if (i == 6) {
        CK(cudaFreeAsync(orphan, s));
        CK(cudaStreamSynchronize(s));
        orphan = nullptr;
        if (doomed_later != nullptr) CK(cudaMemPoolDestroy(doomed_later));
      }
    }
    if (i == 11 && !PoolsSkip("idle")) {  // the pool that moved empty serves now
      unsigned char* x = nullptr;
      CK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&x), 5000, idle, s));
      CK(cudaMemsetAsync(x, 0x3c, 5000, s));
      unsigned char back[5000];
      CK(cudaMemcpyAsync(back, x, sizeof(back), cudaMemcpyDeviceToHost, s));
      CK(cudaFreeAsync(x, s));
      CK(cudaStreamSynchronize(s));
      EXPECT(e2e::FirstNot(back, 0x3c, sizeof(back)) < 0, "memory of the pool that moved empty");
    }
    uint64_t sum = Sum(nullptr, 0), in_mine = 0, in_def = 0;
    for (const Live& l : live) {
      std::vector<unsigned char> got(l.want.size());
      CK(cudaMemcpy(got.data(), l.p, got.size(), cudaMemcpyDeviceToHost));
      EXPECT_SAME(got.data(), l.want.data(), got.size(), "a pool allocation");
      sum = Sum(got.data(), got.size(), sum);
      (l.mine ? in_mine : in_def) += l.want.size();
    }
    int c[2];
    CK(cudaMemcpy(c, counter, sizeof(c), cudaMemcpyDeviceToHost));
    EXPECT(c[0] == count[0] && c[1] == count[1], "the pool counter %d,%d, want %d,%d", c[0], c[1],
           count[0], count[1]);
    // What the pool reports of its memory, as far as the driver promises it.
    const uint64_t used = PoolFigure(mine, cudaMemPoolAttrUsedMemCurrent);
    const uint64_t reserved = PoolFigure(mine, cudaMemPoolAttrReservedMemCurrent);
    EXPECT(used >= in_mine + sizeof(count), "the pool's used memory %llu < %llu at step %d",
           static_cast<unsigned long long>(used), static_cast<unsigned long long>(in_mine), i);
    EXPECT(reserved >= used, "the pool reserves %llu < used %llu",
           static_cast<unsigned long long>(reserved), static_cast<unsigned long long>(used));
    EXPECT(PoolFigure(mine, cudaMemPoolAttrUsedMemHigh) >= used, "the pool's used high mark");
    EXPECT(PoolFigure(mine, cudaMemPoolAttrReservedMemHigh) >= reserved,
           "the pool's reserved high mark");
    EXPECT(PoolFigure(def, cudaMemPoolAttrUsedMemCurrent) >= in_def,
           "the default pool's used memory");
    char buf[96];
    snprintf(buf, sizeof(buf), " pools=%llu live=%zu pcounter=%d",
             static_cast<unsigned long long>(sum), live.size(), c[1]);
    *line += buf;
  }

  void Teardown() {
    e2e::Step("pools teardown");
    for (const Live& l : live) CK(cudaFreeAsync(l.p, s));
    CK(cudaFreeAsync(counter, s));
    CK(cudaStreamSynchronize(s));
    EXPECT(PoolFigure(mine, cudaMemPoolAttrUsedMemCurrent) == 0,
           "the pool's used memory at the end");
    // Under its release threshold the pool keeps what was freed, until a trim.
    EXPECT(PoolFigure(mine, cudaMemPoolAttrReservedMemCurrent) > 0,
           "the pool's reserved memory under its threshold");
    CK(cudaMemPoolTrimTo(mine, 0));
    EXPECT(PoolFigure(mine, cudaMemPoolAttrReservedMemCurrent) == 0,
           "the pool's reserved memory after a trim to 0");
    uint64_t zero = 0;
    CK(cudaMemPoolSetAttribute(mine, cudaMemPoolAttrUsedMemHigh, &zero));
    EXPECT(PoolFigure(mine, cudaMemPoolAttrUsedMemHigh) == 0, "the used high mark after a reset");
    CK(cudaMemPoolDestroy(mine));
    CK(cudaMemPoolDestroy(idle));
    CK(cudaStreamDestroy(s));
  }
};

// --- texture objects

// Through a texture object (GPU only: the sim runs no such kernel).
__global__ void fetch_linear(cudaTextureObject_t t, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<float>(t, i);
}
__global__ void fetch_pitched(cudaTextureObject_t t, float* out, int w, int h) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}

struct Textures {
  static constexpr int kN = 4096;  // floats in each linear buffer
  static constexpr int kW = 64, kH = 32;
  struct Obj {
    const char* name;
    cudaTextureObject_t value;
    const void* ptr;  // the memory it reads
    size_t bytes;     // linear: its size; pitch-2D: 0
    cudaTextureAddressMode address;
  };
  bool on_gpu = false;
  void *raw0 = nullptr, *raw1 = nullptr;  // lin0 and lin1 lie in these, 512-byte aligned
  float *lin0 = nullptr, *lin1 = nullptr, *pitched = nullptr, *out = nullptr;
  size_t pitch = 0;
  std::vector<float> h_lin0, h_lin1, h_pitched;  // what the buffers hold
  std::vector<Obj> live;

  static cudaTextureObject_t Linear(const float* p, size_t bytes, cudaTextureAddressMode mode) {
    cudaResourceDesc res{};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = const_cast<float*>(p);
    res.res.linear.desc = cudaCreateChannelDesc<float>();
    res.res.linear.sizeInBytes = bytes;
    cudaTextureDesc tex{};
    tex.readMode = cudaReadModeElementType;
    tex.addressMode[0] = mode;
    cudaTextureObject_t t = 0;
    CK(cudaCreateTextureObject(&t, &res, &tex, nullptr));
    return t;
  }

  // Four objects made (two linear over lin0 and lin1, one pitch-2D, one linear over half
  // of lin1), the second destroyed: the values the app holds have a hole.
  void Setup() {
    e2e::Step("textures setup");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    on_gpu = strcmp(prop.name, "Flyt Simulated GPU") != 0;
    // A linear texture's memory must be aligned to CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT
    // (512 on Hopper), which cudaMalloc does not promise.
    auto aligned = [](void** raw) {
      CK(cudaMalloc(raw, kN * sizeof(float) + 512));
      return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(*raw) + 511) & ~uintptr_t{511});
    };
    lin0 = aligned(&raw0);
    lin1 = aligned(&raw1);
    CK(cudaMalloc(&out, kN * sizeof(float)));
    CK(cudaMallocPitch(&pitched, &pitch, kW * sizeof(float), kH));
    h_lin0.resize(kN);
    h_lin1.resize(kN);
    h_pitched.resize(kW * kH);
    for (int i = 0; i < kN; ++i) {
      h_lin0[i] = static_cast<float>(i);
      h_lin1[i] = static_cast<float>(100000 + i);
    }
    for (int i = 0; i < kW * kH; ++i) h_pitched[i] = static_cast<float>(50000 + i);
    CK(cudaMemcpy(lin0, h_lin0.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(lin1, h_lin1.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy2D(pitched, pitch, h_pitched.data(), kW * sizeof(float), kW * sizeof(float), kH,
                    cudaMemcpyHostToDevice));
    const cudaTextureObject_t a = Linear(lin0, kN * sizeof(float), cudaAddressModeClamp);
    const cudaTextureObject_t gone = Linear(lin1, kN * sizeof(float), cudaAddressModeClamp);
    cudaResourceDesc res{};
    res.resType = cudaResourceTypePitch2D;
    res.res.pitch2D.devPtr = pitched;
    res.res.pitch2D.desc = cudaCreateChannelDesc<float>();
    res.res.pitch2D.width = kW;
    res.res.pitch2D.height = kH;
    res.res.pitch2D.pitchInBytes = pitch;
    cudaTextureDesc tex{};
    tex.readMode = cudaReadModeElementType;
    tex.addressMode[0] = tex.addressMode[1] = cudaAddressModeBorder;
    tex.filterMode = cudaFilterModePoint;
    cudaTextureObject_t p = 0;
    CK(cudaCreateTextureObject(&p, &res, &tex, nullptr));
    const cudaTextureObject_t half = Linear(lin1, kN / 2 * sizeof(float), cudaAddressModeBorder);
    CK(cudaDestroyTextureObject(gone));
    live = {{"lin0", a, lin0, kN * sizeof(float), cudaAddressModeClamp},
            {"pitched", p, pitched, 0, cudaAddressModeBorder},
            {"lin1_half", half, lin1, kN / 2 * sizeof(float), cudaAddressModeBorder}};
    for (const Obj& o : live) EXPECT(o.value != 0 && o.value != gone, "texture %s value", o.name);
  }

  // The driver still knows each value the app holds as the object it made.
  void CheckObject(const Obj& o, int i) {
    cudaResourceDesc res{};
    CK(cudaGetTextureObjectResourceDesc(&res, o.value));
    cudaTextureDesc tex{};
    CK(cudaGetTextureObjectTextureDesc(&tex, o.value));
    if (o.bytes != 0) {
      EXPECT(res.resType == cudaResourceTypeLinear && res.res.linear.devPtr == o.ptr &&
                 res.res.linear.sizeInBytes == o.bytes,
             "texture %s (value %llu) at step %d: type %d, %zu bytes", o.name,
             static_cast<unsigned long long>(o.value), i, static_cast<int>(res.resType),
             res.res.linear.sizeInBytes);
    } else {
      EXPECT(res.resType == cudaResourceTypePitch2D && res.res.pitch2D.devPtr == o.ptr &&
                 res.res.pitch2D.width == kW && res.res.pitch2D.height == kH &&
                 res.res.pitch2D.pitchInBytes == pitch,
             "texture %s (value %llu) at step %d: type %d, %zux%zu", o.name,
             static_cast<unsigned long long>(o.value), i, static_cast<int>(res.resType),
             res.res.pitch2D.width, res.res.pitch2D.height);
    }
    // (The address modes of a linear texture mean nothing to tex1Dfetch: checked on the
    // pitch-2D one only.)
    EXPECT((o.bytes != 0 || tex.addressMode[0] == o.address) &&
               tex.readMode == cudaReadModeElementType,
           "texture %s at step %d: address mode %d, read mode %d", o.name, i,
           static_cast<int>(tex.addressMode[0]), static_cast<int>(tex.readMode));
  }

  void CheckFetch(const Obj& o, int i) {
    std::vector<float> got(o.bytes != 0 ? o.bytes / sizeof(float) : kW * kH);
    const int n = static_cast<int>(got.size());
    if (o.bytes != 0) {
      fetch_linear<<<(n + 255) / 256, 256>>>(o.value, out, n);
    } else {
      fetch_pitched<<<dim3(1, kH), kW>>>(o.value, out, kW, kH);
    }
    CK(cudaGetLastError());
    CK(cudaMemcpy(got.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
    const std::vector<float>& want = o.ptr == lin0 ? h_lin0 : (o.ptr == lin1 ? h_lin1 : h_pitched);
    for (int k = 0; k < n; ++k)
      EXPECT(got[k] == want[k], "texture %s read %g at %d, want %g (step %d)", o.name, got[k], k,
             want[k], i);
  }

  void Step(int i, std::string* line) {
    e2e::Step("textures step");
    // The memory under them changes; what they read must follow it.
    h_lin0[i % kN] += 1.0f;
    h_pitched[(i * 7) % (kW * kH)] -= 1.0f;
    CK(cudaMemcpy(lin0 + i % kN, &h_lin0[i % kN], sizeof(float), cudaMemcpyHostToDevice));
    const int at = (i * 7) % (kW * kH);
    CK(cudaMemcpy(reinterpret_cast<char*>(pitched) + (at / kW) * pitch + (at % kW) * sizeof(float),
                  &h_pitched[at], sizeof(float), cudaMemcpyHostToDevice));
    for (const Obj& o : live) CheckObject(o, i);
    // One made and destroyed: its value is none the app holds.
    const cudaTextureObject_t extra = Linear(lin0, 1024 * sizeof(float), cudaAddressModeWrap);
    for (const Obj& o : live) EXPECT(extra != o.value, "a new texture took %s's value", o.name);
    CheckObject({"extra", extra, lin0, 1024 * sizeof(float), cudaAddressModeWrap}, i);
    CK(cudaDestroyTextureObject(extra));
    if (on_gpu)
      for (const Obj& o : live) CheckFetch(o, i);
    // What the memory holds, read back (as the kernels read it on a GPU).
    std::vector<float> b0(kN), b1(kN), bp(kW * kH);
    CK(cudaMemcpy(b0.data(), lin0, kN * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b1.data(), lin1, kN * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy2D(bp.data(), kW * sizeof(float), pitched, pitch, kW * sizeof(float), kH,
                    cudaMemcpyDeviceToHost));
    EXPECT(b0 == h_lin0 && b1 == h_lin1 && bp == h_pitched,
           "the memory under the textures at step %d", i);
    char buf[96];
    snprintf(buf, sizeof(buf), " tex=%llu objects=%zu",
             static_cast<unsigned long long>(
                 Sum(bp.data(), bp.size() * sizeof(float), Sum(b0.data(), kN * sizeof(float)))),
             live.size());
    *line += buf;
  }

  void Teardown() {
    e2e::Step("textures teardown");
    for (const Obj& o : live) CK(cudaDestroyTextureObject(o.value));
    CK(cudaFree(raw0));
    CK(cudaFree(raw1));
    CK(cudaFree(out));
    CK(cudaFree(pitched));
  }
};

// --- refusals

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Prints "phase NAME ready" and keeps calling CUDA until DIR/NAME exists.
void Hold(const std::string& dir, const char* name) {
  printf("phase %s ready\n", name);
  fflush(stdout);
  for (int i = 0; i < 3000 && !Exists(dir + "/" + name); ++i) {
    CK(cudaStreamQuery(0));
    usleep(20000);
  }
  EXPECT(Exists(dir + "/" + name), "nobody released phase %s", name);
  printf("phase %s done\n", name);
}

int Refuse(const std::string& dir, int argc, char** argv) {
  for (int k = 0; k < argc; ++k) {
    const std::string phase = argv[k];
    e2e::Step(argv[k]);
    if (phase == "graph-alloc") {
      cudaGraph_t g;
      CK(cudaGraphCreate(&g, 0));
      cudaMemAllocNodeParams p{};
      p.poolProps.allocType = cudaMemAllocationTypePinned;
      p.poolProps.location.type = cudaMemLocationTypeDevice;
      p.poolProps.location.id = 0;
      p.bytesize = 1 << 20;
      cudaGraphNode_t alloc, free_node;
      CK(cudaGraphAddMemAllocNode(&alloc, g, nullptr, 0, &p));
      CK(cudaGraphAddMemFreeNode(&free_node, g, &alloc, 1, p.dptr));
      Hold(dir, argv[k]);
      CK(cudaGraphDestroy(g));
    } else if (phase == "graph-cond") {
      cudaGraph_t g;
      CK(cudaGraphCreate(&g, 0));
      cudaGraphConditionalHandle h;
      CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
      cudaGraphNodeParams np{};
      np.type = cudaGraphNodeTypeConditional;
      np.conditional.handle = h;
      np.conditional.type = cudaGraphCondTypeIf;
      np.conditional.size = 1;
      cudaGraphNode_t cond;
      CK(cudaGraphAddNode(&cond, g, nullptr, nullptr, 0, &np));
      cudaGraphExec_t exec;
      CK(cudaGraphInstantiate(&exec, g, 0));
      Hold(dir, argv[k]);
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(g));
    } else if (phase == "async") {
      void* p = nullptr;
      CK(cudaMallocAsync(&p, 1 << 20, 0));
      CK(cudaStreamSynchronize(0));
      Hold(dir, argv[k]);
      CK(cudaFreeAsync(p, 0));
      CK(cudaStreamSynchronize(0));
    } else if (phase == "pool-ipc") {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = 0;
      cudaMemPool_t pool;
      CK(cudaMemPoolCreate(&pool, &props));
      void* p = nullptr;
      CK(cudaMallocFromPoolAsync(&p, 1 << 20, pool, 0));
      CK(cudaStreamSynchronize(0));
      Hold(dir, argv[k]);
      CK(cudaFreeAsync(p, 0));
      CK(cudaStreamSynchronize(0));
      CK(cudaMemPoolDestroy(pool));
    } else if (phase == "surface" || phase == "texture-array") {
      const cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
      cudaArray_t arr = nullptr;
      CK(cudaMallocArray(&arr, &fd, 64, 16, cudaArraySurfaceLoadStore));
      cudaResourceDesc res{};
      res.resType = cudaResourceTypeArray;
      res.res.array.array = arr;
      if (phase == "surface") {
        cudaSurfaceObject_t obj = 0;
        CK(cudaCreateSurfaceObject(&obj, &res));
        Hold(dir, argv[k]);
        CK(cudaDestroySurfaceObject(obj));
      } else {
        cudaTextureDesc tex{};
        tex.readMode = cudaReadModeElementType;
        cudaTextureObject_t obj = 0;
        CK(cudaCreateTextureObject(&obj, &res, &tex, nullptr));
        Hold(dir, argv[k]);
        CK(cudaDestroyTextureObject(obj));
      }
      CK(cudaFreeArray(arr));
    } else if (phase == "vmm-fixed" || phase == "vmm") {
      ResolveVmm();
      const CUmemAllocationProp prop = DeviceProp();
      size_t gran = 0;
      CU(g_cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
      // Far from the movable range (and below the sim's cuMemAlloc range).
      const CUdeviceptr want = phase == "vmm-fixed" ? 0x580000000000ull : 0;
      CUdeviceptr va = 0;
      CU(g_cu.reserve(&va, 2 * gran, 0, want, 0));
      printf("%s.at_hint=%d\n", argv[k], va == want ? 1 : 0);
      Hold(dir, argv[k]);
      CU(g_cu.address_free(va, 2 * gran));
    } else {
      e2e::Fail(__FILE__, __LINE__, "unknown phase %s", argv[k]);
    }
  }
  Hold(dir, "end");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("migrate_state", 300);
  if (argc > 2 && std::string(argv[1]) == "refuse") {
    Refuse(argv[2], argc - 3, argv + 3);
    e2e::Pass();
    return 0;
  }
  const int steps = argc > 1 ? atoi(argv[1]) : 12;
  const int pause_ms = argc > 2 ? atoi(argv[2]) : 0;
  bool vmm_on = false, graphs_on = false, async_on = false, pools_on = false, tex_on = false;
  for (int k = 3; k < argc; ++k) {
    vmm_on = vmm_on || std::string(argv[k]) == "vmm";
    graphs_on = graphs_on || std::string(argv[k]) == "graphs";
    async_on = async_on || std::string(argv[k]) == "async";
    pools_on = pools_on || std::string(argv[k]) == "pools";
    tex_on = tex_on || std::string(argv[k]) == "textures";
  }
  if (!vmm_on && !graphs_on && !async_on && !pools_on && !tex_on)
    vmm_on = graphs_on = async_on = pools_on = tex_on = true;
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  Vmm vmm;
  Graphs graphs;
  Async async;
  Pools pools;
  Textures textures;
  if (vmm_on) vmm.Setup();
  if (graphs_on) graphs.Setup();
  if (async_on) async.Setup();
  if (pools_on) pools.Setup();
  if (tex_on) textures.Setup();
  for (int i = 0; i < steps; ++i) {
    std::string line = "step " + std::to_string(i);
    if (vmm_on) vmm.Step(i, s, &line);
    if (graphs_on) graphs.Step(i, &line);
    if (async_on) async.Step(i, &line);
    if (pools_on) pools.Step(i, &line);
    if (tex_on) textures.Step(i, &line);
    printf("%s\n", line.c_str());
    fflush(stdout);
    if (pause_ms > 0) usleep(pause_ms * 1000);
  }
  if (async_on) async.Teardown();  // (its allocations of steps 6-9 came from `mine`)
  if (pools_on) pools.Teardown();
  if (tex_on) textures.Teardown();
  if (graphs_on) graphs.Teardown();
  if (vmm_on) vmm.Teardown();
  CK(cudaStreamDestroy(s));
  e2e::Pass();
  return 0;
}
