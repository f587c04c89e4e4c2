// Implementation of transport/ucx_transport.h (built when UCX's headers were found).
#include "transport/ucx_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/ucx_api.h"
#include "transport/ucx_rma.h"

namespace flyt::transport {
namespace {

using Clock = std::chrono::steady_clock;

// Large iovecs go as messages of their own, so the receiver's Receive of exactly that
// many bytes lands them in place (no copy through a staging buffer).
constexpr size_t kOwnMessageBytes = size_t{64} << 10;
constexpr int kMaxIov = 16;
constexpr uint32_t kDetachVersion = 1;
// While spinning, the liveness socket is looked at this often.
constexpr int64_t kSocketCheckNs = 1000000;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

int SpinUs() {
  static const int spin = [] {
    const char* s = std::getenv("FLYT_UCX_SPIN_US");
    if (s == nullptr || *s == '\0') return 50;
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    return (*end == '\0' && v >= 0 && v <= 1000000) ? static_cast<int>(v) : 50;
  }();
  return spin;
}

uint64_t RandomTag() {
  std::random_device rd;
  uint64_t t = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return t == 0 ? 1 : t;
}

// Blocking write of all bytes on a socket (the preface: a few hundred bytes).
Status WriteAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::Error(Errno("send"));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  const size_t at = out->size();
  out->resize(at + 4);
  std::memcpy(out->data() + at, &v, 4);
}
void PutU64(std::vector<uint8_t>* out, uint64_t v) {
  const size_t at = out->size();
  out->resize(at + 8);
  std::memcpy(out->data() + at, &v, 8);
}

class UcxConnection final : public Connection {
 public:
  enum class Role { kClient, kServerMain, kServerWorker };

  UcxConnection(Role role, int sock, std::string peer)
      : role_(role), sock_(sock), peer_(std::move(peer)) {
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    preface_read_ = role != Role::kServerMain;
  }

  ~UcxConnection() override {
    if (!detached_) Shutdown();
    rma_.reset();  // its transfers end first (the socket and stop_fd_ are its watch)
    CloseUcx();
    if (sock_ >= 0) ::close(sock_);
    if (stop_fd_ >= 0) ::close(stop_fd_);
  }

  // --- set-up

  // Client: its own UCP worker, then the preface on the socket.
  Status StartClient() {
    Status st = ucx::Get(&api_);
    if (st.ok()) st = CreateWorker();
    if (!st.ok()) return st;
    my_tag_ = RandomTag();
    UcxPreface p;
    p.tag = my_tag_;
    std::vector<uint8_t> bytes;
    st = WithOwnAddress(p, &bytes);
    if (!st.ok()) return st;
    return WriteAll(sock_, bytes.data(), bytes.size());
  }

  // `head` (a preface or a switch message: its address_len is set here)
  // followed by this worker's UCX address.
  template <typename Head>
  Status WithOwnAddress(Head head, std::vector<uint8_t>* out) {
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    ucs_status_t s = api_->worker_get_address(worker_, &addr, &len);
    if (s != UCS_OK) return Status::Error("ucx: worker address: " + api_->Why(s));
    if (len > kUcxMaxAddress) {
      api_->worker_release_address(worker_, addr);
      return Status::Error("ucx: this worker's address is too large");
    }
    head.address_len = static_cast<uint32_t>(len);
    out->resize(sizeof(head) + len);
    std::memcpy(out->data(), &head, sizeof(head));
    std::memcpy(out->data() + sizeof(head), addr, len);
    api_->worker_release_address(worker_, addr);
    return Status::Ok();
  }

