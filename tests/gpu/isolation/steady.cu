// steady: a well-behaved neighbour that keeps a CUDA context busy for a while,
// so that faults of other processes happen while it runs. Each iteration
// allocates 4 MiB, fills it with a kernel (values depend on the iteration),
// sums it on the GPU (64-bit atomics) and with pinned async copies, and
// checks both against the host's sum; frees. It runs for $FLYT_ISO_STEADY_S
// seconds (default 6) counted from the end of its first iteration, at least
// 3 iterations. After the first iteration it creates $FLYT_ISO_READY_FILE
// (when set), so the harness can start the faulting programs while this one
// is known to be running. stdout is deterministic (the iteration count is
// not printed). Exit 0 on success, 1 when a CUDA call fails, 2 when a sum is
// wrong.
#include <time.h>

#include "common.h"

static double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static __host__ __device__ uint32_t value(uint32_t i, uint32_t it) {
  uint32_t x = i * 2654435761u ^ (it * 7919u + 1u);
  x ^= x >> 15;
  return x & 0xffffu;
}

__global__ void fill(uint32_t* a, uint32_t n, uint32_t it) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    a[i] = value(i, it);
}

__global__ void sum(const uint32_t* a, uint32_t n, unsigned long long* out) {
  __shared__ unsigned long long part[256];
  unsigned long long s = 0;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    s += a[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

int main() {
  const char* s_env = getenv("FLYT_ISO_STEADY_S");
  const double run_s = s_env != nullptr ? atof(s_env) : 6.0;
  const char* ready = getenv("FLYT_ISO_READY_FILE");
  const uint32_t n = 1u << 20;
  uint32_t* host = nullptr;
  unsigned long long* hsum = nullptr;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaMallocHost(&host, n * sizeof(uint32_t)));
  CHECK(cudaMallocHost(&hsum, sizeof(unsigned long long)));
  double t_first = 0;
  unsigned long long first_sum = 0;
  for (uint32_t it = 0;; ++it) {
    uint32_t* a = nullptr;
    unsigned long long* dsum = nullptr;
    CHECK(cudaMalloc(&a, n * sizeof(uint32_t)));
    CHECK(cudaMalloc(&dsum, sizeof(unsigned long long)));
    CHECK(cudaMemsetAsync(dsum, 0, sizeof(unsigned long long), stream));
    fill<<<264, 256, 0, stream>>>(a, n, it);
    CHECK_LAUNCH();
    sum<<<132, 256, 0, stream>>>(a, n, dsum);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(hsum, dsum, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(host, a, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    unsigned long long expect = 0, copied = 0;
    for (uint32_t i = 0; i < n; ++i) {
      expect += value(i, it);
      copied += host[i];
    }
    EXPECT(*hsum == expect, "iteration %u: GPU sum %llu, expected %llu", it, *hsum, expect);
    EXPECT(copied == expect, "iteration %u: copied data sums to %llu, expected %llu", it, copied,
           expect);
    CHECK(cudaFree(a));
    CHECK(cudaFree(dsum));
    if (it == 0) {
      first_sum = expect;
      t_first = now_s();
      if (ready != nullptr && *ready != '\0') {
        FILE* f = fopen(ready, "w");
        if (f != nullptr) fclose(f);
      }
    }
    if (it >= 2 && now_s() - t_first >= run_s) break;
  }
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaGetLastError());
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFreeHost(host));
  CHECK(cudaFreeHost(hsum));
  printf("steady: first sum %llu\n", first_sum);
  printf("steady: every iteration's sums match\n");
  pass("steady");
  return 0;
}
