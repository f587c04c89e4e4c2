// cuda_graphs: (1) stream capture across two streams (event fork/join) of
// H2D copy + 3 kernels + D2H copy, cudaStreamIsCapturing, node count,
// cudaGraphInstantiate, cudaGraphUpload, 200 replays; (2) a graph built by
// hand (kernel + memset nodes with dependencies) and
// cudaGraphExecKernelNodeSetParams between launches; (3) recapture with new
// arguments and cudaGraphExecUpdate; (4) graph memory nodes: cudaMallocAsync
// and cudaFreeAsync captured in a graph, replayed.
#include <vector>
#include "common.h"

__global__ void inc(int* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] += 1;
}
__global__ void fill(int* c, int v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = v;
}
__global__ void acc(long long* b, const int* a, const int* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) b[i] += static_cast<long long>(a[i]) * c[i];
}
__global__ void twice_plus(int* y, const int* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * 2 + y[i];
}

int main() {
  const int n = 100000, blocks = (n + 255) / 256;
  int* h_in;
  long long* h_out;
  CHECK(cudaMallocHost(&h_in, n * sizeof(int)));
  CHECK(cudaMallocHost(&h_out, n * sizeof(long long)));
  for (int i = 0; i < n; ++i) h_in[i] = i % 100;
  int *d_a, *d_c;
  long long* d_b;
  CHECK(cudaMalloc(&d_a, n * sizeof(int)));
  CHECK(cudaMalloc(&d_c, n * sizeof(int)));
  CHECK(cudaMalloc(&d_b, n * sizeof(long long)));
  CHECK(cudaMemset(d_b, 0, n * sizeof(long long)));
  cudaStream_t s0, s1;
  CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  // (1) Stream capture.
  CHECK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus cs;
  CHECK(cudaStreamIsCapturing(s0, &cs));
  EXPECT(cs == cudaStreamCaptureStatusActive, "capture status");
  CHECK(cudaMemcpyAsync(d_a, h_in, n * sizeof(int), cudaMemcpyHostToDevice, s0));
  CHECK(cudaEventRecord(fork, s0));
  CHECK(cudaStreamWaitEvent(s1, fork, 0));
  inc<<<blocks, 256, 0, s0>>>(d_a, n);
  CHECK_LAUNCH();
  fill<<<blocks, 256, 0, s1>>>(d_c, 3, n);
  CHECK_LAUNCH();
  CHECK(cudaEventRecord(join, s1));
  CHECK(cudaStreamWaitEvent(s0, join, 0));
  acc<<<blocks, 256, 0, s0>>>(d_b, d_a, d_c, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpyAsync(h_out, d_b, n * sizeof(long long), cudaMemcpyDeviceToHost, s0));
  cudaGraph_t graph;
  CHECK(cudaStreamEndCapture(s0, &graph));
  CHECK(cudaStreamIsCapturing(s0, &cs));
  EXPECT(cs == cudaStreamCaptureStatusNone, "capture status after end");
  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  printf("captured graph nodes=%zu\n", nodes);
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphUpload(exec, s0));
  const int replays = 200;
  for (int r = 0; r < replays; ++r) CHECK(cudaGraphLaunch(exec, s0));
  CHECK(cudaStreamSynchronize(s0));
  int bad = 0;
  for (int i = 0; i < n; ++i)
    bad += h_out[i] != static_cast<long long>(replays) * ((i % 100) + 1) * 3;
  printf("replays=%d mismatches=%d checksum=%016llx\n", replays, bad,
         (unsigned long long)fnv1a(h_out, n * sizeof(long long)));
  EXPECT(bad == 0, "captured graph replays");

  // Change the pinned input between replays: the graph reads it at run time.
  for (int i = 0; i < n; ++i) h_in[i] = 1000;
  CHECK(cudaGraphLaunch(exec, s0));
  CHECK(cudaStreamSynchronize(s0));
  bad = 0;
  for (int i = 0; i < n; ++i)
    bad += h_out[i] != static_cast<long long>(replays) * ((i % 100) + 1) * 3 + 1001 * 3;
  printf("replay with new host input mismatches=%d\n", bad);
  EXPECT(bad == 0, "replay after host input change");

  // (2) Hand-built graph: memset(y) and fill(x, v) -> twice_plus(y, x).
  int *d_x, *d_y;
  CHECK(cudaMalloc(&d_x, n * sizeof(int)));
  CHECK(cudaMalloc(&d_y, n * sizeof(int)));
  cudaGraph_t g2;
  CHECK(cudaGraphCreate(&g2, 0));
  cudaGraphNode_t n_fill, n_memset, n_twice;
  int v = 7, nn = n;
  void* fill_args[] = {&d_x, &v, &nn};
  cudaKernelNodeParams kp = {};
  kp.func = reinterpret_cast<void*>(fill);
  kp.gridDim = dim3(blocks);
  kp.blockDim = dim3(256);
  kp.kernelParams = fill_args;
  CHECK(cudaGraphAddKernelNode(&n_fill, g2, nullptr, 0, &kp));
  cudaMemsetParams mp = {};
  mp.dst = d_y;
  mp.value = 1;
  mp.elementSize = sizeof(int);
  mp.width = n;
  mp.height = 1;
  mp.pitch = 0;
  CHECK(cudaGraphAddMemsetNode(&n_memset, g2, nullptr, 0, &mp));
  void* twice_args[] = {&d_y, &d_x, &nn};
  cudaKernelNodeParams kp2 = {};
  kp2.func = reinterpret_cast<void*>(twice_plus);
  kp2.gridDim = dim3(blocks);
  kp2.blockDim = dim3(256);
  kp2.kernelParams = twice_args;
  cudaGraphNode_t deps[2] = {n_fill, n_memset};
  CHECK(cudaGraphAddKernelNode(&n_twice, g2, deps, 2, &kp2));
  cudaGraphExec_t exec2;
  CHECK(cudaGraphInstantiate(&exec2, g2, 0));
  CHECK(cudaGraphLaunch(exec2, s1));
  std::vector<int> hy(n);
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaMemcpy(hy.data(), d_y, n * sizeof(int), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int i = 0; i < n; ++i) bad += hy[i] != 15;
  v = 20;  // new kernel argument for the fill node
  CHECK(cudaGraphExecKernelNodeSetParams(exec2, n_fill, &kp));
  CHECK(cudaGraphLaunch(exec2, s1));
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaMemcpy(hy.data(), d_y, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) bad += hy[i] != 41;
  printf("manual graph mismatches=%d y0=%d\n", bad, hy[0]);
  EXPECT(bad == 0, "manual graph");

  // (3) Recapture with different arguments and update the executable graph.
  CHECK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
  fill<<<blocks, 256, 0, s0>>>(d_x, 5, n);
  twice_plus<<<blocks, 256, 0, s0>>>(d_y, d_x, n);
  cudaGraph_t g3;
  CHECK(cudaStreamEndCapture(s0, &g3));
  cudaGraphExec_t exec3;
  CHECK(cudaGraphInstantiate(&exec3, g3, 0));
  CHECK(cudaGraphLaunch(exec3, s0));  // y = 41 + 10 = 51
  CHECK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
  fill<<<blocks, 256, 0, s0>>>(d_x, -2, n);
  twice_plus<<<blocks, 256, 0, s0>>>(d_y, d_x, n);
  cudaGraph_t g4;
  CHECK(cudaStreamEndCapture(s0, &g4));
  cudaGraphExecUpdateResultInfo info;
  CHECK(cudaGraphExecUpdate(exec3, g4, &info));
  EXPECT(info.result == cudaGraphExecUpdateSuccess, "update result %d",
         static_cast<int>(info.result));
  for (int r = 0; r < 10; ++r) CHECK(cudaGraphLaunch(exec3, s0));  // y = 51 - 40 = 11
  CHECK(cudaStreamSynchronize(s0));
  CHECK(cudaMemcpy(hy.data(), d_y, n * sizeof(int), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int i = 0; i < n; ++i) bad += hy[i] != 11;
  printf("updated graph mismatches=%d y0=%d\n", bad, hy[0]);
  EXPECT(bad == 0, "graph exec update");

  // (4) Graph memory nodes.
  CHECK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeGlobal));
  int* tmp = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&tmp), n * sizeof(int), s0));
  fill<<<blocks, 256, 0, s0>>>(tmp, 4, n);
  twice_plus<<<blocks, 256, 0, s0>>>(d_y, tmp, n);
  CHECK(cudaFreeAsync(tmp, s0));
  cudaGraph_t g5;
  CHECK(cudaStreamEndCapture(s0, &g5));
  cudaGraphExec_t exec5;
  CHECK(cudaGraphInstantiate(&exec5, g5, 0));
  for (int r = 0; r < 25; ++r) CHECK(cudaGraphLaunch(exec5, s0));  // y = 11 + 25*8 = 211
  CHECK(cudaStreamSynchronize(s0));
  CHECK(cudaMemcpy(hy.data(), d_y, n * sizeof(int), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int i = 0; i < n; ++i) bad += hy[i] != 211;
  printf("memory-node graph mismatches=%d y0=%d\n", bad, hy[0]);
  EXPECT(bad == 0, "graph memory nodes");
  CHECK(cudaDeviceGraphMemTrim(0));

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphExecDestroy(exec2));
  CHECK(cudaGraphExecDestroy(exec3));
  CHECK(cudaGraphExecDestroy(exec5));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaGraphDestroy(g2));
  CHECK(cudaGraphDestroy(g3));
  CHECK(cudaGraphDestroy(g4));
  CHECK(cudaGraphDestroy(g5));
  CHECK(cudaEventDestroy(fork));
  CHECK(cudaEventDestroy(join));
  CHECK(cudaStreamDestroy(s0));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaFree(d_a));
  CHECK(cudaFree(d_b));
  CHECK(cudaFree(d_c));
  CHECK(cudaFree(d_x));
  CHECK(cudaFree(d_y));
  CHECK(cudaFreeHost(h_in));
  CHECK(cudaFreeHost(h_out));
  pass("cuda_graphs");
  return 0;
}
