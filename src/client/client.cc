// Implementation of client/client.h.
#include "client/client.h"

#include "client/client_manager_lookup.h"
#include "client/managed_memory.h"
#include "client/query_cache.h"
#include "client/tls_client.h"

#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "common/log.h"
#include "transport/emulated_transport.h"
#include "transport/shm_transport.h"

namespace flyt::client {
namespace {

// tls:// goes through the TLS layer; every other address through the transport.
Status DialServer(const transport::Address& a, const transport::Liveness& l,
                  std::unique_ptr<transport::Connection>* out) {
  return a.kind == transport::Address::Kind::kTls ? DialTls(a, l, out) : transport::Dial(a, l, out);
}

thread_local CUcontext t_current = nullptr;
thread_local uint32_t t_last_reply_info = 0;
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
thread_local uint64_t t_last_call_seq = 0;  // CallsLocked() at this thread's last Call
// Several servers (client/multi_server.cc): a RouteScope's server (-1: none), and
// the server of the thread's last call or post.
thread_local int t_route = -1;
thread_local int t_last_route = 0;
// SameConnection: the connection generation this thread's requests were built for
// (0: any), and whether one found another.
thread_local uint64_t t_expect_gen = 0;
thread_local bool t_gen_stale = false;
// Under the connection lock: the calling thread's request was built for another
// connection generation than `now` (it is then not sent, and Stale() says so).
bool BuiltForAnotherConnection(uint64_t now) {
  if (t_expect_gen == 0 || t_expect_gen == now) return false;
  t_gen_stale = true;
  return true;
}

// One name per stream: the per-thread default stream as CU_STREAM_PER_THREAD,
// the legacy one as 0.
uint64_t StreamKey(CUstream stream, bool per_thread) {
  auto raw = reinterpret_cast<uintptr_t>(stream);
  if (raw == 0) return per_thread ? 2 : 0;
  return raw == 1 ? 0 : raw;
}

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n > 0 && n < (1 << 30)) ? static_cast<int>(n) : fallback;
}

// A duration setting in microseconds: "0" turns the behaviour off, a value that is not a
// positive number gives the default, and larger values are capped at `max`.
int EnvMicros(const char* name, int fallback, int max) {
  const char* v = std::getenv(name);
  if (v != nullptr && std::strcmp(v, "0") == 0) return 0;
  return std::min(EnvInt(name, fallback), max);
}

constexpr size_t kQueueLimit = 256 << 10;
// Sends may take at most about 1/kSendCostShare of a paced caller's time (see QueueAsync).
constexpr uint64_t kSendCostShare = 8;
constexpr size_t kSmallSendBytes = 16 << 10;  // sends that count towards that cost
constexpr uint64_t kSendCostCapNs = 25000;    // one slow send (a preempted thread) counts so much

}  // namespace

CUcontext CurrentContext() { return t_current; }
CUstreamCaptureMode CurrentCaptureMode() { return t_capture_mode; }
void SetCaptureMode(CUstreamCaptureMode mode) { t_capture_mode = mode; }
uint32_t Client::LastReplyInfo() { return t_last_reply_info; }
void SetCurrentContext(CUcontext ctx) { t_current = ctx; }

int Client::RouteNow() const {
  return t_route >= 0 ? t_route : TagOf(reinterpret_cast<uintptr_t>(t_current));
}
int Client::StreamRoute(CUstream stream) const {
  const uint64_t raw = reinterpret_cast<uintptr_t>(stream);
  return raw > 2 ? TagOf(raw) : RouteNow();
}
int Client::LastRoute() { return t_last_route; }
Client::RouteScope::RouteScope(int server) : saved_(t_route), set_(server >= 0) {
  if (set_) t_route = server;
}
Client::RouteScope::~RouteScope() {
  if (set_) t_route = saved_;
}

void AfterForkInChild() {
  // The child shares the parent's socket: it must never speak on it. As with
  // NVIDIA's driver, CUDA is unusable in a child forked after initialisation.
  // Destroying the connection would shut it down for the parent too (and
  // join threads that only the parent has): close our descriptors, leak the rest.
  // A lock another parent thread held at fork() would stay held forever here:
  // the child starts with fresh ones (no thread of the child holds any yet).
  Client& c = Client::Get();
  new (&c.mu_) std::mutex();
  new (&c.state_mu_) std::mutex();
  new (&c.callback_mu_) std::mutex();
  new (&c.rma_mu_) std::mutex();
  new (&c.stage_mu_) std::mutex();
  c.stage_ = Client::StageArea{};  // the parent's (the child cannot use CUDA)
  c.rma_enabled_ = false;          // the registrations were the parent's connection's
  if (c.conn_ != nullptr) c.conn_->AbandonAfterFork();
  (void)c.conn_.release();
  c.queue_.clear();
  c.broken_ = CUDA_ERROR_NOT_INITIALIZED;
  c.init_rc_ = CUDA_ERROR_NOT_INITIALIZED;
  for (Client* p : c.peers_) {  // the other servers' links: the same
    new (&p->mu_) std::mutex();
    new (&p->state_mu_) std::mutex();
    new (&p->callback_mu_) std::mutex();
    new (&p->rma_mu_) std::mutex();
    new (&p->stage_mu_) std::mutex();
    p->stage_ = Client::StageArea{};
    p->rma_enabled_ = false;
    if (p->conn_ != nullptr) p->conn_->AbandonAfterFork();
    (void)p->conn_.release();
    p->queue_.clear();
    p->broken_ = CUDA_ERROR_NOT_INITIALIZED;
  }
  managed::AfterForkInChild();
}

Client& Client::Get() {
  static Client* client = new Client();  // never destroyed: atexit order is unknown
  return *client;
}

CUresult Client::Fail(const std::string& why) {
  FLYT_ERROR("%s", why.c_str());
  return CUDA_ERROR_NO_DEVICE;
}

