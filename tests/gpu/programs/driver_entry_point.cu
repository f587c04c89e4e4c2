// driver_entry_point: driver API reached from a runtime program without
// linking libcuda: cudaGetDriverEntryPointByVersion (and the deprecated
// cudaGetDriverEntryPoint) for cuMemAlloc/cuMemcpyHtoD/DtoH/DtoD/
// cuMemsetD8/D32/cuMemFree/cuMemGetInfo/cuPointerGetAttribute/cuCtxGetCurrent/
// cuCtxGetDevice/cuDeviceGetAttribute/cuDriverGetVersion/cuGetErrorName/
// cuLaunchKernel (on a CUfunction from cudaGetFuncBySymbol)/cuStreamSynchronize;
// the per-thread-default-stream variant of cuMemcpyHtoDAsync; a symbol that
// does not exist.
#include <cuda.h>
#include <vector>
#include "common.h"

typedef CUresult(CUDAAPI* PFN_MemAlloc)(CUdeviceptr*, size_t);
typedef CUresult(CUDAAPI* PFN_MemFree)(CUdeviceptr);
typedef CUresult(CUDAAPI* PFN_MemcpyHtoD)(CUdeviceptr, const void*, size_t);
typedef CUresult(CUDAAPI* PFN_MemcpyDtoH)(void*, CUdeviceptr, size_t);
typedef CUresult(CUDAAPI* PFN_MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult(CUDAAPI* PFN_MemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
typedef CUresult(CUDAAPI* PFN_MemsetD32)(CUdeviceptr, unsigned int, size_t);
typedef CUresult(CUDAAPI* PFN_MemsetD8)(CUdeviceptr, unsigned char, size_t);
typedef CUresult(CUDAAPI* PFN_MemGetInfo)(size_t*, size_t*);
typedef CUresult(CUDAAPI* PFN_PointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr);
typedef CUresult(CUDAAPI* PFN_CtxGetCurrent)(CUcontext*);
typedef CUresult(CUDAAPI* PFN_CtxGetDevice)(CUdevice*);
typedef CUresult(CUDAAPI* PFN_DeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
typedef CUresult(CUDAAPI* PFN_DriverGetVersion)(int*);
typedef CUresult(CUDAAPI* PFN_GetErrorName)(CUresult, const char**);
typedef CUresult(CUDAAPI* PFN_LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                            unsigned, unsigned, unsigned, CUstream, void**, void**);
typedef CUresult(CUDAAPI* PFN_StreamSynchronize)(CUstream);

__global__ void triple(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 3 + 1;
}

template <typename F>
static F get(const char* name, unsigned int version, unsigned long long flags = cudaEnableDefault) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  CHECK(cudaGetDriverEntryPointByVersion(name, &fn, version, flags, &q));
  EXPECT(q == cudaDriverEntryPointSuccess && fn != nullptr, "entry point %s", name);
  return reinterpret_cast<F>(fn);
}

int main() {
  CHECK(cudaFree(0));  // make sure the primary context exists
  auto memAlloc = get<PFN_MemAlloc>("cuMemAlloc", 3020);
  auto memFree = get<PFN_MemFree>("cuMemFree", 3020);
  auto htod = get<PFN_MemcpyHtoD>("cuMemcpyHtoD", 3020);
  auto dtoh = get<PFN_MemcpyDtoH>("cuMemcpyDtoH", 3020);
  auto dtod = get<PFN_MemcpyDtoD>("cuMemcpyDtoD", 3020);
  auto htodAsyncPt =
      get<PFN_MemcpyHtoDAsync>("cuMemcpyHtoDAsync", 12000, cudaEnablePerThreadDefaultStream);
  auto memsetD32 = get<PFN_MemsetD32>("cuMemsetD32", 3020);
  auto memsetD8 = get<PFN_MemsetD8>("cuMemsetD8", 3020);
  auto memGetInfo = get<PFN_MemGetInfo>("cuMemGetInfo", 3020);
  auto ptrAttr = get<PFN_PointerGetAttribute>("cuPointerGetAttribute", 4000);
  auto ctxGetCurrent = get<PFN_CtxGetCurrent>("cuCtxGetCurrent", 4000);
  auto ctxGetDevice = get<PFN_CtxGetDevice>("cuCtxGetDevice", 2000);
  auto devAttr = get<PFN_DeviceGetAttribute>("cuDeviceGetAttribute", 2000);
  auto drvVersion = get<PFN_DriverGetVersion>("cuDriverGetVersion", 2020);
  auto errName = get<PFN_GetErrorName>("cuGetErrorName", 6000);
  auto launch = get<PFN_LaunchKernel>("cuLaunchKernel", 4000);
  auto streamSync =
      get<PFN_StreamSynchronize>("cuStreamSynchronize", 12000, cudaEnablePerThreadDefaultStream);

  // Deprecated spelling of the same query.
  {
#pragma nv_diag_suppress 1444
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    CHECK(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &q));
#pragma GCC diagnostic pop
    EXPECT(q == cudaDriverEntryPointSuccess && fn != nullptr, "deprecated entry point query");
    printf("cudaGetDriverEntryPoint(cuMemAlloc): found\n");
  }
  // A symbol that does not exist.
  {
    void* fn = reinterpret_cast<void*>(1);
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
    cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuFlytDoesNotExist", &fn, 13000, cudaEnableDefault, &q);
    printf("missing symbol: return=%s status=%d fn_null=%d\n", cudaGetErrorName(e),
           static_cast<int>(q), fn == nullptr);
    EXPECT(q == cudaDriverEntryPointSymbolNotFound, "missing symbol status");
    printf("last_error=%s\n", cudaGetErrorName(cudaGetLastError()));
  }

  CUcontext ctx = nullptr;
  CU_CHECK(ctxGetCurrent(&ctx));
  EXPECT(ctx != nullptr, "no current context");
  CUdevice dev = -1;
  CU_CHECK(ctxGetDevice(&dev));
  int major = 0, minor = 0, version = 0;
  CU_CHECK(devAttr(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CU_CHECK(devAttr(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  CU_CHECK(drvVersion(&version));
  printf("compute capability %d.%d, driver >= 13000: %s\n", major, minor,
         version >= 13000 ? "yes" : "no");
  const char* name = nullptr;
  CU_CHECK(errName(CUDA_ERROR_INVALID_VALUE, &name));
  printf("cuGetErrorName(1)=%s\n", name);
  size_t free_b = 0, total_b = 0;
  CU_CHECK(memGetInfo(&free_b, &total_b));
  EXPECT(total_b > 0 && free_b <= total_b, "cuMemGetInfo");

  const int n = 65536 + 11;
  std::vector<int> h(n), o(n);
  for (int i = 0; i < n; ++i) h[i] = i - 30000;
  CUdeviceptr a = 0, b = 0;
  CU_CHECK(memAlloc(&a, n * sizeof(int)));
  CU_CHECK(memAlloc(&b, n * sizeof(int)));
  unsigned int mtype = 0;
  CU_CHECK(ptrAttr(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a));
  printf("memory type of cuMemAlloc pointer: %s\n",
         mtype == CU_MEMORYTYPE_DEVICE ? "device" : "other");
  EXPECT(mtype == CU_MEMORYTYPE_DEVICE, "pointer attribute");
  CU_CHECK(memsetD32(b, 0xdeadbeefu, n));
  CU_CHECK(memsetD8(b, 0x11, 6));  // first 6 bytes
  CU_CHECK(htod(a, h.data(), n * sizeof(int)));
  // Launch through the driver on the runtime kernel's CUfunction.
  cudaFunction_t fn;
  CHECK(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(triple)));
  int nn = n;
  void* args[] = {&a, &nn};
  CU_CHECK(launch(reinterpret_cast<CUfunction>(fn), (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr,
                  args, nullptr));
  CU_CHECK(dtoh(o.data(), a, n * sizeof(int)));
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += o[i] != h[i] * 3 + 1;
  CU_CHECK(dtoh(o.data(), b, n * sizeof(int)));
  const unsigned char* ob = reinterpret_cast<const unsigned char*>(o.data());
  for (int i = 0; i < 6; ++i) bad += ob[i] != 0x11;
  bad += ob[6] != 0xad || ob[7] != 0xde;
  for (int i = 2; i < n; ++i) bad += static_cast<unsigned int>(o[i]) != 0xdeadbeefu;
  // Device-to-device, then the per-thread-stream async upload.
  CU_CHECK(dtod(b, a, n * sizeof(int)));
  CU_CHECK(htodAsyncPt(a, h.data(), 1000 * sizeof(int), nullptr));
  CU_CHECK(streamSync(nullptr));
  CU_CHECK(dtoh(o.data(), b, n * sizeof(int)));
  for (int i = 0; i < n; ++i) bad += o[i] != h[i] * 3 + 1;
  CU_CHECK(dtoh(o.data(), a, 2000 * sizeof(int)));
  for (int i = 0; i < 2000; ++i) bad += o[i] != (i < 1000 ? h[i] : h[i] * 3 + 1);
  printf("driver api mismatches=%d checksum=%016llx\n", bad,
         (unsigned long long)fnv1a(o.data(), 2000 * sizeof(int)));
  EXPECT(bad == 0, "driver API results");
  CU_CHECK(memFree(a));
  CU_CHECK(memFree(b));
  pass("driver_entry_point");
  return 0;
}
