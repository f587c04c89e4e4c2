// NCCL run by the server for its client (ops::kOpNccl; the client's calls come
// from Flyt's libnccl.so.2, src/nccl/). The collectives run here, on this GPU,
// and their bytes go between the servers of the communicator's ranks over
// NCCL's own transports: never through the client.
//
// Owns: the session's communicators (NCCL's pointers, which the client holds as
// values and which are checked on every use), their buffer registrations and
// PreMulSum ops, the session's NCCL group depth, and the loading of the NCCL
// library (ServerState::nccl) at the first call. A communicator the client
// leaves is aborted when it exits or dies. Each call runs in the session's
// current context, which is made current again afterwards (NCCL may set a
// device's primary context current on this thread).
// Must not touch other sessions' communicators; NCCL's own memory is not
// charged to the tenant's quota (not known to Flyt).
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;

namespace {

// A config as the wire carries it, rebuilt as an ncclConfig_t.
struct WireConfig {
  std::vector<uint64_t> storage;  // 8-byte aligned bytes of the app's struct
  std::string net_name, comm_name;
  bool has_net = false, has_name = false, present = false;

  bool Read(wire::Reader& in) {
    uint32_t n = 0;
    if (!in.Get(&n) || n > nccl::kMaxConfigBytes) return false;
    storage.assign((n + 7) / 8, 0);
    if (n > 0 && !in.GetBytes(storage.data(), n)) return false;
    uint8_t net = 0, name = 0;
    if (!in.Get(&net) || !in.GetString(&net_name) || !in.Get(&name) || !in.GetString(&comm_name))
      return false;
    has_net = net != 0;
    has_name = name != 0;
    present = n > 0;
    if (present && n < sizeof(nccl::ConfigHead)) return false;
    return true;
  }
  // The struct NCCL reads (nullptr: none), its string pointers ours.
  void* Get() {
    if (!present) return nullptr;
    auto* head = reinterpret_cast<nccl::ConfigHead*>(storage.data());
    head->size = storage.size() * 8 < head->size ? storage.size() * 8 : head->size;
    head->blocking = 0;  // never wait here for other ranks (the client waits: src/nccl/)
    head->net_name = has_net ? net_name.c_str() : nullptr;
    head->comm_name = has_name ? comm_name.c_str() : nullptr;
    return storage.data();
  }
};

}  // namespace

void Session::ReleaseNccl() {
  if (nccl_comms_.empty()) return;
  NcclApi& n = state_->nccl;
  for (const auto& [comm, device] : nccl_comms_) {
    (void)device;
    for (auto it = nccl_registrations_.begin(); it != nccl_registrations_.end();) {
      if (it->first == comm && n.ncclCommDeregister != nullptr)
        n.ncclCommDeregister(reinterpret_cast<NcclComm>(comm), reinterpret_cast<void*>(it->second));
      it = it->first == comm ? nccl_registrations_.erase(it) : std::next(it);
    }
    // Abort, not destroy: the peers may be gone, and a destroy would wait for them.
    int r = n.ncclCommAbort(reinterpret_cast<NcclComm>(comm));
    if (r != nccl::kSuccess)
      FLYT_WARN("session %llu: aborting an NCCL communicator the client left failed (%d)",
                static_cast<unsigned long long>(id_), r);
  }
  nccl_comms_.clear();
  nccl_ops_.clear();
  nccl_registrations_.clear();
  while (nccl_group_depth_ > 0) {  // a group the client never ended
    n.ncclGroupEnd();
    --nccl_group_depth_;
  }
}

