// Shared helpers for the Flyt GPU test programs.
//
// Contract: every program prints only deterministic text on stdout (results,
// checksums, error names) and exits 0 on success, 1 when a CUDA call fails
// (CHECK), 2 when a result check fails (EXPECT). Diagnostics that may differ
// between runs go to stderr, which the runner does not compare.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda.h>
#include <cuda_runtime.h>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t err_ = (call);                                                                   \
    if (err_ != cudaSuccess) {                                                                   \
      printf("CUDA error %s in %s:%d: %s\n", cudaGetErrorName(err_), __FILE__, __LINE__, #call); \
      fflush(stdout);                                                                            \
      fprintf(stderr, "CUDA error %s (%s) in %s:%d: %s\n", cudaGetErrorName(err_),               \
              cudaGetErrorString(err_), __FILE__, __LINE__, #call);                              \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

// For driver-API calls reached through entry points (CUresult).
#define CU_CHECK(call)                                                                           \
  do {                                                                                           \
    CUresult r_ = (call);                                                                        \
    if (r_ != CUDA_SUCCESS) {                                                                    \
      printf("driver error %d in %s:%d: %s\n", static_cast<int>(r_), __FILE__, __LINE__, #call); \
      fflush(stdout);                                                                            \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

// After a <<<>>> launch: catches configuration errors right away.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

#define EXPECT(cond, ...)                                               \
  do {                                                                  \
    if (!(cond)) {                                                      \
      printf("CHECK FAILED in %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      printf(__VA_ARGS__);                                              \
      printf("\n");                                                     \
      fflush(stdout);                                                   \
      exit(2);                                                          \
    }                                                                   \
  } while (0)

// FNV-1a over raw bytes: a compact deterministic checksum to print.
static inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Small deterministic PRNG (xorshift32) for test data.
struct Rng {
  uint32_t s;
  explicit Rng(uint32_t seed) : s(seed ? seed : 1u) {}
  uint32_t next() {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return s;
  }
  // Integer in [lo, hi].
  int range(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<uint32_t>(hi - lo + 1));
  }
};

// Right after a launch meant to fault: prints what the launch, cudaDeviceSynchronize
// and cudaGetLastError answer and whether a cudaMalloc still works (a sticky error
// makes it fail too), and returns the program's exit code: 3 when the synchronize
// reports `expected`, 1 when the launch itself failed or nothing failed, 4 for any
// other error. Output is flushed around the synchronize, so that text the driver
// writes to stdout there (a device assert's) comes in a fixed place.
static inline int ReportFault(cudaError_t expected) {
  cudaError_t launch = cudaGetLastError();
  printf("launch: %s\n", cudaGetErrorName(launch));
  fflush(stdout);
  cudaError_t sync = cudaDeviceSynchronize();
  fflush(stdout);
  printf("cudaDeviceSynchronize: %s\n", cudaGetErrorName(sync));
  cudaError_t last = cudaGetLastError();
  printf("cudaGetLastError: %s\n", cudaGetErrorName(last));
  int* d2 = nullptr;
  cudaError_t after = cudaMalloc(&d2, 16);
  printf("cudaMalloc after fault: %s\n", cudaGetErrorName(after));
  fflush(stdout);
  if (launch != cudaSuccess) return 1;
  if (sync == expected) return 3;
  return sync == cudaSuccess ? 1 : 4;
}

static inline void pass(const char* name) {
  printf("%s: PASS\n", name);
  fflush(stdout);
}
