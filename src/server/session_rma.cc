// Session handlers for one-sided copies of the client's pinned memory (ucx://).
//
// Owns: the client buffers the session may reach (their keys, by id), the session's
// pinned staging buffers for them (registered with the transport once), and the copies
// between those buffers and the device. The client registers a pinned or registered host
// buffer once (kOpRmaAttach, kOpRmaRegister); a copy then travels as a small request
// (kOpCopyRma) and the bytes move by the transport's reads and writes of the client's
// memory (transport::RemoteMemory), without the client's threads:
//   host to device: the bytes are read into a staging buffer when the frame runs and
//     copied to the device asynchronously, while the next chunk is read;
//   device to host, asynchronous: the device copies into a staging buffer in stream
//     order, and a host function behind that copy writes the bytes to the client, so
//     that everything later in the stream (the app's host functions, events,
//     synchronizations) sees them, and the client's call returned at once;
//   device to host, synchronous: copies and writes pipelined chunk by chunk;
//   synchronous copies where the transport reaches device memory itself (a UCX with
//     CUDA support; the sim backend, whose device memory is host memory): straight
//     between the client's memory and the allocation, after the stream's earlier work.
// Every request is checked against the session's own keys and ranges (a client can make
// the server touch only memory it registered); a transport failure ends the session, as a
// broken connection does. Keys go when the client frees the buffer and with the session.
// Must not touch: the transport's registrations and endpoints (transport/ucx_rma.h),
// other sessions' state, the byte-stream staging of session.cc.
#include <cstring>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

namespace {
// Staging buffers per session (of wire::kCopyChunk each): enough to read one chunk while
// the device copies another, with room for asynchronous writes to the client in flight.
constexpr size_t kRmaSlots = 4;
}  // namespace

