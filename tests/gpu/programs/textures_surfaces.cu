// textures_surfaces: CUDA arrays and texture/surface objects. cudaMallocArray
// + cudaMemcpy2DToArray + texture object (point sampling with clamp
// addressing, linear filtering halfway between texels), a surface object
// written by one kernel and read by another, cudaMemcpy2DFromArray,
// cudaMemcpy2DArrayToArray, cudaArrayGetInfo, a 3D array through
// cudaMalloc3DArray + cudaMemcpy3D and tex3D, textures over linear memory
// (tex1Dfetch) and pitched memory (Pitch2D).
#include <cmath>
#include <vector>
#include "common.h"

__global__ void sample_point(cudaTextureObject_t t, float* out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h)
    out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f) + tex2D<float>(t, x - 3 + 0.5f, y + 0.5f);
}
__global__ void sample_linear(cudaTextureObject_t t, float* out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 1.0f, y + 0.5f);
}
__global__ void surf_write(cudaSurfaceObject_t s, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) surf2Dwrite(x * 100 + y, s, x * static_cast<int>(sizeof(int)), y);
}
__global__ void surf_read_add(cudaSurfaceObject_t s, int* out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) {
    int v;
    surf2Dread(&v, s, x * static_cast<int>(sizeof(int)), y);
    out[y * w + x] = v + 1;
  }
}
__global__ void sample3d(cudaTextureObject_t t, int* out, int X, int Y, int Z) {
  int x = threadIdx.x, y = threadIdx.y, z = blockIdx.x;
  if (x < X && y < Y && z < Z)
    out[(z * Y + y) * X + x] = tex3D<int>(t, x + 0.5f, y + 0.5f, z + 0.5f) * 2;
}
__global__ void fetch1d(cudaTextureObject_t t, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<int>(t, i) + tex1Dfetch<int>(t, n - 1 - i);
}
__global__ void sample_pitch(cudaTextureObject_t t, float* out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f) * 3.f;
}

static cudaTextureObject_t make_tex(const cudaResourceDesc& rd, cudaTextureFilterMode filter,
                                    cudaTextureReadMode rm) {
  cudaTextureDesc td = {};
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
  td.filterMode = filter;
  td.readMode = rm;
  td.normalizedCoords = 0;
  cudaTextureObject_t t = 0;
  CHECK(cudaCreateTextureObject(&t, &rd, &td, nullptr));
  return t;
}