CUresult Client::Init() {
  std::call_once(init_once_, [this] {
    pthread_atfork(nullptr, nullptr, AfterForkInChild);
    const char* counts = std::getenv("FLYT_CALL_COUNTS");
    count_calls_ = counts != nullptr && std::strcmp(counts, "1") == 0;
    // Over shm://, how long the wait for a reply busy-polls before it sleeps (the server
    // then has to wake this thread: a futex call there, a wake-up latency here).
    reply_spin_us_ = EnvMicros("FLYT_SHM_REPLY_SPIN_US", 1000, 1000000);
    // Over tcp:// and unix://, the same for the socket (0: block at once).
    socket_spin_us_ = EnvMicros("FLYT_SOCKET_SPIN_US", 200, 1000000);
    // 0: every call goes at once.
    flush_after_ns_ = static_cast<uint64_t>(EnvMicros("FLYT_FLUSH_US", 20, 1 << 30)) * 1000;
    const char* flush_us = std::getenv("FLYT_FLUSH_US");
    flush_adaptive_ = flush_us == nullptr || flush_us[0] == '\0';
    // One-sided copies of pinned memory over ucx:// (client/rma.cc).
    const char* rma = std::getenv("FLYT_RMA");
    rma_enabled_ = rma == nullptr || std::strcmp(rma, "off") != 0;
    rma_min_bytes_ = static_cast<size_t>(EnvInt("FLYT_RMA_MIN_BYTES", 64 << 10));
    const char* server = std::getenv("FLYT_SERVER");
    std::string manager_socket, manager_token;
    if (server != nullptr && server[0] != '\0') {
      server_ = server;  // standalone mode
      // A checkpoint restored on another node: a client manager, where the VM has one,
      // knows where by this address (client/session_move.cc).
      if (server_.find(',') == std::string::npos) NoteFixedEndpoint(server_);
    } else if (ClientManagerPresent(&manager_socket)) {
      Status asked = AskClientManager(manager_socket, EnvInt("FLYT_TIMEOUT_MS", 30000) + 30000,
                                      &server_, &manager_token);
      if (!asked.ok()) {
        init_rc_ = Fail(asked.message());
        return;
      }
    } else {
      server_ = "tcp://127.0.0.1:14833";
    }
    const char* token = std::getenv("FLYT_TOKEN");
    token_ = !manager_token.empty() ? manager_token : token ? token : "";
    // Several servers, "A,B,...": one ordinal list, server 0's GPUs first
    // (client/multi_server.cc). One address is the single server, as always.
    std::vector<std::string> list;
    if (server_.find(',') != std::string::npos) {
      size_t at = 0;
      for (;;) {
        size_t comma = server_.find(',', at);
        std::string one = server_.substr(at, comma == std::string::npos ? comma : comma - at);
        const size_t first = one.find_first_not_of(" \t");  // "A, B" as "A,B"
        const size_t last = one.find_last_not_of(" \t");
        list.push_back(first == std::string::npos ? "" : one.substr(first, last - first + 1));
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
      for (const auto& one : list) {
        if (one.empty()) {
          init_rc_ = Fail("FLYT_SERVER: an empty address in the list '" + server_ + "'");
          return;
        }
      }
      server_ = list[0];
    }
    init_done_ = true;  // lets Call() run the handshake
    init_rc_ = CUDA_SUCCESS;
    CUresult rc = Open();
    if (rc == CUDA_SUCCESS && list.size() > 1) rc = OpenPeers(list);
    if (rc != CUDA_SUCCESS) {
      init_done_ = false;
      init_rc_ = rc;
    }
  });
  return init_rc_;
}

CUresult Client::Open() {
  transport::Address addr;
  Status st = transport::ParseAddress(server_, &addr);
  if (!st.ok()) return Fail("FLYT_SERVER: " + st.message());
  transport::Liveness live;
  live.dead_peer_timeout_ms = EnvInt("FLYT_TIMEOUT_MS", 30000);
  live.connect_timeout_ms = live.dead_peer_timeout_ms < 10000 ? live.dead_peer_timeout_ms : 10000;
  address_ = addr;
  liveness_ = live;
  const bool networked = addr.kind == transport::Address::Kind::kTcp ||
                         addr.kind == transport::Address::Kind::kTls ||
                         addr.kind == transport::Address::Kind::kUcx;
  dial_host_ = networked ? addr.host : "127.0.0.1";
  tls_link_ = addr.kind == transport::Address::Kind::kTls;
  st = DialServer(addr, live, &conn_);
  if (!st.ok())
    return Fail("cannot reach flyt-server at " + server_ + ": " + st.message() +
                ". Start flyt-server there or point FLYT_SERVER (flyt run --server) at it");
  st = transport::WrapFromEnvironment(&conn_);  // FLYT_EMULATE: network emulator
  if (!st.ok()) return Fail(st.message());
  Hello hello;
  CUresult rc = SayHello(&hello);
  if (rc != CUDA_SUCCESS) {
    if (hello.answered) {
      FLYT_ERROR("flyt-server at %s refused this client: %s", server_.c_str(),
                 hello.message.c_str());
      conn_.reset();
      broken_ = rc;
    } else {
      FLYT_ERROR("handshake with flyt-server at %s failed (error %d)", server_.c_str(), rc);
    }
    return rc;
  }
  MoveToSharedMemory(&hello);
  devices_ = std::move(hello.devices);
  driver_version_ =
      hello.rep.driver_version < CUDA_VERSION ? hello.rep.driver_version : CUDA_VERSION;
  session_id_ = hello.rep.session_id;
  session_secret_ = hello.rep.session_secret;
  primaries_.resize(devices_.size());
  FLYT_INFO("connected to flyt-server at %s: session %llu, %zu GPU(s), driver %d", server_.c_str(),
            static_cast<unsigned long long>(hello.rep.session_id), devices_.size(),
            hello.rep.driver_version);
  // A server whose sessions move may ask an idle process to park: that
  // request comes on the callback channel (kOpParkNudge), opened after the
  // first call (the server hands the session to its worker only then).
  if ((hello.features & ops::kServerFeatureMovable) != 0) callback_wanted_.store(true);
  server_features_.store(hello.features);
  return CUDA_SUCCESS;
}

bool Client::ReadDeviceList(wire::Reader& r, std::vector<ops::DeviceInfo>* out) {
  uint32_t n = 0;
  if (!r.Get(&n) || n > kMaxDevices) return false;
  out->resize(n);
  for (auto& d : *out) r.Get(&d);
  return r.ok();
}

CUresult Client::SayHello(Hello* out) {
  wire::Writer w;
  wire::HelloRequest req{wire::kProtocolVersion, CUDA_VERSION, static_cast<uint32_t>(getpid()),
                         static_cast<uint32_t>(token_.size())};
  w.Put(req);
  w.PutBytes(token_.data(), token_.size());
  std::vector<uint8_t> reply;
  CUresult rc = Call("hello", ops::kOpHello, w, ReplySink{&reply});
  wire::Reader r(reply.data(), reply.size());
  if (!r.Get(&out->rep) || !r.GetString(&out->message))
    return rc == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : rc;
  out->answered = true;
  if (rc != CUDA_SUCCESS) return rc;
  if (!ReadDeviceList(r, &out->devices)) return CUDA_ERROR_UNKNOWN;
  // Servers that offer shared memory say where, and which kernel they run on.
  if (!r.GetString(&out->shm_offer) || !r.GetString(&out->boot_id)) {
    out->shm_offer.clear();
    out->boot_id.clear();
  } else if (r.remaining() >= sizeof(uint32_t)) {
    r.Get(&out->features);
  }
  return r.ok() ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

void Client::MoveToSharedMemory(Hello* hello) {
  // FLYT_SHM=off keeps the transport the app was given; an emulated network
  // is never replaced by shared memory, nor is ucx:// (an explicit choice of UCX,
  // which finds shared memory on this host by itself).
  const char* mode = std::getenv("FLYT_SHM");
  const char* emulate = std::getenv("FLYT_EMULATE");
  const char* emulate_file = std::getenv("FLYT_EMULATE_FILE");
  if ((mode != nullptr && std::strcmp(mode, "off") == 0) ||
      address_.kind == transport::Address::Kind::kShm ||
      address_.kind == transport::Address::Kind::kUcx || hello->shm_offer.empty() ||
      (emulate != nullptr && *emulate != '\0') ||
      (emulate_file != nullptr && *emulate_file != '\0'))
    return;
  transport::Address shm;
  if (!transport::ParseAddress(hello->shm_offer, &shm).ok() ||
      shm.kind != transport::Address::Kind::kShm)
    return;
  const std::string local_boot = transport::KernelBootId();
  if (local_boot.empty() || local_boot != hello->boot_id) return;  // another host or VM
  std::unique_ptr<transport::Connection> shm_conn;
  Status st = transport::Dial(shm, liveness_, &shm_conn);
  if (!st.ok()) {
    FLYT_INFO(
        "flyt-server offers shared memory at %s, which this process cannot reach (%s); "
        "staying on %s",
        hello->shm_offer.c_str(), st.message().c_str(), server_.c_str());
    return;
  }
  std::unique_ptr<transport::Connection> old = std::move(conn_);
  conn_ = std::move(shm_conn);
  ++conn_gen_;
  Hello upgraded;
  CUresult rc = SayHello(&upgraded);
  if (rc != CUDA_SUCCESS) {
    FLYT_INFO("shared memory at %s refused this client (error %d); staying on %s",
              hello->shm_offer.c_str(), rc, server_.c_str());
    conn_ = std::move(old);
    ++conn_gen_;
    broken_ = CUDA_SUCCESS;
    return;
  }
  // The first session owns nothing yet: end it.
  wire::FrameHeader bye{wire::kMagic, ops::kOpGoodbye, 0, next_call_++, 0, 0, 0, 0};
  iovec iov{&bye, sizeof(bye)};
  if (!old->Send(&iov, 1).ok()) {
    // It ends when the connection closes anyway.
  }
  old.reset();
  FLYT_INFO("flyt-server at %s is on this host: using shared memory (%s)", server_.c_str(),
            hello->shm_offer.c_str());
  address_ = shm;
  server_ = hello->shm_offer;
  *hello = std::move(upgraded);
}

CUresult Client::SendLocked(const wire::FrameHeader& h, const wire::Writer& req, const void* bulk,
                            size_t bulk_len) {
  iovec iov[4];
  int n = 0;
  if (!queue_.empty()) iov[n++] = {queue_.data(), queue_.size()};
  iov[n++] = {const_cast<wire::FrameHeader*>(&h), sizeof(h)};
  if (req.size() > 0) iov[n++] = {const_cast<uint8_t*>(req.data()), req.size()};
  if (bulk_len > 0) iov[n++] = {const_cast<void*>(bulk), bulk_len};
  return SendMessageLocked(iov, n);
}

CUresult Client::SendMessageLocked(iovec* iov, int n) {
  uint64_t t0 = NowNs();
  Status st = conn_->Send(iov, n);
  sends_.fetch_add(1, std::memory_order_relaxed);
  last_send_ns_ = NowNs();
  // What a small send costs this thread, averaged over the last few (1/8 weight each);
  // bulk payloads cost their bytes, not the transport's per-message price.
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) bytes += iov[i].iov_len;
  if (bytes <= kSmallSendBytes) {
    uint64_t cost = std::min<uint64_t>(last_send_ns_ - t0, kSendCostCapNs);
    send_cost_ns_ = send_cost_ns_ - send_cost_ns_ / 8 + cost / 8;
  }
  queue_.clear();
  if (!st.ok()) return MarkLostLocked(nullptr, st.message());
  return CUDA_SUCCESS;
}

CUresult Client::MarkLostLocked(const char* during, const std::string& why) {
  if (broken_ == CUDA_SUCCESS) {
    FLYT_ERROR(
        "lost the connection to flyt-server at %s%s%s (%s): the GPU's state for this process "
        "is gone; every further CUDA call fails with CUDA_ERROR_DEVICE_UNAVAILABLE; restart "
        "the application once the server is back",
        server_.c_str(), during != nullptr ? " during " : "", during != nullptr ? during : "",
        why.c_str());
  }
  broken_ = CUDA_ERROR_DEVICE_UNAVAILABLE;
  return broken_;
}

CUresult Client::SyncContextLocked() {
  // The server runs a session's calls on one thread: before a call, that
  // thread takes on the calling client thread's context and capture mode.
  CUcontext cur = t_current;
  if (member_) {  // several servers: this server's own handle, or one of its contexts
    const uint64_t raw = reinterpret_cast<uintptr_t>(cur);
    cur =
        raw != 0 && TagOf(raw) == index_ ? reinterpret_cast<CUcontext>(Untag(raw)) : fallback_ctx_;
  }
  if (cur != nullptr && cur != sent_ctx_) {
    sent_ctx_ = cur;
    uint64_t raw = reinterpret_cast<uintptr_t>(cur);
    QueueLocked(ops::kOpSetCurrentContext, &raw, sizeof(raw));
  }
  if (t_capture_mode != sent_capture_mode_) {
    sent_capture_mode_ = t_capture_mode;
    uint32_t raw = static_cast<uint32_t>(t_capture_mode);
    QueueLocked(ops::kOpSetCaptureMode, &raw, sizeof(raw));
  }
  return CUDA_SUCCESS;
}

void Client::QueueLocked(uint16_t op, const void* payload, uint32_t n) {
  wire::FrameHeader h{wire::kMagic, op, 0, next_call_++, n, 0, 0, 0};
  size_t at = queue_.size();
  queue_.resize(at + sizeof(h) + n);
  std::memcpy(queue_.data() + at, &h, sizeof(h));
  std::memcpy(queue_.data() + at + sizeof(h), payload, n);
}

void Client::TraceCall(const char* name, const char* cls, uint64_t t0_ns) {
  FLYT_INFO("trace %s %s %.2f us", name, cls, static_cast<double>(NowNs() - t0_ns) / 1000.0);
}

CUresult Client::Post(const char* name, uint16_t op, const wire::Writer& req, uint16_t flags,
                      const void* bulk, size_t bulk_len) {
  if (!peers_.empty()) [[unlikely]] {
    const int k = RouteCall(name, op, req);
    t_last_route = k < 0 ? 0 : k;
    if (k < 0) return static_cast<CUresult>(-k);
    if (k != 0) return peers_[k - 1]->Post(name, op, req, flags, bulk, bulk_len);
  }
  if (managed::Any()) managed::BeforeDeviceWork();  // the host's writes reach the GPU first
  uint64_t t0 = log::TraceCalls() ? NowNs() : 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (BuiltForAnotherConnection(conn_gen_.load())) [[unlikely]]
    return CUDA_ERROR_NOT_READY;
  SyncContextLocked();
  async_calls_.fetch_add(1, std::memory_order_relaxed);
  if (count_calls_) ++async_by_name_[name];
  wire::FrameHeader h{wire::kMagic,
                      op,
                      flags,
                      NextAppCallIdLocked(),
                      static_cast<uint32_t>(req.size() + bulk_len),
                      0,
                      0,
                      0};
  CUresult rc = CUDA_SUCCESS;
  if (bulk_len > 4096 || queue_.size() + sizeof(h) + req.size() > kQueueLimit) {
    rc = SendLocked(h, req, bulk, bulk_len);
  } else {
    size_t at = queue_.size();
    queue_.resize(at + sizeof(h) + req.size() + bulk_len);
    std::memcpy(queue_.data() + at, &h, sizeof(h));
    if (req.size() > 0) std::memcpy(queue_.data() + at + sizeof(h), req.data(), req.size());
    if (bulk_len > 0) std::memcpy(queue_.data() + at + sizeof(h) + req.size(), bulk, bulk_len);
    // Calls that come faster than flush_after_ns_ travel together; a call
    // after a pause goes at once, so the GPU starts on it while the app
    // prepares the next (a decoder's launches, one every ~15 us of Python).
    // Where sends are dear (TCP: a system call through the network stack, ~10 us), the
    // queue also waits until sending costs at most 1/kSendCostShare of the caller's time.
    uint64_t wait_ns = flush_after_ns_;
    if (flush_adaptive_) wait_ns = std::max(wait_ns, kSendCostShare * send_cost_ns_);
    if (NowNs() - last_send_ns_ >= wait_ns) rc = FlushLocked();
  }
  if (t0 != 0) TraceCall(name, "ASYNC", t0);
  return rc;
}

void Client::CaptureEnded() {
  int n = active_captures_.load(std::memory_order_acquire);
  while (n > 0 && !active_captures_.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
  }
}

void Client::NoteStreamDrained(CUstream stream, bool per_thread) {
  if (!peers_.empty()) return;  // several servers: the calls are not all counted here
  std::lock_guard<std::mutex> lock(mu_);
  if (CallsLocked() != t_last_call_seq) return;  // another call came in between
  drained_ = Drained{true, StreamKey(stream, per_thread), t_last_call_seq};
}

bool Client::StreamDrained(CUstream stream, bool per_thread) {
  if (!peers_.empty()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return drained_.valid && drained_.seq == CallsLocked() &&
         drained_.stream == StreamKey(stream, per_thread) && broken_ == CUDA_SUCCESS;
}

Client::CallStats Client::Stats() const {
  return CallStats{sync_calls_.load(std::memory_order_relaxed),
                   async_calls_.load(std::memory_order_relaxed),
                   sends_.load(std::memory_order_relaxed)};
}

std::string Client::CallCounts() {
  struct Row {
    uint64_t n;
    const char* kind;
    const char* name;
  };
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, n] : sync_by_name_) rows.push_back({n, "SYNC", name});
    for (const auto& [name, n] : async_by_name_) rows.push_back({n, "ASYNC", name});
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.n > b.n; });
  std::string out;
  for (const Row& r : rows)
    out += std::string(r.kind) + " " + std::to_string(r.n) + " " + r.name + "\n";
  return out;
}

