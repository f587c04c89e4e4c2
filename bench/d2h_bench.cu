// d2h_bench: device-to-host copies into pageable memory, for the data plane's CPU cost
// (bench/sim_d2h.sh runs it through `flyt run` against flyt-server --backend sim).
// Usage: d2h_bench [MIB [REPS [HOLD_S]]]   (default 256 MiB, 10 reps, hold 0 s)
// With HOLD_S > 0 it prints "ready" and sleeps HOLD_S seconds before the timed copies too.
// Prints, per run: "RESULT d2h_pageable_gbps <best> GB/s", "RESULT d2h_pageable_median_gbps
// <median> GB/s", "RESULT d2h_client_cpu_s_per_gib <s> s" (this process's user + system
// time over the copies, helper threads included, per GiB copied), then "holding" and
// sleeps HOLD_S seconds (so that a script can read the server's CPU time before the
// session ends).
#include <cuda_runtime.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                    \
  do {                                                              \
    cudaError_t e_ = (x);                                           \
    if (e_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
      return 2;                                                     \
    }                                                               \
  } while (0)

static double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  const int hold = argc > 3 ? std::atoi(argv[3]) : 0;
  const size_t n = mib << 20;
  auto* host = static_cast<unsigned char*>(std::malloc(n));
  std::vector<unsigned char> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = static_cast<unsigned char>(i * 7 + (i >> 12));
  std::memset(host, 0, n);  // every page touched before timing
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, n));
  CHECK(cudaMemcpy(dev, want.data(), n, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
  if (std::memcmp(host, want.data(), n) != 0) {
    std::fprintf(stderr, "d2h_bench: the bytes differ\n");
    return 1;
  }
  if (hold > 0) {
    std::printf("ready\n");
    std::fflush(stdout);
    sleep(static_cast<unsigned>(hold));
  }
  std::vector<double> gbps;
  const double cpu0 = CpuSeconds();
  for (int r = 0; r < reps; ++r) {
    auto a = std::chrono::steady_clock::now();
    CHECK(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    gbps.push_back(static_cast<double>(n) / s / 1e9);
  }
  const double cpu = CpuSeconds() - cpu0;
  std::sort(gbps.begin(), gbps.end());
  std::printf("RESULT d2h_pageable_gbps %.3f GB/s\n", gbps.back());
  std::printf("RESULT d2h_pageable_median_gbps %.3f GB/s\n", gbps[gbps.size() / 2]);
  std::printf("RESULT d2h_client_cpu_s_per_gib %.3f s\n",
              cpu / (static_cast<double>(n) * reps / (1 << 30)));
  std::printf("holding\n");
  std::fflush(stdout);
  if (hold > 0) sleep(static_cast<unsigned>(hold));
  return 0;
}
