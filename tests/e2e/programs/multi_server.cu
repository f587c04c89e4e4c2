// multi_server: the GPUs of two servers seen by one process as one ordinal list
// (FLYT_SERVER "A,B"; docs/architecture.md §8.4), used as a local machine with
// two GPUs without P2P is used: enumerate (distinct PCI bus ids that
// cudaDeviceGetByPCIBusId finds again), peer capability and P2P attributes 0
// and enabling peer access cudaErrorPeerAccessUnsupported, memory on each
// device at distinct addresses, host copies to and from each, a kernel
// launched on each (flyt_sim_affine, which the sim models), per-device streams
// and events (elapsed time, a stream waiting for the other device's event),
// calls naming the other device's stream, event and memory while this device
// is current, and copies between the two devices both ways: cudaMemcpyPeer,
// cudaMemcpyPeerAsync and cudaMemcpy/cudaMemcpyAsync with cudaMemcpyDefault,
// at odd sizes and offsets (3 MiB + 4099 B crosses the servers' 8 MiB chunk
// only with the larger size below), all checked byte for byte.
//
// Natively on a machine with two GPUs with P2P the peer answers differ; the
// program is for Flyt's two servers (or two GPUs without P2P). Prints
// "key=value" lines, then "multi_server: PASS".
//
// `multi_server three`: a server with two GPUs, then one with one: ordinals
// 0 and 1 are the first server's (peers of each other, peer access enabled and
// a peer copy through the driver's path), 2 the second's (no peer of either),
// and a copy from 1 to 2 and back goes between the servers.
//
// `multi_server managed`: managed memory on each server's GPU (distinct
// addresses even where two servers' drivers hand out the same ones): host
// writes read by device 1's kernel, its results and a memset read by the host
// after the stream's sync, device 0's memory undisturbed, copies between the
// two servers' managed memory both ways; on device 1 advice, prefetches to it
// and back to the host, range attributes in the process's ordinals, stream
// attachment; a location on the other server's GPU refused with
// cudaErrorNotSupported (logged once) and the process goes on.
//
// `multi_server tls`: servers reached over tls://: copies between them are
// refused with cudaErrorNotSupported, each GPU goes on working.
//
// `multi_server later`: calls once refused for the second server's GPU, there:
// the JIT linker (a state made with device 1 current, completed and destroyed
// with device 0 current, its cubin loaded on device 1 and its kernel
// launched), graphs built by hand on device 1 (memset, memcpy, kernel, host and
// empty nodes, their list, types, dependencies, roots and kernel parameters;
// a child graph, event nodes, edges added and removed, a clone, nodes destroyed;
// set again, instantiated and launched: the copies (one from host memory) and
// the memset checked byte for byte, the host node ran once; a node of device 0's graph as a
// dependency is refused), TMA descriptors of device 1's memory (with either device current: the
// same descriptor), stream capture on device 1 (status, id, graph and dependencies asked while it
// runs, a node added by hand made the next dependency, capture into a given graph; launched and
// checked), virtual memory on device 1 (reserved, created, mapped, made accessible, copies, a
// memset and a kernel through it, its handle retained, exported and imported again), stream
// memory operations on a stream of device 1, an IPC event of device 1 opened by a child process,
// and 2D/3D copies between the two devices' memory both ways (pitched, odd widths and heights,
// offsets; packed rows; a 3D box), all checked byte for byte. Arguments naming both servers (a
// node, graph, mapping, access or address of device 0) are refused.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "e2e_driver.h"
#include "e2e_vmm.h"

__global__ void flyt_sim_affine(const unsigned* in, unsigned* out, unsigned long long n,
                                unsigned mul, unsigned add) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<unsigned long long>(gridDim.x) * blockDim.x)
    out[i] = in[i] * mul + add;
}

__device__ unsigned char g_sym[4099];  // one per device, as natively

namespace {

constexpr size_t kBytes = (3 << 20) + 4099;
constexpr size_t kLarge = (17 << 20) + 12345;  // more than two 8 MiB chunks

// Copies n bytes at `off` from device `from` (src) to device `to` (dst) in one
// of four ways, with device `current` current, and checks them.
void Across(int way, int from, int to, int current, char* src, char* dst, size_t off, size_t n,
            cudaStream_t stream, uint32_t seed) {
  std::vector<unsigned char> in(n), out(n, 0);
  e2e::Fill(in.data(), n, seed);
  CK(cudaSetDevice(from));
  CK(cudaMemcpy(src + off, in.data(), n, cudaMemcpyHostToDevice));
  CK(cudaSetDevice(current));
  switch (way) {
    case 0:
      CK(cudaMemcpyPeer(dst + off, to, src + off, from, n));
      break;
    case 1:
      CK(cudaMemcpyPeerAsync(dst + off, to, src + off, from, n, stream));
      CK(cudaStreamSynchronize(stream));
      break;
    case 2:
      CK(cudaMemcpy(dst + off, src + off, n, cudaMemcpyDefault));
      break;
    default:
      CK(cudaMemcpyAsync(dst + off, src + off, n, cudaMemcpyDeviceToDevice, stream));
      CK(cudaStreamSynchronize(stream));
      break;
  }
  CK(cudaSetDevice(to));
  CK(cudaMemcpy(out.data(), dst + off, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), in.data(), n, "copy between the servers");
}

}  // namespace

int Three() {
  e2e::Step("three devices");
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  printf("device_count=%d\n", count);
  EXPECT(count == 3, "expected 3 devices, found %d", count);
  int can[3][3] = {};
  for (int x = 0; x < 3; ++x)
    for (int y = 0; y < 3; ++y)
      if (x != y) CK(cudaDeviceCanAccessPeer(&can[x][y], x, y));
  printf("can_access.0_1=%d\ncan_access.1_0=%d\ncan_access.0_2=%d\ncan_access.2_1=%d\n", can[0][1],
         can[1][0], can[0][2], can[2][1]);
  char* buf[3] = {};
  cudaStream_t stream[3];
  for (int d = 0; d < 3; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaMalloc(&buf[d], kBytes));
    CK(cudaStreamCreate(&stream[d]));
  }
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));  // the same server: the driver's peer path
  EXPECT_ERR(cudaDeviceEnablePeerAccess(2, 0), cudaErrorPeerAccessUnsupported);
  Across(0, 0, 1, 0, buf[0], buf[1], 5, kBytes - 5, stream[1], 77);
  Across(1, 1, 2, 0, buf[1], buf[2], 0, kBytes, stream[2], 78);
  Across(2, 2, 1, 2, buf[2], buf[1], 9, 4099, stream[1], 79);
  Across(3, 2, 0, 1, buf[2], buf[0], 1, kBytes - 1, stream[0], 80);
  printf("copies=ok\n");
  for (int d = 0; d < 3; ++d) {
    CK(cudaFree(buf[d]));
    CK(cudaStreamDestroy(stream[d]));
  }
  e2e::Pass();
  return 0;
}

