// symbols: __constant__ arrays and structs, __device__ globals with and
// without static initialisers, cudaMemcpyToSymbol (with offset),
// cudaMemcpyFromSymbol, the Async variants on a stream, cudaGetSymbolAddress
// (then plain cudaMemcpy / kernels on that address), cudaGetSymbolSize.
#include <vector>
#include "common.h"

struct Params {
  int a;
  float b;
  char tag[3];
  double c;
};

__constant__ float c_coeffs[64];
__constant__ Params c_params;
__device__ float d_table[1000];
__device__ int d_counter;
__device__ int d_init[4] = {11, 22, 33, 44};
__device__ unsigned long long d_big[3] = {0x0123456789abcdefull, 42ull, ~0ull};

__global__ void use_symbols(int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    d_table[i] = c_coeffs[i % 64] * static_cast<float>(c_params.a) + c_params.b +
                 static_cast<float>(c_params.tag[i % 3]) + static_cast<float>(c_params.c) +
                 static_cast<float>(d_init[i % 4]);
    atomicAdd(&d_counter, 1);
  }
}

__global__ void scale_via_pointer(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= 2.f;
}

int main() {
  std::vector<float> coeffs(64);
  for (int i = 0; i < 64; ++i) coeffs[i] = static_cast<float>(i) * 0.25f;
  // Upload in two parts: the first 40 directly, the rest with an offset.
  CHECK(cudaMemcpyToSymbol(c_coeffs, coeffs.data(), 40 * sizeof(float)));
  CHECK(cudaMemcpyToSymbol(c_coeffs, coeffs.data() + 40, 24 * sizeof(float), 40 * sizeof(float)));
  Params p{3, 1.5f, {1, 2, 3}, 0.25};
  CHECK(cudaMemcpyToSymbol(c_params, &p, sizeof(p)));
  int zero = 0;
  CHECK(cudaMemcpyToSymbol(d_counter, &zero, sizeof(zero), 0, cudaMemcpyHostToDevice));

  // Statically initialised device globals must arrive with their values.
  int init[4] = {};
  unsigned long long big[3] = {};
  CHECK(cudaMemcpyFromSymbol(init, d_init, sizeof(init)));
  CHECK(cudaMemcpyFromSymbol(big, d_big, sizeof(big)));
  printf("d_init=%d,%d,%d,%d d_big=%016llx,%llu,%016llx\n", init[0], init[1], init[2], init[3],
         big[0], big[1], big[2]);
  EXPECT(init[0] == 11 && init[3] == 44 && big[0] == 0x0123456789abcdefull && big[2] == ~0ull,
         "initialisers");

  size_t sz = 0;
  CHECK(cudaGetSymbolSize(&sz, d_table));
  printf("sizeof(d_table)=%zu sizeof(c_params)=", sz);
  EXPECT(sz == 1000 * sizeof(float), "symbol size");
  CHECK(cudaGetSymbolSize(&sz, c_params));
  printf("%zu\n", sz);
  EXPECT(sz == sizeof(Params), "symbol size");

  const int n = 1000;
  use_symbols<<<(n + 127) / 128, 128>>>(n);
  CHECK_LAUNCH();
  std::vector<float> table(n);
  int counter = -1;
  CHECK(cudaMemcpyFromSymbol(table.data(), d_table, n * sizeof(float)));
  CHECK(cudaMemcpyFromSymbol(&counter, d_counter, sizeof(int)));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    float e = coeffs[i % 64] * static_cast<float>(p.a) + p.b + static_cast<float>(p.tag[i % 3]) +
              static_cast<float>(p.c) + static_cast<float>(init[i % 4]);
    if (table[i] != e) ++bad;
  }
  printf("counter=%d table_mismatches=%d checksum=%016llx\n", counter, bad,
         (unsigned long long)fnv1a(table.data(), n * sizeof(float)));
  EXPECT(counter == n && bad == 0, "symbol kernel");

  // Address of a device global: use it like any device pointer.
  float* addr = nullptr;
  CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&addr), d_table));
  EXPECT(addr != nullptr, "symbol address");
  scale_via_pointer<<<(n + 255) / 256, 256>>>(addr, n);
  CHECK_LAUNCH();
  std::vector<float> t2(n);
  CHECK(cudaMemcpy(t2.data(), addr, n * sizeof(float), cudaMemcpyDeviceToHost));
  int bad2 = 0;
  for (int i = 0; i < n; ++i) bad2 += t2[i] != 2.f * table[i];
  printf("via_address_mismatches=%d\n", bad2);
  EXPECT(bad2 == 0, "via address");

  // Async symbol copies on a stream, with an offset into the symbol.
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* pinned;
  CHECK(cudaMallocHost(&pinned, 100 * sizeof(float)));
  for (int i = 0; i < 100; ++i) pinned[i] = -static_cast<float>(i);
  CHECK(cudaMemcpyToSymbolAsync(d_table, pinned, 100 * sizeof(float), 500 * sizeof(float),
                                cudaMemcpyHostToDevice, s));
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < 100; ++i) pinned[i] = 0.f;
  CHECK(cudaMemcpyFromSymbolAsync(pinned, d_table, 100 * sizeof(float), 450 * sizeof(float),
                                  cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  int bad3 = 0;
  for (int i = 0; i < 100; ++i) {
    float e = i < 50 ? t2[450 + i] : -static_cast<float>(i - 50);
    bad3 += pinned[i] != e;
  }
  printf("async_symbol_mismatches=%d\n", bad3);
  EXPECT(bad3 == 0, "async symbol copies");

  // Constant memory read back.
  float back[64];
  CHECK(cudaMemcpyFromSymbol(back, c_coeffs, sizeof(back)));
  EXPECT(memcmp(back, coeffs.data(), sizeof(back)) == 0, "constant readback");
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaStreamDestroy(s));
  pass("symbols");
  return 0;
}
