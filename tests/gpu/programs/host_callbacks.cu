// host_callbacks: host functions ordered in streams. cudaLaunchHostFunc
// after kernel + D2H copy must see the copied data; a host function writing
// pinned memory must happen before a later H2D copy of that memory in the
// same stream; cudaStreamAddCallback gets cudaSuccess; a graph host node runs
// once per graph launch, after its kernel dependency.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
#include "common.h"

__global__ void set_all(int* d, int v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = v;
}
__global__ void add_from(int* d, const int* src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] += src[i % 4];
}

struct Log {
  std::vector<int> seen;
  int* pinned;
};

static void CUDART_CB record(void* user) {
  Log* log = static_cast<Log*>(user);
  log->seen.push_back(log->pinned[0] + log->pinned[999]);
}

static void CUDART_CB produce(void* user) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int* p = static_cast<int*>(user);
  for (int k = 0; k < 4; ++k) p[k] = 70 + k;
}

static std::atomic<int> g_callback_ok{0};
static void CUDART_CB old_style(cudaStream_t, cudaError_t status, void* user) {
  if (status == cudaSuccess && user == reinterpret_cast<void*>(0x1234)) g_callback_ok++;
}

static std::atomic<int> g_node_runs{0};
static void CUDART_CB node_fn(void* user) {
  int* p = static_cast<int*>(user);
  g_node_runs += p[0] == 9 ? 1 : 1000;  // the kernel's D2H result must be visible
}

int main() {
  const int n = 1000;
  int* d;
  int* dsrc;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMalloc(&dsrc, 4 * sizeof(int)));
  int* pinned;
  CHECK(cudaMallocHost(&pinned, n * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  Log log{{}, pinned};
  for (int k = 1; k <= 5; ++k) {
    set_all<<<(n + 255) / 256, 256, 0, s>>>(d, k * 10, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, record, &log));
  }
  CHECK(cudaStreamSynchronize(s));
  printf("host func saw:");
  for (int v : log.seen) printf(" %d", v);
  printf("\n");
  EXPECT(log.seen.size() == 5 && log.seen[0] == 20 && log.seen[4] == 100, "host func ordering");

  // Host function produces data that a later copy in the same stream uploads.
  int* staging;
  CHECK(cudaMallocHost(&staging, 4 * sizeof(int)));
  for (int k = 0; k < 4; ++k) staging[k] = -1;
  set_all<<<(n + 255) / 256, 256, 0, s>>>(d, 0, n);
  CHECK(cudaLaunchHostFunc(s, produce, staging));
  CHECK(cudaMemcpyAsync(dsrc, staging, 4 * sizeof(int), cudaMemcpyHostToDevice, s));
  add_from<<<(n + 255) / 256, 256, 0, s>>>(d, dsrc, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpyAsync(pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += pinned[i] != 70 + i % 4;
  printf("copy after producing host func: first=%d mismatches=%d\n", pinned[0], bad);
  EXPECT(bad == 0, "host func before H2D copy");

  CHECK(cudaStreamAddCallback(s, old_style, reinterpret_cast<void*>(0x1234), 0));
  CHECK(cudaStreamSynchronize(s));
  printf("cudaStreamAddCallback ok=%d\n", g_callback_ok.load());
  EXPECT(g_callback_ok.load() == 1, "stream callback");

  // Graph: kernel -> memcpy D2H -> host node.
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  set_all<<<(n + 255) / 256, 256, 0, s>>>(d, 9, n);
  CHECK(cudaMemcpyAsync(pinned, d, sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaLaunchHostFunc(s, node_fn, pinned));
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int r = 0; r < 3; ++r) {
    pinned[0] = 0;
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaStreamSynchronize(s));
  }
  // And a host node added by hand.
  cudaGraph_t g2;
  CHECK(cudaGraphCreate(&g2, 0));
  cudaHostNodeParams hp = {};
  hp.fn = node_fn;
  hp.userData = pinned;
  cudaGraphNode_t hn;
  CHECK(cudaGraphAddHostNode(&hn, g2, nullptr, 0, &hp));
  cudaGraphExec_t ge2;
  CHECK(cudaGraphInstantiate(&ge2, g2, 0));
  CHECK(cudaGraphLaunch(ge2, s));
  CHECK(cudaStreamSynchronize(s));
  printf("graph host node runs=%d\n", g_node_runs.load());
  EXPECT(g_node_runs.load() == 4, "graph host nodes");

  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphExecDestroy(ge2));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaGraphDestroy(g2));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFreeHost(staging));
  CHECK(cudaFree(d));
  CHECK(cudaFree(dsrc));
  pass("host_callbacks");
  return 0;
}