int Managed() {
  e2e::Step("managed memory on each server's GPU");
  const size_t n = (1 << 20) + 4099;  // odd: the last granule is partial
  const size_t words = n / 4;
  unsigned char* m[2] = {nullptr, nullptr};
  cudaStream_t stream[2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaStreamCreateWithFlags(&stream[d], cudaStreamNonBlocking));
    CK(cudaMallocManaged(&m[d], n));
    // New managed memory reads as zero; the host writes it directly.
    printf("managed%d.fresh_first_not=%lld\n", d, e2e::FirstNot(m[d], 0, n));
    e2e::Fill(m[d], n, 20 + d);
  }
  // Two servers' drivers may hand out the same address; this process shows two.
  printf("managed.distinct=%d\n", m[0] + n <= m[1] || m[1] + n <= m[0] ? 1 : 0);
  for (int d = 0; d < 2; ++d) {
    cudaPointerAttributes pa;
    CK(cudaPointerGetAttributes(&pa, m[d] + 100));
    printf("managed%d.pointer=%s/%d\n", d, pa.type == cudaMemoryTypeManaged ? "managed" : "other",
           pa.device);
  }
  // Device 1's kernel reads the host's writes and writes managed memory the host
  // then reads, while device 0 is current (the kernel names device 1's stream).
  std::vector<unsigned char> want(n);
  e2e::Fill(want.data(), n, 21);
  unsigned* out = nullptr;
  CK(cudaSetDevice(1));
  CK(cudaMallocManaged(&out, words * 4));
  CK(cudaSetDevice(0));
  flyt_sim_affine<<<8, 128, 0, stream[1]>>>(reinterpret_cast<const unsigned*>(m[1]), out, words, 7,
                                            9);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(stream[1]));
  long long bad = -1;
  for (size_t i = 0; i < words && bad < 0; ++i) {
    unsigned in;
    memcpy(&in, want.data() + 4 * i, 4);
    if (out[i] != in * 7 + 9) bad = static_cast<long long>(i);
  }
  printf("managed1.kernel_first_bad=%lld\n", bad);
  // A device write (memset on device 1's stream), a host write to other bytes of
  // the same page meanwhile, then the host sees both after the stream's sync.
  CK(cudaMemsetAsync(m[1] + 4096, 0x5a, 8192, stream[1]));
  m[1][4096 + 8192] = 0x77;
  CK(cudaStreamSynchronize(stream[1]));
  memset(want.data() + 4096, 0x5a, 8192);
  want[4096 + 8192] = 0x77;
  printf("managed1.after_memset_diff=%lld\n", e2e::FirstDiff(m[1], want.data(), n));
  // Device 0's memory was not disturbed by device 1's work.
  std::vector<unsigned char> want0(n);
  e2e::Fill(want0.data(), n, 20);
  printf("managed0.diff=%lld\n", e2e::FirstDiff(m[0], want0.data(), n));
  // Between the two servers' managed memory, both ways (server to server).
  CK(cudaMemcpy(m[0] + 3, m[1] + 5, 300000, cudaMemcpyDefault));
  memcpy(want0.data() + 3, want.data() + 5, 300000);
  printf("managed.copy_1_to_0_diff=%lld\n", e2e::FirstDiff(m[0], want0.data(), n));
  CK(cudaMemcpy(m[1], m[0], n, cudaMemcpyDefault));
  printf("managed.copy_0_to_1_diff=%lld\n", e2e::FirstDiff(m[1], want0.data(), n));

  e2e::Step("advice, prefetch, range attributes, attachment on the second server");
  cudaMemLocation dev1{cudaMemLocationTypeDevice, 1};
  cudaMemLocation dev0{cudaMemLocationTypeDevice, 0};
  cudaMemLocation host{cudaMemLocationTypeHost, 0};
  CK(cudaMemAdvise(m[1], n, cudaMemAdviseSetPreferredLocation, dev1));
  CK(cudaMemPrefetchAsync(m[1], n, dev1, 0, stream[1]));
  CK(cudaMemsetAsync(m[1], 0x11, 64, stream[1]));
  CK(cudaMemPrefetchAsync(m[1], n, host, 0, stream[1]));
  CK(cudaStreamSynchronize(stream[1]));
  memset(want0.data(), 0x11, 64);
  printf("managed1.prefetch_diff=%lld\n", e2e::FirstDiff(m[1], want0.data(), n));
  int attr = -7;
  CK(cudaMemRangeGetAttribute(&attr, sizeof(attr), cudaMemRangeAttributePreferredLocation, m[1],
                              n));
  printf("managed1.range.preferred=%d\n", attr);  // the process's ordinal, not the server's
  int type = -7, id = -7;
  CK(cudaMemRangeGetAttribute(&type, sizeof(type), cudaMemRangeAttributePreferredLocationType, m[1],
                              n));
  CK(cudaMemRangeGetAttribute(&id, sizeof(id), cudaMemRangeAttributePreferredLocationId, m[1], n));
  printf("managed1.range.preferred_loc=%d/%d\n", type, id);
  CK(cudaMemAdvise(m[0], n, cudaMemAdviseSetPreferredLocation, dev0));
  CK(cudaMemRangeGetAttribute(&attr, sizeof(attr), cudaMemRangeAttributePreferredLocation, m[0],
                              n));
  printf("managed0.range.preferred=%d\n", attr);
  CK(cudaStreamAttachMemAsync(stream[1], m[1], 0, cudaMemAttachSingle));
  CK(cudaStreamSynchronize(stream[1]));
  printf("managed1.attach=ok\n");
  // A location on the other server's GPU: that GPU cannot reach the memory, so it
  // is refused (twice, logged once), and the process goes on.
  EXPECT_ERR(cudaMemAdvise(m[1], n, cudaMemAdviseSetAccessedBy, dev0), cudaErrorNotSupported);
  EXPECT_ERR(cudaMemAdvise(m[1], n, cudaMemAdviseSetAccessedBy, dev0), cudaErrorNotSupported);
  EXPECT_ERR(cudaMemPrefetchAsync(m[1], n, dev0, 0, stream[1]), cudaErrorNotSupported);
  printf("managed1.other_gpu=refused\n");

  for (int d = 0; d < 2; ++d) {
    CK(cudaFree(m[d]));
    CK(cudaStreamDestroy(stream[d]));
  }
  CK(cudaFree(out));
  // Memory and a copy on device 1 still work.
  CK(cudaSetDevice(1));
  char* p = nullptr;
  CK(cudaMalloc(&p, 4096));
  std::vector<unsigned char> in(4096), back(4096, 0);
  e2e::Fill(in.data(), in.size(), 5);
  CK(cudaMemcpy(p, in.data(), in.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(back.data(), p, back.size(), cudaMemcpyDeviceToHost));
  EXPECT_SAME(back.data(), in.data(), in.size(), "after a refused call");
  CK(cudaFree(p));
  printf("goes_on=ok\n");
  e2e::Pass();
  return 0;
}

// Over tls:// the servers' own connection would carry the bytes unencrypted:
// copies between them are refused, each GPU works on its own.
int Tls() {
  e2e::Step("tls");
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  printf("device_count=%d\n", count);
  char* buf[2] = {};
  std::vector<unsigned char> in(4099), out(4099, 0);
  e2e::Fill(in.data(), in.size(), 9);
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaMalloc(&buf[d], in.size()));
    CK(cudaMemcpy(buf[d], in.data(), in.size(), cudaMemcpyHostToDevice));
  }
  EXPECT_ERR(cudaMemcpyPeer(buf[1], 1, buf[0], 0, in.size()), cudaErrorNotSupported);
  EXPECT_ERR(cudaMemcpy(buf[0], buf[1], in.size(), cudaMemcpyDefault), cudaErrorNotSupported);
  printf("copies_across=refused\n");
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaMemcpy(out.data(), buf[d], out.size(), cudaMemcpyDeviceToHost));
    EXPECT_SAME(out.data(), in.data(), in.size(), "own device after a refused copy");
    CK(cudaFree(buf[d]));
  }
  printf("own_devices=ok\n");
  e2e::Pass();
  return 0;
}

