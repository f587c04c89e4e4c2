// fault_device_assert: a kernel fails a device-side assert(). The launch
// itself succeeds; cudaDeviceSynchronize must return the sticky error
// cudaErrorAssert, which a later call (cudaMalloc) keeps returning. One
// thread asserts, so the driver's assertion message (file, line, kernel,
// block [0,0,0], thread [0,0,0]) is the same on every run; where the driver
// writes it to stdout it must reach this process and no other.
// Prints the error names and exits with code 3 (1 = no error at all or a
// failed launch, 4 = another error).
// The kernel's name contains flyt_sim_fault: the sim backend makes such
// launches fault (plumbing tests without a GPU).
// FLYT_EXPECT_RC: 3
// FLYT_RUN_LAST: 1
#undef NDEBUG
#include <cassert>

#include "common.h"

__global__ void good(int* p) { p[threadIdx.x] = threadIdx.x; }

__global__ void flyt_sim_fault_assert(const int* p, int expect) {
  // p[0] is 0 (written by good): thread 0 of block 0 fails the assertion.
  if (threadIdx.x == 0 && blockIdx.x == 0) assert(p[0] == expect);
}

int main() {
  int* d;
  CHECK(cudaMalloc(&d, 256 * sizeof(int)));
  good<<<1, 256>>>(d);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  printf("good kernel ok\n");
  fflush(stdout);
  flyt_sim_fault_assert<<<2, 64>>>(d, 12345);
  return ReportFault(cudaErrorAssert);
}
