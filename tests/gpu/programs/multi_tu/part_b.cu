// Translation unit B: another fatbin with a static kernel also named `scale`
// (different code), its own TU-local constant, and a public kernel that
// main.cu launches directly.
#include "../common.h"
#include "parts.h"

static __constant__ float k_factor = 3.0f;

static __global__ void scale(float* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = d[i] * k_factor - 1.0f;
}

__global__ void b_public(int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 3 + 1;
}

int part_b_run(float* d, int n) {
  scale<<<(n + 127) / 128, 128>>>(d, n);
  CHECK_LAUNCH();
  return 1;
}
