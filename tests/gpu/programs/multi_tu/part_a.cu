// Translation unit A: its own fatbin, a static kernel named `scale`, a
// TU-local __constant__ with an initialiser and a TU-local __device__ counter.
#include "../common.h"
#include "parts.h"

static __constant__ float k_factor = 2.0f;
static __device__ int d_calls;

static __global__ void scale(float* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = d[i] * k_factor + 0.5f;
  if (i == 0) atomicAdd(&d_calls, 1);
}

int part_a_run(float* d, int n) {
  scale<<<(n + 255) / 256, 256>>>(d, n);
  CHECK_LAUNCH();
  return 1;
}

int part_a_counter() {
  int v = -1;
  CHECK(cudaMemcpyFromSymbol(&v, d_calls, sizeof(int)));
  return v;
}
