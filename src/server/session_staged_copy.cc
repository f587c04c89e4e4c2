// Session handler for pageable device-to-host copies over shm:// (kOpCopyFromDeviceStaged).
//
// Owns: the chunk pipeline of one such copy. The client shared a staging area with
// kOpHostShare (session_shared_host.cc: mapped, registered with cuMemHostRegister), so
// the GPU writes each chunk straight into the client's memory (cuMemcpyDtoHAsync into a
// registered region is a DMA, as into cuMemHostAlloc memory). Up to `slots` chunks are
// in flight on the copy's stream, each with an event; as each completes the server sends
// a StagedNotice and the client copies that slot out into the app's pageable buffer,
// then acks it, and only then is the slot written again. No byte crosses the rings.
// A failure (bad address, sticky error) is the notice of the chunk that failed and the
// call's status; a client that goes away mid-copy ends the session, after the chunks
// in flight have landed (their memory is unregistered with the session's regions).
// Must not touch: the regions themselves (session_shared_host.cc owns them), the
// byte-stream staging of session.cc, other sessions.
#include <algorithm>
#include <vector>

#include "common/log.h"
#include "server/session.h"
#include "server/tenant_board.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;

namespace {

// A copy may name at most this many bytes (the driver refuses more than exists anyway).
constexpr uint64_t kMaxStagedCopy = uint64_t{1} << 40;

}  // namespace