int main() {
  const int W = 64, H = 48;
  std::vector<float> img(W * H);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) img[y * W + x] = static_cast<float>((x * 7 + y * 3) % 50);
  cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
  cudaArray_t arr;
  CHECK(cudaMallocArray(&arr, &fdesc, W, H));
  CHECK(cudaMemcpy2DToArray(arr, 0, 0, img.data(), W * sizeof(float), W * sizeof(float), H,
                            cudaMemcpyHostToDevice));
  cudaChannelFormatDesc got_desc;
  cudaExtent got_ext;
  unsigned int got_flags;
  CHECK(cudaArrayGetInfo(&got_desc, &got_ext, &got_flags, arr));
  printf("array info: bits=%d kind=%d extent=%zux%zux%zu\n", got_desc.x,
         static_cast<int>(got_desc.f), got_ext.width, got_ext.height, got_ext.depth);

  cudaResourceDesc rd = {};
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = arr;
  cudaTextureObject_t tp = make_tex(rd, cudaFilterModePoint, cudaReadModeElementType);
  cudaTextureObject_t tl = make_tex(rd, cudaFilterModeLinear, cudaReadModeElementType);
  float* dout;
  CHECK(cudaMalloc(&dout, W * H * sizeof(float)));
  dim3 b(16, 16), g((W + 15) / 16, (H + 15) / 16);
  std::vector<float> out(W * H);
  sample_point<<<g, b>>>(tp, dout, W, H);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      int xl = x - 3 < 0 ? 0 : x - 3;
      bad += out[y * W + x] != img[y * W + x] + img[y * W + xl];
    }
  printf("texture point+clamp mismatches=%d checksum=%016llx\n", bad,
         (unsigned long long)fnv1a(out.data(), out.size() * 4));
  sample_linear<<<g, b>>>(tl, dout, W, H);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int badl = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      int xr = x + 1 < W ? x + 1 : W - 1;
      float e = 0.5f * (img[y * W + x] + img[y * W + xr]);
      badl += std::fabs(out[y * W + x] - e) > 1e-4f;
    }
  printf("texture linear mismatches=%d\n", badl);
  bad += badl;

  // Surface: write with one kernel, read with another, copy out of the array.
  cudaChannelFormatDesc idesc = cudaCreateChannelDesc<int>();
  cudaArray_t sarr, sarr2;
  CHECK(cudaMallocArray(&sarr, &idesc, W, H, cudaArraySurfaceLoadStore));
  CHECK(cudaMallocArray(&sarr2, &idesc, W, H));
  cudaResourceDesc srd = {};
  srd.resType = cudaResourceTypeArray;
  srd.res.array.array = sarr;
  cudaSurfaceObject_t surf;
  CHECK(cudaCreateSurfaceObject(&surf, &srd));
  surf_write<<<g, b>>>(surf, W, H);
  CHECK_LAUNCH();
  int* iout;
  CHECK(cudaMalloc(&iout, W * H * sizeof(int)));
  surf_read_add<<<g, b>>>(surf, iout, W, H);
  CHECK_LAUNCH();
  std::vector<int> hi(W * H), hs(W * H);
  CHECK(cudaMemcpy(hi.data(), iout, hi.size() * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy2DArrayToArray(sarr2, 0, 0, sarr, 0, 0, W * sizeof(int), H,
                                 cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy2DFromArray(hs.data(), W * sizeof(int), sarr2, 0, 0, W * sizeof(int), H,
                              cudaMemcpyDeviceToHost));
  int bads = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      bads += hs[y * W + x] != x * 100 + y;
      bads += hi[y * W + x] != x * 100 + y + 1;
    }
  printf("surface mismatches=%d\n", bads);
  bad += bads;

  // 3D array and tex3D.
  const int X = 16, Y = 8, Z = 4;
  std::vector<int> vol(X * Y * Z), vout(X * Y * Z);
  for (int i = 0; i < X * Y * Z; ++i) vol[i] = i * 5 - 77;
  cudaArray_t arr3;
  CHECK(cudaMalloc3DArray(&arr3, &idesc, make_cudaExtent(X, Y, Z)));
  cudaMemcpy3DParms cp = {};
  cp.srcPtr = make_cudaPitchedPtr(vol.data(), X * sizeof(int), X, Y);
  cp.dstArray = arr3;
  cp.extent = make_cudaExtent(X, Y, Z);
  cp.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&cp));
  cudaResourceDesc rd3 = {};
  rd3.resType = cudaResourceTypeArray;
  rd3.res.array.array = arr3;
  cudaTextureObject_t t3 = make_tex(rd3, cudaFilterModePoint, cudaReadModeElementType);
  int* d3;
  CHECK(cudaMalloc(&d3, vol.size() * sizeof(int)));
  sample3d<<<Z, dim3(X, Y)>>>(t3, d3, X, Y, Z);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(vout.data(), d3, vout.size() * sizeof(int), cudaMemcpyDeviceToHost));
  int bad3 = 0;
  for (int i = 0; i < X * Y * Z; ++i) bad3 += vout[i] != vol[i] * 2;
  printf("3d texture mismatches=%d\n", bad3);
  bad += bad3;

  // Texture over linear memory.
  const int n = 10000;
  std::vector<int> lin(n), lout(n);
  for (int i = 0; i < n; ++i) lin[i] = i * i % 10007;
  int *dlin, *dlout;
  CHECK(cudaMalloc(&dlin, n * sizeof(int)));
  CHECK(cudaMalloc(&dlout, n * sizeof(int)));
  CHECK(cudaMemcpy(dlin, lin.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  cudaResourceDesc rdl = {};
  rdl.resType = cudaResourceTypeLinear;
  rdl.res.linear.devPtr = dlin;
  rdl.res.linear.desc = idesc;
  rdl.res.linear.sizeInBytes = n * sizeof(int);
  cudaTextureObject_t tlin = make_tex(rdl, cudaFilterModePoint, cudaReadModeElementType);
  fetch1d<<<(n + 255) / 256, 256>>>(tlin, dlout, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(lout.data(), dlout, n * sizeof(int), cudaMemcpyDeviceToHost));
  int badlin = 0;
  for (int i = 0; i < n; ++i) badlin += lout[i] != lin[i] + lin[n - 1 - i];
  printf("linear texture mismatches=%d\n", badlin);
  bad += badlin;

  // Texture over pitched memory.
  float* pimg;
  size_t pitch;
  CHECK(cudaMallocPitch(reinterpret_cast<void**>(&pimg), &pitch, W * sizeof(float), H));
  CHECK(cudaMemcpy2D(pimg, pitch, img.data(), W * sizeof(float), W * sizeof(float), H,
                     cudaMemcpyHostToDevice));
  cudaResourceDesc rdp = {};
  rdp.resType = cudaResourceTypePitch2D;
  rdp.res.pitch2D.devPtr = pimg;
  rdp.res.pitch2D.desc = fdesc;
  rdp.res.pitch2D.width = W;
  rdp.res.pitch2D.height = H;
  rdp.res.pitch2D.pitchInBytes = pitch;
  cudaTextureObject_t tpitch = make_tex(rdp, cudaFilterModePoint, cudaReadModeElementType);
  sample_pitch<<<g, b>>>(tpitch, dout, W, H);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int badp = 0;
  for (int i = 0; i < W * H; ++i) badp += out[i] != img[i] * 3.f;
  printf("pitch2D texture mismatches=%d\n", badp);
  bad += badp;

  EXPECT(bad == 0, "texture/surface mismatches");
  CHECK(cudaDestroyTextureObject(tp));
  CHECK(cudaDestroyTextureObject(tl));
  CHECK(cudaDestroyTextureObject(t3));
  CHECK(cudaDestroyTextureObject(tlin));
  CHECK(cudaDestroyTextureObject(tpitch));
  CHECK(cudaDestroySurfaceObject(surf));
  CHECK(cudaFreeArray(arr));
  CHECK(cudaFreeArray(sarr));
  CHECK(cudaFreeArray(sarr2));
  CHECK(cudaFreeArray(arr3));
  CHECK(cudaFree(dout));
  CHECK(cudaFree(iout));
  CHECK(cudaFree(d3));
  CHECK(cudaFree(dlin));
  CHECK(cudaFree(dlout));
  CHECK(cudaFree(pimg));
  pass("textures_surfaces");
  return 0;
}
