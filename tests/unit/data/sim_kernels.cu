// Kernels whose parameter layouts the cuda_image and sim_kernels unit tests check.
//
// Owns: nothing but test input; tests/unit/sim_kernels.cmake compiles this file with
// nvcc into fatbins (every compression mode), a cubin, PTX, a relocatable fatbin and
// an executable. The kernels never run. Changing a signature here means changing the
// expected offsets in tests/unit/sim_kernels_test.cc.
#include <cstdio>

struct Vec3 {
  float x, y, z;
};  // size 12, align 4
struct alignas(16) Aligned16 {
  float v[3];
};  // size 16, align 16
struct Padded8 {
  char c;
  double d;
};  // size 16, align 8
struct Block4000 {
  char b[4000];
};  // size 4000, align 1: fits the legacy EIATTR_KPARAM_INFO
struct Block32000 {
  char b[32000];
};  // size 32000: needs EIATTR_KPARAM_INFO_V2
struct Doubles2000 {
  double d[2000];
};  // size 16000, align 8

extern "C" __global__ void mixed(int a, double b, char c, Vec3 s, void* p) {}
extern "C" __global__ void scalars(char a, short b, int c, long long d, float e, double f,
                                   unsigned char g, bool h) {}
extern "C" __global__ void aligned(char a, Aligned16 v, Padded8 p, char z) {}
extern "C" __global__ void vectors(char c, float4 f, double2 d, int3 i, char2 c2) {}
extern "C" __global__ void big(int n, Block4000 b, float* out) {}
extern "C" __global__ void huge(int n, Block32000 h, float* out) {}
extern "C" __global__ void grid_const(const __grid_constant__ Doubles2000 h, int x) {}
extern "C" __global__ void noparams() {}

template <typename T>
__global__ void tmpl(T* out, T v, int n) {}
template __global__ void tmpl<float>(float*, float, int);
template __global__ void tmpl<double>(double*, double, int);

__global__ void cpp_named(int* a, int b) {}

namespace ns {
__global__ void in_namespace(unsigned long x, const float* __restrict__ y) {}
}  // namespace ns

// Not a kernel: must not be listed, even with -rdc=true where it keeps a symbol.
__device__ __noinline__ int helper(int x) { return x * 3; }
extern "C" __global__ void uses_helper(int* p, int n) { p[0] = helper(n); }

int main() {
  std::printf("sim_kernels test data\n");
  return 0;
}
