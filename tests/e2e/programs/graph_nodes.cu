// graph_nodes: CUDA graphs built node by node, as NVIDIA's samples and libraries build them.
//
//   simple      simpleCudaGraphs: memcpy H2D from pageable and pinned memory, memset,
//               kernel, D2D, D2H back to host memory, a host node that reads the copied
//               bytes, launched many times with new host contents; ToSymbol/FromSymbol;
//               cudaGraphExecMemcpyNodeSetParams(1D), node SetParams, node queries, clone,
//               cudaGraphExecUpdate.
//   conditional graphConditionalNodes: IF, IF/ELSE, WHILE counting down in a kernel, SWITCH;
//               the conditional value set by kernels (flyt_sim_* names: the sim models them).
//               Then the sample's captured WHILE: a node added by hand to a capture
//               (cudaStreamGetCaptureInfo's graph and dependencies), its body captured by
//               a second stream (cudaStreamBeginCaptureToGraph), the capture continued
//               after it (cudaStreamUpdateCaptureDependencies, set and add).
//   memory      graph memory nodes: alloc -> memset -> D2H -> free, launched again and
//               again; node queries; a free node for memory no graph allocated; trim.
//   other       child graph (holding a host copy), empty and event record/wait nodes,
//               the generic cudaGraphAddNode / NodeSetParams / ExecNodeSetParams.
//   topology    a diamond of nodes: edges (with edge data), root nodes, dependencies and
//               dependents, an edge added twice and removed twice, a node destroyed,
//               a memset node disabled and enabled again in an executable graph; a
//               captured graph with a copy to pinned host memory shows only its own nodes.
//   quota BYTES (Flyt only, server with --memory-quota BYTES) allocation nodes count
//               against the quota.
//   refusals    (Flyt only) what Flyt answers with cudaErrorNotSupported.
//   (always)    user objects, as NCCL ties its plans to a captured graph: destructors run
//               when the last reference goes, on a thread of the library's, and an
//               executable graph's references only after its launches are done.
//
// Prints key=value lines (deterministic: no addresses, no timings), then "graph_nodes: PASS".
// Nothing printed depends on what a kernel computes except through the kernels the sim
// models (flyt_sim_set_conditional, flyt_sim_countdown), so the sim and a GPU agree.
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "e2e_common.h"

// Sets a conditional node's value (modelled by the sim backend).
__global__ void flyt_sim_set_conditional(cudaGraphConditionalHandle h, unsigned value) {
  if (threadIdx.x == 0 && blockIdx.x == 0) cudaGraphSetConditional(h, value);
}
// c[0] -= 1, c[1] += 1, condition = c[0] > 0 (modelled by the sim backend).
__global__ void flyt_sim_countdown(cudaGraphConditionalHandle h, int* c) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    c[0] -= 1;
    c[1] += 1;
    cudaGraphSetConditional(h, c[0] > 0 ? 1u : 0u);
  }
}
// Work whose result is never checked (the sim runs no kernel).
__global__ void scratch(int* p) { p[threadIdx.x] = static_cast<int>(threadIdx.x); }

__device__ unsigned char g_symbol[256];

namespace {

constexpr size_t kBytes = 64 << 10;

const char* TypeName(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel:
      return "kernel";
    case cudaGraphNodeTypeMemcpy:
      return "memcpy";
    case cudaGraphNodeTypeMemset:
      return "memset";
    case cudaGraphNodeTypeHost:
      return "host";
    case cudaGraphNodeTypeGraph:
      return "graph";
    case cudaGraphNodeTypeEmpty:
      return "empty";
    case cudaGraphNodeTypeWaitEvent:
      return "wait_event";
    case cudaGraphNodeTypeEventRecord:
      return "event_record";
    case cudaGraphNodeTypeMemAlloc:
      return "mem_alloc";
    case cudaGraphNodeTypeMemFree:
      return "mem_free";
    case cudaGraphNodeTypeConditional:
      return "conditional";
    default:
      return "other";
  }
}

// The graph's node types, sorted (the order of cudaGraphGetNodes is not promised).
std::string Types(cudaGraph_t g) {
  size_t n = 0;
  CK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) CK(cudaGraphGetNodes(g, nodes.data(), &n));
  std::vector<std::string> names;
  for (auto node : nodes) {
    cudaGraphNodeType t;
    CK(cudaGraphNodeGetType(node, &t));
    names.push_back(TypeName(t));
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (auto& s : names) out += (out.empty() ? "" : ",") + s;
  return out;
}

cudaMemcpy3DParms Copy1D(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  cudaMemcpy3DParms p{};
  p.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), n, n, 1);
  p.dstPtr = make_cudaPitchedPtr(dst, n, n, 1);
  p.extent = make_cudaExtent(n, 1, 1);
  p.kind = kind;
  return p;
}

