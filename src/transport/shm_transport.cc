// The shared-memory transport: handshake over a Unix socket, bytes through two
// rings in a sealed memfd, the socket kept open as the liveness channel.
// See shm_transport.h and docs/shared_memory.md.
#include "transport/shm_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/shm_ring.h"
#include "transport/shm_segment.h"

namespace flyt::transport {
namespace {

constexpr size_t kDefaultRingBytes = size_t{8} << 20;
constexpr size_t kMinRingBytes = size_t{64} << 10;
constexpr size_t kMaxRingBytes = size_t{1} << 30;
constexpr size_t kPage = 4096;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

ShmRingOptions RingOptions() {
  ShmRingOptions o;
  o.spin_us = 50;
  if (const char* s = std::getenv("FLYT_SHM_SPIN_US"); s != nullptr && *s != '\0') {
    char* end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (*end == '\0' && v >= 0 && v <= 1000000) o.spin_us = static_cast<int>(v);
  }
  o.max_message_bytes = kMaxRingBytes;  // frames are at most 64 MiB plus a header
  return o;
}

// Reading the peer's pid is diagnostics only; failures leave it out.
std::string PeerPid(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return "";
  return " (pid " + std::to_string(cred.pid) + ")";
}

// Sends `n` bytes with `fd` attached (SCM_RIGHTS); retries EINTR. Returns
// what sendmsg returned.
ssize_t SendWithFd(int sock, const void* data, size_t n, int fd, int flags) {
  iovec iov{const_cast<void*>(data), n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t sent;
  do {
    sent = ::sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
  } while (sent < 0 && errno == EINTR);
  return sent;
}

// Receives up to `n` bytes and the descriptors attached to them (SCM_RIGHTS,
// close-on-exec; at most 4 fit, *truncated says more were cut off). Returns
// what recvmsg returned, errno as it left it.
ssize_t RecvWithFds(int sock, void* data, size_t n, int flags, std::vector<int>* fds,
                    bool* truncated) {
  iovec iov{data, n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t r = ::recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  const int err = errno;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->push_back(fd);
    }
  }
  *truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  errno = err;
  return r;
}

class ShmConnection final : public Connection {
 public:
  // `layout` and `segment_fd` (server side: the segment's descriptor, kept so
  // that the connection can be handed to another process; -1 on the client).
  ShmConnection(int sock, std::unique_ptr<Segment> segment, std::unique_ptr<ShmRing> tx,
                std::unique_ptr<ShmRing> rx, std::string peer, std::string gone,
                const ShmHandshake& layout = ShmHandshake{}, int segment_fd = -1)
      : sock_(sock),
        segment_fd_(segment_fd),
        layout_(layout),
        segment_(std::move(segment)),
        tx_(std::move(tx)),
        rx_(std::move(rx)),
        peer_(std::move(peer)),
        gone_message_(std::move(gone)) {
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
    monitor_ = std::thread([this] { Monitor(); });
  }

  ~ShmConnection() override {
    if (!detached_) Shutdown();
    if (monitor_.joinable()) monitor_.join();
    for (auto& [id, fd] : shared_fds_) ::close(fd);  // shared but never used
    if (sock_ >= 0 && ::close(sock_) != 0) {
      // Nothing to do about it in a destructor; the fd is gone either way.
    }
    if (segment_fd_ >= 0) ::close(segment_fd_);
    if (stop_fd_ >= 0) ::close(stop_fd_);
  }

  // Stops the monitor without touching the rings or the socket, and hands
  // over the socket, the segment and the descriptors shared but not taken.
  Status Detach(DetachedConnection* out) override {
    if (segment_fd_ < 0 || sock_ < 0 || detached_)
      return Status::Error("shm connection to " + peer_ + " cannot be handed over");
    if (left_in_record_ != 0)
      return Status::Error("shm connection to " + peer_ + " is in the middle of a message");
    // The next process starts reading where the shared tail says: publish all we read.
    if (Status st = rx_->PublishConsumed(); !st.ok()) return st;
    if (stop_fd_ < 0) return Status::Error(Errno("eventfd"));
    uint64_t one = 1;
    if (::write(stop_fd_, &one, sizeof(one)) != sizeof(one)) return Status::Error(Errno("eventfd"));
    monitor_.join();
    if (gone_.load()) return Status::Error(gone_message_);
    detached_ = true;
    out->kind = DetachedConnection::Kind::kShm;
    out->peer = peer_;
    out->fds = {sock_, segment_fd_};
    out->state.resize(sizeof(ShmHandshake));
    std::memcpy(out->state.data(), &layout_, sizeof(layout_));
    for (auto& [id, fd] : shared_fds_) {
      const size_t at = out->state.size();
      out->state.resize(at + sizeof(id));
      std::memcpy(out->state.data() + at, &id, sizeof(id));
      out->fds.push_back(fd);
    }
    shared_fds_.clear();
    sock_ = -1;
    segment_fd_ = -1;
    return Status::Ok();
  }

