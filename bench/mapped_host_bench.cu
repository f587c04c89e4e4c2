// mapped_host_bench: what mapping pinned memory for the GPU costs the copies that use it,
// natively and through Flyt (docs/compatibility.md, "Mapped pinned memory over sockets").
// The same loops on a plain pinned buffer (cudaMallocHost) and on a mapped one
// (cudaHostAllocMapped); prints "name value unit" lines, median of 5 runs:
//   {plain,mapped}_write_h2d_ms    64 MiB: the host writes all of it, cudaMemcpy to the device
//   {plain,mapped}_d2h_read_ms     64 MiB: cudaMemcpy from the device, the host reads all of it
//   {plain,mapped}_small_h2d_us    per iteration: the host writes 4 KiB, cudaMemcpy them to
//                                  the device
//   {plain,mapped}_small_d2h_us    per iteration: cudaMemcpy 4 KiB from the device, the host
//                                  reads them
// Usage: mapped_host_bench [--quick]
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

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

volatile unsigned long long g_sink = 0;

void Run(const char* kind, unsigned char* h, unsigned char* d, size_t n, int reps,
         int small_iters) {
  std::vector<double> w, r, sw, sr;
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = Now();
    memset(h, rep + 1, n);
    CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    w.push_back((Now() - t0) * 1e3);
    t0 = Now();
    CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i += 64) sum += h[i];
    g_sink = g_sink + sum;
    r.push_back((Now() - t0) * 1e3);
    t0 = Now();
    for (int i = 0; i < small_iters; ++i) {
      memset(h + (i % 16) * 4096, i, 4096);
      CHECK(cudaMemcpy(d, h + (i % 16) * 4096, 4096, cudaMemcpyHostToDevice));
    }
    sw.push_back((Now() - t0) * 1e6 / small_iters);
    t0 = Now();
    for (int i = 0; i < small_iters; ++i) {
      CHECK(cudaMemcpy(h + (i % 16) * 4096, d, 4096, cudaMemcpyDeviceToHost));
      g_sink = g_sink + h[(i % 16) * 4096 + 17];
    }
    sr.push_back((Now() - t0) * 1e6 / small_iters);
  }
  printf("%s_write_h2d_ms %.2f ms\n", kind, Median(w));
  printf("%s_d2h_read_ms %.2f ms\n", kind, Median(r));
  printf("%s_small_h2d_us %.1f us\n", kind, Median(sw));
  printf("%s_small_d2h_us %.1f us\n", kind, Median(sr));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 3 : 5, small_iters = quick ? 100 : 500;
  const size_t n = 64u << 20;
  unsigned char *plain = nullptr, *mapped = nullptr, *d = nullptr;
  CHECK(cudaMalloc(&d, n));
  CHECK(cudaMallocHost(&plain, n));
  CHECK(cudaHostAlloc(&mapped, n, cudaHostAllocMapped));
  Run("plain", plain, d, n, reps, small_iters);
  Run("mapped", mapped, d, n, reps, small_iters);
  CHECK(cudaFreeHost(plain));
  CHECK(cudaFreeHost(mapped));
  CHECK(cudaFree(d));
  return 0;
}
