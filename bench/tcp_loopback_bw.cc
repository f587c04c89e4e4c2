// tcp_loopback_bw: what a plain loopback socket moves, as the reference for Flyt's
// bulk copies ("256 MiB copies >= 0.8x of loopback TCP").
//
// Usage: tcp_loopback_bw [--mib M] [--reps R] [--rtt-iters N] [--only tcp|unix|memcpy]
//        tcp_loopback_bw --free-port      (prints a free TCP port on 127.0.0.1, exits)
//
// For each of TCP on 127.0.0.1 and a Unix stream socket: one sender thread pushes an
// M MiB (default 256) buffer with large send() calls, one receiver thread recv()s it
// into another M MiB buffer; default socket options (kernel autotuning), TCP_NODELAY.
// One verified warm-up, then R (default 3) timed transfers; prints best and median.
// Also a 1-byte ping-pong round trip (median) and a one-core memcpy of M MiB.
// Output lines: RESULT <name> <value> <unit>.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "ERROR %s: %s\n", what, std::strerror(errno));
  std::exit(2);
}

void Result(const std::string& name, double value, const char* unit) {
  std::printf("RESULT %s %.6g %s\n", name.c_str(), value, unit);
  std::fflush(stdout);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int ListenLoopback(int* port) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  if (l < 0) Die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) Die("bind");
  if (listen(l, 1) != 0) Die("listen");
  socklen_t len = sizeof a;
  if (getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) Die("getsockname");
  *port = ntohs(a.sin_port);
  return l;
}

// A connected pair of TCP sockets over 127.0.0.1.
void TcpPair(int fds[2]) {
  int port = 0;
  int l = ListenLoopback(&port);
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0) Die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) Die("connect");
  int s = accept(l, nullptr, nullptr);
  if (s < 0) Die("accept");
  close(l);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fds[0] = c;
  fds[1] = s;
}

void UnixPair(int fds[2]) {
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) Die("socketpair");
}

void SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      Die("send");
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t k = recv(fd, p, n, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      Die("recv");
    }
    if (k == 0) {
      errno = EPIPE;
      Die("recv: peer closed");
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// Seconds to move n bytes from fds[0] to fds[1]: the receiver thread is already
// blocked in recv() when the clock starts; the clock stops when it has every byte.
double Transfer(const int fds[2], const char* src, char* dst, size_t n) {
  std::thread rx([&] { RecvAll(fds[1], dst, n); });
  // Let the receiver reach recv() so thread start-up is not timed.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto t0 = Clock::now();
  SendAll(fds[0], src, n);
  rx.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void BenchStream(const char* name, bool tcp, const char* src, char* dst, size_t n, int reps,
                 int rtt_iters) {
  int fds[2];
  if (tcp) {
    TcpPair(fds);
  } else {
    UnixPair(fds);
  }
  std::memset(dst, 0, n);
  Transfer(fds, src, dst, n);
  bool ok = std::memcmp(src, dst, n) == 0;
  if (!ok) std::fprintf(stderr, "WARN %s transfer corrupted data\n", name);
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r)
    gbps.push_back(static_cast<double>(n) / Transfer(fds, src, dst, n) / 1e9);
  Result(std::string(name) + "_gbps", *std::max_element(gbps.begin(), gbps.end()), "GB/s");
  Result(std::string(name) + "_median_gbps", Median(gbps), "GB/s");

  // 1-byte ping-pong: an echo thread on fds[1].
  std::thread echo([&] {
    char c;
    for (int i = 0; i < rtt_iters; ++i) {
      RecvAll(fds[1], &c, 1);
      SendAll(fds[1], &c, 1);
    }
  });
  std::vector<double> rtt;
  rtt.reserve(rtt_iters);
  for (int i = 0; i < rtt_iters; ++i) {
    char c = static_cast<char>(i);
    auto a = Clock::now();
    SendAll(fds[0], &c, 1);
    RecvAll(fds[0], &c, 1);
    rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
  echo.join();
  Result(std::string(name) + "_rtt_us", Median(rtt), "us");
  close(fds[0]);
  close(fds[1]);
}

void BenchMemcpy(const char* src, char* dst, size_t n, int reps) {
  std::memcpy(dst, src, n);
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    std::memcpy(dst, src, n);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    gbps.push_back(static_cast<double>(n) / s / 1e9);
  }
  Result("memcpy_gbps", *std::max_element(gbps.begin(), gbps.end()), "GB/s");
}

int Usage() {
  std::fprintf(stderr,
               "usage: tcp_loopback_bw [--mib M] [--reps R] [--rtt-iters N] "
               "[--only tcp|unix|memcpy]\n"
               "       tcp_loopback_bw --free-port\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 256;
  int reps = 3;
  int rtt_iters = 20000;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--free-port") {
      int port = 0;
      int l = ListenLoopback(&port);
      close(l);
      std::printf("%d\n", port);
      return 0;
    } else if (a == "--mib" && has_value) {
      mib = static_cast<size_t>(std::atol(argv[++i]));
    } else if (a == "--reps" && has_value) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--rtt-iters" && has_value) {
      rtt_iters = std::atoi(argv[++i]);
    } else if (a == "--only" && has_value) {
      only = argv[++i];
    } else {
      return Usage();
    }
  }
  if (mib == 0 || reps < 1 || rtt_iters < 1) return Usage();
  const size_t n = mib << 20;
  std::vector<char> src(n), dst(n);  // zero-filled: every page is touched
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&src[i], &x, 8);
  }
  std::printf("INFO bytes %zu reps %d cores %u\n", n, reps, std::thread::hardware_concurrency());
  if (only.empty() || only == "tcp")
    BenchStream("tcp_loopback", true, src.data(), dst.data(), n, reps, rtt_iters);
  if (only.empty() || only == "unix")
    BenchStream("unix_socket", false, src.data(), dst.data(), n, reps, rtt_iters);
  if (only.empty() || only == "memcpy") BenchMemcpy(src.data(), dst.data(), n, reps);
  return 0;
}
