// nvrtc_jit: run-time compilation. NVRTC compiles a source with an extern "C"
// kernel and a template instantiated through a name expression; the CUBIN
// (sm_90) is loaded with cudaLibraryLoadData and launched through
// cudaLibraryGetKernel + cudaLaunchKernel; the PTX (compute_90) is loaded
// with the driver's cuModuleLoadData (JIT on the GPU host) through an entry
// point, its __device__ global read with cuModuleGetGlobal, and launched with
// cuLaunchKernel.
// FLYT_LIBS: -lnvrtc
#include <cuda.h>
#include <nvrtc.h>
#include <string>
#include <vector>
#include "common.h"

#define NVRTC_CHECK(call)                                                                          \
  do {                                                                                             \
    nvrtcResult r_ = (call);                                                                       \
    if (r_ != NVRTC_SUCCESS) {                                                                     \
      printf("NVRTC error %s in %s:%d: %s\n", nvrtcGetErrorString(r_), __FILE__, __LINE__, #call); \
      fflush(stdout);                                                                              \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static const char* kSource = R"(
__device__ int jit_counter = 100;
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
  if (i == 0) atomicAdd(&jit_counter, 1);
}
template <typename T> __global__ void scale(T* p, T f, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= f;
}
)";

typedef CUresult(CUDAAPI* PFN_ModuleLoadData)(CUmodule*, const void*);
typedef CUresult(CUDAAPI* PFN_ModuleGetFunction)(CUfunction*, CUmodule, const char*);
typedef CUresult(CUDAAPI* PFN_ModuleGetGlobal)(CUdeviceptr*, size_t*, CUmodule, const char*);
typedef CUresult(CUDAAPI* PFN_ModuleUnload)(CUmodule);
typedef CUresult(CUDAAPI* PFN_LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                            unsigned, unsigned, unsigned, CUstream, void**, void**);

template <typename F>
static F get(const char* name, unsigned int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q));
  EXPECT(q == cudaDriverEntryPointSuccess && fn, "entry point %s", name);
  return reinterpret_cast<F>(fn);
}

static std::vector<char> compile(const char* arch, bool cubin, std::string* lowered) {
  nvrtcProgram prog;
  NVRTC_CHECK(nvrtcCreateProgram(&prog, kSource, "jit.cu", 0, nullptr, nullptr));
  NVRTC_CHECK(nvrtcAddNameExpression(prog, "scale<int>"));
  const char* opts[] = {arch, "-default-device"};
  nvrtcResult r = nvrtcCompileProgram(prog, 2, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, &log[0]);
    fprintf(stderr, "%s\n", log.c_str());
    NVRTC_CHECK(r);
  }
  const char* name = nullptr;
  NVRTC_CHECK(nvrtcGetLoweredName(prog, "scale<int>", &name));
  *lowered = name;
  size_t size = 0;
  std::vector<char> out;
  if (cubin) {
    NVRTC_CHECK(nvrtcGetCUBINSize(prog, &size));
    out.resize(size);
    NVRTC_CHECK(nvrtcGetCUBIN(prog, out.data()));
  } else {
    NVRTC_CHECK(nvrtcGetPTXSize(prog, &size));
    out.resize(size);
    NVRTC_CHECK(nvrtcGetPTX(prog, out.data()));
  }
  NVRTC_CHECK(nvrtcDestroyProgram(&prog));
  return out;
}

