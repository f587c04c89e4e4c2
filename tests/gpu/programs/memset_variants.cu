// memset_variants: cudaMemset / cudaMemsetAsync at unaligned offsets and odd
// sizes (1 byte to 300 KB, overlapping), cudaMemset2DAsync on a sub-width of
// a pitched buffer, cudaMemset3DAsync on a sub-extent, and the driver's
// cuMemsetD16 / cuMemsetD2D32 / cuMemsetD8Async through entry points. A CPU
// mirror of every byte is compared after each group.
#include <cuda.h>
#include <vector>
#include "common.h"

typedef CUresult(CUDAAPI* PFN_MemsetD16)(CUdeviceptr, unsigned short, size_t);
typedef CUresult(CUDAAPI* PFN_MemsetD2D32)(CUdeviceptr, size_t, unsigned int, size_t, size_t);
typedef CUresult(CUDAAPI* PFN_MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);

template <typename F>
static F get(const char* name, unsigned int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q));
  EXPECT(q == cudaDriverEntryPointSuccess && fn, "entry point %s", name);
  return reinterpret_cast<F>(fn);
}

static int compare(const unsigned char* dev, const std::vector<unsigned char>& mirror,
                   const char* what) {
  std::vector<unsigned char> got(mirror.size());
  CHECK(cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != mirror[i];
  printf("%s: mismatches=%d checksum=%016llx\n", what, bad,
         (unsigned long long)fnv1a(got.data(), got.size()));
  return bad;
}

int main() {
  const size_t size = (1 << 20) + 77;
  unsigned char* d;
  CHECK(cudaMalloc(&d, size));
  std::vector<unsigned char> mirror(size, 0);
  CHECK(cudaMemset(d, 0, size));
  struct Op {
    size_t off, len;
    int val;
  } ops[] = {
      {0, 1, 0xab},
      {1, 3, 0x11},
      {3, 7, 0x22},
      {13, 4097, 0x33},
      {5000, 65536 + 5, 0x44},
      {100003, 300001, 0x55},
      {size - 1, 1, 0x66},
      {2, 0, 0x77},
      {4096, 4096, 0x00},
      {777777, 12345, 0x1ff},
  };
  for (auto& o : ops) {
    CHECK(cudaMemset(d + o.off, o.val, o.len));
    memset(mirror.data() + o.off, o.val & 0xff, o.len);
  }
  int bad = compare(d, mirror, "cudaMemset");
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (auto& o : ops) {
    size_t off = (o.off * 7 + 3) % (size - o.len);
    CHECK(cudaMemsetAsync(d + off, (o.val + 0x21) & 0xff, o.len, s));
    memset(mirror.data() + off, (o.val + 0x21) & 0xff, o.len);
  }
  CHECK(cudaStreamSynchronize(s));
  bad += compare(d, mirror, "cudaMemsetAsync");

  // 2D: a pitched buffer, memset of a sub-width window.
  const int W = 301, H = 41;
  unsigned char* p2;
  size_t pitch;
  CHECK(cudaMallocPitch(reinterpret_cast<void**>(&p2), &pitch, W, H));
  CHECK(cudaMemset2DAsync(p2, pitch, 0x5a, W, H, s));
  CHECK(cudaMemset2DAsync(p2 + 3 * pitch + 10, pitch, 0xc3, 100, 20, s));
  std::vector<unsigned char> g2(W * H);
  CHECK(cudaMemcpy2DAsync(g2.data(), W, p2, pitch, W, H, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  int bad2 = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      bool in = y >= 3 && y < 23 && x >= 10 && x < 110;
      bad2 += g2[y * W + x] != (in ? 0xc3 : 0x5a);
    }
  printf("cudaMemset2DAsync: mismatches=%d\n", bad2);
  bad += bad2;

  // 3D: sub-extent memset at an offset.
  const int X = 64, Y = 16, Z = 8;
  cudaPitchedPtr v;
  CHECK(cudaMalloc3D(&v, make_cudaExtent(X, Y, Z)));
  CHECK(cudaMemset3DAsync(v, 0x01, make_cudaExtent(X, Y, Z), s));
  cudaPitchedPtr sub = v;
  sub.ptr = static_cast<char*>(v.ptr) + 2 * v.pitch * Y + 4 * v.pitch + 8;  // z=2, y=4, x=8
  CHECK(cudaMemset3DAsync(sub, 0xee, make_cudaExtent(16, 5, 3), s));
  std::vector<unsigned char> g3(X * Y * Z);
  cudaMemcpy3DParms cp = {};
  cp.srcPtr = v;
  cp.dstPtr = make_cudaPitchedPtr(g3.data(), X, X, Y);
  cp.extent = make_cudaExtent(X, Y, Z);
  cp.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3DAsync(&cp, s));
  CHECK(cudaStreamSynchronize(s));
  int bad3 = 0;
  for (int z = 0; z < Z; ++z)
    for (int y = 0; y < Y; ++y)
      for (int x = 0; x < X; ++x) {
        bool in = z >= 2 && z < 5 && y >= 4 && y < 9 && x >= 8 && x < 24;
        bad3 += g3[(z * Y + y) * X + x] != (in ? 0xee : 0x01);
      }
  printf("cudaMemset3DAsync: mismatches=%d\n", bad3);
  bad += bad3;

  // Driver memsets with wider elements.
  auto d16 = get<PFN_MemsetD16>("cuMemsetD16", 3020);
  auto d2d32 = get<PFN_MemsetD2D32>("cuMemsetD2D32", 3020);
  auto d8a = get<PFN_MemsetD8Async>("cuMemsetD8Async", 3020);
  CHECK(cudaMemset(d, 0, size));
  std::fill(mirror.begin(), mirror.end(), 0);
  CUresult r = d16(reinterpret_cast<CUdeviceptr>(d + 2), 0xbeef, 1001);
  EXPECT(r == CUDA_SUCCESS, "cuMemsetD16 %d", static_cast<int>(r));
  for (int i = 0; i < 1001; ++i) {
    mirror[2 + 2 * i] = 0xef;
    mirror[3 + 2 * i] = 0xbe;
  }
  // 2D of 32-bit words: 50 rows of 30 words, pitch 256 bytes, at offset 8192.
  r = d2d32(reinterpret_cast<CUdeviceptr>(d + 8192), 256, 0x01020304u, 30, 50);
  EXPECT(r == CUDA_SUCCESS, "cuMemsetD2D32 %d", static_cast<int>(r));
  for (int y = 0; y < 50; ++y)
    for (int x = 0; x < 30; ++x) {
      unsigned char* m = mirror.data() + 8192 + y * 256 + x * 4;
      m[0] = 4;
      m[1] = 3;
      m[2] = 2;
      m[3] = 1;
    }
  CHECK(cudaDeviceSynchronize());  // order the legacy-stream memsets before stream s
  r = d8a(reinterpret_cast<CUdeviceptr>(d + 300000), 0x7e, 99999, reinterpret_cast<CUstream>(s));
  EXPECT(r == CUDA_SUCCESS, "cuMemsetD8Async %d", static_cast<int>(r));
  memset(mirror.data() + 300000, 0x7e, 99999);
  CHECK(cudaStreamSynchronize(s));
  bad += compare(d, mirror, "driver memsets");

  EXPECT(bad == 0, "memset mismatches");
  CHECK(cudaFree(d));
  CHECK(cudaFree(p2));
  CHECK(cudaFree(v.ptr));
  CHECK(cudaStreamDestroy(s));
  pass("memset_variants");
  return 0;
}