CUresult Client::FlushLocked() {
  if (queue_.empty() || broken_ != CUDA_SUCCESS) return broken_;
  iovec iov{queue_.data(), queue_.size()};
  return SendMessageLocked(&iov, 1);
}

namespace {
std::atomic<void (*)(uint64_t)> g_call_hook{nullptr};
}  // namespace

void Client::SetCallHook(void (*hook)(uint64_t call_id)) { g_call_hook.store(hook); }

uint64_t Client::NextAppCallIdLocked() {
  uint64_t id = next_call_++;
  if (auto* hook = g_call_hook.load(std::memory_order_relaxed)) hook(id);
  return id;
}

CUresult Client::Flush() {
  for (Client* p : peers_) p->Flush();
  std::lock_guard<std::mutex> lock(mu_);
  return FlushLocked();
}

namespace {
// Calls that only wait for device work (generic ids, protocol/api_list.h).
bool WaitsOnly(uint16_t op) {
  return op == 100 || op == 113 || op == 114 || op == 134 || op == 135;
}
}  // namespace

CUresult Client::Call(const char* name, uint16_t op, const wire::Writer& req, ReplySink sink,
                      uint16_t flags) {
  if (!peers_.empty()) [[unlikely]] {  // several servers: the call goes where it is routed
    const int k = RouteCall(name, op, req);
    t_last_route = k < 0 ? 0 : k;
    if (k < 0) return static_cast<CUresult>(-k);
    if (k != 0) return peers_[k - 1]->Call(name, op, req, sink, flags);
  }
  CUresult rc = CallManaged(name, op, req, sink, flags);
  // After the first call was answered (the session has its worker then):
  // the callback channel of a movable server's client (see Init).
  if (callback_wanted_.load(std::memory_order_relaxed) &&
      callback_wanted_.exchange(false, std::memory_order_acq_rel)) {
    CUresult cb = EnsureCallbackChannel();
    if (cb != CUDA_SUCCESS)
      FLYT_WARN("no callback channel (error %d): this process moves only when it calls CUDA", cb);
  }
  return rc;
}