  // Worker process: the state the main process handed over, then step 3.
  Status StartServerWorker(const std::vector<uint8_t>& state) {
    size_t at = 0;
    auto get = [&](void* dst, size_t n) {
      if (state.size() - at < n) return false;
      std::memcpy(dst, state.data() + at, n);
      at += n;
      return true;
    };
    uint32_t version = 0, addr_len = 0, buffered = 0;
    if (!get(&version, 4) || version != kDetachVersion || !get(&raw_sent_, 8) ||
        !get(&raw_recv_, 8) || !get(&peer_tag_, 8) || !get(&addr_len, 4) ||
        addr_len > kUcxMaxAddress || state.size() - at < addr_len)
      return Status::Error("reattach: not a detached ucx:// connection");
    peer_address_.assign(state.begin() + static_cast<std::ptrdiff_t>(at),
                         state.begin() + static_cast<std::ptrdiff_t>(at + addr_len));
    at += addr_len;
    if (!get(&buffered, 4) || state.size() - at != buffered)
      return Status::Error("reattach: not a detached ucx:// connection");
    rbuf_.assign(state.begin() + static_cast<std::ptrdiff_t>(at), state.end());
    rbeg_ = 0;
    std::lock_guard<std::mutex> lock(mu_);
    Status st = ucx::Get(&api_);
    if (st.ok()) st = CreateWorker();
    if (st.ok()) st = ConnectPeerLocked();
    if (!st.ok()) return st;
    my_tag_ = RandomTag();
    UcxSwitch sw;
    sw.raw_bytes = raw_sent_;
    sw.tag = my_tag_;
    std::vector<uint8_t> msg;
    st = WithOwnAddress(sw, &msg);
    if (!st.ok()) return st;
    tx_ucx_ = true;
    switch_msg_ = std::move(msg);
    return PostSwitchLocked();
  }

  // --- Connection

  Status Send(const iovec* iov, int count) override {
    if (count < 0 || count > kMaxIov) return Status::Error("ucx: bad iovec count");
    std::unique_lock<std::mutex> lock(mu_);
    if (!tx_ucx_ && api_ != nullptr) {
      // A client still on the raw stream: has the server switched meanwhile?
      Status st = PollLocked(true);
      if (!st.ok()) return st;
    }
    if (tx_ucx_) return SendUcxLocked(iov, count, &lock);
    Status st = SendRawLocked(iov, count);
    return st.ok() ? st : Gone(st);
  }

  Status Receive(void* dst, size_t n) override {
    auto* out = static_cast<uint8_t*>(dst);
    std::unique_lock<std::mutex> lock(mu_);
    if (!preface_read_) {
      Status st = ReadPrefaceLocked(&lock);
      if (!st.ok()) return st;
    }
    while (n > 0) {
      // Raw bytes first (the stream before the switch), then UCX messages.
      if (rbeg_ < rbuf_.size()) {
        const size_t take = std::min(n, rbuf_.size() - rbeg_);
        std::memcpy(out, rbuf_.data() + rbeg_, take);
        rbeg_ += take;
        out += take;
        n -= take;
        if (rbeg_ == rbuf_.size()) {
          rbuf_.clear();
          rbeg_ = 0;
        }
        continue;
      }
      if (pend_off_ < pending_.size()) {
        const size_t take = std::min(n, pending_.size() - pend_off_);
        std::memcpy(out, pending_.data() + pend_off_, take);
        pend_off_ += take;
        out += take;
        n -= take;
        continue;
      }
      if (rx_ == Rx::kRawUntil && raw_recv_ == peer_raw_total_) rx_ = Rx::kUcx;
      if (rx_ != Rx::kUcx) {
        // Wait for raw bytes (or the switch).
        const uint64_t before = raw_recv_;
        const Rx rx_before = rx_;
        Status st = WaitLocked(&lock, true, [&] {
          return raw_recv_ > before || rx_ != rx_before ||
                 (rx_ == Rx::kRawUntil && raw_recv_ == peer_raw_total_);
        });
        if (!st.ok()) return st;
        continue;
      }
      Status st = ReceiveMessageLocked(&lock, &out, &n);
      if (!st.ok()) return st;
    }
    return Status::Ok();
  }

  void Shutdown() override {
    shutdown_.store(true);
    if (stop_fd_ >= 0) {
      const uint64_t one = 1;
      if (::write(stop_fd_, &one, sizeof(one)) < 0) {
        // Full counter: a wake-up is pending anyway.
      }
    }
    if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);  // the peer sees the hang-up
  }

  void AbandonAfterFork() override {
    // The UCP worker and its descriptors belong to the parent: leak them untouched
    // (the one-sided side's progress thread exists only there too).
    (void)rma_.release();
    if (sock_ >= 0) ::close(sock_);
    if (stop_fd_ >= 0) ::close(stop_fd_);
    sock_ = stop_fd_ = -1;
    worker_ = nullptr;
    ep_ = nullptr;
    detached_ = true;
  }

  RemoteMemory* Rma() override {
    std::lock_guard<std::mutex> lock(rma_mu_);
    if (rma_ == nullptr && api_ != nullptr && role_ != Role::kServerMain && !detached_) {
      rma_ = NewUcxRemoteMemory(api_, role_ == Role::kClient,
                                RmaPeerWatch{sock_, stop_fd_, &shutdown_, peer_});
    }
    return rma_.get();
  }

