// multi_tu: three translation units compiled separately (whole-program mode),
// so the executable carries three fatbins registered independently. Two of
// them hold a TU-local kernel with the same source name `scale` and a
// TU-local __constant__ `k_factor` with different values; a kernel defined in
// part_b.cu is launched from main.cu; main.cu has kernels of its own.
#include <vector>
#include "../common.h"
#include "parts.h"

static __constant__ float k_factor = 10.0f;

__global__ void main_kernel(float* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] += k_factor;
}

int main() {
  const int n = 5000;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i % 100);
  float* d;
  int* di;
  CHECK(cudaMalloc(&d, n * sizeof(float)));
  CHECK(cudaMalloc(&di, n * sizeof(int)));
  CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  int launches = 0;
  launches += part_a_run(d, n);                 // x*2+0.5
  launches += part_b_run(d, n);                 // x*3-1
  main_kernel<<<(n + 255) / 256, 256>>>(d, n);  // +10
  CHECK_LAUNCH();
  launches += part_a_run(d, n);  // x*2+0.5
  b_public<<<(n + 255) / 256, 256>>>(di, n);
  CHECK_LAUNCH();
  std::vector<float> o(n);
  std::vector<int> oi(n);
  CHECK(cudaMemcpy(o.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(oi.data(), di, n * sizeof(int), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    float x = h[i];
    x = x * 2.f + 0.5f;
    x = x * 3.f - 1.f;
    x = x + 10.f;
    x = x * 2.f + 0.5f;
    bad += o[i] != x;
    bad += oi[i] != i * 3 + 1;
  }
  int counter = part_a_counter();
  printf("launches=%d part_a_counter=%d mismatches=%d checksum=%016llx\n", launches, counter, bad,
         (unsigned long long)fnv1a(o.data(), n * sizeof(float), fnv1a(oi.data(), n * sizeof(int))));
  EXPECT(bad == 0 && counter == 2, "multi-TU results");
  CHECK(cudaFree(d));
  CHECK(cudaFree(di));
  pass("multi_tu");
  return 0;
}