  // The receiving side of Detach: descriptors shared before the hand-over.
  void AdoptShared(uint64_t id, int fd) { shared_fds_[id] = fd; }

  bool SharesMemory() const override { return true; }

  Status ShareFd(int fd, uint64_t* id) override {
    ShareNotice notice;
    {
      std::lock_guard<std::mutex> lock(share_mu_);
      notice.id = next_share_id_++;
    }
    std::lock_guard<std::mutex> lock(send_mu_);  // one notice at a time on the socket
    const ssize_t n = SendWithFd(sock_, &notice, sizeof(notice), fd, 0);
    if (n != static_cast<ssize_t>(sizeof(notice))) {
      return Status::Error(n < 0 ? Errno("share memory with " + peer_ + ": sendmsg")
                                 : "share memory with " + peer_ + ": short send");
    }
    *id = notice.id;
    return Status::Ok();
  }

  Status TakeSharedFd(uint64_t id, int timeout_ms, int* fd) override {
    std::unique_lock<std::mutex> lock(share_mu_);
    const bool arrived = share_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
      return shared_fds_.count(id) != 0 || monitor_done_;
    });
    auto it = shared_fds_.find(id);
    if (!arrived || it == shared_fds_.end()) {
      return Status::Error(peer_ + ": shared memory " + std::to_string(id) + " never arrived");
    }
    *fd = it->second;
    shared_fds_.erase(it);
    return Status::Ok();
  }

  Status Send(const iovec* iov, int count) override {
    if (count < 0) return Status::Error("bad iovec count");
    Status st = tx_->Write(iov, count, 0);
    return st.ok() ? st : Translate(st);
  }

  Status Receive(void* dst, size_t n) override {
    auto* out = static_cast<uint8_t*>(dst);
    const int timeout_ms = timeout_ms_.load(std::memory_order_relaxed);
    while (n > 0) {
      if (left_in_record_ == 0) {
        uint64_t len = 0;
        Status st = rx_->BeginRead(&len, timeout_ms);
        if (!st.ok()) return Translate(st);
        left_in_record_ = len;  // 0-byte records are skipped
        continue;
      }
      // Straight from the ring into the destination: one copy, whatever n is.
      const size_t take = left_in_record_ < n ? static_cast<size_t>(left_in_record_) : n;
      Status st = rx_->ReadBody(out, take, timeout_ms);
      if (!st.ok()) return Translate(st);
      left_in_record_ -= take;
      out += take;
      n -= take;
    }
    return Status::Ok();
  }

  void Shutdown() override {
    local_shutdown_.store(true);
    tx_->Close();  // wakes a peer (or a thread of ours) waiting on either ring
    rx_->Close();
    ::shutdown(sock_, SHUT_RDWR);  // ENOTCONN once the peer is gone: nothing to do
  }

  void AbandonAfterFork() override {
    // The rings and the segment stay mapped (they are the parent's too); only
    // this process's descriptors go, so the server still sees the parent.
    ::close(sock_);
    sock_ = -1;
    for (auto& [id, fd] : shared_fds_) ::close(fd);
    shared_fds_.clear();
  }

  void SetReceiveSpin(int spin_us) { rx_->SetSpinUs(spin_us); }

  void SetReceiveTimeout(int timeout_ms) override {
    timeout_ms_.store(timeout_ms < 0 ? 0 : timeout_ms, std::memory_order_relaxed);
  }
  std::string Peer() const override { return peer_; }

 private:
  // The only message the socket carries after the handshake: a descriptor
  // the peer shares (SCM_RIGHTS attached to these 16 bytes).
  struct ShareNotice {
    static constexpr uint32_t kMagic = 0x44594c46;  // "FLYD"
    uint32_t magic = kMagic;
    uint32_t reserved = 0;
    uint64_t id = 0;
  };
  static_assert(sizeof(ShareNotice) == 16);
  // Descriptors shared but not yet taken; more is a hostile peer.
  static constexpr size_t kMaxPendingShares = 64;

