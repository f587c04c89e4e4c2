// fault_illegal_address: a kernel writes through a wild pointer. The launch
// itself succeeds; cudaDeviceSynchronize must return the sticky error
// (cudaErrorIllegalAddress), which later calls keep returning. Prints the
// error names and exits with code 3 (any other code is a failure).
// FLYT_EXPECT_RC: 3
// FLYT_RUN_LAST: 1
#include "common.h"

__global__ void good(int* p) { p[threadIdx.x] = threadIdx.x; }

__global__ void wild_write(unsigned long long addr) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    volatile int* bad = reinterpret_cast<volatile int*>(addr);
    *bad = 1;
  }
}

int main() {
  int* d;
  CHECK(cudaMalloc(&d, 256 * sizeof(int)));
  good<<<1, 256>>>(d);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  printf("good kernel ok\n");
  fflush(stdout);
  // The null page: mapped neither on the GPU nor in the process (which
  // matters with HMM, where the GPU may reach any mapped host address).
  wild_write<<<1, 32>>>(0x10ull);
  return ReportFault(cudaErrorIllegalAddress);
}
