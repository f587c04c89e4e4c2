// framework_calls: the driver-call patterns of PyTorch, cuBLAS and cuDNN that
// must cost no round trip through Flyt, and fork after initialisation.
//
// Per iteration a framework sets a kernel attribute to the value it already
// has, reads function attributes and occupancy, asks whether the stream is
// capturing, launches, copies a scalar to the host and synchronizes the
// stream (PyTorch's .item()). Through Flyt only the copy needs a reply: the
// program reads the client's call counters (flyt_client_stats, Flyt's own
// extension of libcuda.so.1) and prints sync_per_iter=... for the harness. It
// then forks: the child's CUDA calls must fail at once (as with NVIDIA's
// driver), and the parent must go on working, on every transport (shm too).
#include <cuda.h>  // driver types only
#include <dlfcn.h>
#include <sys/wait.h>

#include "e2e_common.h"

__global__ void Scale(float* p, int n, float f) {
  extern __shared__ float tile[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    tile[threadIdx.x] = p[i];
    p[i] = tile[threadIdx.x] * f;
  }
}

namespace {

using StatsFn = int (*)(uint64_t*, int);

StatsFn FindStats() {
  // The library cudart loaded: Flyt's under `flyt run` (NVIDIA's has no such symbol).
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  return lib != nullptr ? reinterpret_cast<StatsFn>(dlsym(lib, "flyt_client_stats")) : nullptr;
}

uint64_t SyncCalls(StatsFn fn) {
  uint64_t v[3] = {0, 0, 0};
  if (fn != nullptr) fn(v, 3);
  return v[0];
}

// What a framework does around one small step.
void FrameworkStep(cudaStream_t s, float* dev, float* host, int n) {
  e2e::Step("framework step");
  CK(cudaFuncSetAttribute(Scale, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024));
  cudaFuncAttributes attrs;
  CK(cudaFuncGetAttributes(&attrs, Scale));
  EXPECT(attrs.maxThreadsPerBlock > 0, "maxThreadsPerBlock %d", attrs.maxThreadsPerBlock);
  int blocks = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Scale, 256, 1024));
  EXPECT(blocks > 0, "occupancy %d", blocks);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  CK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusNone, "capture status %d", static_cast<int>(status));
  unsigned long long capture_id = 1;
  CK(cudaStreamGetCaptureInfo(s, &status, &capture_id));
  EXPECT(status == cudaStreamCaptureStatusNone, "capture info status %d", static_cast<int>(status));
  Scale<<<(n + 255) / 256, 256, 1024, s>>>(dev, n, 1.0f);
  CK(cudaGetLastError());
  CK(cudaMemcpyAsync(host, dev, sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamSynchronize(s));  // nothing happened in between
}

}  // namespace

int main() {
  e2e::Init("framework_calls");
  const int n = 4096;
  const int iterations = 100;
  StatsFn stats = FindStats();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* dev = nullptr;
  CK(cudaMalloc(&dev, n * sizeof(float)));
  CK(cudaMemset(dev, 0, n * sizeof(float)));
  float host = -1.0f;

  e2e::Step("warm-up");
  FrameworkStep(s, dev, &host, n);  // first answers come from the server
  EXPECT(host == 0.0f, "copied %f", host);

  const uint64_t before = SyncCalls(stats);
  for (int i = 0; i < iterations; ++i) FrameworkStep(s, dev, &host, n);
  const uint64_t after = SyncCalls(stats);
  printf("flyt_stats=%d\n", stats != nullptr ? 1 : 0);
  printf("sync_per_iter=%.2f\n", static_cast<double>(after - before) / iterations);

  // A stream someone else's work touched is not "drained": a launch after the
  // copy means the next synchronize must reach the server.
  e2e::Step("synchronize after a launch");
  Scale<<<(n + 255) / 256, 256, 1024, s>>>(dev, n, 2.0f);
  const uint64_t before_sync = SyncCalls(stats);
  CK(cudaStreamSynchronize(s));
  printf("sync_after_launch=%llu\n",
         static_cast<unsigned long long>(SyncCalls(stats) - before_sync));

  // Numba's launch-size search: the driver's cuOccupancyMaxPotentialBlockSize,
  // with a callback for the dynamic shared memory of each block size (it runs
  // in this process) and a block size limit.
  e2e::Step("cuOccupancyMaxPotentialBlockSize");
  using PotentialFn = CUresult (*)(int*, int*, CUfunction, size_t (*)(int), size_t, int);
  PotentialFn potential = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CK(cudaGetDriverEntryPointByVersion("cuOccupancyMaxPotentialBlockSize",
                                      reinterpret_cast<void**>(&potential), 12000,
                                      cudaEnableDefault, &found));
  EXPECT(potential != nullptr, "cuOccupancyMaxPotentialBlockSize not found (%d)",
         static_cast<int>(found));
  CUfunction fn = nullptr;
  CK(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(Scale)));
  int grid = 0, block = 0;
  static int callbacks = 0;
  CUresult prc = potential(
      &grid, &block, fn,
      [](int b) -> size_t {
        ++callbacks;
        return static_cast<size_t>(b) * 4;
      },
      0, 200);
  printf(
      "potential.rc=%d\npotential.block_within_limit=%d\npotential.grid_positive=%d\n"
      "potential.callbacks_ran=%d\n",
      static_cast<int>(prc), block > 0 && block <= 200, grid > 0, callbacks > 0);

  e2e::Step("fork");
  fflush(stdout);
  pid_t child = fork();
  EXPECT(child >= 0, "fork failed");
  if (child == 0) {
    // As with NVIDIA's driver: CUDA is unusable in a child forked after
    // initialisation; the call must fail, not hang or reach the parent's session.
    float* p = nullptr;
    cudaError_t e = cudaMalloc(&p, 1 << 20);
    cudaError_t e2 = cudaMemcpy(&host, dev, sizeof(float), cudaMemcpyDeviceToHost);
    printf("fork_child_malloc=%s\n", e == cudaSuccess ? "success" : "error");
    printf("fork_child_memcpy=%s\n", e2 == cudaSuccess ? "success" : "error");
    fflush(stdout);
    _exit(0);
  }
  int wstatus = 0;
  EXPECT(waitpid(child, &wstatus, 0) == child, "waitpid");
  EXPECT(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0, "child status %d", wstatus);

  e2e::Step("parent after fork");
  float pattern[64];
  for (int i = 0; i < 64; ++i) pattern[i] = static_cast<float>(i);
  float back[64] = {};
  CK(cudaMemcpy(dev, pattern, sizeof(pattern), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(back, dev, sizeof(back), cudaMemcpyDeviceToHost));
  EXPECT(memcmp(pattern, back, sizeof(back)) == 0, "round trip after fork differs");
  CK(cudaStreamDestroy(s));
  CK(cudaFree(dev));
  e2e::Pass();
  return 0;
}
