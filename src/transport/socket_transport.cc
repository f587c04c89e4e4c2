// TCP and Unix-socket transports: one fd-based Connection with a receive
// buffer so that many small frames cost one read() system call.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/shm_transport.h"
#include "transport/transport.h"
#include "transport/ucx_transport.h"

namespace flyt::transport {
namespace {

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

class SocketConnection final : public Connection {
 public:
  SocketConnection(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {
    buf_.resize(256 << 10);
  }
  ~SocketConnection() override {
    if (fd_ >= 0) ::close(fd_);
  }

  // Bytes the previous owner had received but not consumed come first.
  void Preload(const std::vector<uint8_t>& bytes) {
    if (bytes.size() > buf_.size()) buf_.resize(bytes.size());
    std::memcpy(buf_.data(), bytes.data(), bytes.size());
    begin_ = 0;
    end_ = bytes.size();
  }

  Status Detach(DetachedConnection* out) override {
    if (fd_ < 0) return Status::Error("connection to " + peer_ + " is already closed");
    out->kind = DetachedConnection::Kind::kSocket;
    out->fds = {fd_};
    out->state.assign(buf_.begin() + static_cast<std::ptrdiff_t>(begin_),
                      buf_.begin() + static_cast<std::ptrdiff_t>(end_));
    out->peer = peer_;
    fd_ = -1;
    begin_ = end_ = 0;
    return Status::Ok();
  }

  Status Send(const iovec* iov, int count) override {
    return SendAllOnSocket(fd_, peer_, iov, count);
  }

  Status Receive(void* dst, size_t n) override {
    auto* out = static_cast<uint8_t*>(dst);
    size_t have = end_ - begin_;
    if (have > 0) {
      size_t take = have < n ? have : n;
      std::memcpy(out, buf_.data() + begin_, take);
      begin_ += take;
      out += take;
      n -= take;
    }
    while (n > 0) {
      if (n >= buf_.size() / 2) {  // large: straight into the destination
        ssize_t r = ::recv(fd_, out, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return Failed(r);
        out += r;
        n -= static_cast<size_t>(r);
        continue;
      }
      ssize_t r = RecvSpinning(buf_.data(), buf_.size());
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return Failed(r);
      size_t take = static_cast<size_t>(r) < n ? static_cast<size_t>(r) : n;
      std::memcpy(out, buf_.data(), take);
      begin_ = take;
      end_ = static_cast<size_t>(r);
      out += take;
      n -= take;
    }
    return Status::Ok();
  }

  void Shutdown() override {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }
  void AbandonAfterFork() override {
    ::close(fd_);
    fd_ = -1;
  }
  void SetSocketSpin(int spin_us) override {
    spin_ns_ = spin_us > 0 ? static_cast<int64_t>(spin_us) * 1000 : 0;
  }
  void SetReceiveTimeout(int timeout_ms) override {
    timeval tv{};
    tv.tv_sec = timeout_ms / 1000;
    tv.tv_usec = (timeout_ms % 1000) * 1000;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  std::string Peer() const override { return peer_; }

 private:
  // recv() of what is there, polling without blocking for up to spin_ns_ first.
  ssize_t RecvSpinning(void* dst, size_t n) {
    if (spin_ns_ > 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns_);
      for (;;) {
        ssize_t r = ::recv(fd_, dst, n, MSG_DONTWAIT);
        if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return r;
        if (std::chrono::steady_clock::now() >= until) break;
      }
    }
    return ::recv(fd_, dst, n, 0);
  }

  Status Failed(ssize_t r) {
    if (r == 0) return Status::Error("connection closed by " + peer_);
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return Status::Error("no answer from " + peer_ + " in time (timed out)");
    }
    return Status::Error("receive from " + peer_ + ": " + std::strerror(errno));
  }

  int fd_;
  std::string peer_;
  std::vector<uint8_t> buf_;
  size_t begin_ = 0, end_ = 0;
  int64_t spin_ns_ = 0;  // SetSocketSpin
};

class SocketListener final : public Listener {
 public:
  SocketListener(int fd, Address addr) : fd_(fd), addr_(std::move(addr)) {}
  ~SocketListener() override {
    Close();
    if (addr_.kind == Address::Kind::kUnix) ::unlink(addr_.path.c_str());
  }
  Status Accept(std::unique_ptr<Connection>* out) override {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return Status::Error(Errno("accept"));
      }
      std::string peer = "unix:" + addr_.path;
      if (ss.ss_family == AF_INET) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        char ip[64];
        auto* in = reinterpret_cast<sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        peer = std::string(ip) + ":" + std::to_string(ntohs(in->sin_port));
      }
      int sz = 4 << 20;
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
      *out = std::make_unique<SocketConnection>(fd, peer);
      return Status::Ok();
    }
  }
  void Close() override {
    if (!closed_) {
      closed_ = true;
      ::shutdown(fd_, SHUT_RDWR);
      ::close(fd_);
    }
  }
  std::string Describe() const override { return addr_.ToString(); }

