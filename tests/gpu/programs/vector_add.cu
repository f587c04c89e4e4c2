// vector_add: the simplest round trip. cudaMalloc, H2D/D2H cudaMemcpy from
// pageable memory, a grid-stride kernel and a one-thread-per-element kernel,
// odd sizes, int and float, compared element by element with the CPU.
#include <vector>
#include "common.h"

__global__ void add_f32(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

__global__ void add_i32_strided(const int* a, const int* b, int* c, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    c[i] = a[i] * 3 + b[i];
}

int main() {
  const int n = (1 << 20) + 3;
  std::vector<float> ha(n), hb(n), hc(n, -1.f);
  std::vector<int> ia(n), ib(n), ic(n, -1);
  for (int i = 0; i < n; ++i) {
    ha[i] = 0.5f * static_cast<float>(i % 4096);
    hb[i] = static_cast<float>((i * 7) % 1000) - 250.f;
    ia[i] = i;
    ib[i] = -2 * (i % 977);
  }
  float *da, *db, *dc;
  int *ja, *jb, *jc;
  CHECK(cudaMalloc(&da, n * sizeof(float)));
  CHECK(cudaMalloc(&db, n * sizeof(float)));
  CHECK(cudaMalloc(&dc, n * sizeof(float)));
  CHECK(cudaMalloc(&ja, n * sizeof(int)));
  CHECK(cudaMalloc(&jb, n * sizeof(int)));
  CHECK(cudaMalloc(&jc, n * sizeof(int)));
  CHECK(cudaMemcpy(da, ha.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, hb.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ja, ia.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(jb, ib.data(), n * sizeof(int), cudaMemcpyHostToDevice));

  add_f32<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  CHECK_LAUNCH();
  add_i32_strided<<<40, 128>>>(ja, jb, jc, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(hc.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(ic.data(), jc, n * sizeof(int), cudaMemcpyDeviceToHost));

  int bad_f = 0, bad_i = 0;
  double sum = 0;
  long long isum = 0;
  for (int i = 0; i < n; ++i) {
    if (hc[i] != ha[i] + hb[i]) ++bad_f;
    if (ic[i] != ia[i] * 3 + ib[i]) ++bad_i;
    sum += hc[i];
    isum += ic[i];
  }
  printf("n=%d float_mismatches=%d int_mismatches=%d\n", n, bad_f, bad_i);
  printf("float_sum=%.1f int_sum=%lld\n", sum, isum);
  printf("checksum=%016llx\n", (unsigned long long)fnv1a(hc.data(), n * sizeof(float),
                                                         fnv1a(ic.data(), n * sizeof(int))));
  EXPECT(bad_f == 0 && bad_i == 0, "mismatches");
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dc));
  CHECK(cudaFree(ja));
  CHECK(cudaFree(jb));
  CHECK(cudaFree(jc));
  pass("vector_add");
  return 0;
}
