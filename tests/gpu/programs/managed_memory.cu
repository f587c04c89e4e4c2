// managed_memory: unified memory, small (4 MiB): cudaMallocManaged with host
// initialisation, kernel update, host read after synchronize; a __managed__
// module variable touched by host and kernel; cudaMemPrefetchAsync to the
// device and back to the host; cudaMemAdvise(SetReadMostly /
// SetPreferredLocation); cudaStreamAttachMemAsync; cudaPointerGetAttributes
// reports managed memory.
#include "common.h"

__managed__ int g_managed[16];

__global__ void bump(int* p, int n, int add) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 2 + add;
  if (i < 16) g_managed[i] += i;
}

int main() {
  int dev = 0, managed = 0, concurrent = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev));
  CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
  EXPECT(managed == 1, "managed memory unsupported");
  const int n = 1 << 20;  // 4 MiB of ints
  int* m;
  CHECK(cudaMallocManaged(&m, n * sizeof(int), cudaMemAttachGlobal));
  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, m));
  printf("pointer type managed: %d\n", attr.type == cudaMemoryTypeManaged ? 1 : 0);
  for (int i = 0; i < n; ++i) m[i] = i % 1000;
  for (int i = 0; i < 16; ++i) g_managed[i] = 100 * i;

  bump<<<n / 256, 256>>>(m, n, 1);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += m[i] != (i % 1000) * 2 + 1;
  for (int i = 0; i < 16; ++i) bad += g_managed[i] != 101 * i;
  printf("first pass mismatches=%d g_managed[15]=%d\n", bad, g_managed[15]);
  EXPECT(bad == 0, "first pass");

  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemLocation on_dev = {cudaMemLocationTypeDevice, dev};
  cudaMemLocation on_host = {cudaMemLocationTypeHost, 0};
  if (concurrent) {
    CHECK(cudaMemAdvise(m, n * sizeof(int), cudaMemAdviseSetPreferredLocation, on_dev));
    CHECK(cudaMemPrefetchAsync(m, n * sizeof(int), on_dev, 0, s));
  }
  bump<<<n / 256, 256, 0, s>>>(m, n, -3);
  CHECK_LAUNCH();
  if (concurrent) CHECK(cudaMemPrefetchAsync(m, n * sizeof(int), on_host, 0, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaDeviceSynchronize());
  bad = 0;
  for (int i = 0; i < n; ++i) bad += m[i] != ((i % 1000) * 2 + 1) * 2 - 3;
  printf("prefetch pass mismatches=%d\n", bad);
  EXPECT(bad == 0, "prefetch pass");

  // A second allocation attached to one stream, read-mostly advice.
  int* m2;
  CHECK(cudaMallocManaged(&m2, 4096 * sizeof(int), cudaMemAttachHost));
  for (int i = 0; i < 4096; ++i) m2[i] = i;
  CHECK(cudaStreamAttachMemAsync(s, m2, 0, cudaMemAttachSingle));
  CHECK(cudaStreamSynchronize(s));
  if (concurrent) CHECK(cudaMemAdvise(m2, 4096 * sizeof(int), cudaMemAdviseSetReadMostly, on_dev));
  bump<<<16, 256, 0, s>>>(m2, 4096, 7);
  CHECK_LAUNCH();
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaDeviceSynchronize());
  bad = 0;
  long long sum = 0;
  for (int i = 0; i < 4096; ++i) {
    bad += m2[i] != i * 2 + 7;
    sum += m2[i];
  }
  for (int i = 0; i < 16; ++i) bad += g_managed[i] != 103 * i;
  printf("attached pass mismatches=%d sum=%lld g_managed[15]=%d\n", bad, sum, g_managed[15]);
  EXPECT(bad == 0, "attached pass");

  CHECK(cudaFree(m));
  CHECK(cudaFree(m2));
  CHECK(cudaStreamDestroy(s));
  pass("managed_memory");
  return 0;
}
