// Implementation of transport/ucx_rma.h.
#include "transport/ucx_rma.h"

#include <poll.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/ucx_transport.h"

namespace flyt::transport {
namespace {

using Clock = std::chrono::steady_clock;

// A transfer busy-polls UCX while it moves and this long after it last moved, then
// sleeps in slices of 1 ms (some of UCX's transports send no wake-up when room frees up).
constexpr int kSpinUs = 200;
// The client's progress thread polls this long after its last work, then sleeps 1 ms at
// a time for kRecentMs, then until UCX has news (at most 100 ms).
constexpr int kBusyUs = 200;
constexpr int kRecentMs = 50;
// Zero bytes after an imported key: a memory domain's unpacker may read its own fixed
// size whatever length byte the key gave it.
constexpr size_t kKeyPad = 256;
// Once the peer is known gone, how long a transfer may take to end with an error.
constexpr int kAbandonMs = 2000;
// While waiting, the peer's socket is looked at this often.
constexpr int64_t kWatchEveryNs = 1000000;

class UcxRemoteMemory;

// Client sides whose progress thread runs. When the process exits they are stopped first
// (an atexit handler runs before the libraries' destructors, UCX's among them): a client
// library never gets to destroy its connection.
std::mutex g_live_mu;
std::set<UcxRemoteMemory*>* g_live = new std::set<UcxRemoteMemory*>();  // never destroyed
void StopLiveAtExit();

class UcxRemoteMemory final : public RemoteMemory {
 public:
  UcxRemoteMemory(const ucx::Api* api, bool client, RmaPeerWatch watch)
      : api_(api), client_(client), watch_(std::move(watch)) {}

  ~UcxRemoteMemory() override {
    {
      std::lock_guard<std::mutex> live(g_live_mu);
      g_live->erase(this);
    }
    StopThread();
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_) {
      // UCX still holds a transfer it could not end: leave everything it may use.
      FLYT_WARN("ucx rma with %s: leaving its UCX state behind (a transfer never ended)",
                watch_.peer.c_str());
      return;
    }
    for (auto& [id, rkey] : keys_) api_->rkey_destroy(rkey);
    keys_.clear();
    CloseEndpointLocked();
    {
      std::lock_guard<std::mutex> l(locals_mu_);
      for (auto& [base, reg] : locals_) api_->mem_unmap(api_->context, reg.memh);
      locals_.clear();
    }
    for (auto& [handle, memh] : exposed_) api_->mem_unmap(api_->context, memh);
    exposed_.clear();
    if (worker_ != nullptr) api_->worker_destroy(worker_);
    worker_ = nullptr;
    if (stop_efd_ >= 0) ::close(stop_efd_);
  }

  // Ends the client's progress thread (in the process that started it: a forked child
  // has none).
  void StopThread() {
    if (!thread_.joinable() || owner_pid_ != ::getpid()) return;
    stop_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    if (::write(stop_efd_, &one, sizeof(one)) < 0) {
      // A full counter: the thread wakes anyway.
    }
    thread_.join();
  }

  // --- client side

  Status LocalAddress(std::vector<uint8_t>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = StartClientLocked();
    if (st.ok()) *out = address_;
    return st;
  }

  Status Expose(void* base, size_t len, std::vector<uint8_t>* key, uint64_t* handle) override {
    if (base == nullptr || len == 0) return Status::Error("ucx rma: nothing to register");
    {
      std::lock_guard<std::mutex> lock(mu_);
      Status st = StartClientLocked();
      if (!st.ok()) return st;
    }
    ucp_mem_h memh = nullptr;
    Status st = Map(base, len, false, &memh);
    if (!st.ok()) return st;
    void* packed = nullptr;
    size_t size = 0;
    const ucs_status_t s = api_->rkey_pack(api_->context, memh, &packed, &size);
    if (s != UCS_OK || size == 0 || size > kMaxPackedRkey) {
      if (s == UCS_OK) api_->rkey_buffer_release(packed);
      api_->mem_unmap(api_->context, memh);
      return Status::Error("ucx rma: cannot pack a key for " + std::to_string(len) + " bytes: " +
                           (s != UCS_OK ? api_->Why(s) : "size " + std::to_string(size)));
    }
    const auto* p = static_cast<const uint8_t*>(packed);
    key->assign(p, p + size);
    api_->rkey_buffer_release(packed);
    std::lock_guard<std::mutex> lock(mu_);
    *handle = ++next_id_;
    exposed_[*handle] = memh;
    return Status::Ok();
  }

