// fault_trap: a kernel executes the PTX trap instruction. The launch itself
// succeeds; cudaDeviceSynchronize must return the sticky error
// cudaErrorLaunchFailure, which a later call (cudaMalloc) keeps returning.
// Prints the error names and exits with code 3 (1 = no error at all or a
// failed launch, 4 = another error).
// The kernel's name contains flyt_sim_fault: the sim backend makes such
// launches fault (plumbing tests without a GPU).
// FLYT_EXPECT_RC: 3
// FLYT_RUN_LAST: 1
#include "common.h"

__global__ void good(int* p) { p[threadIdx.x] = threadIdx.x; }

__global__ void flyt_sim_fault_trap(int* p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    p[0] = -1;
    asm volatile("trap;");
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
  flyt_sim_fault_trap<<<2, 64>>>(d);
  return ReportFault(cudaErrorLaunchFailure);
}