  void SetReceiveTimeout(int timeout_ms) override {
    timeout_ms_.store(timeout_ms < 0 ? 0 : timeout_ms);
  }
  std::string Peer() const override { return peer_; }

  Status Detach(DetachedConnection* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (role_ != Role::kServerMain || sock_ < 0 || detached_ || !preface_read_)
      return Status::Error("ucx:// connection to " + peer_ + " cannot be handed over");
    out->kind = DetachedConnection::Kind::kUcx;
    out->peer = peer_;
    out->fds = {sock_};
    out->state.clear();
    PutU32(&out->state, kDetachVersion);
    PutU64(&out->state, raw_sent_);
    PutU64(&out->state, raw_recv_);
    PutU64(&out->state, peer_tag_);
    PutU32(&out->state, static_cast<uint32_t>(peer_address_.size()));
    out->state.insert(out->state.end(), peer_address_.begin(), peer_address_.end());
    PutU32(&out->state, static_cast<uint32_t>(rbuf_.size() - rbeg_));
    out->state.insert(out->state.end(), rbuf_.begin() + static_cast<std::ptrdiff_t>(rbeg_),
                      rbuf_.end());
    sock_ = -1;
    detached_ = true;
    return Status::Ok();
  }

 private:
  enum class Rx { kRaw, kRawUntil, kUcx };