  void Withdraw(uint64_t handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = exposed_.find(handle);
    if (it == exposed_.end()) return;
    const ucs_status_t s = api_->mem_unmap(api_->context, it->second);
    if (s != UCS_OK) FLYT_WARN("ucx rma: unregistering a buffer failed: %s", api_->Why(s).c_str());
    exposed_.erase(it);
  }

  // --- server side

  Status Connect(const void* address, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (client_) return Status::Error("ucx rma: the client side does not connect");
    if (ep_ != nullptr) return Status::Error("ucx rma: connected already");
    if (n == 0 || n > kUcxMaxAddress)
      return Status::Error("ucx rma: a worker address of " + std::to_string(n) + " bytes");
    if (!failed_.empty()) return Status::Error(failed_);
    if (worker_ == nullptr) {
      ucp_worker_params_t wp{};
      wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
      wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // mu_ serializes every call
      ucs_status_t s = api_->worker_create(api_->context, &wp, &worker_);
      if (s != UCS_OK) {
        worker_ = nullptr;
        return Status::Error("ucx rma: cannot create a UCP worker: " + api_->Why(s));
      }
      s = api_->worker_get_efd(worker_, &efd_);
      if (s != UCS_OK) return Status::Error("ucx rma: worker wake-up descriptor: " + api_->Why(s));
    }
    peer_address_.assign(static_cast<const uint8_t*>(address),
                         static_cast<const uint8_t*>(address) + n);
    Status st = ucx::CreateEndpoint(*api_, worker_, peer_address_.data(), peer_address_.size(),
                                    &UcxRemoteMemory::OnPeerError, this, watch_.peer + " (memory)",
                                    &ep_, &peer_errors_);
    if (st.ok()) lanes_ = RmaLanesLocked();
    return st;
  }

  Status ImportKey(const void* key, size_t n, uint64_t* id) override {
    Status st = ValidatePackedRkey(key, n);
    if (!st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.empty()) return Status::Error(failed_);
    if (ep_ == nullptr) return Status::Error("ucx rma: a key before the client's address");
    if (keys_.size() >= kMaxImportedKeys)
      return Status::Error("ucx rma: more than " + std::to_string(kMaxImportedKeys) + " keys");
    std::vector<uint8_t> padded(n + kKeyPad, 0);
    std::memcpy(padded.data(), key, n);
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t s = api_->ep_rkey_unpack(ep_, padded.data(), &rkey);
    if (s != UCS_OK) return Status::Error("ucx rma: the client's key is unusable: " + api_->Why(s));
    *id = ++next_id_;
    keys_[*id] = rkey;
    return Status::Ok();
  }

  void DropKey(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = keys_.find(id);
    if (it == keys_.end()) return;
    if (!abandoned_) api_->rkey_destroy(it->second);
    keys_.erase(it);
  }

  Status RegisterLocal(void* base, size_t len, bool device, uint64_t* handle) override {
    if (base == nullptr || len == 0) return Status::Error("ucx rma: nothing to register");
    ucp_mem_h memh = nullptr;
    Status st = Map(base, len, device, &memh);
    if (!st.ok()) return st;
    std::lock_guard<std::mutex> lock(locals_mu_);
    *handle = ++next_local_;
    locals_[reinterpret_cast<uintptr_t>(base)] = Local{len, memh, *handle};
    return Status::Ok();
  }