CUresult Client::CallManaged(const char* name, uint16_t op, const wire::Writer& req, ReplySink sink,
                             uint16_t flags) {
  if (!managed::Any()) return CallUnhooked(name, op, req, sink, flags);
  // Managed memory: the host's writes reach the GPU before device work, and
  // once work is known done, pages it may have changed are fetched again.
  const bool waits = WaitsOnly(op);
  const bool copies_back =
      op == ops::kOpCopyFromDevice || op == ops::kOpCopy3D || op == ops::kOpCopyFromDeviceStaged;
  if (!waits) {
    managed::BeforeDeviceWork();
  } else {
    managed::FlushHostWrites();  // a kernel may be waiting for them
  }
  const uint64_t epoch = managed::Epoch();
  CUresult rc = CallUnhooked(name, op, req, sink, flags);
  // All work done: a cuCtxSynchronize with nothing sent meanwhile, with one server
  // (with several, the others' work may still run).
  if (rc == CUDA_SUCCESS && (waits || copies_back))
    managed::AfterCompletion(op == 100 && managed::Epoch() == epoch && !Get().multi());
  return rc;
}

CUresult Client::CallUnhooked(const char* name, uint16_t op, const wire::Writer& req,
                              ReplySink sink, uint16_t flags) {
  uint64_t t0 = log::TraceCalls() ? NowNs() : 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (BuiltForAnotherConnection(conn_gen_.load())) [[unlikely]]
    return CUDA_ERROR_NOT_READY;
  return CallLocked(name, op, req, sink, flags, t0);
}

Client::SameConnection::SameConnection(uint64_t gen) : saved_(t_expect_gen) {
  t_expect_gen = gen;
  t_gen_stale = false;
}
Client::SameConnection::~SameConnection() { t_expect_gen = saved_; }
bool Client::SameConnection::Stale() { return t_gen_stale; }

CUresult Client::CallLocked(const char* name, uint16_t op, const wire::Writer& req, ReplySink sink,
                            uint16_t flags, uint64_t t0) {
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (op != ops::kOpHello) SyncContextLocked();
  sync_calls_.fetch_add(1, std::memory_order_relaxed);
  t_last_call_seq = CallsLocked();
  if (count_calls_) ++sync_by_name_[name];
  uint64_t id = NextAppCallIdLocked();
  wire::FrameHeader h{wire::kMagic,
                      op,
                      static_cast<uint16_t>(flags | wire::kFlagWantReply),
                      id,
                      static_cast<uint32_t>(req.size()),
                      0,
                      0,
                      0};
  CUresult rc = SendLocked(h, req, nullptr, 0);
  if (rc != CUDA_SUCCESS) return rc;
  // Creating or destroying a context changes what the server's thread has
  // current: the next call says again which context it runs in.
  if (op == ops::kOpCtxCreate || op == ops::kOpCtxDestroy) sent_ctx_ = nullptr;
  // A connection (the first, or a new one after a move to shm:// or another server)
  // waits for replies the way this process's calls wait natively: spinning, for a while.
  if (reply_spin_gen_ != conn_gen_.load(std::memory_order_relaxed)) {
    reply_spin_gen_ = conn_gen_.load(std::memory_order_relaxed);
    transport::SetShmReceiveSpin(conn_.get(), reply_spin_us_);
    conn_->SetSocketSpin(socket_spin_us_);
  }
  if (sink.staged != nullptr) {
    rc = ReceiveStagedLocked(name, sink);
    if (rc != CUDA_SUCCESS) return rc;
  }
  wire::FrameHeader rep{};
  rc = ReceiveReplyLocked(name, id, sink, &rep);
  if (rc != CUDA_SUCCESS) return rc;
  // The tenant's share changed on the server: the locally answered device
  // attributes (SM count, memory) follow it from now on.
  if ((rep.info & wire::kReplyConfigChanged) && op != ops::kOpDeviceInfo) RefreshDevicesLocked();
  if (t0 != 0) TraceCall(name, "SYNC", t0);
  if (t0 != 0 && rep.status != CUDA_SUCCESS)
    FLYT_INFO("trace %s answered CUDA error %u", name, static_cast<unsigned>(rep.status));
  t_last_reply_info = rep.info;
  if (rep.deferred_status != CUDA_SUCCESS) {
    FLYT_DEBUG("%s: reporting deferred error %u of an earlier asynchronous call", name,
               rep.deferred_status);
    return static_cast<CUresult>(rep.deferred_status);
  }
  return static_cast<CUresult>(rep.status);
}

