// staged_copies: device-to-host copies into pageable memory, the ones that over shm://
// go through the staging area shared with the server (client/staged_copy.cc,
// server/session_staged_copy.cc). Over other transports the same checks run on the
// byte path. The chunk size is FLYT_SHM_STAGED_CHUNK_KIB (default 4096) and the
// sizes below are chosen around it. Byte-exact, with guard bytes around every copy:
//   - sizes 1, 4, 4095, one chunk - 1, one chunk, one chunk + 1, several chunks + odd,
//     more chunks than slots, at unaligned source and destination addresses, into a
//     buffer that straddles pages;
//   - cudaMemcpyAsync into pageable memory returns with the bytes there (synchronous
//     for the host, as natively), in order behind a memset on the same stream;
//   - several threads copying at once, each on its own stream;
//   - errors: a bogus device address, and a copy that runs past its allocation
//     (fails in a later chunk over shm://); the context works afterwards.
// Prints "staged_copies: PASS". With the argument "loop" it prints "looping" and copies
// device to host until killed (a test kills it in the middle of a copy).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "e2e_common.h"

namespace {

size_t Chunk() {
  const char* v = getenv("FLYT_SHM_STAGED_CHUNK_KIB");
  return (v != nullptr && atoi(v) > 0 ? static_cast<size_t>(atoi(v)) : 4096) << 10;
}

// Copies device [src_off, +n) into a fresh pageable buffer at offset `at`, with guard
// bytes on both sides, and checks it against `want`.
void CheckCopy(const unsigned char* d, const unsigned char* want, size_t src_off, size_t n,
               size_t at, const char* what) {
  std::vector<unsigned char> host(at + n + 64, 0xee);
  CK(cudaMemcpy(host.data() + at, d + src_off, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(host.data() + at, want + src_off, n, what);
  EXPECT(e2e::FirstNot(host.data(), 0xee, at) < 0, "%s: wrote before its start", what);
  EXPECT(e2e::FirstNot(host.data() + at + n, 0xee, 64) < 0, "%s: wrote past its end", what);
}

void Loop() {
  const size_t n = 64 << 20;
  unsigned char* d = nullptr;
  CK(cudaMalloc(reinterpret_cast<void**>(&d), n));
  CK(cudaMemset(d, 7, n));
  std::vector<unsigned char> h(n);
  printf("looping\n");
  fflush(stdout);
  for (;;) CK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("staged_copies", 240);
  if (argc > 1 && std::string(argv[1]) == "loop") Loop();
  const size_t chunk = Chunk();
  const size_t n = chunk * 9 + 4097;  // more chunks than slots, and an odd tail
  unsigned char* d = nullptr;
  CK(cudaMalloc(reinterpret_cast<void**>(&d), n));
  std::vector<unsigned char> want(n);
  e2e::Fill(want.data(), n, 1);
  CK(cudaMemcpy(d, want.data(), n, cudaMemcpyHostToDevice));

  e2e::Step("sizes and offsets");
  const size_t sizes[] = {1,         4,         4095,          chunk - 1, chunk,
                          chunk + 1, 2 * chunk, 3 * chunk + 5, n - 3,     n};
  const size_t offsets[][2] = {{0, 0}, {3, 1}, {1, 4093}, {4096, 7}};
  for (size_t size : sizes) {
    for (const auto& o : offsets) {
      if (o[0] + size > n) continue;
      char what[96];
      snprintf(what, sizeof(what), "%zu bytes from +%zu to +%zu", size, o[0], o[1]);
      CheckCopy(d, want.data(), o[0], size, o[1], what);
    }
  }

  e2e::Step("a buffer that straddles pages");
  {
    const long page = sysconf(_SC_PAGESIZE);
    const size_t span = 3 * chunk + 3 * static_cast<size_t>(page);
    auto* m = static_cast<unsigned char*>(
        mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT(m != MAP_FAILED, "mmap failed");
    // Untouched pages (first touched by the copy itself), from 100 bytes before a page end.
    const size_t len = 2 * chunk + 333;
    unsigned char* dst = m + page - 100;
    CK(cudaMemcpy(dst, d + 17, len, cudaMemcpyDeviceToHost));
    EXPECT_SAME(dst, want.data() + 17, len, "into fresh pages");
    EXPECT(e2e::FirstNot(m, 0, page - 100) < 0, "wrote before a fresh buffer");
    munmap(m, span);
  }

  e2e::Step("asynchronous copies into pageable memory");
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    std::vector<unsigned char> h(n + 1, 0);
    // Synchronous for the host: the bytes are there when the call returns.
    CK(cudaMemcpyAsync(h.data() + 1, d, n, cudaMemcpyDeviceToHost, s));
    EXPECT_SAME(h.data() + 1, want.data(), n, "cudaMemcpyAsync returned before its bytes");
    // In stream order: behind a memset queued on the same stream.
    unsigned char* d2 = nullptr;
    CK(cudaMalloc(reinterpret_cast<void**>(&d2), n));
    CK(cudaMemcpy(d2, want.data(), n, cudaMemcpyHostToDevice));
    CK(cudaMemsetAsync(d2 + chunk / 2, 0x5a, 2 * chunk, s));
    CK(cudaMemcpyAsync(h.data(), d2, n, cudaMemcpyDeviceToHost, s));
    std::vector<unsigned char> w2(want);
    memset(w2.data() + chunk / 2, 0x5a, 2 * chunk);
    EXPECT_SAME(h.data(), w2.data(), n, "a copy behind a memset on its stream");
    // On the legacy default stream, behind a memset on it.
    CK(cudaMemsetAsync(d2, 0x33, 5, 0));
    CK(cudaMemcpyAsync(h.data(), d2, chunk + 9, cudaMemcpyDeviceToHost, 0));
    memset(w2.data(), 0x33, 5);
    EXPECT_SAME(h.data(), w2.data(), chunk + 9, "a copy on the default stream");
    CK(cudaFree(d2));
  }

  e2e::Step("several threads at once");
  {
    const int kThreads = 4;
    std::vector<std::thread> threads;
    std::vector<int> bad(kThreads, 0);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        cudaStream_t ts;
        if (cudaStreamCreateWithFlags(&ts, cudaStreamNonBlocking) != cudaSuccess) {
          bad[t] = 1;
          return;
        }
        std::vector<unsigned char> h(n);
        for (int i = 0; i < 6; ++i) {
          const size_t off = static_cast<size_t>(t * 977 + i * 31);
          const size_t len = n - off - static_cast<size_t>(t);
          memset(h.data(), 0, len);
          cudaError_t e = (i % 2)
                              ? cudaMemcpyAsync(h.data(), d + off, len, cudaMemcpyDeviceToHost, ts)
                              : cudaMemcpy(h.data(), d + off, len, cudaMemcpyDeviceToHost);
          if (e != cudaSuccess || memcmp(h.data(), want.data() + off, len) != 0) bad[t] = 2;
        }
        cudaStreamDestroy(ts);
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT(bad[t] == 0, "thread %d: %d", t, bad[t]);
  }

  e2e::Step("errors");
  {
    std::vector<unsigned char> h(3 * chunk + 10);
    cudaError_t e =
        cudaMemcpy(h.data(), reinterpret_cast<void*>(0x10), 3 * chunk, cudaMemcpyDeviceToHost);
    EXPECT(e != cudaSuccess, "a copy from a bogus device address succeeded");
    cudaGetLastError();
    e = cudaMemcpy(h.data(), reinterpret_cast<void*>(0x10), 4, cudaMemcpyDeviceToHost);
    EXPECT(e != cudaSuccess, "a small copy from a bogus device address succeeded");
    cudaGetLastError();
    // Runs past the end of its allocation: over shm:// its first chunk is fine.
    e = cudaMemcpy(h.data(), d + n - chunk - 10, 3 * chunk, cudaMemcpyDeviceToHost);
    EXPECT(e != cudaSuccess, "a copy past the end of an allocation succeeded");
    cudaGetLastError();
    e = cudaMemcpyAsync(h.data(), d + n - chunk - 7, 3 * chunk, cudaMemcpyDeviceToHost, s);
    EXPECT(e != cudaSuccess, "an asynchronous copy past the end of an allocation succeeded");
    cudaGetLastError();
    CheckCopy(d, want.data(), 0, n, 5, "a copy after the errors");
  }

  e2e::Step("free");
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  e2e::Pass();
  return 0;
}