// Host node: sums the bytes the D2H node before it brought back.
struct HostSeen {
  const unsigned char* buf;
  size_t n;
  std::vector<unsigned> sums;
};
void CALLBACK_SumBytes(void* p) {
  auto* s = static_cast<HostSeen*>(p);
  unsigned sum = 0;
  for (size_t i = 0; i < s->n; ++i) sum += s->buf[i];
  s->sums.push_back(sum);
}
unsigned Sum(const unsigned char* p, size_t n) {
  unsigned s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

void Simple() {
  e2e::Step("simple: setup");
  auto* in_page = static_cast<unsigned char*>(malloc(kBytes));
  auto* out_page = static_cast<unsigned char*>(malloc(kBytes));
  auto* out_page2 = static_cast<unsigned char*>(malloc(kBytes));
  unsigned char *in_pin = nullptr, *out_pin = nullptr;
  CK(cudaMallocHost(&in_pin, kBytes));
  CK(cudaMallocHost(&out_pin, kBytes));
  unsigned char *d_a = nullptr, *d_b = nullptr, *d_c = nullptr;
  int* d_scratch = nullptr;
  CK(cudaMalloc(&d_a, kBytes));
  CK(cudaMalloc(&d_b, kBytes));
  CK(cudaMalloc(&d_c, kBytes));
  CK(cudaMalloc(&d_scratch, 32 * sizeof(int)));
  e2e::Fill(in_pin, kBytes, 99);

  e2e::Step("simple: build");
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t h2d, h2d_pin, mset, kern, d2d, d2h, d2h_pin, host;
  cudaMemcpy3DParms p = Copy1D(d_a, in_page, kBytes, cudaMemcpyHostToDevice);
  CK(cudaGraphAddMemcpyNode(&h2d, g, nullptr, 0, &p));
  CK(cudaGraphAddMemcpyNode1D(&h2d_pin, g, nullptr, 0, d_c, in_pin, kBytes,
                              cudaMemcpyHostToDevice));
  cudaMemsetParams ms{};
  ms.dst = d_b;
  ms.value = 0x11;
  ms.elementSize = 1;
  ms.width = kBytes;
  ms.height = 1;
  CK(cudaGraphAddMemsetNode(&mset, g, nullptr, 0, &ms));
  void* kargs[] = {&d_scratch};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(scratch);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(32);
  kp.kernelParams = kargs;
  cudaGraphNode_t kdeps[] = {h2d, mset};
  CK(cudaGraphAddKernelNode(&kern, g, kdeps, 2, &kp));
  // d_b[0, kBytes/2) <- d_a[0, kBytes/2): the D2H brings back half copied, half memset.
  CK(cudaGraphAddMemcpyNode1D(&d2d, g, &kern, 1, d_b, d_a, kBytes / 2, cudaMemcpyDeviceToDevice));
  cudaMemcpy3DParms back = Copy1D(out_page, d_b, kBytes, cudaMemcpyDefault);  // UNIFIED
  CK(cudaGraphAddMemcpyNode(&d2h, g, &d2d, 1, &back));
  CK(cudaGraphAddMemcpyNode1D(&d2h_pin, g, &h2d_pin, 1, out_pin, d_c, kBytes,
                              cudaMemcpyDeviceToHost));
  HostSeen seen{out_page, kBytes, {}};
  cudaHostNodeParams hp{CALLBACK_SumBytes, &seen};
  CK(cudaGraphAddHostNode(&host, g, &d2h, 1, &hp));
  printf("simple.types=%s\n", Types(g).c_str());

  e2e::Step("simple: launch");
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, g, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<unsigned char> want(kBytes);
  int launches_ok = 0;
  for (int i = 0; i < 6; ++i) {
    e2e::Fill(in_page, kBytes, 1000 + i);  // read at each launch, not at build
    memset(out_page, 0, kBytes);
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    memcpy(want.data(), in_page, kBytes / 2);
    memset(want.data() + kBytes / 2, 0x11, kBytes / 2);
    EXPECT_SAME(out_page, want.data(), kBytes, "simple: pageable D2H after launch");
    EXPECT_SAME(out_pin, in_pin, kBytes, "simple: pinned round trip");
    EXPECT(seen.sums.size() == static_cast<size_t>(i + 1) &&
               seen.sums.back() == Sum(want.data(), kBytes),
           "host node saw the D2H bytes (launch %d)", i);
    launches_ok++;
  }
  printf("simple.launches_ok=%d\n", launches_ok);
  printf("simple.host_node_runs=%zu\n", seen.sums.size());

  e2e::Step("simple: exec set params");
  CK(cudaGraphExecMemcpyNodeSetParams1D(exec, d2h_pin, out_page2, d_c, kBytes,
                                        cudaMemcpyDeviceToHost));
  memset(out_page2, 0, kBytes);
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_SAME(out_page2, in_pin, kBytes, "simple: exec-updated D2H destination");
  cudaMemcpy3DParms p2 = Copy1D(d_a, in_pin, kBytes, cudaMemcpyHostToDevice);
  CK(cudaGraphExecMemcpyNodeSetParams(exec, h2d, &p2));  // pageable -> pinned source
  memset(out_page, 0, kBytes);
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  memcpy(want.data(), in_pin, kBytes / 2);
  memset(want.data() + kBytes / 2, 0x11, kBytes / 2);
  EXPECT_SAME(out_page, want.data(), kBytes, "simple: exec-updated H2D source");
  printf("simple.exec_set_params=ok\n");

  e2e::Step("simple: queries");
  cudaMemcpy3DParms q{};
  CK(cudaGraphMemcpyNodeGetParams(d2h_pin, &q));
  EXPECT(q.dstPtr.ptr == out_pin && q.srcPtr.ptr == d_c && q.extent.width == kBytes &&
             q.extent.height == 1 && q.extent.depth == 1,
         "memcpy node params read back");
  cudaMemcpy3DParms q2{};
  CK(cudaGraphMemcpyNodeGetParams(h2d, &q2));
  EXPECT(q2.srcPtr.ptr == in_page && q2.dstPtr.ptr == d_a, "H2D node params read back");
  cudaGraphNodeType t;
  CK(cudaGraphNodeGetType(d2h, &t));
  printf("simple.d2h_type=%s\n", TypeName(t));
  cudaHostNodeParams hq{};
  CK(cudaGraphHostNodeGetParams(host, &hq));
  EXPECT(hq.fn == CALLBACK_SumBytes && hq.userData == &seen, "host node params read back");

  e2e::Step("simple: node set params, clone, update");
  // The graph's own D2H node now writes to out_page2; a new exec sees it.
  CK(cudaGraphMemcpyNodeSetParams1D(d2h_pin, out_page2, d_c, kBytes, cudaMemcpyDeviceToHost));
  cudaGraph_t clone;
  CK(cudaGraphClone(&clone, g));
  cudaGraphNode_t cloned_d2h;
  CK(cudaGraphNodeFindInClone(&cloned_d2h, d2h_pin, clone));
  CK(cudaGraphNodeGetType(cloned_d2h, &t));
  printf("simple.clone_types=%s\n", Types(clone).c_str());
  cudaGraphExec_t exec2;
  CK(cudaGraphInstantiate(&exec2, clone, 0));
  e2e::Fill(in_pin, kBytes, 7);
  memset(out_page2, 0, kBytes);
  CK(cudaGraphLaunch(exec2, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_SAME(out_page2, in_pin, kBytes, "simple: clone's D2H after node SetParams");
  // Update the first exec from the clone whose D2H goes to out_pin again.
  CK(cudaGraphMemcpyNodeSetParams1D(cloned_d2h, out_pin, d_c, kBytes, cudaMemcpyDeviceToHost));
  cudaGraphExecUpdateResultInfo info{};
  CK(cudaGraphExecUpdate(exec, clone, &info));
  printf("simple.exec_update=%d\n", static_cast<int>(info.result));
  e2e::Fill(in_pin, kBytes, 8);
  memset(out_pin, 0, kBytes);
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_SAME(out_pin, in_pin, kBytes, "simple: D2H after cudaGraphExecUpdate");

  e2e::Step("simple: symbols");
  cudaGraph_t sg;
  CK(cudaGraphCreate(&sg, 0));
  cudaGraphNode_t to_sym, from_sym;
  unsigned char sym_in[256], sym_out[256];
  e2e::Fill(sym_in, sizeof(sym_in), 5);
  memset(sym_out, 0, sizeof(sym_out));
  CK(cudaGraphAddMemcpyNodeToSymbol(&to_sym, sg, nullptr, 0, g_symbol, sym_in, sizeof(sym_in), 0,
                                    cudaMemcpyHostToDevice));
  CK(cudaGraphAddMemcpyNodeFromSymbol(&from_sym, sg, &to_sym, 1, sym_out, g_symbol, sizeof(sym_out),
                                      0, cudaMemcpyDeviceToHost));
  cudaGraphExec_t sexec;
  CK(cudaGraphInstantiate(&sexec, sg, 0));
  CK(cudaGraphLaunch(sexec, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_SAME(sym_out, sym_in, sizeof(sym_in), "simple: through a symbol");
  printf("simple.symbol=ok\n");

  CK(cudaGraphExecDestroy(sexec));
  CK(cudaGraphDestroy(sg));
  CK(cudaGraphExecDestroy(exec2));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(clone));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d_a));
  CK(cudaFree(d_b));
  CK(cudaFree(d_c));
  CK(cudaFree(d_scratch));
  CK(cudaFreeHost(in_pin));
  CK(cudaFreeHost(out_pin));
  free(in_page);
  free(out_page);
  free(out_page2);
}

// A graph: memset *flag = 0, kernel sets the condition to `value`, conditional node of
// `type` with `size` bodies (body i: memset *flag = 10 + i), D2H of the flag.
struct CondGraph {
  cudaGraph_t g;
  cudaGraphExec_t exec;
  cudaGraphNode_t kernel;
  cudaGraphConditionalHandle handle;
  unsigned* d_flag;
  unsigned h_flag;
};
void BuildCond(CondGraph* c, cudaGraphConditionalNodeType type, unsigned size, unsigned value) {
  CK(cudaGraphCreate(&c->g, 0));
  CK(cudaGraphConditionalHandleCreate(&c->handle, c->g, 0, 0));
  cudaGraphNode_t zero, cond, back;
  cudaMemsetParams ms{};
  ms.dst = c->d_flag;
  ms.value = 0;
  ms.elementSize = 4;
  ms.width = 1;
  ms.height = 1;
  CK(cudaGraphAddMemsetNode(&zero, c->g, nullptr, 0, &ms));
  void* args[] = {&c->handle, &value};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(flyt_sim_set_conditional);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(1);
  kp.kernelParams = args;
  CK(cudaGraphAddKernelNode(&c->kernel, c->g, &zero, 1, &kp));
  cudaGraphNodeParams np{};
  np.type = cudaGraphNodeTypeConditional;
  np.conditional.handle = c->handle;
  np.conditional.type = type;
  np.conditional.size = size;
  CK(cudaGraphAddNode(&cond, c->g, &c->kernel, nullptr, 1, &np));
  for (unsigned i = 0; i < size; ++i) {
    cudaGraphNode_t set;
    ms.value = 10 + i;
    CK(cudaGraphAddMemsetNode(&set, np.conditional.phGraph_out[i], nullptr, 0, &ms));
  }
  cudaMemcpy3DParms p = Copy1D(&c->h_flag, c->d_flag, 4, cudaMemcpyDeviceToHost);
  CK(cudaGraphAddMemcpyNode(&back, c->g, &cond, 1, &p));
  CK(cudaGraphInstantiate(&c->exec, c->g, 0));
}
unsigned RunCond(CondGraph* c, unsigned value, cudaStream_t s) {
  void* args[] = {&c->handle, &value};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(flyt_sim_set_conditional);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(1);
  kp.kernelParams = args;
  CK(cudaGraphExecKernelNodeSetParams(c->exec, c->kernel, &kp));
  c->h_flag = 0xdead;
  CK(cudaGraphLaunch(c->exec, s));
  CK(cudaStreamSynchronize(s));
  return c->h_flag;
}

void Conditional() {
  e2e::Step("conditional");
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  CondGraph c{};
  CK(cudaMalloc(&c.d_flag, 4));
  BuildCond(&c, cudaGraphCondTypeIf, 1, 1);
  unsigned a = RunCond(&c, 1, s), b = RunCond(&c, 0, s);
  printf("cond.if=%u,%u\n", a, b);
  printf("cond.if_types=%s\n", Types(c.g).c_str());
  CK(cudaGraphExecDestroy(c.exec));
  CK(cudaGraphDestroy(c.g));
  BuildCond(&c, cudaGraphCondTypeIf, 2, 1);
  a = RunCond(&c, 1, s);
  b = RunCond(&c, 0, s);
  printf("cond.if_else=%u,%u\n", a, b);
  CK(cudaGraphExecDestroy(c.exec));
  CK(cudaGraphDestroy(c.g));
  BuildCond(&c, cudaGraphCondTypeSwitch, 3, 0);
  unsigned s0 = RunCond(&c, 0, s), s2 = RunCond(&c, 2, s), s7 = RunCond(&c, 7, s);
  printf("cond.switch=%u,%u,%u\n", s0, s2, s7);
  CK(cudaGraphExecDestroy(c.exec));
  CK(cudaGraphDestroy(c.g));
  CK(cudaFree(c.d_flag));

  e2e::Step("conditional: while");
  // counter <- host {n, 0}; WHILE (default 1 at each launch) { countdown }; host <- counter.
  int* d_counter = nullptr;
  CK(cudaMalloc(&d_counter, 2 * sizeof(int)));
  int init[2] = {0, 0}, result[2] = {-1, -1};
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h;
  CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
  cudaGraphNode_t up, loop, down, body_kernel;
  cudaMemcpy3DParms p = Copy1D(d_counter, init, sizeof(init), cudaMemcpyHostToDevice);
  CK(cudaGraphAddMemcpyNode(&up, g, nullptr, 0, &p));
  cudaGraphNodeParams np{};
  np.type = cudaGraphNodeTypeConditional;
  np.conditional.handle = h;
  np.conditional.type = cudaGraphCondTypeWhile;
  np.conditional.size = 1;
  CK(cudaGraphAddNode(&loop, g, &up, nullptr, 1, &np));
  void* args[] = {&h, &d_counter};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(flyt_sim_countdown);
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(1);
  kp.kernelParams = args;
  CK(cudaGraphAddKernelNode(&body_kernel, np.conditional.phGraph_out[0], nullptr, 0, &kp));
  cudaMemcpy3DParms q = Copy1D(result, d_counter, sizeof(result), cudaMemcpyDeviceToHost);
  CK(cudaGraphAddMemcpyNode(&down, g, &loop, 1, &q));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, g, 0));
  std::string iterations;
  for (int n : {5, 3, 8}) {
    init[0] = n;
    init[1] = 0;
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    iterations += (iterations.empty() ? "" : ",") + std::to_string(result[1]);
    EXPECT(result[0] == 0, "while: counter ends at 0 (got %d)", result[0]);
  }
  printf("cond.while_iterations=%s\n", iterations.c_str());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  CK(cudaFree(d_counter));
  CK(cudaStreamDestroy(s));
}

