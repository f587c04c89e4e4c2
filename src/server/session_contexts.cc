// Contexts the client creates (cuCtxCreate / cuCtxDestroy), on the server.
//
// Owns: kOpCtxCreate and kOpCtxDestroy; the session's user contexts (real
// contexts of this worker, or green contexts of the tenant's SM share when the
// share gives the device one, so that a user context runs within the share
// too); which context the session's thread has current; the handles made while
// a user context is current, which its destroy takes along (memory refunded to
// the quota, the driver never called on what the destroy freed); the user
// contexts left at the session's end. The client's handle of a user context is
// the driver's CUcontext itself (RealContext passes it through).
// Must not touch the primary context, the session's execution context
// (session_share.cc) or any other session's state.
#include "common/log.h"
#include "server/session.h"
#include "server/tenant_board.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

namespace {

// What cuCtxDestroy frees with the context (its documentation: modules,
// functions, streams, events, arrays, cuMemAlloc memory). Graph execs are
// instantiated in it and go too. Libraries, kernels, graphs and pools do not
// belong to a context.
bool ContextBound(HandleKind kind) {
  switch (kind) {
    case HandleKind::kStream:
    case HandleKind::kEvent:
    case HandleKind::kMemory:
    case HandleKind::kModule:
    case HandleKind::kFunction:
    case HandleKind::kArray:
    case HandleKind::kGraphExec:
      return true;
    default:
      return false;
  }
}

// cuMemAllocAsync / cuMemAllocFromPoolAsync (protocol/api_list.h): stream-
// ordered memory outlives the context (cuCtxDestroy's documentation).
bool StreamOrdered(uint16_t op) { return op == 240 || op == 241; }

// The flags cuCtxCreate accepts: CU_CTX_FLAGS_MASK, one scheduling policy.
bool ValidFlags(unsigned flags) {
  if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0) return false;
  unsigned sched = flags & CU_CTX_SCHED_MASK;
  return sched == CU_CTX_SCHED_AUTO || sched == CU_CTX_SCHED_SPIN || sched == CU_CTX_SCHED_YIELD ||
         sched == CU_CTX_SCHED_BLOCKING_SYNC;
}

std::pair<uint8_t, uint64_t> Key(HandleKind kind, uint64_t value) {
  return {static_cast<uint8_t>(kind), value};
}

}  // namespace

