// async_mempool: stream-ordered allocation. cudaMallocAsync/cudaFreeAsync in
// a loop of varying sizes on the default pool (release threshold set and
// read back), allocation on one stream used and freed on another after an
// event, an explicit pool (cudaMemPoolCreate, cudaMallocFromPoolAsync,
// used-memory attributes, cudaMemPoolTrimTo, cudaDeviceSetMemPool /
// cudaDeviceGetMemPool, and the CUDA 13 calls by location: cudaMemGetDefaultMemPool,
// cudaMemSetMemPool, cudaMemGetMemPool for the device), all results checked.
#include <cstdint>
#include <vector>
#include "common.h"

__global__ void fill_seq(int* p, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = base + i;
}
__global__ void sum_into(const int* p, int n, unsigned long long* out) {
  unsigned long long acc = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    acc += p[i];
  atomicAdd(out, acc);
}

int main() {
  int dev = 0, supported = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev));
  EXPECT(supported == 1, "memory pools unsupported");
  cudaMemPool_t def;
  CHECK(cudaDeviceGetDefaultMemPool(&def, dev));
  uint64_t thr = 64ull << 20, thr_back = 0;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &thr));
  CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReleaseThreshold, &thr_back));
  printf("release threshold=%llu\n", static_cast<unsigned long long>(thr_back));

  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  unsigned long long* total;
  CHECK(cudaMalloc(&total, sizeof(unsigned long long)));
  CHECK(cudaMemsetAsync(total, 0, sizeof(unsigned long long), s1));
  unsigned long long expect = 0;
  for (int it = 0; it < 60; ++it) {
    int n = 1000 + (it * 7919) % 300000;
    int* p = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p), n * sizeof(int), s1));
    fill_seq<<<(n + 255) / 256, 256, 0, s1>>>(p, n, it);
    CHECK_LAUNCH();
    sum_into<<<64, 256, 0, s1>>>(p, n, total);
    CHECK_LAUNCH();
    CHECK(cudaFreeAsync(p, s1));
    expect +=
        static_cast<unsigned long long>(n) * it + static_cast<unsigned long long>(n) * (n - 1) / 2;
  }
  unsigned long long got = 0;
  CHECK(cudaMemcpyAsync(&got, total, sizeof(got), cudaMemcpyDeviceToHost, s1));
  CHECK(cudaStreamSynchronize(s1));
  printf("loop total=%llu expected=%llu\n", got, expect);
  EXPECT(got == expect, "loop total");

  // Allocate on s1, use and free on s2.
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const int n = 1 << 20;
  int* x = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&x), n * sizeof(int), s1));
  fill_seq<<<n / 256, 256, 0, s1>>>(x, n, 5);
  CHECK(cudaEventRecord(ev, s1));
  CHECK(cudaStreamWaitEvent(s2, ev, 0));
  CHECK(cudaMemsetAsync(total, 0, sizeof(unsigned long long), s2));
  sum_into<<<128, 256, 0, s2>>>(x, n, total);
  CHECK(cudaFreeAsync(x, s2));
  CHECK(cudaMemcpyAsync(&got, total, sizeof(got), cudaMemcpyDeviceToHost, s2));
  CHECK(cudaStreamSynchronize(s2));
  unsigned long long e2 = 5ull * n + static_cast<unsigned long long>(n) * (n - 1) / 2;
  printf("cross-stream total=%llu\n", got);
  EXPECT(got == e2, "cross-stream");

  // Explicit pool.
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t pool;
  CHECK(cudaMemPoolCreate(&pool, &props));
  int* y = nullptr;
  CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&y), 8 << 20, pool, s1));
  fill_seq<<<(2 << 20) / 256, 256, 0, s1>>>(y, 2 << 20, 1);
  CHECK(cudaMemsetAsync(total, 0, sizeof(unsigned long long), s1));
  sum_into<<<128, 256, 0, s1>>>(y, 2 << 20, total);
  CHECK(cudaStreamSynchronize(s1));
  uint64_t used = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used >= (8u << 20), "used memory while allocated");
  CHECK(cudaFreeAsync(y, s1));
  CHECK(cudaMemcpyAsync(&got, total, sizeof(got), cudaMemcpyDeviceToHost, s1));
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  printf("explicit pool total=%llu used_after_free=%llu\n", got,
         static_cast<unsigned long long>(used));
  EXPECT(used == 0, "used memory after free");
  CHECK(cudaMemPoolTrimTo(pool, 0));

  // Make it the device's current pool: plain cudaMallocAsync now draws from it.
  CHECK(cudaDeviceSetMemPool(dev, pool));
  cudaMemPool_t cur;
  CHECK(cudaDeviceGetMemPool(&cur, dev));
  EXPECT(cur == pool, "current pool");
  int* z = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&z), 1 << 20, s2));
  CHECK(cudaStreamSynchronize(s2));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used >= (1u << 20), "allocation from current pool");
  CHECK(cudaFreeAsync(z, s2));
  CHECK(cudaStreamSynchronize(s2));
  CHECK(cudaDeviceSetMemPool(dev, def));

  // The same through the CUDA 13 calls by memory location.
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = dev;
  cudaMemPool_t by_location = nullptr;
  CHECK(cudaMemGetDefaultMemPool(&by_location, &loc, cudaMemAllocationTypePinned));
  EXPECT(by_location == def, "cudaMemGetDefaultMemPool(device) is the device's default pool");
  CHECK(cudaMemSetMemPool(&loc, cudaMemAllocationTypePinned, pool));
  CHECK(cudaDeviceGetMemPool(&cur, dev));
  EXPECT(cur == pool, "cudaMemSetMemPool(device) sets the device's current pool");
  CHECK(cudaMemGetMemPool(&by_location, &loc, cudaMemAllocationTypePinned));
  EXPECT(by_location == pool, "cudaMemGetMemPool(device) is the current pool");
  CHECK(cudaMemSetMemPool(&loc, cudaMemAllocationTypePinned, def));
  printf("pools by location: ok\n");
  CHECK(cudaMemPoolDestroy(pool));

  CHECK(cudaEventDestroy(ev));
  CHECK(cudaFree(total));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  pass("async_mempool");
  return 0;
}
