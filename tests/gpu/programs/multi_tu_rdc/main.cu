// multi_tu_rdc: separate compilation (-rdc=true) with a device link step:
// main.cu's kernel calls a __device__ function from lib.cu and reads an
// extern __device__ variable defined there; a kernel in lib.cu changes it;
// cudaMemcpyToSymbol/FromSymbol on the extern variable.
// FLYT_NVCC: -rdc=true
#include <vector>
#include "../common.h"

extern __device__ int g_bias;
__device__ int lib_mix(int x);
__global__ void lib_set_bias(int b);

__global__ void apply(int* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = lib_mix(d[i]) + g_bias;
}

int main() {
  const int n = 4096;
  std::vector<int> h(n), o(n);
  for (int i = 0; i < n; ++i) h[i] = i - 2000;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  apply<<<n / 256, 256>>>(d, n);  // x*7 + 5 + 5
  CHECK_LAUNCH();
  lib_set_bias<<<1, 1>>>(-3);
  CHECK_LAUNCH();
  apply<<<n / 256, 256>>>(d, n);  // x*7 - 3 - 3
  CHECK_LAUNCH();
  int bias = 0;
  CHECK(cudaMemcpyFromSymbol(&bias, g_bias, sizeof(int)));
  int nb = 100;
  CHECK(cudaMemcpyToSymbol(g_bias, &nb, sizeof(int)));
  apply<<<n / 256, 256>>>(d, n);  // x*7 + 100 + 100
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(o.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    int x = h[i];
    x = x * 7 + 10;
    x = x * 7 - 6;
    x = x * 7 + 200;
    bad += o[i] != x;
  }
  printf("bias_after_kernel=%d mismatches=%d checksum=%016llx\n", bias, bad,
         (unsigned long long)fnv1a(o.data(), n * sizeof(int)));
  EXPECT(bad == 0 && bias == -3, "rdc results");
  CHECK(cudaFree(d));
  pass("multi_tu_rdc");
  return 0;
}