// graphConditionalNodes' capturedWhileGraph, with NCCL's way of joining a node added by
// hand into a capture (get the dependencies, add after them, set them to the new node).
void CapturedWhile() {
  e2e::Step("conditional: captured while");
  cudaStream_t s, body_stream;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&body_stream, cudaStreamNonBlocking));
  int* d_counter = nullptr;
  CK(cudaMalloc(&d_counter, 2 * sizeof(int)));
  int* host = nullptr;  // {n, 0} in, {0, iterations} out
  CK(cudaMallocHost(&host, 4 * sizeof(int)));
  cudaStreamCaptureStatus st;
  cudaGraph_t capture_graph = nullptr, g = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t ndeps = 0;
  CK(cudaStreamGetCaptureInfo(s, &st, nullptr, &capture_graph, &deps, nullptr, &ndeps));
  printf("captured.idle=%d,%zu\n", static_cast<int>(st), ndeps);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(cudaStreamGetCaptureInfo(s, &st, nullptr, &capture_graph, &deps, nullptr, &ndeps));
  printf("captured.begin=%d,%zu\n", static_cast<int>(st == cudaStreamCaptureStatusActive), ndeps);
  CK(cudaMemcpyAsync(d_counter, host, 2 * sizeof(int), cudaMemcpyHostToDevice, s));
  CK(cudaStreamGetCaptureInfo(s, &st, nullptr, &capture_graph, &deps, nullptr, &ndeps));
  EXPECT(ndeps == 1, "after one copy the capture depends on one node (got %zu)", ndeps);
  cudaGraphNodeType t;
  CK(cudaGraphNodeGetType(deps[0], &t));
  printf("captured.dep_type=%s\n", TypeName(t));
  cudaGraphConditionalHandle h;
  CK(cudaGraphConditionalHandleCreate(&h, capture_graph, 1, cudaGraphCondAssignDefault));
  cudaGraphNodeParams np{};
  np.type = cudaGraphNodeTypeConditional;
  np.conditional.handle = h;
  np.conditional.type = cudaGraphCondTypeWhile;
  np.conditional.size = 1;
  cudaGraphNode_t loop;
  CK(cudaGraphAddNode(&loop, capture_graph, deps, nullptr, ndeps, &np));
  cudaGraph_t body = np.conditional.phGraph_out[0], body_back = nullptr;
  CK(cudaStreamBeginCaptureToGraph(body_stream, body, nullptr, nullptr, 0,
                                   cudaStreamCaptureModeRelaxed));
  flyt_sim_countdown<<<1, 1, 0, body_stream>>>(h, d_counter);
  CK(cudaGetLastError());
  CK(cudaStreamEndCapture(body_stream, &body_back));
  EXPECT(body_back == body, "capture to a graph ends with that graph");
  printf("captured.body=%s\n", Types(body).c_str());
  CK(cudaStreamUpdateCaptureDependencies(s, &loop, nullptr, 1, cudaStreamSetCaptureDependencies));
  CK(cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &deps, nullptr, &ndeps));
  EXPECT(ndeps == 1 && deps[0] == loop, "set: the capture depends on the loop alone");
  // Add: an empty node made by hand joins the set; the copy after waits for both.
  cudaGraphNode_t extra;
  CK(cudaGraphAddEmptyNode(&extra, capture_graph, nullptr, 0));
  CK(cudaStreamUpdateCaptureDependencies(s, &extra, nullptr, 1, cudaStreamAddCaptureDependencies));
  CK(cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &deps, nullptr, &ndeps));
  printf("captured.after_add=%zu\n", ndeps);
  EXPECT(ndeps == 2, "add: two dependencies (got %zu)", ndeps);
  CK(cudaMemcpyAsync(host + 2, d_counter, 2 * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamEndCapture(s, &g));
  EXPECT(g == capture_graph, "the captured graph is the one GetCaptureInfo named");
  printf("captured.types=%s\n", Types(g).c_str());
  size_t edges = 0;
  CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
  printf("captured.edges=%zu\n", edges);
  // cudaGraphDebugDotPrint (torch.cuda.CUDAGraph.debug_dump): a DOT file where asked.
  char dot_path[] = "/tmp/graph_nodes-dot-XXXXXX";
  int fd = mkstemp(dot_path);
  EXPECT(fd >= 0, "mkstemp");
  close(fd);
  CK(cudaGraphDebugDotPrint(g, dot_path, cudaGraphDebugDotFlagsVerbose));
  std::string dot;
  if (FILE* f = fopen(dot_path, "r")) {
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), f)) > 0) dot.append(buf, got);
    fclose(f);
  }
  unlink(dot_path);
  size_t arrows = 0;
  for (size_t at = dot.find("->"); at != std::string::npos; at = dot.find("->", at + 2)) ++arrows;
  printf("captured.dot=%d\n", dot.rfind("digraph", 0) == 0 && arrows >= edges ? 1 : 0);
  printf("captured.dot_unwritable=%d\n",
         static_cast<int>(cudaGraphDebugDotPrint(g, "/nonexistent-dir/graph.dot", 0)));
  cudaGetLastError();
  // Bad input: no capture, a bogus flag.
  cudaGraphNode_t none = nullptr;
  printf("captured.update_idle=%d\n",
         static_cast<int>(cudaStreamUpdateCaptureDependencies(s, &none, nullptr, 0, 0)));
  cudaGetLastError();
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, g, 0));
  std::string iterations;
  for (int n : {4, 7, 1}) {
    host[0] = n;
    host[1] = 0;
    host[2] = host[3] = -1;
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    EXPECT(host[2] == 0, "captured while: counter ends at 0 (got %d)", host[2]);
    iterations += (iterations.empty() ? "" : ",") + std::to_string(host[3]);
  }
  printf("captured.while_iterations=%s\n", iterations.c_str());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  CK(cudaFreeHost(host));
  CK(cudaFree(d_counter));
  CK(cudaStreamDestroy(body_stream));
  CK(cudaStreamDestroy(s));
}