  // Reads one share notice. A Unix stream socket delivers the 16 bytes sent
  // with one sendmsg, and their descriptor, to one recvmsg; anything else
  // (other bytes, a short notice, no or several descriptors) is a protocol
  // violation. Returns false with *why set then, or at EOF.
  bool ReadShareNotice(std::string* why) {
    ShareNotice notice;
    std::vector<int> fds;
    bool truncated = false;
    const ssize_t r = RecvWithFds(sock_, &notice, sizeof(notice), MSG_DONTWAIT, &fds, &truncated);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    const bool valid = r == static_cast<ssize_t>(sizeof(notice)) && fds.size() == 1 && !truncated &&
                       notice.magic == ShareNotice::kMagic;
    if (!valid) {
      for (int fd : fds) ::close(fd);
      if (r < 0) *why = Errno("recvmsg");
      if (r > 0) *why = "sent bytes on the liveness socket";
      return false;  // r == 0: EOF, the peer is gone
    }
    std::lock_guard<std::mutex> lock(share_mu_);
    if (shared_fds_.size() >= kMaxPendingShares || shared_fds_.count(notice.id) != 0) {
      ::close(fds[0]);
      *why = "shared descriptors it never used";
      return false;
    }
    shared_fds_[notice.id] = fds[0];
    share_cv_.notify_all();
    return true;
  }

