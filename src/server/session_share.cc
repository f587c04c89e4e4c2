// Session handlers for the tenant's SM share: the execution context a session
// runs under and its move to a new one after a live SM change.
//
// With green contexts each session makes its own green context from the
// server's descriptor (a green context may be current to one thread at a time,
// and a session is one thread); it is what the session's thread has current
// wherever the primary context was current before. Memory and code belong to
// the primary context and stay valid across a move. Streams do not: at the
// first call after a change, the session drains its work, makes a green
// context from the new descriptor, and replaces each of its streams with a new
// one of the same flags and priority there. The client keeps its handles
// (Session::RealStream translates); the replaced streams and contexts live
// until the session ends, so that no handle value can be handed out twice.
#include <chrono>

#include "common/log.h"
#include "server/session.h"
#include "server/tenant_board.h"

namespace flyt::server {

using marshal::HandleKind;

CUresult Session::MakeExec(int device, const ExecConfig& config, CUgreenCtx* green,
                           CUcontext* ctx) {
  DriverApi& a = state_->api;
  *green = nullptr;
  *ctx = primary_;
  if (device < 0 || static_cast<size_t>(device) >= config.desc.size() ||
      config.desc[device] == nullptr)
    return CUDA_SUCCESS;  // the whole GPU (or what MPS leaves): the primary context
  if (a.cuGreenCtxCreate == nullptr || a.cuCtxFromGreenCtx == nullptr)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUgreenCtx g = nullptr;
  CUresult rc = a.cuGreenCtxCreate(&g, config.desc[device], device, CU_GREEN_CTX_DEFAULT_STREAM);
  if (rc != CUDA_SUCCESS) return rc;
  CUcontext c = nullptr;
  rc = a.cuCtxFromGreenCtx(&c, g);
  if (rc != CUDA_SUCCESS) {
    CUresult destroyed = a.cuGreenCtxDestroy(g);
    if (destroyed != CUDA_SUCCESS)
      FLYT_WARN("session %llu: cuGreenCtxDestroy failed with error %d",
                static_cast<unsigned long long>(id_), destroyed);
    return rc;
  }
  *green = g;
  *ctx = c;
  return CUDA_SUCCESS;
}

// At the primary context's retain: the session's execution context for `device`.
void Session::EnterExec(int device) {
  ExecConfig config = state_->share.Exec();
  if (exec_ != nullptr && device == exec_device_ && exec_generation_.load() == config.generation)
    return;  // retained again: the context the session has is current
  CUgreenCtx green = nullptr;
  CUcontext ctx = nullptr;
  CUresult rc = MakeExec(device, config, &green, &ctx);
  if (rc != CUDA_SUCCESS) {
    FLYT_WARN(
        "session %llu: cannot make a green context of %d SMs (error %d); running on the "
        "primary context (whole GPU)",
        static_cast<unsigned long long>(id_), config.sm, rc);
    green = nullptr;
    ctx = primary_;
  }
  if (green_ != nullptr) old_greens_.push_back(green_);  // streams may live in it
  green_ = green;
  exec_ = ctx;
  exec_device_ = device;
  if (state_->slot != nullptr) state_->slot->device = device;
  exec_generation_ = config.generation;
  if (green_ != nullptr)
    FLYT_INFO("session %llu: green context of %d SMs", static_cast<unsigned long long>(id_),
              config.sm);
}

void Session::SwitchExec() {
  ExecConfig config = state_->share.Exec();
  if (primary_ == nullptr) {  // no context yet: the retain makes it from the new config
    exec_generation_ = config.generation;
    return;
  }
  if (captures_.load() > 0) return;  // moving streams would break the capture: after it
  DriverApi& a = state_->api;
  auto t0 = std::chrono::steady_clock::now();
  // What the session queued runs to its end under the old share.
  CUresult rc = SynchronizeSession();
  if (rc != CUDA_SUCCESS && deferred_ == CUDA_SUCCESS) deferred_ = rc;
  ReleaseStaging();  // its events and buffers belong to the old context; made again lazily
  CUgreenCtx green = nullptr;
  CUcontext ctx = nullptr;
  rc = MakeExec(primary_device_, config, &green, &ctx);
  exec_generation_ = config.generation;
  if (rc != CUDA_SUCCESS) {
    FLYT_WARN(
        "session %llu: cannot make a green context of %d SMs (error %d); staying on the "
        "old share",
        static_cast<unsigned long long>(id_), config.sm, rc);
    return;
  }
  rc = a.cuCtxSetCurrent(ctx);
  if (rc != CUDA_SUCCESS) {
    FLYT_WARN(
        "session %llu: cuCtxSetCurrent of the new context failed (error %d); staying on "
        "the old share",
        static_cast<unsigned long long>(id_), rc);
    if (green != nullptr && a.cuGreenCtxDestroy(green) != CUDA_SUCCESS)
      FLYT_WARN("session %llu: cuGreenCtxDestroy failed", static_cast<unsigned long long>(id_));
    a.cuCtxSetCurrent(exec_);
    return;
  }
  if (green_ != nullptr) old_greens_.push_back(green_);
  if (pt_stream_ != nullptr) retired_streams_.push_back(pt_stream_);
  pt_stream_ = nullptr;  // made again in the new context on first use
  green_ = green;
  exec_ = ctx;
  // Each stream moves: a new stream with the same flags and priority in the
  // new context; the client's handle now names it.
  size_t moved = 0;
  for (uint64_t h : handles_[static_cast<int>(HandleKind::kStream)]) {
    if (UserOwned(HandleKind::kStream, h)) continue;  // a context the client created keeps it
    CUstream old = RealStream(h);
    unsigned flags = 0;
    int priority = 0;
    CUresult f = a.cuStreamGetFlags(old, &flags);
    CUresult p = a.cuStreamGetPriority(old, &priority);
    CUstream fresh = nullptr;
    CUresult c = f != CUDA_SUCCESS ? f : p != CUDA_SUCCESS ? p : CUDA_SUCCESS;
    if (c == CUDA_SUCCESS) c = a.cuStreamCreateWithPriority(&fresh, flags, priority);
    if (c != CUDA_SUCCESS) {
      FLYT_WARN("session %llu: stream %#llx stays in the old context (error %d)",
                static_cast<unsigned long long>(id_), static_cast<unsigned long long>(h), c);
      continue;
    }
    stream_map_[h] = fresh;
    retired_streams_.push_back(old);
    ++moved;
  }
  auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  state_->share.NoteSwitch(static_cast<uint64_t>(us));
  if (state_->board != nullptr) state_->board->layout().last_switch_us = static_cast<uint64_t>(us);
  FLYT_INFO("session %llu: now on %s%s, %zu stream(s) moved in %lld us",
            static_cast<unsigned long long>(id_), green_ != nullptr ? "a green context of " : "",
            green_ != nullptr ? (std::to_string(config.sm) + " SMs").c_str() : "the whole GPU",
            moved, static_cast<long long>(us));
}

// At the session's end, after ReleaseAll destroyed its streams.
void Session::ReleaseExec() {
  DriverApi& a = state_->api;
  if (green_ != nullptr) old_greens_.push_back(green_);
  green_ = nullptr;
  if (!old_greens_.empty() && primary_ != nullptr) a.cuCtxSetCurrent(primary_);
  for (CUgreenCtx g : old_greens_) {
    CUresult rc = a.cuGreenCtxDestroy(g);
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("session %llu: cuGreenCtxDestroy failed with error %d",
                static_cast<unsigned long long>(id_), rc);
  }
  old_greens_.clear();
  exec_ = primary_;
}

}  // namespace flyt::server
