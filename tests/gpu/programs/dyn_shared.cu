// dyn_shared: dynamic shared memory at 16 KiB, a launch above 48 KiB without
// the opt-in (must fail), cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
// to 192 KiB then the same launch (must work), static + dynamic shared in
// one kernel, a templated kernel on dynamic shared memory, launch through
// cudaLaunchKernel with a sharedMem argument, cudaFuncGetAttributes and the
// carveout attribute.
#include <vector>
#include "common.h"

__global__ void reverse_dyn(const float* in, float* out, int n_per_block) {
  extern __shared__ float s[];
  const float* src = in + static_cast<size_t>(blockIdx.x) * n_per_block;
  float* dst = out + static_cast<size_t>(blockIdx.x) * n_per_block;
  for (int i = threadIdx.x; i < n_per_block; i += blockDim.x) s[i] = src[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n_per_block; i += blockDim.x) dst[i] = s[n_per_block - 1 - i];
}

__global__ void static_plus_dyn(const int* in, int* out, int n_dyn) {
  __shared__ int stat[2048];  // 8 KiB static
  extern __shared__ int dyn[];
  for (int i = threadIdx.x; i < 2048; i += blockDim.x) stat[i] = i * 3;
  for (int i = threadIdx.x; i < n_dyn; i += blockDim.x) dyn[i] = in[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n_dyn; i += blockDim.x)
    out[i] = dyn[(i + 1) % n_dyn] + stat[i % 2048];
}

template <typename T>
__global__ void rotate_tmpl(const T* in, T* out, int n) {
  extern __shared__ __align__(16) unsigned char raw[];
  T* s = reinterpret_cast<T*>(raw);
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = in[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = s[(i + 7) % n] * static_cast<T>(2);
}

static int check_reverse(const std::vector<float>& in, const std::vector<float>& out, int blocks,
                         int npb) {
  int bad = 0;
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < npb; ++i) bad += out[b * npb + i] != in[b * npb + npb - 1 - i];
  return bad;
}