// A user object's destructor: counts, and notes whether it ran on the app's thread.
struct Owned {
  std::atomic<int> destroyed{0};
  std::atomic<int> on_app_thread{0};
  pthread_t app;
};
void DestroyOwned(void* p) {
  auto* o = static_cast<Owned*>(p);
  o->on_app_thread += pthread_equal(pthread_self(), o->app) ? 1 : 0;
  o->destroyed += 1;
}
// Waits up to 5 s for the destructor (it runs asynchronously, natively too).
int Destroyed(Owned* o) {
  for (int i = 0; i < 500 && o->destroyed.load() == 0; ++i) usleep(10000);
  return o->destroyed.load();
}

void UserObjects() {
  e2e::Step("user objects");
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* d = nullptr;
  CK(cudaMalloc(&d, 1 << 20));
  // A graph moves the app's reference in; its executable graph keeps the object alive
  // after the graph is gone, until it is destroyed itself (after its launches).
  Owned a;
  a.app = pthread_self();
  cudaUserObject_t obj;
  CK(cudaUserObjectCreate(&obj, &a, DestroyOwned, 1, cudaUserObjectNoDestructorSync));
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t set;
  cudaMemsetParams ms{};
  ms.dst = d;
  ms.value = 7;
  ms.elementSize = 4;
  ms.width = 1 << 18;
  ms.height = 1;
  CK(cudaGraphAddMemsetNode(&set, g, nullptr, 0, &ms));
  CK(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, g, 0));
  CK(cudaGraphDestroy(g));
  usleep(50000);
  const int after_graph = a.destroyed.load();
  for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(exec, s));
  CK(cudaGraphExecDestroy(exec));
  const int after_exec = Destroyed(&a);
  CK(cudaStreamSynchronize(s));
  printf("user_object.exec=%d,%d,app_thread%d\n", after_graph, after_exec, a.on_app_thread.load());
  // The app's own references: retained and released.
  Owned b;
  b.app = pthread_self();
  CK(cudaUserObjectCreate(&obj, &b, DestroyOwned, 2, cudaUserObjectNoDestructorSync));
  CK(cudaUserObjectRetain(obj, 3));
  CK(cudaUserObjectRelease(obj, 4));
  usleep(50000);
  const int still = b.destroyed.load();
  CK(cudaUserObjectRelease(obj, 1));
  printf("user_object.app_refs=%d,%d\n", still, Destroyed(&b));
  // A clone and a child graph node hold references of their own.
  Owned c;
  c.app = pthread_self();
  CK(cudaUserObjectCreate(&obj, &c, DestroyOwned, 1, cudaUserObjectNoDestructorSync));
  cudaGraph_t g2, clone, parent;
  CK(cudaGraphCreate(&g2, 0));
  CK(cudaGraphAddMemsetNode(&set, g2, nullptr, 0, &ms));
  CK(cudaGraphRetainUserObject(g2, obj, 2, 0));
  CK(cudaGraphReleaseUserObject(g2, obj, 1));
  CK(cudaUserObjectRelease(obj, 1));  // the app's: the graph's one remains
  CK(cudaGraphClone(&clone, g2));
  CK(cudaGraphCreate(&parent, 0));
  cudaGraphNode_t child;
  CK(cudaGraphAddChildGraphNode(&child, parent, nullptr, 0, g2));
  CK(cudaGraphDestroy(g2));
  CK(cudaGraphDestroy(clone));
  usleep(50000);
  const int with_parent = c.destroyed.load();
  CK(cudaGraphDestroy(parent));
  printf("user_object.copies=%d,%d\n", with_parent, Destroyed(&c));
  printf("user_object.bad_flags=%d\n",
         static_cast<int>(cudaUserObjectCreate(&obj, &c, DestroyOwned, 1, 0)));
  cudaGetLastError();
  CK(cudaFree(d));
  CK(cudaStreamDestroy(s));
}