 private:
  int fd_;
  Address addr_;
  bool closed_ = false;
};

void SetLiveness(int fd, const Liveness& l) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int secs = l.dead_peer_timeout_ms / 3000 > 0 ? l.dead_peer_timeout_ms / 3000 : 1;
  int cnt = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &secs, sizeof(secs));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &secs, sizeof(secs));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  unsigned int ut = static_cast<unsigned int>(l.dead_peer_timeout_ms);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
  int sz = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

// connect() with a timeout.
bool ConnectWithin(int fd, const sockaddr* sa, socklen_t len, int timeout_ms) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = ::connect(fd, sa, len);
  if (rc < 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = ::poll(&p, 1, timeout_ms);
    if (rc == 0) {
      errno = ETIMEDOUT;
      return false;
    }
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) {
      errno = err;
      return false;
    }
    rc = 0;
  }
  fcntl(fd, F_SETFL, flags);
  return rc == 0;
}

}  // namespace

std::string Address::ToString() const {
  if (kind == Kind::kUnix) return "unix://" + path;
  if (kind == Kind::kShm) return "shm://" + path;
  const char* scheme = kind == Kind::kTls ? "tls://" : kind == Kind::kUcx ? "ucx://" : "tcp://";
  return scheme + host + ":" + std::to_string(port);
}

Status SendAllOnSocket(int fd, const std::string& peer, const iovec* iov, int count,
                       uint64_t* sent) {
  iovec local[16];
  if (count < 0 || count > 16) return Status::Error("too many iovecs");
  std::memcpy(local, iov, sizeof(iovec) * static_cast<size_t>(count));
  iovec* cur = local;
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = cur;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Error("send to " + peer + ": " + std::strerror(errno));
    }
    if (sent != nullptr) *sent += static_cast<uint64_t>(n);
    size_t left = static_cast<size_t>(n);
    while (count > 0 && left >= cur->iov_len) {
      left -= cur->iov_len;
      ++cur;
      --count;
    }
    if (count > 0) {
      cur->iov_base = static_cast<char*>(cur->iov_base) + left;
      cur->iov_len -= left;
    }
  }
  return Status::Ok();
}

Status ParseAddress(const std::string& text, Address* out) {
  std::string rest = text;
  if (rest.rfind("unix://", 0) == 0 || rest.rfind("unix:", 0) == 0) {
    out->kind = Address::Kind::kUnix;
    out->path = rest.substr(rest.rfind("unix://", 0) == 0 ? 7 : 5);
    if (out->path.empty() || out->path.size() >= sizeof(sockaddr_un::sun_path))
      return Status::Error("bad Unix socket address '" + text + "': expected unix:///path");
    return Status::Ok();
  }
  if (rest.rfind("shm://", 0) == 0 || rest.rfind("shm:", 0) == 0) {
    out->kind = Address::Kind::kShm;
    out->path = rest.substr(rest.rfind("shm://", 0) == 0 ? 6 : 4);
    if (out->path.empty() || out->path.size() >= sizeof(sockaddr_un::sun_path))
      return Status::Error("bad shared-memory address '" + text + "': expected shm:///path");
    return Status::Ok();
  }
  const bool tls = rest.rfind("tls://", 0) == 0;
  const bool ucx = rest.rfind("ucx://", 0) == 0;
  if (rest.rfind("tcp://", 0) == 0 || tls || ucx) rest = rest.substr(6);
  size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon + 1 >= rest.size())
    return Status::Error("bad address '" + text + "': expected tcp://HOST:PORT or unix:///PATH");
  out->kind = tls ? Address::Kind::kTls : ucx ? Address::Kind::kUcx : Address::Kind::kTcp;
  out->host = rest.substr(0, colon);
  if (out->host.size() > 2 && out->host.front() == '[' && out->host.back() == ']')
    out->host = out->host.substr(1, out->host.size() - 2);
  char* end = nullptr;
  long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 0 || port > 65535)
    return Status::Error("bad port in address '" + text + "'");
  out->port = static_cast<int>(port);
  if (out->host.empty()) out->host = "0.0.0.0";
  return Status::Ok();
}

