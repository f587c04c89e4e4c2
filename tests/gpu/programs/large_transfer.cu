// large_transfer: bulk data paths and copy semantics. 256 MiB pageable H2D,
// D2D, D2H with checksums; 64 MiB pinned async both ways; odd sizes (1, 3,
// 4097, 1 MiB + 1 bytes) at odd device offsets; cudaMemcpyPeer on the same
// device; cudaMemcpyAsync H2D from pageable memory whose source is
// overwritten right after the call returns (CUDA guarantees the data was
// taken); cudaMemcpyAsync D2H to pageable memory checked WITHOUT a
// synchronize (CUDA guarantees it has completed on return).
#include <cstdint>
#include <vector>
#include "common.h"

__global__ void xor_words(uint64_t* p, size_t n, uint64_t k) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] ^= k + i;
}

static void pattern(uint64_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = (i * 0x9E3779B97F4A7C15ull) ^ seed;
}

int main() {
  const size_t big = 256ull << 20, words = big / 8;
  std::vector<uint64_t> h(words), back(words);
  pattern(h.data(), words, 0x1234);
  uint64_t *d1, *d2;
  CHECK(cudaMalloc(&d1, big));
  CHECK(cudaMalloc(&d2, big));
  CHECK(cudaMemcpy(d1, h.data(), big, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d2, d1, big, cudaMemcpyDeviceToDevice));
  xor_words<<<1024, 256>>>(d2, words, 77);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(back.data(), d2, big, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < words; ++i) bad += back[i] != (h[i] ^ (77 + i));
  printf("256MiB pageable H2D/D2D/D2H mismatches=%zu checksum=%016llx\n", bad,
         (unsigned long long)fnv1a(back.data(), 1 << 20));
  EXPECT(bad == 0, "big pageable");

  // Pinned, async, 64 MiB.
  const size_t pbytes = 64ull << 20, pwords = pbytes / 8;
  uint64_t *pin_in, *pin_out;
  CHECK(cudaMallocHost(&pin_in, pbytes));
  CHECK(cudaMallocHost(&pin_out, pbytes));
  pattern(pin_in, pwords, 0xabcdef);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaMemcpyAsync(d1, pin_in, pbytes, cudaMemcpyHostToDevice, s));
  xor_words<<<512, 256, 0, s>>>(d1, pwords, 5);
  CHECK(cudaMemcpyAsync(pin_out, d1, pbytes, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  bad = 0;
  for (size_t i = 0; i < pwords; ++i) bad += pin_out[i] != (pin_in[i] ^ (5 + i));
  printf("64MiB pinned async mismatches=%zu\n", bad);
  EXPECT(bad == 0, "pinned async");

  // Odd sizes at odd offsets.
  unsigned char* base = reinterpret_cast<unsigned char*>(d2);
  const size_t sizes[] = {1, 3, 4097, (1u << 20) + 1};
  const size_t offs[] = {1, 7, 333, 65537};
  std::vector<unsigned char> src((1u << 20) + 1), dst((1u << 20) + 1);
  int bad_odd = 0;
  for (int k = 0; k < 4; ++k) {
    for (size_t i = 0; i < sizes[k]; ++i) src[i] = static_cast<unsigned char>(i * 31 + k);
    CHECK(cudaMemcpy(base + offs[k], src.data(), sizes[k], cudaMemcpyHostToDevice));
    unsigned char* far = base + (8u << 20) + offs[k] + 3;  // a non-overlapping odd destination
    CHECK(cudaMemcpy(far, base + offs[k], sizes[k], cudaMemcpyDeviceToDevice));
    memset(dst.data(), 0, sizes[k]);
    CHECK(cudaMemcpy(dst.data(), far, sizes[k], cudaMemcpyDeviceToHost));
    bad_odd += memcmp(dst.data(), src.data(), sizes[k]) != 0;
  }
  printf("odd sizes mismatches=%d\n", bad_odd);
  EXPECT(bad_odd == 0, "odd sizes");

  // Peer copy on the same device.
  CHECK(cudaMemcpyPeer(d2, 0, d1, 0, 1 << 20));
  CHECK(cudaMemcpy(back.data(), d2, 1 << 20, cudaMemcpyDeviceToHost));
  bad = 0;
  for (size_t i = 0; i < (1u << 20) / 8; ++i) bad += back[i] != pin_out[i];
  printf("cudaMemcpyPeer mismatches=%zu\n", bad);
  EXPECT(bad == 0, "peer copy");

  // Async H2D from pageable: the source may be reused as soon as the call returns.
  std::vector<uint64_t> page(1 << 16);
  pattern(page.data(), page.size(), 42);
  std::vector<uint64_t> orig = page;
  CHECK(cudaMemcpyAsync(d1, page.data(), page.size() * 8, cudaMemcpyHostToDevice, s));
  std::fill(page.begin(), page.end(), 0);
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(back.data(), d1, page.size() * 8, cudaMemcpyDeviceToHost));
  bad = 0;
  for (size_t i = 0; i < page.size(); ++i) bad += back[i] != orig[i];
  printf("async H2D from reused pageable buffer mismatches=%zu\n", bad);
  EXPECT(bad == 0, "pageable async H2D");

  // Async D2H to pageable: complete on return, no synchronize.
  std::vector<uint64_t> dstp(1 << 16, 0);
  CHECK(cudaMemcpyAsync(dstp.data(), d1, dstp.size() * 8, cudaMemcpyDeviceToHost, s));
  bad = 0;
  for (size_t i = 0; i < dstp.size(); ++i) bad += dstp[i] != orig[i];
  printf("async D2H to pageable, unsynchronised read mismatches=%zu\n", bad);
  EXPECT(bad == 0, "pageable async D2H must be complete on return");
  CHECK(cudaStreamSynchronize(s));

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFreeHost(pin_in));
  CHECK(cudaFreeHost(pin_out));
  CHECK(cudaFree(d1));
  CHECK(cudaFree(d2));
  pass("large_transfer");
  return 0;
}
