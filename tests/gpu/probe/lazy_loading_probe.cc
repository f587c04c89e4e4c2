// lazy_loading_probe: which driver calls make the driver load a kernel under lazy loading
// (CUDA_MODULE_LOADING=LAZY, the default), as CUPTI's LAZY_FUNCTION_LOADING overhead
// records show. Run natively on the GPU machine: it loads a cubin with cuLibraryLoadData,
// then calls, one step at a time with a CUPTI flush after each, the queries flyt-server
// makes when it describes a library (enumerate, name, parameter layout) and then a launch,
// printing which step each overhead record came with.
// Owns: nothing of Flyt's; a diagnostic. Build: tests/gpu/README.md (Probes).
// usage: lazy_loading_probe KERNEL.cubin
#include <cuda.h>
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

namespace {

const char* g_step = "";

void CUPTIAPI Requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 1 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI Completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind != CUPTI_ACTIVITY_KIND_OVERHEAD) continue;
    auto* o = reinterpret_cast<CUpti_ActivityOverhead3*>(r);
    std::printf("step %-22s overhead kind %#x, %llu ns\n", g_step,
                static_cast<unsigned>(o->overheadKind),
                static_cast<unsigned long long>(o->end - o->start));
    free(o->overheadData);
  }
  free(buffer);
}

void Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  std::printf("%s failed: %d\n", what, r);
  std::exit(1);
}

void Step(const char* name) {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_step = name;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: lazy_loading_probe KERNEL.cubin\n");
    return 2;
  }
  std::ifstream f(argv[1], std::ios::binary);
  std::vector<char> image((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Check(cuInit(0), "cuInit");
  CUdevice dev;
  CUcontext ctx;
  Check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  Check(cuDevicePrimaryCtxRetain(&ctx, dev), "retain");
  Check(cuCtxSetCurrent(ctx), "set current");
  cuptiActivityRegisterCallbacks(Requested, Completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_OVERHEAD);
  Step("cuLibraryLoadData");
  CUlibrary lib;
  Check(cuLibraryLoadData(&lib, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0), "load");
  Step("cuLibraryEnumerate");
  unsigned count = 0;
  Check(cuLibraryGetKernelCount(&count, lib), "count");
  std::vector<CUkernel> ks(count);
  Check(cuLibraryEnumerateKernels(ks.data(), count, lib), "enumerate");
  Step("cuKernelGetName");
  for (CUkernel k : ks) {
    const char* name = nullptr;
    Check(cuKernelGetName(&name, k), "name");
  }
  Step("cuKernelGetParamInfo");
  for (CUkernel k : ks) {
    size_t off = 0, size = 0;
    for (size_t i = 0; cuKernelGetParamInfo(k, i, &off, &size) == CUDA_SUCCESS; ++i) {
    }
  }
  Step("cuKernelGetAttribute");
  for (CUkernel k : ks) {
    int v = 0;
    Check(cuKernelGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, k, dev), "attribute");
  }
  Step("cuKernelGetFunction");
  std::vector<CUfunction> fs;
  for (CUkernel k : ks) {
    CUfunction fn;
    Check(cuKernelGetFunction(&fn, k), "get function");
    fs.push_back(fn);
  }
  Step("cuLaunchKernel");
  CUdeviceptr buf;
  Check(cuMemAlloc(&buf, 4096), "alloc");
  void* args[] = {&buf};
  for (CUkernel k : ks)
    Check(cuLaunchKernel(reinterpret_cast<CUfunction>(k), 1, 1, 1, 32, 1, 1, 0, nullptr, args,
                         nullptr),
          "launch");
  Check(cuCtxSynchronize(), "sync");
  Step("end");
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::printf("kernels: %u\n", count);
  return 0;
}