namespace {

struct LaterDriver {
  e2e::VmmDriver vmm;  // the VMM calls (e2e_vmm.h)
  decltype(&::cuLinkCreate_v2) link_create;
  decltype(&::cuLinkAddData_v2) link_add_data;
  decltype(&::cuLinkComplete) link_complete;
  decltype(&::cuLinkDestroy) link_destroy;
  decltype(&::cuModuleLoadData) module_load;
  decltype(&::cuModuleUnload) module_unload;
  decltype(&::cuModuleGetFunction) module_function;
  decltype(&::cuLaunchKernel) launch;
  decltype(&::cuTensorMapEncodeTiled) encode_tiled;
  decltype(&::cuTensorMapReplaceAddress) replace_address;
  decltype(&::cuGraphKernelNodeGetParams) kernel_node_params;
  decltype(&::cuOccupancyMaxActiveClusters) max_active_clusters;
  decltype(&::cuStreamWriteValue32_v2) write32;
  decltype(&::cuStreamWaitValue32_v2) wait32;
  decltype(&::cuStreamBatchMemOp_v2) batch;
  decltype(&::cuStreamBeginCaptureToGraph) capture_to_graph;
  CUresult (*write32_v1)(CUstream, CUdeviceptr, cuuint32_t, unsigned);  // the pre-11.7 ABI
  CUresult (*batch_v1)(CUstream, unsigned, CUstreamBatchMemOpParams_v1*, unsigned);
};

void LaterLink(const LaterDriver& cu, unsigned* buf1) {
  e2e::Step("the JIT linker on device 1");
  CK(cudaSetDevice(1));
  CK(cudaFree(nullptr));
  char info[1024] = {}, error[1024] = {};
  CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* vals[] = {info, reinterpret_cast<void*>(sizeof(info)), error,
                  reinterpret_cast<void*>(sizeof(error))};
  CUlinkState state = nullptr;
  CU(cu.link_create(4, opts, vals, &state));
  CU(cu.link_add_data(state, CU_JIT_INPUT_PTX, const_cast<char*>(e2e::kAddOnePtx),
                      sizeof(e2e::kAddOnePtx), "add_one.ptx", 0, nullptr, nullptr));
  CK(cudaSetDevice(0));  // the state stays the second server's
  void* cubin = nullptr;
  size_t cubin_size = 0;
  CU(cu.link_complete(state, &cubin, &cubin_size));
  EXPECT(cubin != nullptr && cubin_size > 0, "cuLinkComplete gave %p, %zu bytes", cubin,
         cubin_size);
  CK(cudaSetDevice(1));
  CUmodule mod = nullptr;
  CU(cu.module_load(&mod, cubin));
  CUfunction f = nullptr;
  CU(cu.module_function(&f, mod, "add_one"));
  unsigned n = 256;
  void* args[] = {&buf1, &n};
  CU(cu.launch(f, 1, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CK(cudaDeviceSynchronize());
  CK(cudaSetDevice(0));
  CU(cu.link_destroy(state));
  EXPECT_CU(cu.link_destroy(state), CUDA_ERROR_INVALID_HANDLE);
  CK(cudaSetDevice(1));
  CU(cu.module_unload(mod));
  printf("link_on_second=ok\n");
}

std::atomic<int> g_host_node_runs{0};

void LaterGraph(const LaterDriver& cu, char* src1, char* dst1, size_t n) {
  e2e::Step("graphs built by hand on device 1");
  CK(cudaSetDevice(1));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  std::vector<unsigned char> in(n), out(n, 0);
  e2e::Fill(in.data(), n, 4242);
  CK(cudaMemcpy(src1, in.data(), n, cudaMemcpyHostToDevice));
  cudaGraph_t g = nullptr;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t ms = nullptr, cp = nullptr, kn = nullptr, host = nullptr, empty = nullptr;
  cudaMemsetParams mp{};
  mp.dst = dst1 + n;  // the second half: set to 0x5a
  mp.value = 0x5a;
  mp.elementSize = 1;
  mp.width = n;
  mp.height = 1;
  CK(cudaGraphAddMemsetNode(&ms, g, nullptr, 0, &mp));
  CK(cudaGraphAddMemcpyNode1D(&cp, g, &ms, 1, dst1, src1, n, cudaMemcpyDeviceToDevice));
  unsigned* words = reinterpret_cast<unsigned*>(src1);
  unsigned long long count = 16;
  unsigned mul = 3, add = 1;
  void* kargs[] = {&words, &words, &count, &mul, &add};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(flyt_sim_affine);
  kp.gridDim = dim3(2, 1, 1);
  kp.blockDim = dim3(64, 1, 1);
  kp.kernelParams = kargs;
  CK(cudaGraphAddKernelNode(&kn, g, &cp, 1, &kp));
  cudaHostNodeParams hp{};
  hp.fn = [](void*) { g_host_node_runs.fetch_add(1); };
  CK(cudaGraphAddHostNode(&host, g, &kn, 1, &hp));
  CK(cudaGraphAddEmptyNode(&empty, g, &host, 1));
  // Host memory in a graph of device 1: its server reads it over its own channel.
  std::vector<unsigned char> from_host(n);
  e2e::Fill(from_host.data(), n, 4343);
  cudaGraphNode_t up = nullptr;
  CK(cudaGraphAddMemcpyNode1D(&up, g, &empty, 1, src1 + n, from_host.data(), n,
                              cudaMemcpyHostToDevice));
  size_t count_nodes = 0;
  CK(cudaGraphGetNodes(g, nullptr, &count_nodes));
  EXPECT(count_nodes == 6, "%zu nodes", count_nodes);
  cudaGraphNode_t nodes[6] = {};
  CK(cudaGraphGetNodes(g, nodes, &count_nodes));
  int kinds = 0;
  for (auto node : nodes) {
    cudaGraphNodeType t{};
    CK(cudaGraphNodeGetType(node, &t));
    kinds |= 1 << static_cast<int>(t);
  }
  const int want = 1 << cudaGraphNodeTypeKernel | 1 << cudaGraphNodeTypeMemcpy |
                   1 << cudaGraphNodeTypeMemset | 1 << cudaGraphNodeTypeHost |
                   1 << cudaGraphNodeTypeEmpty;
  EXPECT(kinds == want, "node types %#x, want %#x", kinds, want);
  cudaGraphNode_t dep = nullptr;
  size_t ndep = 1;
  CK(cudaGraphNodeGetDependencies(kn, &dep, nullptr, &ndep));
  EXPECT(ndep == 1 && dep == cp, "the kernel node's dependency: %zu, %p", ndep,
         static_cast<void*>(dep));
  cudaGraphNode_t root = nullptr;
  size_t nroot = 1;
  CK(cudaGraphGetRootNodes(g, &root, &nroot));
  EXPECT(nroot == 1 && root == ms, "roots: %zu, %p", nroot, static_cast<void*>(root));
  kp.gridDim = dim3(3, 1, 1);
  CK(cudaGraphKernelNodeSetParams(kn, &kp));
  CUDA_KERNEL_NODE_PARAMS got{};
  CK(cudaSetDevice(0));  // the node's server answers whichever device is current
  CU(cu.kernel_node_params(reinterpret_cast<CUgraphNode>(kn), &got));
  EXPECT(got.gridDimX == 3 && got.blockDimX == 64 && got.sharedMemBytes == 0,
         "kernel node params: grid %u block %u", got.gridDimX, got.blockDimX);
  CK(cudaSetDevice(1));
  // Child graph, event nodes, edges, clones and a node destroyed, on device 1.
  {
    cudaGraph_t child = nullptr, clone = nullptr;
    cudaGraphNode_t ce = nullptr, cn = nullptr, rec = nullptr, wait = nullptr, found = nullptr;
    cudaEvent_t ev;
    CK(cudaEventCreate(&ev));
    CK(cudaGraphCreate(&child, 0));
    CK(cudaGraphAddEmptyNode(&ce, child, nullptr, 0));
    CK(cudaGraphAddChildGraphNode(&cn, g, &up, 1, child));
    cudaGraph_t got_child = nullptr;
    CK(cudaGraphChildGraphNodeGetGraph(cn, &got_child));
    size_t child_nodes = 0;
    CK(cudaGraphGetNodes(got_child, nullptr, &child_nodes));
    EXPECT(child_nodes == 1, "the child graph has %zu nodes", child_nodes);
    CK(cudaGraphAddEventRecordNode(&rec, g, &cn, 1, ev));
    CK(cudaGraphAddEventWaitNode(&wait, g, nullptr, 0, ev));
    cudaEvent_t got_ev = nullptr;
    CK(cudaGraphEventRecordNodeGetEvent(rec, &got_ev));
    EXPECT(got_ev == ev, "the event record node's event");
    CK(cudaGraphAddDependencies(g, &rec, &wait, nullptr, 1));
    size_t nout = 0;
    CK(cudaGraphNodeGetDependentNodes(rec, nullptr, nullptr, &nout));
    EXPECT(nout == 1, "the record node has %zu dependents", nout);
    CK(cudaGraphRemoveDependencies(g, &rec, &wait, nullptr, 1));
    CK(cudaGraphNodeGetDependentNodes(rec, nullptr, nullptr, &nout));
    EXPECT(nout == 0, "the record node has %zu dependents after removal", nout);
    CK(cudaGraphClone(&clone, g));
    CK(cudaGraphNodeFindInClone(&found, kn, clone));
    cudaGraphNodeType t{};
    CK(cudaGraphNodeGetType(found, &t));
    EXPECT(t == cudaGraphNodeTypeKernel, "the clone's kernel node has type %d", t);
    CK(cudaGraphDestroy(clone));
    CK(cudaGraphDestroyNode(wait));
    CK(cudaGraphDestroyNode(rec));
    CK(cudaGraphDestroyNode(cn));
    CK(cudaGraphDestroy(child));
    CK(cudaEventDestroy(ev));
    size_t left = 0;
    CK(cudaGraphGetNodes(g, nullptr, &left));
    EXPECT(left == 6, "%zu nodes left", left);
  }
  printf("graph_nodes_on_second=ok\n");
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, g, 0));
  CK(cudaGraphLaunch(exec, stream));
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(out.data(), dst1, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), in.data(), n, "the graph's copy");
  CK(cudaMemcpy(out.data(), dst1 + n, n, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(out.data(), static_cast<unsigned char>(0x5a), n) < 0, "the graph's memset");
  EXPECT(g_host_node_runs.load() == 1, "the host node ran %d times", g_host_node_runs.load());
  CK(cudaMemcpy(out.data(), src1 + n, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), from_host.data(), n, "the graph's copy from host memory");
  printf("graph_launch_on_second=ok\n");
  // A node of device 0's graph as a dependency: two servers in one graph.
  CK(cudaSetDevice(0));
  cudaGraph_t g0 = nullptr;
  cudaGraphNode_t e0 = nullptr, mixed = nullptr;
  CK(cudaGraphCreate(&g0, 0));
  CK(cudaGraphAddEmptyNode(&e0, g0, nullptr, 0));
  EXPECT_ERR(cudaGraphAddEmptyNode(&mixed, g, &e0, 1), cudaErrorNotSupported);
  CK(cudaGraphDestroy(g0));
  printf("graph_two_servers=refused\n");
  CK(cudaSetDevice(1));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(stream));
}

