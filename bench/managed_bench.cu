// managed_bench: managed-memory loops timed the same way natively and through
// Flyt. Prints "name value unit" lines (median of 5 runs):
//   touch_loop_us       per iteration of: the host writes one int of a 64 MiB
//                       managed array, a kernel updates the whole array,
//                       cudaDeviceSynchronize, the host reads one int
//   host_init_compute_read_ms  256 MiB: the host writes all of it (first
//                       touch), a kernel updates it, the host reads all of it
//   prefetch_roundtrip_ms      256 MiB already on the host: prefetch to the GPU,
//                       kernel, prefetch back, synchronize, the host reads it all
// Usage: managed_bench [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                      \
  do {                                                                   \
    cudaError_t e_ = (call);                                             \
    if (e_ != cudaSuccess) {                                             \
      fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

__global__ void bump(int* p, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) p[i] += 1;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 3 : 5;
  CHECK(cudaFree(nullptr));
  volatile long long sink = 0;

  {  // touch loop
    const size_t n = 16u << 20;
    int* m;
    CHECK(cudaMallocManaged(&m, n * sizeof(int)));
    CHECK(cudaMemset(m, 0, n * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    std::vector<double> t;
    const int iters = quick ? 20 : 50;
    for (int r = 0; r < reps; ++r) {
      double t0 = Now();
      for (int it = 0; it < iters; ++it) {
        m[(it * 7919) % n] = it;
        bump<<<528, 256>>>(m, n);
        CHECK(cudaDeviceSynchronize());
        sink = sink + m[(it * 4099) % n];
      }
      t.push_back((Now() - t0) / iters * 1e6);
    }
    printf("touch_loop_us %.1f us\n", Median(t));
    CHECK(cudaFree(m));
  }
  const size_t big = 64u << 20;  // ints: 256 MiB
  {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      int* m;
      CHECK(cudaMallocManaged(&m, big * sizeof(int)));
      double t0 = Now();
      for (size_t i = 0; i < big; ++i) m[i] = static_cast<int>(i);
      bump<<<528, 256>>>(m, big);
      CHECK(cudaDeviceSynchronize());
      long long s = 0;
      for (size_t i = 0; i < big; ++i) s += m[i];
      t.push_back((Now() - t0) * 1e3);
      sink = sink + s;
      CHECK(cudaFree(m));
    }
    printf("host_init_compute_read_ms %.1f ms\n", Median(t));
  }
  {
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    cudaMemLocation on_dev = {cudaMemLocationTypeDevice, dev};
    cudaMemLocation on_host = {cudaMemLocationTypeHost, 0};
    int* m;
    CHECK(cudaMallocManaged(&m, big * sizeof(int)));
    for (size_t i = 0; i < big; ++i) m[i] = 1;
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      double t0 = Now();
      CHECK(cudaMemPrefetchAsync(m, big * sizeof(int), on_dev, 0, 0));
      bump<<<528, 256>>>(m, big);
      CHECK(cudaMemPrefetchAsync(m, big * sizeof(int), on_host, 0, 0));
      CHECK(cudaDeviceSynchronize());
      long long s = 0;
      for (size_t i = 0; i < big; ++i) s += m[i];
      t.push_back((Now() - t0) * 1e3);
      sink = sink + s;
    }
    printf("prefetch_roundtrip_ms %.1f ms\n", Median(t));
    CHECK(cudaFree(m));
  }
  fprintf(stderr, "sink %lld\n", static_cast<long long>(sink));
  return 0;
}
