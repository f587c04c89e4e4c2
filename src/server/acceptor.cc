// Implementation of server/acceptor.h.
#include "server/acceptor.h"

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <random>
#include <thread>

#include "common/log.h"
#include "server/reply_frame.h"
#include "server/tenant_board.h"

namespace flyt::server {
namespace {

// A client that sends nothing for this long after connecting is dropped.
constexpr int kHandshakeTimeoutMs = 30000;
// How long a side channel (callback, paging) waits for its session to reach a worker.
constexpr int kSideChannelWaitMs = 2000;

// After the hello, a socket client either calls (it stays: a worker takes
// it) or says goodbye or closes (it moved to shared memory: no worker).
// Waits without consuming anything; true when a worker should take it.
bool ClientStays(const transport::DetachedConnection& d) {
  if (d.kind != transport::DetachedConnection::Kind::kSocket || !d.state.empty()) return true;
  const int fd = d.fds[0];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    wire::FrameHeader h{};
    ssize_t n = ::recv(fd, &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;  // closed
    if (static_cast<size_t>(n) < sizeof(h)) {
      // Part of a header: wait for the rest.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    return !(h.magic == wire::kMagic && h.op == ops::kOpGoodbye);
  }
}

}  // namespace

void Acceptor::Run(transport::Listener* listener, const transport::TlsServerContext* tls) {
  for (;;) {
    std::unique_ptr<transport::Connection> conn;
    Status s = listener->Accept(&conn);
    if (!s.ok()) {
      FLYT_ERROR("%s: %s", listener->Describe().c_str(), s.message().c_str());
      return;
    }
    std::thread([this, tls, c = std::move(conn)]() mutable {
      if (tls != nullptr) {
        Status st = transport::AcceptTls(*tls, kHandshakeTimeoutMs, &c);
        if (!st.ok()) {
          FLYT_WARN("%s; closing", st.message().c_str());
          return;
        }
      }
      if (emulate_.enabled()) c = transport::WrapEmulated(std::move(c), emulate_);
      Handle(std::move(c));
    }).detach();
  }
}

bool Acceptor::Reply(transport::Connection* conn, const wire::FrameHeader& req, CUresult rc,
                     const wire::Writer& out) {
  return SendReply(conn, req, rc, out.data(), out.size());
}

void Acceptor::Handle(std::unique_ptr<transport::Connection> conn) {
  const std::string peer = conn->Peer();
  conn->SetReceiveTimeout(kHandshakeTimeoutMs);
  wire::FrameHeader h{};
  if (!conn->Receive(&h, sizeof(h)).ok()) return;
  if (h.magic != wire::kMagic || h.payload_len > 4096 ||
      (h.op != ops::kOpHello && h.op != ops::kOpAttachCallbackChannel &&
       h.op != ops::kOpAttachPagingChannel && h.op != ops::kOpResume &&
       h.op != ops::kOpRestoreSession)) {
    FLYT_WARN("connection from %s: not a Flyt handshake; closing", peer.c_str());
    return;
  }
  std::vector<uint8_t> payload(h.payload_len);
  if (!conn->Receive(payload.data(), payload.size()).ok()) return;
  conn->SetReceiveTimeout(0);  // the worker waits for calls as long as the client lives
  if (h.op == ops::kOpAttachCallbackChannel || h.op == ops::kOpAttachPagingChannel) {
    Callback(std::move(conn), h, payload);
  } else if (h.op == ops::kOpResume || h.op == ops::kOpRestoreSession) {
    Moved(std::move(conn), h, payload);
  } else {
    Hello(std::move(conn), h, payload);
  }
}

void Acceptor::Hello(std::unique_ptr<transport::Connection> conn, const wire::FrameHeader& h,
                     const std::vector<uint8_t>& payload) {
  const std::string peer = conn->Peer();
  wire::Reader in(payload.data(), payload.size());
  wire::HelloRequest req{};
  const uint8_t* token = nullptr;
  if (!in.Get(&req) || req.token_len > wire::kMaxTokenLen ||
      (token = in.Skip(req.token_len)) == nullptr) {
    FLYT_WARN("connection from %s: malformed handshake; closing", peer.c_str());
    return;
  }
  channel::Ticket ticket;
  ticket.session = next_session_++;
  std::random_device rd;
  ticket.secret = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
  ticket.client_pid = req.pid;
  wire::Writer out;
  wire::HelloReply rep{wire::kProtocolVersion, state_->driver_version, ticket.session,
                       ticket.secret};
  out.Put(rep);
  std::string refusal = Refusal(req, token);
  out.PutString(refusal);
  if (!refusal.empty()) {
    FLYT_WARN("session %llu from %s (pid %u) refused: %s",
              static_cast<unsigned long long>(ticket.session), peer.c_str(), req.pid,
              refusal.c_str());
    if (Reply(conn.get(), h, CUDA_ERROR_NOT_PERMITTED, out)) {
      // Hang up only after the client has read the refusal and closed (or 2 s):
      // a hang-up right after the reply can reach a shm client first.
      conn->SetReceiveTimeout(2000);
      uint8_t byte = 0;
      conn->Receive(&byte, 1).ok();
    }
    return;
  }
  // The inventory as the share shows it now; the generation tells the
  // worker whether the client must fetch it again.
  ticket.share_generation = state_->board->layout().share_generation.load();
  PutWelcome(out);
  if (!Reply(conn.get(), h, CUDA_SUCCESS, out)) return;
  transport::DetachedConnection detached;
  Status st = conn->Detach(&detached);
  if (!st.ok()) {
    FLYT_WARN("session %llu from %s: %s", static_cast<unsigned long long>(ticket.session),
              peer.c_str(), st.message().c_str());
    return;
  }
  conn.reset();
  if (!ClientStays(detached)) {
    FLYT_DEBUG("session %llu from %s: the client left after the handshake",
               static_cast<unsigned long long>(ticket.session), peer.c_str());
    transport::CloseDetached(&detached);
    return;
  }
  st = pool_->Serve(ticket, &detached);
  if (!st.ok()) {
    FLYT_ERROR("session %llu from %s (pid %u): no worker to serve it: %s",
               static_cast<unsigned long long>(ticket.session), peer.c_str(), req.pid,
               st.message().c_str());
    transport::CloseDetached(&detached);
  }
}

std::string Acceptor::Refusal(const wire::HelloRequest& req, const uint8_t* token) const {
  if (req.protocol_version != wire::kProtocolVersion)
    return "protocol version mismatch: client speaks " + std::to_string(req.protocol_version) +
           ", server speaks " + std::to_string(wire::kProtocolVersion) +
           "; use matching Flyt versions";
  if (std::string(reinterpret_cast<const char*>(token), req.token_len) != state_->token)
    return "wrong token: the server refused the client's credential; set FLYT_TOKEN (or "
           "--token) to the token the server was started with";
  return "";
}

void Acceptor::PutWelcome(wire::Writer& out) const {
  std::vector<ops::DeviceInfo> devices = state_->share.Devices(nullptr);
  out.Put<uint32_t>(static_cast<uint32_t>(devices.size()));
  for (const auto& d : devices) out.Put(d);
  out.PutString(state_->shm_offer);
  out.PutString(state_->boot_id);
  out.Put<uint32_t>((state_->movable_memory ? ops::kServerFeatureMovable : 0u) |
                    ops::kServerFeatureStagedDownload | ops::kServerFeaturePeers);
}

void Acceptor::Moved(std::unique_ptr<transport::Connection> conn, const wire::FrameHeader& h,
                     const std::vector<uint8_t>& payload) {
  const std::string peer = conn->Peer();
  const bool resume = h.op == ops::kOpResume;
  wire::Reader in(payload.data(), payload.size());
  wire::HelloRequest req{};
  const uint8_t* token = nullptr;
  uint64_t key[2] = {0, 0};
  if (!in.Get(&req) || req.token_len > wire::kMaxTokenLen ||
      (token = in.Skip(req.token_len)) == nullptr ||
      (resume && (!in.Get(&key[0]) || !in.Get(&key[1]))) || in.remaining() != 0) {
    FLYT_WARN("connection from %s: malformed %s; closing", peer.c_str(),
              resume ? "resume" : "restore");
    return;
  }
  std::string refusal = Refusal(req, token);
  wire::Writer out;
  if (!refusal.empty()) {
    FLYT_WARN("%s from %s refused: %s", resume ? "resume" : "restore", peer.c_str(),
              refusal.c_str());
    if (resume) out.Put(wire::HelloReply{wire::kProtocolVersion, state_->driver_version, 0, 0});
    out.PutString(refusal);
    Reply(conn.get(), h, CUDA_ERROR_NOT_PERMITTED, out);
    return;
  }
  transport::DetachedConnection detached;
  if (!resume) {
    // A server moves a session here: a worker reads the snapshot and answers.
    channel::Ticket ticket;
    ticket.session = next_session_++;
    std::random_device rd;
    ticket.secret = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
    ticket.client_pid = req.pid;
    ticket.flags = channel::kTicketRestore;
    ticket.share_generation = state_->board->layout().share_generation.load();
    // Accepted: the snapshot may come (a refusal above costs the mover no bytes).
    out.PutString("");
    if (!Reply(conn.get(), h, CUDA_SUCCESS, out)) return;
    Status st = conn->Detach(&detached);
    if (st.ok()) st = pool_->Serve(ticket, &detached);
    if (!st.ok()) {
      FLYT_ERROR("session moved here from %s: no worker to restore it: %s", peer.c_str(),
                 st.message().c_str());
      transport::CloseDetached(&detached);
    }
    return;
  }
  uint64_t session = 0, secret = 0;
  if (!pool_->FindResume(key, &session, &secret)) {
    // Not restored (yet): a checkpointed client asks again until it is.
    out.Put(wire::HelloReply{wire::kProtocolVersion, state_->driver_version, 0, 0});
    out.PutString("no session waits for this client here (yet)");
    Reply(conn.get(), h, CUDA_ERROR_NOT_READY, out);
    return;
  }
  out.Put(wire::HelloReply{wire::kProtocolVersion, state_->driver_version, session, secret});
  out.PutString("");
  PutWelcome(out);
  if (!Reply(conn.get(), h, CUDA_SUCCESS, out)) return;
  Status st = conn->Detach(&detached);
  if (st.ok()) st = pool_->RouteResume(key, &detached);
  if (!st.ok()) {
    FLYT_WARN("session %llu: resume from %s failed: %s", static_cast<unsigned long long>(session),
              peer.c_str(), st.message().c_str());
    transport::CloseDetached(&detached);
  }
}

void Acceptor::Callback(std::unique_ptr<transport::Connection> conn, const wire::FrameHeader& h,
                        const std::vector<uint8_t>& payload) {
  const bool paging = h.op == ops::kOpAttachPagingChannel;
  const char* what = paging ? "paging" : "callback";
  wire::Reader in(payload.data(), payload.size());
  uint32_t version = 0;
  uint64_t session = 0, secret = 0;
  bool parsed = in.Get(&version) && in.Get(&session) && in.Get(&secret) && in.remaining() == 0 &&
                version == wire::kProtocolVersion;
  // A client may dial right after its welcome (movable servers' clients do),
  // while its connection is still on its way to a worker: wait for that.
  bool known = parsed && pool_->KnowsSession(session, secret);
  for (int i = 0; parsed && !known && i < kSideChannelWaitMs / 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    known = pool_->KnowsSession(session, secret);
  }
  if (!known) {
    FLYT_WARN("%s channel from %s refused: unknown session or wrong secret", what,
              conn->Peer().c_str());
    return;
  }
  wire::Writer none;
  if (!Reply(conn.get(), h, CUDA_SUCCESS, none)) return;
  transport::DetachedConnection detached;
  Status st = conn->Detach(&detached);
  if (st.ok())
    st = pool_->RouteCallback(session, secret, &detached,
                              paging ? channel::Type::kPaging : channel::Type::kCallback);
  if (!st.ok()) {
    FLYT_WARN("%s channel of session %llu: %s", what, static_cast<unsigned long long>(session),
              st.message().c_str());
    transport::CloseDetached(&detached);
  }
}

}  // namespace flyt::server
