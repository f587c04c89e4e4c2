// device_query: device enumeration, properties, attributes, versions and memory info must
// match the Flyt sim device, the 1D linear texture limit must be there, and the client must
// answer the same from several threads.
// Prints one "key=value" line per fact, then "device_query: PASS". With FLYT_E2E_NATIVE=1
// (a real GPU, with or without Flyt) the checks of the sim device's identity are skipped.
#include <thread>
#include <vector>

#include "e2e_common.h"

namespace {

constexpr const char* kSimName = "Flyt Simulated GPU";
constexpr size_t kSimTotalMem = 85899345920ull;  // 80 GiB
constexpr int kSimSMs = 132;

int Attr(cudaDeviceAttr attr, const char* name) {
  int v = -12345;
  cudaError_t err = cudaDeviceGetAttribute(&v, attr, 0);
  if (err != cudaSuccess)
    ::e2e::Fail(__FILE__, __LINE__, "cudaDeviceGetAttribute(%s) returned %d (%s)", name,
                static_cast<int>(err), cudaGetErrorName(err));
  printf("attr.%s=%d\n", name, v);
  return v;
}

}  // namespace

int main() {
  e2e::Init("device_query");
  const char* native_env = getenv("FLYT_E2E_NATIVE");
  const bool sim = !(native_env && strcmp(native_env, "1") == 0);
  printf("expect_sim_device=%d\n", sim ? 1 : 0);

  e2e::Step("cudaDriverGetVersion");
  int driver = 0;
  CK(cudaDriverGetVersion(&driver));
  printf("driver_version=%d\n", driver);
  EXPECT(driver >= 13000, "driver version %d is below 13000, which CUDA 13 cudart needs", driver);

  e2e::Step("cudaRuntimeGetVersion");
  int runtime = 0;
  CK(cudaRuntimeGetVersion(&runtime));
  printf("runtime_version=%d\n", runtime);
  EXPECT(runtime == CUDART_VERSION, "runtime %d, built with %d", runtime, CUDART_VERSION);

  e2e::Step("cudaGetDeviceCount");
  int count = -1;
  CK(cudaGetDeviceCount(&count));
  printf("device_count=%d\n", count);
  EXPECT(sim ? count == 1 : count >= 1, "the sim server exposes exactly one device, got %d", count);

  e2e::Step("cudaSetDevice/cudaGetDevice");
  CK(cudaSetDevice(0));
  int dev = -1;
  CK(cudaGetDevice(&dev));
  EXPECT(dev == 0, "current device %d", dev);

  e2e::Step("cudaGetDeviceProperties");
  cudaDeviceProp prop;
  memset(&prop, 0, sizeof(prop));
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("name=%s\n", prop.name);
  printf("compute_capability=%d.%d\n", prop.major, prop.minor);
  printf("multiprocessors=%d\n", prop.multiProcessorCount);
  printf("total_global_mem=%zu\n", prop.totalGlobalMem);
  printf("warp_size=%d\n", prop.warpSize);
  printf("max_threads_per_block=%d\n", prop.maxThreadsPerBlock);
  printf("max_threads_dim=%d,%d,%d\n", prop.maxThreadsDim[0], prop.maxThreadsDim[1],
         prop.maxThreadsDim[2]);
  printf("max_grid_size=%d,%d,%d\n", prop.maxGridSize[0], prop.maxGridSize[1], prop.maxGridSize[2]);
  printf("shared_mem_per_block=%zu\n", prop.sharedMemPerBlock);
  if (sim) {
    EXPECT(strcmp(prop.name, kSimName) == 0, "name \"%s\", want \"%s\"", prop.name, kSimName);
    EXPECT(prop.major == 9 && prop.minor == 0, "compute capability %d.%d", prop.major, prop.minor);
    EXPECT(prop.multiProcessorCount == kSimSMs, "SM count %d", prop.multiProcessorCount);
    EXPECT(prop.totalGlobalMem == kSimTotalMem, "totalGlobalMem %zu", prop.totalGlobalMem);
  }
  EXPECT(prop.warpSize == 32, "warpSize %d", prop.warpSize);
  EXPECT(prop.maxThreadsPerBlock == 1024, "maxThreadsPerBlock %d", prop.maxThreadsPerBlock);

  e2e::Step("cudaDeviceGetAttribute");
  EXPECT(Attr(cudaDevAttrComputeCapabilityMajor, "cc_major") == prop.major, "cc major");
  EXPECT(Attr(cudaDevAttrComputeCapabilityMinor, "cc_minor") == prop.minor, "cc minor");
  EXPECT(Attr(cudaDevAttrMultiProcessorCount, "multiprocessor_count") == prop.multiProcessorCount,
         "SMs");
  EXPECT(Attr(cudaDevAttrWarpSize, "warp_size") == 32, "warp size");
  EXPECT(Attr(cudaDevAttrMaxThreadsPerBlock, "max_threads_per_block") == 1024, "max threads");
  // Attributes and properties must agree whatever values the server reports.
  EXPECT(Attr(cudaDevAttrMaxBlockDimX, "max_block_dim_x") == prop.maxThreadsDim[0], "dim x");
  EXPECT(Attr(cudaDevAttrMaxBlockDimY, "max_block_dim_y") == prop.maxThreadsDim[1], "dim y");
  EXPECT(Attr(cudaDevAttrMaxBlockDimZ, "max_block_dim_z") == prop.maxThreadsDim[2], "dim z");
  EXPECT(Attr(cudaDevAttrMaxGridDimX, "max_grid_dim_x") == prop.maxGridSize[0], "grid x");
  EXPECT(Attr(cudaDevAttrMaxGridDimY, "max_grid_dim_y") == prop.maxGridSize[1], "grid y");
  EXPECT(Attr(cudaDevAttrMaxGridDimZ, "max_grid_dim_z") == prop.maxGridSize[2], "grid z");
  EXPECT(static_cast<size_t>(Attr(cudaDevAttrMaxSharedMemoryPerBlock,
                                  "max_shared_memory_per_block")) == prop.sharedMemPerBlock,
         "shared memory per block");
  EXPECT(Attr(cudaDevAttrMaxThreadsPerMultiProcessor, "max_threads_per_multiprocessor") ==
             prop.maxThreadsPerMultiProcessor,
         "threads per SM");
  EXPECT(Attr(cudaDevAttrL2CacheSize, "l2_cache_size") == prop.l2CacheSize, "L2 size");
  EXPECT(Attr(cudaDevAttrUnifiedAddressing, "unified_addressing") == prop.unifiedAddressing,
         "unified addressing");

  e2e::Step("cudaDeviceGetAttribute on a bad ordinal");
  {
    int v = 0;
    cudaError_t err = cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 7);
    printf("bad_ordinal_error=%s\n", cudaGetErrorName(err));
    EXPECT(err == cudaErrorInvalidDevice, "device 7 gave %d (%s)", static_cast<int>(err),
           cudaGetErrorName(err));
    cudaGetLastError();  // clear the runtime's last error
    // An attribute beyond the driver's list is the driver's INVALID_VALUE.
    err = cudaDeviceGetAttribute(&v, cudaDevAttrMax, 0);
    printf("attr_max_error=%s\n", cudaGetErrorName(err));
    EXPECT(err == cudaErrorInvalidValue, "cudaDevAttrMax gave %d (%s)", static_cast<int>(err),
           cudaGetErrorName(err));
    cudaGetLastError();
  }

  e2e::Step("cudaDeviceGetTexture1DLinearMaxWidth");
  {
    // The limit itself is the device's; that there is one is what is checked.
    size_t width = 0;
    cudaChannelFormatDesc fmt = cudaCreateChannelDesc<float4>();
    CK(cudaDeviceGetTexture1DLinearMaxWidth(&width, &fmt, 0));
    printf("texture1d_linear_max_width_positive=%d\n", width > 0 ? 1 : 0);
    EXPECT(width > 0, "cudaDeviceGetTexture1DLinearMaxWidth gave 0");
  }

  e2e::Step("cudaMemGetInfo");
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  printf("mem_free=%zu\n", free_b);
  printf("mem_total=%zu\n", total_b);
  EXPECT(total_b == prop.totalGlobalMem, "cudaMemGetInfo total %zu, totalGlobalMem %zu", total_b,
         prop.totalGlobalMem);
  EXPECT(free_b > 0 && free_b <= total_b, "free %zu of %zu", free_b, total_b);

  e2e::Step("four threads querying at once");
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  const int want_sms = prop.multiProcessorCount;
  const size_t want_total = prop.totalGlobalMem;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &bad, want_sms, want_total] {
      for (int i = 0; i < 50; ++i) {
        int sms = 0, warp = 0;
        size_t f = 0, tot = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
            sms != want_sms)
          bad[t]++;
        if (cudaDeviceGetAttribute(&warp, cudaDevAttrWarpSize, 0) != cudaSuccess || warp != 32)
          bad[t]++;
        if (cudaMemGetInfo(&f, &tot) != cudaSuccess || tot != want_total) bad[t]++;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT(bad[t] == 0, "thread %d saw %d wrong answers", t, bad[t]);

  e2e::Step("cudaDeviceSynchronize");
  CK(cudaDeviceSynchronize());
  e2e::Pass();
  return 0;
}
