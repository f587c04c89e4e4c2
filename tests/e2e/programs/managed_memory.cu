// managed_memory: unified memory as solvers, tutorials and CuPy's managed allocator use
// it, without kernels (the sim runs none; device writes are memsets and copies):
//   - a fresh allocation reads as zero; host writes reach the device before the next
//     device work (a device-to-device copy reads them), in a big buffer too (64 MiB,
//     written and read sequentially);
//   - device writes (memset, copies into managed memory) are seen by the host after the
//     synchronisation CUDA makes them visible at, and a host write to other bytes of the
//     same page in between does not undo them (no false sharing);
//   - synchronous copies with managed memory on either side, cudaMemcpyDefault;
//   - prefetch to the device and back to the host, advice, range attributes, stream
//     attachment, pointer attributes, the refusals of non-managed memory;
//   - several threads writing neighbouring slices (shared pages) while another thread
//     synchronises, and reading while the device is written;
//   - the application's own SIGSEGV handler still gets its own faults, installed before
//     or after Flyt's; a fork()ed child whose CUDA calls fail leaves the parent's memory
//     intact (host changes pending at the fork still reach the device afterwards).
// With the argument `quota` (a server with --memory-quota 64M) instead: managed memory
// counts against the quota in full at allocation, and a free gives it back.
// Prints key=value lines and "managed_memory: PASS".
#include <pthread.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <thread>
#include <vector>

#include "e2e_common.h"

namespace {

sigjmp_buf g_jump;
std::atomic<int> g_app_faults{0};
void AppHandler(int, siginfo_t*, void*) {
  g_app_faults.fetch_add(1);
  siglongjmp(g_jump, 1);
}
void InstallAppHandler() {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = AppHandler;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
}
// Touches a PROT_NONE page of the program's own: the app's handler must get it.
bool AppFaultCaught() {
  static char* page =
      static_cast<char*>(mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  int before = g_app_faults.load();
  if (sigsetjmp(g_jump, 1) == 0) {
    *reinterpret_cast<volatile char*>(page) = 1;
    return false;
  }
  return g_app_faults.load() == before + 1;
}

void Pattern(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed) & 0xff);
}

}  // namespace

int Quota() {
  size_t free0 = 0, total = 0, free1 = 0;
  CK(cudaMemGetInfo(&free0, &total));
  void *a = nullptr, *b = nullptr;
  CK(cudaMallocManaged(&a, 40 << 20));
  CK(cudaMemGetInfo(&free1, &total));
  printf("quota.charged_mib=%zu\n", (free0 - free1) >> 20);
  printf("quota.second=%s\n", cudaGetErrorName(cudaMallocManaged(&b, 40 << 20)));
  cudaGetLastError();
  CK(cudaFree(a));
  CK(cudaMallocManaged(&b, 40 << 20));
  printf("quota.after_free=ok\n");
  CK(cudaFree(b));
  e2e::Pass();
  return 0;
}

