// matmul_tiled: shared-memory tiled matrix multiply (templated tile size 16
// and 32, __syncthreads), sizes that are not multiples of the tile, 2D grids.
// Inputs are small integers so float results are exact and comparable.
#include <vector>
#include "common.h"

template <int TILE>
__global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE + 1];  // padding: avoid bank conflicts
  int row = blockIdx.y * TILE + threadIdx.y;
  int col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.f;
  for (int t = 0; t < K; t += TILE) {
    int ak = t + threadIdx.x, bk = t + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.f;
    Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}

template <int TILE>
static void run(const float* dA, const float* dB, float* dC, int M, int N, int K) {
  dim3 block(TILE, TILE);
  dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  matmul<TILE><<<grid, block>>>(dA, dB, dC, M, N, K);
  CHECK_LAUNCH();
}

int main() {
  const int M = 300, N = 257, K = 519;
  std::vector<float> A(M * K), B(K * N), C(M * N), ref(M * N);
  Rng rng(12345);
  for (auto& x : A) x = static_cast<float>(rng.range(-2, 2));
  for (auto& x : B) x = static_cast<float>(rng.range(-3, 3));
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      long long s = 0;
      for (int k = 0; k < K; ++k)
        s += static_cast<long long>(A[i * K + k]) * static_cast<long long>(B[k * N + j]);
      ref[i * N + j] = static_cast<float>(s);
    }
  float *dA, *dB, *dC;
  CHECK(cudaMalloc(&dA, A.size() * sizeof(float)));
  CHECK(cudaMalloc(&dB, B.size() * sizeof(float)));
  CHECK(cudaMalloc(&dC, C.size() * sizeof(float)));
  CHECK(cudaMemcpy(dA, A.data(), A.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dB, B.data(), B.size() * sizeof(float), cudaMemcpyHostToDevice));

  long long refsum = 0;
  for (float v : ref) refsum += static_cast<long long>(v);
  printf("M=%d N=%d K=%d ref_sum=%lld ref_checksum=%016llx\n", M, N, K, refsum,
         (unsigned long long)fnv1a(ref.data(), ref.size() * sizeof(float)));

  for (int pass_i = 0; pass_i < 2; ++pass_i) {
    CHECK(cudaMemset(dC, 0xff, C.size() * sizeof(float)));
    int tile = pass_i == 0 ? 16 : 32;
    if (tile == 16)
      run<16>(dA, dB, dC, M, N, K);
    else
      run<32>(dA, dB, dC, M, N, K);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(C.data(), dC, C.size() * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < M * N; ++i) bad += C[i] != ref[i];
    printf("tile=%d mismatches=%d checksum=%016llx\n", tile, bad,
           (unsigned long long)fnv1a(C.data(), C.size() * sizeof(float)));
    EXPECT(bad == 0, "tile %d", tile);
  }
  CHECK(cudaFree(dA));
  CHECK(cudaFree(dB));
  CHECK(cudaFree(dC));
  pass("matmul_tiled");
  return 0;
}