// The chunks of a staged device-to-host copy, announced before the reply: each is
// copied out of its slot, then acked so that the server may write that slot again.
// A notice that reports a failure ends them (the reply carries the error).
CUresult Client::ReceiveStagedLocked(const char* name, const ReplySink& sink) {
  for (uint64_t i = 0; i < sink.staged_chunks; ++i) {
    ops::StagedNotice notice{};
    Status st = conn_->Receive(&notice, sizeof(notice));
    if (!st.ok()) return MarkLostLocked(name, st.message());
    if (notice.index != i) return MarkLostLocked(name, "malformed staged-copy notice");
    if (notice.status != CUDA_SUCCESS) break;
    (*sink.staged)(i);
    uint64_t ack = i;
    iovec iov{&ack, sizeof(ack)};
    if (CUresult rc = SendMessageLocked(&iov, 1); rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

CUresult Client::ReceiveReplyLocked(const char* name, uint64_t id, ReplySink sink,
                                    wire::FrameHeader* out) {
  wire::FrameHeader& rep = *out;
  Status st = conn_->Receive(&rep, sizeof(rep));
  while (st.ok() && rep.magic == wire::kMagic && rep.op == ops::kOpDeviceOutput &&
         rep.call_id == 0 && rep.payload_len <= wire::kMaxPayload) {
    // Device printf output that the call flushed: it belongs on our stdout.
    std::vector<uint8_t> text(rep.payload_len);
    st = conn_->Receive(text.data(), text.size());
    // Through the app's own stdio stream, as NVIDIA's driver does, so that the
    // order with the app's printf output is the native one.
    if (st.ok()) std::fwrite(text.data(), 1, text.size(), stdout);
    if (st.ok()) st = conn_->Receive(&rep, sizeof(rep));
  }
  bool malformed = st.ok() && (rep.magic != wire::kMagic || !(rep.flags & wire::kFlagReply) ||
                               rep.call_id != id || rep.payload_len > wire::kMaxPayload);
  if (st.ok() && !malformed) {
    if (sink.raw != nullptr && rep.status == CUDA_SUCCESS &&
        !((rep.info & wire::kReplyCaptured) && rep.payload_len == 0)) {
      if (rep.payload_len != sink.raw_size) {
        malformed = true;
      } else {
        st = conn_->Receive(sink.raw, sink.raw_size);
      }
    } else {
      std::vector<uint8_t> scratch;
      std::vector<uint8_t>* dst = sink.vec != nullptr ? sink.vec : &scratch;
      dst->resize(rep.payload_len);
      st = conn_->Receive(dst->data(), rep.payload_len);
    }
  }
  if (!st.ok() || malformed)
    return MarkLostLocked(name, malformed ? "malformed reply" : st.message());
  // The operator moves this process's session: every call sent so far is
  // answered, so the session can go now (client/session_move.cc).
  if (rep.info & wire::kReplyMoveWanted) ParkLocked();
  return CUDA_SUCCESS;
}

void Client::RefreshDevicesLocked() {
  // The session may now run in another (green) context: functions fetched for
  // the old one, and occupancy for the old SM count, are asked again.
  QueryCache::Get().Clear();
  uint64_t id = next_call_++;
  wire::FrameHeader h{wire::kMagic, ops::kOpDeviceInfo, wire::kFlagWantReply, id, 0, 0, 0, 0};
  wire::Writer none;
  if (SendLocked(h, none, nullptr, 0) != CUDA_SUCCESS) return;
  wire::FrameHeader rep{};
  std::vector<uint8_t> reply;
  if (ReceiveReplyLocked("device inventory", id, ReplySink{&reply}, &rep) != CUDA_SUCCESS) return;
  wire::Reader r(reply.data(), reply.size());
  uint32_t n = 0;
  if (rep.status != CUDA_SUCCESS || !r.Get(&n) || n != devices_.size()) return;
  std::vector<ops::DeviceInfo> devices(n);
  for (auto& d : devices)
    if (!r.Get(&d)) return;
  UpdateDevicesLocked(devices);
  FLYT_INFO("the tenant's share changed: %d SMs, %llu bytes of device memory",
            n > 0 ? devices_[0].attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] : 0,
            n > 0 ? static_cast<unsigned long long>(devices_[0].total_mem) : 0ull);
}

// --- host functions

void Client::UpdateDevicesLocked(const std::vector<ops::DeviceInfo>& devices) {
  if (devices.size() != devices_.size()) return;
  for (size_t i = 0; i < devices.size(); ++i) {
    const ops::DeviceInfo& d = devices[i];
    // Other threads read these without a lock (cuDeviceGetAttribute): only
    // what changed is stored, one aligned word at a time.
    ops::DeviceInfo& mine = devices_[i];
    for (int a = 0; a < ops::kMaxDeviceAttribute; ++a) {
      if (d.attributes[a] != __atomic_load_n(&mine.attributes[a], __ATOMIC_RELAXED))
        __atomic_store_n(&mine.attributes[a], d.attributes[a], __ATOMIC_RELAXED);
    }
    if (d.total_mem != __atomic_load_n(&mine.total_mem, __ATOMIC_RELAXED))
      __atomic_store_n(&mine.total_mem, d.total_mem, __ATOMIC_RELAXED);
  }
}

CUresult Client::DialSideChannel(uint16_t op, const char* what,
                                 std::unique_ptr<transport::Connection>* out) {
  std::unique_ptr<transport::Connection> conn;
  Status st = DialServer(address_, liveness_, &conn);
  if (st.ok()) st = transport::WrapFromEnvironment(&conn);
  wire::Writer w;
  w.Put<uint32_t>(wire::kProtocolVersion);
  w.Put<uint64_t>(session_id_);
  w.Put<uint64_t>(session_secret_);
  wire::FrameHeader h{
      wire::kMagic, op, wire::kFlagWantReply, 0, static_cast<uint32_t>(w.size()), 0, 0, 0};
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t*>(w.data()), w.size()}};
  wire::FrameHeader rep{};
  if (st.ok()) st = conn->Send(iov, 2);
  if (st.ok()) st = conn->Receive(&rep, sizeof(rep));
  if (!st.ok() || rep.magic != wire::kMagic || rep.status != CUDA_SUCCESS) {
    FLYT_ERROR("cannot open the %s channel to flyt-server at %s: %s", what, server_.c_str(),
               st.ok() ? "refused" : st.message().c_str());
    return CUDA_ERROR_DEVICE_UNAVAILABLE;
  }
  *out = std::move(conn);
  return CUDA_SUCCESS;
}

CUresult Client::EnsureCallbackChannel() {
  std::lock_guard<std::mutex> lock(callback_mu_);
  if (callback_channel_) return CUDA_SUCCESS;
  std::unique_ptr<transport::Connection> conn;
  CUresult rc = DialSideChannel(ops::kOpAttachCallbackChannel, "host-function", &conn);
  if (rc != CUDA_SUCCESS) return rc;
  std::shared_ptr<transport::Connection> shared(std::move(conn));
  callback_conn_ = shared;
  const uint64_t generation = ++callback_generation_;
  std::thread([this, shared, generation] { ServeCallbacks(shared, generation); }).detach();
  callback_channel_ = true;
  return CUDA_SUCCESS;
}

