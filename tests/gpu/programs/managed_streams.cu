// managed_streams: streams over managed buffers, as pipelines that overlap host
// and device work write it: each of 4 non-blocking streams owns a managed
// buffer attached to it (cudaStreamAttachMemAsync, cudaMemAttachSingle), the
// host fills a buffer, prefetches it to the GPU, launches a kernel and a
// prefetch back, and processes a finished stream's results while the other
// streams' kernels run (concurrent access of different buffers). A __managed__
// table read by the kernels is changed by the host between rounds.
#include "common.h"

__managed__ int g_scale[4];

__global__ void work(int* buf, int n, int s, int round) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int v = buf[i];
  for (int k = 0; k < 64; ++k) v = v * 3 + g_scale[s] + round;  // some arithmetic
  buf[i] = v;
}

int main() {
  const int kStreams = 4, n = 1 << 20;
  int dev = 0;
  CHECK(cudaGetDevice(&dev));
  cudaStream_t st[kStreams];
  int* buf[kStreams];
  for (int s = 0; s < kStreams; ++s) {
    CHECK(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
    CHECK(cudaMallocManaged(&buf[s], n * sizeof(int), cudaMemAttachHost));
    CHECK(cudaStreamAttachMemAsync(st[s], buf[s], 0, cudaMemAttachSingle));
    g_scale[s] = s + 1;
  }
  for (int s = 0; s < kStreams; ++s) CHECK(cudaStreamSynchronize(st[s]));
  cudaMemLocation on_dev = {cudaMemLocationTypeDevice, dev};
  cudaMemLocation on_host = {cudaMemLocationTypeHost, 0};
  uint64_t sums[kStreams] = {};
  for (int round = 0; round < 3; ++round) {
    for (int s = 0; s < kStreams; ++s) {
      for (int i = 0; i < n; ++i) buf[s][i] = i ^ (round * 977 + s);
      CHECK(cudaMemPrefetchAsync(buf[s], n * sizeof(int), on_dev, 0, st[s]));
      work<<<n / 256, 256, 0, st[s]>>>(buf[s], n, s, round);
      CHECK_LAUNCH();
      CHECK(cudaMemPrefetchAsync(buf[s], n * sizeof(int), on_host, 0, st[s]));
    }
    for (int s = 0; s < kStreams; ++s) {  // others still run while the host reads this one
      CHECK(cudaStreamSynchronize(st[s]));
      sums[s] = fnv1a(buf[s], n * sizeof(int), sums[s]);
    }
    CHECK(cudaDeviceSynchronize());
    for (int s = 0; s < kStreams; ++s) g_scale[s] += 10;  // read by the next round's kernels
  }
  // The same computation on the host, for the last round.
  int bad = 0;
  for (int s = 0; s < kStreams; ++s) {
    for (int i = 0; i < n; i += 4099) {
      int v = i ^ (2 * 977 + s);
      for (int k = 0; k < 64; ++k) v = v * 3 + (s + 1 + 20) + 2;
      bad += buf[s][i] != v;
    }
    printf("stream%d checksum=%016llx\n", s, static_cast<unsigned long long>(sums[s]));
  }
  printf("mismatches=%d\n", bad);
  EXPECT(bad == 0, "host and device disagree");
  for (int s = 0; s < kStreams; ++s) {
    CHECK(cudaFree(buf[s]));
    CHECK(cudaStreamDestroy(st[s]));
  }
  printf("managed_streams: PASS\n");
  return 0;
}
