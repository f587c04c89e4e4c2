// first_kernel: time from process start to the end of the first kernel.
// Records CLOCK_REALTIME at main() entry and once the first kernel launch +
// cudaDeviceSynchronize have returned, then checks that the kernel ran.
// Prints the line the isolation harness parses, then "first_kernel: ok":
//   first_kernel: main_ns=<ns> done_ns=<ns> spawn_ns=<ns or 0>
// spawn_ns is $FLYT_ISO_SPAWN_NS (the harness's CLOCK_REALTIME just before it
// started the process), so spawn->done can be read from this line alone.
// Exit 0 on success, 1 when a CUDA call fails, 2 when the kernel did not run.
#include <time.h>

#include "common.h"

static long long realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

__device__ int g_mark;

__global__ void mark(int v) {
  if (threadIdx.x == 0 && blockIdx.x == 0) g_mark = v;
}

int main() {
  const long long main_ns = realtime_ns();
  mark<<<1, 32>>>(42);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  const long long done_ns = realtime_ns();
  const char* spawn = getenv("FLYT_ISO_SPAWN_NS");
  long long spawn_ns = spawn != nullptr ? atoll(spawn) : 0;
  printf("first_kernel: main_ns=%lld done_ns=%lld spawn_ns=%lld\n", main_ns, done_ns, spawn_ns);
  int v = 0;
  CHECK(cudaMemcpyFromSymbol(&v, g_mark, sizeof(v)));
  EXPECT(v == 42, "kernel wrote %d, expected 42", v);
  printf("first_kernel: ok\n");
  return 0;
}