void Client::ServeCallbacks(std::shared_ptr<transport::Connection> conn, uint64_t generation) {
  std::vector<uint8_t> payload;
  for (;;) {
    wire::FrameHeader h{};
    if (!conn->Receive(&h, sizeof(h)).ok() || h.magic != wire::kMagic ||
        h.payload_len > wire::kMaxPayload)
      break;
    payload.resize(h.payload_len);
    if (!conn->Receive(payload.data(), payload.size()).ok()) break;
    wire::FrameHeader done{wire::kMagic, ops::kOpHostFuncDone, 0, h.call_id, 0, 0, 0, 0};
    const void* reply = nullptr;
    if (h.op == ops::kOpRunHostFunc && h.payload_len == 0) {
      RunHostFunc(h.call_id, (h.flags & wire::kFlagPersistent) != 0);
    } else if (h.op == ops::kOpDeliverBytes && h.payload_len >= 8) {
      // A graph's copy to the host: the bytes land where the app asked.
      uint64_t dst = 0;
      std::memcpy(&dst, payload.data(), 8);
      std::memcpy(reinterpret_cast<void*>(dst), payload.data() + 8, h.payload_len - 8);
    } else if (h.op == ops::kOpParkNudge && h.payload_len == 0) {
      // A move waits: ask on a thread of its own, so that this channel stays
      // free for the host functions the park's drain may run.
      std::thread([this] {
        wire::Writer w;
        Call("move-poll", ops::kOpMovePoll, w, ReplySink{});
      }).detach();
    } else if (h.op == ops::kOpFetchBytes && h.payload_len == 16) {
      // A graph's copy from the host: send what the buffer holds now.
      uint64_t src = 0, len = 0;
      std::memcpy(&src, payload.data(), 8);
      std::memcpy(&len, payload.data() + 8, 8);
      if (len > wire::kMaxPayload) break;
      reply = reinterpret_cast<const void*>(src);
      done.payload_len = static_cast<uint32_t>(len);
    } else {
      break;
    }
    iovec iov[2] = {{&done, sizeof(done)}, {const_cast<void*>(reply), done.payload_len}};
    if (!conn->Send(iov, done.payload_len > 0 ? 2 : 1).ok()) break;
  }
  // The server is gone: queued host functions will never be asked for. (A
  // session that moved has a channel of a later generation already. A move
  // under way holds the connection lock until the new channel is up: the old
  // server closes this one as soon as the session has left it.)
  std::lock_guard<std::mutex> conn_lock(mu_);
  std::lock_guard<std::mutex> lock(callback_mu_);
  if (generation != callback_generation_) return;
  callback_conn_.reset();
  callback_channel_ = false;
  host_funcs_.clear();
  host_funcs_per_stream_.clear();
  host_funcs_cv_.notify_all();
}

void Client::RunHostFunc(uint64_t id, bool persistent) {
  HostFunc call{};
  {
    std::lock_guard<std::mutex> lock(callback_mu_);
    auto it = host_funcs_.find(id);
    if (it == host_funcs_.end()) return;
    if (persistent) {
      call.fn = it->second.fn;  // a graph node: it runs again at the next launch
    } else {
      call = std::move(it->second);
      host_funcs_.erase(it);
    }
  }
  // The stream's earlier work is done: the function sees what it wrote.
  if (managed::Any()) managed::AfterCompletion(false);
  call.fn();
  if (persistent) return;
  std::lock_guard<std::mutex> lock(callback_mu_);
  if (--host_funcs_per_stream_[call.stream] <= 0) host_funcs_per_stream_.erase(call.stream);
  host_funcs_cv_.notify_all();
}

uint64_t Client::RegisterGraphHostFunc(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(callback_mu_);
  uint64_t id = next_host_func_++;
  host_funcs_[id] = HostFunc{std::move(fn), 0};
  return id;
}

void Client::WaitHostFuncs(CUstream stream) {
  if (!peers_.empty()) [[unlikely]] {
    const int k = StreamRoute(stream);
    if (k > 0 && k < server_count())
      return peers_[k - 1]->WaitHostFuncs(
          reinterpret_cast<CUstream>(Untag(reinterpret_cast<uintptr_t>(stream))));
  }
  uint64_t key = reinterpret_cast<uintptr_t>(stream);
  {
    std::lock_guard<std::mutex> lock(callback_mu_);
    bool none = key == 0 ? host_funcs_per_stream_.empty() : host_funcs_per_stream_.count(key) == 0;
    if (none) return;
  }
  Flush();  // the host functions may still sit in our queue
  std::unique_lock<std::mutex> lock(callback_mu_);
  host_funcs_cv_.wait(lock, [&] {
    return key == 0 ? host_funcs_per_stream_.empty() : host_funcs_per_stream_.count(key) == 0;
  });
}

CUresult Client::EnqueueHostFunc(CUstream stream, std::function<void()> fn, bool per_thread) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!peers_.empty()) [[unlikely]] {  // the stream's server runs it through its own channel
    const uint64_t raw = reinterpret_cast<uintptr_t>(stream);
    const int k = StreamRoute(stream);
    if (k >= server_count()) return CUDA_ERROR_INVALID_HANDLE;
    if (k > 0)
      return peers_[k - 1]->EnqueueHostFunc(reinterpret_cast<CUstream>(Untag(raw)), std::move(fn),
                                            per_thread);
  }
  CUresult rc = EnsureCallbackChannel();
  if (rc != CUDA_SUCCESS) return rc;
  uint64_t id = 0;
  uint64_t key = reinterpret_cast<uintptr_t>(stream);
  {
    std::lock_guard<std::mutex> lock(callback_mu_);
    id = next_host_func_++;
    host_funcs_[id] = HostFunc{std::move(fn), key};
    ++host_funcs_per_stream_[key];
  }
  wire::Writer w;
  w.Put<uint64_t>(key);
  w.Put<uint64_t>(id);
  // Synchronous: the reply says whether the function was captured into a graph.
  rc = Call("cuLaunchHostFunc", ops::kOpHostFunc, w, ReplySink{},
            per_thread ? wire::kFlagPerThread : 0);
  bool pending = rc == CUDA_SUCCESS && !(LastReplyInfo() & wire::kReplyCaptured);
  if (!pending) {  // captured (runs with the graph) or failed: nothing to wait for
    std::lock_guard<std::mutex> lock(callback_mu_);
    if (--host_funcs_per_stream_[key] <= 0) host_funcs_per_stream_.erase(key);
    if (rc != CUDA_SUCCESS) host_funcs_.erase(id);
    host_funcs_cv_.notify_all();
  }
  return rc;
}

// --- contexts

CUresult Client::RetainPrimary(CUdevice dev, CUcontext* out) {
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    Primary& p = primaries_[dev];
    if (p.ctx != nullptr) {
      ++p.refs;
      *out = p.ctx;
      return CUDA_SUCCESS;
    }
  }
  const int server = DeviceServer(dev);
  wire::Writer w;
  w.Put<int32_t>(DeviceLocal(dev));
  std::vector<uint8_t> reply;
  CUresult rc;
  {
    RouteScope route(multi() ? server : -1);
    rc = Call("cuDevicePrimaryCtxRetain", ops::kOpPrimaryCtxRetain, w, ReplySink{&reply});
  }
  uint64_t raw = 0;
  wire::Reader r(reply.data(), reply.size());
  if (rc != CUDA_SUCCESS) return rc;
  if (!r.Get(&raw) || raw == 0) return CUDA_ERROR_UNKNOWN;
  Link(server).NoteServerMadeCurrent(raw);  // the server made it current
  std::lock_guard<std::mutex> lock(state_mu_);
  Primary& p = primaries_[dev];
  p.ctx = reinterpret_cast<CUcontext>(Tag(raw, server));
  ++p.refs;
  *out = p.ctx;
  return CUDA_SUCCESS;
}

CUresult Client::ReleasePrimary(CUdevice dev) {
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(state_mu_);
  Primary& p = primaries_[dev];
  if (p.refs > 0) --p.refs;  // the server keeps the context for the session's life
  return CUDA_SUCCESS;
}