bool Session::Nccl(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint8_t sub = 0;
  if (!in.Get(&sub)) return false;
  *rc = CUDA_SUCCESS;
  if (sub == ops::kNcclEnv) {
    // The app's NCCL settings, for this client's worker, before NCCL reads them.
    uint32_t count = 0;
    if (!in.Get(&count) || count > nccl::kMaxForwardedEnv) return false;
    for (uint32_t i = 0; i < count; ++i) {
      std::string name, value;
      if (!in.GetString(&name, 64) || !in.GetString(&value, 1024)) return false;
      if (!nccl::ForwardedEnv(name.c_str())) return false;  // never another variable
      if (!state_->nccl_tried) setenv(name.c_str(), value.c_str(), 1);
    }
    if (in.remaining() != 0) return false;
    out.Put<int32_t>(nccl::kSuccess);
    out.PutString("");
    return true;
  }
  if (!state_->nccl_tried) {
    state_->nccl_tried = true;
    if (state_->sim_backend) {
      LoadSimNccl(&state_->nccl);
    } else if (Status st = LoadRealNccl(&state_->nccl); !st.ok()) {
      state_->nccl_error = st.message();
      FLYT_WARN("session %llu: %s", static_cast<unsigned long long>(id_), st.message().c_str());
    }
  }
  NcclApi& n = state_->nccl;
  wire::Writer outs;  // the call's outputs, after its result and message
  int result = nccl::kSuccess;
  std::string message;
  auto fail = [&](int r, std::string why) {
    result = r;
    message = std::move(why);
  };
  auto comm_of = [&](uint64_t v) -> NcclComm {
    return nccl_comms_.count(v) != 0 ? reinterpret_cast<NcclComm>(v) : nullptr;
  };
  auto not_ours = [&] { fail(nccl::kInvalidArgument, "not a communicator of this process"); };
  auto stream_of = [&](uint64_t v, CUstream* s) {
    if (v <= 2) {  // null, legacy, per-thread: as the driver takes them
      *s = reinterpret_cast<CUstream>(v);
      return true;
    }
    if (!Owns(HandleKind::kStream, v)) return false;
    *s = reinterpret_cast<CUstream>(RealHandle(HandleKind::kStream, v));
    return true;
  };
  // A communicator made: kept, and described to the client.
  // A communicator made (the device: the current one, else `device`): kept, and
  // described to the client.
  auto made = [&](NcclComm c, int device = -1) {
    int count = 0, rank = 0;
    if (c != nullptr) {
      auto [it, fresh] = nccl_comms_.emplace(reinterpret_cast<uintptr_t>(c),
                                             device >= 0 ? device : CurrentDevice());
      device = it->second;
      (void)fresh;
      // Not known while NCCL is still making it (non-blocking): 0, asked again later.
      if (n.ncclCommCount == nullptr || n.ncclCommCount(c, &count) != nccl::kSuccess) count = 0;
      if (n.ncclCommUserRank == nullptr || n.ncclCommUserRank(c, &rank) != nccl::kSuccess)
        count = 0;
    }
    outs.Put<uint64_t>(reinterpret_cast<uintptr_t>(c));
    outs.Put<int32_t>(count);
    outs.Put<int32_t>(rank);
    outs.Put<int32_t>(device);
  };
  if (!state_->nccl_error.empty()) {
    in.Skip(in.remaining());  // not read: nothing serves it
    fail(nccl::kSystemError, state_->nccl_error);
  } else {
    switch (sub) {
      case ops::kNcclVersion: {
        if (in.remaining() != 0) return false;
        int v = 0;
        result = n.ncclGetVersion(&v);
        outs.Put<int32_t>(v);
        break;
      }
      case ops::kNcclUniqueId: {
        if (in.remaining() != 0) return false;
        nccl::UniqueId id{};
        result = n.ncclGetUniqueId(&id);
        outs.PutBytes(&id, sizeof(id));
        break;
      }
      case ops::kNcclInit: {
        int32_t nranks = 0, rank = 0;
        uint32_t nids = 0;
        if (!in.Get(&nranks) || !in.Get(&rank) || !in.Get(&nids) || nids == 0 ||
            nids > ops::kMaxNcclIds)
          return false;
        std::vector<nccl::UniqueId> ids(nids);
        if (!in.GetBytes(ids.data(), nids * sizeof(nccl::UniqueId))) return false;
        WireConfig config;
        if (!config.Read(in) || in.remaining() != 0) return false;
        NcclComm c = nullptr;
        if (nids == 1) {
          result = n.ncclCommInitRankConfig(&c, nranks, ids[0], rank, config.Get());
        } else if (n.ncclCommInitRankScalable == nullptr) {
          fail(nccl::kInvalidUsage, "this GPU server's NCCL has no ncclCommInitRankScalable");
        } else {
          result = n.ncclCommInitRankScalable(&c, nranks, rank, static_cast<int>(nids), ids.data(),
                                              config.Get());
        }
        made(result == nccl::kSuccess || result == nccl::kInProgress ? c : nullptr);
        break;
      }
      case ops::kNcclInitAll: {
        int32_t count = 0;
        if (!in.Get(&count) || count < 0 || count > static_cast<int32_t>(ops::kMaxNcclDevices))
          return false;
        std::vector<int> devices(static_cast<size_t>(count));
        for (auto& d : devices)
          if (!in.Get(&d)) return false;
        if (in.remaining() != 0) return false;
        std::vector<NcclComm> comms(devices.size(), nullptr);
        if (n.ncclCommInitAll == nullptr) {
          fail(nccl::kInvalidUsage, "this GPU server's NCCL has no ncclCommInitAll");
          break;
        }
        result = n.ncclCommInitAll(comms.data(), count, devices.data());
        for (size_t i = 0; i < comms.size(); ++i)
          made(result == nccl::kSuccess || result == nccl::kInProgress ? comms[i] : nullptr,
               devices[i]);
        break;
      }
      case ops::kNcclSplit:
      case ops::kNcclShrink: {
        uint64_t v = 0;
        if (!in.Get(&v)) return false;
        int32_t color = 0, key = 0, flags = 0;
        std::vector<int> exclude;
        if (sub == ops::kNcclSplit) {
          if (!in.Get(&color) || !in.Get(&key)) return false;
        } else {
          uint32_t count = 0;
          if (!in.Get(&count) || count > ops::kMaxNcclRanks) return false;
          exclude.resize(count);
          for (auto& r : exclude)
            if (!in.Get(&r)) return false;
        }
        WireConfig config;
        if (!config.Read(in)) return false;
        if (sub == ops::kNcclShrink && !in.Get(&flags)) return false;
        if (in.remaining() != 0) return false;
        NcclComm parent = comm_of(v);
        // NCCL writes the child here when it is made, maybe after this call returns.
        nccl_child_slots_.push_back(std::make_unique<NcclComm>(nullptr));
        NcclComm& c = *nccl_child_slots_.back();
        const uint64_t token = nccl_child_slots_.size();
        if (parent == nullptr) {
          not_ours();
        } else if (sub == ops::kNcclSplit) {
          if (n.ncclCommSplit == nullptr)
            fail(nccl::kInvalidUsage, "this GPU server's NCCL has no ncclCommSplit");
          else
            result = n.ncclCommSplit(parent, color, key, &c, config.Get());
        } else if (n.ncclCommShrink == nullptr) {
          fail(nccl::kInvalidUsage, "this GPU server's NCCL has no ncclCommShrink");
        } else {
          result = n.ncclCommShrink(parent, exclude.data(), static_cast<int>(exclude.size()), &c,
                                    config.Get(), flags);
        }
        const int device = parent != nullptr ? nccl_comms_[v] : -1;
        made(result == nccl::kSuccess || result == nccl::kInProgress ? c : nullptr, device);
        // Not named yet: NCCL names it when done (a rank with NCCL_SPLIT_NOCOLOR gets none).
        const bool pending = (result == nccl::kSuccess || result == nccl::kInProgress) &&
                             c == nullptr && parent != nullptr &&
                             (sub == ops::kNcclShrink || color != -1);
        if (pending) nccl_child_device_[token] = device;
        outs.Put<uint64_t>(pending ? token : 0);
        break;
      }
      case ops::kNcclResolve: {
        uint64_t token = 0;
        if (!in.Get(&token) || in.remaining() != 0) return false;
        auto it = nccl_child_device_.find(token);
        if (it == nccl_child_device_.end()) {
          fail(nccl::kInvalidArgument, "not a split or shrink of this process in progress");
          break;
        }
        NcclComm c = *nccl_child_slots_[token - 1];
        made(c, it->second);
        if (c != nullptr) nccl_child_device_.erase(it);
        break;
      }
      case ops::kNcclCommInfo: {
        uint64_t v = 0;
        if (!in.Get(&v) || in.remaining() != 0) return false;
        if (comm_of(v) == nullptr)
          not_ours();
        else
          made(comm_of(v));
        break;
      }
      case ops::kNcclFinalize:
      case ops::kNcclDestroy:
      case ops::kNcclAbort:
      case ops::kNcclAsyncError: {
        uint64_t v = 0;
        if (!in.Get(&v) || in.remaining() != 0) return false;
        NcclComm c = comm_of(v);
        if (c == nullptr) {
          not_ours();
          break;
        }
        if (sub == ops::kNcclAsyncError) {
          int async = 0;
          result = n.ncclCommGetAsyncError(c, &async);
          outs.Put<int32_t>(async);
        } else if (sub == ops::kNcclFinalize) {
          result = n.ncclCommFinalize != nullptr ? n.ncclCommFinalize(c) : nccl::kSuccess;
        } else {
          // Its registrations go with it (NCCL frees them); the handle is gone either way.
          result = sub == ops::kNcclDestroy ? n.ncclCommDestroy(c) : n.ncclCommAbort(c);
          nccl_comms_.erase(v);
          std::erase_if(nccl_registrations_, [&](const auto& r) { return r.first == v; });
          std::erase_if(nccl_ops_, [&](const auto& o) { return o.first == v; });
        }
        break;
      }
      case ops::kNcclLastError: {
        uint64_t v = 0;
        if (!in.Get(&v) || in.remaining() != 0) return false;
        const char* text = n.ncclGetLastError != nullptr ? n.ncclGetLastError(comm_of(v)) : "";
        outs.PutString(text != nullptr ? text : "");
        break;
      }
      case ops::kNcclCollective: {
        uint8_t kind = 0;
        uint64_t send = 0, recv = 0, count = 0, v = 0, sv = 0;
        int32_t type = 0, op = 0, root = 0;
        if (!in.Get(&kind) || !in.Get(&send) || !in.Get(&recv) || !in.Get(&count) ||
            !in.Get(&type) || !in.Get(&op) || !in.Get(&root) || !in.Get(&v) || !in.Get(&sv) ||
            in.remaining() != 0)
          return false;
        NcclComm c = comm_of(v);
        CUstream s = nullptr;
        if (c == nullptr) {
          not_ours();
          break;
        }
        if (!stream_of(sv, &s)) {
          fail(nccl::kInvalidArgument, "not a stream of this process");
          break;
        }
        const void* sp = reinterpret_cast<const void*>(send);
        void* rp = reinterpret_cast<void*>(recv);
        switch (kind) {
          case ops::kNcclAllReduce:
            result = n.ncclAllReduce(sp, rp, count, type, op, c, s);
            break;
          case ops::kNcclBroadcast:
            result = n.ncclBroadcast(sp, rp, count, type, root, c, s);
            break;
          case ops::kNcclReduce:
            result = n.ncclReduce(sp, rp, count, type, op, root, c, s);
            break;
          case ops::kNcclAllGather:
            result = n.ncclAllGather(sp, rp, count, type, c, s);
            break;
          case ops::kNcclReduceScatter:
            result = n.ncclReduceScatter(sp, rp, count, type, op, c, s);
            break;
          case ops::kNcclAlltoAll:
            if (n.ncclAlltoAll == nullptr)
              fail(nccl::kInvalidUsage, "this GPU server's NCCL has no ncclAlltoAll");
            else
              result = n.ncclAlltoAll(sp, rp, count, type, c, s);
            break;
          case ops::kNcclSend:
            result = n.ncclSend(sp, count, type, root, c, s);
            break;
          case ops::kNcclRecv:
            result = n.ncclRecv(rp, count, type, root, c, s);
            break;
          default:
            return false;
        }
        break;
      }
      case ops::kNcclGroupStart:
        if (in.remaining() != 0) return false;
        result = n.ncclGroupStart();
        if (result == nccl::kSuccess) ++nccl_group_depth_;
        break;
      case ops::kNcclGroupEnd:
        if (in.remaining() != 0) return false;
        if (nccl_group_depth_ == 0) {
          fail(nccl::kInvalidUsage, "ncclGroupEnd without ncclGroupStart");
          break;
        }
        --nccl_group_depth_;
        result = n.ncclGroupEnd();
        break;
      case ops::kNcclRedOpCreate: {
        uint64_t v = 0, scalar = 0;
        int32_t type = 0, residence = 0;
        if (!in.Get(&v) || !in.Get(&type) || !in.Get(&residence) || !in.Get(&scalar) ||
            in.remaining() != 0)
          return false;
        NcclComm c = comm_of(v);
        int op = 0;
        if (c == nullptr) {
          not_ours();
        } else if (n.ncclRedOpCreatePreMulSum == nullptr) {
          fail(nccl::kInvalidUsage, "this GPU server's NCCL has no ncclRedOpCreatePreMulSum");
        } else {
          // Host-immediate: the value's bytes, here; device: the pointer.
          void* p = residence == nccl::kScalarHostImmediate ? static_cast<void*>(&scalar)
                                                            : reinterpret_cast<void*>(scalar);
          result = n.ncclRedOpCreatePreMulSum(&op, p, type, residence, c);
          if (result == nccl::kSuccess) nccl_ops_.insert({v, op});
        }
        outs.Put<int32_t>(op);
        break;
      }
      case ops::kNcclRedOpDestroy: {
        uint64_t v = 0;
        int32_t op = 0;
        if (!in.Get(&v) || !in.Get(&op) || in.remaining() != 0) return false;
        NcclComm c = comm_of(v);
        if (c == nullptr || nccl_ops_.erase({v, op}) == 0)
          fail(nccl::kInvalidArgument, "not a reduction op this process made on the communicator");
        else
          result = n.ncclRedOpDestroy(op, c);
        break;
      }
      case ops::kNcclRegister:
      case ops::kNcclDeregister: {
        uint64_t v = 0, a = 0, bytes = 0;
        if (!in.Get(&v) || !in.Get(&a) || (sub == ops::kNcclRegister && !in.Get(&bytes)) ||
            in.remaining() != 0)
          return false;
        NcclComm c = comm_of(v);
        if (c == nullptr) {
          not_ours();
        } else if (n.ncclCommRegister == nullptr || n.ncclCommDeregister == nullptr) {
          fail(nccl::kInvalidUsage, "this GPU server's NCCL cannot register buffers");
        } else if (sub == ops::kNcclRegister) {
          void* handle = nullptr;
          result = n.ncclCommRegister(c, reinterpret_cast<void*>(a), bytes, &handle);
          if (result == nccl::kSuccess)
            nccl_registrations_.insert({v, reinterpret_cast<uintptr_t>(handle)});
          outs.Put<uint64_t>(reinterpret_cast<uintptr_t>(handle));
        } else if (nccl_registrations_.erase({v, a}) == 0) {
          fail(nccl::kInvalidArgument, "not a registration of this communicator");
        } else {
          result = n.ncclCommDeregister(c, reinterpret_cast<void*>(a));
        }
        break;
      }
      default:
        return false;
    }
    // NCCL may have made a device's primary context current on this thread.
    if (CUcontext ctx = current_ctx_ != 0 ? RealContext(current_ctx_) : (exec_ ? exec_ : primary_);
        ctx != nullptr)
      state_->api.cuCtxSetCurrent(ctx);
    if (result != nccl::kSuccess && result != nccl::kInProgress && message.empty() &&
        n.ncclGetLastError != nullptr) {
      const char* text = n.ncclGetLastError(nullptr);
      message = text != nullptr ? text : "";
    }
  }
  out.Put<int32_t>(result);
  out.PutString(message);
  out.PutBytes(outs.data(), outs.size());
  return true;
}

}  // namespace flyt::server
