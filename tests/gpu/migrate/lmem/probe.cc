// Where the driver places a module's global after the context's local memory grew
// (a launch of a kernel with a deep stack) or after cuCtxSetLimit(STACK_SIZE), against
// a fresh context. Native only (run.sh on the GPU machine).
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define CK(x)                       \
  do {                              \
    CUresult r_ = (x);              \
    if (r_ != CUDA_SUCCESS) {       \
      printf("%s -> %d\n", #x, r_); \
      exit(1);                      \
    }                               \
  } while (0)
int main(int argc, char** argv) {
  const int mode = atoi(argv[1]);
  const size_t stack = argc > 4 ? strtoull(argv[4], nullptr, 10) : 0;
  CK(cuInit(0));
  CUdevice d;
  CK(cuDeviceGet(&d, 0));
  CUcontext c;
  CK(cuDevicePrimaryCtxRetain(&c, d));
  CK(cuCtxSetCurrent(c));
  size_t s0 = 0;
  CK(cuCtxGetLimit(&s0, CU_LIMIT_STACK_SIZE));
  if (mode == 3 || mode == 4) CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack));
  CUmodule a, b;
  CK(cuModuleLoad(&a, argv[2]));
  CUdeviceptr out;
  CK(cuMemAlloc(&out, 1 << 20));
  if (mode == 2) {
    CUfunction f;
    CK(cuModuleGetFunction(&f, a, "deep"));
    int n = 3;
    void* args[] = {&out, &n};
    CK(cuLaunchKernel(f, 132, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    CK(cuCtxSynchronize());
  }
  if (mode == 4) CK(cuCtxSynchronize());
  size_t s1 = 0;
  CK(cuCtxGetLimit(&s1, CU_LIMIT_STACK_SIZE));
  CK(cuModuleLoad(&b, argv[3]));
  CUdeviceptr ga, gb;
  size_t n;
  CK(cuModuleGetGlobal(&ga, &n, a, "ga"));
  CK(cuModuleGetGlobal(&gb, &n, b, "gb"));
  size_t fr, tot;
  CK(cuMemGetInfo(&fr, &tot));
  printf("mode %d stack before %zu after %zu ga 0x%llx gb 0x%llx out 0x%llx used %zu MiB\n", mode,
         s0, s1, (unsigned long long)ga, (unsigned long long)gb, (unsigned long long)out,
         (tot - fr) >> 20);
  return 0;
}