void Memory() {
  e2e::Step("memory");
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  constexpr size_t kAlloc = 1 << 20, kBack = 4096;
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaMemAllocNodeParams ap{};
  ap.poolProps.allocType = cudaMemAllocationTypePinned;
  ap.poolProps.location.type = cudaMemLocationTypeDevice;
  ap.poolProps.location.id = 0;
  ap.bytesize = kAlloc;
  cudaGraphNode_t alloc, set, back, freen;
  CK(cudaGraphAddMemAllocNode(&alloc, g, nullptr, 0, &ap));
  EXPECT(ap.dptr != nullptr, "alloc node returned a pointer");
  cudaMemsetParams ms{};
  ms.dst = ap.dptr;
  ms.value = 0x5a;
  ms.elementSize = 1;
  ms.width = kAlloc;
  ms.height = 1;
  CK(cudaGraphAddMemsetNode(&set, g, &alloc, 1, &ms));
  std::vector<unsigned char> host(kBack), want(kBack, 0x5a);
  cudaMemcpy3DParms p = Copy1D(host.data(), ap.dptr, kBack, cudaMemcpyDeviceToHost);
  CK(cudaGraphAddMemcpyNode(&back, g, &set, 1, &p));
  CK(cudaGraphAddMemFreeNode(&freen, g, &back, 1, ap.dptr));
  printf("memory.types=%s\n", Types(g).c_str());
  cudaMemAllocNodeParams aq{};
  CK(cudaGraphMemAllocNodeGetParams(alloc, &aq));
  void* freed = nullptr;
  CK(cudaGraphMemFreeNodeGetParams(freen, &freed));
  EXPECT(aq.bytesize == kAlloc && aq.dptr == ap.dptr && freed == ap.dptr,
         "alloc/free node params read back");
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, g, 0));
  int ok = 0;
  for (int i = 0; i < 4; ++i) {
    std::fill(host.begin(), host.end(), 0);
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    EXPECT_SAME(host.data(), want.data(), kBack, "memory: bytes of graph-allocated memory");
    ok++;
  }
  printf("memory.launches_ok=%d\n", ok);

  e2e::Step("memory: freed outside the graph");
  // graphMemoryNodes' pattern: the graph allocates and fills, the stream frees.
  cudaGraph_t ga;
  CK(cudaGraphCreate(&ga, 0));
  cudaMemAllocNodeParams ap2 = ap;
  ap2.dptr = nullptr;
  cudaGraphNode_t alloc2, set2, back2;
  CK(cudaGraphAddMemAllocNode(&alloc2, ga, nullptr, 0, &ap2));
  ms.dst = ap2.dptr;
  ms.value = 0x6b;
  CK(cudaGraphAddMemsetNode(&set2, ga, &alloc2, 1, &ms));
  cudaMemcpy3DParms p2 = Copy1D(host.data(), ap2.dptr, kBack, cudaMemcpyDeviceToHost);
  CK(cudaGraphAddMemcpyNode(&back2, ga, &set2, 1, &p2));
  cudaGraphExec_t aexec;
  CK(cudaGraphInstantiate(&aexec, ga, 0));
  int freed_ok = 0;
  for (int i = 0; i < 2; ++i) {
    std::fill(host.begin(), host.end(), 0);
    CK(cudaGraphLaunch(aexec, s));
    CK(cudaFreeAsync(ap2.dptr, s));
    CK(cudaStreamSynchronize(s));
    EXPECT(e2e::FirstNot(host.data(), 0x6b, kBack) < 0, "memory: bytes before the stream's free");
    freed_ok++;
  }
  printf("memory.freed_by_stream=%d\n", freed_ok);
  CK(cudaGraphExecDestroy(aexec));
  CK(cudaGraphDestroy(ga));

  e2e::Step("memory: bad free");
  void* plain = nullptr;
  CK(cudaMalloc(&plain, 4096));
  cudaGraph_t g2;
  CK(cudaGraphCreate(&g2, 0));
  cudaGraphNode_t bad;
  cudaError_t err = cudaGraphAddMemFreeNode(&bad, g2, nullptr, 0, plain);
  printf("memory.free_not_graph_memory=%s\n", cudaGetErrorName(err));
  EXPECT(err != cudaSuccess, "a free node for cudaMalloc memory is refused");
  cudaGetLastError();
  CK(cudaGraphDestroy(g2));
  CK(cudaFree(plain));

  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  CK(cudaDeviceSynchronize());
  CK(cudaDeviceGraphMemTrim(0));
  unsigned long long used = 1;
  CK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
  printf("memory.used_after_trim=%llu\n", used);
  CK(cudaStreamDestroy(s));
}