  void UnregisterLocal(uint64_t handle) override {
    std::lock_guard<std::mutex> lock(locals_mu_);
    for (auto it = locals_.begin(); it != locals_.end(); ++it) {
      if (it->second.handle != handle) continue;
      api_->mem_unmap(api_->context, it->second.memh);
      locals_.erase(it);
      return;
    }
  }

  Status Read(void* local, size_t n, uint64_t remote, uint64_t id, bool device) override {
    if (n == 0) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    ucp_rkey_h rkey = nullptr;
    Status st = ReadyLocked(id, &rkey);
    if (!st.ok()) return st;
    ucp_request_param_t p{};
    Params(local, n, device, &p);
    return WaitLocked(api_->get_nbx(ep_, local, n, remote, rkey, &p), "read");
  }

  Status Write(const void* local, size_t n, uint64_t remote, uint64_t id, bool device) override {
    if (n == 0) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    ucp_rkey_h rkey = nullptr;
    Status st = ReadyLocked(id, &rkey);
    if (!st.ok()) return st;
    ucp_request_param_t p{};
    Params(local, n, device, &p);
    st = WaitLocked(api_->put_nbx(ep_, local, n, remote, rkey, &p), "write");
    if (!st.ok()) return st;
    // Completion of a put frees its buffer; the flush puts the bytes in the client's
    // memory before anything said after this (a reply on the connection's own worker).
    ucp_request_param_t f{};
    return WaitLocked(api_->ep_flush_nbx(ep_, &f), "flush");
  }

  bool DeviceMemory() const override {
    return (api_->memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }

  std::string Describe() const override {
    std::string d = "UCX " + api_->version + " one-sided reads and writes";
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!lanes_.empty()) d += " over " + lanes_;
    }
    d += DeviceMemory() ? "; this UCX reaches CUDA memory"
                        : "; this UCX has no CUDA support (GPU memory is staged through pinned "
                          "host memory)";
    return d;
  }

  // The registration that holds [p, p+n), for the connection's own messages.
  ucp_mem_h LocalMemh(const void* p, size_t n) {
    std::lock_guard<std::mutex> lock(locals_mu_);
    return LocalMemhLocked(p, n);
  }

 private:
  struct Local {
    size_t len = 0;
    ucp_mem_h memh = nullptr;
    uint64_t handle = 0;
  };

