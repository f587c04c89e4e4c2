// ptx_only_jit: the executable carries PTX only (compute_90, no SASS), so the
// driver on the GPU host JIT-compiles every kernel at load time. Kernels with
// shared memory, atomics and a __device__ global; cudaFuncGetAttributes
// reports ptxVersion 90 and binaryVersion 90 after the JIT.
// FLYT_ARCH: -gencode arch=compute_90,code=compute_90
#include <vector>
#include "common.h"

__device__ unsigned long long d_sum;

__global__ void block_sum(const int* in, int n) {
  __shared__ int s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? in[i] : 0;
  __syncthreads();
  for (int st = 128; st > 0; st >>= 1) {
    if (threadIdx.x < st) s[threadIdx.x] += s[threadIdx.x + st];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(&d_sum, static_cast<unsigned long long>(s[0]));
}

__global__ void square(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * p[i];
}

int main() {
  const int n = 300001;
  std::vector<int> h(n);
  for (int i = 0; i < n; ++i) h[i] = i % 200;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  unsigned long long zero = 0;
  CHECK(cudaMemcpyToSymbol(d_sum, &zero, sizeof(zero)));
  square<<<(n + 255) / 256, 256>>>(d, n);
  CHECK_LAUNCH();
  block_sum<<<(n + 255) / 256, 256>>>(d, n);
  CHECK_LAUNCH();
  unsigned long long sum = 0;
  CHECK(cudaMemcpyFromSymbol(&sum, d_sum, sizeof(sum)));
  unsigned long long ref = 0;
  for (int i = 0; i < n; ++i) ref += static_cast<unsigned long long>(h[i]) * h[i];
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, block_sum));
  printf("ptx-only: sum=%llu ptxVersion=%d binaryVersion=%d\n", sum, fa.ptxVersion,
         fa.binaryVersion);
  EXPECT(sum == ref, "sum %llu vs %llu", sum, ref);
  EXPECT(fa.ptxVersion == 90, "ptx version");
  CHECK(cudaFree(d));
  pass("ptx_only_jit");
  return 0;
}
