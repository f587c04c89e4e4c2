// One-sided copies of pinned memory (ucx://): the part of client/client.h that registers
// the process's pinned and registered host buffers with the transport so that the server
// reads and writes them itself (transport::RemoteMemory, server/session_rma.cc).
//
// A buffer is registered once, at the first copy worth it (at least FLYT_RMA_MIN_BYTES,
// or an asynchronous device-to-host copy, which then stays asynchronous): the first time,
// the server learns this process's memory address (kOpRmaAttach); each buffer's key goes
// with kOpRmaRegister. From then on every copy of that buffer goes that way, so that the
// server alone orders the reads and writes of its bytes. A registration belongs to the
// connection it was made on: when the session moves to another connection (client/
// session_move.cc) the buffers register again. Freeing a buffer drops its key on the
// server (after the server's work on it) before the registration goes.
// Must not touch: the copies themselves (client/api_memory.cc), the transport's state.
#include "client/client.h"
#include "common/log.h"

namespace flyt::client {

bool Client::RmaKey(const void* p, size_t n, bool first_use_worth_it, uint64_t* key) {
  if (!rma_enabled_ || n == 0) return false;
  HostBuffer b;
  if (!FindHostBuffer(p, &b) || !b.Covers(p, n) || b.server_addr != 0) return false;
  uint64_t gen = conn_gen_.load(std::memory_order_acquire);
  if (b.rma_gen == gen && b.rma_key != 0) {
    *key = b.rma_key;
    return true;
  }
  if (!first_use_worth_it || rma_refused_gen_.load(std::memory_order_acquire) == gen ||
      (b.rma_gen == gen && b.rma_refused))
    return false;

  std::lock_guard<std::mutex> registering(rma_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS || conn_ == nullptr) return false;
  gen = conn_gen_.load();
  if (!FindHostBuffer(p, &b) || !b.Covers(p, n)) return false;
  if (b.rma_gen == gen && b.rma_key != 0) {  // another thread registered it meanwhile
    *key = b.rma_key;
    return true;
  }
  auto mark_refused = [&](uint64_t base) {
    std::lock_guard<std::mutex> state(state_mu_);
    auto it = host_buffers_.find(base);
    if (it == host_buffers_.end()) return;
    it->second.rma_gen = gen;
    it->second.rma_refused = true;
    it->second.rma_key = 0;
  };
  transport::RemoteMemory* rma = conn_->Rma();
  if (rma == nullptr) {
    rma_refused_gen_.store(gen);  // not a transport with one-sided access
    return false;
  }
  if (rma_attached_gen_ != gen) {
    std::vector<uint8_t> address;
    Status st = rma->LocalAddress(&address);
    CUresult rc = CUDA_ERROR_NOT_SUPPORTED;
    std::vector<uint8_t> reply;
    if (st.ok()) {
      wire::Writer w;
      w.PutBlob(address.data(), address.size());
      rc = CallLocked("one-sided copies (attach)", ops::kOpRmaAttach, w, ReplySink{&reply}, 0, 0);
      if (conn_gen_.load() != gen) return false;  // the session moved meanwhile
    }
    uint32_t flags = 0;
    wire::Reader r(reply.data(), reply.size());
    if (rc == CUDA_SUCCESS && !r.Get(&flags)) rc = CUDA_ERROR_UNKNOWN;
    if (rc != CUDA_SUCCESS) {
      rma_refused_gen_.store(gen);
      const std::string why = st.ok() ? "error " + std::to_string(rc) : st.message();
      FLYT_INFO(
          "flyt-server does not read and write this process's pinned memory itself (%s): "
          "copies of it travel as messages",
          why.c_str());
      return false;
    }
    rma_attached_gen_ = gen;
    FLYT_DEBUG("one-sided copies of pinned memory with flyt-server at %s%s", server_.c_str(),
               (flags & ops::kRmaDirect) ? " (synchronous ones straight to device memory)" : "");
  }
  std::vector<uint8_t> packed;
  uint64_t handle = 0;
  Status st = rma->Expose(reinterpret_cast<void*>(b.base), b.size, &packed, &handle);
  if (!st.ok()) {
    FLYT_INFO("pinned buffer of %zu bytes not registered for one-sided copies: %s", b.size,
              st.message().c_str());
    mark_refused(b.base);
    return false;
  }
  wire::Writer w;
  w.Put<uint64_t>(b.base);
  w.Put<uint64_t>(b.size);
  w.PutBlob(packed.data(), packed.size());
  std::vector<uint8_t> reply;
  CUresult rc =
      CallLocked("one-sided copies (register)", ops::kOpRmaRegister, w, ReplySink{&reply}, 0, 0);
  if (conn_gen_.load() != gen) return false;  // moved: that registration went with its connection
  uint64_t id = 0;
  wire::Reader r(reply.data(), reply.size());
  if (rc != CUDA_SUCCESS || !r.Get(&id) || id == 0) {
    rma->Withdraw(handle);
    if (rc == CUDA_SUCCESS) rc = CUDA_ERROR_UNKNOWN;
    FLYT_INFO("flyt-server refused a pinned buffer for one-sided copies (error %d)", rc);
    mark_refused(b.base);
    return false;
  }
  bool kept = false;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    auto it = host_buffers_.find(b.base);
    if (it != host_buffers_.end()) {
      it->second.rma_key = id;
      it->second.rma_handle = handle;
      it->second.rma_gen = gen;
      it->second.rma_refused = false;
      kept = true;
    }
  }
  if (!kept) {  // freed meanwhile by another thread: undo
    wire::Writer u;
    u.Put<uint64_t>(id);
    CallLocked("one-sided copies (unregister)", ops::kOpRmaUnregister, u, ReplySink{}, 0, 0);
    if (conn_gen_.load() == gen) rma->Withdraw(handle);
    return false;
  }
  *key = id;
  return true;
}

CUresult Client::RmaForget(const HostBuffer& b) {
  if (b.rma_key == 0) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> registering(rma_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  // Made on a connection this process no longer has: it went with it.
  if (b.rma_gen != conn_gen_.load() || conn_ == nullptr) return CUDA_SUCCESS;
  if (broken_ != CUDA_SUCCESS) return broken_;
  wire::Writer w;
  w.Put<uint64_t>(b.rma_key);
  CUresult rc =
      CallLocked("one-sided copies (unregister)", ops::kOpRmaUnregister, w, ReplySink{}, 0, 0);
  if (b.rma_gen == conn_gen_.load() && conn_ != nullptr) {
    if (transport::RemoteMemory* rma = conn_->Rma(); rma != nullptr) rma->Withdraw(b.rma_handle);
  }
  return rc;
}

}  // namespace flyt::client