void Other() {
  e2e::Step("other: child graph, empty, events");
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  constexpr size_t n = 4096;
  unsigned char *d_x = nullptr, *d_y = nullptr;
  CK(cudaMalloc(&d_x, n));
  CK(cudaMalloc(&d_y, n));
  std::vector<unsigned char> src(n), dst(n), want(n);
  // Child: d_y <- memset 0x33; d_x <- host src.
  cudaGraph_t child;
  CK(cudaGraphCreate(&child, 0));
  cudaGraphNode_t c_set, c_up;
  cudaMemsetParams ms{};
  ms.dst = d_y;
  ms.value = 0x33;
  ms.elementSize = 1;
  ms.width = n;
  ms.height = 1;
  CK(cudaGraphAddMemsetNode(&c_set, child, nullptr, 0, &ms));
  cudaMemcpy3DParms p = Copy1D(d_x, src.data(), n, cudaMemcpyHostToDevice);
  CK(cudaGraphAddMemcpyNode(&c_up, child, nullptr, 0, &p));
  // Parent: child -> empty -> event record -> D2H of d_x; a second graph waits for the event.
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t child_node, empty, rec, down;
  CK(cudaGraphAddChildGraphNode(&child_node, g, nullptr, 0, child));
  CK(cudaGraphAddEmptyNode(&empty, g, &child_node, 1));
  cudaEvent_t ev;
  CK(cudaEventCreate(&ev));
  CK(cudaGraphAddEventRecordNode(&rec, g, &empty, 1, ev));
  cudaMemcpy3DParms q = Copy1D(dst.data(), d_x, n, cudaMemcpyDeviceToHost);
  CK(cudaGraphAddMemcpyNode(&down, g, &rec, 1, &q));
  printf("other.types=%s\n", Types(g).c_str());
  cudaGraph_t embedded;
  CK(cudaGraphChildGraphNodeGetGraph(child_node, &embedded));
  printf("other.child_types=%s\n", Types(embedded).c_str());
  cudaEvent_t got;
  CK(cudaGraphEventRecordNodeGetEvent(rec, &got));
  EXPECT(got == ev, "event record node's event read back");
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, g, 0));
  e2e::Fill(src.data(), n, 31);
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_SAME(dst.data(), src.data(), n, "other: host copy inside a child graph");
  printf("other.event_query=%d\n", static_cast<int>(cudaEventQuery(ev)));

  cudaGraph_t w;
  CK(cudaGraphCreate(&w, 0));
  cudaGraphNode_t wait, wdown;
  CK(cudaGraphAddEventWaitNode(&wait, w, nullptr, 0, ev));
  cudaMemcpy3DParms r = Copy1D(want.data(), d_y, n, cudaMemcpyDeviceToHost);
  CK(cudaGraphAddMemcpyNode(&wdown, w, &wait, 1, &r));
  cudaGraphExec_t wexec;
  CK(cudaGraphInstantiate(&wexec, w, 0));
  CK(cudaGraphLaunch(wexec, s));
  CK(cudaStreamSynchronize(s));
  EXPECT(e2e::FirstNot(want.data(), 0x33, n) < 0, "other: memset inside the child graph");
  printf("other.wait_types=%s\n", Types(w).c_str());

  e2e::Step("other: generic node calls");
  cudaGraph_t gg;
  CK(cudaGraphCreate(&gg, 0));
  cudaGraphNodeParams np{};
  np.type = cudaGraphNodeTypeMemset;
  np.memset.dst = d_y;
  np.memset.value = 0x44;
  np.memset.elementSize = 1;
  np.memset.width = n;
  np.memset.height = 1;
  cudaGraphNode_t gset, gdown;
  CK(cudaGraphAddNode(&gset, gg, nullptr, nullptr, 0, &np));
  cudaGraphNodeParams cp{};
  cp.type = cudaGraphNodeTypeMemcpy;
  cp.memcpy.copyParams = Copy1D(dst.data(), d_y, n, cudaMemcpyDeviceToHost);
  CK(cudaGraphAddNode(&gdown, gg, &gset, nullptr, 1, &cp));
  np.memset.value = 0x55;
  CK(cudaGraphNodeSetParams(gset, &np));
  cudaGraphExec_t gexec;
  CK(cudaGraphInstantiate(&gexec, gg, 0));
  CK(cudaGraphLaunch(gexec, s));
  CK(cudaStreamSynchronize(s));
  EXPECT(e2e::FirstNot(dst.data(), 0x55, n) < 0, "generic: memset value set by NodeSetParams");
  cp.memcpy.copyParams = Copy1D(want.data(), d_y, n, cudaMemcpyDeviceToHost);
  CK(cudaGraphExecNodeSetParams(gexec, gdown, &cp));
  np.memset.value = 0x66;
  CK(cudaGraphExecNodeSetParams(gexec, gset, &np));
  CK(cudaGraphLaunch(gexec, s));
  CK(cudaStreamSynchronize(s));
  EXPECT(e2e::FirstNot(want.data(), 0x66, n) < 0, "generic: ExecNodeSetParams memset and memcpy");
  printf("other.generic=ok\n");

  CK(cudaGraphExecDestroy(gexec));
  CK(cudaGraphDestroy(gg));
  CK(cudaGraphExecDestroy(wexec));
  CK(cudaGraphDestroy(w));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  CK(cudaGraphDestroy(child));

  // The embedded child graph went with g: new graphs may get its address (the driver's
  // allocator reuses it) and must be destroyable like any other.
  e2e::Step("other: new graphs where a queried child graph was");
  int refused = 0;
  for (int round = 0; round < 8; ++round) {
    cudaGraph_t fresh[4];
    for (auto& f : fresh) CK(cudaGraphCreate(&f, 0));
    for (auto& f : fresh) refused += cudaGraphDestroy(f) != cudaSuccess;
    cudaGetLastError();
  }
  printf("other.fresh_graphs_refused=%d\n", refused);
  CK(cudaEventDestroy(ev));
  CK(cudaFree(d_x));
  CK(cudaFree(d_y));
  CK(cudaStreamDestroy(s));
}