void LaterTensorMap(const LaterDriver& cu, char* buf1, char* other1) {
  e2e::Step("TMA descriptors of device 1's memory");
  cuuint64_t dims[2] = {64, 32};
  cuuint64_t strides[1] = {64 * 4};
  cuuint32_t box[2] = {16, 8};
  cuuint32_t elem[2] = {1, 1};
  CUtensorMap maps[2];
  for (int current = 1; current >= 0; --current) {
    CK(cudaSetDevice(current));
    CU(cu.encode_tiled(&maps[current], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, buf1, dims, strides, box,
                       elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                       CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  }
  EXPECT(memcmp(&maps[0], &maps[1], sizeof(maps[0])) == 0,
         "device 1's descriptor differs with device 0 current");
  CK(cudaSetDevice(1));
  CU(cu.replace_address(&maps[1], other1));
  printf("tensor_map_on_second=ok\n");
}

// Stream capture on device 1, as torch.cuda.graph does it on cuda:1: the capture's
// status, id and dependencies asked while it runs, a node added to the capture's graph by
// hand and made the next dependency (the graphConditionalNodes sample's way), then the
// graph ended, instantiated and launched, its results checked byte for byte. A capture on
// device 0 at the same time has another id; device 0's node as a dependency is refused.
void LaterCapture(char* a1, char* b1, size_t n) {
  e2e::Step("stream capture on device 1");
  std::vector<unsigned char> out(n, 0);
  CK(cudaSetDevice(0));
  cudaStream_t s0;
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  char* z0 = nullptr;
  CK(cudaMalloc(&z0, n));
  cudaGraph_t other0 = nullptr;
  cudaGraphNode_t node0 = nullptr;
  CK(cudaGraphCreate(&other0, 0));
  CK(cudaGraphAddEmptyNode(&node0, other0, nullptr, 0));
  CK(cudaSetDevice(1));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char* c1 = nullptr;
  CK(cudaMalloc(&c1, n));
  CK(cudaMemset(c1, 0, n));
  CK(cudaDeviceSynchronize());
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
  CK(cudaStreamGetCaptureInfo(s, &st));
  EXPECT(st == cudaStreamCaptureStatusNone, "status %d before the capture", static_cast<int>(st));

  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeGlobal));  // device 0's at the same time
  CK(cudaMemsetAsync(a1, 0x11, n, s));
  CK(cudaMemsetAsync(z0, 0x33, n, s0));
  unsigned long long id = 0, id0 = 0;
  cudaGraph_t captured = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t ndeps = 0;
  CK(cudaStreamGetCaptureInfo(s, &st, &id, &captured, &deps, &edges, &ndeps));
  EXPECT(st == cudaStreamCaptureStatusActive && id != 0 && captured != nullptr && ndeps == 1 &&
             deps != nullptr,
         "capture info: status %d id %llu graph %p, %zu dependencies", static_cast<int>(st), id,
         static_cast<void*>(captured), ndeps);
  CK(cudaStreamGetCaptureInfo(s0, &st, &id0));
  EXPECT(st == cudaStreamCaptureStatusActive && id0 != 0 && id0 != id,
         "device 0's capture: status %d id %llu (device 1's %llu)", static_cast<int>(st), id0, id);
  cudaStreamCaptureStatus is = cudaStreamCaptureStatusNone;
  CK(cudaStreamIsCapturing(s, &is));
  EXPECT(is == cudaStreamCaptureStatusActive, "cudaStreamIsCapturing: %d", static_cast<int>(is));
  const cudaGraphNode_t first = deps[0];
  cudaGraphNodeType type{};
  CK(cudaGraphNodeGetType(first, &type));
  EXPECT(type == cudaGraphNodeTypeMemset, "the captured node's type %d", static_cast<int>(type));
  // A node added by hand after the captured memset, then the capture's only dependency.
  cudaMemsetParams mp{};
  mp.dst = b1;
  mp.value = 0x22;
  mp.elementSize = 1;
  mp.width = n;
  mp.height = 1;
  cudaGraphNode_t added = nullptr;
  CK(cudaGraphAddMemsetNode(&added, captured, &first, 1, &mp));
  EXPECT_ERR(
      cudaStreamUpdateCaptureDependencies(s, &node0, nullptr, 1, cudaStreamSetCaptureDependencies),
      cudaErrorNotSupported);  // device 0's node: two servers in one graph
  CK(cudaStreamUpdateCaptureDependencies(s, &added, nullptr, 1, cudaStreamSetCaptureDependencies));
  CK(cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &deps, nullptr, &ndeps));
  EXPECT(ndeps == 1 && deps[0] == added, "after the update: %zu dependencies", ndeps);
  CK(cudaMemcpyAsync(c1, b1, n, cudaMemcpyDeviceToDevice, s));  // after the node added
  CK(cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &deps, nullptr, &ndeps));
  EXPECT(ndeps == 1 && deps[0] != added, "after the copy: %zu dependencies", ndeps);
  cudaGraph_t g = nullptr, g0 = nullptr;
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaStreamEndCapture(s0, &g0));
  CK(cudaStreamGetCaptureInfo(s, &st, &id));
  EXPECT(st == cudaStreamCaptureStatusNone, "status %d after the capture", static_cast<int>(st));
  size_t nodes = 0;
  CK(cudaGraphGetNodes(g, nullptr, &nodes));
  EXPECT(nodes == 3, "the captured graph has %zu nodes", nodes);
  printf("capture_info_on_second=ok\n");
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, g, 0));
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(out.data(), a1, n, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(out.data(), static_cast<unsigned char>(0x11), n) < 0, "the captured memset");
  CK(cudaMemcpy(out.data(), c1, n, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(out.data(), static_cast<unsigned char>(0x22), n) < 0,
         "the copy after the node added by hand");
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(c1));
  CK(cudaStreamDestroy(s));
  CK(cudaSetDevice(0));
  CK(cudaGraphInstantiate(&exec, g0, 0));
  CK(cudaGraphLaunch(exec, s0));
  CK(cudaStreamSynchronize(s0));
  CK(cudaMemcpy(out.data(), z0, n, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(out.data(), static_cast<unsigned char>(0x33), n) < 0,
         "device 0's captured memset");
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g0));
  CK(cudaGraphDestroy(other0));
  CK(cudaFree(z0));
  CK(cudaStreamDestroy(s0));
  printf("capture_launch_on_second=ok\n");
}

// cuStreamBeginCaptureToGraph on a stream of device 1: work captured after a node of
// device 1's graph (asked with device 0 current: the stream says where), the graph
// launched and the copy checked; device 0's graph is refused.
void LaterCaptureToGraph(const LaterDriver& cu, char* a1, char* b1, size_t n) {
  e2e::Step("capture into a graph of device 1");
  CK(cudaSetDevice(0));
  cudaGraph_t g0 = nullptr;
  CK(cudaGraphCreate(&g0, 0));
  CK(cudaSetDevice(1));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const CUstream cs = reinterpret_cast<CUstream>(s);
  cudaGraph_t g = nullptr;
  CK(cudaGraphCreate(&g, 0));
  cudaMemsetParams mp{};
  mp.dst = a1;
  mp.value = 0x44;
  mp.elementSize = 1;
  mp.width = n;
  mp.height = 1;
  cudaGraphNode_t root = nullptr;
  CK(cudaGraphAddMemsetNode(&root, g, nullptr, 0, &mp));
  EXPECT_CU(cu.capture_to_graph(cs, reinterpret_cast<CUgraph>(g0), nullptr, nullptr, 0,
                                CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_ERROR_NOT_SUPPORTED);  // device 0's graph
  CUgraphNode deps_in[] = {reinterpret_cast<CUgraphNode>(root)};
  CU(cu.capture_to_graph(cs, reinterpret_cast<CUgraph>(g), deps_in, nullptr, 1,
                         CU_STREAM_CAPTURE_MODE_GLOBAL));
  CK(cudaSetDevice(0));
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaGraph_t captured = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t ndeps = 0;
  CK(cudaStreamGetCaptureInfo(s, &st, nullptr, &captured, &deps, nullptr, &ndeps));
  EXPECT(st == cudaStreamCaptureStatusActive && captured == g && ndeps == 1 && deps[0] == root,
         "capture into a graph: status %d, graph %p (want %p), %zu dependencies",
         static_cast<int>(st), static_cast<void*>(captured), static_cast<void*>(g), ndeps);
  CK(cudaSetDevice(1));
  CK(cudaMemcpyAsync(b1, a1, n, cudaMemcpyDeviceToDevice, s));  // after the memset node
  cudaGraph_t ended = nullptr;
  CK(cudaStreamEndCapture(s, &ended));
  EXPECT(ended == g, "cudaStreamEndCapture gave %p, want %p", static_cast<void*>(ended),
         static_cast<void*>(g));
  size_t nodes = 0;
  CK(cudaGraphGetNodes(g, nullptr, &nodes));
  EXPECT(nodes == 2, "the graph has %zu nodes", nodes);
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, g, 0));
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  std::vector<unsigned char> out(n, 0);
  CK(cudaMemcpy(out.data(), b1, n, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(out.data(), static_cast<unsigned char>(0x44), n) < 0,
         "the copy captured after the memset node");
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  CK(cudaSetDevice(0));
  CK(cudaGraphDestroy(g0));
  CK(cudaSetDevice(1));
  printf("capture_to_graph_on_second=ok\n");
}

