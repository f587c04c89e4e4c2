// See parallel_copy.h.
#include "client/parallel_copy.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FLYT_CPU_RELAX() _mm_pause()
#else
#define FLYT_CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

namespace flyt::client {
namespace {

constexpr size_t kPiece = 256 << 10;                          // what one thread claims at a time
constexpr size_t kMinParallel = 1 << 20;                      // smaller copies: the caller alone
constexpr unsigned kMaxThreads = 8;                           // the caller and at most 7 helpers
constexpr auto kHelperSpin = std::chrono::microseconds(100);  // then sleep on the futex
constexpr uint32_t kClosed = UINT32_MAX;                      // piece index of a copy being set up

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op | FUTEX_PRIVATE_FLAG, value,
                 nullptr, nullptr, 0);
}

// One copy at a time: the caller publishes it under a new generation, then every
// thread claims pieces of it with a compare-and-swap on `claim` = generation << 32 |
// next piece. A claim succeeds only while the copy is the current one, and the
// description fields change only after every piece is done and `claim` was closed,
// so a thread that read them and then claimed a piece read the right ones.
struct Crew {
  pid_t pid = 0;
  unsigned helpers = 0;
  std::mutex busy;
  std::atomic<uint32_t> gen{0};  // futex word of sleeping helpers
  std::atomic<uint32_t> sleepers{0};
  std::atomic<uint64_t> claim{0};
  std::atomic<uint8_t*> dst{nullptr};
  std::atomic<const uint8_t*> src{nullptr};
  std::atomic<size_t> n{0};
  std::atomic<size_t> done{0};

  void Work(uint32_t g) {
    for (;;) {
      uint64_t c = claim.load();
      if (static_cast<uint32_t>(c >> 32) != g) return;
      const auto i = static_cast<uint32_t>(c);
      const size_t total = n.load(std::memory_order_relaxed);
      uint8_t* d = dst.load(std::memory_order_relaxed);
      const uint8_t* s = src.load(std::memory_order_relaxed);
      if (i == kClosed || static_cast<size_t>(i) * kPiece >= total) return;
      if (!claim.compare_exchange_weak(c, c + 1)) continue;
      const size_t off = static_cast<size_t>(i) * kPiece;
      const size_t len = std::min(kPiece, total - off);
      std::memcpy(d + off, s + off, len);
      done.fetch_add(len, std::memory_order_release);
    }
  }

  void Serve() {
    uint32_t seen = 0;
    for (;;) {
      auto until = std::chrono::steady_clock::now() + kHelperSpin;
      int spins = 0;
      while (gen.load(std::memory_order_acquire) == seen) {
        FLYT_CPU_RELAX();
        if (++spins % 256 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      if (gen.load() == seen) {
        sleepers.fetch_add(1);
        while (gen.load() == seen) Futex(&gen, FUTEX_WAIT, seen);
        sleepers.fetch_sub(1);
      }
      seen = gen.load();
      Work(seen);
    }
  }

  void Copy(uint8_t* d, const uint8_t* s, size_t len) {
    uint32_t g = gen.load(std::memory_order_relaxed) + 1;
    if (g == 0) g = 1;  // helpers start having seen 0
    claim.store(uint64_t{g} << 32 | kClosed);
    dst.store(d, std::memory_order_relaxed);
    src.store(s, std::memory_order_relaxed);
    n.store(len, std::memory_order_relaxed);
    done.store(0, std::memory_order_relaxed);
    claim.store(uint64_t{g} << 32);
    gen.store(g);
    if (sleepers.load() > 0) Futex(&gen, FUTEX_WAKE, INT32_MAX);
    Work(g);
    // Only pieces a helper claimed are left: each is being copied now.
    int spins = 0;
    while (done.load(std::memory_order_acquire) != len) {
      FLYT_CPU_RELAX();
      if (++spins > 4096) sched_yield();
    }
  }
};

void* ServeCrew(void* crew) {
  static_cast<Crew*>(crew)->Serve();
  return nullptr;
}

std::mutex g_make_mu;
std::atomic<Crew*> g_crew{nullptr};

// The crew of this process (made at first use with threads - 1 helpers), or nullptr.
Crew* GetCrew(unsigned threads) {
  // A child after fork() has none of the parent's helpers (and the parent's locks
  // may be held by threads that are not here): it copies alone.
  Crew* crew = g_crew.load(std::memory_order_acquire);
  if (crew != nullptr) return crew->pid == getpid() ? crew : nullptr;
  std::lock_guard<std::mutex> lock(g_make_mu);
  crew = g_crew.load(std::memory_order_acquire);
  if (crew != nullptr) return crew->pid == getpid() ? crew : nullptr;
  crew = new Crew();  // never destroyed: its helpers live as long as the process
  crew->pid = getpid();
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  for (unsigned i = 0; i + 1 < threads; ++i) {
    pthread_t t;
    if (pthread_create(&t, nullptr, ServeCrew, crew) != 0) break;
    pthread_detach(t);
    ++crew->helpers;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  g_crew.store(crew, std::memory_order_release);
  return crew;
}

}  // namespace

void ParallelCopy(void* dst, const void* src, size_t n, unsigned threads) {
  threads = std::min(threads, kMaxThreads);
  if (threads <= 1 || n < kMinParallel) {
    std::memcpy(dst, src, n);
    return;
  }
  Crew* crew = GetCrew(threads);
  std::unique_lock<std::mutex> lock;
  if (crew != nullptr) lock = std::unique_lock<std::mutex>(crew->busy, std::try_to_lock);
  if (crew == nullptr || crew->helpers == 0 || !lock.owns_lock()) {
    std::memcpy(dst, src, n);
    return;
  }
  crew->Copy(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
}

}  // namespace flyt::client
