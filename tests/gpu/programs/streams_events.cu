// streams_events: copy/compute overlap across 4 streams with pinned memory
// (cudaMemcpyAsync H2D -> kernel -> D2H per chunk), streams with flags and
// priorities, cross-stream dependencies with cudaStreamWaitEvent, event
// timing (cudaEventElapsedTime must be > 0; never printed), events created
// with cudaEventDisableTiming (elapsed time must fail), cudaEventQuery,
// cudaStreamQuery, cudaEventSynchronize, cudaStreamSynchronize.
#include <vector>
#include "common.h"

__global__ void work(float* x, int n, int iters) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  for (int k = 0; k < iters; ++k) v = v * 0.5f + 1.0f;  // converges to 2, exact steps
  x[i] = v + static_cast<float>(i % 8);
}

__global__ void add_from(float* dst, const float* src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

static float cpu_work(float v, int i, int iters) {
  for (int k = 0; k < iters; ++k) v = v * 0.5f + 1.0f;
  return v + static_cast<float>(i % 8);
}

int main() {
  const int nstreams = 4;
  const int chunk = 1 << 20;
  const int n = nstreams * chunk;
  const int iters = 200;
  float *h, *hout;
  CHECK(cudaMallocHost(&h, n * sizeof(float)));
  CHECK(cudaHostAlloc(&hout, n * sizeof(float), cudaHostAllocDefault));
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i % 1000);
  float* d;
  CHECK(cudaMalloc(&d, n * sizeof(float)));

  int least = 0, greatest = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  EXPECT(greatest <= least, "priority range");
  cudaStream_t s[nstreams];
  CHECK(cudaStreamCreate(&s[0]));
  CHECK(cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithPriority(&s[2], cudaStreamNonBlocking, greatest));
  CHECK(cudaStreamCreateWithPriority(&s[3], cudaStreamDefault, least));
  unsigned int flags = 0;
  CHECK(cudaStreamGetFlags(s[1], &flags));
  EXPECT(flags == cudaStreamNonBlocking, "stream flags %u", flags);
  int prio = 0;
  CHECK(cudaStreamGetPriority(s[2], &prio));
  EXPECT(prio == greatest, "stream priority");

  cudaEvent_t start, stop, done[nstreams], notiming;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreateWithFlags(&stop, cudaEventBlockingSync));
  CHECK(cudaEventCreateWithFlags(&notiming, cudaEventDisableTiming));
  for (int k = 0; k < nstreams; ++k)
    CHECK(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming));

  // A never-recorded event counts as complete.
  CHECK(cudaEventQuery(notiming));

  CHECK(cudaEventRecord(start, s[0]));
  for (int k = 0; k < nstreams; ++k) {
    // Streams 1..3 wait for the start event recorded on stream 0.
    if (k > 0) CHECK(cudaStreamWaitEvent(s[k], start, 0));
    float* dp = d + k * chunk;
    CHECK(cudaMemcpyAsync(dp, h + k * chunk, chunk * sizeof(float), cudaMemcpyHostToDevice, s[k]));
    work<<<chunk / 256, 256, 0, s[k]>>>(dp, chunk, iters);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(done[k], s[k]));
  }
  // Stream 0 adds every other chunk into its own chunk once they are done.
  for (int k = 1; k < nstreams; ++k) {
    CHECK(cudaStreamWaitEvent(s[0], done[k], 0));
    add_from<<<chunk / 256, 256, 0, s[0]>>>(d, d + k * chunk, chunk);
    CHECK_LAUNCH();
  }
  CHECK(cudaEventRecord(notiming, s[0]));
  for (int k = 1; k < nstreams; ++k) {
    CHECK(cudaStreamWaitEvent(s[k], notiming, 0));
    CHECK(cudaMemcpyAsync(hout + k * chunk, d + k * chunk, chunk * sizeof(float),
                          cudaMemcpyDeviceToHost, s[k]));
  }
  CHECK(cudaMemcpyAsync(hout, d, chunk * sizeof(float), cudaMemcpyDeviceToHost, s[0]));
  for (int k = 1; k < nstreams; ++k) CHECK(cudaStreamWaitEvent(s[0], done[k], 0));
  CHECK(cudaEventRecord(stop, s[0]));
  CHECK(cudaEventSynchronize(stop));
  for (int k = 0; k < nstreams; ++k) CHECK(cudaStreamSynchronize(s[k]));
  CHECK(cudaEventQuery(stop));
  CHECK(cudaStreamQuery(s[0]));

  float ms = -1.f;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  EXPECT(ms > 0.f, "elapsed time must be positive");
  cudaError_t e = cudaEventElapsedTime(&ms, start, notiming);
  printf("elapsed_time_with_disable_timing_event: %s\n", cudaGetErrorName(e));
  EXPECT(e != cudaSuccess, "timing on a DisableTiming event must fail");
  // The failed call is the runtime's last error; reading it resets it.
  printf("last_error: %s\n", cudaGetErrorName(cudaGetLastError()));
  CHECK(cudaGetLastError());  // not sticky: must be clear now

  int bad = 0;
  double sum = 0;
  for (int i = 0; i < chunk; ++i) {
    float expect0 = cpu_work(h[i], i, iters);
    for (int k = 1; k < nstreams; ++k) {
      float ek = cpu_work(h[k * chunk + i], k * chunk + i, iters);
      expect0 += ek;
      if (hout[k * chunk + i] != ek) ++bad;
    }
    if (hout[i] != expect0) ++bad;
  }
  for (int i = 0; i < n; ++i) sum += hout[i];
  printf("streams=%d chunk=%d mismatches=%d sum=%.3f\n", nstreams, chunk, bad, sum);
  EXPECT(bad == 0, "mismatches");

  for (int k = 0; k < nstreams; ++k) {
    CHECK(cudaEventDestroy(done[k]));
    CHECK(cudaStreamDestroy(s[k]));
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaEventDestroy(notiming));
  CHECK(cudaFree(d));
  CHECK(cudaFreeHost(h));
  CHECK(cudaFreeHost(hout));
  pass("streams_events");
  return 0;
}
