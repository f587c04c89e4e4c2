// occupancy_props: device properties (only fields that are the same on every
// Hopper H100/H200: compute capability, limits, shared memory, registers),
// cross-checked against cudaDeviceGetAttribute; cudaGetDeviceCount,
// cudaDeviceGetPCIBusId -> cudaDeviceGetByPCIBusId round trip (not printed),
// runtime/driver versions, device limits (stack size set/get), the occupancy
// API (cudaOccupancyMaxActiveBlocksPerMultiprocessor[WithFlags],
// cudaOccupancyMaxPotentialBlockSize, cudaOccupancyAvailableDynamicSMemPerBlock)
// and cudaFuncGetAttributes; the driver's cuOccupancyMaxPotentialBlockSize
// [WithFlags] (Numba's max_potential_block_size), with a per-block-size
// dynamic shared memory callback and a block size limit. Nothing that depends
// on the SM count, memory size or clocks is printed.
// FLYT_LIBS: -lcuda
#include "common.h"

// Dynamic shared memory a block of `block` threads needs (the driver calls it).
static size_t SmemPerBlock(int block) { return static_cast<size_t>(block) * 96; }

__global__ void light(float* p) { p[threadIdx.x] += 1.f; }

__global__ void __launch_bounds__(256) heavy(float* p, int n) {
  float acc[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) acc[k] = p[(threadIdx.x + k * 97) % n];
  float s = 0;
#pragma unroll
  for (int k = 0; k < 16; ++k) s += acc[k] * acc[(k + 3) % 16];
  p[threadIdx.x] = s;
}

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  EXPECT(count >= 1, "no device");
  CHECK(cudaSetDevice(0));
  int dev = -1;
  CHECK(cudaGetDevice(&dev));
  EXPECT(dev == 0, "current device");
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  printf("cc=%d.%d warpSize=%d maxThreadsPerBlock=%d maxThreadsDim=%d,%d,%d maxGridSize=%d,%d,%d\n",
         p.major, p.minor, p.warpSize, p.maxThreadsPerBlock, p.maxThreadsDim[0], p.maxThreadsDim[1],
         p.maxThreadsDim[2], p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
  printf(
      "sharedMemPerBlock=%zu optin=%zu perSM=%zu regsPerBlock=%d regsPerSM=%d totalConstMem=%zu\n",
      p.sharedMemPerBlock, p.sharedMemPerBlockOptin, p.sharedMemPerMultiprocessor, p.regsPerBlock,
      p.regsPerMultiprocessor, p.totalConstMem);
  printf(
      "maxThreadsPerSM=%d maxBlocksPerSM=%d unifiedAddressing=%d managedMemory=%d "
      "concurrentKernels=%d "
      "cooperativeLaunch=%d canMapHostMemory=%d\n",
      p.maxThreadsPerMultiProcessor, p.maxBlocksPerMultiProcessor, p.unifiedAddressing,
      p.managedMemory, p.concurrentKernels, p.cooperativeLaunch, p.canMapHostMemory);
  EXPECT(p.major == 9 && p.minor == 0, "expected sm_90");
  EXPECT(p.multiProcessorCount > 0 && p.totalGlobalMem > 0, "SMs and memory");

  // Attributes must agree with the properties.
  struct {
    cudaDeviceAttr a;
    int v;
    const char* name;
  } checks[] = {
      {cudaDevAttrComputeCapabilityMajor, p.major, "major"},
      {cudaDevAttrComputeCapabilityMinor, p.minor, "minor"},
      {cudaDevAttrMultiProcessorCount, p.multiProcessorCount, "sm count"},
      {cudaDevAttrMaxThreadsPerBlock, p.maxThreadsPerBlock, "threads/block"},
      {cudaDevAttrMaxSharedMemoryPerBlockOptin, static_cast<int>(p.sharedMemPerBlockOptin),
       "optin"},
      {cudaDevAttrWarpSize, p.warpSize, "warp"},
      {cudaDevAttrMaxRegistersPerBlock, p.regsPerBlock, "regs"},
      {cudaDevAttrL2CacheSize, p.l2CacheSize, "l2"},
  };
  for (auto& c : checks) {
    int v = -1;
    CHECK(cudaDeviceGetAttribute(&v, c.a, 0));
    EXPECT(v == c.v, "attribute %s: %d vs %d", c.name, v, c.v);
  }
  printf("attributes agree with properties\n");

  char bus[64] = {};
  CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), 0));
  int by_bus = -1;
  CHECK(cudaDeviceGetByPCIBusId(&by_bus, bus));
  EXPECT(by_bus == 0, "PCI bus id round trip");

  int rt = 0, drv = 0;
  CHECK(cudaRuntimeGetVersion(&rt));
  CHECK(cudaDriverGetVersion(&drv));
  printf("runtime=%d driver>=runtime: %s\n", rt, drv >= rt ? "yes" : "no");

  size_t stack = 0;
  CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
  CHECK(cudaDeviceGetLimit(&stack, cudaLimitStackSize));
  printf("stack limit after set: %zu\n", stack);
  size_t freeb = 0, totalb = 0;
  CHECK(cudaMemGetInfo(&freeb, &totalb));
  EXPECT(totalb > 0 && freeb <= totalb, "cudaMemGetInfo");

  const int sizes[] = {32, 128, 256, 1024};
  for (int bs : sizes) {
    int blocks = 0, blocks_smem = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, light, bs, 0));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks_smem, light, bs, 40 * 1024,
                                                                 cudaOccupancyDefault));
    printf("light block=%d active_blocks_per_sm=%d with_40KiB_smem=%d\n", bs, blocks, blocks_smem);
  }
  int hb = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&hb, heavy, 256, 0));
  printf("heavy block=256 active_blocks_per_sm=%d\n", hb);
  int min_grid = 0, best_block = 0;
  CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &best_block, heavy, 0, 0));
  printf("heavy max potential block size=%d\n", best_block);
  EXPECT(min_grid > 0, "min grid");
  size_t avail = 0;
  CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&avail, light, 2, 256));
  printf("light available dynamic smem with 2 blocks of 256: %zu\n", avail);

  // The driver API form, as Numba and other driver-API users call it.
  CUfunction light_fn = nullptr, heavy_fn = nullptr;
  CHECK(cudaGetFuncBySymbol(&light_fn, reinterpret_cast<const void*>(light)));
  CHECK(cudaGetFuncBySymbol(&heavy_fn, reinterpret_cast<const void*>(heavy)));
  int drv_grid = 0, drv_block = 0;
  CU_CHECK(cuOccupancyMaxPotentialBlockSize(&drv_grid, &drv_block, heavy_fn, nullptr, 0, 0));
  printf("driver heavy potential block=%d grid_positive=%d\n", drv_block, drv_grid > 0);
  CU_CHECK(cuOccupancyMaxPotentialBlockSize(&drv_grid, &drv_block, light_fn, SmemPerBlock, 0, 0));
  printf("driver light potential block with callback=%d\n", drv_block);
  CU_CHECK(cuOccupancyMaxPotentialBlockSize(&drv_grid, &drv_block, light_fn, nullptr, 4096, 200));
  printf("driver light potential block limit 200=%d\n", drv_block);
  CU_CHECK(cuOccupancyMaxPotentialBlockSizeWithFlags(&drv_grid, &drv_block, light_fn, nullptr, 0, 0,
                                                     CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE));
  printf("driver light potential block with flags=%d\n", drv_block);
  printf("driver null output=%d\n", static_cast<int>(cuOccupancyMaxPotentialBlockSize(
                                        nullptr, &drv_block, light_fn, nullptr, 0, 0)));

  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, heavy));
  printf("heavy: maxThreadsPerBlock=%d binaryVersion=%d ptxVersion=%d localSizeBytes=%zu\n",
         fa.maxThreadsPerBlock, fa.binaryVersion, fa.ptxVersion, fa.localSizeBytes);
  EXPECT(fa.maxThreadsPerBlock == 256, "launch bounds");

  float* d;
  CHECK(cudaMalloc(&d, 1024 * sizeof(float)));
  CHECK(cudaMemset(d, 0, 1024 * sizeof(float)));
  heavy<<<1, 256>>>(d, 1024);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(d));
  pass("occupancy_props");
  return 0;
}
