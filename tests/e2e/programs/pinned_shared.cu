// pinned_shared: pinned host memory over a shared-memory connection (shm://).
//
// cudaMallocHost / cudaHostAlloc memory is then shared with flyt-server, which
// registers it with the driver: the GPU reaches the client's own bytes. Checks,
// byte-exact: sync and async copies both ways between pinned buffers and the
// device; the mapped device pointer (cudaHostGetDevicePointer) read and written
// by device-side copies and memsets, whose results appear in the client's
// buffer; pointer attributes; freeing. Over other transports the buffer stays
// client memory until cudaHostGetDevicePointer maps it (mapped_host.cu covers that).
// Prints mapped=0|1, same_address=0|1, then "pinned_shared: PASS".
// With the argument "hold" it also prints "holding" after allocating and
// sleeps, so that a test can kill it while it owns shared memory.
#include <vector>

#include "e2e_common.h"

int main(int argc, char** argv) {
  e2e::Init("pinned_shared");
  const bool hold = argc > 1 && std::string(argv[1]) == "hold";
  const size_t n = (8 << 20) + 123;

  e2e::Step("allocate");
  unsigned char *a = nullptr, *b = nullptr, *m = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&a), n));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&b), n, cudaHostAllocPortable));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&m), n, cudaHostAllocMapped));
  unsigned char* d = nullptr;
  CK(cudaMalloc(reinterpret_cast<void**>(&d), n));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  e2e::Step("sync copies");
  e2e::Fill(a, n, 7);
  CK(cudaMemcpy(d, a, n, cudaMemcpyHostToDevice));
  memset(a, 0, n);  // the copy has completed: reusing the buffer must not matter
  CK(cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost));
  std::vector<unsigned char> want(n);
  e2e::Fill(want.data(), n, 7);
  long long diff = e2e::FirstDiff(b, want.data(), n);
  EXPECT(diff < 0, "sync round trip through pinned buffers differs at byte %lld", diff);

  e2e::Step("async copies");
  e2e::Fill(a, n, 11);
  CK(cudaMemcpyAsync(d + 5, a, n - 5, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(b, d + 5, n - 5, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  diff = e2e::FirstDiff(b, a, n - 5);
  EXPECT(diff < 0, "async round trip through pinned buffers differs at byte %lld", diff);
  CK(cudaMemcpyAsync(b, d, 1, cudaMemcpyDefault, s));  // unified addressing picks the direction
  CK(cudaStreamSynchronize(s));

  e2e::Step("pointer attributes");
  cudaPointerAttributes attr{};
  CK(cudaPointerGetAttributes(&attr, a + 100));
  EXPECT(attr.type == cudaMemoryTypeHost, "cudaMallocHost memory reports type %d", attr.type);
  EXPECT(attr.hostPointer != nullptr, "no host pointer");

  e2e::Step("mapped pointer");
  unsigned char* dm = nullptr;
  cudaError_t mapped = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dm), m, 0);
  printf("mapped=%d\n", mapped == cudaSuccess ? 1 : 0);
  if (mapped == cudaSuccess) {
    printf("same_address=%d\n", dm == m ? 1 : 0);
    // The device writes the client's buffer through the mapped pointer ...
    CK(cudaMemsetAsync(dm + 1, 0x5a, n - 2, s));
    CK(cudaStreamSynchronize(s));
    long long off = e2e::FirstNot(m + 1, 0x5a, n - 2);
    EXPECT(off < 0, "a device memset through the mapped pointer missed byte %lld", off + 1);
    // ... and reads it: device-to-device from the mapped pointer.
    e2e::Fill(m, n, 23);
    CK(cudaMemcpyAsync(d, dm, n, cudaMemcpyDeviceToDevice, s));
    CK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    diff = e2e::FirstDiff(b, m, n);
    EXPECT(diff < 0, "a device copy from the mapped pointer differs at byte %lld", diff);
    CK(cudaPointerGetAttributes(&attr, m + 8));
    EXPECT(attr.devicePointer == dm + 8, "devicePointer %p, expected %p", attr.devicePointer,
           static_cast<void*>(dm + 8));
  } else {
    cudaGetLastError();
    EXPECT(mapped == cudaErrorNotSupported, "cudaHostGetDevicePointer: %s",
           cudaGetErrorString(mapped));
  }
  // Memory that was never pinned has no device address, natively or through Flyt.
  {
    std::vector<unsigned char> plain(64);
    void* none = nullptr;
    cudaError_t r = cudaHostGetDevicePointer(&none, plain.data(), 0);
    cudaGetLastError();
    EXPECT(r == cudaErrorInvalidValue, "cudaHostGetDevicePointer of malloc'd memory: %s",
           cudaGetErrorString(r));
  }

  if (hold) {
    printf("holding\n");
    fflush(stdout);
    sleep(60);
  }

  e2e::Step("free");
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  CK(cudaFreeHost(a));
  CK(cudaFreeHost(b));
  CK(cudaFreeHost(m));
  EXPECT(cudaFreeHost(a + 1) != cudaSuccess, "cudaFreeHost of a non-allocation succeeded");
  cudaGetLastError();
  e2e::Pass();
  return 0;
}