  static void OnPeerError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    static_cast<UcxRemoteMemory*>(arg)->ep_error_ = status;  // inside our progress, under mu_
  }

  Status Map(void* base, size_t len, bool device, ucp_mem_h* memh) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = len;
    if (device) {
      mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
      mp.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    const ucs_status_t s = api_->mem_map(api_->context, &mp, memh);
    if (s != UCS_OK) {
      return Status::Error("ucx rma: cannot register " + std::to_string(len) +
                           " bytes: " + api_->Why(s));
    }
    return Status::Ok();
  }

  ucp_mem_h LocalMemhLocked(const void* p, size_t n) const {
    const auto at = reinterpret_cast<uintptr_t>(p);
    auto it = locals_.upper_bound(at);
    if (it == locals_.begin()) return nullptr;
    --it;
    const uintptr_t off = at - it->first;
    return off <= it->second.len && n <= it->second.len - off ? it->second.memh : nullptr;
  }

  void Params(const void* local, size_t n, bool device, ucp_request_param_t* p) {
    if (device) {
      p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      p->memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    if (ucp_mem_h memh = LocalMemh(local, n); memh != nullptr) {
      p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p->memh = memh;
    }
  }

  Status StartClientLocked() {
    if (!client_) return Status::Error("ucx rma: the server side exposes nothing");
    if (worker_ != nullptr) return Status::Ok();
    if (!failed_.empty()) return Status::Error(failed_);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread, once it runs
    ucs_status_t s = api_->worker_create(api_->context, &wp, &worker_);
    if (s != UCS_OK) {
      worker_ = nullptr;
      failed_ = "ucx rma: cannot create a UCP worker: " + api_->Why(s);
      return Status::Error(failed_);
    }
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    s = api_->worker_get_efd(worker_, &efd_);
    if (s == UCS_OK) s = api_->worker_get_address(worker_, &addr, &len);
    if (s == UCS_OK && len <= kUcxMaxAddress) {
      const auto* b = reinterpret_cast<const uint8_t*>(addr);
      address_.assign(b, b + len);
    }
    if (s == UCS_OK) api_->worker_release_address(worker_, addr);
    stop_efd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s != UCS_OK || address_.empty() || stop_efd_ < 0) {
      failed_ = "ucx rma: cannot set up this side's worker" +
                (s != UCS_OK ? ": " + api_->Why(s) : std::string());
      api_->worker_destroy(worker_);
      worker_ = nullptr;
      return Status::Error(failed_);
    }
    owner_pid_ = ::getpid();
    thread_ = std::thread([this] { ProgressLoop(); });
    static std::once_flag at_exit;
    std::call_once(at_exit, [] { std::atexit(StopLiveAtExit); });
    std::lock_guard<std::mutex> live(g_live_mu);
    g_live->insert(this);
    return Status::Ok();
  }

  // The client's worker is the target of the server's reads and writes: over UCX's TCP
  // transport (and its software emulation of RMA) the target must progress to answer.
  // While it has had work lately it keeps polling (UCX's emulation of RMA with active
  // messages may wait for room in the server's queue, which sends no wake-up); idle, it
  // sleeps until UCX has news.
  void ProgressLoop() {
    auto last_work = Clock::now();
    for (;;) {
      bool worked = false;
      while (api_->worker_progress(worker_) != 0) worked = true;
      if (stop_.load(std::memory_order_acquire)) return;
      const auto now = Clock::now();
      if (worked) last_work = now;
      const auto idle = now - last_work;
      if (idle < std::chrono::microseconds(kBusyUs)) {
        if (!worked) std::this_thread::yield();  // the peer's thread may need this core
        continue;
      }
      const ucs_status_t s = api_->worker_arm(worker_);
      if (s == UCS_ERR_BUSY) continue;
      pollfd p[2] = {{efd_, POLLIN, 0}, {stop_efd_, POLLIN, 0}};
      const bool recent = idle < std::chrono::milliseconds(kRecentMs);
      ::poll(p, 2, s != UCS_OK || recent ? 1 : 100);
    }
  }

  Status ReadyLocked(uint64_t id, ucp_rkey_h* rkey) {
    if (client_) return Status::Error("ucx rma: the client side does not read or write");
    if (!failed_.empty()) return Status::Error(failed_);
    if (ep_ == nullptr) return Status::Error("ucx rma: not connected to the client's memory");
    auto it = keys_.find(id);
    if (it == keys_.end()) return Status::Error("ucx rma: no key " + std::to_string(id));
    *rkey = it->second;
    return Status::Ok();
  }

  // Why the peer is to be given up on now ("" while it is not).
  std::string GoneWhyLocked(Clock::duration elapsed) {
    if (watch_.shutdown != nullptr && watch_.shutdown->load())
      return "connection to " + watch_.peer + " was shut down";
    if (ep_error_ != UCS_OK) return watch_.peer + " went away (UCX: " + api_->Why(ep_error_) + ")";
    if (watch_.sock >= 0) {
      // After the switch to UCX the socket carries nothing: any news is a hang-up.
      pollfd p{watch_.sock, POLLIN | POLLRDHUP, 0};
      if (::poll(&p, 1, 0) > 0 && p.revents != 0) return watch_.peer + " went away";
    }
    if (elapsed > std::chrono::milliseconds(kRmaOpTimeoutMs))
      return watch_.peer + " did not answer a read or write in " +
             std::to_string(kRmaOpTimeoutMs / 1000) + " s";
    return "";
  }

  // Waits for a request; when the peer is gone, closes the endpoint so that UCX ends the
  // transfer with an error, and gives up on it (abandoned_) if even that does not.
  Status WaitLocked(void* req, const char* what) {
    if (req == nullptr) return Status::Ok();
    if (UCS_PTR_IS_ERR(req)) {
      return FailLocked(std::string("ucx ") + what + " with " + watch_.peer + ": " +
                        api_->Why(UCS_PTR_STATUS(req)));
    }
    const auto start = Clock::now();
    auto spin_until = start + std::chrono::microseconds(kSpinUs);
    auto last_watch = start;
    Clock::time_point gone_at{};
    bool gone = false;
    ucs_status_t s;
    while ((s = api_->request_check_status(req)) == UCS_INPROGRESS) {
      const bool moved = api_->worker_progress(worker_) != 0;
      const auto now = Clock::now();
      if (moved) spin_until = now + std::chrono::microseconds(kSpinUs);
      if (!gone && now - last_watch > std::chrono::nanoseconds(kWatchEveryNs)) {
        last_watch = now;
        std::string why = GoneWhyLocked(now - start);
        if (!why.empty()) {
          gone = true;
          gone_at = now;
          if (failed_.empty()) failed_ = why;
          CloseEndpointLocked();  // ends the transfer where UCX can
          continue;
        }
      }
      if (gone && now - gone_at > std::chrono::milliseconds(kAbandonMs)) {
        abandoned_ = true;  // UCX keeps the request: never free it or what it points at
        FLYT_ERROR("ucx rma: a %s with %s did not end after the peer was gone; giving it up", what,
                   watch_.peer.c_str());
        return Status::Error(failed_);
      }
      if (now < spin_until) {
        if (!moved) std::this_thread::yield();  // the client's thread may need this core
        continue;
      }
      if (api_->worker_arm(worker_) == UCS_ERR_BUSY) continue;
      pollfd p[3] = {{efd_, POLLIN, 0},
                     {gone ? -1 : watch_.stop_fd, POLLIN, 0},
                     {gone ? -1 : watch_.sock, POLLIN | POLLRDHUP, 0}};
      ::poll(p, 3, 1);
      if (p[1].revents != 0 || p[2].revents != 0) last_watch = start;  // look at once
    }
    api_->request_free(req);
    if (s != UCS_OK) {
      return FailLocked(std::string("ucx ") + what + " with " + watch_.peer + ": " +
                        (failed_.empty() ? api_->Why(s) : failed_));
    }
    return Status::Ok();
  }

  // Which of UCX's transports carry the endpoint's reads and writes, from UCX's own
  // description of the endpoint (its "rma_bw" lanes; "am" only: UCX emulates them with
  // active messages that the client's progress thread answers).
  std::string RmaLanesLocked() {
    if (api_->ep_print_info == nullptr || ep_ == nullptr) return "";
    char* text = nullptr;
    size_t size = 0;
    FILE* f = ::open_memstream(&text, &size);
    if (f == nullptr) return "";
    api_->ep_print_info(ep_, f);
    ::fclose(f);
    std::string all(text != nullptr ? text : "", size);
    std::free(text);
    std::string rma, am;
    size_t at = 0;
    while (at < all.size()) {
      size_t end = all.find('\n', at);
      if (end == std::string::npos) end = all.size();
      const std::string line = all.substr(at, end - at);
      at = end + 1;
      const size_t lane = line.find("lane[");
      if (lane == std::string::npos) continue;
      // "lane[1]:  3:cma/memory.0 md[2] ... rma_bw#0 ..." -> "cma/memory.0"
      const size_t colon = line.find(':', lane + 5);
      if (colon == std::string::npos) continue;
      size_t b = line.find_first_not_of(' ', colon + 1);
      if (b == std::string::npos) continue;
      const size_t c = line.find(':', b);
      if (c != std::string::npos && c < line.find(' ', b)) b = c + 1;
      const std::string tl = line.substr(b, line.find(' ', b) - b);
      if (line.find("rma_bw") != std::string::npos) rma += (rma.empty() ? "" : ",") + tl;
      if (line.find(" am ") != std::string::npos || line.find(" am\n") != std::string::npos)
        am += (am.empty() ? "" : ",") + tl;
    }
    if (!rma.empty()) return rma;
    return am.empty() ? "" : am + " (emulated with active messages)";
  }

  Status FailLocked(const std::string& why) {
    if (failed_.empty()) failed_ = why;
    return Status::Error(failed_);
  }

  void CloseEndpointLocked() {
    if (ep_ == nullptr) return;
    ucp_request_param_t p{};
    if (peer_errors_) {  // a forced close needs peer-failure handling on the endpoint
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    void* req = api_->ep_close_nbx(ep_, &p);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
      const auto until = Clock::now() + std::chrono::milliseconds(200);
      while (api_->request_check_status(req) == UCS_INPROGRESS && Clock::now() < until)
        api_->worker_progress(worker_);
      if (api_->request_check_status(req) != UCS_INPROGRESS) api_->request_free(req);
    }
    ep_ = nullptr;
  }

  const ucx::Api* api_;
  const bool client_;
  const RmaPeerWatch watch_;
  mutable std::mutex mu_;  // everything below but locals_
  std::string lanes_;      // what carries the reads and writes (Describe)
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string failed_;  // set once: why every later read or write fails
  bool abandoned_ = false;
  uint64_t next_id_ = 0;
  // Client side.
  std::vector<uint8_t> address_;
  std::map<uint64_t, ucp_mem_h> exposed_;
  std::thread thread_;
  pid_t owner_pid_ = 0;
  std::atomic<bool> stop_{false};
  int stop_efd_ = -1;
  // Server side.
  std::vector<uint8_t> peer_address_;
  ucp_ep_h ep_ = nullptr;
  bool peer_errors_ = true;
  ucs_status_t ep_error_ = UCS_OK;
  std::map<uint64_t, ucp_rkey_h> keys_;
  std::mutex locals_mu_;  // locals_ (looked up by the connection's messages too)
  std::map<uintptr_t, Local> locals_;
  uint64_t next_local_ = 0;
};

