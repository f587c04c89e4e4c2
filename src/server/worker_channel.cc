// Implementation of server/worker_channel.h.
#include "server/worker_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace flyt::server::channel {
namespace {

struct Header {
  uint32_t type;
  uint32_t length;
};

constexpr size_t kMaxFds = 64;

}  // namespace

Status Send(int sock, Type type, const void* payload, size_t n, const std::vector<int>& fds) {
  if (n > kMaxPayload || fds.size() > kMaxFds)
    return Status::Error("worker channel: message too large");
  Header h{static_cast<uint32_t>(type), static_cast<uint32_t>(n)};
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<void*>(payload), n}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = n > 0 ? 2 : 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t r = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (r >= 0) return Status::Ok();
    if (errno != EINTR)
      return Status::Error(std::string("worker channel: send: ") + std::strerror(errno));
  }
}

void CloseFds(Message* m) {
  for (int fd : m->fds)
    if (fd >= 0) ::close(fd);
  m->fds.clear();
}

Status Receive(int sock, Message* out, int timeout_ms) {
  out->payload.clear();
  out->fds.clear();
  if (timeout_ms >= 0) {
    pollfd p{sock, POLLIN, 0};
    int r;
    do {
      r = ::poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return Status::Error("worker channel: no message in time (timed out)");
  }
  std::vector<uint8_t> buf(sizeof(Header) + kMaxPayload);
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t r;
  do {
    r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return Status::Error(std::string("worker channel: receive: ") + std::strerror(errno));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out->fds.push_back(fd);
    }
  }
  if (r == 0) {
    CloseFds(out);
    return Status::Error("worker channel: closed");
  }
  Header h{};
  if (static_cast<size_t>(r) < sizeof(h) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    CloseFds(out);
    return Status::Error("worker channel: malformed message");
  }
  std::memcpy(&h, buf.data(), sizeof(h));
  if (h.length != static_cast<size_t>(r) - sizeof(h)) {
    CloseFds(out);
    return Status::Error("worker channel: malformed message");
  }
  out->type = static_cast<Type>(h.type);
  out->payload.assign(buf.begin() + sizeof(h), buf.begin() + r);
  return Status::Ok();
}

Status SendConnection(int sock, Type type, const Ticket* ticket, transport::DetachedConnection* c) {
  std::vector<uint8_t> p;
  auto put = [&](const void* v, size_t n) {
    const auto* b = static_cast<const uint8_t*>(v);
    p.insert(p.end(), b, b + n);
  };
  if (ticket != nullptr) put(ticket, sizeof(*ticket));
  const auto kind = static_cast<uint32_t>(c->kind);
  const auto peer_len = static_cast<uint32_t>(c->peer.size());
  const auto state_len = static_cast<uint32_t>(c->state.size());
  put(&kind, 4);
  put(&peer_len, 4);
  put(&state_len, 4);
  put(c->peer.data(), c->peer.size());
  put(c->state.data(), c->state.size());
  return Send(sock, type, p.data(), p.size(), c->fds);
}

Status ParseConnection(Message* m, Ticket* ticket, transport::DetachedConnection* c) {
  size_t at = 0;
  auto get = [&](void* v, size_t n) {
    if (m->payload.size() - at < n) return false;
    std::memcpy(v, m->payload.data() + at, n);
    at += n;
    return true;
  };
  uint32_t kind = 0, peer_len = 0, state_len = 0;
  bool ok = (ticket == nullptr || get(ticket, sizeof(*ticket))) && get(&kind, 4) &&
            get(&peer_len, 4) && get(&state_len, 4) &&
            m->payload.size() - at == static_cast<size_t>(peer_len) + state_len;
  if (!ok) {
    CloseFds(m);
    return Status::Error("worker channel: malformed connection message");
  }
  c->kind = static_cast<transport::DetachedConnection::Kind>(kind);
  c->peer.assign(reinterpret_cast<const char*>(m->payload.data() + at), peer_len);
  at += peer_len;
  c->state.assign(m->payload.begin() + static_cast<std::ptrdiff_t>(at), m->payload.end());
  c->fds = std::move(m->fds);
  m->fds.clear();
  return Status::Ok();
}

namespace {

void PutString(std::vector<uint8_t>* p, const std::string& s) {
  const auto n = static_cast<uint32_t>(s.size());
  const auto* b = reinterpret_cast<const uint8_t*>(&n);
  p->insert(p->end(), b, b + 4);
  p->insert(p->end(), s.begin(), s.end());
}

bool GetString(const std::vector<uint8_t>& p, size_t* at, std::string* out) {
  uint32_t n = 0;
  if (p.size() - *at < 4) return false;
  std::memcpy(&n, p.data() + *at, 4);
  *at += 4;
  if (p.size() - *at < n) return false;
  out->assign(reinterpret_cast<const char*>(p.data() + *at), n);
  *at += n;
  return true;
}

}  // namespace

std::vector<uint8_t> EncodeMoveOrder(const MoveOrder& o) {
  std::vector<uint8_t> p = {static_cast<uint8_t>(o.mode), static_cast<uint8_t>(o.leave_running)};
  PutString(&p, o.where);
  PutString(&p, o.token);
  return p;
}

bool DecodeMoveOrder(const std::vector<uint8_t>& p, MoveOrder* out) {
  if (p.size() < 2 || (p[0] != 1 && p[0] != 2)) return false;
  out->mode = static_cast<MoveOrder::Mode>(p[0]);
  out->leave_running = p[1] != 0;
  size_t at = 2;
  return GetString(p, &at, &out->where) && GetString(p, &at, &out->token) && at == p.size();
}

std::vector<uint8_t> EncodeReport(const Report& r) {
  std::vector<uint8_t> p = {static_cast<uint8_t>(r.kind), static_cast<uint8_t>(r.ok)};
  const auto* b = reinterpret_cast<const uint8_t*>(&r.session);
  p.insert(p.end(), b, b + 8);
  PutString(&p, r.message);
  return p;
}

bool DecodeReport(const std::vector<uint8_t>& p, Report* out) {
  if (p.size() < 10 || (p[0] != 1 && p[0] != 2)) return false;
  out->kind = static_cast<Report::Kind>(p[0]);
  out->ok = p[1] != 0;
  std::memcpy(&out->session, p.data() + 2, 8);
  size_t at = 10;
  return GetString(p, &at, &out->message) && at == p.size();
}

}  // namespace flyt::server::channel
