// rma_copies: copies of pinned and registered host memory, the ones that over ucx://
// travel as one-sided reads and writes of this process's memory (client/rma.cc,
// server/session_rma.cc). Over other transports the same checks run on the byte path.
// Byte-exact, with odd sizes and offsets inside the buffers:
//   - synchronous copies both ways, whole and in pieces;
//   - asynchronous copies both ways on a stream, and small asynchronous device-to-host
//     copies (which stay asynchronous over ucx://);
//   - stream order with host work: a host function behind a device-to-host copy sees
//     the bytes; a host-to-device copy behind a host function that wrote the buffer
//     copies what it wrote; a device-to-host copy then a host-to-device copy of the same
//     buffer on one stream; events recorded behind a copy;
//   - cudaHostRegister'ed memory, before and after cudaHostUnregister;
//   - a buffer freed while registered, with a copy still queued, and a new one in its
//     place; many buffers at once.
// Prints "rma_copies: PASS". With the argument "loop" it prints "looping" and copies
// both ways until killed (a test kills it in the middle of transfers).
#include <unistd.h>

#include <vector>

#include "e2e_common.h"

namespace {

struct Check {
  const unsigned char* buf;
  size_t n;
  unsigned long long sum;
};

// Host function: sums the buffer as the stream reaches it.
void CUDART_CB SumHost(void* p) {
  auto* c = static_cast<Check*>(p);
  unsigned long long s = 0;
  for (size_t i = 0; i < c->n; ++i) s = s * 131 + c->buf[i];
  c->sum = s;
}
unsigned long long Sum(const unsigned char* b, size_t n) {
  unsigned long long s = 0;
  for (size_t i = 0; i < n; ++i) s = s * 131 + b[i];
  return s;
}

struct FillJob {
  unsigned char* buf;
  size_t n;
  uint32_t seed;
};
void CUDART_CB FillHost(void* p) {
  auto* f = static_cast<FillJob*>(p);
  e2e::Fill(f->buf, f->n, f->seed);
}

void Loop() {
  const size_t n = 24 << 20;
  unsigned char *a = nullptr, *b = nullptr, *d = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&a), n));
  CK(cudaMallocHost(reinterpret_cast<void**>(&b), n));
  CK(cudaMalloc(reinterpret_cast<void**>(&d), n));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  e2e::Fill(a, n, 3);
  printf("looping\n");
  fflush(stdout);
  for (;;) {
    CK(cudaMemcpyAsync(d, a, n, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpy(d, b, n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a, d, n, cudaMemcpyDeviceToHost));
  }
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("rma_copies", 240);
  if (argc > 1 && std::string(argv[1]) == "loop") Loop();
  const size_t n = (3 << 20) * 3 + 123;  // odd, and more than one 8 MiB chunk
  unsigned char *a = nullptr, *b = nullptr, *d = nullptr, *d2 = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&a), n));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&b), n, cudaHostAllocPortable));
  CK(cudaMalloc(reinterpret_cast<void**>(&d), n));
  CK(cudaMalloc(reinterpret_cast<void**>(&d2), n));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<unsigned char> want(n);

  e2e::Step("synchronous copies");
  e2e::Fill(a, n, 1);
  CK(cudaMemcpy(d, a, n, cudaMemcpyHostToDevice));
  memset(a, 0, n);  // done: reusing the buffer must not matter
  CK(cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost));
  e2e::Fill(want.data(), n, 1);
  EXPECT_SAME(b, want.data(), n, "synchronous round trip");

  e2e::Step("pieces at odd offsets");
  // Device bytes [off, off+len) from host bytes [off, off+len) of another pattern.
  e2e::Fill(a, n, 2);
  const size_t pieces[][2] = {{0, 1},     {1, 4095},        {4097, 65536},       {70001, 1 << 20},
                              {n - 1, 1}, {n - 9000, 9000}, {123, (8 << 20) + 5}};
  for (const auto& p : pieces) {
    CK(cudaMemcpy(d + p[0], a + p[0], p[1], cudaMemcpyHostToDevice));
    memcpy(want.data() + p[0], a + p[0], p[1]);
  }
  memset(b, 0xee, n);
  CK(cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(b, want.data(), n, "device after pieces");
  for (const auto& p : pieces) {  // and back into a buffer at other offsets
    memset(b, 0xee, n);
    const size_t at = (p[0] * 7 + 3) % (n - p[1] + 1);
    CK(cudaMemcpy(b + at, d + p[0], p[1], cudaMemcpyDeviceToHost));
    EXPECT_SAME(b + at, want.data() + p[0], p[1], "a piece back");
    EXPECT(at == 0 || b[at - 1] == 0xee, "a copy wrote before its start");
    EXPECT(at + p[1] == n || b[at + p[1]] == 0xee, "a copy wrote past its end");
  }

  e2e::Step("asynchronous copies");
  e2e::Fill(a, n, 3);
  CK(cudaMemcpyAsync(d + 5, a, n - 5, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(b, d + 5, n - 5, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_SAME(b, a, n - 5, "asynchronous round trip");
  // Small device-to-host copies, many of them, then one synchronize.
  unsigned char* small = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&small), 4096));
  for (int i = 0; i < 64; ++i)
    CK(cudaMemcpyAsync(small + i * 7, d + 5 + i * 100, 7, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < 64; ++i) EXPECT_SAME(small + i * 7, a + i * 100, 7, "small async copy");

  e2e::Step("stream order with host functions");
  // A host function behind a device-to-host copy sees the copy's bytes.
  e2e::Fill(a, n, 4);
  CK(cudaMemcpy(d, a, n, cudaMemcpyHostToDevice));
  memset(b, 0, n);
  Check after{b, n, 0};
  CK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
  CK(cudaLaunchHostFunc(s, SumHost, &after));
  CK(cudaStreamSynchronize(s));
  EXPECT(after.sum == Sum(a, n), "a host function behind a copy did not see its bytes");
  // A host-to-device copy behind a host function that writes the buffer copies what it wrote.
  FillJob job{a, n, 5};
  CK(cudaLaunchHostFunc(s, FillHost, &job));
  CK(cudaMemcpyAsync(d2, a, n, cudaMemcpyHostToDevice, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(b, d2, n, cudaMemcpyDeviceToHost));
  e2e::Fill(want.data(), n, 5);
  EXPECT_SAME(b, want.data(), n, "a copy behind a host function that wrote its source");

  e2e::Step("device to host, then host to device, of one buffer");
  e2e::Fill(a, n, 6);
  CK(cudaMemcpy(d, a, n, cudaMemcpyHostToDevice));
  memset(b, 0, n);
  CK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(d2, b, n, cudaMemcpyHostToDevice, s));
  CK(cudaStreamSynchronize(s));
  memset(b, 0, n);
  CK(cudaMemcpy(b, d2, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(b, a, n, "the second copy read the first one's bytes");

  e2e::Step("events");
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  memset(b, 0, n);
  CK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
  CK(cudaEventRecord(ev, s));
  CK(cudaEventSynchronize(ev));
  EXPECT_SAME(b, a, n, "bytes after cudaEventSynchronize");
  memset(b, 0, n);
  CK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
  CK(cudaEventRecord(ev, s));
  cudaError_t q;
  while ((q = cudaEventQuery(ev)) == cudaErrorNotReady) {
  }
  CK(q);
  EXPECT_SAME(b, a, n, "bytes once cudaEventQuery says done");
  CK(cudaEventDestroy(ev));

  e2e::Step("registered memory");
  const size_t rn = (5 << 20) + 77;
  std::vector<unsigned char> reg_store(rn + 4096);
  unsigned char* reg = reg_store.data() + 3;  // not page aligned
  CK(cudaHostRegister(reg, rn, cudaHostRegisterDefault));
  e2e::Fill(reg, rn, 7);
  CK(cudaMemcpy(d, reg, rn, cudaMemcpyHostToDevice));
  memset(reg, 0, rn);
  CK(cudaMemcpyAsync(reg + 11, d + 11, rn - 11, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  e2e::Fill(want.data(), rn, 7);
  EXPECT_SAME(reg + 11, want.data() + 11, rn - 11, "registered memory round trip");
  CK(cudaHostUnregister(reg));
  memset(reg, 0, rn);
  CK(cudaMemcpy(reg, d, rn, cudaMemcpyDeviceToHost));  // plain memory now
  EXPECT_SAME(reg, want.data(), rn, "memory after cudaHostUnregister");

  e2e::Step("freed while registered");
  unsigned char* f = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&f), n));
  e2e::Fill(f, n, 8);
  CK(cudaMemcpy(d, f, n, cudaMemcpyHostToDevice));
  CK(cudaMemcpyAsync(f, d2, n, cudaMemcpyDeviceToHost, s));  // still queued when freed
  CK(cudaFreeHost(f));  // waits for the device's work on it, as natively
  f = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&f), n));  // often the same addresses
  e2e::Fill(f, n, 9);
  CK(cudaMemcpy(d, f, n, cudaMemcpyHostToDevice));
  memset(b, 0, n);
  CK(cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(b, f, n, "a new buffer where a registered one was freed");
  CK(cudaFreeHost(f));

  e2e::Step("many buffers");
  std::vector<unsigned char*> bufs(48);
  for (size_t i = 0; i < bufs.size(); ++i) {
    CK(cudaMallocHost(reinterpret_cast<void**>(&bufs[i]), 70000 + i));
    e2e::Fill(bufs[i], 70000 + i, static_cast<uint32_t>(100 + i));
    CK(cudaMemcpyAsync(d + i * 70100, bufs[i], 70000 + i, cudaMemcpyHostToDevice, s));
  }
  CK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < bufs.size(); ++i) {
    memset(bufs[i], 0, 70000 + i);
    CK(cudaMemcpyAsync(bufs[i], d + i * 70100, 70000 + i, cudaMemcpyDeviceToHost, s));
  }
  CK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < bufs.size(); ++i) {
    e2e::Fill(want.data(), 70000 + i, static_cast<uint32_t>(100 + i));
    EXPECT_SAME(bufs[i], want.data(), 70000 + i, "one of many buffers");
    CK(cudaFreeHost(bufs[i]));
  }

  e2e::Step("errors");
  // A copy to an address that is no device memory fails as natively.
  cudaError_t bad = cudaMemcpy(reinterpret_cast<void*>(0x10), a, 1 << 20, cudaMemcpyHostToDevice);
  EXPECT(bad != cudaSuccess, "a copy to a bogus device address succeeded");
  cudaGetLastError();
  CK(cudaMemcpy(b, d, 16, cudaMemcpyDeviceToHost));  // the context still works

  e2e::Step("free");
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  CK(cudaFree(d2));
  CK(cudaFreeHost(a));
  CK(cudaFreeHost(b));
  CK(cudaFreeHost(small));
  e2e::Pass();
  return 0;
}
