// Helpers shared by the e2e test programs (tests/e2e/programs/*.cu).
//
// Every program is self-checking: it exits 0 after printing "<name>: PASS" as its last
// stdout line, and exits 1 after printing "<name>: FAIL ..." to stdout and stderr when a
// check fails. A watchdog (SIGALRM, default 90 s, env E2E_WATCHDOG_S) turns a hang into
// exit code 3 and names the step that hung. The programs must stay valid under
// `flyt-server --backend sim`, where no kernel runs: never check what a kernel computed.
#pragma once

#include <cuda_runtime.h>
#include <signal.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace e2e {

inline const char* g_prog = "e2e";
inline const char* volatile g_step = "start";

inline void WriteAll(int fd, const char* s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

inline void OnAlarm(int) {
  WriteAll(2, g_prog);
  WriteAll(2, ": FAIL watchdog expired during step: ");
  WriteAll(2, g_step);
  WriteAll(2, "\n");
  WriteAll(1, g_prog);
  WriteAll(1, ": FAIL watchdog expired during step: ");
  WriteAll(1, g_step);
  WriteAll(1, "\n");
  _exit(3);
}

// Names the program, makes stdout line-buffered and arms the watchdog.
inline void Init(const char* prog, unsigned default_seconds = 90) {
  g_prog = prog;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  unsigned seconds = default_seconds;
  if (const char* env = getenv("E2E_WATCHDOG_S")) seconds = static_cast<unsigned>(atoi(env));
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnAlarm;
  sigaction(SIGALRM, &sa, nullptr);
  if (seconds > 0) alarm(seconds);
}

// Records what the program is doing, for the watchdog and failure messages.
inline void Step(const char* step) { g_step = step; }

[[noreturn]] inline void Fail(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
[[noreturn]] inline void Fail(const char* file, int line, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  const char* step = g_step;
  fprintf(stdout, "%s: FAIL at %s:%d (step %s): %s\n", g_prog, file, line, step, msg);
  fprintf(stderr, "%s: FAIL at %s:%d (step %s): %s\n", g_prog, file, line, step, msg);
  fflush(stdout);
  fflush(stderr);
  exit(1);
}

inline void Pass() {
  printf("%s: PASS\n", g_prog);
  fflush(stdout);
}

// Deterministic pseudo-random bytes; different seeds give different contents.
inline void Fill(void* dst, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 0x9e3779b9u;
  if (x == 0) x = 1;
  unsigned char* p = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = static_cast<unsigned char>(x >> 24);
  }
}

// Returns the index of the first differing byte, or -1 when equal.
inline long long FirstDiff(const void* a, const void* b, size_t n) {
  if (memcmp(a, b, n) == 0) return -1;
  const unsigned char* pa = static_cast<const unsigned char*>(a);
  const unsigned char* pb = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < n; ++i)
    if (pa[i] != pb[i]) return static_cast<long long>(i);
  return -1;
}

// Returns the index of the first byte that is not `value`, or -1.
inline long long FirstNot(const void* a, unsigned char value, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(a);
  for (size_t i = 0; i < n; ++i)
    if (p[i] != value) return static_cast<long long>(i);
  return -1;
}

// Lowercase hex of `n` bytes as they lie in memory.
inline std::string Hex(const void* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[b[i] >> 4]);
    out.push_back(kDigits[b[i] & 15]);
  }
  return out;
}

}  // namespace e2e

// Checks a CUDA runtime call; on error fails with the call text, code and name.
#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t ck_err_ = (call);                                                                  \
    if (ck_err_ != cudaSuccess)                                                                    \
      ::e2e::Fail(__FILE__, __LINE__, "%s returned %d (%s: %s)", #call, static_cast<int>(ck_err_), \
                  cudaGetErrorName(ck_err_), cudaGetErrorString(ck_err_));                         \
  } while (0)

// Checks a condition; on failure prints the condition and a printf-style message.
#define EXPECT(cond, ...)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      char expect_msg_[1024];                                                 \
      snprintf(expect_msg_, sizeof(expect_msg_), __VA_ARGS__);                \
      ::e2e::Fail(__FILE__, __LINE__, "expected %s: %s", #cond, expect_msg_); \
    }                                                                         \
  } while (0)

// An expected runtime error, then the runtime's last error cleared as the samples do.
#define EXPECT_ERR(call, want)                                                           \
  do {                                                                                   \
    cudaError_t got_ = (call);                                                           \
    EXPECT(got_ == (want), "%s returned %s, expected %s", #call, cudaGetErrorName(got_), \
           cudaGetErrorName(want));                                                      \
    cudaGetLastError();                                                                  \
  } while (0)

// Checks that two host buffers are byte-identical.
#define EXPECT_SAME(a, b, n, what)                                                           \
  do {                                                                                       \
    long long same_at_ = ::e2e::FirstDiff((a), (b), (n));                                    \
    if (same_at_ >= 0)                                                                       \
      ::e2e::Fail(__FILE__, __LINE__,                                                        \
                  "%s: %zu bytes differ first at offset %lld "                               \
                  "(got 0x%02x, want 0x%02x)",                                               \
                  (what), static_cast<size_t>(n), same_at_,                                  \
                  static_cast<const unsigned char*>(static_cast<const void*>(a))[same_at_],  \
                  static_cast<const unsigned char*>(static_cast<const void*>(b))[same_at_]); \
  } while (0)