// Virtual memory on device 1, as PyTorch's expandable segments use it: granularity,
// a reservation, physical memory mapped and made accessible, copies, a memset and a
// kernel through it (with device 0 current too: the reservation says where it goes), a
// copy from it to device 0, its handle retained and its properties, a shareable handle
// exported and imported again, then all unmapped and released. Device 0's memory in
// device 1's reservation and device 0's access to it are refused.
void LaterVmm(const LaterDriver& cu, char* buf0) {
  e2e::Step("virtual memory on device 1");
  CK(cudaSetDevice(1));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 1;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CU(cu.vmm.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT(gran > 0, "granularity %zu", gran);
  const size_t size = 2 * gran;
  CUdeviceptr va = 0;
  CU(cu.vmm.reserve(&va, size, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0, h0 = 0;
  CU(cu.vmm.create(&h, size, &prop, 0));
  CUmemAllocationProp got{};
  CU(cu.vmm.properties(&got, h));
  EXPECT(got.location.type == CU_MEM_LOCATION_TYPE_DEVICE && got.location.id == 1,
         "the allocation's location: type %d id %d", static_cast<int>(got.location.type),
         got.location.id);
  // Device 0's memory in device 1's reservation: two servers.
  CUmemAllocationProp prop0 = prop;
  prop0.location.id = 0;
  prop0.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  CK(cudaSetDevice(0));
  CU(cu.vmm.create(&h0, gran, &prop0, 0));
  EXPECT_CU(cu.vmm.map(va, gran, 0, h0, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU(cu.vmm.release(h0));
  CU(cu.vmm.map(va, size, 0, h, 0));  // with device 0 current: the handle's server
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_CU(cu.vmm.set_access(va, size, &desc, 1), CUDA_ERROR_NOT_SUPPORTED);
  desc.location.id = 1;
  CU(cu.vmm.set_access(va, size, &desc, 1));
  unsigned long long access = 0;
  CU(cu.vmm.get_access(&access, &desc.location, va + gran));
  EXPECT(access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access %llu", access);
  cudaPointerAttributes pa{};
  CK(cudaPointerGetAttributes(&pa, reinterpret_cast<void*>(va + gran + 1)));  // device 0 current
  EXPECT(pa.type == cudaMemoryTypeDevice && pa.device == 1, "device 1's mapping: type %d device %d",
         static_cast<int>(pa.type), pa.device);
  printf("vmm_map_on_second=ok\n");

  // Bytes through it, device 0 current; then a kernel on device 1 over it.
  const size_t n = gran + 4099;  // across a granule
  std::vector<unsigned char> in(n), out(n, 0);
  e2e::Fill(in.data(), n, 515);
  char* p = reinterpret_cast<char*>(va);
  CK(cudaMemcpy(p + 3, in.data(), n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(out.data(), p + 3, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), in.data(), n, "bytes through device 1's mapping");
  CK(cudaMemset(p + size - 4096, 0x7e, 4096));
  CK(cudaMemcpy(out.data(), p + size - 4096, 4096, cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(out.data(), static_cast<unsigned char>(0x7e), 4096) < 0,
         "a memset of device 1's mapping");
  CK(cudaMemcpy(buf0, p + 3, 4099, cudaMemcpyDefault));  // to device 0, server to server
  CK(cudaMemcpy(out.data(), buf0, 4099, cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), in.data(), 4099, "device 1's mapping copied to device 0");
  CK(cudaSetDevice(1));
  const unsigned long long words = 1000;
  std::vector<unsigned> win(words), wout(words, 0);
  for (unsigned i = 0; i < words; ++i) win[i] = i * 7 + 1;
  unsigned* u = reinterpret_cast<unsigned*>(va);
  CK(cudaMemcpy(u, win.data(), words * 4, cudaMemcpyHostToDevice));
  flyt_sim_affine<<<4, 64>>>(u, u + words, words, 5, 3);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(wout.data(), u + words, words * 4, cudaMemcpyDeviceToHost));
  for (unsigned i = 0; i < words; ++i)
    EXPECT(wout[i] == win[i] * 5 + 3, "word %u: %u, want %u", i, wout[i], win[i] * 5 + 3);
  printf("vmm_data_on_second=ok\n");

  // The handle behind an address, and a shareable handle imported again.
  CK(cudaSetDevice(0));
  CUmemGenericAllocationHandle again = 0;
  CU(cu.vmm.retain(&again, reinterpret_cast<void*>(va + gran + 5)));
  EXPECT(again == h, "cuMemRetainAllocationHandle gave %llu, want %llu", again, h);
  CU(cu.vmm.release(again));
  int fd = -1;
  CU(cu.vmm.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle imported = 0;
  CU(cu.vmm.import_handle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CK(cudaSetDevice(1));
  CUdeviceptr va2 = 0;
  CU(cu.vmm.reserve(&va2, size, 0, 0, 0));
  CU(cu.vmm.map(va2, size, 0, imported, 0));
  CU(cu.vmm.set_access(va2, size, &desc, 1));
  std::vector<unsigned char> whole(size), whole2(size, 0);
  CK(cudaMemcpy(whole.data(), p, size, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(whole2.data(), reinterpret_cast<char*>(va2), size, cudaMemcpyDeviceToHost));
  EXPECT_SAME(whole2.data(), whole.data(), size, "the imported handle's mapping");
  CK(cudaPointerGetAttributes(&pa, reinterpret_cast<void*>(va2)));
  EXPECT(pa.type == cudaMemoryTypeDevice && pa.device == 1,
         "the imported handle's mapping: type %d device %d", static_cast<int>(pa.type), pa.device);
  EXPECT_SAME(whole2.data() + 8000, in.data() + 7997, n - 7997, "the imported handle's bytes");
  CU(cu.vmm.unmap(va2, size));
  CU(cu.vmm.address_free(va2, size));
  CU(cu.vmm.release(imported));
  printf("vmm_handles_on_second=ok\n");
  CK(cudaSetDevice(0));  // undone with device 0 current: the range's and handle's server
  CU(cu.vmm.unmap(va, size));
  CU(cu.vmm.release(h));
  CU(cu.vmm.address_free(va, size));
  CK(cudaSetDevice(1));
  CK(cudaDeviceSynchronize());
}

// Stream memory operations on a stream of device 1: a write and a wait as single calls
// and as one batch (also in the pre-11.7 ABI), the values checked; an address of device
// 0 is refused.
void LaterMemOps(const LaterDriver& cu, unsigned* flag1, unsigned* flag0) {
  e2e::Step("stream memory operations on device 1");
  CK(cudaSetDevice(1));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMemset(flag1, 0, 16));
  CK(cudaDeviceSynchronize());
  const CUstream cs = reinterpret_cast<CUstream>(s);
  const CUdeviceptr f = reinterpret_cast<CUdeviceptr>(flag1);
  CU(cu.write32(cs, f, 41, 0));
  CU(cu.wait32(cs, f, 41, CU_STREAM_WAIT_VALUE_EQ));
  CUstreamBatchMemOpParams ops[2];
  memset(ops, 0, sizeof(ops));
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = f + 4;
  ops[0].writeValue.value = 0xabcd1234u;
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = f + 4;
  ops[1].waitValue.value = 0xabcd1234u;
  ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  CK(cudaSetDevice(0));  // the stream says where the batch goes
  CU(cu.batch(cs, 2, ops, 0));
  CK(cudaStreamSynchronize(s));
  unsigned got[2] = {0, 0};
  CK(cudaMemcpy(got, flag1, sizeof(got), cudaMemcpyDeviceToHost));
  EXPECT(got[0] == 41 && got[1] == 0xabcd1234u, "the values written: %u, %#x", got[0], got[1]);
  // The pre-11.7 ABI, as binaries built with older toolkits call it, where the GPU
  // offers it (CAN_USE_STREAM_MEM_OPS_V1: the sim does, recent drivers do not unless
  // the module is loaded with NVreg_EnableStreamMemOPs=1, and refuse the calls).
  int v1_ok = 0;
  CK(cudaDeviceGetAttribute(
      &v1_ok, static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1), 1));
  if (v1_ok != 0) {
    CU(cu.write32_v1(cs, f + 8, 77, 0));
    ops[1].waitValue.address = f + 8;
    ops[1].waitValue.value = 77;
    CU(cu.batch_v1(cs, 1, &ops[1], 0));
    CK(cudaStreamSynchronize(s));
    unsigned v1 = 0;
    CK(cudaMemcpy(&v1, flag1 + 2, sizeof(v1), cudaMemcpyDeviceToHost));
    EXPECT(v1 == 77, "the value the pre-11.7 ABI wrote: %u", v1);
  } else {
    EXPECT_CU(cu.write32_v1(cs, f + 8, 77, 0), CUDA_ERROR_NOT_SUPPORTED);
  }
  printf("stream_memops_v1_on_second=%s\n", v1_ok != 0 ? "ok" : "refused as the GPU says");
  ops[0].writeValue.address = reinterpret_cast<CUdeviceptr>(flag0);  // device 0's memory
  EXPECT_CU(cu.batch(cs, 1, ops, 0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_CU(cu.write32_v1(cs, reinterpret_cast<CUdeviceptr>(flag0), 1, 0),
            CUDA_ERROR_NOT_SUPPORTED);
  CK(cudaSetDevice(1));
  CK(cudaStreamDestroy(s));
  printf("stream_memops_on_second=ok\n");
}

// CUDA IPC on device 1 with another process of the same server list (itself again,
// `later_ipc_child`): an interprocess event of device 1, its handle got with device 0
// current (the event's server answers), opened by the child with device 1 current (so
// that server's: the child records it on a stream of device 1), its own handle refused
// as natively. Memory handles are refused on either device alike: the servers place a
// client's memory apart, and placed memory has no legacy IPC handle.
void FromHex(const char* s, void* out, size_t n) {
  EXPECT(strlen(s) == 2 * n, "a handle argument of %zu hex digits, want %zu", strlen(s), 2 * n);
  auto digit = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  auto* bytes = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i)
    bytes[i] = static_cast<unsigned char>(digit(s[2 * i]) << 4 | digit(s[2 * i + 1]));
}

int LaterIpcChild(const char* event_hex) {
  e2e::Init("multi_server-ipc-child");
  cudaIpcEventHandle_t eh;
  FromHex(event_hex, &eh, sizeof(eh));
  e2e::Step("child: open device 1's event with device 1 current");
  CK(cudaSetDevice(1));
  cudaEvent_t ev;
  CK(cudaIpcOpenEventHandle(&ev, eh));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  char* d = nullptr;
  CK(cudaMalloc(&d, 4096));
  CK(cudaStreamWaitEvent(stream, ev, 0));  // the parent's recording
  CK(cudaMemsetAsync(d, 0x3c, 4096, stream));
  CK(cudaEventRecord(ev, stream));
  CK(cudaSetDevice(0));  // synchronized with device 0 current: the event says where
  CK(cudaEventSynchronize(ev));
  CK(cudaEventQuery(ev));
  std::vector<unsigned char> got(4096);
  CK(cudaMemcpy(got.data(), d, got.size(), cudaMemcpyDeviceToHost));
  EXPECT(e2e::FirstNot(got.data(), static_cast<unsigned char>(0x3c), got.size()) < 0,
         "the child's memset before its recording");
  CK(cudaEventDestroy(ev));
  CK(cudaSetDevice(1));
  CK(cudaStreamDestroy(stream));
  CK(cudaFree(d));
  printf("ipc_child=ok\n");
  fflush(stdout);
  return 0;
}

void LaterIpc(char* buf0, char* buf1) {
  e2e::Step("CUDA IPC on device 1");
  CK(cudaSetDevice(1));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
  CK(cudaEventRecord(ev, s));
  CK(cudaSetDevice(0));
  cudaIpcEventHandle_t eh;
  CK(cudaIpcGetEventHandle(&eh, ev));
  cudaEvent_t own = nullptr;
  EXPECT_ERR(cudaIpcOpenEventHandle(&own, eh), cudaErrorDeviceUninitialized);  // its own
  cudaIpcMemHandle_t mh;
  EXPECT_ERR(cudaIpcGetMemHandle(&mh, buf1), cudaErrorNotSupported);  // placed memory
  EXPECT_ERR(cudaIpcGetMemHandle(&mh, buf0), cudaErrorNotSupported);  // on either device
  std::string event_hex = e2e::Hex(&eh, sizeof(eh));
  fflush(stdout);
  pid_t child = fork();
  EXPECT(child >= 0, "fork failed");
  if (child == 0) {
    char self[] = "/proc/self/exe";
    char arg0[] = "multi_server";
    char mode[] = "later_ipc_child";
    char* args[] = {arg0, mode, event_hex.data(), nullptr};
    execv(self, args);
    _exit(127);
  }
  int status = 0;
  EXPECT(waitpid(child, &status, 0) == child, "waitpid failed");
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status 0x%x)", status);
  CK(cudaEventSynchronize(ev));
  CK(cudaEventQuery(ev));
  CK(cudaSetDevice(1));
  CK(cudaStreamWaitEvent(s, ev, 0));
  CK(cudaStreamSynchronize(s));
  CK(cudaEventDestroy(ev));
  CK(cudaStreamDestroy(s));
  printf("ipc_event_on_second=ok\n");
}

// cudaMemcpy2D / 2DAsync / 3D between device 0's and device 1's memory.
void Later2D(int from, int to, cudaStream_t stream, uint32_t seed) {
  const size_t width = 1001, height = 7, xoff = 3, yoff = 1;
  char* p[2] = {};
  size_t pitch[2] = {};
  for (int d : {from, to}) {
    CK(cudaSetDevice(d));
    CK(cudaMallocPitch(reinterpret_cast<void**>(&p[d]), &pitch[d], width + xoff, height + yoff));
  }
  std::vector<unsigned char> rows(width * height), back(width * height, 0);
  e2e::Fill(rows.data(), rows.size(), seed);
  CK(cudaSetDevice(from));
  char* src = p[from] + yoff * pitch[from] + xoff;
  char* dst = p[to] + yoff * pitch[to] + xoff;
  CK(cudaMemcpy2D(src, pitch[from], rows.data(), width, width, height, cudaMemcpyHostToDevice));
  CK(cudaMemcpy2D(dst, pitch[to], src, pitch[from], width, height, cudaMemcpyDeviceToDevice));
  CK(cudaSetDevice(to));
  CK(cudaMemcpy2D(back.data(), width, dst, pitch[to], width, height, cudaMemcpyDeviceToHost));
  EXPECT_SAME(back.data(), rows.data(), rows.size(), "2D copy between the servers");
  // Asynchronous, on the target's stream, with the default kind.
  e2e::Fill(rows.data(), rows.size(), seed + 1);
  CK(cudaMemcpy2D(src, pitch[from], rows.data(), width, width, height, cudaMemcpyHostToDevice));
  CK(cudaMemcpy2DAsync(dst, pitch[to], src, pitch[from], width - 2, height, cudaMemcpyDefault,
                       stream));
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy2D(back.data(), width, dst, pitch[to], width - 2, height, cudaMemcpyDeviceToHost));
  for (size_t y = 0; y < height; ++y)
    EXPECT_SAME(back.data() + y * width, rows.data() + y * width, width - 2, "2D async row");
  for (int d : {from, to}) {
    CK(cudaSetDevice(d));
    CK(cudaFree(p[d]));
  }
}

int Later() {
  LaterDriver cu{};
  e2e::ResolveDriver("cuLinkCreate", &cu.link_create);
  e2e::ResolveDriver("cuLinkAddData", &cu.link_add_data);
  e2e::ResolveDriver("cuLinkComplete", &cu.link_complete);
  e2e::ResolveDriver("cuLinkDestroy", &cu.link_destroy);
  e2e::ResolveDriver("cuModuleLoadData", &cu.module_load);
  e2e::ResolveDriver("cuModuleUnload", &cu.module_unload);
  e2e::ResolveDriver("cuModuleGetFunction", &cu.module_function);
  e2e::ResolveDriver("cuLaunchKernel", &cu.launch);
  e2e::ResolveDriver("cuTensorMapEncodeTiled", &cu.encode_tiled);
  e2e::ResolveDriver("cuTensorMapReplaceAddress", &cu.replace_address);
  e2e::ResolveDriver("cuGraphKernelNodeGetParams", &cu.kernel_node_params);
  e2e::ResolveDriver("cuOccupancyMaxActiveClusters", &cu.max_active_clusters);
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  e2e::ResolveVmm();
  cu.vmm = e2e::g_vmm;
  e2e::ResolveDriver("cuStreamWriteValue32", &cu.write32);
  e2e::ResolveDriver("cuStreamWaitValue32", &cu.wait32);
  e2e::ResolveDriver("cuStreamBatchMemOp", &cu.batch);
  e2e::ResolveDriver("cuStreamBeginCaptureToGraph", &cu.capture_to_graph);
  e2e::ResolveDriver("cuStreamWriteValue32", &cu.write32_v1, 11000);
  e2e::ResolveDriver("cuStreamBatchMemOp", &cu.batch_v1, 11000);
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  EXPECT(count == 2, "expected 2 devices, found %d", count);
  const size_t n = 64 * 1024 + 7;
  char* buf[2] = {};
  char* other[2] = {};
  cudaStream_t stream[2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaMalloc(&buf[d], 2 * n));
    CK(cudaMalloc(&other[d], 2 * n));
    CK(cudaStreamCreate(&stream[d]));
  }
  LaterLink(cu, reinterpret_cast<unsigned*>(buf[1]));
  LaterGraph(cu, other[1], buf[1], n);
  LaterTensorMap(cu, buf[1], other[1]);
  LaterCapture(buf[1], other[1], n);
  LaterCaptureToGraph(cu, buf[1], other[1], n);
  LaterVmm(cu, buf[0]);
  LaterMemOps(cu, reinterpret_cast<unsigned*>(buf[1]), reinterpret_cast<unsigned*>(buf[0]));
  LaterIpc(buf[0], buf[1]);

  // A kernel the other server loaded first (cudart loaded this program's kernels while
  // device 1 was current), given more than 48 KiB of dynamic shared memory on device 0
  // and launched there: the opt-in holds for that server's copy (cuBLAS's first use of
  // its second GPU does so).
  e2e::Step("dynamic shared memory opt-in on the other server's copy");
  {
    CK(cudaSetDevice(1));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, flyt_sim_affine));
    CK(cudaSetDevice(0));
    const int big = 64 * 1024;
    CK(cudaFuncSetAttribute(flyt_sim_affine, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
    flyt_sim_affine<<<1, 32, big>>>(reinterpret_cast<const unsigned*>(buf[0]),
                                    reinterpret_cast<unsigned*>(other[0]), 0, 1, 0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    // The opt-in is device 0's alone, and reads back there (cudart asks the driver
    // attribute by attribute with the kernel of the server that loaded it first).
    CK(cudaFuncGetAttributes(&fa, flyt_sim_affine));
    EXPECT(fa.maxDynamicSharedSizeBytes == big, "device 0 reads an opt-in of %d, set %d",
           fa.maxDynamicSharedSizeBytes, big);
    CK(cudaSetDevice(1));
    CK(cudaFuncGetAttributes(&fa, flyt_sim_affine));
    EXPECT(fa.maxDynamicSharedSizeBytes < big, "device 1 reads device 0's opt-in (%d)",
           fa.maxDynamicSharedSizeBytes);
    CK(cudaSetDevice(0));
    printf("shared_opt_in_other_copy=ok\n");
  }

  // An occupancy question about device 1's function whose config names a stream of
  // device 0 (cuBLAS asks so with the stream it made on the device it started on): the
  // driver answers for the function; the stream does not matter.
  e2e::Step("cluster occupancy with another device's stream");
  {
    CK(cudaSetDevice(1));
    cudaFunction_t fn = nullptr;
    CK(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(flyt_sim_affine)));
    CUlaunchAttribute attr = {};
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = 1;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg = {};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = reinterpret_cast<CUstream>(stream[0]);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = -1;
    CUresult rc = cu.max_active_clusters(&clusters, reinterpret_cast<CUfunction>(fn), &cfg);
    EXPECT(rc == CUDA_SUCCESS && clusters >= 0, "cuOccupancyMaxActiveClusters: %d, %d",
           static_cast<int>(rc), clusters);
    // The kernel itself where a function is expected (cuBLAS asks so), with the other
    // device current: the answer is for that device's copy.
    cudaKernel_t kernel = nullptr;
    CK(cudaGetKernel(&kernel, flyt_sim_affine));
    for (int d : {0, 1}) {
      CK(cudaSetDevice(d));
      cfg.hStream = nullptr;
      clusters = -1;
      rc = cu.max_active_clusters(&clusters, reinterpret_cast<CUfunction>(kernel), &cfg);
      EXPECT(rc == CUDA_SUCCESS && clusters >= 0,
             "cuOccupancyMaxActiveClusters of the kernel on device %d: %d, %d", d,
             static_cast<int>(rc), clusters);
    }
    printf("occupancy_other_stream=ok\n");
  }

  e2e::Step("2D and 3D copies between the servers");
  Later2D(0, 1, stream[1], 600);
  Later2D(1, 0, stream[0], 700);
  // Packed rows (pitch == width): a slice at a time.
  {
    const size_t width = 333, height = 5;
    std::vector<unsigned char> in(width * height), out(width * height, 0);
    e2e::Fill(in.data(), in.size(), 800);
    CK(cudaSetDevice(1));
    CK(cudaMemcpy(buf[1] + 1, in.data(), in.size(), cudaMemcpyHostToDevice));
    CK(cudaSetDevice(0));
    CK(cudaMemcpy2D(buf[0] + 5, width, buf[1] + 1, width, width, height, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(out.data(), buf[0] + 5, out.size(), cudaMemcpyDeviceToHost));
    EXPECT_SAME(out.data(), in.data(), in.size(), "packed 2D copy between the servers");
  }
  // A 3D box of odd sizes from device 1's pitched volume into device 0's.
  {
    const size_t w = 77, h = 5, depth = 3;
    cudaExtent ext = make_cudaExtent(w + 2, h + 1, depth + 1);
    cudaPitchedPtr vol[2];
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMalloc3D(&vol[d], ext));
    }
    std::vector<unsigned char> in(w * h * depth), out(w * h * depth, 0);
    e2e::Fill(in.data(), in.size(), 900);
    cudaMemcpy3DParms up{};
    up.srcPtr = make_cudaPitchedPtr(in.data(), w, w, h);
    up.dstPtr = vol[1];
    up.dstPos = make_cudaPos(1, 1, 1);
    up.extent = make_cudaExtent(w, h, depth);
    up.kind = cudaMemcpyHostToDevice;
    CK(cudaSetDevice(1));
    CK(cudaMemcpy3D(&up));
    cudaMemcpy3DParms across{};
    across.srcPtr = vol[1];
    across.srcPos = make_cudaPos(1, 1, 1);
    across.dstPtr = vol[0];
    across.dstPos = make_cudaPos(2, 0, 0);
    across.extent = make_cudaExtent(w, h, depth);
    across.kind = cudaMemcpyDeviceToDevice;
    CK(cudaMemcpy3D(&across));
    cudaMemcpy3DParms down{};
    down.srcPtr = vol[0];
    down.srcPos = make_cudaPos(2, 0, 0);
    down.dstPtr = make_cudaPitchedPtr(out.data(), w, w, h);
    down.extent = make_cudaExtent(w, h, depth);
    down.kind = cudaMemcpyDeviceToHost;
    CK(cudaSetDevice(0));
    CK(cudaMemcpy3D(&down));
    EXPECT_SAME(out.data(), in.data(), in.size(), "3D copy between the servers");
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaFree(vol[d].ptr));
    }
  }
  printf("copies_2d_across=ok\n");
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaFree(buf[d]));
    CK(cudaFree(other[d]));
    CK(cudaStreamDestroy(stream[d]));
  }
  e2e::Pass();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("multi_server");
  if (argc > 1 && strcmp(argv[1], "three") == 0) return Three();
  if (argc > 1 && strcmp(argv[1], "managed") == 0) return Managed();
  if (argc > 1 && strcmp(argv[1], "tls") == 0) return Tls();
  if (argc > 1 && strcmp(argv[1], "later") == 0) return Later();
  if (argc == 3 && strcmp(argv[1], "later_ipc_child") == 0) return LaterIpcChild(argv[2]);

  e2e::Step("enumerate");
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  printf("device_count=%d\n", count);
  EXPECT(count == 2, "expected 2 devices, found %d", count);
  char bus[2][32];
  cudaUUID_t uuid[2];
  for (int d = 0; d < 2; ++d) {
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, d));
    uuid[d] = prop.uuid;
    EXPECT(prop.major >= 1 && prop.totalGlobalMem > 0, "device %d has no properties", d);
    CK(cudaDeviceGetPCIBusId(bus[d], sizeof(bus[d]), d));
    int again = -1;
    CK(cudaDeviceGetByPCIBusId(&again, bus[d]));
    EXPECT(again == d, "bus id %s names device %d, not %d", bus[d], again, d);
    printf("device.%d.name=%s\n", d, prop.name);
  }
  printf("bus_ids_distinct=%d\n", strcmp(bus[0], bus[1]) != 0 ? 1 : 0);
  // Two servers on one GPU (or two sims) still show two devices.
  printf("uuids_distinct=%d\n", memcmp(&uuid[0], &uuid[1], sizeof(uuid[0])) != 0 ? 1 : 0);

  e2e::Step("peer capability");
  int can = -1;
  CK(cudaDeviceCanAccessPeer(&can, 0, 1));
  printf("can_access.0_1=%d\n", can);
  CK(cudaDeviceCanAccessPeer(&can, 1, 0));
  printf("can_access.1_0=%d\n", can);
  int attr = -1;
  CK(cudaDeviceGetP2PAttribute(&attr, cudaDevP2PAttrAccessSupported, 0, 1));
  printf("p2p_attr.access=%d\n", attr);
  CK(cudaSetDevice(0));
  EXPECT_ERR(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessUnsupported);
  CK(cudaSetDevice(1));
  EXPECT_ERR(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessUnsupported);
  EXPECT_ERR(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
  printf("enable_peer=refused\n");

  e2e::Step("memory on each device");
  char* buf[2] = {nullptr, nullptr};
  char* large[2] = {nullptr, nullptr};
  cudaStream_t stream[2];
  cudaEvent_t start[2], stop[2];
  size_t free_before[2] = {0, 0}, total[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaMemGetInfo(&free_before[d], &total[d]));
    CK(cudaMalloc(&buf[d], kBytes));
    CK(cudaMalloc(&large[d], kLarge));
    CK(cudaStreamCreate(&stream[d]));
    CK(cudaEventCreate(&start[d]));
    CK(cudaEventCreate(&stop[d]));
  }
  const uintptr_t a = reinterpret_cast<uintptr_t>(buf[0]), b = reinterpret_cast<uintptr_t>(buf[1]);
  printf("addresses_distinct=%d\n", (a + kBytes <= b || b + kBytes <= a) ? 1 : 0);
  // Pointer attributes name each allocation's device whichever device is current.
  CK(cudaSetDevice(0));
  for (int d = 0; d < 2; ++d) {
    cudaPointerAttributes pa{};
    CK(cudaPointerGetAttributes(&pa, buf[d]));
    EXPECT(pa.type == cudaMemoryTypeDevice && pa.device == d,
           "pointer of device %d: type %d device %d", d, pa.type, pa.device);
  }
  printf("pointer_devices=ok\n");

  e2e::Step("host copies");
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    std::vector<unsigned char> in(kBytes), out(kBytes, 0);
    e2e::Fill(in.data(), kBytes, 100 + d);
    CK(cudaMemcpy(buf[d], in.data(), kBytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(out.data(), buf[d], kBytes, cudaMemcpyDeviceToHost));
    EXPECT_SAME(out.data(), in.data(), kBytes, "host round trip");
    std::fill(out.begin(), out.end(), 0);
    CK(cudaMemcpyAsync(buf[d] + 1, in.data(), kBytes - 1, cudaMemcpyHostToDevice, stream[d]));
    CK(cudaMemcpyAsync(out.data(), buf[d] + 1, kBytes - 1, cudaMemcpyDeviceToHost, stream[d]));
    CK(cudaStreamSynchronize(stream[d]));
    EXPECT_SAME(out.data(), in.data(), kBytes - 1, "async host round trip");
  }
  printf("host_copies=ok\n");

  e2e::Step("a kernel on each device");
  const size_t words = kBytes / 4;
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    std::vector<unsigned> in(words), out(words, 0);
    for (size_t i = 0; i < words; ++i) in[i] = static_cast<unsigned>(i * 7 + d);
    CK(cudaMemcpy(buf[d], in.data(), words * 4, cudaMemcpyHostToDevice));
    CK(cudaEventRecord(start[d], stream[d]));
    flyt_sim_affine<<<64, 256, 0, stream[d]>>>(
        reinterpret_cast<unsigned*>(buf[d]), reinterpret_cast<unsigned*>(buf[d]), words, 3 + d, 11);
    CK(cudaGetLastError());
    CK(cudaEventRecord(stop[d], stream[d]));
    CK(cudaMemcpyAsync(out.data(), buf[d], words * 4, cudaMemcpyDeviceToHost, stream[d]));
    CK(cudaStreamSynchronize(stream[d]));
    size_t bad = 0;
    for (size_t i = 0; i < words; ++i) bad += out[i] != in[i] * (3 + d) + 11;
    EXPECT(bad == 0, "device %d: %zu words wrong after the kernel", d, bad);
  }
  printf("kernels=ok\n");

  e2e::Step("symbols, pitched copies and stream-ordered memory on each device");
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    std::vector<unsigned char> in(sizeof(g_sym)), out(sizeof(g_sym), 0);
    e2e::Fill(in.data(), in.size(), 300 + d);
    CK(cudaMemcpyToSymbol(g_sym, in.data(), in.size()));
    CK(cudaMemcpyFromSymbol(out.data(), g_sym, out.size()));
    EXPECT_SAME(out.data(), in.data(), in.size(), "symbol");
    size_t pitch = 0;
    char* pitched = nullptr;
    const size_t width = 1000, height = 7;
    CK(cudaMallocPitch(reinterpret_cast<void**>(&pitched), &pitch, width, height));
    std::vector<unsigned char> rows(width * height), back(width * height, 0);
    e2e::Fill(rows.data(), rows.size(), 400 + d);
    CK(cudaMemcpy2D(pitched, pitch, rows.data(), width, width, height, cudaMemcpyHostToDevice));
    CK(cudaMemcpy2D(back.data(), width, pitched, pitch, width, height, cudaMemcpyDeviceToHost));
    EXPECT_SAME(back.data(), rows.data(), rows.size(), "pitched rows");
    CK(cudaFree(pitched));
    char* async_mem = nullptr;
    CK(cudaMallocAsync(reinterpret_cast<void**>(&async_mem), 1 << 20, stream[d]));
    CK(cudaMemsetAsync(async_mem, 0x5a + d, 1 << 20, stream[d]));
    std::vector<unsigned char> got(1 << 20, 0);
    CK(cudaMemcpyAsync(got.data(), async_mem, got.size(), cudaMemcpyDeviceToHost, stream[d]));
    CK(cudaFreeAsync(async_mem, stream[d]));
    CK(cudaStreamSynchronize(stream[d]));
    EXPECT(e2e::FirstNot(got.data(), static_cast<unsigned char>(0x5a + d), got.size()) < 0,
           "device %d: stream-ordered memory not set", d);
  }
  printf("per_device_extras=ok\n");
  size_t free_mid[2] = {0, 0};  // the pools' idle memory may stay theirs a while
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    size_t t = 0;
    CK(cudaMemGetInfo(&free_mid[d], &t));
  }

  e2e::Step("streams and events of the other device");
  CK(cudaSetDevice(0));  // device 1's handles with device 0 current
  for (int d = 0; d < 2; ++d) {
    int dev = -1;
    CK(cudaStreamGetDevice(stream[d], &dev));
    EXPECT(dev == d, "stream of device %d says device %d", d, dev);
  }
  CK(cudaStreamSynchronize(stream[1]));
  CK(cudaEventSynchronize(stop[1]));
  CK(cudaEventQuery(stop[1]));
  CK(cudaStreamQuery(stream[1]));
  float ms = -1;
  CK(cudaEventElapsedTime(&ms, start[1], stop[1]));
  EXPECT(ms >= 0, "elapsed time %f", ms);
  CK(cudaEventRecord(stop[0], stream[0]));
  CK(cudaStreamWaitEvent(stream[1], stop[0], 0));  // across the servers: the host waits
  CK(cudaStreamSynchronize(stream[1]));
  // A host function behind device 1's stream, queued with device 0 current.
  static std::atomic<int> ran{0};
  CK(cudaLaunchHostFunc(
      stream[1], [](void*) { ran.fetch_add(1); }, nullptr));
  CK(cudaStreamSynchronize(stream[1]));
  EXPECT(ran.load() == 1, "the host function on device 1's stream ran %d times", ran.load());
  printf("other_device_handles=ok\n");

  e2e::Step("copies between the servers");
  const size_t sizes[] = {1, 4099, kBytes - 3};
  uint32_t seed = 1;
  for (int way = 0; way < 4; ++way) {
    for (size_t n : sizes) {
      const size_t off = n == 1 ? 7 : 3;
      Across(way, 0, 1, 0, buf[0], buf[1], off, n, stream[1], seed++);
      Across(way, 1, 0, 1, buf[1], buf[0], off, n, stream[0], seed++);
    }
  }
  // Larger than the servers' chunks, each way, with the other device current.
  Across(0, 0, 1, 1, large[0], large[1], 5, kLarge - 5, stream[1], seed++);
  Across(3, 1, 0, 1, large[1], large[0], 0, kLarge, stream[0], seed++);
  printf("copies_across=ok\n");

  e2e::Step("copies both ways at once from two threads");
  {
    auto worker = [&](int from, int to, char* src, char* dst, uint32_t seed) {
      for (int i = 0; i < 6; ++i)
        Across(i % 4, from, to, from, src, dst, i, kBytes - 16, 0, seed + i);
    };
    // Halves of the large buffers: one thread's source is never the other's target.
    std::thread t1(worker, 0, 1, large[0], large[1], 1000u);
    std::thread t2(worker, 1, 0, large[1] + kBytes, large[0] + kBytes, 2000u);
    t1.join();
    t2.join();
  }
  printf("copies_two_threads=ok\n");

  e2e::Step("free");
  CK(cudaSetDevice(0));
  for (int d = 0; d < 2; ++d) {  // device 1's with device 0 current, as natively
    CK(cudaFree(buf[d]));
    CK(cudaFree(large[d]));
    CK(cudaEventDestroy(start[d]));
    CK(cudaEventDestroy(stop[d]));
    CK(cudaStreamDestroy(stream[d]));
  }
  // Two servers on one physical GPU (MULTI_SERVER_SHARED_GPU=1, set by
  // tests/gpu/run_multi_server.sh): a device-wide reading moves with the other server's
  // contexts and staging buffers, so it cannot show this device's memory coming back.
  const char* shared_gpu = getenv("MULTI_SERVER_SHARED_GPU");
  if (shared_gpu != nullptr && strcmp(shared_gpu, "1") == 0) {
    printf("memory_back=skipped (one physical GPU)\n");
  } else {
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      size_t free_after = 0, t = 0;
      CK(cudaMemGetInfo(&free_after, &t));
      EXPECT(free_after >= free_mid[d] + kBytes + kLarge,
             "device %d: %zu bytes free, %zu with the buffers, %zu before", d, free_after,
             free_mid[d], free_before[d]);
    }
    printf("memory_back=ok\n");
  }
  e2e::Pass();
  return 0;
}