void StopLiveAtExit() {
  std::lock_guard<std::mutex> live(g_live_mu);
  for (UcxRemoteMemory* r : *g_live) r->StopThread();
}

}  // namespace

Status ValidatePackedRkey(const void* key, size_t n) {
  const auto* p = static_cast<const uint8_t*>(key);
  if (p == nullptr || n < 9)
    return Status::Error("ucx rma: a key of " + std::to_string(n) + " bytes");
  if (n > kMaxPackedRkey)
    return Status::Error("ucx rma: a key of " + std::to_string(n) + " bytes (at most " +
                         std::to_string(kMaxPackedRkey) + ")");
  uint64_t md_map = 0;
  std::memcpy(&md_map, p, sizeof(md_map));
  if (md_map == 0) return Status::Error("ucx rma: a key that names no memory domain");
  if (p[8] != UCS_MEMORY_TYPE_HOST)
    return Status::Error("ucx rma: a key for memory of type " + std::to_string(p[8]) +
                         " (clients register host memory)");
  size_t at = 9;
  for (int bit = 0; bit < 64; ++bit) {
    if ((md_map & (uint64_t{1} << bit)) == 0) continue;
    if (at >= n) return Status::Error("ucx rma: a truncated key");
    const size_t len = p[at++];
    if (len > n - at) return Status::Error("ucx rma: a truncated key");
    at += len;
  }
  if (at != n)
    return Status::Error("ucx rma: a key with " + std::to_string(n - at) + " stray bytes");
  return Status::Ok();
}

std::unique_ptr<RemoteMemory> NewUcxRemoteMemory(const ucx::Api* api, bool client,
                                                 RmaPeerWatch watch) {
  return std::make_unique<UcxRemoteMemory>(api, client, std::move(watch));
}

ucp_mem_h UcxLocalRegistration(RemoteMemory* rma, const void* p, size_t n) {
  return rma == nullptr ? nullptr : static_cast<UcxRemoteMemory*>(rma)->LocalMemh(p, n);
}

}  // namespace flyt::transport