  static void OnPeerError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* self = static_cast<UcxConnection*>(arg);
    self->ep_error_ = status;  // under mu_: callbacks run inside our progress calls
  }

  Status CreateWorker() {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // mu_ serializes every call
    ucs_status_t s = api_->worker_create(api_->context, &wp, &worker_);
    if (s != UCS_OK) return Status::Error("ucx: cannot create a UCP worker: " + api_->Why(s));
    s = api_->worker_get_efd(worker_, &efd_);
    if (s != UCS_OK) return Status::Error("ucx: worker wake-up descriptor: " + api_->Why(s));
    return Status::Ok();
  }

  Status ConnectPeerLocked() {
    return ucx::CreateEndpoint(*api_, worker_, peer_address_.data(), peer_address_.size(),
                               &UcxConnection::OnPeerError, this, peer_, &ep_, &peer_errors_);
  }

  void CloseUcx() {
    if (api_ == nullptr || worker_ == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (ep_ != nullptr) {
      ucp_request_param_t p{};
      if (peer_errors_) {  // forced close needs peer-failure handling on the endpoint
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      }
      void* req = api_->ep_close_nbx(ep_, &p);
      if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
        const auto until = Clock::now() + std::chrono::milliseconds(200);
        while (api_->request_check_status(req) == UCS_INPROGRESS && Clock::now() < until)
          api_->worker_progress(worker_);
        api_->request_free(req);
      }
      ep_ = nullptr;
    }
    if (switch_req_ != nullptr) api_->request_free(switch_req_);  // completed by the close
    switch_req_ = nullptr;
    api_->worker_destroy(worker_);
    worker_ = nullptr;
  }

  // A large message to or from memory the server registered once (its staging buffers,
  // RemoteMemory::RegisterLocal) goes with that registration.
  void WithRegistration(const void* p, size_t n, ucp_request_param_t* param) {
    if (n < kOwnMessageBytes || role_ != Role::kServerWorker) return;
    std::lock_guard<std::mutex> lock(rma_mu_);
    if (ucp_mem_h memh = UcxLocalRegistration(rma_.get(), p, n); memh != nullptr) {
      param->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param->memh = memh;
    }
  }

  // Why the peer is not there any more (or why we stopped); fails every later call.
  Status Gone(const Status& why) {
    if (failed_.empty()) failed_ = why.message();
    return Status::Error(failed_);
  }
  Status GoneMessage() {
    if (shutdown_.load()) return Status::Error("connection to " + peer_ + " was shut down");
    if (!failed_.empty()) return Status::Error(failed_);
    return Status::Error(std::string(role_ == Role::kClient ? "flyt-server at " : "client at ") +
                         peer_ + " went away");
  }

  // --- raw stream (before the switch)

  Status SendRawLocked(const iovec* iov, int count) {
    if (!failed_.empty() || shutdown_.load()) return GoneMessage();
    return SendAllOnSocket(sock_, peer_, iov, count, &raw_sent_);
  }

  // Reads what the socket has (never blocks). In the raw phase that is the peer's
  // stream; after the peer switched, only up to its count; after that, nothing: EOF
  // means the peer is gone, bytes are a violation.
  Status ReadSocketLocked() {
    uint8_t tmp[64 << 10];
    for (;;) {
      size_t room = sizeof(tmp);
      if (rx_ == Rx::kRawUntil) room = std::min<uint64_t>(room, peer_raw_total_ - raw_recv_ + 1);
      if (rx_ == Rx::kUcx) room = 1;
      const ssize_t r = ::recv(sock_, tmp, room, MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::Ok();
      if (r < 0) {
        if (errno == ETIMEDOUT)
          return Gone(Status::Error(peer_ + " stopped answering (timed out)"));
        return Gone(Status::Error("receive from " + peer_ + ": " + std::strerror(errno)));
      }
      if (r == 0) return Gone(GoneMessage());
      if (rx_ == Rx::kUcx ||
          (rx_ == Rx::kRawUntil && raw_recv_ + static_cast<uint64_t>(r) > peer_raw_total_)) {
        return Gone(Status::Error(peer_ + ": bytes on the ucx:// socket after the switch to UCX "
                                          "(protocol violation); closing"));
      }
      if (rbeg_ == rbuf_.size()) {
        rbuf_.clear();
        rbeg_ = 0;
      }
      rbuf_.insert(rbuf_.end(), tmp, tmp + r);
      raw_recv_ += static_cast<uint64_t>(r);
      if (static_cast<size_t>(r) < room) return Status::Ok();
    }
  }

  // Server main process: the client's preface, before anything else.
  Status ReadPrefaceLocked(std::unique_lock<std::mutex>* lock) {
    auto need = [&](size_t n) -> Status {
      return WaitLocked(lock, true, [&] { return rbuf_.size() - rbeg_ >= n; });
    };
    Status st = need(sizeof(UcxPreface));
    UcxPreface p;
    if (st.ok()) {
      std::memcpy(&p, rbuf_.data() + rbeg_, sizeof(p));
      st = ValidateUcxPreface(p);
    }
    if (st.ok()) st = need(sizeof(p) + p.address_len);
    // Refused here already (a pure check of bytes; the main process never loads UCX).
    if (st.ok()) st = ucx::CheckWorkerAddress(rbuf_.data() + rbeg_ + sizeof(p), p.address_len);
    if (!st.ok()) return Gone(Status::Error(peer_ + ": " + st.message()));
    const uint8_t* a = rbuf_.data() + rbeg_ + sizeof(p);
    peer_address_.assign(a, a + p.address_len);
    peer_tag_ = p.tag;
    rbeg_ += sizeof(p) + p.address_len;
    raw_recv_ -= sizeof(p) + p.address_len;  // counts stream bytes only
    preface_read_ = true;
    return Status::Ok();
  }

  // --- UCX

  // One round of progress: UCX, and the socket when asked (or always before the switch).
  Status PollLocked(bool check_socket) {
    if (!failed_.empty()) return Status::Error(failed_);
    if (shutdown_.load()) return GoneMessage();
    if (check_socket || rx_ != Rx::kUcx) {
      Status st = ReadSocketLocked();
      if (!st.ok()) return st;
    }
    if (worker_ == nullptr) return Status::Ok();
    while (api_->worker_progress(worker_) != 0) {
    }
    if (ep_error_ != UCS_OK)
      return Gone(Status::Error(GoneMessage().message() + " (UCX: " + api_->Why(ep_error_) + ")"));
    if (switch_req_ != nullptr) {
      const ucs_status_t s = api_->request_check_status(switch_req_);
      if (s != UCS_INPROGRESS) {
        api_->request_free(switch_req_);
        switch_req_ = nullptr;
        if (s != UCS_OK)
          return Gone(Status::Error("ucx: switch to UCX with " + peer_ + ": " + api_->Why(s)));
      }
    }
    if (rx_ == Rx::kRaw) return TakeSwitchLocked();
    return Status::Ok();
  }

  // Before the switch, the first message with our tag is the peer's UcxSwitch.
  Status TakeSwitchLocked() {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = api_->tag_probe_nb(worker_, my_tag_, ~ucp_tag_t{0}, 1, &info);
    if (msg == nullptr) return Status::Ok();
    const bool from_server = role_ == Role::kClient;
    if (info.length > sizeof(UcxSwitch) + kUcxMaxAddress) {
      return Gone(Status::Error(peer_ + ": a switch message of " + std::to_string(info.length) +
                                " bytes (protocol violation); closing"));
    }
    std::vector<uint8_t> bytes(info.length);
    Status st = ReceiveProbedLocked(msg, bytes.data(), bytes.size());
    if (!st.ok()) return st;
    UcxSwitch sw;
    st = ParseUcxSwitch(bytes.data(), bytes.size(), from_server, &sw);
    if (st.ok() && !from_server && sw.tag != peer_tag_) st = Status::Error("tag changed");
    if (st.ok() && sw.raw_bytes < raw_recv_) st = Status::Error("raw byte count went backwards");
    if (!st.ok()) return Gone(Status::Error(peer_ + ": bad switch to UCX: " + st.message()));
    peer_raw_total_ = sw.raw_bytes;
    rx_ = Rx::kRawUntil;
    FLYT_DEBUG("ucx: %s switched to UCX after %llu bytes on the socket%s", peer_.c_str(),
               static_cast<unsigned long long>(sw.raw_bytes),
               peer_errors_ ? "" : " (no UCX peer-failure handling: the socket watches)");
    if (!from_server) return Status::Ok();
    // Client: reach the server's worker, then switch our own direction.
    peer_tag_ = sw.tag;
    peer_address_.assign(bytes.begin() + sizeof(sw), bytes.end());
    st = ConnectPeerLocked();
    if (!st.ok()) return Gone(st);
    UcxSwitch mine;
    mine.raw_bytes = raw_sent_;
    mine.tag = my_tag_;
    tx_ucx_ = true;
    switch_msg_.resize(sizeof(mine));
    std::memcpy(switch_msg_.data(), &mine, sizeof(mine));
    return PostSwitchLocked();
  }

  // Posts our switch message without waiting for it (the peer may not be progressing
  // UCX yet); later sends queue behind it on the same endpoint, PollLocked reaps it.
  Status PostSwitchLocked() {
    ucp_request_param_t p{};
    void* req = api_->tag_send_nbx(ep_, switch_msg_.data(), switch_msg_.size(), peer_tag_, &p);
    if (UCS_PTR_IS_ERR(req)) {
      return Gone(Status::Error("ucx: switch to UCX with " + peer_ + ": " +
                                api_->Why(UCS_PTR_STATUS(req))));
    }
    switch_req_ = req;
    return Status::Ok();
  }

  // Waits (mu_ held; released while sleeping) until ready() or an error; honours the
  // receive timeout when `timed`.
  template <typename Ready>
  Status WaitLocked(std::unique_lock<std::mutex>* lock, bool timed, Ready ready) {
    const auto start = Clock::now();
    const int timeout_ms = timed ? timeout_ms_.load() : 0;
    const auto spin_until = start + std::chrono::microseconds(SpinUs());
    auto last_socket_check = start;
    bool check_socket = true;
    for (;;) {
      Status st = PollLocked(check_socket);
      if (!st.ok()) return st;
      if (ready()) return Status::Ok();
      const auto now = Clock::now();
      check_socket = now - last_socket_check > std::chrono::nanoseconds(kSocketCheckNs);
      if (check_socket) last_socket_check = now;
      if (timeout_ms > 0 && now - start >= std::chrono::milliseconds(timeout_ms))
        return Status::Error("no answer from " + peer_ + " in time (timed out)");
      if (now < spin_until) continue;
      if (worker_ != nullptr) {
        const ucs_status_t s = api_->worker_arm(worker_);
        if (s == UCS_ERR_BUSY) continue;  // events arrived meanwhile
      }
      int slice = 10;
      if (timeout_ms > 0) {
        const auto left = std::chrono::milliseconds(timeout_ms) -
                          std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
        slice = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(slice, left.count())));
      }
      pollfd p[3] = {{sock_, POLLIN | POLLRDHUP, 0}, {stop_fd_, POLLIN, 0}, {efd_, POLLIN, 0}};
      lock->unlock();
      const int rc = ::poll(p, worker_ != nullptr ? 3 : 2, slice);
      lock->lock();
      check_socket = rc > 0 && p[0].revents != 0;
    }
  }

  // Receives a probed message of n bytes into dst (waits for it; a rendezvous transfer
  // may take a while, and the buffer is not ours to leave behind, so no timeout here).
  Status ReceiveProbedLocked(ucp_tag_message_h msg, void* dst, size_t n) {
    ucp_request_param_t p{};
    void* req = api_->tag_msg_recv_nbx(worker_, dst, n, msg, &p);
    return CompleteLocked(req, nullptr, "receive");
  }

  // Waits for one request; when the peer fails (or we shut down), cancels it and waits
  // for the cancellation, so that UCX never writes into a buffer we gave back.
  Status CompleteLocked(void* req, std::unique_lock<std::mutex>* lock, const char* what) {
    if (req == nullptr) return Status::Ok();
    if (UCS_PTR_IS_ERR(req)) {
      return Gone(Status::Error(std::string("ucx ") + what + " with " + peer_ + ": " +
                                api_->Why(UCS_PTR_STATUS(req))));
    }
    ucs_status_t s;
    bool cancelled = false;
    const auto spin_until = Clock::now() + std::chrono::microseconds(SpinUs());
    while ((s = api_->request_check_status(req)) == UCS_INPROGRESS) {
      if (api_->worker_progress(worker_) != 0) continue;
      const bool dead = ep_error_ != UCS_OK || shutdown_.load() || !failed_.empty();
      if (dead && !cancelled) {
        api_->request_cancel(worker_, req);
        cancelled = true;
        continue;
      }
      if (Clock::now() < spin_until) continue;
      // A long transfer, or a peer that does not take it: sleep until UCX or the
      // socket has news, letting other threads of ours in meanwhile.
      if (!cancelled && !ReadSocketLockedForLiveness().ok()) {
        api_->request_cancel(worker_, req);
        cancelled = true;
        continue;
      }
      if (api_->worker_arm(worker_) == UCS_ERR_BUSY) continue;
      pollfd p[3] = {{sock_, POLLIN | POLLRDHUP, 0}, {stop_fd_, POLLIN, 0}, {efd_, POLLIN, 0}};
      const int wait_ms = cancelled ? 1 : 10;
      if (lock != nullptr) lock->unlock();
      ::poll(p, 3, wait_ms);
      if (lock != nullptr) lock->lock();
    }
    api_->request_free(req);
    if (s != UCS_OK) {
      if (!failed_.empty() || shutdown_.load()) return GoneMessage();
      return Gone(
          Status::Error(std::string("ucx ") + what + " with " + peer_ + ": " + api_->Why(s)));
    }
    return Status::Ok();
  }

  // The liveness part of ReadSocketLocked, for waits in the middle of a transfer.
  Status ReadSocketLockedForLiveness() {
    if (rx_ != Rx::kUcx) return ReadSocketLocked();
    pollfd p{sock_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return Status::Ok();
    return ReadSocketLocked();
  }

  // One message per run of small iovecs, one per large iovec; all sent, then all waited for.
  Status SendUcxLocked(const iovec* iov, int count, std::unique_lock<std::mutex>* lock) {
    if (!failed_.empty() || shutdown_.load()) return GoneMessage();
    if (ep_ == nullptr) return Gone(Status::Error("ucx: no endpoint to " + peer_));
    // Each group keeps its own descriptors until its send completes.
    ucp_dt_iov_t descs[kMaxIov];
    int group_start = 0, used = 0;
    void* reqs[kMaxIov + 1];
    int nreq = 0;
    Status st;
    auto post = [&](void* req) {
      if (req == nullptr) return;
      if (UCS_PTR_IS_ERR(req)) {
        if (st.ok())
          st = Status::Error("ucx send to " + peer_ + ": " + api_->Why(UCS_PTR_STATUS(req)));
        return;
      }
      reqs[nreq++] = req;
    };
    // A run of small iovecs: one message (UCX gathers them; eager sends copy at once).
    auto flush = [&] {
      const int in_group = used - group_start;
      if (in_group == 0) return;
      ucp_request_param_t p{};
      if (in_group == 1) {
        post(api_->tag_send_nbx(ep_, descs[group_start].buffer, descs[group_start].length,
                                peer_tag_, &p));
      } else {
        p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
        p.datatype = ucp_dt_make_iov();
        post(api_->tag_send_nbx(ep_, &descs[group_start], static_cast<size_t>(in_group), peer_tag_,
                                &p));
      }
      group_start = used;
    };
    for (int i = 0; i < count && st.ok(); ++i) {
      if (iov[i].iov_len == 0) continue;
      if (iov[i].iov_len >= kOwnMessageBytes) {
        flush();
        ucp_request_param_t p{};
        WithRegistration(iov[i].iov_base, iov[i].iov_len, &p);
        post(api_->tag_send_nbx(ep_, iov[i].iov_base, iov[i].iov_len, peer_tag_, &p));
        continue;
      }
      descs[used++] = {iov[i].iov_base, iov[i].iov_len};
    }
    if (st.ok()) flush();
    for (int i = 0; i < nreq; ++i) {
      Status one = CompleteLocked(reqs[i], lock, "send");
      if (st.ok() && !one.ok()) st = one;
    }
    return st.ok() ? st : Gone(st);
  }

  // Receives the next message: straight into the caller's buffer when it fits, else
  // into pending_ (from which Receive copies what it asked for).
  Status ReceiveMessageLocked(std::unique_lock<std::mutex>* lock, uint8_t** out, size_t* n) {
    ucp_tag_message_h msg = nullptr;
    ucp_tag_recv_info_t info{};
    Status st = WaitLocked(lock, true, [&] {
      msg = api_->tag_probe_nb(worker_, my_tag_, ~ucp_tag_t{0}, 1, &info);
      return msg != nullptr;
    });
    if (!st.ok()) return st;
    if (info.length > kUcxMaxMessage) {
      return Gone(Status::Error(peer_ + ": a message of " + std::to_string(info.length) +
                                " bytes is larger than any frame (protocol violation); closing"));
    }
    const bool direct = info.length <= *n;
    uint8_t empty = 0;
    uint8_t* target = &empty;
    if (info.length > 0 && direct) target = *out;
    if (!direct) {
      pending_.resize(info.length);
      pend_off_ = 0;
      target = pending_.data();
    }
    ucp_request_param_t p{};
    if (direct) WithRegistration(target, info.length, &p);
    st = CompleteLocked(api_->tag_msg_recv_nbx(worker_, target, info.length, msg, &p), lock,
                        "receive");
    if (!st.ok()) {
      pending_.clear();
      pend_off_ = 0;
      return st;
    }
    if (direct) {
      *out += info.length;
      *n -= info.length;
    }
    return Status::Ok();
  }

  const Role role_;
  int sock_ = -1;
  int stop_fd_ = -1;
  int efd_ = -1;
  std::string peer_;
  bool detached_ = false;
  bool preface_read_ = true;
  std::mutex mu_;
  std::atomic<bool> shutdown_{false};
  std::atomic<int> timeout_ms_{0};
  std::string failed_;  // set once: why every later call fails

  const ucx::Api* api_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  ucs_status_t ep_error_ = UCS_OK;
  uint64_t my_tag_ = 0;
  uint64_t peer_tag_ = 0;
  std::vector<uint8_t> peer_address_;
  std::vector<uint8_t> switch_msg_;  // our UcxSwitch, alive until switch_req_ completes
  void* switch_req_ = nullptr;
  bool peer_errors_ = true;  // the endpoint has UCX's peer-failure handling

  bool tx_ucx_ = false;
  Rx rx_ = Rx::kRaw;
  uint64_t raw_sent_ = 0;        // stream bytes sent on the socket
  uint64_t raw_recv_ = 0;        // stream bytes received from the socket
  uint64_t peer_raw_total_ = 0;  // what the peer's switch said it sent there
  std::vector<uint8_t> rbuf_;    // raw bytes received, not yet consumed (from rbeg_)
  size_t rbeg_ = 0;
  std::vector<uint8_t> pending_;  // the rest of a UCX message larger than a Receive
  size_t pend_off_ = 0;

  std::mutex rma_mu_;  // rma_ (its calls lock themselves)
  std::unique_ptr<RemoteMemory> rma_;
};