// Request: blob address. Reply: u32 flags.
bool Session::RmaAttach(Reader& in, Writer& out, CUresult* rc) {
  const uint8_t* address = nullptr;
  uint32_t n = 0;
  if (!in.GetBlob(&address, &n, ops::kMaxRmaAddress) || in.remaining() != 0) return false;
  transport::RemoteMemory* r = conn_->Rma();
  if (r == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;  // not a transport with one-sided access
    return true;
  }
  if (rma_ != nullptr) {
    *rc = CUDA_ERROR_INVALID_VALUE;  // attached already
    return true;
  }
  Status st = r->Connect(address, n);
  if (!st.ok()) {
    FLYT_WARN("session %llu: no one-sided copies of the client's memory: %s",
              static_cast<unsigned long long>(id_), st.message().c_str());
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  rma_ = r;
  // Device memory straight from the transport: UCX reaches GPU memory here, or the sim
  // backend's device memory is host memory.
  rma_direct_ = state_->api.is_sim || r->DeviceMemory();
  FLYT_INFO("session %llu: pinned client memory by %s; %s", static_cast<unsigned long long>(id_),
            r->Describe().c_str(),
            rma_direct_ ? "synchronous copies go straight to and from device memory"
                        : "staged through pinned host memory");
  out.Put<uint32_t>(rma_direct_ ? uint32_t{ops::kRmaDirect} : uint32_t{0});
  return true;
}

// Request: u64 base, u64 size, blob key. Reply: u64 key id.
bool Session::RmaRegister(Reader& in, Writer& out, CUresult* rc) {
  uint64_t base = 0, size = 0;
  const uint8_t* key = nullptr;
  uint32_t n = 0;
  if (!in.Get(&base) || !in.Get(&size) || !in.GetBlob(&key, &n, ops::kMaxRmaKey) ||
      in.remaining() != 0)
    return false;
  if (rma_ == nullptr || size == 0 || base + size < base) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  uint64_t id = 0;
  Status st = rma_->ImportKey(key, n, &id);
  if (!st.ok()) {
    FLYT_WARN("session %llu: refused a client key: %s", static_cast<unsigned long long>(id_),
              st.message().c_str());
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  rma_keys_[id] = RmaRegion{base, size};
  out.Put<uint64_t>(id);
  return true;
}

// Request: u64 key id.
bool Session::RmaUnregister(Reader& in, CUresult* rc) {
  uint64_t id = 0;
  if (!in.Get(&id) || in.remaining() != 0) return false;
  auto it = rma_keys_.find(id);
  if (it == rma_keys_.end()) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  // Writes to the buffer may be queued on streams: they finish first, as the device's
  // work on pinned memory does before cuMemFreeHost returns.
  *rc = SynchronizeSession();
  rma_->DropKey(id);
  rma_keys_.erase(it);
  return true;
}

bool Session::EnsureRmaStaging() {
  if (!rma_slots_.empty()) return true;
  if (rma_tried_) return false;
  rma_tried_ = true;
  DriverApi& a = state_->api;
  if (primary_ == nullptr || a.cuMemHostAlloc == nullptr || a.cuEventCreate == nullptr ||
      a.cuLaunchHostFunc == nullptr)
    return false;
  for (size_t i = 0; i < kRmaSlots; ++i) {
    auto slot = std::make_unique<RmaSlot>();
    slot->session = this;
    if (a.cuMemHostAlloc(&slot->buf, wire::kCopyChunk, 0) != CUDA_SUCCESS) break;
    if (a.cuEventCreate(&slot->done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      a.cuMemFreeHost(slot->buf);
      break;
    }
    // Registered once, so that transfers need no registration of their own (RDMA).
    Status st = rma_->RegisterLocal(slot->buf, wire::kCopyChunk, false, &slot->local);
    if (!st.ok()) slot->local = 0;
    rma_slots_.push_back(std::move(slot));
  }
  if (rma_slots_.size() < 2) {
    ReleaseRmaStaging();
    rma_tried_ = true;
    return false;
  }
  rma_tried_ = false;
  return true;
}

Session::RmaSlot* Session::TakeRmaSlot(CUresult* rc) {
  for (size_t tries = 0; tries < rma_slots_.size(); ++tries) {
    RmaSlot* slot = rma_slots_[rma_next_].get();
    rma_next_ = (rma_next_ + 1) % rma_slots_.size();
    if (slot->lost) continue;
    if (slot->busy) {
      slot->busy = false;
      slot->to_client = false;
      const CUresult e = state_->api.cuEventSynchronize(slot->done);
      if (e != CUDA_SUCCESS) {
        *rc = e;  // the stream failed (a sticky error)
        return nullptr;
      }
    }
    return slot;
  }
  *rc = CUDA_ERROR_OUT_OF_MEMORY;
  return nullptr;
}

void Session::FinishRmaWrites(uint64_t client, uint64_t n) {
  for (auto& slot : rma_slots_) {
    if (!slot->busy || !slot->to_client) continue;
    if (slot->client >= client + n || client >= slot->client + slot->len) continue;
    slot->busy = false;
    slot->to_client = false;
    const CUresult e = state_->api.cuEventSynchronize(slot->done);
    if (e != CUDA_SUCCESS && deferred_ == CUDA_SUCCESS) deferred_ = e;
  }
}

CUresult Session::RmaTransportFailed(const Status& why) {
  if (!rma_failed_.exchange(true)) {
    FLYT_WARN("session %llu: a one-sided copy with the client failed (%s); closing",
              static_cast<unsigned long long>(id_), why.message().c_str());
  }
  conn_->Shutdown();  // the next receive ends the session
  return CUDA_ERROR_UNKNOWN;
}

// A host function behind an asynchronous device-to-host copy into a staging buffer:
// writes the bytes to the client before anything later in the stream runs.
void Session::RmaWriteToClient(void* p) {
  auto* slot = static_cast<RmaSlot*>(p);
  Session* s = slot->session;
  if (s->rma_failed_.load()) return;
  Status st = s->rma_->Write(slot->buf, slot->len, slot->client, slot->key, false);
  if (!st.ok()) {
    slot->lost = true;
    s->RmaTransportFailed(st);
  }
}

bool Session::RmaDirectRange(uint64_t device, uint64_t n) {
  CUdeviceptr base = 0;
  size_t size = 0;
  if (MemGetAddressRange(&base, &size, device) != CUDA_SUCCESS) return false;
  if (device - base > size || n > size - (device - base)) return false;
  // A plain allocation of this session's (not managed memory, not an IPC mapping).
  return Owns(HandleKind::kMemory, base) && !pager_.Contains(device, n) && !IpcMapped(device, n);
}

CUresult Session::CopyRmaDirect(bool to_device, uint64_t device, uint64_t key, uint64_t client,
                                uint64_t n, CUstream stream, bool per_thread) {
  DriverApi& a = state_->api;
  // A synchronous copy runs after the stream's earlier work (and reports its error).
  auto sync =
      per_thread && a.cuStreamSynchronize_pt ? a.cuStreamSynchronize_pt : a.cuStreamSynchronize;
  CUresult rc = sync(stream);
  if (rc != CUDA_SUCCESS) return rc;
  if (to_device) FinishRmaWrites(client, n);
  void* dev = reinterpret_cast<void*>(device);
  const bool gpu = !a.is_sim;  // the sim's device memory is host memory
  Status st =
      to_device ? rma_->Read(dev, n, client, key, gpu) : rma_->Write(dev, n, client, key, gpu);
  return st.ok() ? CUDA_SUCCESS : RmaTransportFailed(st);
}

// Request: u8 to_device, u64 device, u64 key, u64 client address, u64 bytes, u64 stream,
// u8 async.
bool Session::CopyRma(Reader& in, bool per_thread, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t to_device = 0, async = 0;
  uint64_t device = 0, key = 0, client = 0, n = 0, stream = 0;
  if (!in.Get(&to_device) || !in.Get(&device) || !in.Get(&key) || !in.Get(&client) || !in.Get(&n) ||
      !in.Get(&stream) || !in.Get(&async) || in.remaining() != 0 || to_device > 1 || async > 1)
    return false;
  auto it = rma_keys_.find(key);
  if (rma_ == nullptr || it == rma_keys_.end() || client < it->second.base ||
      client - it->second.base > it->second.size ||
      n > it->second.size - (client - it->second.base)) {
    *rc = CUDA_ERROR_INVALID_VALUE;  // only memory the client registered
    return true;
  }
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  if (n == 0) return true;
  CUstream s = RealStream(stream == 0 && per_thread ? 2 : stream);
  if (Capturing(s)) {
    // The client sends these only while no capture runs (graphs take the byte path).
    *rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return true;
  }
  if (rma_failed_.load()) {
    *rc = RmaTransportFailed(Status::Error("an earlier one-sided copy failed"));
    return true;
  }
  if (!async && rma_direct_ && RmaDirectRange(device, n)) {
    *rc = CopyRmaDirect(to_device, device, key, client, n, s, per_thread);
    return true;
  }
  if (!EnsureRmaStaging()) {
    *rc = CUDA_ERROR_OUT_OF_MEMORY;
    return true;
  }
  const size_t chunk = wire::kCopyChunk;
  if (to_device) {
    FinishRmaWrites(client, n);  // bytes still on their way to that memory come first
    RmaSlot* last = nullptr;
    for (uint64_t off = 0; off < n && *rc == CUDA_SUCCESS; off += chunk) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(chunk, n - off));
      RmaSlot* slot = TakeRmaSlot(rc);
      if (slot == nullptr) break;
      Status st = rma_->Read(slot->buf, len, client + off, key, false);
      if (!st.ok()) {
        slot->lost = true;
        *rc = RmaTransportFailed(st);
        break;
      }
      *rc = a.cuMemcpyHtoDAsync_v2(device + off, slot->buf, len, s);
      if (*rc == CUDA_SUCCESS) *rc = a.cuEventRecord(slot->done, s);
      slot->busy = *rc == CUDA_SUCCESS;
      if (slot->busy) last = slot;
    }
    // A synchronous copy is complete when it returns (its chunks ran in stream order).
    if (!async && last != nullptr) {
      last->busy = false;
      const CUresult e = a.cuEventSynchronize(last->done);
      if (*rc == CUDA_SUCCESS) *rc = e;
    }
    return true;
  }
  if (async) {
    for (uint64_t off = 0; off < n && *rc == CUDA_SUCCESS; off += chunk) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(chunk, n - off));
      RmaSlot* slot = TakeRmaSlot(rc);
      if (slot == nullptr) break;
      *rc = a.cuMemcpyDtoHAsync_v2(slot->buf, device + off, len, s);
      if (*rc != CUDA_SUCCESS) break;
      slot->to_client = true;
      slot->client = client + off;
      slot->len = len;
      slot->key = key;
      *rc = a.cuLaunchHostFunc(s, &Session::RmaWriteToClient, slot);
      if (*rc == CUDA_SUCCESS) *rc = a.cuEventRecord(slot->done, s);
      slot->busy = true;  // waited for before reuse, whatever happened
      if (*rc != CUDA_SUCCESS) {
        // The write may or may not run: wait for the stream before the buffer is reused.
        const CUresult e = a.cuStreamSynchronize(s);
        if (e != CUDA_SUCCESS && deferred_ == CUDA_SUCCESS) deferred_ = e;
        slot->busy = false;
        slot->to_client = false;
      }
    }
    return true;
  }
  // Synchronous: chunk i+1 leaves the device while chunk i is written to the client.
  struct Pending {
    RmaSlot* slot;
    uint64_t off;
    size_t len;
  };
  Pending queue[2];
  int queued = 0;
  auto drain_one = [&]() -> bool {
    Pending p = queue[0];
    queue[0] = queue[1];
    --queued;
    p.slot->busy = false;
    CUresult e = a.cuEventSynchronize(p.slot->done);
    if (e != CUDA_SUCCESS) {
      if (*rc == CUDA_SUCCESS) *rc = e;
      return false;
    }
    if (*rc != CUDA_SUCCESS) return false;
    Status st = rma_->Write(p.slot->buf, p.len, client + p.off, key, false);
    if (!st.ok()) {
      p.slot->lost = true;
      *rc = RmaTransportFailed(st);
      return false;
    }
    return true;
  };
  for (uint64_t off = 0; off < n && *rc == CUDA_SUCCESS; off += chunk) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(chunk, n - off));
    if (queued == 2 && !drain_one()) break;
    RmaSlot* slot = TakeRmaSlot(rc);
    if (slot == nullptr) break;
    *rc = a.cuMemcpyDtoHAsync_v2(slot->buf, device + off, len, s);
    if (*rc == CUDA_SUCCESS) *rc = a.cuEventRecord(slot->done, s);
    if (*rc != CUDA_SUCCESS) break;
    slot->busy = true;
    queue[queued++] = Pending{slot, off, len};
  }
  while (queued > 0) drain_one();
  return true;
}

void Session::ReleaseRmaStaging() {
  if (rma_slots_.empty()) return;
  DriverApi& a = state_->api;
  for (auto& slot : rma_slots_) {
    // Its write to the client ends first (it fails at once when the client is gone).
    if (slot->busy && a.cuEventSynchronize(slot->done) != CUDA_SUCCESS) {
      FLYT_DEBUG("session %llu: a staging buffer's last use ended with an error",
                 static_cast<unsigned long long>(id_));
    }
    slot->busy = false;
  }
  size_t kept = 0;
  for (auto& slot : rma_slots_) {
    if (slot->lost) {
      // The transport may still hold a transfer into it: it stays, unregistered never.
      ++kept;
      (void)slot.release();
      continue;
    }
    if (slot->local != 0 && rma_ != nullptr) rma_->UnregisterLocal(slot->local);
    if (slot->done != nullptr) a.cuEventDestroy_v2(slot->done);
    if (slot->buf != nullptr) a.cuMemFreeHost(slot->buf);
  }
  if (kept > 0)
    FLYT_WARN("session %llu: %zu staging buffer(s) left to a failed transfer",
              static_cast<unsigned long long>(id_), kept);
  rma_slots_.clear();
  rma_next_ = 0;
}

}  // namespace flyt::server
