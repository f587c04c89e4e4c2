// mapped_zero_copy: kernels that read and write host memory directly
// (cudaHostAllocMapped + cudaHostGetDevicePointer, and cudaHostRegister with
// cudaHostRegisterMapped), the host seeing the device's writes after a
// synchronize, and a device spin-waiting on a flag the host sets. This needs
// the GPU to reach the application's memory: over a network transport it is
// expected to need special support.
#include <atomic>
#include <vector>
#include "common.h"

__global__ void square_in_place(int* host_mem, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) host_mem[i] = host_mem[i] * host_mem[i];
}

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void wait_flag(volatile int* flag, volatile int* out) {
  unsigned long long start = global_ns();
  while (*flag == 0 && global_ns() - start < 20ull * 1000 * 1000 * 1000) {  // at most 20 s
  }
  *out = *flag + 1;
}

int main() {
  int dev = 0, can_map = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, dev));
  EXPECT(can_map == 1, "cannot map host memory");
  const int n = 100000;
  int* h;
  CHECK(cudaHostAlloc(&h, n * sizeof(int), cudaHostAllocMapped));
  for (int i = 0; i < n; ++i) h[i] = i % 1000 - 500;
  int* dptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dptr), h, 0));
  square_in_place<<<(n + 255) / 256, 256>>>(dptr, n);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += h[i] != (i % 1000 - 500) * (i % 1000 - 500);
  printf("cudaHostAllocMapped mismatches=%d checksum=%016llx\n", bad,
         (unsigned long long)fnv1a(h, n * sizeof(int)));
  EXPECT(bad == 0, "mapped alloc");

  std::vector<int> buf(n + 4096);
  int* reg = buf.data();
  for (int i = 0; i < n; ++i) reg[i] = i % 77;
  CHECK(cudaHostRegister(reg, n * sizeof(int), cudaHostRegisterMapped));
  int* dreg;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dreg), reg, 0));
  square_in_place<<<(n + 255) / 256, 256>>>(dreg, n);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  bad = 0;
  for (int i = 0; i < n; ++i) bad += reg[i] != (i % 77) * (i % 77);
  printf("cudaHostRegisterMapped mismatches=%d\n", bad);
  EXPECT(bad == 0, "mapped register");
  CHECK(cudaHostUnregister(reg));

  // Host-to-device signalling through mapped memory while a kernel runs.
  int* flags;
  CHECK(cudaHostAlloc(&flags, 2 * sizeof(int), cudaHostAllocMapped));
  flags[0] = 0;
  flags[1] = 0;
  int* dflags;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dflags), flags, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  wait_flag<<<1, 1, 0, s>>>(dflags, dflags + 1);
  CHECK_LAUNCH();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  reinterpret_cast<volatile int*>(flags)[0] = 41;
  CHECK(cudaStreamSynchronize(s));
  printf("flag handshake: device saw %d\n", flags[1]);
  EXPECT(flags[1] == 42, "handshake");
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFreeHost(flags));
  CHECK(cudaFreeHost(h));
  pass("mapped_zero_copy");
  return 0;
}
