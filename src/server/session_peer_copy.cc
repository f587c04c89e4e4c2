// Copies between the GPUs of two servers of one client process, server to
// server (docs/architecture.md §8.4): the target's session opens a one-time TCP
// listener (kOpPeerListen) and reads the bytes into its device memory
// (kOpPeerReceive); the source's session writes its device memory there
// (kOpPeerSend), after the earlier work of the copy's stream. The client never
// carries the bytes; it only tells each side its part.
//
// Owns: the session's one-time listeners and the results of its receives,
// their keys (128 random bits each, checked before any byte is taken), and
// closing them all when the session ends. Must not touch: other sessions,
// memory the driver does not give this session, the session's other handles.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;

namespace {

constexpr size_t kPeerChunk = 8 << 20;

int PeerTimeoutMs() {
  const char* v = std::getenv("FLYT_TIMEOUT_MS");
  long n = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
  return n > 0 && n < (1 << 30) ? static_cast<int>(n) : 30000;
}

// Waits until fd is readable (POLLIN) or writable (POLLOUT); false on timeout.
bool WaitFd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = poll(&p, 1, timeout_ms);
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

bool ReadAll(int fd, void* buf, size_t n, int timeout_ms) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    if (!WaitFd(fd, POLLIN, timeout_ms)) return false;
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteAll(int fd, const void* buf, size_t n, int timeout_ms) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    if (!WaitFd(fd, POLLOUT, timeout_ms)) return false;
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int DialPeer(const std::string& host, uint16_t port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    int err = 0;
    socklen_t len = sizeof(err);
    if (r != 0 && (errno != EINPROGRESS || !WaitFd(fd, POLLOUT, timeout_ms) ||
                   getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace

bool Session::PeerListen(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint64_t bytes = 0;
  if (!in.Get(&bytes) || in.remaining() != 0) return false;
  if (placed_slot_ < 0) {  // only a client of several servers (kOpPlaceMemory first)
    *rc = CUDA_ERROR_NOT_PERMITTED;
    return true;
  }
  // Listeners no client took, and results no client asked for: a few are
  // kept, the oldest go first.
  while (peer_results_.size() >= 64) peer_results_.erase(peer_results_.begin());
  while (peer_listeners_.size() >= 16) {
    close(peer_listeners_.begin()->second.fd);
    peer_listeners_.erase(peer_listeners_.begin());
  }
  PeerListener l;
  l.bytes = bytes;
  l.fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  int off = 0;
  if (l.fd >= 0) setsockopt(l.fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  if (l.fd < 0 || bind(l.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (l.fd >= 0) close(l.fd);
    // Without IPv6: IPv4 alone.
    l.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in a4{};
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    if (l.fd < 0 || bind(l.fd, reinterpret_cast<sockaddr*>(&a4), sizeof(a4)) != 0) {
      if (l.fd >= 0) close(l.fd);
      FLYT_WARN("session %llu: no listener for a copy from another server: %s",
                static_cast<unsigned long long>(id_), std::strerror(errno));
      *rc = CUDA_ERROR_OPERATING_SYSTEM;
      return true;
    }
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (listen(l.fd, 4) != 0 || getsockname(l.fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    close(l.fd);
    *rc = CUDA_ERROR_OPERATING_SYSTEM;
    return true;
  }
  const uint16_t port = bound.ss_family == AF_INET6
                            ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                            : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::random_device rd;
  for (auto& k : l.key) k = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const uint64_t id = next_transfer_++;
  peer_listeners_[id] = l;
  out.Put<uint64_t>(id);
  out.Put<uint16_t>(port);
  out.Put<uint64_t>(l.key[0]);
  out.Put<uint64_t>(l.key[1]);
  *rc = CUDA_SUCCESS;
  return true;
}

bool Session::PeerReceive(wire::Reader& in, bool per_thread, CUresult* rc) {
  uint64_t id = 0, dst = 0, bytes = 0, stream = 0;
  if (!in.Get(&id) || !in.Get(&dst) || !in.Get(&bytes) || !in.Get(&stream) || in.remaining() != 0)
    return false;
  (void)per_thread;
  auto it = peer_listeners_.find(id);
  if (it == peer_listeners_.end() || it->second.bytes != bytes) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    peer_results_[id] = *rc;
    return true;
  }
  PeerListener l = it->second;
  peer_listeners_.erase(it);
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    close(l.fd);
    *rc = peer_results_[id] = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  const int timeout = PeerTimeoutMs();
  DriverApi& a = api();
  CUstream s = RealStream(stream);
  CUresult result = CUDA_ERROR_OPERATING_SYSTEM;
  int fd = -1;
  // The sender proves it is the one the client told with the transfer's key; a
  // connection without it is dropped and the next one waited for, until the
  // timeout in all.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
  for (int tries = 0; tries < 4 && fd < 0; ++tries) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0 || !WaitFd(l.fd, POLLIN, static_cast<int>(left))) break;
    fd = accept4(l.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    uint64_t key[2] = {0, 0};
    if (!ReadAll(fd, key, sizeof(key), timeout) || key[0] != l.key[0] || key[1] != l.key[1]) {
      FLYT_WARN("session %llu: a connection without the transfer's key was refused",
                static_cast<unsigned long long>(id_));
      close(fd);
      fd = -1;
    }
  }
  close(l.fd);
  if (fd >= 0) {
    std::vector<uint8_t> buf(std::min<uint64_t>(bytes, kPeerChunk));
    result = CUDA_SUCCESS;
    for (uint64_t done = 0; done < bytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, kPeerChunk));
      if (!ReadAll(fd, buf.data(), n, timeout)) {
        result = CUDA_ERROR_OPERATING_SYSTEM;
        break;
      }
      // Behind the stream's earlier work, and done before the buffer is reused.
      CUresult r = a.cuMemcpyHtoDAsync_v2(dst + done, buf.data(), n, s);
      if (r == CUDA_SUCCESS) r = a.cuStreamSynchronize(s);
      if (r != CUDA_SUCCESS) {
        result = r;
        break;
      }
      done += n;
    }
    uint32_t status = static_cast<uint32_t>(result);
    (void)WriteAll(fd, &status, sizeof(status), timeout);  // the sender's answer
    close(fd);
  }
  if (result == CUDA_ERROR_OPERATING_SYSTEM)
    FLYT_WARN("session %llu: a copy from another server did not arrive",
              static_cast<unsigned long long>(id_));
  *rc = peer_results_[id] = result;
  return true;
}

bool Session::PeerSend(wire::Reader& in, bool per_thread, CUresult* rc) {
  std::string host;
  uint16_t port = 0;
  uint64_t key[2] = {0, 0}, src = 0, bytes = 0, stream = 0;
  if (!in.GetString(&host) || !in.Get(&port) || !in.Get(&key[0]) || !in.Get(&key[1]) ||
      !in.Get(&src) || !in.Get(&bytes) || !in.Get(&stream) || in.remaining() != 0)
    return false;
  (void)per_thread;
  if (placed_slot_ < 0) {  // only a client of several servers (kOpPlaceMemory first)
    *rc = CUDA_ERROR_NOT_PERMITTED;
    return true;
  }
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  DriverApi& a = api();
  CUstream s = RealStream(stream);
  // After the earlier work: the stream's, or all of the session's when the
  // copy's stream is another server's.
  CUresult r = stream > 2 ? a.cuStreamSynchronize(s) : SynchronizeSession();
  const int timeout = PeerTimeoutMs();
  int fd = DialPeer(host, port, timeout);
  if (fd < 0) {
    FLYT_WARN("session %llu: cannot reach the other server at %s:%u for a copy: %s",
              static_cast<unsigned long long>(id_), host.c_str(), port, std::strerror(errno));
    *rc = CUDA_ERROR_OPERATING_SYSTEM;
    return true;
  }
  // Even when the earlier work failed the target is told (it stops waiting).
  CUresult result = WriteAll(fd, key, sizeof(key), timeout) ? r : CUDA_ERROR_OPERATING_SYSTEM;
  std::vector<uint8_t> buf(std::min<uint64_t>(bytes, kPeerChunk));
  for (uint64_t done = 0; result == CUDA_SUCCESS && done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, kPeerChunk));
    result = a.cuMemcpyDtoHAsync_v2(buf.data(), src + done, n, s);
    if (result == CUDA_SUCCESS) result = a.cuStreamSynchronize(s);
    if (result != CUDA_SUCCESS) break;
    if (!WriteAll(fd, buf.data(), n, timeout)) result = CUDA_ERROR_OPERATING_SYSTEM;
    done += n;
  }
  if (result == CUDA_SUCCESS) {  // the target's verdict
    uint32_t status = 0;
    result = ReadAll(fd, &status, sizeof(status), timeout) ? static_cast<CUresult>(status)
                                                           : CUDA_ERROR_OPERATING_SYSTEM;
  }
  close(fd);
  *rc = result;
  return true;
}

bool Session::PeerDone(wire::Reader& in, CUresult* rc) {
  uint64_t id = 0;
  if (!in.Get(&id) || in.remaining() != 0) return false;
  // A failed receive (an asynchronous call) is this reply's deferred error already.
  auto it = peer_results_.find(id);
  *rc = it == peer_results_.end() ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  if (it != peer_results_.end()) peer_results_.erase(it);
  return true;
}

void Session::ClosePeerListeners() {
  for (auto& [id, l] : peer_listeners_) close(l.fd);
  peer_listeners_.clear();
  peer_results_.clear();
}

}  // namespace flyt::server
