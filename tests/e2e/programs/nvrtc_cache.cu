// nvrtc_cache: NVRTC compiling through the driver's compile cache (private table
// da9151d3), as cuDNN's runtime fusion, CuPy and PyTorch's jiterator use NVRTC.
//
//   nvrtc_cache  compiles one kernel source three times with NVRTC's cache trace on
//                (--enable-cache-trace), then once with a different option
//                (-ftz=true); for each compile prints whether its PTX and its cubin came
//                from the cache ("hit"), were compiled and stored ("miss") or the cache
//                was not used ("off"), and the cubin's digest; loads the first cubin,
//                launches it and, on a GPU, checks what it computed.
//
// Prints key=value lines and "nvrtc_cache: PASS". What is a hit depends on the cache
// folder (CUDA_CACHE_PATH) the caller gives: the test decides what to expect.
#include <cuda.h>  // driver types only; the program does not link libcuda
#include <nvrtc.h>

#include <string>
#include <vector>

#include "e2e_driver.h"

namespace {

const char kSource[] = R"(
template <int N> __device__ float poly(float x) {
  float r = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) r = r * x + (i % 3);
  return r;
}
extern "C" __global__ void scale(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = in[i] * 3.0f + 1.0f + 0.0f * poly<300>(in[i] * 0.001f);  // poly stays finite
}
)";

#define NV(call)                                                           \
  do {                                                                     \
    nvrtcResult r_ = (call);                                               \
    EXPECT(r_ == NVRTC_SUCCESS, "%s: %s", #call, nvrtcGetErrorString(r_)); \
  } while (0)

struct Compiled {
  std::string ptx_state, cubin_state;
  std::vector<char> cubin;
};

// "hit", "miss" or "off" for one stage, from NVRTC's cache trace.
std::string StageState(const std::string& log, const char* hit, const char* miss) {
  if (log.find(hit) != std::string::npos) return "hit";
  if (log.find(miss) != std::string::npos) return "miss";
  return "off";
}

Compiled Compile(const std::vector<const char*>& extra) {
  nvrtcProgram prog = nullptr;
  NV(nvrtcCreateProgram(&prog, kSource, "scale.cu", 0, nullptr, nullptr));
  std::vector<const char*> opts = {"--gpu-architecture=sm_90", "--enable-cache-trace"};
  opts.insert(opts.end(), extra.begin(), extra.end());
  nvrtcResult rc = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  size_t log_size = 0;
  NV(nvrtcGetProgramLogSize(prog, &log_size));
  std::string log(log_size, '\0');
  NV(nvrtcGetProgramLog(prog, log.data()));
  EXPECT(rc == NVRTC_SUCCESS, "nvrtcCompileProgram: %s\n%s", nvrtcGetErrorString(rc), log.c_str());
  Compiled c;
  c.ptx_state = StageState(log, "retrieved cached ptx", "added cache entry");
  c.cubin_state = StageState(log, "retrieved cached cubin", "added cubin cache entry");
  size_t size = 0;
  NV(nvrtcGetCUBINSize(prog, &size));
  c.cubin.resize(size);
  NV(nvrtcGetCUBIN(prog, c.cubin.data()));
  NV(nvrtcDestroyProgram(&prog));
  return c;
}

}  // namespace

int main() {
  e2e::Init("nvrtc_cache");
  CK(cudaFree(nullptr));  // a context, as NVRTC's users have one
  printf("under_flyt=%d\n", e2e::UnderFlyt() ? 1 : 0);

  e2e::Step("three compiles of one source, one with another option");
  std::vector<Compiled> runs;
  for (int i = 0; i < 3; ++i) runs.push_back(Compile({}));
  Compiled ftz = Compile({"-ftz=true"});
  for (size_t i = 0; i < runs.size(); ++i) {
    printf("c%zu.ptx=%s\nc%zu.cubin=%s\n", i, runs[i].ptx_state.c_str(), i,
           runs[i].cubin_state.c_str());
    EXPECT(runs[i].cubin == runs[0].cubin, "compile %zu gave other bytes than compile 0", i);
  }
  printf("ftz.ptx=%s\nftz.cubin=%s\n", ftz.ptx_state.c_str(), ftz.cubin_state.c_str());
  printf("cubin_bytes=%zu\ncubin_digest=%s\n", runs[0].cubin.size(),
         e2e::Hex(runs[0].cubin.data(), runs[0].cubin.size() < 64 ? runs[0].cubin.size() : 64)
             .c_str());
  printf("ftz_differs=%d\n", ftz.cubin != runs[0].cubin ? 1 : 0);

  e2e::Step("load and launch the cubin");
  decltype(&::cuModuleLoadData) module_load;
  decltype(&::cuModuleGetFunction) module_function;
  decltype(&::cuModuleUnload) module_unload;
  decltype(&::cuLaunchKernel) launch;
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  e2e::ResolveDriver("cuModuleLoadData", &module_load);
  e2e::ResolveDriver("cuModuleGetFunction", &module_function);
  e2e::ResolveDriver("cuModuleUnload", &module_unload);
  e2e::ResolveDriver("cuLaunchKernel", &launch);
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  CU(module_load(&mod, runs[2].cubin.data()));
  CU(module_function(&fn, mod, "scale"));
  const int n = 1000;
  std::vector<float> in(n), out(n, 0.0f);
  for (int i = 0; i < n; ++i) in[i] = static_cast<float>(i) * 0.25f;
  float *d_in = nullptr, *d_out = nullptr;
  CK(cudaMalloc(&d_in, n * sizeof(float)));
  CK(cudaMalloc(&d_out, n * sizeof(float)));
  CK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  int count = n;
  void* args[] = {&d_out, &d_in, &count};
  CU(launch(fn, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
  CK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (std::string(prop.name).find("Simulated") == std::string::npos) {
    for (int i = 0; i < n; ++i)
      EXPECT(out[i] == in[i] * 3.0f + 1.0f, "out[%d] = %f, want %f", i, out[i],
             in[i] * 3.0f + 1.0f);
    printf("results=checked\n");
  } else {
    printf("results=not run (sim)\n");
  }
  CK(cudaFree(d_in));
  CK(cudaFree(d_out));
  CU(module_unload(mod));
  e2e::Pass();
  return 0;
}
