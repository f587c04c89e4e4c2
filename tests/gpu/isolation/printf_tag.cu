// printf_tag TAG: device printf that names its process. Each of 4 launches
// prints 40 lines "device: tag T launch L line N" from one thread, with a
// host line between launches and a pause (100 ms) so that several
// instances run side by side. Run with different tags at once, every
// instance must print exactly its own lines (a run compares with a native
// run of the same tag). Exit 0 on success, 1 when a CUDA call fails.
#include <time.h>

#include "common.h"

__global__ void lines(int tag, int launch, int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    for (int i = 0; i < n; ++i) printf("device: tag %d launch %d line %02d\n", tag, launch, i);
}

int main(int argc, char** argv) {
  const int tag = argc > 1 ? atoi(argv[1]) : 0;
  printf("host: tag %d start\n", tag);
  fflush(stdout);
  for (int l = 0; l < 4; ++l) {
    lines<<<2, 32>>>(tag, l, 40);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    fflush(stdout);
    printf("host: tag %d after launch %d\n", tag, l);
    fflush(stdout);
    timespec pause{0, 100 * 1000 * 1000};
    nanosleep(&pause, nullptr);
  }
  printf("printf_tag %d: PASS\n", tag);
  return 0;
}
