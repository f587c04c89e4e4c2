// Whether the driver gives texture objects the same values in a fresh process when
// they are made in the same order (a move could then make them again on its target
// and check the values). Native only: run.sh on the GPU machine.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#define CK(x)                       \
  do {                              \
    CUresult r_ = (x);              \
    if (r_ != CUDA_SUCCESS) {       \
      printf("%s -> %d\n", #x, r_); \
      exit(1);                      \
    }                               \
  } while (0)
int main(int argc, char** argv) {
  const int extra = argc > 1 ? atoi(argv[1]) : 0;  // objects made and destroyed first
  CK(cuInit(0));
  CUdevice d;
  CK(cuDeviceGet(&d, 0));
  CUcontext c;
  CK(cuDevicePrimaryCtxRetain(&c, d));
  CK(cuCtxSetCurrent(c));
  CUdeviceptr buf;
  CK(cuMemAlloc(&buf, 1 << 20));
  CUDA_RESOURCE_DESC res{};
  res.resType = CU_RESOURCE_TYPE_LINEAR;
  res.res.linear.devPtr = buf;
  res.res.linear.format = CU_AD_FORMAT_FLOAT;
  res.res.linear.numChannels = 1;
  res.res.linear.sizeInBytes = 1 << 20;
  CUDA_TEXTURE_DESC tex{};
  for (int i = 0; i < extra; ++i) {
    CUtexObject t;
    CK(cuTexObjectCreate(&t, &res, &tex, nullptr));
    CK(cuTexObjectDestroy(t));
  }
  CUtexObject t[4];
  for (auto& x : t) CK(cuTexObjectCreate(&x, &res, &tex, nullptr));
  CK(cuTexObjectDestroy(t[1]));
  CUtexObject again;
  CK(cuTexObjectCreate(&again, &res, &tex, nullptr));
  CUsurfObject s = 0;
  printf("extra %d: tex %llu %llu %llu %llu, after destroying the second: %llu\n", extra,
         (unsigned long long)t[0], (unsigned long long)t[1], (unsigned long long)t[2],
         (unsigned long long)t[3], (unsigned long long)again);
  (void)s;
  return 0;
}
