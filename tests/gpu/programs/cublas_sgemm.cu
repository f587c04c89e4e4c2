// cublas_sgemm: cuBLAS on its own stream: SGEMM (both transposes), DGEMM,
// strided-batched SGEMM, SAXPY and SDOT with host and device pointer modes,
// compared with a CPU reference within a tolerance. Prints the CPU
// reference checksums (deterministic) and pass/fail per operation.
// FLYT_LIBS: -lcublas
#include <cublas_v2.h>
#include <cmath>
#include <vector>
#include "common.h"

#define CUBLAS_CHECK(call)                                                                   \
  do {                                                                                       \
    cublasStatus_t st_ = (call);                                                             \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      printf("cuBLAS error %s in %s:%d: %s\n", cublasGetStatusName(st_), __FILE__, __LINE__, \
             #call);                                                                         \
      fflush(stdout);                                                                        \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

// Column-major reference: C = alpha * op(A) * op(B) + beta * C.
template <typename T>
static void ref_gemm(bool ta, bool tb, int m, int n, int k, T alpha, const std::vector<T>& A,
                     int lda, const std::vector<T>& B, int ldb, T beta, std::vector<T>& C,
                     int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        double a = ta ? A[p + i * lda] : A[i + p * lda];
        double b = tb ? B[j + p * ldb] : B[p + j * ldb];
        s += a * b;
      }
      C[i + j * ldc] = static_cast<T>(alpha * s + beta * C[i + j * ldc]);
    }
}

template <typename T>
static double max_rel_err(const std::vector<T>& got, const std::vector<T>& ref) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = std::fabs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    double r = d / (std::fabs(static_cast<double>(ref[i])) + 1.0);
    if (r > worst) worst = r;
  }
  return worst;
}