bool Client::PrimaryState(CUdevice dev, unsigned* flags, int* active) {
  if (dev < 0 || dev >= device_count()) return false;
  std::lock_guard<std::mutex> lock(state_mu_);
  if (flags) *flags = primaries_[dev].flags;
  if (active) *active = primaries_[dev].refs > 0 ? 1 : 0;
  return true;
}

CUresult Client::PrimaryContextFlags(CUdevice dev, unsigned* flags) {
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_CONTEXT;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    const Primary& p = primaries_[dev];
    if (p.driver_bits_known) {
      *flags = p.flags | p.driver_bits;
      return CUDA_SUCCESS;
    }
  }
  wire::Writer w;
  w.Put<uint8_t>(ops::kDriverMiscCtxGetFlags);
  std::vector<uint8_t> reply;
  CUresult rc = Call("cuCtxGetFlags", ops::kOpDriverMisc, w, ReplySink{&reply});
  wire::Reader r(reply.data(), reply.size());
  uint32_t now = 0;
  if (rc == CUDA_SUCCESS && !r.Get(&now)) rc = CUDA_ERROR_UNKNOWN;
  std::lock_guard<std::mutex> lock(state_mu_);
  Primary& p = primaries_[dev];
  if (rc == CUDA_SUCCESS) {
    p.driver_bits = now & ~p.flags & ~static_cast<unsigned>(CU_CTX_SCHED_MASK);
    p.driver_bits_known = true;
  }
  *flags = p.flags | p.driver_bits;  // without an answer: as asked for
  return CUDA_SUCCESS;
}

void Client::SetPrimaryFlags(CUdevice dev, unsigned flags) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (dev >= 0 && dev < device_count()) primaries_[dev].flags = flags;
}

CUresult Client::ResetPrimary(CUdevice dev) {
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  wire::Writer w;
  CUresult rc;
  {
    RouteScope route(multi() ? DeviceServer(dev) : -1);
    rc = Call("cuDevicePrimaryCtxReset", ops::kOpPrimaryCtxReset, w, ReplySink{});
  }
  QueryCache::Get().Clear();
  if (multi()) {  // several servers: only that server's memory went
    std::lock_guard<std::mutex> lock(state_mu_);
    for (auto it = device_ranges_.begin(); it != device_ranges_.end();) {
      auto owner = range_owner_.find(it->first);
      if (owner == range_owner_.end() || DeviceServer(owner->second.second) != DeviceServer(dev)) {
        ++it;
        continue;
      }
      if (it->second.second) munmap(reinterpret_cast<void*>(it->first), it->second.first);
      range_owner_.erase(owner);
      it = device_ranges_.erase(it);
    }
    primaries_[dev].refs = 0;
    return rc;
  }
  managed::UnmapAll();
  std::lock_guard<std::mutex> lock(state_mu_);
  for (auto& [base, r] : device_ranges_)
    if (r.second) munmap(reinterpret_cast<void*>(base), r.first);
  device_ranges_.clear();
  range_owner_.clear();
  ForgetVmmLocked();
  funcs_.clear();
  images_.clear();
  primaries_[dev].refs = 0;
  return rc;
}

CUcontext Client::PrimaryHandle(CUdevice dev) {
  std::lock_guard<std::mutex> lock(state_mu_);
  return dev >= 0 && static_cast<size_t>(dev) < primaries_.size() ? primaries_[dev].ctx : nullptr;
}

int Client::ContextDevice(CUcontext ctx) {
  if (ctx == nullptr) return -1;
  std::lock_guard<std::mutex> lock(state_mu_);
  for (size_t i = 0; i < primaries_.size(); ++i)
    if (primaries_[i].ctx == ctx) return static_cast<int>(i);
  if (created_contexts_.empty()) return -1;
  auto it = created_contexts_.find(ctx);
  return it != created_contexts_.end() ? it->second.device : -1;
}

CUresult Client::CreateContext(CUdevice dev, unsigned flags, CUcontext* out) {
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  const int server = DeviceServer(dev);
  wire::Writer w;
  w.Put<int32_t>(DeviceLocal(dev));
  w.Put<uint32_t>(flags);
  std::vector<uint8_t> reply;
  CUresult rc;
  {
    RouteScope route(multi() ? server : -1);
    rc = Call("cuCtxCreate", ops::kOpCtxCreate, w, ReplySink{&reply});
  }
  if (rc != CUDA_SUCCESS) return rc;
  uint64_t raw = 0;
  uint32_t got_flags = 0;
  wire::Reader r(reply.data(), reply.size());
  if (!r.Get(&raw) || !r.Get(&got_flags) || raw == 0) return CUDA_ERROR_UNKNOWN;
  auto ctx = reinterpret_cast<CUcontext>(Tag(raw, server));
  std::lock_guard<std::mutex> lock(state_mu_);
  if (next_context_id_ == 0) next_context_id_ = static_cast<uint64_t>(device_count()) + 1;
  created_contexts_[ctx] = CreatedContext{dev, got_flags, next_context_id_++};
  *out = ctx;
  return CUDA_SUCCESS;
}

CUresult Client::DestroyContext(CUcontext ctx) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (created_contexts_.count(ctx) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  }
  const int server = multi() ? TagOf(reinterpret_cast<uintptr_t>(ctx)) : 0;
  wire::Writer w;
  w.Put<uint64_t>(WireHandle(ctx));
  std::vector<uint8_t> reply;
  CUresult rc;
  {
    RouteScope route(multi() ? server : -1);
    rc = Call("cuCtxDestroy", ops::kOpCtxDestroy, w, ReplySink{&reply});
  }
  // Whatever the driver answered, a server that replied has forgotten the
  // context and says which handles went with it; without a reply (the
  // connection is lost) nothing changed.
  if (reply.empty()) return rc;
  wire::Reader r(reply.data(), reply.size());
  std::vector<uint64_t> memory, modules;
  uint32_t n = 0;
  if (r.Get(&n) && n <= r.remaining() / sizeof(uint64_t)) {
    memory.resize(n);
    for (auto& m : memory) r.Get(&m);
    if (r.Get(&n) && n <= r.remaining() / sizeof(uint64_t)) {
      modules.resize(n);
      for (auto& m : modules) r.Get(&m);
    }
  }
  for (uint64_t m : memory) {
    managed::Unmap(m);
    RemoveDeviceRange(m);
  }
  for (uint64_t m : modules) RemoveImage(Tag(m, server));
  QueryCache::Get().Clear();  // answers keyed by this context's handle
  std::lock_guard<std::mutex> lock(state_mu_);
  created_contexts_.erase(ctx);
  return rc;
}

void Client::SetContextFlags(CUcontext ctx, unsigned flags) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = created_contexts_.find(ctx);
  if (it != created_contexts_.end()) {
    it->second.flags = flags;
    return;
  }
  for (auto& p : primaries_)
    if (p.ctx == ctx && ctx != nullptr) p.flags = flags;
}

bool Client::FindCreatedContext(CUcontext ctx, CreatedContext* out) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = created_contexts_.find(ctx);
  if (it == created_contexts_.end()) return false;
  if (out != nullptr) *out = it->second;
  return true;
}

// --- ranges

bool HoldAddressRange(uint64_t base, uint64_t size) {
  // Keep this process from ever placing host memory where the GPU's memory
  // lives in the server, so that unified addressing stays unambiguous.
  if (size == 0) return false;
  void* p = mmap(reinterpret_cast<void*>(base), size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  const bool held = p == reinterpret_cast<void*>(base);
  if (p != MAP_FAILED && !held) munmap(p, size);
  return held;
}

void Client::AddDeviceRange(uint64_t base, uint64_t size, bool reserve_va) {
  const bool reserved = reserve_va && HoldAddressRange(base, size);
  CUcontext ctx = CurrentContext();
  const int dev = ContextDevice(ctx);
  std::lock_guard<std::mutex> lock(state_mu_);
  device_ranges_[base] = {size, reserved};
  range_owner_[base] = {ctx, dev < 0 ? 0 : dev};
}

bool Client::DeviceRangeOwner(uint64_t base, CUcontext* ctx, int* device) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = range_owner_.find(base);
  if (it == range_owner_.end()) return false;
  *ctx = it->second.first;
  *device = it->second.second;
  return true;
}

