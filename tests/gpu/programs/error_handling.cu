// error_handling: recoverable (non-sticky) errors and the last-error state.
// An impossible cudaMalloc, an invalid device, launches with bad
// configurations (cudaPeekAtLastError keeps the error, cudaGetLastError
// clears it), cudaFuncGetAttributes on a host function, a copy to a host
// variable as symbol, cudaFree of a bogus pointer, cudaFree(nullptr). After
// all of them the context must still work. Prints every error name.
#include <vector>
#include "common.h"

__global__ void ok_kernel(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i ^ 0x55;
}

static int host_var = 0;
static void host_function() {}

static void report(const char* what, cudaError_t e) {
  printf("%-36s -> %s\n", what, cudaGetErrorName(e));
}

int main() {
  printf("string(cudaErrorMemoryAllocation)=%s\n", cudaGetErrorString(cudaErrorMemoryAllocation));
  CHECK(cudaFree(0));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, 1ull << 50);
  report("cudaMalloc(1 PiB)", e);
  EXPECT(e == cudaErrorMemoryAllocation, "huge malloc");
  report("cudaGetLastError", cudaGetLastError());
  report("cudaGetLastError again", cudaGetLastError());

  e = cudaSetDevice(9999);
  report("cudaSetDevice(9999)", e);
  EXPECT(e == cudaErrorInvalidDevice, "invalid device");
  report("cudaGetLastError", cudaGetLastError());
  int dev = -1;
  CHECK(cudaGetDevice(&dev));
  EXPECT(dev == 0, "device unchanged");

  int* d;
  const int n = 4096;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  ok_kernel<<<1, 2048>>>(d, n);
  report("launch 2048 threads/block: peek", cudaPeekAtLastError());
  report("peek again", cudaPeekAtLastError());
  report("get", cudaGetLastError());
  report("get again", cudaGetLastError());
  ok_kernel<<<dim3(1, 70000), 32>>>(d, n);
  report("launch grid.y=70000", cudaGetLastError());
  ok_kernel<<<0, 32>>>(d, n);
  report("launch 0 blocks", cudaGetLastError());

  cudaFuncAttributes fa;
  e = cudaFuncGetAttributes(&fa, reinterpret_cast<const void*>(host_function));
  report("cudaFuncGetAttributes(host fn)", e);
  EXPECT(e != cudaSuccess, "attributes of a host function");
  cudaGetLastError();
  e = cudaMemcpyToSymbol(host_var, &n, sizeof(int));
  report("cudaMemcpyToSymbol(host variable)", e);
  EXPECT(e != cudaSuccess, "copy to host variable as symbol");
  cudaGetLastError();
  e = cudaFree(reinterpret_cast<void*>(0x1234));
  report("cudaFree(bogus)", e);
  EXPECT(e != cudaSuccess, "free of a bogus pointer");
  cudaGetLastError();
  report("cudaFree(nullptr)", cudaFree(nullptr));
  report("cudaDeviceSynchronize", cudaDeviceSynchronize());

  // The context still works.
  ok_kernel<<<n / 256, 256>>>(d, n);
  CHECK_LAUNCH();
  std::vector<int> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += h[i] != (i ^ 0x55);
  printf("after errors: mismatches=%d\n", bad);
  EXPECT(bad == 0, "context after errors");
  CHECK(cudaFree(d));
  pass("error_handling");
  return 0;
}