int main() {
  CHECK(cudaFree(0));
  const int n = 4096;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 64);
    y[i] = static_cast<float>(i % 3);
  }
  float *dx, *dy;
  int* di;
  CHECK(cudaMalloc(&dx, n * sizeof(float)));
  CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CHECK(cudaMalloc(&di, n * sizeof(int)));
  CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<int> hi(n);
  for (int i = 0; i < n; ++i) hi[i] = i - 100;
  CHECK(cudaMemcpy(di, hi.data(), n * sizeof(int), cudaMemcpyHostToDevice));

  // CUBIN through the runtime's library API.
  std::string lowered;
  std::vector<char> cubin = compile("--gpu-architecture=sm_90", true, &lowered);
  printf("lowered name of scale<int>: %s\n", lowered.c_str());
  cudaLibrary_t lib;
  CHECK(cudaLibraryLoadData(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  cudaKernel_t k_saxpy, k_scale;
  CHECK(cudaLibraryGetKernel(&k_saxpy, lib, "saxpy"));
  CHECK(cudaLibraryGetKernel(&k_scale, lib, lowered.c_str()));
  float a = 2.f;
  int nn = n;
  void* args1[] = {&a, &dx, &dy, &nn};
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k_saxpy), dim3(n / 256), dim3(256), args1, 0,
                         0));
  int f = 3;
  void* args2[] = {&di, &f, &nn};
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k_scale), dim3(n / 256), dim3(256), args2, 0,
                         0));
  CHECK(cudaDeviceSynchronize());
  void* gptr = nullptr;
  size_t gsize = 0;
  CHECK(cudaLibraryGetGlobal(&gptr, &gsize, lib, "jit_counter"));
  int counter = 0;
  CHECK(cudaMemcpy(&counter, gptr, sizeof(int), cudaMemcpyDeviceToHost));
  printf("cubin: jit_counter=%d size=%zu\n", counter, gsize);

  // PTX through the driver (JIT).
  std::vector<char> ptx = compile("--gpu-architecture=compute_90", false, &lowered);
  auto loadData = get<PFN_ModuleLoadData>("cuModuleLoadData", 2000);
  auto getFunction = get<PFN_ModuleGetFunction>("cuModuleGetFunction", 2000);
  auto getGlobal = get<PFN_ModuleGetGlobal>("cuModuleGetGlobal", 3020);
  auto unload = get<PFN_ModuleUnload>("cuModuleUnload", 2000);
  auto launch = get<PFN_LaunchKernel>("cuLaunchKernel", 4000);
  CUmodule mod;
  CU_CHECK(loadData(&mod, ptx.data()));
  CUfunction f_saxpy, f_scale;
  CU_CHECK(getFunction(&f_saxpy, mod, "saxpy"));
  CU_CHECK(getFunction(&f_scale, mod, lowered.c_str()));
  a = -1.f;
  CU_CHECK(launch(f_saxpy, n / 128, 1, 1, 128, 1, 1, 0, nullptr, args1, nullptr));
  f = -2;
  CU_CHECK(launch(f_scale, n / 128, 1, 1, 128, 1, 1, 0, nullptr, args2, nullptr));
  CHECK(cudaDeviceSynchronize());
  CUdeviceptr gp;
  size_t gs;
  CU_CHECK(getGlobal(&gp, &gs, mod, "jit_counter"));
  int counter2 = 0;
  CHECK(cudaMemcpy(&counter2, reinterpret_cast<void*>(gp), sizeof(int), cudaMemcpyDeviceToHost));
  printf("ptx: jit_counter=%d\n", counter2);

  std::vector<float> oy(n);
  std::vector<int> oi(n);
  CHECK(cudaMemcpy(oy.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(oi.data(), di, n * sizeof(int), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    bad += oy[i] != (2.f * x[i] + y[i]) - x[i];
    bad += oi[i] != (i - 100) * -6;
  }
  printf("jit results mismatches=%d checksum=%016llx\n", bad,
         (unsigned long long)fnv1a(oy.data(), n * 4, fnv1a(oi.data(), n * 4)));
  EXPECT(bad == 0 && counter == 101 && counter2 == 101, "jit results");
  CU_CHECK(unload(mod));
  CHECK(cudaLibraryUnload(lib));
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dy));
  CHECK(cudaFree(di));
  pass("nvrtc_jit");
  return 0;
}