int main(int argc, char** argv) {
  e2e::Init("managed_memory", 120);
  CK(cudaSetDevice(0));
  if (argc > 1 && strcmp(argv[1], "quota") == 0) return Quota();
  int managed = 0, concurrent = 0;
  CK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0));
  CK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
  printf("attr.managed=%d\n", managed);

  e2e::Step("an application SIGSEGV handler installed before managed memory exists");
  InstallAppHandler();
  printf("app_handler.before=%d\n", AppFaultCaught() ? 1 : 0);

  e2e::Step("fresh memory is zero; host writes reach the device");
  const size_t n = 4 << 20;
  unsigned char* m = nullptr;
  CK(cudaMallocManaged(&m, n));
  printf("fresh.first_nonzero=%lld\n", e2e::FirstNot(m, 0, n));
  std::vector<unsigned char> want(n), got(n);
  Pattern(want.data(), n, 7);
  memcpy(m, want.data(), n);
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, n));
  CK(cudaMemcpy(d, m, n, cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(got.data(), d, n, cudaMemcpyDeviceToHost));
  printf("host_to_device.diff=%lld\n", e2e::FirstDiff(got.data(), want.data(), n));

  e2e::Step("device writes are seen after synchronisation; other bytes of the page survive");
  m[10] = 0x11;                                // host: dirty, flushed by the memset below
  CK(cudaMemset(m + 4096 + 100, 0x5a, 200));   // device: bytes 4196..4395
  CK(cudaMemsetAsync(m + 8192, 0x77, 64, 0));  // device, the same 64 KiB granule
  m[4096 + 50] = 0x22;  // host, same page as the memset, while it may still run
  CK(cudaDeviceSynchronize());
  Pattern(want.data(), n, 7);
  want[10] = 0x11;
  memset(want.data() + 4096 + 100, 0x5a, 200);
  memset(want.data() + 8192, 0x77, 64);
  want[4096 + 50] = 0x22;
  printf("device_write.diff=%lld\n", e2e::FirstDiff(m, want.data(), n));
  CK(cudaMemcpy(got.data(), m, n, cudaMemcpyDeviceToHost));  // the device's side agrees
  printf("device_side.diff=%lld\n", e2e::FirstDiff(got.data(), want.data(), n));

  e2e::Step("synchronous copies into and out of managed memory");
  int v = 55;
  CK(cudaMemcpy(m + 16, &v, sizeof(v), cudaMemcpyHostToDevice));
  int seen = 0;
  memcpy(&seen, m + 16, sizeof(seen));
  printf("copy_h2d.host_sees=%d\n", seen);
  int back = 0;
  CK(cudaMemcpy(&back, m + 16, sizeof(back), cudaMemcpyDefault));
  printf("copy_default.out=%d\n", back);
  CK(cudaMemset(d, 0x3c, 256));
  CK(cudaMemcpy(m + 1000, d, 256, cudaMemcpyDeviceToHost));  // "host" destination is managed
  printf("copy_d2h_into_managed.first_not=%lld\n", e2e::FirstNot(m + 1000, 0x3c, 256));
  memset(m + 2000, 0x42, 128);
  CK(cudaMemcpy(d, m + 2000, 128, cudaMemcpyHostToDevice));  // "host" source is managed
  unsigned char row[128];
  CK(cudaMemcpy(row, d, 128, cudaMemcpyDeviceToHost));
  printf("copy_h2d_from_managed.first_not=%lld\n", e2e::FirstNot(row, 0x42, 128));
  unsigned char* m2 = nullptr;
  CK(cudaMallocManaged(&m2, 1 << 20));
  CK(cudaMemcpy(m2, m, 1 << 20, cudaMemcpyDefault));  // managed to managed
  printf("copy_managed_to_managed.diff=%lld\n", e2e::FirstDiff(m2, m, 1 << 20));
  CK(cudaMemcpyAsync(m2, d + 128, 64, cudaMemcpyDefault, 0));  // d[128..256) is 0x3c
  CK(cudaStreamSynchronize(0));
  printf("copy_async_into_managed.first_not=%lld\n", e2e::FirstNot(m2, 0x3c, 64));

  e2e::Step("prefetch, advice, range attributes, stream attachment");
  cudaMemLocation dev_loc{cudaMemLocationTypeDevice, 0};
  cudaMemLocation host_loc{cudaMemLocationTypeHost, 0};
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMemAdvise(m, n, cudaMemAdviseSetReadMostly, dev_loc));
  CK(cudaMemAdvise(m, n, cudaMemAdviseSetPreferredLocation, dev_loc));
  CK(cudaMemPrefetchAsync(m, n, dev_loc, 0, s));
  CK(cudaMemsetAsync(m + n - 4096, 0x66, 4096, s));
  CK(cudaMemPrefetchAsync(m, n, host_loc, 0, s));
  CK(cudaStreamSynchronize(s));
  memset(want.data() + n - 4096, 0x66, 4096);
  want[16] = 55, want[17] = want[18] = want[19] = 0;
  memset(want.data() + 1000, 0x3c, 256);
  memset(want.data() + 2000, 0x42, 128);
  printf("prefetch.diff=%lld\n", e2e::FirstDiff(m, want.data(), n));
  int attr = -7;
  CK(cudaMemRangeGetAttribute(&attr, sizeof(attr), cudaMemRangeAttributeReadMostly, m, n));
  printf("range.read_mostly=%d\n", attr);
  CK(cudaMemRangeGetAttribute(&attr, sizeof(attr), cudaMemRangeAttributePreferredLocation, m, n));
  printf("range.preferred=%d\n", attr);
  CK(cudaMemRangeGetAttribute(&attr, sizeof(attr), cudaMemRangeAttributeLastPrefetchLocation, m,
                              n));
  printf("range.last_prefetch=%d\n", attr);
  CK(cudaStreamAttachMemAsync(s, m2, 0, cudaMemAttachSingle));
  CK(cudaStreamSynchronize(s));
  printf("attach.interior=%s\n",
         cudaGetErrorName(cudaStreamAttachMemAsync(s, m2 + 64, 0, cudaMemAttachSingle)));
  cudaGetLastError();
  cudaPointerAttributes pa;
  CK(cudaPointerGetAttributes(&pa, m + 100));
  printf("pointer.type_managed=%d\npointer.host_is_device=%d\n",
         pa.type == cudaMemoryTypeManaged ? 1 : 0, pa.hostPointer == pa.devicePointer ? 1 : 0);
  printf("refuse.prefetch_device_memory=%s\n",
         cudaGetErrorName(cudaMemPrefetchAsync(d, 4096, dev_loc, 0, s)));
  cudaGetLastError();
  printf("refuse.advise_device_memory=%s\n",
         cudaGetErrorName(cudaMemAdvise(d, 4096, cudaMemAdviseSetReadMostly, dev_loc)));
  cudaGetLastError();
  unsigned char* bad = nullptr;
  printf("refuse.alloc_flags0=%s\n", cudaGetErrorName(cudaMallocManaged(&bad, 4096, 0)));
  cudaGetLastError();

  e2e::Step("64 MiB written and read sequentially");
  const size_t big_n = 64 << 20;
  unsigned char* big = nullptr;
  CK(cudaMallocManaged(&big, big_n));
  for (size_t i = 0; i < big_n; i += 4096) big[i] = static_cast<unsigned char>(i >> 12);
  unsigned char* dbig = nullptr;
  CK(cudaMalloc(&dbig, big_n));
  CK(cudaMemcpy(dbig, big, big_n, cudaMemcpyDefault));
  CK(cudaMemset(big, 0, big_n));
  CK(cudaMemcpy(big, dbig, big_n, cudaMemcpyDefault));
  CK(cudaDeviceSynchronize());
  long long big_bad = 0;
  for (size_t i = 0; i < big_n; i += 4096) big_bad += big[i] != static_cast<unsigned char>(i >> 12);
  for (size_t i = 1; i < big_n; i += 4093) big_bad += (i % 4096 != 0) && big[i] != 0;
  printf("big.mismatches=%lld\n", big_bad);

  e2e::Step("threads write neighbouring slices while another synchronises");
  const int kThreads = 4;
  const size_t slice = 3000;  // not page-aligned: the threads share pages
  std::atomic<bool> stop{false};
  std::thread syncer([&] {
    while (!stop.load()) cudaDeviceSynchronize();
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (size_t i = 0; i < slice; ++i)
          m2[t * slice + i] = static_cast<unsigned char>(t * 40 + round);
    });
  }
  for (auto& w : writers) w.join();
  stop.store(true);
  syncer.join();
  long long thread_bad = 0;
  for (int t = 0; t < kThreads; ++t)
    thread_bad +=
        e2e::FirstNot(m2 + t * slice, static_cast<unsigned char>(t * 40 + 19), slice) >= 0;
  std::vector<unsigned char> dev_view(kThreads * slice);
  CK(cudaMemcpy(dev_view.data(), m2, dev_view.size(), cudaMemcpyDeviceToHost));
  thread_bad += e2e::FirstDiff(dev_view.data(), m2, dev_view.size()) >= 0;
  printf("threads.bad_slices=%lld\n", thread_bad);

  e2e::Step("an application handler installed after Flyt's");
  InstallAppHandler();
  printf("app_handler.after=%d\n", AppFaultCaught() ? 1 : 0);
  CK(cudaDeviceSynchronize());
  CK(cudaMemset(m, 0x99, 64));
  CK(cudaDeviceSynchronize());
  printf("after_app_handler.first_not=%lld\n", e2e::FirstNot(m, 0x99, 64));
  printf("app_handler.chained=%d\n", AppFaultCaught() ? 1 : 0);

  e2e::Step("fork: the child exits, the parent's managed memory is intact");
  m[64] = 0x31;
  pid_t child = fork();
  if (child == 0) {
    // CUDA is unusable in a child forked after initialisation (an error, not a
    // hang); it must not disturb the parent's managed memory either.
    void* x = nullptr;
    _exit(cudaMalloc(&x, 16) == cudaSuccess || cudaMemset(m, 1, 16) == cudaSuccess ? 1 : 0);
  }
  int status = -1;
  waitpid(child, &status, 0);
  CK(cudaMemset(m + 65, 0x32, 1));
  CK(cudaDeviceSynchronize());
  printf("fork.child_status=%d\nfork.parent_sees=%02x%02x\n", status, m[64], m[65]);

  e2e::Step("free");
  CK(cudaFree(m));
  CK(cudaFree(m2));
  CK(cudaFree(big));
  CK(cudaFree(d));
  CK(cudaFree(dbig));
  CK(cudaStreamDestroy(s));
  e2e::Pass();
  return 0;
}
