// pinned_memory: page-locked host memory from cudaMallocHost, cudaHostAlloc
// (portable, write-combined) and cudaHostRegister on malloc'd memory;
// cudaHostGetFlags, cudaPointerGetAttributes (host vs device vs unregistered
// memory), cudaHostGetDevicePointer of pageable memory, async copies in both
// directions from each kind, cudaHostUnregister, and cudaMemcpy with
// cudaMemcpyDefault (kind inferred through UVA).
#include <vector>
#include "common.h"

__global__ void negate(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = -p[i] + 5;
}

static int roundtrip(int* host_src, int* host_dst, int* dev, int n, cudaStream_t s) {
  for (int i = 0; i < n; ++i) host_src[i] = i * 13 - 7;
  CHECK(cudaMemcpyAsync(dev, host_src, n * sizeof(int), cudaMemcpyHostToDevice, s));
  negate<<<(n + 255) / 256, 256, 0, s>>>(dev, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpyAsync(host_dst, dev, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += host_dst[i] != -(i * 13 - 7) + 5;
  return bad;
}

static const char* type_name(cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeUnregistered:
      return "unregistered";
    case cudaMemoryTypeHost:
      return "host";
    case cudaMemoryTypeDevice:
      return "device";
    case cudaMemoryTypeManaged:
      return "managed";
  }
  return "?";
}

int main() {
  const int n = 3 << 20;
  int* dev;
  CHECK(cudaMalloc(&dev, n * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  int *a, *b, *wc;
  CHECK(cudaMallocHost(&a, n * sizeof(int)));
  CHECK(cudaHostAlloc(&b, n * sizeof(int), cudaHostAllocPortable));
  CHECK(cudaHostAlloc(&wc, n * sizeof(int), cudaHostAllocWriteCombined));
  unsigned int flags = 0;
  CHECK(cudaHostGetFlags(&flags, b));
  printf("cudaHostAlloc(portable) flags has portable bit: %d\n",
         (flags & cudaHostAllocPortable) ? 1 : 0);
  CHECK(cudaHostGetFlags(&flags, wc));
  printf("cudaHostAlloc(writecombined) flags has wc bit: %d\n",
         (flags & cudaHostAllocWriteCombined) ? 1 : 0);

  std::vector<int> plain(n + 1024);
  int* reg = plain.data();
  CHECK(cudaHostRegister(reg, n * sizeof(int), cudaHostRegisterDefault));

  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, a));
  printf("cudaMallocHost pointer: %s\n", type_name(attr.type));
  CHECK(cudaPointerGetAttributes(&attr, reg));
  printf("registered pointer: %s\n", type_name(attr.type));
  CHECK(cudaPointerGetAttributes(&attr, dev));
  printf("device pointer: %s\n", type_name(attr.type));
  std::vector<int> other(16);
  CHECK(cudaPointerGetAttributes(&attr, other.data()));
  printf("pageable pointer: %s\n", type_name(attr.type));
  // Pageable memory has no device address: the error, not a crash or a pointer.
  void* unmapped = nullptr;
  cudaError_t unmapped_rc = cudaHostGetDevicePointer(&unmapped, other.data(), 0);
  cudaGetLastError();
  printf("cudaHostGetDevicePointer(pageable): %s\n", cudaGetErrorName(unmapped_rc));

  int bad = 0;
  bad += roundtrip(a, b, dev, n, s);
  bad += roundtrip(b, reg, dev, n, s);
  bad += roundtrip(reg, a, dev, n, s);
  // Write-combined memory: write only from the host, read back via a normal buffer.
  bad += roundtrip(wc, a, dev, n, s);
  printf("pinned round trips mismatches=%d\n", bad);
  EXPECT(bad == 0, "pinned round trips");

  CHECK(cudaHostUnregister(reg));
  CHECK(cudaPointerGetAttributes(&attr, reg));
  printf("after unregister: %s\n", type_name(attr.type));

  // cudaMemcpyDefault in every direction.
  std::vector<int> pg(1000), back(1000);
  for (int i = 0; i < 1000; ++i) pg[i] = 3 * i;
  CHECK(cudaMemcpy(dev, pg.data(), 1000 * sizeof(int), cudaMemcpyDefault));
  CHECK(cudaMemcpy(dev + 1000, dev, 1000 * sizeof(int), cudaMemcpyDefault));
  CHECK(cudaMemcpy(a, dev + 1000, 1000 * sizeof(int), cudaMemcpyDefault));
  CHECK(cudaMemcpy(back.data(), a, 1000 * sizeof(int), cudaMemcpyDefault));
  EXPECT(back == pg, "cudaMemcpyDefault chain");
  printf("cudaMemcpyDefault chain ok checksum=%016llx\n",
         (unsigned long long)fnv1a(back.data(), back.size() * 4));

  CHECK(cudaFreeHost(a));
  CHECK(cudaFreeHost(b));
  CHECK(cudaFreeHost(wc));
  CHECK(cudaFree(dev));
  CHECK(cudaStreamDestroy(s));
  pass("pinned_memory");
  return 0;
}