int main() {
  int dev = 0, optin = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  EXPECT(optin >= 192 * 1024, "opt-in shared memory per block %d", optin);

  const int blocks = 8;
  const int big = 192 * 1024;
  const int npb_big = big / sizeof(float);
  std::vector<float> h(blocks * npb_big), o(blocks * npb_big);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i % 65536);
  float *din, *dout;
  CHECK(cudaMalloc(&din, h.size() * sizeof(float)));
  CHECK(cudaMalloc(&dout, h.size() * sizeof(float)));
  CHECK(cudaMemcpy(din, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));

  // 16 KiB: no opt-in needed.
  const int small = 16 * 1024, npb_small = small / sizeof(float);
  reverse_dyn<<<blocks, 256, small>>>(din, dout, npb_small);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(o.data(), dout, blocks * npb_small * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = check_reverse(h, o, blocks, npb_small);
  printf("dyn_smem=16KiB mismatches=%d\n", bad);
  EXPECT(bad == 0, "16 KiB");

  // 192 KiB before the opt-in: the launch must be refused.
  reverse_dyn<<<blocks, 1024, big>>>(din, dout, npb_big);
  cudaError_t e = cudaGetLastError();
  printf("dyn_smem=192KiB without opt-in: %s\n", cudaGetErrorName(e));
  EXPECT(e != cudaSuccess, "launch above 48 KiB without opt-in must fail");
  CHECK(cudaGetLastError());

  CHECK(cudaFuncSetAttribute(reverse_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
  CHECK(cudaFuncSetAttribute(reverse_dyn, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, reverse_dyn));
  printf("reverse_dyn: maxDynamicSharedSizeBytes=%d sharedSizeBytes=%zu\n",
         fa.maxDynamicSharedSizeBytes, fa.sharedSizeBytes);
  EXPECT(fa.maxDynamicSharedSizeBytes == big, "attribute readback");
  CHECK(cudaMemset(dout, 0, h.size() * sizeof(float)));
  reverse_dyn<<<blocks, 1024, big>>>(din, dout, npb_big);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(o.data(), dout, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  bad = check_reverse(h, o, blocks, npb_big);
  printf("dyn_smem=192KiB mismatches=%d checksum=%016llx\n", bad,
         (unsigned long long)fnv1a(o.data(), o.size() * 4));
  EXPECT(bad == 0, "192 KiB");

  // The same through cudaLaunchKernel with an explicit sharedMem argument.
  CHECK(cudaMemset(dout, 0, h.size() * sizeof(float)));
  int npb = npb_big;
  void* args[] = {&din, &dout, &npb};
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(reverse_dyn), dim3(blocks), dim3(512), args,
                         big, 0));
  CHECK(cudaMemcpy(o.data(), dout, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  bad = check_reverse(h, o, blocks, npb_big);
  printf("cudaLaunchKernel dyn_smem=192KiB mismatches=%d\n", bad);
  EXPECT(bad == 0, "cudaLaunchKernel 192 KiB");

  // Static 8 KiB + dynamic 100 KiB.
  const int dyn_bytes = 100 * 1024, n_dyn = dyn_bytes / sizeof(int);
  CHECK(cudaFuncSetAttribute(static_plus_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             dyn_bytes));
  CHECK(cudaFuncGetAttributes(&fa, static_plus_dyn));
  printf("static_plus_dyn: sharedSizeBytes=%zu maxDynamicSharedSizeBytes=%d\n", fa.sharedSizeBytes,
         fa.maxDynamicSharedSizeBytes);
  EXPECT(fa.sharedSizeBytes == 8192, "static shared size");
  std::vector<int> hi(n_dyn), ho(n_dyn);
  for (int i = 0; i < n_dyn; ++i) hi[i] = i * 7 - 1000;
  int *di, *dio;
  CHECK(cudaMalloc(&di, n_dyn * sizeof(int)));
  CHECK(cudaMalloc(&dio, n_dyn * sizeof(int)));
  CHECK(cudaMemcpy(di, hi.data(), n_dyn * sizeof(int), cudaMemcpyHostToDevice));
  static_plus_dyn<<<1, 768, dyn_bytes>>>(di, dio, n_dyn);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(ho.data(), dio, n_dyn * sizeof(int), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int i = 0; i < n_dyn; ++i) bad += ho[i] != hi[(i + 1) % n_dyn] + (i % 2048) * 3;
  printf("static_plus_dyn mismatches=%d\n", bad);
  EXPECT(bad == 0, "static + dynamic");

  // Templated kernel, doubles, 64 KiB dynamic.
  const int nd = 8192;  // 64 KiB of doubles
  CHECK(cudaFuncSetAttribute(rotate_tmpl<double>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             nd * (int)sizeof(double)));
  std::vector<double> hd(nd), od(nd);
  for (int i = 0; i < nd; ++i) hd[i] = i * 0.5;
  double *dd, *ddo;
  CHECK(cudaMalloc(&dd, nd * sizeof(double)));
  CHECK(cudaMalloc(&ddo, nd * sizeof(double)));
  CHECK(cudaMemcpy(dd, hd.data(), nd * sizeof(double), cudaMemcpyHostToDevice));
  rotate_tmpl<double><<<1, 512, nd * sizeof(double)>>>(dd, ddo, nd);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(od.data(), ddo, nd * sizeof(double), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int i = 0; i < nd; ++i) bad += od[i] != hd[(i + 7) % nd] * 2.0;
  printf("template<double> dyn_smem=64KiB mismatches=%d\n", bad);
  EXPECT(bad == 0, "template");

  CHECK(cudaFree(din));
  CHECK(cudaFree(dout));
  CHECK(cudaFree(di));
  CHECK(cudaFree(dio));
  CHECK(cudaFree(dd));
  CHECK(cudaFree(ddo));
  pass("dyn_shared");
  return 0;
}