namespace {

// One connection attempt; *retryable says whether nobody was listening yet.
Status DialOnce(const Address& a, const Liveness& l, std::unique_ptr<Connection>* out,
                bool* retryable) {
  *retryable = false;
  if (a.kind == Address::Kind::kShm) return DialShm(a, l, out, retryable);
  if (a.kind == Address::Kind::kUcx) return DialUcx(a, l, out, retryable);
  if (a.kind == Address::Kind::kUnix) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::Error(Errno("socket"));
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, a.path.c_str(), sizeof(sa.sun_path) - 1);
    if (!ConnectWithin(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa), l.connect_timeout_ms)) {
      *retryable = errno == ECONNREFUSED || errno == ENOENT;
      Status s = Status::Error(Errno(("connect to " + a.ToString()).c_str()));
      ::close(fd);
      return s;
    }
    int sz = 4 << 20;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    *out = std::make_unique<SocketConnection>(fd, a.ToString());
    return Status::Ok();
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(a.port);
  int gai = getaddrinfo(a.host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) return Status::Error("cannot resolve '" + a.host + "': " + gai_strerror(gai));
  std::string last = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    SetLiveness(fd, l);
    if (ConnectWithin(fd, ai->ai_addr, ai->ai_addrlen, l.connect_timeout_ms)) {
      freeaddrinfo(res);
      *out = std::make_unique<SocketConnection>(fd, a.ToString());
      return Status::Ok();
    }
    last = std::strerror(errno);
    if (errno == ECONNREFUSED) *retryable = true;
    ::close(fd);
  }
  freeaddrinfo(res);
  return Status::Error("connect to " + a.ToString() + ": " + last);
}

}  // namespace

void CloseDetached(DetachedConnection* d) {
  for (int fd : d->fds)
    if (fd >= 0) ::close(fd);
  d->fds.clear();
  d->kind = DetachedConnection::Kind::kNone;
}

Status Reattach(DetachedConnection&& d, std::unique_ptr<Connection>* out) {
  if (d.kind == DetachedConnection::Kind::kShm) return ReattachShm(std::move(d), out);
  if (d.kind == DetachedConnection::Kind::kUcx) return ReattachUcx(std::move(d), out);
  if (d.kind != DetachedConnection::Kind::kSocket || d.fds.size() != 1 || d.fds[0] < 0 ||
      d.state.size() > (size_t{64} << 20)) {
    CloseDetached(&d);
    return Status::Error("reattach: not a detached socket connection");
  }
  auto conn = std::make_unique<SocketConnection>(d.fds[0], d.peer);
  conn->Preload(d.state);
  d.fds.clear();
  *out = std::move(conn);
  return Status::Ok();
}

Status Dial(const Address& a, const Liveness& l, std::unique_ptr<Connection>* out) {
  if (a.kind == Address::Kind::kTls)
    return Status::Error("tls:// is dialled by the client library's TLS layer, not here");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(l.refused_retry_ms);
  for (;;) {
    bool retryable = false;
    Status s = DialOnce(a, l, out, &retryable);
    if (s.ok() || !retryable || std::chrono::steady_clock::now() >= deadline) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status Listen(const Address& a, std::unique_ptr<Listener>* out) {
  if (a.kind == Address::Kind::kShm) return ListenShm(a, out);
  if (a.kind == Address::Kind::kUcx) return ListenUcx(a, out);
  if (a.kind == Address::Kind::kUnix) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::Error(Errno("socket"));
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, a.path.c_str(), sizeof(sa.sun_path) - 1);
    ::unlink(a.path.c_str());  // a stale socket file from a dead server
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) < 0 || ::listen(fd, 128) < 0) {
      Status s = Status::Error(Errno(("listen on " + a.ToString()).c_str()));
      ::close(fd);
      return s;
    }
    *out = std::make_unique<SocketListener>(fd, a);
    return Status::Ok();
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port = std::to_string(a.port);
  int gai = getaddrinfo(a.host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) return Status::Error("cannot resolve '" + a.host + "': " + gai_strerror(gai));
  int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(res);
    return Status::Error(Errno("socket"));
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, res->ai_addr, res->ai_addrlen) < 0 || ::listen(fd, 128) < 0) {
    Status s = Status::Error(Errno(("listen on " + a.ToString()).c_str()));
    freeaddrinfo(res);
    ::close(fd);
    return s;
  }
  freeaddrinfo(res);
  Address bound = a;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET) bound.port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) {
      bound.port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    }
  }
  *out = std::make_unique<SocketListener>(fd, bound);  // port 0 asked: the kernel's choice
  return Status::Ok();
}

}  // namespace flyt::transport