bool Session::CtxCreate(Reader& in, Writer& out, CUresult* rc) {
  int32_t dev = 0;
  uint32_t flags = 0;
  if (!in.Get(&dev) || !in.Get(&flags) || in.remaining() != 0) return false;
  DriverApi& a = state_->api;
  out.Put<uint64_t>(0);  // replaced below on success
  out.Put<uint32_t>(0);
  if (dev < 0 || static_cast<size_t>(dev) >= state_->devices.size()) {
    *rc = CUDA_ERROR_INVALID_DEVICE;
    return true;
  }
  if (a.cuCtxCreate_v4 == nullptr || a.cuCtxDestroy_v2 == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  UserContext uc;
  uc.device = dev;
  CUcontext ctx = nullptr;
  unsigned got_flags = flags;
  ExecConfig config = state_->share.Exec();
  const bool green = static_cast<size_t>(dev) < config.desc.size() && config.desc[dev] != nullptr;
  if (green) {
    // The tenant's SM share: a green context of its own, as the session's.
    if (!ValidFlags(flags)) {
      *rc = CUDA_ERROR_INVALID_VALUE;
      return true;
    }
    *rc = MakeExec(dev, config, &uc.green, &ctx);
    if (*rc == CUDA_SUCCESS && uc.green == nullptr) *rc = CUDA_ERROR_UNKNOWN;
    if (*rc != CUDA_SUCCESS) return true;
  } else {
    *rc = a.cuCtxCreate_v4(&ctx, nullptr, flags, dev);
    if (*rc == CUDA_SUCCESS && ctx == nullptr) *rc = CUDA_ERROR_UNKNOWN;
    if (*rc != CUDA_SUCCESS) return true;
    // The driver pushed it onto this thread's stack; popping it keeps the
    // stack one entry deep (the session switches with cuCtxSetCurrent).
    CUresult popped = a.cuCtxSetCurrent(nullptr);
    if (popped != CUDA_SUCCESS)
      FLYT_WARN("session %llu: popping a new context failed with error %d",
                static_cast<unsigned long long>(id_), popped);
  }
  CUresult made_current = a.cuCtxSetCurrent(ctx);
  if (made_current == CUDA_SUCCESS && !green && a.cuCtxGetFlags != nullptr) {
    CUresult asked = a.cuCtxGetFlags(&got_flags);
    if (asked != CUDA_SUCCESS) got_flags = flags;
  }
  if (made_current != CUDA_SUCCESS) {
    CUresult undone = green ? a.cuGreenCtxDestroy(uc.green) : a.cuCtxDestroy_v2(ctx);
    if (undone != CUDA_SUCCESS)
      FLYT_WARN(
          "session %llu: destroying a context that could not be made current failed "
          "with error %d",
          static_cast<unsigned long long>(id_), undone);
    CUresult back = a.cuCtxSetCurrent(current_ctx_ != 0 ? RealContext(current_ctx_) : nullptr);
    if (back != CUDA_SUCCESS)
      FLYT_WARN("session %llu: restoring the current context failed with error %d",
                static_cast<unsigned long long>(id_), back);
    *rc = made_current;
    return true;
  }
  const uint64_t raw = reinterpret_cast<uintptr_t>(ctx);
  user_contexts_[raw] = uc;
  // NVML's process list: this client has a context on `dev` (as EnterExec says
  // for the primary context's).
  if (state_->slot != nullptr && state_->slot->device.load() < 0) state_->slot->device = dev;
  Adopt(HandleKind::kContext, raw);
  NoteCurrentContext(raw);
  out.Clear();
  out.Put<uint64_t>(raw);
  out.Put<uint32_t>(got_flags);
  FLYT_DEBUG("session %llu: created context %#llx on device %d%s",
             static_cast<unsigned long long>(id_), static_cast<unsigned long long>(raw), dev,
             green ? " (green context of the tenant's SMs)" : "");
  return true;
}

bool Session::CtxDestroy(Reader& in, Writer& out, CUresult* rc) {
  uint64_t raw = 0;
  if (!in.Get(&raw) || in.remaining() != 0) return false;
  std::vector<uint64_t> memory, modules;
  if (raw == 0) {
    *rc = CUDA_ERROR_INVALID_VALUE;
  } else if (user_contexts_.count(raw) == 0) {
    // The primary context, one destroyed before, or no context at all.
    *rc = CUDA_ERROR_INVALID_CONTEXT;
  } else {
    *rc = DestroyUserContext(raw, &memory, &modules);
  }
  out.Put<uint32_t>(static_cast<uint32_t>(memory.size()));
  for (uint64_t m : memory) out.Put<uint64_t>(m);
  out.Put<uint32_t>(static_cast<uint32_t>(modules.size()));
  for (uint64_t m : modules) out.Put<uint64_t>(m);
  return true;
}

CUresult Session::DestroyUserContext(uint64_t raw, std::vector<uint64_t>* memory,
                                     std::vector<uint64_t>* modules) {
  DriverApi& a = state_->api;
  auto it = user_contexts_.find(raw);
  if (it == user_contexts_.end()) return CUDA_ERROR_INVALID_CONTEXT;
  UserContext uc = it->second;
  auto* ctx = reinterpret_cast<CUcontext>(raw);
  auto warn = [&](const char* what, CUresult r) {
    if (r != CUDA_SUCCESS)
      FLYT_WARN("session %llu: destroying context %#llx: %s failed with error %d",
                static_cast<unsigned long long>(id_), static_cast<unsigned long long>(raw), what,
                r);
  };
  // The staging buffers and events may have been made in it; made again on use.
  ReleaseStaging();
  // Its work runs to the end, and its handles go while it is current: a
  // green context shares the primary context's memory and would leave them.
  warn("cuCtxSetCurrent", a.cuCtxSetCurrent(ctx));
  if (a.cuCtxSynchronize != nullptr) {
    CUresult synced = a.cuCtxSynchronize();
    if (synced != CUDA_SUCCESS)
      FLYT_DEBUG("session %llu: cuCtxSynchronize before destroying a context: error %d",
                 static_cast<unsigned long long>(id_), synced);
  }
  std::vector<std::pair<uint8_t, uint64_t>> owned;
  for (const auto& [key, owner] : user_owned_)
    if (owner == raw) owned.push_back(key);
  auto each = [&](HandleKind kind, auto&& fn) {
    for (const auto& [k, h] : owned)
      if (k == static_cast<uint8_t>(kind)) {
        fn(h);
        Forget(kind, h);  // refunds memory and arrays; erases the user_owned_ entry
      }
  };
  each(HandleKind::kGraphExec, [&](uint64_t h) {
    warn("cuGraphExecDestroy", a.cuGraphExecDestroy(reinterpret_cast<CUgraphExec>(h)));
  });
  each(HandleKind::kEvent, [&](uint64_t h) {
    warn("cuEventDestroy", a.cuEventDestroy_v2(reinterpret_cast<CUevent>(h)));
  });
  each(HandleKind::kStream,
       [&](uint64_t h) { warn("cuStreamDestroy", a.cuStreamDestroy_v2(RealStream(h))); });
  if (uc.pt_stream != nullptr) warn("cuStreamDestroy", a.cuStreamDestroy_v2(uc.pt_stream));
  each(HandleKind::kArray,
       [&](uint64_t h) { warn("cuArrayDestroy", a.cuArrayDestroy(reinterpret_cast<CUarray>(h))); });
  each(HandleKind::kMemory, [&](uint64_t h) {
    pager_.Remove(h);  // managed memory: the pager lets go first
    warn("cuMemFree", a.cuMemFree_v2(static_cast<CUdeviceptr>(h)));
    if (memory != nullptr) memory->push_back(h);
  });
  each(HandleKind::kModule, [&](uint64_t h) {
    // A library's module in this context goes with the context, not by unloading.
    if (!LibraryOwnsModule(h))
      warn("cuModuleUnload", a.cuModuleUnload(reinterpret_cast<CUmodule>(h)));
    if (modules != nullptr) modules->push_back(h);
  });
  each(HandleKind::kFunction, [](uint64_t) {});  // went with their modules
  CUresult rc = uc.green != nullptr ? a.cuGreenCtxDestroy(uc.green) : a.cuCtxDestroy_v2(ctx);
  warn(uc.green != nullptr ? "cuGreenCtxDestroy" : "cuCtxDestroy", rc);
  user_contexts_.erase(raw);
  Forget(HandleKind::kContext, raw);
  // The session's thread gets back what it had current (nothing, when that was
  // this context: the destroy popped it, as the driver pops it for the caller).
  uint64_t back = current_ctx_ == raw ? 0 : current_ctx_;
  CUresult restored = a.cuCtxSetCurrent(back != 0 ? RealContext(back) : nullptr);
  if (back != 0) warn("restoring the current context", restored);
  NoteCurrentContext(back);
  FLYT_DEBUG("session %llu: destroyed context %#llx with %zu handles",
             static_cast<unsigned long long>(id_), static_cast<unsigned long long>(raw),
             owned.size());
  // A sticky error of earlier work is the app's to see at its next call.
  return rc;
}

void Session::NoteCurrentContext(uint64_t raw) {
  current_ctx_ = raw;
  current_user_ = raw != 0 && user_contexts_.count(raw) != 0 ? raw : 0;
}

void Session::NoteContextHandle(HandleKind kind, uint64_t value) {
  if (!ContextBound(kind)) return;
  if (kind == HandleKind::kMemory && StreamOrdered(req_.op)) return;
  user_owned_[Key(kind, value)] = current_user_;
}

void Session::DropContextHandle(HandleKind kind, uint64_t value) {
  user_owned_.erase(Key(kind, value));
}

bool Session::UserOwned(HandleKind kind, uint64_t value) const {
  return !user_owned_.empty() && user_owned_.count(Key(kind, value)) != 0;
}

bool Session::CurrentIsGreen() const {
  if (const MorePrimary* more = CurrentMore(); more != nullptr) return more->green != nullptr;
  if (current_user_ == 0) return green_ != nullptr;
  auto it = user_contexts_.find(current_user_);
  return it != user_contexts_.end() && it->second.green != nullptr;
}

CUstream Session::UserDefaultStream(uint64_t raw) const {
  auto it = user_contexts_.find(current_user_);
  if (it == user_contexts_.end() || it->second.green == nullptr)
    return reinterpret_cast<CUstream>(raw);  // the context's own default streams
  // A green context has no per-thread default stream: a blocking stream of
  // its own stands in (made on first use, with the context current).
  const UserContext& uc = it->second;
  if (uc.pt_stream == nullptr &&
      state_->api.cuStreamCreate(&uc.pt_stream, CU_STREAM_DEFAULT) != CUDA_SUCCESS) {
    uc.pt_stream = nullptr;
    return reinterpret_cast<CUstream>(raw);  // the driver's own error follows
  }
  return uc.pt_stream;
}

void Session::KeepUserContextCurrent() {
  if (current_user_ == 0) return;
  CUresult rc = state_->api.cuCtxSetCurrent(reinterpret_cast<CUcontext>(current_user_));
  if (rc != CUDA_SUCCESS)
    FLYT_WARN("session %llu: making context %#llx current again failed with error %d",
              static_cast<unsigned long long>(id_), static_cast<unsigned long long>(current_user_),
              rc);
}

std::vector<Session::StashedHandle> Session::StashUserHandles() {
  std::vector<StashedHandle> stash;
  auto take = [&](HandleKind kind, uint64_t value) {
    StashedHandle s{kind, value, 0};
    handles_[static_cast<int>(kind)].erase(value);
    auto& sizes = kind == HandleKind::kArray ? array_bytes_ : memory_bytes_;
    if (kind == HandleKind::kMemory || kind == HandleKind::kArray) {
      auto it = sizes.find(value);
      if (it != sizes.end()) {
        s.bytes = it->second;
        sizes.erase(it);
      }
    }
    stash.push_back(s);
  };
  for (const auto& [key, owner] : user_owned_) take(static_cast<HandleKind>(key.first), key.second);
  for (const auto& [raw, uc] : user_contexts_) take(HandleKind::kContext, raw);
  return stash;
}

void Session::RestoreUserHandles(const std::vector<StashedHandle>& stash) {
  for (const StashedHandle& s : stash) {
    handles_[static_cast<int>(s.kind)].insert(s.value);
    if (s.kind == HandleKind::kMemory) memory_bytes_[s.value] = s.bytes;
    if (s.kind == HandleKind::kArray) array_bytes_[s.value] = s.bytes;
  }
  KeepUserContextCurrent();  // ReleaseAll made the primary context current
}

void Session::ReleaseUserContexts() {
  if (user_contexts_.empty()) return;
  size_t n = user_contexts_.size();
  while (!user_contexts_.empty())  // each call forgets the context, whatever the driver says
    DestroyUserContext(user_contexts_.begin()->first, nullptr, nullptr);
  FLYT_INFO("session %llu: destroyed %zu context(s) the client left",
            static_cast<unsigned long long>(id_), n);
}

}  // namespace flyt::server
