// kernel_args: launches kernels with every kind of parameter (scalars of each width,
// pointers, padded structs, vector types, a 2000-byte struct, a struct near 4 KiB, a
// 32000-byte struct, templates, a namespaced kernel, extern "C" kernels) through <<<>>>,
// cudaLaunchKernel, cudaLaunchKernelExC and the cudaLaunchKernelEx template, with various
// grid, block, shared-memory sizes and streams. For each launch it prints the line the sim
// server must record, in exactly its format:
//   launch kernel=<name> grid=X,Y,Z block=X,Y,Z shared=N params=<hex0>:<hex1>:...
// computed from the values it passed. The harness compares these lines with the record.
// Kernels never run under the sim; on a GPU they only write through valid pointers.
// Ends with "kernel_args: PASS".
#include <initializer_list>
#include <vector>

#include "e2e_common.h"

// Structs with padding; tests memset them to zero before filling the fields.
struct Padded {  // 32 bytes: a, 7 padding, b, c, 2 padding, d, e, 7 padding
  char a;
  double b;
  short c;
  int d;
  char e;
};
struct Small {  // 8 bytes: a, 3 padding, b
  char a;
  int b;
};
struct Mixed {  // 32 bytes, 16-byte aligned: p, tag, 7 padding, v
  int* p;
  char tag;
  float4 v;
};
struct Big2000 {
  unsigned char b[2000];
};
struct Near4K {  // with the 8-byte pointer before it: 4088 bytes of parameters
  unsigned int w[1020];
};
struct Huge {  // beyond the classic 4 KiB limit (CUDA 12.1+ allows 32764 bytes)
  unsigned char b[32000];
};
static_assert(sizeof(Padded) == 32, "Padded layout");
static_assert(sizeof(Small) == 8, "Small layout");
static_assert(sizeof(Mixed) == 32, "Mixed layout");

extern "C" __global__ void k_empty() {}

extern "C" __global__ void k_scalars(char c, unsigned char uc, short s, int i, unsigned u,
                                     long long ll, float f, double d, bool b, int* out) {
  if (out && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && blockIdx.x == 0 &&
      blockIdx.y == 0 && blockIdx.z == 0)
    *out = c + uc + s + i + static_cast<int>(u) + static_cast<int>(ll) + static_cast<int>(f) +
           static_cast<int>(d) + b;
}

extern "C" __global__ void k_ptrs(int* p, const float* q, void* null_ptr) {
  if (p && q && !null_ptr && threadIdx.x == 0 && blockIdx.x == 0) *p = static_cast<int>(*q);
}

extern "C" __global__ void k_vectors(float4 a, int2 b, char3 c, double2 d, int* out) {
  if (out && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0)
    *out = static_cast<int>(a.w + d.y) + b.y + c.z;
}

__global__ void k_padded(Padded s, int tail, int* out) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0) smem[0] = s.d;
  if (out && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && blockIdx.x == 0 &&
      blockIdx.y == 0 && blockIdx.z == 0)
    *out = s.a + static_cast<int>(s.b) + s.c + s.d + s.e + tail;
}

__global__ void k_small(Small s, char c2, int* out) {
  if (out && threadIdx.x == 0 && blockIdx.x == 0) *out = s.a + s.b + c2;
}

__global__ void k_mixed(Mixed m) {
  if (m.p && threadIdx.x == 0 && blockIdx.x == 0) *m.p = m.tag + static_cast<int>(m.v.x);
}

__global__ void k_big2000(Big2000 s, int x, int* out) {
  if (out && threadIdx.x == 0 && blockIdx.x == 0) *out = s.b[0] + s.b[1999] + x;
}

__global__ void k_near4k(int* p, Near4K s) {
  if (p && threadIdx.x == 0 && blockIdx.x == 0) *p = static_cast<int>(s.w[0] + s.w[1019]);
}

__global__ void k_huge(Huge h, int* out) {
  if (out && threadIdx.x == 0 && blockIdx.x == 0) *out = h.b[0] + h.b[31999];
}

template <typename T, int N>
__global__ void k_tmpl(T v, T* out) {
  if (out && threadIdx.x == 0 && blockIdx.x == 0) *out = v + static_cast<T>(N);
}

