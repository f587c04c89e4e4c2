// template_struct: kernel parameter marshalling. Templated kernels over
// int/unsigned short/float/double/long long and over struct types; structs of
// odd sizes and alignments (3, 6, 12, 20, 32 bytes, alignas(16)) mixed with
// scalars so the parameter buffer has padding; a 1212-byte parameter struct
// (> 1 KiB), an 8160-byte one (> 4 KiB, CUDA 12.1+ large parameters), a
// kernel with 24 scalar parameters, a struct carrying a device pointer, and
// launches through cudaLaunchKernel with an args array.
#include <vector>
#include "common.h"

struct S3 {
  char c[3];
};
struct S6 {
  short a, b, c;
};
struct S12 {
  int a;
  char b;
  short c;
  float d;
};
struct S20 {
  float f[5];
};
struct alignas(16) S32 {
  float v[4];
  int a;
};
struct Big {
  int vals[300];
  float f;
  char tag[8];
};
struct Huge {
  int v[2040];
};
struct View {
  float* data;
  int n;
  float scale;
};

static_assert(sizeof(S3) == 3 && sizeof(S6) == 6 && sizeof(S12) == 12 && sizeof(S20) == 20 &&
                  sizeof(S32) == 32,
              "sizes");
static_assert(sizeof(Big) == 1212 && sizeof(Huge) == 8160, "big sizes");

__global__ void mixed(char a, S3 b, double c, S6 d, short e, S12 f, S32 g, bool h, long long i,
                      S20 j, long long* out) {
  out[0] = a;
  out[1] = b.c[0] * 10000 + b.c[1] * 100 + b.c[2];
  out[2] = static_cast<long long>(c * 1000.0);
  out[3] = d.a * 1000000LL + d.b * 1000 + d.c;
  out[4] = e;
  out[5] = f.a + f.b * 10 + f.c * 100 + static_cast<long long>(f.d * 4.f);
  out[6] = static_cast<long long>(g.v[0] + g.v[1] + g.v[2] + g.v[3]) + g.a;
  out[7] = h ? 1 : 0;
  out[8] = i;
  out[9] = static_cast<long long>((j.f[0] + j.f[1] + j.f[2] + j.f[3] + j.f[4]) * 8.f);
}

__global__ void big_param(Big b, int scale, long long* out) {
  int t = threadIdx.x;
  if (t < 300) out[t] = static_cast<long long>(b.vals[t]) * scale + t;
  if (t == 0) {
    out[300] = static_cast<long long>(b.f * 16.f);
    long long tag = 0;
    for (int k = 0; k < 8; ++k) tag = tag * 131 + b.tag[k];
    out[301] = tag;
  }
}

__global__ void huge_param(Huge h, int* out) {
  for (int t = threadIdx.x; t < 2040; t += blockDim.x) out[t] = h.v[t] ^ 0x5a5a;
}

template <typename T, int K>
__global__ void affine(T* out, T x0, T step, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] =
        static_cast<T>((x0 + static_cast<T>(i) * step) * static_cast<T>(K) + static_cast<T>(1));
}

template <typename S>
__global__ void copy_struct(S s, S* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *out = s;
}

__global__ void many(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8, int a9,
                     int a10, int a11, int a12, int a13, int a14, int a15, int a16, int a17,
                     int a18, int a19, int a20, int a21, int a22, int a23, long long* out) {
  int v[24] = {a0,  a1,  a2,  a3,  a4,  a5,  a6,  a7,  a8,  a9,  a10, a11,
               a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23};
  long long s = 0;
  for (int k = 0; k < 24; ++k) s = s * 3 + v[k];
  *out = s;
}

__global__ void scale_view(View v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < v.n) v.data[i] *= v.scale;
}

template <typename T, int K>
static int check_affine(T x0, T step, const char* tname) {
  const int n = 1000;
  T* d;
  CHECK(cudaMalloc(&d, n * sizeof(T)));
  affine<T, K><<<(n + 127) / 128, 128>>>(d, x0, step, n);
  CHECK_LAUNCH();
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    T e = static_cast<T>((x0 + static_cast<T>(i) * step) * static_cast<T>(K) + static_cast<T>(1));
    bad += !(h[i] == e);
  }
  printf("affine<%s,%d> mismatches=%d checksum=%016llx\n", tname, K, bad,
         (unsigned long long)fnv1a(h.data(), n * sizeof(T)));
  return bad;
}

