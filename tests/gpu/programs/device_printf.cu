// device_printf: printf from kernels, made deterministic: one thread prints
// per launch (or one block prints in lane order with __syncwarp between
// lines), each launch synchronised before the next host line; integer,
// float, string, hex, char, pointer-free formats; cudaDeviceSetLimit on the
// printf FIFO size. Host lines are flushed before each launch so the order
// of host and device lines is fixed.
// Runs among the others: each client process has a worker and a printf FIFO
// of its own, as on a local GPU.
#include "common.h"

__global__ void hello(int launch, float f, double d) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    printf("device: launch=%d int=%d neg=%d u=%u\n", launch, 42, -7, 4000000000u);
    printf("device: float=%.3f double=%.6f exp=%.2e\n", f, d, 1234.5);
    printf("device: str=%s char=%c hex=%x HEX=%08X ll=%lld\n", "flyt", 'Z', 0xbeef, 0xCAFEu,
           -9000000000LL);
    printf("device: percent=%% width=[%6d] left=[%-6d]\n", 12, 34);
  }
}

__global__ void ordered_lanes() {
  // One warp, lanes print one after the other.
  for (int lane = 0; lane < 4; ++lane) {
    if (threadIdx.x == lane) printf("device: lane %d of block %d\n", lane, blockIdx.x);
    __syncwarp();
  }
}

__global__ void many_lines(int n) {
  if (threadIdx.x == 0)
    for (int i = 0; i < n; ++i) printf("device: line %03d value %d\n", i, i * i);
}

int main() {
  size_t fifo = 0;
  CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 4 << 20));
  CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
  EXPECT(fifo >= (4u << 20), "printf fifo size");
  printf("host: before launches\n");
  fflush(stdout);
  for (int l = 0; l < 3; ++l) {
    hello<<<4, 64>>>(l, 1.25f * l, 3.141592653589793 * l);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    fflush(stdout);
    printf("host: after launch %d\n", l);
    fflush(stdout);
  }
  for (int b = 0; b < 2; ++b) {
    ordered_lanes<<<dim3(1), dim3(32)>>>();
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    fflush(stdout);
  }
  many_lines<<<1, 32>>>(200);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  fflush(stdout);
  printf("host: done\n");
  pass("device_printf");
  return 0;
}