namespace flyt_e2e {
__global__ void k_ns(long long v, Small s, int* out) {
  if (out && threadIdx.x == 0 && blockIdx.x == 0) *out = static_cast<int>(v) + s.b;
}
}  // namespace flyt_e2e

namespace {

// Mangled names, as nvcc registers them with cudart (checked against the PTX .entry names).
constexpr const char* kPadded = "_Z8k_padded6PaddediPi";
constexpr const char* kSmall = "_Z7k_small5SmallcPi";
constexpr const char* kMixed = "_Z7k_mixed5Mixed";
constexpr const char* kBig2000 = "_Z9k_big20007Big2000iPi";
constexpr const char* kNear4K = "_Z8k_near4kPi6Near4K";
constexpr const char* kHuge = "_Z6k_huge4HugePi";
constexpr const char* kTmplFloat3 = "_Z6k_tmplIfLi3EEvT_PS0_";
constexpr const char* kTmplDoubleM1 = "_Z6k_tmplIdLin1EEvT_PS0_";
constexpr const char* kTmplUShort7 = "_Z6k_tmplItLi7EEvT_PS0_";
constexpr const char* kNs = "_ZN8flyt_e2e4k_nsEx5SmallPi";

struct Param {
  const void* p;
  size_t n;
};
template <typename T>
Param P(const T& v) {
  return Param{&v, sizeof(T)};
}

int g_launches = 0;

// Prints the record line for one launch.
void Emit(const char* name, dim3 g, dim3 b, size_t shared, std::initializer_list<Param> ps) {
  std::string params;
  bool first = true;
  for (const Param& p : ps) {
    if (!first) params += ":";
    first = false;
    params += e2e::Hex(p.p, p.n);
  }
  printf("launch kernel=%s grid=%u,%u,%u block=%u,%u,%u shared=%zu params=%s\n", name, g.x, g.y,
         g.z, b.x, b.y, b.z, shared, params.c_str());
  ++g_launches;
}

void CheckLaunch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    e2e::Fail(__FILE__, __LINE__, "launch of %s failed: %d (%s)", what, static_cast<int>(err),
              cudaGetErrorName(err));
}

}  // namespace