  // Waits for the socket to hang up (the peer exited, crashed or shut down,
  // or we did) and then closes both rings, so that every wait ends at once.
  // Meanwhile it collects the descriptors the peer shares.
  void Monitor() {
    std::string why;
    for (;;) {
      pollfd p[2] = {{sock_, POLLIN | POLLRDHUP, 0}, {stop_fd_, POLLIN, 0}};
      const int rc = ::poll(p, stop_fd_ >= 0 ? 2 : 1, -1);
      if (rc < 0) {
        if (errno == EINTR) continue;
        why = Errno("poll");
        break;
      }
      // Read what is there first: a notice may arrive just before a hang-up.
      if ((p[0].revents & POLLIN) != 0 && !ReadShareNotice(&why)) break;
      if ((p[0].revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0) break;
      if (stop_fd_ >= 0 && (p[1].revents & POLLIN) != 0) return;  // Detach: hands off
    }
    if (!local_shutdown_.load()) {
      why_ = why;  // published by the store below
      gone_.store(true);
    }
    tx_->Close();
    rx_->Close();
    std::lock_guard<std::mutex> lock(share_mu_);
    monitor_done_ = true;
    share_cv_.notify_all();
  }

  Status Translate(const Status& st) {
    if (local_shutdown_.load()) return Status::Error("connection to " + peer_ + " was shut down");
    const std::string& m = st.message();
    if (m.find("corrupted") != std::string::npos || m.find("timed out") != std::string::npos) {
      return Status::Error(peer_ + ": " + m);
    }
    if (gone_.load() || rx_->closed() || tx_->closed()) {
      // The peer's own Shutdown closes the rings just before its socket goes:
      // give the monitor a moment to see the hang-up and say why.
      for (int i = 0; i < 20 && !gone_.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (gone_.load() && !why_.empty()) return Status::Error(gone_message_ + " (" + why_ + ")");
      return Status::Error(gone_message_);
    }
    return Status::Error(peer_ + ": " + m);
  }

  int sock_;
  int segment_fd_ = -1;
  int stop_fd_ = -1;  // written by Detach to end the monitor
  bool detached_ = false;
  ShmHandshake layout_;
  std::unique_ptr<Segment> segment_;
  std::unique_ptr<ShmRing> tx_;
  std::unique_ptr<ShmRing> rx_;
  std::string peer_;
  const std::string gone_message_;
  std::string why_;  // written by the monitor before gone_ is set, then never again
  std::atomic<bool> gone_{false};
  std::atomic<bool> local_shutdown_{false};
  std::atomic<int> timeout_ms_{0};
  uint64_t left_in_record_ = 0;  // bytes of the current rx record not yet received
  // Shared descriptors: sending side (client) and receiving side (server).
  std::mutex send_mu_;
  std::mutex share_mu_;
  std::condition_variable share_cv_;
  uint64_t next_share_id_ = 1;
  std::map<uint64_t, int> shared_fds_;  // arrived, not yet taken
  bool monitor_done_ = false;
  std::thread monitor_;
};

// Server side of the handshake on a fresh connection. Never blocks on the
// client: it only sends (a few bytes into an empty socket buffer).
Status ServeHandshake(int sock, const Address& addr, std::unique_ptr<Connection>* out) {
  const size_t cap = ShmRingBytesFromEnv();
  ShmHandshake h;
  h.c2s_offset = 0;
  h.c2s_capacity = cap;
  h.s2c_offset = AlignUp(ShmRing::BytesFor(cap), kPage);
  h.s2c_capacity = cap;
  h.segment_bytes = h.s2c_offset + AlignUp(ShmRing::BytesFor(cap), kPage);
  std::unique_ptr<Segment> seg;
  int memfd = -1;
  std::string file_dir;
  Status st = ShmBackingFromEnv(&file_dir);
  if (!st.ok()) return st;
  if (file_dir.empty()) {
    st = CreateMemfdSegment(h.segment_bytes, &seg, &memfd);
  } else {
    st = CreateUnlinkedFileSegment(file_dir, h.segment_bytes, &seg, &memfd);
    h.flags |= ShmHandshake::kFlagFileBacked;
  }
  if (!st.ok()) return st;
  const ShmRingOptions options = RingOptions();
  auto* base = static_cast<uint8_t*>(seg->base());
  std::unique_ptr<ShmRing> rx, tx;
  st = ShmRing::Create(base + h.c2s_offset, ShmRing::BytesFor(cap), cap, options, &rx);
  if (st.ok()) st = ShmRing::Create(base + h.s2c_offset, ShmRing::BytesFor(cap), cap, options, &tx);
  if (st.ok()) {
    const ssize_t n = SendWithFd(sock, &h, sizeof(h), memfd, MSG_DONTWAIT);
    if (n < 0) {
      st = Status::Error(Errno("shm handshake: sendmsg"));
    } else if (static_cast<size_t>(n) != sizeof(h)) {
      st = Status::Error("shm handshake: short send");
    }
  }
  if (!st.ok()) {
    ::close(memfd);
    return st;
  }
  const std::string peer = addr.ToString() + PeerPid(sock);
  *out = std::make_unique<ShmConnection>(sock, std::move(seg), std::move(tx), std::move(rx), peer,
                                         "client at " + peer + " went away", h, memfd);
  return Status::Ok();
}

}  // namespace

Status ReattachShm(DetachedConnection&& d, std::unique_ptr<Connection>* out) {
  ShmHandshake h;
  const size_t ids = d.state.size() >= sizeof(h) ? d.state.size() - sizeof(h) : 0;
  Status st;
  if (d.kind != DetachedConnection::Kind::kShm || d.fds.size() < 2 || d.state.size() < sizeof(h) ||
      ids % sizeof(uint64_t) != 0 || d.fds.size() != 2 + ids / sizeof(uint64_t)) {
    st = Status::Error("reattach: not a detached shm connection");
  } else {
    std::memcpy(&h, d.state.data(), sizeof(h));
    st = ValidateShmHandshake(h);
  }
  std::unique_ptr<Segment> seg;
  if (st.ok()) {
    // MapFdSegment consumes the descriptor it maps; d.fds[1] stays with the
    // connection for a later hand-over.
    const int dup = ::fcntl(d.fds[1], F_DUPFD_CLOEXEC, 3);
    if (dup < 0) st = Status::Error(Errno("reattach: dup"));
    if (st.ok())
      st = MapFdSegment(dup, h.segment_bytes, &seg, (h.flags & ShmHandshake::kFlagFileBacked) != 0);
  }
  std::unique_ptr<ShmRing> tx, rx;
  if (st.ok()) {
    const ShmRingOptions options = RingOptions();
    auto* base = static_cast<uint8_t*>(seg->base());
    st = ShmRing::Attach(base + h.c2s_offset, ShmRing::BytesFor(h.c2s_capacity), options, &rx);
    if (st.ok())
      st = ShmRing::Attach(base + h.s2c_offset, ShmRing::BytesFor(h.s2c_capacity), options, &tx);
  }
  if (!st.ok()) {
    CloseDetached(&d);
    return st;
  }
  auto conn =
      std::make_unique<ShmConnection>(d.fds[0], std::move(seg), std::move(tx), std::move(rx),
                                      d.peer, "client at " + d.peer + " went away", h, d.fds[1]);
  for (size_t i = 0; i < ids / sizeof(uint64_t); ++i) {
    uint64_t id = 0;
    std::memcpy(&id, d.state.data() + sizeof(h) + i * sizeof(id), sizeof(id));
    conn->AdoptShared(id, d.fds[2 + i]);
  }
  d.fds.clear();
  *out = std::move(conn);
  return Status::Ok();
}

namespace {

class ShmListener final : public Listener {
 public:
  ShmListener(int fd, Address addr) : fd_(fd), addr_(std::move(addr)) {}
  ~ShmListener() override {
    Close();
    ::unlink(addr_.path.c_str());  // ENOENT if someone removed it: fine
  }