// Flyt only: the server's quota is `quota` bytes.
void Quota(size_t quota) {
  e2e::Step("quota");
  size_t free0 = 0, total = 0;
  CK(cudaMemGetInfo(&free0, &total));
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaMemAllocNodeParams ap{};
  ap.poolProps.allocType = cudaMemAllocationTypePinned;
  ap.poolProps.location.type = cudaMemLocationTypeDevice;
  ap.bytesize = 2 * quota;
  cudaGraphNode_t big, small;
  cudaError_t err = cudaGraphAddMemAllocNode(&big, g, nullptr, 0, &ap);
  printf("quota.over=%s\n", cudaGetErrorName(err));
  cudaGetLastError();
  ap.bytesize = 16 << 20;
  CK(cudaGraphAddMemAllocNode(&small, g, nullptr, 0, &ap));
  size_t free1 = 0;
  CK(cudaMemGetInfo(&free1, &total));
  printf("quota.charged=%zu\n", free0 - free1);
  CK(cudaGraphDestroy(g));
  size_t free2 = 0;
  CK(cudaMemGetInfo(&free2, &total));
  printf("quota.refunded=%zu\n", free2 - free1);
}

// The names of `nodes` as `names` lists them ("?" for another), sorted and joined.
std::string NodeNames(const std::vector<cudaGraphNode_t>& nodes,
                      const std::vector<std::pair<cudaGraphNode_t, const char*>>& names) {
  std::vector<std::string> out;
  for (cudaGraphNode_t n : nodes) {
    const char* name = "?";
    for (const auto& [node, label] : names)
      if (node == n) name = label;
    out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  std::string joined;
  for (const auto& o : out) joined += (joined.empty() ? "" : ",") + o;
  return joined;
}

std::string Edges(cudaGraph_t g,
                  const std::vector<std::pair<cudaGraphNode_t, const char*>>& names) {
  size_t n = 0;
  CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n + 2), to(n + 2);
  std::vector<cudaGraphEdgeData> data(n + 2);
  size_t asked = n + 2;  // more than there are: the rest comes back NULL
  CK(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &asked));
  EXPECT(asked == n, "cudaGraphGetEdges filled %zu of %zu edges", asked, n);
  EXPECT(from[n] == nullptr && to[n + 1] == nullptr, "entries past the edges are not NULL");
  std::vector<std::string> edges;
  for (size_t i = 0; i < n; ++i) {
    static const cudaGraphEdgeData kZero{};
    EXPECT(std::memcmp(&data[i], &kZero, sizeof(kZero)) == 0, "edge %zu has edge data", i);
    edges.push_back(NodeNames({from[i]}, names) + ">" + NodeNames({to[i]}, names));
  }
  std::sort(edges.begin(), edges.end());
  std::string joined;
  for (const auto& e : edges) joined += (joined.empty() ? "" : ",") + e;
  return joined;
}

std::vector<cudaGraphNode_t> Neighbours(cudaGraphNode_t node, bool dependents) {
  size_t n = 0;
  if (dependents) {
    CK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &n));
  } else {
    CK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n));
  }
  std::vector<cudaGraphNode_t> out(n);
  if (n == 0) return out;
  if (dependents) {
    CK(cudaGraphNodeGetDependentNodes(node, out.data(), nullptr, &n));
  } else {
    CK(cudaGraphNodeGetDependencies(node, out.data(), nullptr, &n));
  }
  return out;
}