int main() {
  e2e::Init("kernel_args", 120);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* dout = nullptr;
  float* dq = nullptr;
  CK(cudaMalloc(&dout, 4096));
  CK(cudaMalloc(&dq, 4096));
  CK(cudaMemset(dout, 0, 4096));
  CK(cudaMemset(dq, 0, 4096));
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));

  e2e::Step("k_empty <<<>>>");
  k_empty<<<1, 1>>>();
  CheckLaunch("k_empty");
  Emit("k_empty", dim3(1, 1, 1), dim3(1, 1, 1), 0, {});

  e2e::Step("k_scalars <<<>>>");
  {
    char c = -3;
    unsigned char uc = 0xfe;
    short s = -12345;
    int i = 0x12345678;
    unsigned u = 0xdeadbeefu;
    long long ll = -0x0123456789abcdefll;
    float f = -1.5f;
    double d = 3.0e100;
    bool b = true;
    dim3 g(70000, 2, 3), blk(32, 4, 2);
    k_scalars<<<g, blk, 1024>>>(c, uc, s, i, u, ll, f, d, b, dout);
    CheckLaunch("k_scalars");
    Emit("k_scalars", g, blk, 1024,
         {P(c), P(uc), P(s), P(i), P(u), P(ll), P(f), P(d), P(b), P(dout)});
  }

  e2e::Step("k_ptrs <<<>>> on a stream");
  {
    void* null_ptr = nullptr;
    k_ptrs<<<5, 256, 0, stream>>>(dout + 3, dq, null_ptr);
    CheckLaunch("k_ptrs");
    int* p = dout + 3;
    Emit("k_ptrs", dim3(5, 1, 1), dim3(256, 1, 1), 0, {P(p), P(dq), P(null_ptr)});
  }

  e2e::Step("k_vectors <<<>>>");
  {
    float4 a = make_float4(1.0f, -2.0f, 0.25f, 1e30f);
    int2 b = make_int2(-1, 0x7fffffff);
    char3 c = make_char3(1, -2, 3);
    double2 d = make_double2(-0.0, 6.02214076e23);
    dim3 g(1, 65535, 1), blk(1, 1, 64);
    k_vectors<<<g, blk>>>(a, b, c, d, dout);
    CheckLaunch("k_vectors");
    Emit("k_vectors", g, blk, 0, {P(a), P(b), P(c), P(d), P(dout)});
  }

  e2e::Step("k_padded <<<>>> with 48 KiB dynamic shared memory");
  {
    Padded s;
    memset(&s, 0, sizeof(s));
    s.a = 'A';
    s.b = -7.75;
    s.c = 0x1234;
    s.d = -2;
    s.e = 'z';
    int tail = 99;
    dim3 g(2, 2, 2), blk(8, 8, 8);
    k_padded<<<g, blk, 49152>>>(s, tail, dout);
    CheckLaunch("k_padded");
    Emit(kPadded, g, blk, 49152, {P(s), P(tail), P(dout)});
  }

  e2e::Step("k_small via cudaLaunchKernel");
  {
    Small s;
    memset(&s, 0, sizeof(s));
    s.a = 7;
    s.b = -100000;
    char c2 = 'q';
    void* args[] = {&s, &c2, &dout};
    dim3 g(3, 1, 1), blk(128, 1, 1);
    CK(cudaLaunchKernel(reinterpret_cast<const void*>(k_small), g, blk, args, 64, stream));
    Emit(kSmall, g, blk, 64, {P(s), P(c2), P(dout)});
  }

  e2e::Step("k_mixed via cudaLaunchKernelExC with a priority attribute");
  {
    Mixed m;
    memset(&m, 0, sizeof(m));
    m.p = dout + 7;
    m.tag = -1;
    m.v = make_float4(0.5f, 1.5f, 2.5f, 3.5f);
    void* args[] = {&m};
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof(attr));
    attr.id = cudaLaunchAttributePriority;
    attr.val.priority = greatest;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(4, 3, 2);
    cfg.blockDim = dim3(16, 16, 4);
    cfg.dynamicSmemBytes = 2048;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k_mixed), args));
    Emit(kMixed, cfg.gridDim, cfg.blockDim, 2048, {P(m)});
  }

  e2e::Step("k_big2000 <<<>>>");
  {
    Big2000 s;
    e2e::Fill(&s, sizeof(s), 2000);
    int x = -42;
    k_big2000<<<3, 96, 100>>>(s, x, dout);
    CheckLaunch("k_big2000");
    Emit(kBig2000, dim3(3, 1, 1), dim3(96, 1, 1), 100, {P(s), P(x), P(dout)});
  }

  e2e::Step("k_near4k <<<>>> on a stream");
  {
    static Near4K s;  // static: keep 4 KiB off the stack
    e2e::Fill(&s, sizeof(s), 4080);
    int* p = dout + 11;
    k_near4k<<<dim3(9, 9, 9), dim3(1, 1, 1), 0, stream>>>(p, s);
    CheckLaunch("k_near4k");
    Emit(kNear4K, dim3(9, 9, 9), dim3(1, 1, 1), 0, {P(p), P(s)});
  }

  e2e::Step("k_huge <<<>>> and via cudaLaunchKernel");
  {
    static Huge h;
    e2e::Fill(&h, sizeof(h), 32000);
    k_huge<<<1, 1024, 0, stream>>>(h, dout);
    CheckLaunch("k_huge <<<>>>");
    Emit(kHuge, dim3(1, 1, 1), dim3(1024, 1, 1), 0, {P(h), P(dout)});
    static Huge h2;
    e2e::Fill(&h2, sizeof(h2), 32001);
    int* null_out = nullptr;
    void* args[] = {&h2, &null_out};
    CK(cudaLaunchKernel(reinterpret_cast<const void*>(k_huge), dim3(2, 1, 1), dim3(1, 1, 1), args,
                        0, nullptr));
    Emit(kHuge, dim3(2, 1, 1), dim3(1, 1, 1), 0, {P(h2), P(null_out)});
  }

  e2e::Step("templates");
  {
    float fv = 0.1f;
    float* fout = reinterpret_cast<float*>(dout + 16);
    k_tmpl<float, 3><<<7, 33, 8>>>(fv, fout);
    CheckLaunch("k_tmpl<float,3>");
    Emit(kTmplFloat3, dim3(7, 1, 1), dim3(33, 1, 1), 8, {P(fv), P(fout)});

    double dv = -1234.5678;
    double* dptr = reinterpret_cast<double*>(dout + 32);
    void* args[] = {&dv, &dptr};
    CK(cudaLaunchKernel(reinterpret_cast<const void*>(k_tmpl<double, -1>), dim3(1, 2, 1),
                        dim3(2, 1, 1), args, 0, stream));
    Emit(kTmplDoubleM1, dim3(1, 2, 1), dim3(2, 1, 1), 0, {P(dv), P(dptr)});

    unsigned short us = 0xbeef;
    unsigned short* usp = reinterpret_cast<unsigned short*>(dout + 48);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(8, 1, 1);
    cfg.blockDim = dim3(64, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    CK(cudaLaunchKernelEx(&cfg, k_tmpl<unsigned short, 7>, us, usp));
    Emit(kTmplUShort7, cfg.gridDim, cfg.blockDim, 0, {P(us), P(usp)});
  }

  e2e::Step("namespaced kernel on the per-thread default stream");
  {
    long long v = 0x0102030405060708ll;
    Small s;
    memset(&s, 0, sizeof(s));
    s.a = -128;
    s.b = 0x7f00ff00;
    void* args[] = {&v, &s, &dout};
    CK(cudaLaunchKernel(reinterpret_cast<const void*>(flyt_e2e::k_ns), dim3(2, 1, 1),
                        dim3(32, 1, 1), args, 16, cudaStreamPerThread));
    Emit(kNs, dim3(2, 1, 1), dim3(32, 1, 1), 16, {P(v), P(s), P(dout)});
  }

  e2e::Step("k_scalars via cudaLaunchKernel and the cudaLaunchKernelEx template");
  {
    char c = 0;
    unsigned char uc = 1;
    short s = 0x7fff;
    int i = -1;
    unsigned u = 0;
    long long ll = 0x7fffffffffffffffll;
    float f = 0.0f;
    double d = -0.5;
    bool b = false;
    int* null_out = nullptr;
    void* args[] = {&c, &uc, &s, &i, &u, &ll, &f, &d, &b, &null_out};
    CK(cudaLaunchKernel(reinterpret_cast<const void*>(k_scalars), dim3(1, 1, 65535),
                        dim3(1024, 1, 1), args, 0, stream));
    Emit("k_scalars", dim3(1, 1, 65535), dim3(1024, 1, 1), 0,
         {P(c), P(uc), P(s), P(i), P(u), P(ll), P(f), P(d), P(b), P(null_out)});

    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(6, 1, 1);
    cfg.blockDim = dim3(32, 1, 1);
    cfg.dynamicSmemBytes = 12288;
    cfg.stream = nullptr;
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof(attr));
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 2;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    char c2 = 'x';
    unsigned char uc2 = 0x80;
    short s2 = -1;
    int i2 = 65536;
    unsigned u2 = 1u << 31;
    long long ll2 = 1;
    float f2 = 3.4028235e38f;
    double d2 = 1.0 / 3.0;
    bool b2 = true;
    CK(cudaLaunchKernelEx(&cfg, k_scalars, c2, uc2, s2, i2, u2, ll2, f2, d2, b2, dout));
    Emit("k_scalars", cfg.gridDim, cfg.blockDim, 12288,
         {P(c2), P(uc2), P(s2), P(i2), P(u2), P(ll2), P(f2), P(d2), P(b2), P(dout)});
  }

  e2e::Step("synchronize");
  CK(cudaStreamSynchronize(stream));
  CK(cudaStreamSynchronize(cudaStreamPerThread));
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  CK(cudaStreamDestroy(stream));
  CK(cudaFree(dout));
  CK(cudaFree(dq));
  printf("launches=%d\n", g_launches);
  e2e::Pass();
  return 0;
}