  Status Accept(std::unique_ptr<Connection>* out) override {
    for (;;) {
      const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return Status::Error(Errno("accept on " + addr_.ToString()));
      }
      Status st = ServeHandshake(fd, addr_, out);
      if (st.ok()) return st;
      // One client's failed handshake must not stop the listener.
      FLYT_WARN("%s: dropped a connection: %s", addr_.ToString().c_str(), st.message().c_str());
      ::close(fd);
    }
  }

  void Close() override {
    if (!closed_.exchange(true)) {
      ::shutdown(fd_, SHUT_RDWR);
      ::close(fd_);
    }
  }
  std::string Describe() const override { return addr_.ToString(); }

 private:
  int fd_;
  Address addr_;
  std::atomic<bool> closed_{false};
};

// Connects a Unix stream socket within timeout_ms (EAGAIN: backlog full).
Status ConnectUnix(const std::string& path, int timeout_ms, int* fd_out, bool* retryable) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof(sa.sun_path) - 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return Status::Error(Errno("socket"));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
      const int flags = fcntl(fd, F_GETFL);
      if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        Status s = Status::Error(Errno("fcntl"));
        ::close(fd);
        return s;
      }
      *fd_out = fd;
      return Status::Ok();
    }
    const int err = errno;
    ::close(fd);
    if ((err == EAGAIN || err == EINTR) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    *retryable = err == ECONNREFUSED || err == ENOENT;
    errno = err == EAGAIN ? ETIMEDOUT : err;
    return Status::Error(Errno("connect to shm://" + path));
  }
}