void Topology() {
  e2e::Step("topology: diamond");
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, 4096));
  CK(cudaMemset(d, 0, 4096));
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t a, b, c, e;
  CK(cudaGraphAddEmptyNode(&a, g, nullptr, 0));
  cudaMemsetParams ms{};
  ms.dst = d;
  ms.value = 7;
  ms.elementSize = 1;
  ms.width = 256;
  ms.height = 1;
  CK(cudaGraphAddMemsetNode(&b, g, &a, 1, &ms));
  CK(cudaGraphAddEmptyNode(&c, g, &a, 1));
  cudaGraphNode_t bc[2] = {b, c};
  CK(cudaGraphAddEmptyNode(&e, g, bc, 2));
  const std::vector<std::pair<cudaGraphNode_t, const char*>> names = {
      {a, "a"}, {b, "b"}, {c, "c"}, {e, "e"}};
  printf("topo.edges=%s\n", Edges(g, names).c_str());
  size_t roots_n = 0;
  CK(cudaGraphGetRootNodes(g, nullptr, &roots_n));
  std::vector<cudaGraphNode_t> roots(roots_n);
  CK(cudaGraphGetRootNodes(g, roots.data(), &roots_n));
  printf("topo.roots=%s\n", NodeNames(roots, names).c_str());
  printf("topo.deps_e=%s\n", NodeNames(Neighbours(e, false), names).c_str());
  printf("topo.dependents_a=%s\n", NodeNames(Neighbours(a, true), names).c_str());
  printf("topo.deps_a=%zu\n", Neighbours(a, false).size());

  e2e::Step("topology: add and remove edges");
  CK(cudaGraphAddDependencies(g, &a, &e, nullptr, 1));
  printf("topo.added=%s\n", Edges(g, names).c_str());
  cudaError_t err = cudaGraphAddDependencies(g, &a, &e, nullptr, 1);
  printf("topo.add_again=%s\n", cudaGetErrorName(err));
  cudaGetLastError();
  CK(cudaGraphRemoveDependencies(g, &a, &e, nullptr, 1));
  err = cudaGraphRemoveDependencies(g, &a, &e, nullptr, 1);
  printf("topo.remove_again=%s\n", cudaGetErrorName(err));
  cudaGetLastError();
  printf("topo.removed=%s\n", Edges(g, names).c_str());

  e2e::Step("topology: destroy a node");
  CK(cudaGraphDestroyNode(c));
  printf("topo.after_destroy=%s\n", Edges(g, names).c_str());
  size_t count = 0;
  CK(cudaGraphGetNodes(g, nullptr, &count));
  printf("topo.nodes_after_destroy=%zu\n", count);

  e2e::Step("topology: disabled node");
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, g, 0));
  unsigned enabled = 9;
  CK(cudaGraphNodeGetEnabled(exec, b, &enabled));
  printf("topo.enabled_at_start=%u\n", enabled);
  CK(cudaGraphNodeSetEnabled(exec, b, 0));
  CK(cudaGraphNodeGetEnabled(exec, b, &enabled));
  printf("topo.enabled_after_disable=%u\n", enabled);
  CK(cudaGraphLaunch(exec, 0));
  unsigned char first = 0;
  CK(cudaMemcpy(&first, d, 1, cudaMemcpyDeviceToHost));
  printf("topo.disabled_memset_ran=%d\n", first == 7 ? 1 : 0);
  CK(cudaGraphNodeSetEnabled(exec, b, 1));
  CK(cudaGraphLaunch(exec, 0));
  CK(cudaMemcpy(&first, d, 1, cudaMemcpyDeviceToHost));
  printf("topo.enabled_memset_ran=%d\n", first == 7 ? 1 : 0);
  err = cudaGraphNodeSetEnabled(exec, a, 0);  // an empty node cannot be disabled
  printf("topo.disable_empty=%s\n", cudaGetErrorName(err));
  cudaGetLastError();
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));

  e2e::Step("topology: captured graph with a copy to pinned host memory");
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (std::strstr(prop.name, "Simulated") != nullptr) {  // the sim has no stream capture
    printf("topo.captured=not run (sim)\n");
    CK(cudaFree(d));
    return;
  }
  unsigned char* pinned = nullptr;
  CK(cudaMallocHost(&pinned, 4096));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK(cudaMemsetAsync(d, 1, 4096, s));
  CK(cudaMemcpyAsync(pinned, d, 4096, cudaMemcpyDeviceToHost, s));
  CK(cudaMemsetAsync(d, 2, 4096, s));
  cudaGraph_t cap;
  CK(cudaStreamEndCapture(s, &cap));
  CK(cudaGraphGetNodes(cap, nullptr, &count));
  size_t edges = 0;
  CK(cudaGraphGetEdges(cap, nullptr, nullptr, nullptr, &edges));
  CK(cudaGraphGetRootNodes(cap, nullptr, &roots_n));
  printf("topo.captured=%zu nodes,%zu edges,%zu roots\n", count, edges, roots_n);
  CK(cudaGraphInstantiate(&exec, cap, 0));
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  printf("topo.captured_copy=%d\n", pinned[4095]);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(cap));
  CK(cudaStreamDestroy(s));
  CK(cudaFreeHost(pinned));
  CK(cudaFree(d));
}

// Flyt only: what Flyt refuses with cudaErrorNotSupported (natively these work).
void Refusals() {
  e2e::Step("refusals");
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, 4096));
  std::vector<unsigned char> host(4096);
  cudaGraph_t g;
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t node;
  cudaMemcpy3DParms p{};  // two rows of 64 bytes, 128 bytes apart in host memory
  p.srcPtr = make_cudaPitchedPtr(host.data(), 128, 64, 2);
  p.dstPtr = make_cudaPitchedPtr(d, 64, 64, 2);
  p.extent = make_cudaExtent(64, 2, 1);
  p.kind = cudaMemcpyHostToDevice;
  cudaError_t err = cudaGraphAddMemcpyNode(&node, g, nullptr, 0, &p);
  printf("refusal.pitched_host=%s\n", cudaGetErrorName(err));
  cudaGetLastError();
  cudaGraph_t child;
  CK(cudaGraphCreate(&child, 0));
  cudaGraphNodeParams np{};
  np.type = cudaGraphNodeTypeGraph;
  np.graph.graph = child;
  np.graph.ownership = cudaGraphChildGraphOwnershipMove;
  err = cudaGraphAddNode(&node, g, nullptr, nullptr, 0, &np);
  printf("refusal.child_move=%s\n", cudaGetErrorName(err));
  cudaGetLastError();
  CK(cudaGraphDestroy(child));
  cudaGraphConditionalHandle h;
  CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
  np = cudaGraphNodeParams{};
  np.type = cudaGraphNodeTypeConditional;
  np.conditional.handle = h;
  np.conditional.type = cudaGraphCondTypeIf;
  np.conditional.size = 1;
  cudaGraphNode_t cond;
  CK(cudaGraphAddNode(&cond, g, nullptr, nullptr, 0, &np));
  cudaMemcpy3DParms b = Copy1D(d, host.data(), 64, cudaMemcpyHostToDevice);
  err = cudaGraphAddMemcpyNode(&node, np.conditional.phGraph_out[0], nullptr, 0, &b);
  printf("refusal.host_copy_in_body=%s\n", cudaGetErrorName(err));
  cudaGetLastError();
  CK(cudaGraphDestroy(g));
  CK(cudaFree(d));
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("graph_nodes");
  CK(cudaSetDevice(0));
  if (argc > 2 && strcmp(argv[1], "quota") == 0) {
    Quota(strtoull(argv[2], nullptr, 0));
  } else if (argc > 1 && strcmp(argv[1], "refusals") == 0) {
    Refusals();
  } else {
    Simple();
    Conditional();
    CapturedWhile();
    UserObjects();
    Memory();
    Other();
    Topology();
  }
  e2e::Pass();
  return 0;
}
