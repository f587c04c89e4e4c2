// multithread_streams: built with --default-stream per-thread, so cudart
// resolves the per-thread-default-stream (_ptsz/_ptds) driver entry points.
// Four host threads each run 20 rounds of H2D -> kernel -> D2H on their own
// default stream (stream 0 = per-thread), in parallel; a cross-thread
// dependency (thread 0 records an event, thread 1 waits on it in its stream);
// explicit cudaStreamPerThread and cudaStreamLegacy use from the main thread.
// FLYT_NVCC: --default-stream per-thread
#include <future>
#include <thread>
#include <vector>
#include "common.h"

__global__ void mix(int* d, int n, int tid, int round) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    d[i] = static_cast<int>(static_cast<unsigned int>(d[i]) * 3u +
                            static_cast<unsigned int>(tid * 1000 + round));
}

static long long expected(int n, int tid, int rounds) {
  long long s = 0;
  for (int i = 0; i < n; ++i) {
    long long v = i % 97;
    for (int r = 0; r < rounds; ++r) v = (v * 3 + tid * 1000 + r) % (1ll << 32);
    s += static_cast<int>(static_cast<unsigned int>(v));
  }
  return s;
}

int main() {
  const int nthreads = 4, n = 200000, rounds = 20;
  std::vector<long long> sums(nthreads, 0);
  std::vector<int> status(nthreads, 0);
  std::promise<cudaEvent_t> recorded;
  std::shared_future<cudaEvent_t> recorded_f = recorded.get_future().share();
  int* shared_buf;
  CHECK(cudaMalloc(&shared_buf, sizeof(int)));
  int shared_out = 0;

  auto worker = [&](int tid) {
    CHECK(cudaSetDevice(0));
    int* d;
    int* h;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMallocHost(&h, n * sizeof(int)));
    for (int i = 0; i < n; ++i) h[i] = i % 97;
    CHECK(cudaMemcpyAsync(d, h, n * sizeof(int), cudaMemcpyHostToDevice, 0));
    for (int r = 0; r < rounds; ++r) {
      mix<<<(n + 255) / 256, 256>>>(d, n, tid, r);
      CHECK_LAUNCH();
    }
    CHECK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    long long s = 0;
    for (int i = 0; i < n; ++i) s += h[i];
    sums[tid] = s;
    if (tid == 0) {
      cudaEvent_t ev;
      CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      int v = 1234;
      CHECK(cudaMemcpyAsync(shared_buf, &v, sizeof(int), cudaMemcpyHostToDevice,
                            cudaStreamPerThread));
      CHECK(cudaEventRecord(ev, cudaStreamPerThread));
      recorded.set_value(ev);
      CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    }
    if (tid == 1) {
      cudaEvent_t ev = recorded_f.get();
      CHECK(cudaStreamWaitEvent(0, ev, 0));
      CHECK(cudaMemcpyAsync(&shared_out, shared_buf, sizeof(int), cudaMemcpyDeviceToHost, 0));
      CHECK(cudaStreamSynchronize(0));
    }
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(h));
    status[tid] = 1;
  };

  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  int bad = 0;
  for (int t = 0; t < nthreads; ++t) {
    long long e = expected(n, t, rounds);
    printf("thread %d: sum=%lld %s\n", t, sums[t], sums[t] == e ? "ok" : "MISMATCH");
    bad += sums[t] != e || status[t] != 1;
  }
  printf("cross-thread event value=%d\n", shared_out);
  bad += shared_out != 1234;

  // Explicit handles from the main thread.
  int* d;
  CHECK(cudaMalloc(&d, 1024 * sizeof(int)));
  CHECK(cudaMemsetAsync(d, 0, 1024 * sizeof(int), cudaStreamLegacy));
  mix<<<4, 256, 0, cudaStreamLegacy>>>(d, 1024, 1, 2);
  mix<<<4, 256, 0, cudaStreamPerThread>>>(d, 1024, 0,
                                          5);  // per-thread stream waits for legacy work
  std::vector<int> h(1024);
  CHECK(cudaMemcpyAsync(h.data(), d, 1024 * sizeof(int), cudaMemcpyDeviceToHost,
                        cudaStreamPerThread));
  CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  for (int v : h) bad += v != (1002 * 3 + 5);
  printf("legacy+per-thread stream value=%d\n", h[0]);
  EXPECT(bad == 0, "multithread results");
  CHECK(cudaFree(d));
  CHECK(cudaFree(shared_buf));
  pass("multithread_streams");
  return 0;
}