class UcxListener final : public Listener {
 public:
  UcxListener(std::unique_ptr<Listener> tcp, Address addr)
      : tcp_(std::move(tcp)), addr_(std::move(addr)) {}
  Status Accept(std::unique_ptr<Connection>* out) override {
    std::unique_ptr<Connection> plain;
    Status st = tcp_->Accept(&plain);
    if (!st.ok()) return st;
    DetachedConnection d;
    st = plain->Detach(&d);
    if (!st.ok() || d.fds.size() != 1 || !d.state.empty()) {
      CloseDetached(&d);
      return st.ok() ? Status::Error("ucx: unexpected socket state") : st;
    }
    *out = std::make_unique<UcxConnection>(UcxConnection::Role::kServerMain, d.fds[0], d.peer);
    return Status::Ok();
  }
  void Close() override { tcp_->Close(); }
  std::string Describe() const override {
    const std::string inner = tcp_->Describe();  // tcp://host:port, with the bound port
    return "ucx://" + inner.substr(inner.find("://") + 3);
  }

 private:
  std::unique_ptr<Listener> tcp_;
  Address addr_;
};

}  // namespace

Status ValidateUcxPreface(const UcxPreface& p) {
  if (p.magic != UcxPreface::kMagic)
    return Status::Error("not a ucx:// client (bad preface; is this a Flyt ucx:// client?)");
  if (p.version != UcxPreface::kVersion)
    return Status::Error("ucx:// client speaks preface version " + std::to_string(p.version) +
                         ", this server " + std::to_string(UcxPreface::kVersion));
  if (p.address_len == 0 || p.address_len > kUcxMaxAddress)
    return Status::Error("ucx:// preface with a worker address of " +
                         std::to_string(p.address_len) + " bytes");
  if (p.tag == 0) return Status::Error("ucx:// preface with tag 0");
  return Status::Ok();
}