int main() {
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  CUBLAS_CHECK(cublasSetStream(h, s));
  Rng rng(4242);
  int fails = 0;

  // SGEMM, all four transpose combinations.
  const int M = 257, N = 129, K = 300;
  for (int t = 0; t < 4; ++t) {
    bool ta = t & 1, tb = t & 2;
    int lda = ta ? K : M, ldb = tb ? N : K, ldc = M;
    std::vector<float> A(lda * (ta ? M : K)), B(ldb * (tb ? K : N)), C(ldc * N), R;
    for (auto& x : A) x = static_cast<float>(rng.range(-8, 8)) * 0.125f;
    for (auto& x : B) x = static_cast<float>(rng.range(-8, 8)) * 0.25f;
    for (auto& x : C) x = static_cast<float>(rng.range(-4, 4));
    R = C;
    float alpha = 1.5f, beta = -0.5f;
    ref_gemm<float>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, R, ldc);
    float *dA, *dB, *dC;
    CHECK(cudaMalloc(&dA, A.size() * sizeof(float)));
    CHECK(cudaMalloc(&dB, B.size() * sizeof(float)));
    CHECK(cudaMalloc(&dC, C.size() * sizeof(float)));
    CUBLAS_CHECK(cublasSetMatrix(lda, ta ? M : K, sizeof(float), A.data(), lda, dA, lda));
    CUBLAS_CHECK(cublasSetMatrix(ldb, tb ? K : N, sizeof(float), B.data(), ldb, dB, ldb));
    CUBLAS_CHECK(cublasSetVector(static_cast<int>(C.size()), sizeof(float), C.data(), 1, dC, 1));
    CUBLAS_CHECK(cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, M,
                             N, K, &alpha, dA, lda, dB, ldb, &beta, dC, ldc));
    CUBLAS_CHECK(cublasGetMatrix(M, N, sizeof(float), dC, ldc, C.data(), ldc));
    double err = max_rel_err(C, R);
    double rsum = 0;
    for (float v : R) rsum += v;
    bool ok = err < 1e-4;
    fails += !ok;
    printf("sgemm %c%c m=%d n=%d k=%d ref_sum=%.4f %s\n", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
           rsum, ok ? "ok" : "MISMATCH");
    if (!ok) fprintf(stderr, "sgemm max rel err %g\n", err);
    CHECK(cudaFree(dA));
    CHECK(cudaFree(dB));
    CHECK(cudaFree(dC));
  }

  // DGEMM.
  {
    const int m = 100, n = 90, k = 80;
    std::vector<double> A(m * k), B(k * n), C(m * n, 0.0), R(m * n, 0.0);
    for (auto& x : A) x = rng.range(-1000, 1000) / 1000.0;
    for (auto& x : B) x = rng.range(-1000, 1000) / 1000.0;
    double alpha = 1.0, beta = 0.0;
    ref_gemm<double>(false, false, m, n, k, alpha, A, m, B, k, beta, R, m);
    double *dA, *dB, *dC;
    CHECK(cudaMalloc(&dA, A.size() * sizeof(double)));
    CHECK(cudaMalloc(&dB, B.size() * sizeof(double)));
    CHECK(cudaMalloc(&dC, C.size() * sizeof(double)));
    CHECK(cudaMemcpy(dA, A.data(), A.size() * sizeof(double), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, B.data(), B.size() * sizeof(double), cudaMemcpyHostToDevice));
    CUBLAS_CHECK(
        cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, dA, m, dB, k, &beta, dC, m));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(C.data(), dC, C.size() * sizeof(double), cudaMemcpyDeviceToHost));
    bool ok = max_rel_err(C, R) < 1e-10;
    fails += !ok;
    printf("dgemm m=%d n=%d k=%d %s\n", m, n, k, ok ? "ok" : "MISMATCH");
    CHECK(cudaFree(dA));
    CHECK(cudaFree(dB));
    CHECK(cudaFree(dC));
  }

  // Strided batched SGEMM: 16 products of 64x64x64.
  {
    const int d = 64, batch = 16;
    const long long stride = static_cast<long long>(d) * d;
    std::vector<float> A(stride * batch), B(stride * batch), C(stride * batch, 0.f),
        R(stride * batch, 0.f);
    for (auto& x : A) x = static_cast<float>(rng.range(-3, 3));
    for (auto& x : B) x = static_cast<float>(rng.range(-3, 3));
    float *dA, *dB, *dC;
    CHECK(cudaMalloc(&dA, A.size() * sizeof(float)));
    CHECK(cudaMalloc(&dB, B.size() * sizeof(float)));
    CHECK(cudaMalloc(&dC, C.size() * sizeof(float)));
    CHECK(cudaMemcpyAsync(dA, A.data(), A.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(dB, B.data(), B.size() * sizeof(float), cudaMemcpyHostToDevice, s));
    float alpha = 1.f, beta = 0.f;
    CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, d, d, d, &alpha, dA, d,
                                           stride, dB, d, stride, &beta, dC, d, stride, batch));
    CHECK(cudaMemcpyAsync(C.data(), dC, C.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int b = 0; b < batch; ++b) {
      std::vector<float> a(A.begin() + b * stride, A.begin() + (b + 1) * stride);
      std::vector<float> bb(B.begin() + b * stride, B.begin() + (b + 1) * stride);
      std::vector<float> r(stride, 0.f);
      ref_gemm<float>(false, false, d, d, d, 1.f, a, d, bb, d, 0.f, r, d);
      std::copy(r.begin(), r.end(), R.begin() + b * stride);
    }
    bool ok = max_rel_err(C, R) < 1e-5;
    fails += !ok;
    printf("sgemm_strided_batched batch=%d ref_checksum=%016llx %s\n", batch,
           (unsigned long long)fnv1a(R.data(), R.size() * sizeof(float)), ok ? "ok" : "MISMATCH");
    CHECK(cudaFree(dA));
    CHECK(cudaFree(dB));
    CHECK(cudaFree(dC));
  }

  // Level 1: SAXPY and SDOT (result to host, then to device memory).
  {
    const int n = 10000;
    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i % 17) - 8.f;
      y[i] = static_cast<float>(i % 5);
    }
    float *dx, *dy, *dres;
    CHECK(cudaMalloc(&dx, n * sizeof(float)));
    CHECK(cudaMalloc(&dy, n * sizeof(float)));
    CHECK(cudaMalloc(&dres, sizeof(float)));
    CUBLAS_CHECK(cublasSetVector(n, sizeof(float), x.data(), 1, dx, 1));
    CUBLAS_CHECK(cublasSetVector(n, sizeof(float), y.data(), 1, dy, 1));
    float alpha = 2.f;
    CUBLAS_CHECK(cublasSaxpy(h, n, &alpha, dx, 1, dy, 1));  // y = 2x + y
    float dot = 0.f;
    CUBLAS_CHECK(cublasSdot(h, n, dx, 1, dy, 1, &dot));  // host pointer mode: blocking
    CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
    CUBLAS_CHECK(cublasSdot(h, n, dx, 1, dy, 1, dres));
    CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    float dot2 = 0.f;
    CHECK(cudaMemcpyAsync(&dot2, dres, sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    double ref = 0;
    for (int i = 0; i < n; ++i) ref += static_cast<double>(x[i]) * (2.0 * x[i] + y[i]);
    bool ok = std::fabs(dot - ref) < 1e-3 * (std::fabs(ref) + 1) &&
              std::fabs(dot2 - ref) < 1e-3 * (std::fabs(ref) + 1);
    fails += !ok;
    printf("saxpy+sdot n=%d ref=%.1f %s\n", n, ref, ok ? "ok" : "MISMATCH");
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dres));
  }

  CUBLAS_CHECK(cublasDestroy(h));
  CHECK(cudaStreamDestroy(s));
  EXPECT(fails == 0, "%d cuBLAS checks failed", fails);
  pass("cublas_sgemm");
  return 0;
}