bool Client::RemoveDeviceRange(uint64_t base) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = device_ranges_.find(base);
  if (it == device_ranges_.end()) return false;
  if (it->second.second) munmap(reinterpret_cast<void*>(base), it->second.first);
  device_ranges_.erase(it);
  range_owner_.erase(base);
  ForgetSyncMemops(base);
  return true;
}

bool Client::FindDeviceRange(uint64_t p, uint64_t n, uint64_t* base, uint64_t* size) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = device_ranges_.upper_bound(p);
  if (it != device_ranges_.begin()) {
    --it;
    uint64_t b = it->first, s = it->second.first;
    if ((p - b < s || (s == 0 && p == b)) && n <= s - (p - b)) {
      if (base) *base = b;
      if (size) *size = s;
      return true;
    }
  }
  return FindMappedLocked(p, n, base, size);
}

// Mapped ranges (cuMemMap) that follow one another form one span of device
// memory, as the GPU sees it: a copy may cross from one into the next.
bool Client::FindMappedLocked(uint64_t p, uint64_t n, uint64_t* base, uint64_t* size) {
  auto it = vmm_mapped_.upper_bound(p);
  if (it == vmm_mapped_.begin()) return false;
  --it;
  if (p - it->first >= it->second) return false;
  if (base) *base = it->first;
  if (size) *size = it->second;
  uint64_t end = it->first + it->second;  // covered so far
  while (n > end - p) {
    ++it;
    if (it == vmm_mapped_.end() || it->first != end) return false;
    end += it->second;
  }
  return true;
}

void Client::AddHostBuffer(const HostBuffer& b) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = host_buffers_.find(b.base);
  if (it != host_buffers_.end() && it->second.device_ptr == 0) --unmapped_pinned_;
  host_buffers_[b.base] = b;
  if (b.device_ptr == 0) ++unmapped_pinned_;
  if (b.base < pinned_lo_.load()) pinned_lo_.store(b.base);
  if (b.base + b.size > pinned_hi_.load()) pinned_hi_.store(b.base + b.size);
}

bool Client::RemoveHostBuffer(const void* base, HostBuffer* out) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = host_buffers_.find(reinterpret_cast<uintptr_t>(base));
  if (it == host_buffers_.end()) return false;
  *out = it->second;
  if (it->second.device_ptr == 0) --unmapped_pinned_;
  host_buffers_.erase(it);
  return true;
}

bool Client::FindHostBuffer(const void* p, HostBuffer* out) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = host_buffers_.upper_bound(v);
  if (it == host_buffers_.begin()) return false;
  --it;
  if (v - it->first >= it->second.size) return false;
  if (out != nullptr) *out = it->second;
  return true;
}

bool Client::SharesMemory() {
  std::lock_guard<std::mutex> lock(mu_);
  return conn_ != nullptr && broken_ == CUDA_SUCCESS && conn_->SharesMemory();
}

CUresult Client::ShareFd(int fd, uint64_t* id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (conn_ == nullptr || broken_ != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
  Status st = conn_->ShareFd(fd, id);
  if (!st.ok()) {
    FLYT_WARN("%s", st.message().c_str());
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  return CUDA_SUCCESS;
}

// --- code

void Client::AddImage(uint64_t handle, bool is_library,
                      std::vector<std::pair<uint64_t, FuncInfo>> fns) {
  std::lock_guard<std::mutex> lock(state_mu_);
  ImageInfo& img = images_[handle];
  img.is_library = is_library;
  for (auto& [h, info] : fns) {
    info.image = handle;
    img.by_name[info.name] = h;
    funcs_[h] = std::make_shared<const FuncInfo>(std::move(info));
  }
}

void Client::AddLibraryModule(uint64_t module, uint64_t library,
                              std::vector<std::pair<uint64_t, FuncInfo>> fns) {
  AddImage(module, false, std::move(fns));
  std::lock_guard<std::mutex> lock(state_mu_);
  ImageInfo& img = images_[module];
  img.library_owned = true;
  img.owner = library;
}

void Client::RemoveImage(uint64_t handle) {
  QueryCache::Get().Clear();  // its handles may come back for other code
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = images_.find(handle);
  if (it == images_.end()) return;
  const bool library = it->second.is_library;
  for (auto& [name, h] : it->second.by_name) funcs_.erase(h);
  images_.erase(it);
  if (!library) return;
  for (auto m = images_.begin(); m != images_.end();) {  // its modules go with it
    if (m->second.library_owned && m->second.owner == handle) {
      for (auto& [name, h] : m->second.by_name) funcs_.erase(h);
      m = images_.erase(m);
    } else {
      ++m;
    }
  }
}

bool Client::ImageKind(uint64_t image, bool* is_library, bool* library_owned) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = images_.find(image);
  if (it == images_.end()) return false;
  if (is_library != nullptr) *is_library = it->second.is_library;
  if (library_owned != nullptr) *library_owned = it->second.library_owned;
  return true;
}

uint64_t Client::FindInImage(uint64_t image, const std::string& name) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = images_.find(image);
  if (it == images_.end()) return 0;
  auto f = it->second.by_name.find(name);
  return f == it->second.by_name.end() ? 0 : f->second;
}

size_t Client::ImageFuncCount(uint64_t image, std::vector<uint64_t>* out) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = images_.find(image);
  if (it == images_.end()) return 0;
  if (out != nullptr)
    for (auto& [name, h] : it->second.by_name) out->push_back(h);
  return it->second.by_name.size();
}

std::shared_ptr<const FuncInfo> Client::Func(uint64_t handle) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = funcs_.find(handle);
  return it == funcs_.end() ? nullptr : it->second;
}

namespace {
uint64_t LinkRoot(const std::unordered_map<uint64_t, uint64_t>& links, uint64_t h) {
  for (int hops = 0; hops < 64; ++hops) {
    auto it = links.find(h);
    if (it == links.end() || it->second == h) return h;
    h = it->second;
  }
  return h;
}
}  // namespace

void Client::SetMaxDynamicShared(uint64_t func, int bytes) {
  std::lock_guard<std::mutex> lock(state_mu_);
  max_dynamic_shared_[LinkRoot(kernel_link_, func)] = bytes;
}

int Client::MaxDynamicShared(uint64_t func) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = max_dynamic_shared_.find(LinkRoot(kernel_link_, func));
  return it == max_dynamic_shared_.end() ? -1 : it->second;
}

void Client::LinkKernelHandles(uint64_t a, uint64_t b) {
  std::lock_guard<std::mutex> lock(state_mu_);
  const uint64_t ra = LinkRoot(kernel_link_, a), rb = LinkRoot(kernel_link_, b);
  if (ra == rb) return;
  kernel_link_[rb] = ra;
  auto it = max_dynamic_shared_.find(rb);
  if (it != max_dynamic_shared_.end()) {
    auto& v = max_dynamic_shared_[ra];
    v = std::max(v, it->second);
    max_dynamic_shared_.erase(rb);
  }
}

void Client::AliasFunc(uint64_t alias, std::shared_ptr<const FuncInfo> info) {
  std::lock_guard<std::mutex> lock(state_mu_);
  funcs_[alias] = std::move(info);
}

}  // namespace flyt::client