// Receives the handshake and its fd (*memfd stays -1 if none came).
Status ReceiveHandshake(int sock, int timeout_ms, ShmHandshake* h, int* memfd) {
  *memfd = -1;
  auto* dst = reinterpret_cast<uint8_t*>(h);
  size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (got < sizeof(*h)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::Error("shm handshake: no answer in time (timed out)");
    pollfd p{sock, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return Status::Error(Errno("shm handshake: poll"));
    }
    if (rc == 0) continue;
    std::vector<int> fds;
    bool extra = false;
    const ssize_t n = RecvWithFds(sock, dst + got, sizeof(*h) - got, 0, &fds, &extra);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::Error(Errno("shm handshake: recvmsg"));
    }
    for (int fd : fds) {
      if (*memfd < 0) {
        *memfd = fd;
      } else {
        ::close(fd);
        extra = true;
      }
    }
    if (extra) {
      return Status::Error("shm handshake: the server sent more than one descriptor");
    }
    if (n == 0) return Status::Error("shm handshake: the server closed the connection");
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status ShmBackingFromEnv(std::string* dir) {
  dir->clear();
  const char* s = std::getenv("FLYT_SHM_BACKING");
  if (s == nullptr || *s == '\0' || std::strcmp(s, "memfd") == 0) return Status::Ok();
  if (std::strncmp(s, "file:", 5) == 0 && s[5] != '\0') {
    *dir = s + 5;
    return Status::Ok();
  }
  return Status::Error(std::string("FLYT_SHM_BACKING must be memfd or file:DIR, not '") + s + "'");
}

std::string KernelBootId() {
  const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[64];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  if (n <= 0) return "";
  std::string id(buf, static_cast<size_t>(n));
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

size_t ShmRingBytesFromEnv() {
  const char* s = std::getenv("FLYT_SHM_RING_BYTES");
  if (s == nullptr || *s == '\0') return kDefaultRingBytes;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (*end != '\0' || v == 0) return kDefaultRingBytes;
  size_t cap = kMinRingBytes;
  while (cap < v && cap < kMaxRingBytes) cap <<= 1;
  return cap;
}

Status ValidateShmHandshake(const ShmHandshake& h) {
  if (h.magic != ShmHandshake::kMagic) {
    return Status::Error("shm handshake: bad magic (is this a flyt-server shm:// socket?)");
  }
  if (h.version != ShmHandshake::kVersion) {
    return Status::Error("shm handshake: server speaks version " + std::to_string(h.version) +
                         ", this client " + std::to_string(ShmHandshake::kVersion));
  }
  auto bad = [&](const std::string& why) {
    return Status::Error("shm handshake: bad ring layout from the server: " + why);
  };
  for (uint64_t cap : {h.c2s_capacity, h.s2c_capacity}) {
    if (cap < ShmRing::kMinCapacity || cap > kMaxRingBytes || (cap & (cap - 1)) != 0) {
      return bad("ring capacity " + std::to_string(cap) + " is not a power of two in [" +
                 std::to_string(ShmRing::kMinCapacity) + ", " + std::to_string(kMaxRingBytes) +
                 "]");
    }
  }
  if (h.segment_bytes > 4 * kMaxRingBytes) {
    return bad("segment of " + std::to_string(h.segment_bytes) + " bytes is too large");
  }
  if (h.c2s_offset % 64 != 0 || h.s2c_offset % 64 != 0) return bad("ring offsets not aligned");
  // All values are bounded above, so these sums cannot overflow.
  const uint64_t c2s_end = h.c2s_offset + ShmRing::BytesFor(h.c2s_capacity);
  const uint64_t s2c_end = h.s2c_offset + ShmRing::BytesFor(h.s2c_capacity);
  if (h.c2s_offset > h.segment_bytes || h.s2c_offset > h.segment_bytes ||
      c2s_end > h.segment_bytes || s2c_end > h.segment_bytes) {
    return bad("a ring lies outside the " + std::to_string(h.segment_bytes) + "-byte segment");
  }
  if (h.c2s_offset < s2c_end && h.s2c_offset < c2s_end) return bad("the rings overlap");
  return Status::Ok();
}

void SetShmReceiveSpin(Connection* conn, int spin_us) {
  if (auto* shm = dynamic_cast<ShmConnection*>(conn); shm != nullptr) shm->SetReceiveSpin(spin_us);
}

Status DialShm(const Address& a, const Liveness& l, std::unique_ptr<Connection>* out,
               bool* retryable) {
  *retryable = false;
  int sock = -1;
  Status st = ConnectUnix(a.path, l.connect_timeout_ms, &sock, retryable);
  if (!st.ok()) return st;
  ShmHandshake h;
  int memfd = -1;
  st = ReceiveHandshake(sock, l.connect_timeout_ms, &h, &memfd);
  if (st.ok()) st = ValidateShmHandshake(h);
  if (st.ok() && memfd < 0)
    st = Status::Error("shm handshake: the server sent no memory descriptor");
  std::unique_ptr<Segment> seg;
  if (st.ok()) {
    // closes memfd
    st = MapFdSegment(memfd, h.segment_bytes, &seg, (h.flags & ShmHandshake::kFlagFileBacked) != 0);
    memfd = -1;
  }
  if (memfd >= 0) ::close(memfd);  // already failing
  std::unique_ptr<ShmRing> tx, rx;
  if (st.ok()) {
    const ShmRingOptions options = RingOptions();
    auto* base = static_cast<uint8_t*>(seg->base());
    st = ShmRing::Attach(base + h.c2s_offset, ShmRing::BytesFor(h.c2s_capacity), options, &tx);
    if (st.ok()) {
      st = ShmRing::Attach(base + h.s2c_offset, ShmRing::BytesFor(h.s2c_capacity), options, &rx);
    }
  }
  if (!st.ok()) {
    ::close(sock);
    return Status::Error("connect to " + a.ToString() + ": " + st.message());
  }
  *out = std::make_unique<ShmConnection>(sock, std::move(seg), std::move(tx), std::move(rx),
                                         a.ToString(),
                                         "flyt-server at " + a.ToString() + " went away");
  return Status::Ok();
}

Status ListenShm(const Address& a, std::unique_ptr<Listener>* out) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error(Errno("socket"));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, a.path.c_str(), sizeof(sa.sun_path) - 1);
  if (::unlink(a.path.c_str()) != 0 && errno != ENOENT) {  // a stale socket of a dead server
    Status s = Status::Error(Errno("listen on " + a.ToString() + ": unlink"));
    ::close(fd);
    return s;
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) < 0 || ::listen(fd, 128) < 0) {
    Status s = Status::Error(Errno("listen on " + a.ToString()));
    ::close(fd);
    return s;
  }
  *out = std::make_unique<ShmListener>(fd, a);
  return Status::Ok();
}

}  // namespace flyt::transport