// Request: u64 src, u64 size, u64 stream, u8 async, u64 staging, u64 chunk, u32 slots.
bool Session::CopyFromDeviceStaged(Reader& in, bool per_thread, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t src = 0, size = 0, stream = 0, staging = 0, chunk = 0;
  uint8_t async = 0;
  uint32_t slots = 0;
  if (!in.Get(&src) || !in.Get(&size) || !in.Get(&stream) || !in.Get(&async) || !in.Get(&staging) ||
      !in.Get(&chunk) || !in.Get(&slots) || in.remaining() != 0)
    return false;
  // The client derives the chunk count the same way: a mismatch would desynchronise
  // the notices, so a request that makes no sense closes the session.
  if (size == 0 || size > kMaxStagedCopy || chunk == 0 || chunk > kMaxStagedCopy || slots == 0 ||
      slots > ops::kMaxStagedSlots)
    return false;
  const uint64_t chunks = (size + chunk - 1) / chunk;
  if (chunks > UINT32_MAX) return false;
  const unsigned lanes = static_cast<unsigned>(std::min<uint64_t>(slots, chunks));
  // Several chunks: every outcome, an early refusal included, is told as notices.
  auto refuse = [&](CUresult e) {
    *rc = e;
    if (chunks == 1) return true;
    ops::StagedNotice n{0, static_cast<uint32_t>(e)};
    iovec iov{&n, sizeof(n)};
    if (!conn_->Send(&iov, 1).ok()) conn_->Shutdown();
    return true;
  };
  if (!InSharedHost(staging, chunk * lanes)) return refuse(CUDA_ERROR_INVALID_VALUE);
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) return refuse(CUDA_ERROR_INVALID_HANDLE);
  const uint64_t target = stream == 0 && per_thread ? 2 : stream;
  CUstream s = RealStream(target);
  // The client never stages while it captures; a graph must not write the staging area.
  // (The legacy default stream is never captured: no driver call for the common case.)
  if (target != 0 && Capturing(s)) return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  auto* area = reinterpret_cast<uint8_t*>(staging);
  // The tenant's byte counters count what reaches the client, as when the bytes
  // crossed the ring in the reply.
  auto count_out = [&](uint64_t bytes) {
    if (state_->slot != nullptr)
      state_->slot->bytes_out.fetch_add(bytes, std::memory_order_relaxed);
  };

  if (chunks == 1) {
    if (async) {
      *rc = a.cuMemcpyDtoHAsync_v2(area, src, size, s);
      if (*rc == CUDA_SUCCESS) *rc = a.cuStreamSynchronize(s);
    } else {
      auto copy = per_thread && a.cuMemcpyDtoH_v2_pt ? a.cuMemcpyDtoH_v2_pt : a.cuMemcpyDtoH_v2;
      *rc = copy(area, src, size);
    }
    if (*rc == CUDA_SUCCESS) count_out(size);
    return true;
  }

  std::vector<CUevent> done(lanes, nullptr);
  for (CUevent& e : done) {
    CUresult made = a.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
    if (made != CUDA_SUCCESS) {
      for (CUevent x : done)
        if (x != nullptr) a.cuEventDestroy_v2(x);
      return refuse(made);
    }
  }
  uint64_t enqueued = 0;  // chunks handed to the stream
  uint64_t notified = 0;  // chunks announced as there
  uint64_t acked = 0;     // chunks the client copied out
  CUresult failed = CUDA_SUCCESS;
  uint64_t failed_at = UINT64_MAX;  // the chunk whose enqueue failed
  bool transport_ok = true;
  auto enqueue = [&] {
    const uint64_t i = enqueued;
    const uint64_t off = i * chunk;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(chunk, size - off));
    CUevent ev = done[i % lanes];
    CUresult e = a.cuMemcpyDtoHAsync_v2(area + (i % lanes) * chunk, src + off, len, s);
    if (e == CUDA_SUCCESS) e = a.cuEventRecord(ev, s);
    if (e != CUDA_SUCCESS) {
      failed = e;
      failed_at = i;
      return;
    }
    ++enqueued;
  };
  auto send_notice = [&](uint64_t i, CUresult e) {
    ops::StagedNotice n{static_cast<uint32_t>(i), static_cast<uint32_t>(e)};
    iovec iov{&n, sizeof(n)};
    transport_ok = conn_->Send(&iov, 1).ok();
    return transport_ok;
  };
  auto receive_ack = [&] {
    uint64_t ack = UINT64_MAX;
    transport_ok = conn_->Receive(&ack, sizeof(ack)).ok();
    if (!transport_ok) return false;
    if (ack != acked) {
      FLYT_WARN("session %llu from %s: staged copy: ack %llu where %llu was due; closing",
                static_cast<unsigned long long>(id_), peer_.c_str(),
                static_cast<unsigned long long>(ack), static_cast<unsigned long long>(acked));
      transport_ok = false;
      return false;
    }
    ++acked;
    return true;
  };

  while (transport_ok && notified < chunks) {
    // Keep every free slot busy; a slot is free once the client acked its last chunk.
    while (failed == CUDA_SUCCESS && enqueued < chunks && enqueued - acked < lanes) enqueue();
    if (notified < enqueued) {
      CUresult e = a.cuEventSynchronize(done[notified % lanes]);
      if (e != CUDA_SUCCESS) {
        failed = e;
        failed_at = notified;
        break;
      }
      if (!send_notice(notified, CUDA_SUCCESS)) break;
      count_out(std::min<uint64_t>(chunk, size - notified * chunk));
      ++notified;
    } else if (failed != CUDA_SUCCESS) {
      break;  // the chunks before the one that failed are announced
    } else if (!receive_ack()) {
      break;  // all slots hold announced chunks: an ack is due
    }
  }
  // The chunk that failed (at its enqueue or on the device) ends the notices.
  if (transport_ok && failed != CUDA_SUCCESS) send_notice(failed_at, failed);
  // The client acks every chunk announced as there before it reads the reply.
  while (transport_ok && acked < notified) receive_ack();
  // Nothing may still write the staging area once the call is answered.
  for (uint64_t i = notified; i < enqueued; ++i) a.cuEventSynchronize(done[i % lanes]);
  for (CUevent e : done) a.cuEventDestroy_v2(e);
  if (!transport_ok) {
    FLYT_INFO("session %llu: the client went away during a staged device-to-host copy",
              static_cast<unsigned long long>(id_));
    conn_->Shutdown();  // the reply fails and the session ends
  }
  *rc = failed;
  return true;
}

}  // namespace flyt::server
