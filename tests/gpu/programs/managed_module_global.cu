// managed_module_global: __managed__ variables of code compiled at run time, as
// NVRTC users (CuPy's RawModule.get_global) reach them: NVRTC compiles a
// source with a zero-initialised and an initialised __managed__ variable; the
// module is loaded with cuModuleLoadData, the variables are found with
// cuModuleGetGlobal, and the host reads and writes them through those
// pointers around kernels that update them.
// FLYT_LIBS: -lnvrtc -lcuda
#include <nvrtc.h>

#include "common.h"

static const char* kSource = R"(
__managed__ int counter;
__managed__ int table[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
extern "C" __global__ void bump(int add) {
  atomicAdd(&counter, add);
  if (blockIdx.x == 0 && threadIdx.x < 16) table[threadIdx.x] = table[threadIdx.x] * 2 + counter * 0;
}
)";

#define NVRTC_CHECK(call)                                             \
  do {                                                                \
    nvrtcResult r_ = (call);                                          \
    if (r_ != NVRTC_SUCCESS) {                                        \
      printf("nvrtc error %s: %s\n", nvrtcGetErrorString(r_), #call); \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

int main() {
  CHECK(cudaFree(nullptr));  // the primary context, current
  nvrtcProgram prog;
  NVRTC_CHECK(nvrtcCreateProgram(&prog, kSource, "managed_globals.cu", 0, nullptr, nullptr));
  const char* opts[] = {"--gpu-architecture=compute_90"};
  NVRTC_CHECK(nvrtcCompileProgram(prog, 1, opts));
  size_t ptx_size = 0;
  NVRTC_CHECK(nvrtcGetPTXSize(prog, &ptx_size));
  char* ptx = static_cast<char*>(malloc(ptx_size));
  NVRTC_CHECK(nvrtcGetPTX(prog, ptx));
  NVRTC_CHECK(nvrtcDestroyProgram(&prog));
  CUmodule mod;
  CU_CHECK(cuModuleLoadData(&mod, ptx));
  free(ptx);
  CUfunction bump;
  CU_CHECK(cuModuleGetFunction(&bump, mod, "bump"));
  CUdeviceptr counter_p = 0, table_p = 0;
  size_t counter_size = 0, table_size = 0;
  CU_CHECK(cuModuleGetGlobal(&counter_p, &counter_size, mod, "counter"));
  CU_CHECK(cuModuleGetGlobal(&table_p, &table_size, mod, "table"));
  int is_managed = 0;
  CU_CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, counter_p));
  int* counter = reinterpret_cast<int*>(counter_p);
  int* table = reinterpret_cast<int*>(table_p);
  printf("sizes=%zu,%zu managed=%d initial counter=%d table_sum=", counter_size, table_size,
         is_managed, *counter);
  int sum = 0;
  for (int i = 0; i < 16; ++i) sum += table[i];
  printf("%d\n", sum);
  *counter = 100;  // the host's write, read by the kernels
  table[3] = 1000;
  int add = 1;
  void* args[] = {&add};
  for (int round = 0; round < 3; ++round) {
    CU_CHECK(cuLaunchKernel(bump, 4, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
    CU_CHECK(cuCtxSynchronize());
    sum = 0;
    for (int i = 0; i < 16; ++i) sum += table[i];
    printf("round %d counter=%d table_sum=%d\n", round, *counter, sum);
    *counter += 1000;
  }
  CU_CHECK(cuModuleUnload(mod));
  printf("managed_module_global: PASS\n");
  return 0;
}
