// memcpy_pitched: cudaMallocPitch + cudaMemcpy2D (host pitch != device pitch),
// cudaMemset2D, cudaMemcpy2DAsync device-to-device of a sub-rectangle,
// cudaMalloc3D + cudaMemset3D + cudaMemcpy3D (H2D into a sub-box at an
// offset) + cudaMemcpy3DAsync (D2H of the whole volume), kernels indexing
// through pitch.
#include <vector>
#include "common.h"

__global__ void inc2d(float* base, size_t pitch, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= w || y >= h) return;
  float* row = reinterpret_cast<float*>(reinterpret_cast<char*>(base) + y * pitch);
  row[x] = row[x] * 2.f + static_cast<float>(y);
}

__global__ void inc3d(cudaPitchedPtr p, int w, int h, int d) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z;
  if (x >= w || y >= h || z >= d) return;
  char* slice = static_cast<char*>(p.ptr) + static_cast<size_t>(z) * p.pitch * p.ysize;
  int* row = reinterpret_cast<int*>(slice + y * p.pitch);
  row[x] += x + 100 * y + 10000 * z;
}

int main() {
  // ---- 2D ----
  const int W = 333, H = 77, HP = 400;  // HP: host pitch in elements
  std::vector<float> h(HP * H, -7.f);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) h[y * HP + x] = static_cast<float>((x * 3 + y * 5) % 101);
  float *dp, *dq;
  size_t pitch = 0, pitchq = 0;
  CHECK(cudaMallocPitch(reinterpret_cast<void**>(&dp), &pitch, W * sizeof(float), H));
  CHECK(cudaMallocPitch(reinterpret_cast<void**>(&dq), &pitchq, W * sizeof(float), H));
  EXPECT(pitch >= W * sizeof(float) && pitchq >= W * sizeof(float), "pitch too small");
  CHECK(cudaMemcpy2D(dp, pitch, h.data(), HP * sizeof(float), W * sizeof(float), H,
                     cudaMemcpyHostToDevice));
  dim3 b2(32, 8), g2((W + 31) / 32, (H + 7) / 8);
  inc2d<<<g2, b2>>>(dp, pitch, W, H);
  CHECK_LAUNCH();
  CHECK(cudaMemset2D(dq, pitchq, 0, W * sizeof(float), H));
  // Sub-rectangle rows 10..59, columns 5..204 of dp -> dq at (0, 0).
  const int sx = 5, sy = 10, sw = 200, sh = 50;
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  CHECK(cudaMemcpy2DAsync(dq, pitchq, reinterpret_cast<char*>(dp) + sy * pitch + sx * sizeof(float),
                          pitch, sw * sizeof(float), sh, cudaMemcpyDeviceToDevice, st));
  CHECK(cudaStreamSynchronize(st));
  std::vector<float> full(W * H), sub(W * H);
  CHECK(cudaMemcpy2D(full.data(), W * sizeof(float), dp, pitch, W * sizeof(float), H,
                     cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy2D(sub.data(), W * sizeof(float), dq, pitchq, W * sizeof(float), H,
                     cudaMemcpyDeviceToHost));
  int bad2 = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      float e = h[y * HP + x] * 2.f + static_cast<float>(y);
      if (full[y * W + x] != e) ++bad2;
      float es =
          (x < sw && y < sh) ? h[(y + sy) * HP + x + sx] * 2.f + static_cast<float>(y + sy) : 0.f;
      if (sub[y * W + x] != es) ++bad2;
    }
  printf(
      "2d: W=%d H=%d mismatches=%d checksum=%016llx\n", W, H, bad2,
      (unsigned long long)fnv1a(full.data(), full.size() * 4, fnv1a(sub.data(), sub.size() * 4)));
  EXPECT(bad2 == 0, "2d mismatches");

  // ---- 3D ----
  const int X = 37, Y = 19, Z = 11;
  cudaExtent ext = make_cudaExtent(X * sizeof(int), Y, Z);
  cudaPitchedPtr vol;
  CHECK(cudaMalloc3D(&vol, ext));
  EXPECT(vol.pitch >= X * sizeof(int) && vol.xsize == X * sizeof(int) && vol.ysize == (size_t)Y,
         "3d pitched ptr");
  CHECK(cudaMemset3D(vol, 0x01, ext));
  const int BX = 20, BY = 10, BZ = 5, OX = 2, OY = 3, OZ = 1;
  std::vector<int> box(BX * BY * BZ);
  for (int z = 0; z < BZ; ++z)
    for (int y = 0; y < BY; ++y)
      for (int x = 0; x < BX; ++x) box[(z * BY + y) * BX + x] = z * 1000 + y * 50 + x + 7;
  cudaMemcpy3DParms up = {};
  up.srcPtr = make_cudaPitchedPtr(box.data(), BX * sizeof(int), BX, BY);
  up.dstPtr = vol;
  up.dstPos = make_cudaPos(OX * sizeof(int), OY, OZ);
  up.extent = make_cudaExtent(BX * sizeof(int), BY, BZ);
  up.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&up));
  dim3 b3(32, 4, 1), g3((X + 31) / 32, (Y + 3) / 4, Z);
  inc3d<<<g3, b3, 0, st>>>(vol, X, Y, Z);
  CHECK_LAUNCH();
  std::vector<int> out(X * Y * Z, 0);
  cudaMemcpy3DParms down = {};
  down.srcPtr = vol;
  down.dstPtr = make_cudaPitchedPtr(out.data(), X * sizeof(int), X, Y);
  down.extent = ext;
  down.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3DAsync(&down, st));
  CHECK(cudaStreamSynchronize(st));
  int bad3 = 0;
  long long sum3 = 0;
  for (int z = 0; z < Z; ++z)
    for (int y = 0; y < Y; ++y)
      for (int x = 0; x < X; ++x) {
        bool in = x >= OX && x < OX + BX && y >= OY && y < OY + BY && z >= OZ && z < OZ + BZ;
        int base = in ? box[((z - OZ) * BY + (y - OY)) * BX + (x - OX)] : 0x01010101;
        int e = base + x + 100 * y + 10000 * z;
        int g = out[(z * Y + y) * X + x];
        if (g != e) ++bad3;
        sum3 += g;
      }
  printf("3d: X=%d Y=%d Z=%d mismatches=%d sum=%lld\n", X, Y, Z, bad3, sum3);
  EXPECT(bad3 == 0, "3d mismatches");

  CHECK(cudaStreamDestroy(st));
  CHECK(cudaFree(dp));
  CHECK(cudaFree(dq));
  CHECK(cudaFree(vol.ptr));
  pass("memcpy_pitched");
  return 0;
}