template <typename S>
static bool roundtrip(const S& s, const char* name) {
  S* d;
  CHECK(cudaMalloc(&d, sizeof(S)));
  CHECK(cudaMemset(d, 0, sizeof(S)));
  copy_struct<S><<<1, 32>>>(s, d);
  CHECK_LAUNCH();
  S back;
  CHECK(cudaMemcpy(&back, d, sizeof(S), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  bool ok = memcmp(&back, &s, sizeof(S)) == 0;
  printf("copy_struct<%s> size=%zu %s\n", name, sizeof(S), ok ? "ok" : "MISMATCH");
  return ok;
}

int main() {
  long long* dout;
  CHECK(cudaMalloc(&dout, 512 * sizeof(long long)));

  // Mixed scalars and odd structs.
  S3 b = {{1, 2, 3}};
  S6 d = {-4, 5, -6};
  S12 f = {7, 8, 9, 2.5f};
  S32 g = {{1.f, 2.f, 3.f, 4.f}, 90};
  S20 j = {{0.125f, 0.25f, 0.5f, 1.f, 2.f}};
  mixed<<<1, 1>>>(static_cast<char>(-5), b, 3.25, d, static_cast<short>(-300), f, g, true,
                  -1234567890123LL, j, dout);
  CHECK_LAUNCH();
  long long m[10];
  CHECK(cudaMemcpy(m, dout, sizeof(m), cudaMemcpyDeviceToHost));
  printf("mixed:");
  for (long long v : m) printf(" %lld", v);
  printf("\n");
  const long long mexp[10] = {
      -5, 10203, 3250, -3995006, -300, 7 + 80 + 900 + 10, 100, 1, -1234567890123LL, 31};
  EXPECT(memcmp(m, mexp, sizeof(m)) == 0, "mixed parameters");

  // The same kernel through cudaLaunchKernel and an args array.
  CHECK(cudaMemset(dout, 0, sizeof(m)));
  char a = -5;
  double c = 3.25;
  short e = -300;
  bool h = true;
  long long i64 = -1234567890123LL;
  void* args[] = {&a, &b, &c, &d, &e, &f, &g, &h, &i64, &j, &dout};
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(mixed), dim3(1), dim3(1), args, 0, 0));
  CHECK(cudaMemcpy(m, dout, sizeof(m), cudaMemcpyDeviceToHost));
  EXPECT(memcmp(m, mexp, sizeof(m)) == 0, "mixed parameters via cudaLaunchKernel");
  printf("mixed via cudaLaunchKernel ok\n");

  // > 1 KiB parameter struct.
  Big big;
  for (int k = 0; k < 300; ++k) big.vals[k] = k * k - 500;
  big.f = 6.5f;
  memcpy(big.tag, "flyt-gp", 8);
  big_param<<<1, 320>>>(big, 3, dout);
  CHECK_LAUNCH();
  std::vector<long long> bo(302);
  CHECK(cudaMemcpy(bo.data(), dout, bo.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int k = 0; k < 300; ++k) bad += bo[k] != static_cast<long long>(big.vals[k]) * 3 + k;
  long long tag = 0;
  for (int k = 0; k < 8; ++k) tag = tag * 131 + big.tag[k];
  bad += bo[300] != 104;
  bad += bo[301] != tag;
  printf("big_param size=%zu mismatches=%d checksum=%016llx\n", sizeof(Big), bad,
         (unsigned long long)fnv1a(bo.data(), bo.size() * sizeof(long long)));
  EXPECT(bad == 0, "big parameter struct");

  // > 4 KiB parameter struct.
  Huge* hg = new Huge;
  for (int k = 0; k < 2040; ++k) hg->v[k] = k * 31 + 17;
  int* dh;
  CHECK(cudaMalloc(&dh, 2040 * sizeof(int)));
  huge_param<<<1, 256>>>(*hg, dh);
  CHECK_LAUNCH();
  std::vector<int> ho(2040);
  CHECK(cudaMemcpy(ho.data(), dh, 2040 * sizeof(int), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int k = 0; k < 2040; ++k) bad += ho[k] != (hg->v[k] ^ 0x5a5a);
  printf("huge_param size=%zu mismatches=%d\n", sizeof(Huge), bad);
  EXPECT(bad == 0, "huge parameter struct");

  // Templates over scalar types.
  int tb = 0;
  tb += check_affine<int, 3>(-100, 7, "int");
  tb += check_affine<unsigned short, 5>(1, 3, "ushort");
  tb += check_affine<float, 2>(0.5f, 0.25f, "float");
  tb += check_affine<double, 7>(-1.5, 0.125, "double");
  tb += check_affine<long long, 11>(1LL << 40, 12345, "longlong");
  EXPECT(tb == 0, "templated kernels");

  // Templates over struct types, byte-exact round trips.
  bool ok = true;
  ok &= roundtrip(b, "S3");
  ok &= roundtrip(d, "S6");
  ok &= roundtrip(j, "S20");
  ok &= roundtrip(big, "Big");
  ok &= roundtrip(*hg, "Huge");
  EXPECT(ok, "struct round trips");

  // 24 scalar parameters.
  many<<<1, 1>>>(1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16, 17, -18, 19, -20,
                 21, -22, 23, -24, dout);
  CHECK_LAUNCH();
  long long mv = 0, me = 0;
  CHECK(cudaMemcpy(&mv, dout, sizeof(mv), cudaMemcpyDeviceToHost));
  for (int k = 0; k < 24; ++k) me = me * 3 + ((k % 2) ? -(k + 1) : (k + 1));
  printf("many=%lld\n", mv);
  EXPECT(mv == me, "24 parameters");

  // Struct carrying a device pointer.
  const int n = 777;
  std::vector<float> hv(n);
  for (int k = 0; k < n; ++k) hv[k] = static_cast<float>(k);
  View v{nullptr, n, -0.5f};
  CHECK(cudaMalloc(&v.data, n * sizeof(float)));
  CHECK(cudaMemcpy(v.data, hv.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  scale_view<<<(n + 63) / 64, 64>>>(v);
  CHECK_LAUNCH();
  std::vector<float> vo(n);
  CHECK(cudaMemcpy(vo.data(), v.data, n * sizeof(float), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int k = 0; k < n; ++k) bad += vo[k] != -0.5f * static_cast<float>(k);
  printf("view mismatches=%d\n", bad);
  EXPECT(bad == 0, "view struct");

  delete hg;
  CHECK(cudaFree(v.data));
  CHECK(cudaFree(dh));
  CHECK(cudaFree(dout));
  pass("template_struct");
  return 0;
}