Status ParseUcxSwitch(const void* bytes, size_t n, bool expect_address, UcxSwitch* p) {
  if (n < sizeof(UcxSwitch))
    return Status::Error("switch message of " + std::to_string(n) + " bytes is truncated");
  std::memcpy(p, bytes, sizeof(*p));
  if (p->magic != UcxSwitch::kMagic) return Status::Error("switch message with bad magic");
  if (p->version != UcxSwitch::kVersion)
    return Status::Error("switch message version " + std::to_string(p->version));
  if (p->tag == 0) return Status::Error("switch message with tag 0");
  if (p->address_len != n - sizeof(UcxSwitch))
    return Status::Error("switch message says its address has " + std::to_string(p->address_len) +
                         " bytes, but " + std::to_string(n - sizeof(UcxSwitch)) + " came");
  if (expect_address && (p->address_len == 0 || p->address_len > kUcxMaxAddress))
    return Status::Error("switch message without a usable worker address");
  if (!expect_address && p->address_len != 0)
    return Status::Error("client switch message with an address");
  return Status::Ok();
}

Status DialUcx(const Address& a, const Liveness& l, std::unique_ptr<Connection>* out,
               bool* retryable) {
  *retryable = false;
  // UCX first: a host without it fails with the reason, not after a connect.
  const ucx::Api* api = nullptr;
  Status st = ucx::Get(&api);
  if (!st.ok()) return st;
  Address tcp = a;
  tcp.kind = Address::Kind::kTcp;
  std::unique_ptr<Connection> plain;
  st = Dial(tcp, l, &plain);  // keepalive and user timeout: the liveness of ucx://
  if (!st.ok()) return Status::Error(st.message() + " (ucx:// handshake socket)");
  DetachedConnection d;
  st = plain->Detach(&d);
  if (!st.ok()) return st;
  auto conn = std::make_unique<UcxConnection>(UcxConnection::Role::kClient, d.fds[0], a.ToString());
  d.fds.clear();
  st = conn->StartClient();
  if (!st.ok()) return Status::Error("connect to " + a.ToString() + ": " + st.message());
  *out = std::move(conn);
  return Status::Ok();
}

Status ListenUcx(const Address& a, std::unique_ptr<Listener>* out) {
  // The main process never runs UCX, but a listener nobody can serve is refused here.
  Status st = ucx::CheckAvailable();
  if (!st.ok()) return st;
  Address tcp = a;
  tcp.kind = Address::Kind::kTcp;
  std::unique_ptr<Listener> inner;
  st = Listen(tcp, &inner);
  if (!st.ok()) return st;
  *out = std::make_unique<UcxListener>(std::move(inner), a);
  return Status::Ok();
}

Status ReattachUcx(DetachedConnection&& d, std::unique_ptr<Connection>* out) {
  if (d.kind != DetachedConnection::Kind::kUcx || d.fds.size() != 1 || d.fds[0] < 0) {
    CloseDetached(&d);
    return Status::Error("reattach: not a detached ucx:// connection");
  }
  auto conn = std::make_unique<UcxConnection>(UcxConnection::Role::kServerWorker, d.fds[0], d.peer);
  d.fds.clear();
  Status st = conn->StartServerWorker(d.state);
  if (!st.ok()) return Status::Error("ucx:// client " + d.peer + ": " + st.message());
  *out = std::move(conn);
  return Status::Ok();
}

}  // namespace flyt::transport
