// cublaslt_matmul: cuBLASLt matmuls (cublasLtMatmul with heuristics and a
// workspace): FP32 in/out; FP16 inputs with FP32 output and compute; BF16
// inputs with a bias + ReLU epilogue. Inputs are small integers scaled so
// every product and sum is exact; compared with a CPU reference.
// FLYT_LIBS: -lcublasLt
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cmath>
#include <vector>
#include "common.h"

#define LT_CHECK(call)                                                                      \
  do {                                                                                      \
    cublasStatus_t st_ = (call);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      printf("cuBLASLt error %d in %s:%d: %s\n", static_cast<int>(st_), __FILE__, __LINE__, \
             #call);                                                                        \
      fflush(stdout);                                                                       \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

enum class In { F32, F16, BF16 };

// D (m x n, column-major, float) = A (m x k) * B (k x n) [+ bias, relu].
static bool run_case(cublasLtHandle_t lt, cudaStream_t stream, void* workspace, size_t ws_size,
                     In in, bool epilogue, int m, int n, int k, Rng& rng, const char* name) {
  std::vector<float> A(m * k), B(k * n), bias(m), R(m * n);
  for (auto& x : A) x = static_cast<float>(rng.range(-4, 4));
  for (auto& x : B) x = static_cast<float>(rng.range(-4, 4)) * 0.5f;
  for (auto& x : bias) x = static_cast<float>(rng.range(-50, 50));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += static_cast<double>(A[i + p * m]) * B[p + j * k];
      if (epilogue) {
        s += bias[i];
        if (s < 0) s = 0;
      }
      R[i + j * m] = static_cast<float>(s);
    }

  size_t esz = in == In::F32 ? 4 : 2;
  cudaDataType_t dt = in == In::F32 ? CUDA_R_32F : (in == In::F16 ? CUDA_R_16F : CUDA_R_16BF);
  std::vector<unsigned char> hA(A.size() * esz), hB(B.size() * esz);
  for (size_t i = 0; i < A.size(); ++i) {
    if (in == In::F32)
      memcpy(&hA[i * 4], &A[i], 4);
    else if (in == In::F16) {
      __half v = __float2half(A[i]);
      memcpy(&hA[i * 2], &v, 2);
    } else {
      __nv_bfloat16 v = __float2bfloat16(A[i]);
      memcpy(&hA[i * 2], &v, 2);
    }
  }
  for (size_t i = 0; i < B.size(); ++i) {
    if (in == In::F32)
      memcpy(&hB[i * 4], &B[i], 4);
    else if (in == In::F16) {
      __half v = __float2half(B[i]);
      memcpy(&hB[i * 2], &v, 2);
    } else {
      __nv_bfloat16 v = __float2bfloat16(B[i]);
      memcpy(&hB[i * 2], &v, 2);
    }
  }
  void *dA, *dB;
  float *dD, *dBias;
  CHECK(cudaMalloc(&dA, hA.size()));
  CHECK(cudaMalloc(&dB, hB.size()));
  CHECK(cudaMalloc(&dD, R.size() * sizeof(float)));
  CHECK(cudaMalloc(&dBias, m * sizeof(float)));
  CHECK(cudaMemcpyAsync(dA, hA.data(), hA.size(), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpyAsync(dB, hB.data(), hB.size(), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpyAsync(dBias, bias.data(), m * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemsetAsync(dD, 0, R.size() * sizeof(float), stream));

  cublasLtMatmulDesc_t op;
  LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t tn = CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tn, sizeof(tn)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tn, sizeof(tn)));
  if (epilogue) {
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_RELU_BIAS;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dBias,
                                            sizeof(dBias)));
    cudaDataType_t bt = CUDA_R_32F;
    LT_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  LT_CHECK(cublasLtMatrixLayoutCreate(&la, dt, m, k, m));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lb, dt, k, n, k));
  LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m));
  cublasLtMatmulPreference_t pref;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws_size, sizeof(ws_size)));
  cublasLtMatmulHeuristicResult_t heur[4] = {};
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 4, heur, &found));
  EXPECT(found > 0, "no cuBLASLt algorithm for %s", name);
  float alpha = 1.f, beta = 0.f;
  LT_CHECK(cublasLtMatmul(lt, op, &alpha, dA, la, dB, lb, &beta, dD, ld, dD, ld, &heur[0].algo,
                          workspace, ws_size, stream));
  std::vector<float> D(R.size());
  CHECK(cudaMemcpyAsync(D.data(), dD, D.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  double worst = 0;
  for (size_t i = 0; i < D.size(); ++i)
    worst = std::fmax(worst, std::fabs(D[i] - R[i]) / (std::fabs(R[i]) + 1.0));
  bool ok = worst < 1e-5;
  printf("%s m=%d n=%d k=%d ref_checksum=%016llx %s\n", name, m, n, k,
         (unsigned long long)fnv1a(R.data(), R.size() * sizeof(float)), ok ? "ok" : "MISMATCH");
  if (!ok) fprintf(stderr, "%s: max rel err %g\n", name, worst);
  LT_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  LT_CHECK(cublasLtMatrixLayoutDestroy(la));
  LT_CHECK(cublasLtMatrixLayoutDestroy(lb));
  LT_CHECK(cublasLtMatrixLayoutDestroy(ld));
  LT_CHECK(cublasLtMatmulDescDestroy(op));
  CHECK(cudaFree(dA));
  CHECK(cudaFree(dB));
  CHECK(cudaFree(dD));
  CHECK(cudaFree(dBias));
  return ok;
}

int main() {
  cublasLtHandle_t lt;
  LT_CHECK(cublasLtCreate(&lt));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  size_t ws_size = 32 << 20;
  void* ws;
  CHECK(cudaMalloc(&ws, ws_size));
  Rng rng(99);
  int fails = 0;
  fails += !run_case(lt, stream, ws, ws_size, In::F32, false, 192, 160, 256, rng, "lt_f32");
  fails += !run_case(lt, stream, ws, ws_size, In::F16, false, 256, 128, 512, rng, "lt_f16_f32out");
  fails +=
      !run_case(lt, stream, ws, ws_size, In::BF16, true, 128, 256, 384, rng, "lt_bf16_bias_relu");
  CHECK(cudaFree(ws));
  CHECK(cudaStreamDestroy(stream));
  LT_CHECK(cublasLtDestroy(lt));
  EXPECT(fails == 0, "%d cuBLASLt checks failed", fails);
  pass("cublaslt_matmul");
  return 0;
}
