// Implementation of server/session.h: handshake, frame loop, generic and
// hand-written handlers, cleanup.
#include "server/session.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>

#include "common/cuda_image.h"
#include "common/log.h"
#include "server/image_cache.h"
#include "server/session_vmm.h"
#include "server/tenant_board.h"
#include "server/worker.h"

namespace flyt::server {

using marshal::ArgRole;
using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

Status DescribeDevices(ServerState* state) {
  DriverApi& api = state->api;
  CUresult rc = api.cuDriverGetVersion(&state->driver_version);
  int count = 0;
  if (rc == CUDA_SUCCESS) rc = api.cuDeviceGetCount(&count);
  if (rc != CUDA_SUCCESS) return Status::Error("cannot list GPUs: error " + std::to_string(rc));
  for (int i = 0; i < count; ++i) {
    ops::DeviceInfo info{};
    CUdevice dev = 0;
    if (api.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    api.cuDeviceGetName(info.name, sizeof(info.name), dev);
    CUuuid uuid{};
    api.cuDeviceGetUuid_v2(&uuid, dev);
    std::memcpy(info.uuid, uuid.bytes, 16);
    size_t total = 0;
    api.cuDeviceTotalMem_v2(&total, dev);
    info.total_mem = total;
    for (int a = 1; a < ops::kMaxDeviceAttribute; ++a) {
      int v = 0;
      info.attributes[a] =
          api.cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), dev) == CUDA_SUCCESS
              ? v
              : ops::kAttributeRefused;
    }
    state->devices.push_back(info);
  }
  // No share until the server's options say otherwise (main calls Init again).
  return state->share.Init(&state->api, state->devices, ShareOptions{});
}

// ---------------------------------------------------------------------------
// Generic handlers, derived from the prototypes (protocol/marshal.h).

namespace {

template <typename T, ArgRole R = marshal::RoleOf<T>()>
struct Slot;

template <typename T>
struct Slot<T, ArgRole::kValue> {
  T v{};
  bool Decode(Reader& r, Session&, bool*) { return r.Get(&v); }
  T Get() { return v; }
  uint64_t Raw() const { return static_cast<uint64_t>(v); }
  void Finish(Writer&, Session&) {}
};

template <typename T>
struct Slot<T, ArgRole::kStructValue> {
  T v{};
  bool Decode(Reader& r, Session&, bool*) { return r.Get(&v); }
  T Get() { return v; }
  uint64_t Raw() const { return 0; }
  void Finish(Writer&, Session&) {}
};

template <typename T>
struct Slot<T, ArgRole::kHandle> {
  uint64_t raw = 0;   // the client's handle
  uint64_t real = 0;  // what the driver gets (streams move at a live SM change)
  bool Decode(Reader& r, Session& s, bool* bad) {
    if (!r.Get(&raw)) return false;
    constexpr HandleKind kind = marshal::HandleOf<T>::kind;
    // Null means "default" only for streams and contexts; the legacy and
    // per-thread stream handles are 1 and 2.
    bool special = (raw == 0 && (kind == HandleKind::kStream || kind == HandleKind::kContext)) ||
                   (kind == HandleKind::kStream && (raw == 1 || raw == 2));
    if (!special && !s.Owns(kind, raw)) *bad = true;
    real = raw;
    if constexpr (kind == HandleKind::kStream)
      real = reinterpret_cast<uintptr_t>(s.RealStream(raw));
    if constexpr (kind == HandleKind::kContext)
      real = reinterpret_cast<uintptr_t>(s.RealContext(raw));
    if constexpr (kind != HandleKind::kStream && kind != HandleKind::kContext)
      real = s.RealHandle(kind, raw);  // a restored session's handles (session_migrate.cc)
    return true;
  }
  T Get() { return reinterpret_cast<T>(real); }
  uint64_t Raw() const { return raw; }
  void Finish(Writer&, Session&) {}
};

template <typename T>
struct Slot<T, ArgRole::kString> {
  std::string s;
  uint8_t present = 0;
  bool Decode(Reader& r, Session&, bool*) {
    if (!r.Get(&present)) return false;
    return present == 0 || r.GetString(&s, ops::kMaxNameLen);
  }
  T Get() { return present ? s.c_str() : nullptr; }
  uint64_t Raw() const { return 0; }
  void Finish(Writer&, Session&) {}
};

template <typename T>
struct Slot<T, ArgRole::kOut> {
  using U = std::remove_pointer_t<T>;
  U v{};
  uint8_t want = 0;
  bool Decode(Reader& r, Session&, bool*) { return r.Get(&want); }
  T Get() { return want ? &v : nullptr; }
  uint64_t Raw() const { return 0; }
  void Finish(Writer& w, Session& s) {
    if (!want) return;
    if constexpr (marshal::kIsHandle<U>) {
      constexpr HandleKind kind = marshal::HandleOf<U>::kind;
      // The client gets its own value for the object (a restored session's
      // may differ from the driver's).
      uint64_t client = v != nullptr ? s.ClientHandle(kind, reinterpret_cast<uintptr_t>(v)) : 0;
      w.Put<uint64_t>(client);
      if (v != nullptr) s.Adopt(kind, client);
      // A graph a generic call returns (cuGraphCreate, cuStreamEndCapture) is a new
      // top-level graph, whatever node-owned graph had its address before.
      if constexpr (std::is_same_v<U, CUgraph>) {
        if (v != nullptr) s.NewTopLevelGraph(client);
      }
    } else {
      w.Put(v);
    }
  }
};

template <typename T>
struct Slot<T, ArgRole::kInStruct> {
  using U = std::remove_cv_t<std::remove_pointer_t<T>>;
  U v{};
  uint8_t present = 0;
  bool Decode(Reader& r, Session&, bool*) {
    if (!r.Get(&present)) return false;
    return present == 0 || r.Get(&v);
  }
  T Get() { return present ? &v : nullptr; }
  uint64_t Raw() const { return 0; }
  void Finish(Writer&, Session&) {}
};

// Ops whose memory counts against the tenant's quota (protocol/api_list.h).
constexpr bool ChargesMemory(uint16_t op) {
  return op == 150 || op == 151 || op == 169 || op == 170 || op == 240 || op == 241 || op == 263;
}

// Bytes an allocation call asks for, from its decoded arguments.
template <uint16_t Op, typename Slots>
uint64_t RequestedBytes(Slots& slots) {
  if constexpr (Op == 150 || Op == 240 || Op == 241 || Op == 263) {
    // cuMemAlloc, cuMemAlloc(FromPool)Async, cuMemAllocManaged (all of it, as a
    // local GPU could come to hold all of it)
    return std::get<1>(slots).v;
  } else if constexpr (Op == 151) {  // cuMemAllocPitch: at least width x height
    return MulSat(std::get<2>(slots).v, std::get<3>(slots).v);
  } else if constexpr (Op == 169) {  // cuArrayCreate
    const auto& d = std::get<1>(slots);
    return d.present ? ArrayBytes(d.v.Width, d.v.Height, 1, d.v.NumChannels, d.v.Format) : 0;
  } else if constexpr (Op == 170) {  // cuArray3DCreate
    const auto& d = std::get<1>(slots);
    return d.present ? ArrayBytes(d.v.Width, d.v.Height, d.v.Depth, d.v.NumChannels, d.v.Format)
                     : 0;
  } else {
    return 0;
  }
}

// Runs one generic call. Returns false for a malformed payload.
template <uint16_t Op, typename... Args>
bool RunGeneric(Session& s, CUresult (*fn)(Args...), Reader& in, Writer& out, CUresult* rc,
                HandleKind releases, bool allocates) {
  std::tuple<Slot<Args>...> slots;
  bool bad_handle = false;
  bool ok = std::apply([&](auto&... sl) { return (sl.Decode(in, s, &bad_handle) && ...); }, slots);
  if (!ok || in.remaining() != 0) return false;
  if (fn == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  if (bad_handle) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  if constexpr (sizeof...(Args) > 0) {
    if (releases == HandleKind::kMemory && !s.Owns(HandleKind::kMemory, std::get<0>(slots).Raw())) {
      *rc = CUDA_ERROR_INVALID_VALUE;
      return true;
    }
    // Memory a restore mapped at the client's old address is not the driver's
    // cuMemAlloc memory: the session frees it (session_migrate.cc).
    if (releases == HandleKind::kMemory && s.IsSessionMapped(std::get<0>(slots).Raw())) {
      bool kept = false;
      if constexpr (Op == 242) {  // cuMemFreeAsync: once the stream got there
        *rc = s.FreeMappedAsync(std::get<0>(slots).Raw(), std::get<1>(slots).Get(), &kept);
      } else {
        *rc = s.FreeMapped(std::get<0>(slots).Raw());
      }
      if (!kept) s.Forget(HandleKind::kMemory, std::get<0>(slots).Raw());
      return true;
    }
    // Managed memory: the pager stops touching it before the driver frees it.
    if (releases == HandleKind::kMemory) s.pager().Remove(std::get<0>(slots).Raw());
    // A library's module goes with its library only, as natively.
    if (releases == HandleKind::kModule && s.LibraryOwnsModule(std::get<0>(slots).Raw())) {
      *rc = CUDA_ERROR_NOT_PERMITTED;
      return true;
    }
    if (releases == HandleKind::kLibrary || releases == HandleKind::kModule)
      s.pager().RemoveOwnedBy(std::get<0>(slots).Raw());
    // A graph a node owns (a conditional node's body) goes only with its node.
    if (releases == HandleKind::kGraph && s.OwnedByNode(std::get<0>(slots).Raw())) {
      *rc = CUDA_ERROR_INVALID_VALUE;
      return true;
    }
  }
  [[maybe_unused]] uint64_t charge = 0;
  if constexpr (ChargesMemory(Op)) {
    charge = RequestedBytes<Op>(slots);
    if (!s.ChargeMemory(charge)) {
      *rc = CUDA_ERROR_OUT_OF_MEMORY;  // over the tenant's memory quota
      return true;
    }
  }
  if constexpr (ThroughSession<Op>::kYes) {  // the session's own checks (server/session_vmm.h)
    *rc = std::apply([&](auto&... sl) { return (s.*ThroughSession<Op>::kMethod)(sl.Get()...); },
                     slots);
  } else if constexpr (Op == 240) {  // cuMemAllocAsync: in movable memory where it can
    uint64_t pool = 0;
    if (std::get<0>(slots).Get() != nullptr && std::get<1>(slots).v > 0 &&
        s.ServesAsyncAlloc(std::get<2>(slots).Get(), &pool)) {
      *rc = s.MemAllocAsync(std::get<0>(slots).Get(), std::get<1>(slots).v, pool);
    } else {
      *rc = std::apply([&](auto&... sl) { return fn(sl.Get()...); }, slots);
    }
  } else {
    *rc = std::apply([&](auto&... sl) { return fn(sl.Get()...); }, slots);
  }
  if constexpr (ChargesMemory(Op)) {
    if (*rc != CUDA_SUCCESS) {
      s.RefundMemory(charge, -1);
      return true;
    }
    if constexpr (Op == 151) {  // the pitch is known now: charge what was really taken
      uint64_t taken = MulSat(std::get<1>(slots).v, std::get<3>(slots).v);
      if (taken > charge) {
        if (!s.ChargeMemory(taken - charge)) {
          CUdeviceptr p = std::get<0>(slots).v;
          CUresult freed = s.IsSessionMapped(p) ? s.FreeMapped(p) : s.api().cuMemFree_v2(p);
          if (freed != CUDA_SUCCESS)
            FLYT_WARN("cuMemFree of an allocation over quota failed with error %d", freed);
          s.RefundMemory(charge, -1);
          *rc = CUDA_ERROR_OUT_OF_MEMORY;
          return true;
        }
        charge = taken;
      }
    }
  }
  if (*rc != CUDA_SUCCESS) return true;
  if constexpr (Op == 263) s.pager().Add(std::get<0>(slots).v, std::get<1>(slots).v);
  // A global of a module or library: a __managed__ variable's block is paged.
  if constexpr (Op == 201 || Op == 202 || Op == 203)
    s.NoteGlobal(std::get<0>(slots).v, std::get<2>(slots).Raw());
  // What a snapshot needs later (session_migrate.cc): globals by name, event
  // flags, and which memory came from a pool.
  if constexpr (Op == 201 || Op == 202)
    s.NoteGlobalName(std::get<0>(slots).v, std::get<1>(slots).v, std::get<2>(slots).Raw(),
                     std::get<3>(slots).Get());
  if constexpr (Op == 130)
    s.NoteEventFlags(
        s.ClientHandle(HandleKind::kEvent, reinterpret_cast<uintptr_t>(std::get<0>(slots).v)),
        std::get<1>(slots).v);
  if constexpr (Op == 240 || Op == 241) {  // the driver's pools (not movable memory)
    if (!s.IsSessionMapped(std::get<0>(slots).v)) s.NoteAsyncAllocation(std::get<0>(slots).v);
  }
  // Executable graphs keep a template of what they run (session_graph_move.cc).
  if constexpr (Op == 220)  // cuGraphInstantiateWithFlags
    s.NoteInstantiated(
        s.ClientHandle(HandleKind::kGraphExec, reinterpret_cast<uintptr_t>(std::get<0>(slots).v)),
        std::get<1>(slots).Raw(), std::get<2>(slots).v);
  if constexpr (Op == 243)  // cuGraphExecUpdate_v2
    s.NoteExecUpdated(std::get<0>(slots).Raw(), std::get<1>(slots).Raw());
  if constexpr (Op == 132 || Op == 133)  // cuEventRecord(WithFlags): the order moves with it
    s.NoteEventRecorded(std::get<0>(slots).Raw());
  if constexpr (Op == 230)  // cuTexObjectCreate: its descriptors move with it
    s.NoteTexObject(std::get<0>(slots).v, std::get<1>(slots).Get(), std::get<2>(slots).Get(),
                    std::get<3>(slots).Get());
  if constexpr (Op == 232)  // cuSurfObjectCreate
    s.NoteBindlessObject(std::get<0>(slots).v, /*surface=*/true, true);
  if constexpr (Op == 231 || Op == 233)  // cuTexObjectDestroy, cuSurfObjectDestroy
    s.NoteBindlessObject(std::get<0>(slots).v, Op == 233, false);
  std::apply([&](auto&... sl) { (sl.Finish(out, s), ...); }, slots);
  if constexpr (sizeof...(Args) > 0) {
    if (releases != HandleKind::kNone) s.Forget(releases, std::get<0>(slots).Raw());
    if (allocates) {
      if constexpr (std::is_same_v<std::tuple_element_t<0, std::tuple<Args...>>, CUdeviceptr*>)
        s.Adopt(HandleKind::kMemory, std::get<0>(slots).v);
    }
  }
  if constexpr (ChargesMemory(Op)) {
    if constexpr (Op == 169 || Op == 170) {
      s.NoteAllocation(HandleKind::kArray, reinterpret_cast<uintptr_t>(std::get<0>(slots).v),
                       charge);
    } else {
      s.NoteAllocation(HandleKind::kMemory, std::get<0>(slots).v, charge);
    }
  }
  return true;
}

bool IsStickyError(CUresult rc) {
  switch (rc) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
      return true;
    default:
      return false;
  }
}

// Copies larger than this go through the pinned staging buffers.
constexpr uint32_t kStagedMin = 1u << 20;

bool IsAllocation(uint16_t op) {
  return op == 150 || op == 151 || op == 240 || op == 241 || op == 263;
}

}  // namespace

bool Session::DispatchGeneric(uint16_t op, bool per_thread, Reader& in, Writer& out, CUresult* rc,
                              bool* known) {
  DriverApi& a = state_->api;
  *known = true;
  switch (op) {
#define FLYT_GENERIC_CASE(id, sym, cls, rel)                                                   \
  case id:                                                                                     \
    return RunGeneric<id>(*this, per_thread && a.sym##_pt != nullptr ? a.sym##_pt : a.sym, in, \
                          out, rc, HandleKind::k##rel, IsAllocation(id));
    FLYT_GENERIC_APIS(FLYT_GENERIC_CASE)
#undef FLYT_GENERIC_CASE
    default:
      *known = false;
      return false;
  }
}

// ---------------------------------------------------------------------------
// Session

Session::Session(ServerState* state, std::unique_ptr<transport::Connection> conn,
                 const channel::Ticket& ticket)
    : state_(state), conn_(std::move(conn)) {
  id_ = ticket.session;
  secret_ = ticket.secret;
  client_pid_ = ticket.client_pid;
  peer_ = conn_ != nullptr ? conn_->Peer() : "";
  FollowShare();
  // The client has the inventory of the share it saw in the handshake; a
  // change since then reaches it with the first reply.
  info_generation_ =
      ticket.share_generation == state_->share_seen ? state_->share.info_generation() : 0;
  exec_generation_ = state_->share.exec_generation();
}

Session::~Session() {
  ClosePeerListeners();
  {
    std::lock_guard<std::mutex> lock(callback_mu_);
    if (callback_conn_ != nullptr) callback_conn_->Shutdown();
  }
  // Host functions still queued in the driver refer to this session.
  while (host_funcs_in_flight_.load() > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

int Session::CurrentDevice() const {
  if (current_ctx_ == 0 || current_ctx_ == primary_client_) return primary_device_;
  for (const auto& [device, more] : more_primaries_)
    if (reinterpret_cast<uintptr_t>(more.primary) == current_ctx_) return device;
  auto it = user_contexts_.find(current_ctx_);
  return it != user_contexts_.end() ? it->second.device : primary_device_;
}

namespace {
void SubtractSat(std::atomic<uint64_t>* v, uint64_t bytes) {
  uint64_t c = v->load();
  while (!v->compare_exchange_weak(c, c > bytes ? c - bytes : 0)) {
  }
}
}  // namespace

bool Session::ChargeShare(uint64_t bytes, int device) {
  if (!state_->share.Charge(device, bytes)) return false;
  if (state_->slot != nullptr) {
    state_->slot->charged += bytes;
    state_->slot->charged_dev[BoardDevice(device)] += bytes;
  }
  return true;
}

bool Session::ChargeMemory(uint64_t bytes, int device) {
  if (device < 0) device = CurrentDevice();
  if (ChargeShare(bytes, device)) return true;
  return ReleaseIdlePoolMemory() && ChargeShare(bytes, device);
}

void Session::RefundMemory(uint64_t bytes, int device) {
  if (device < 0) device = CurrentDevice();
  state_->share.Refund(device, bytes);
  if (state_->slot == nullptr) return;
  SubtractSat(&state_->slot->charged, bytes);
  SubtractSat(&state_->slot->charged_dev[BoardDevice(device)], bytes);
}

void Session::NoteCaptures(int delta) {
  captures_ += delta;
  if (state_->slot != nullptr)
    state_->slot->capturing.store(static_cast<uint32_t>(std::max(0, captures_.load())));
}

void Session::FollowShare() {
  if (state_->board == nullptr) return;
  BoardLayout& board = state_->board->layout();
  const uint64_t generation = board.share_generation.load(std::memory_order_acquire);
  if (generation == state_->share_seen) return;
  state_->share_seen = generation;
  Share::Change change;
  change.has_sm = true;
  change.sm = board.sm_requested.load();
  std::string note;
  Status st = state_->share.Apply(change, captures_.load() > 0, &note);
  if (!st.ok())
    FLYT_WARN("session %llu: cannot adopt the new SM share of %d: %s",
              static_cast<unsigned long long>(id_), change.sm, st.message().c_str());
  state_->share.Republish();  // the quota is the board's and may have changed
  if (state_->slot != nullptr) state_->slot->share_generation = generation;
}

void Session::Abort() {
  if (conn_ != nullptr) conn_->Shutdown();
}

bool Session::Owns(HandleKind kind, uint64_t value) const {
  if (handles_[static_cast<int>(kind)].count(value) != 0) return true;
  // The driver accepts a CUkernel wherever a CUfunction is expected (cudart
  // passes its kernels that way), and a CUlibrary's kernels likewise.
  return kind == HandleKind::kFunction &&
         handles_[static_cast<int>(HandleKind::kKernel)].count(value) != 0;
}
void Session::Adopt(HandleKind kind, uint64_t value) {
  handles_[static_cast<int>(kind)].insert(value);
  if (kind == HandleKind::kStream) stream_origin_[value] = StreamOrigin{++stream_seq_, image_seq_};
  if (current_user_ != 0) NoteContextHandle(kind, value);  // session_contexts.cc
}
void Session::Forget(HandleKind kind, uint64_t value) {
  // Memory of a graph's allocation node: freed outside the graph, it is
  // allocated again at the graph's next launch (session_graph_nodes.cc).
  if (kind == HandleKind::kMemory && graph_allocs_.count(value) != 0) return;
  if (kind == HandleKind::kGraphExec) ExecForgotten(value);
  handles_[static_cast<int>(kind)].erase(value);
  if (!user_owned_.empty()) DropContextHandle(kind, value);
  auto refund = [&](std::unordered_map<uint64_t, uint64_t>& sizes,
                    std::unordered_map<uint64_t, int>& devices) {
    auto it = sizes.find(value);
    if (it == sizes.end()) return;
    int device = 0;
    if (auto d = devices.find(value); d != devices.end()) {
      device = d->second;
      devices.erase(d);
    }
    RefundMemory(it->second, device);
    sizes.erase(it);
  };
  if (kind == HandleKind::kMemory) refund(memory_bytes_, memory_device_);
  if (kind == HandleKind::kArray) refund(array_bytes_, array_device_);
  // The stream it ran on now was destroyed with it; the client's handle value
  // stays taken by the retired stream object until the session ends.
  if (kind == HandleKind::kStream) {
    stream_map_.erase(value);
    stream_origin_.erase(value);
  }
  if (kind == HandleKind::kGraph) GraphForgotten(value);
  auto& fwd = xlate_[static_cast<int>(kind)];
  if (!fwd.empty()) {
    auto it = fwd.find(value);
    if (it != fwd.end()) {
      rev_[static_cast<int>(kind)].erase(it->second);
      fwd.erase(it);
    }
  }
  if (kind == HandleKind::kEvent) {
    event_flags_.erase(value);
    event_recorded_.erase(value);
  }
  if (kind == HandleKind::kMemory) async_allocs_.erase(value);
  if (kind == HandleKind::kModule || kind == HandleKind::kLibrary) images_.erase(value);
  if (kind == HandleKind::kFunction || kind == HandleKind::kKernel) code_names_.erase(value);
  if (kind == HandleKind::kModule) library_modules_.erase(value);
  if (kind == HandleKind::kLibrary) ForgetLibraryModules(value);
}

void Session::NoteAllocation(HandleKind kind, uint64_t handle, uint64_t bytes) {
  auto& sizes = kind == HandleKind::kArray ? array_bytes_ : memory_bytes_;
  auto& devices = kind == HandleKind::kArray ? array_device_ : memory_device_;
  const int device = CurrentDevice();  // where ChargeMemory charged it
  auto [it, fresh] = sizes.emplace(handle, bytes);
  if (!fresh) {  // an address the driver reused before the session noticed the free
    auto d = devices.find(handle);
    RefundMemory(it->second, d != devices.end() ? d->second : 0);
    it->second = bytes;
  }
  if (device != 0)
    devices[handle] = device;
  else
    devices.erase(handle);
}

CUstream Session::RealStream(uint64_t raw) const {
  if (current_user_ != 0 && (raw == 2 || (raw == 0 && pt_call_))) return UserDefaultStream(raw);
  if (const MorePrimary* more = CurrentMore(); more != nullptr) {
    if (more->green == nullptr || !(raw == 2 || (raw == 0 && pt_call_))) {
      if (raw > 2 && !stream_map_.empty()) {
        auto it = stream_map_.find(raw);
        if (it != stream_map_.end()) return it->second;
      }
      return reinterpret_cast<CUstream>(raw);
    }
    // Another GPU's green context: its own stand-in per-thread default stream.
    if (more->pt_stream == nullptr &&
        state_->api.cuStreamCreate(&more->pt_stream, CU_STREAM_DEFAULT) != CUDA_SUCCESS) {
      more->pt_stream = nullptr;
      return reinterpret_cast<CUstream>(raw);  // the driver's own error follows
    }
    return more->pt_stream;
  }
  if (green_ != nullptr && (raw == 2 || (raw == 0 && pt_call_))) {
    if (pt_stream_ == nullptr &&
        state_->api.cuStreamCreate(&pt_stream_, CU_STREAM_DEFAULT) != CUDA_SUCCESS) {
      pt_stream_ = nullptr;
      return reinterpret_cast<CUstream>(raw);  // the driver's own error follows
    }
    return pt_stream_;
  }
  if (raw > 2 && !stream_map_.empty()) {
    auto it = stream_map_.find(raw);
    if (it != stream_map_.end()) return it->second;
  }
  return reinterpret_cast<CUstream>(raw);
}

CUcontext Session::RealContext(uint64_t raw) const {
  if (raw != 0 && raw == primary_client_) return exec_ != nullptr ? exec_ : primary_;
  for (const auto& [device, more] : more_primaries_)
    if (raw == reinterpret_cast<uintptr_t>(more.primary)) return more.exec;
  return reinterpret_cast<CUcontext>(raw);
}

const Session::MorePrimary* Session::CurrentMore() const {
  if (more_primaries_.empty() || current_ctx_ == 0 || current_ctx_ == primary_client_)
    return nullptr;
  for (const auto& [device, more] : more_primaries_)
    if (current_ctx_ == reinterpret_cast<uintptr_t>(more.primary)) return &more;
  return nullptr;
}

CUresult Session::RetainMorePrimary(int device, uint64_t* handle) {
  DriverApi& a = state_->api;
  *handle = 0;
  auto it = more_primaries_.find(device);
  if (it == more_primaries_.end()) {
    MorePrimary more;
    CUresult rc = a.cuDevicePrimaryCtxRetain(&more.primary, device);
    if (rc != CUDA_SUCCESS) return rc;
    // Under an SM share of green contexts this device gets one of its own, as
    // the first did (EnterExec): the share holds on every GPU.
    rc = MakeExec(device, state_->share.Exec(), &more.green, &more.exec);
    if (rc != CUDA_SUCCESS) {
      CUresult released = a.cuDevicePrimaryCtxRelease_v2(device);
      if (released != CUDA_SUCCESS)
        FLYT_WARN("session %llu: releasing the primary context of device %d failed (error %d)",
                  static_cast<unsigned long long>(id_), device, released);
      FLYT_WARN("session %llu: cannot make a green context on device %d (error %d)",
                static_cast<unsigned long long>(id_), device, rc);
      return rc;
    }
    if (more.green == nullptr)
      more.exec = more.primary;
    else
      FLYT_INFO("session %llu: green context of %d SMs on device %d",
                static_cast<unsigned long long>(id_), state_->share.Exec().sm, device);
    it = more_primaries_.emplace(device, more).first;
    Adopt(HandleKind::kContext, reinterpret_cast<uintptr_t>(more.primary));
  }
  CUresult rc = a.cuCtxSetCurrent(it->second.exec);
  if (rc != CUDA_SUCCESS) return rc;
  *handle = reinterpret_cast<uintptr_t>(it->second.primary);
  NoteCurrentContext(*handle);
  StagingFollowsDevice();
  return CUDA_SUCCESS;
}

void Session::StagingFollowsDevice() {
  if (more_primaries_.empty()) return;  // one GPU: one context for the staging
  const int device = CurrentDevice();
  const int before = staging_device_ < 0 ? primary_device_ : staging_device_;
  staging_device_ = device;
  if (device != before) ReleaseStaging();
}

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Status CaptureDeviceOutput(ServerState* state) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::Error("pipe: " + std::string(strerror(errno)));
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  fcntl(fds[0], F_SETPIPE_SZ, 1 << 20);
  if (dup2(fds[1], STDOUT_FILENO) < 0) return Status::Error("dup2 stdout failed");
  close(fds[1]);
  state->device_output_fd = fds[0];
  return Status::Ok();
}

// Forwards what the GPU printed since the last reply. The driver writes device
// printf output during the synchronising call itself, so it is in the pipe by
// now. The worker serves one client: what its context printed is the client's.
void Session::ForwardDeviceOutput() {
  if (state_->device_output_fd < 0) return;
  fflush(stdout);
  static thread_local std::vector<uint8_t> buf(64 << 10);
  for (;;) {
    ssize_t n = ::read(state_->device_output_fd, buf.data(), buf.size());
    if (n <= 0) return;
    wire::FrameHeader h{
        wire::kMagic, ops::kOpDeviceOutput, wire::kFlagReply, 0, static_cast<uint32_t>(n), 0, 0, 0};
    iovec iov[2] = {{&h, sizeof(h)}, {buf.data(), static_cast<size_t>(n)}};
    if (!conn_->Send(iov, 2).ok()) return;
  }
}

wire::FrameHeader Session::ReplyHeader(const wire::FrameHeader& req, CUresult rc,
                                       uint32_t payload_len) {
  ForwardDeviceOutput();  // device printf text goes out ahead of the reply
  wire::FrameHeader h{};
  h.magic = wire::kMagic;
  h.op = req.op;
  h.flags = wire::kFlagReply;
  h.call_id = req.call_id;
  h.payload_len = payload_len;
  h.status = static_cast<uint32_t>(rc);
  if (state_->slot != nullptr)
    state_->slot->bytes_out.fetch_add(sizeof(h) + payload_len, std::memory_order_relaxed);
  h.info = reply_info_;
  // The share changed since the client fetched the device inventory: it
  // fetches it again (kOpDeviceInfo) when it sees this bit.
  if (info_generation_ != state_->share.info_generation()) h.info |= wire::kReplyConfigChanged;
  // The operator moves this session: the client parks after this reply (not after a
  // copy between servers opened its listener: the copy finishes first, and the next
  // reply asks).
  if (!move_asked_ && move_wanted_.load(std::memory_order_acquire) &&
      req.op != ops::kOpPeerListen) {
    h.info |= wire::kReplyMoveWanted;
    move_asked_ = true;
  }
  if (!keep_deferred_) {
    h.deferred_status = static_cast<uint32_t>(deferred_);
    deferred_ = CUDA_SUCCESS;
  }
  return h;
}

bool Session::SendReplyHeader(const wire::FrameHeader& req, CUresult rc, uint32_t payload_len) {
  wire::FrameHeader h = ReplyHeader(req, rc, payload_len);
  iovec iov{&h, sizeof(h)};
  return conn_->Send(&iov, 1).ok();
}

bool Session::Reply(const wire::FrameHeader& req, CUresult rc, const Writer& out) {
  wire::FrameHeader h = ReplyHeader(req, rc, static_cast<uint32_t>(out.size()));
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t*>(out.data()), out.size()}};
  Status s = conn_->Send(iov, out.size() > 0 ? 2 : 1);
  if (!s.ok())
    FLYT_INFO("session %llu: %s", static_cast<unsigned long long>(id_), s.message().c_str());
  return s.ok();
}

void Session::AttachCallbackChannel(std::unique_ptr<transport::Connection> conn) {
  std::lock_guard<std::mutex> lock(callback_mu_);
  if (callback_conn_ != nullptr) callback_conn_->Shutdown();
  callback_conn_ = std::move(conn);
  callback_cv_.notify_all();
}

bool Session::CallbackExchange(wire::FrameHeader h, const void* a, size_t na, const void* b,
                               size_t nb, void* reply, size_t reply_len, bool wait_for_channel) {
  std::unique_lock<std::mutex> lock(callback_mu_);
  if (!wait_for_channel && callback_conn_ == nullptr) return false;
  callback_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return callback_conn_ != nullptr; });
  if (callback_conn_ == nullptr) {
    FLYT_WARN(
        "session %llu: host-side work of a stream dropped: the client has no callback "
        "channel",
        static_cast<unsigned long long>(id_));
    return false;
  }
  h.magic = wire::kMagic;
  h.payload_len = static_cast<uint32_t>(na + nb);
  iovec iov[3] = {{&h, sizeof(h)}, {const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
  wire::FrameHeader ack{};
  bool ok = callback_conn_->Send(iov, 3).ok() && callback_conn_->Receive(&ack, sizeof(ack)).ok() &&
            ack.magic == wire::kMagic && ack.op == ops::kOpHostFuncDone &&
            ack.call_id == h.call_id && ack.payload_len == reply_len &&
            (reply_len == 0 || callback_conn_->Receive(reply, reply_len).ok());
  if (!ok) {
    FLYT_INFO("session %llu: callback channel closed", static_cast<unsigned long long>(id_));
    callback_conn_->Shutdown();
  }
  return ok;
}

void Session::RunClientHostFunc(uint64_t id, bool persistent) {
  wire::FrameHeader h{};
  h.op = ops::kOpRunHostFunc;
  h.flags = persistent ? wire::kFlagPersistent : 0;
  h.call_id = id;
  CallbackExchange(h, nullptr, 0, nullptr, 0, nullptr, 0);
}

// Both move at most wire::kCopyChunk bytes per exchange (a graph's memcpy
// node may be larger than one frame).
void Session::DeliverToClient(uint64_t client_dst, const void* bytes, size_t n) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  for (size_t off = 0; off < n || off == 0; off += wire::kCopyChunk) {
    size_t len = std::min<size_t>(wire::kCopyChunk, n - off);
    wire::FrameHeader h{};
    h.op = ops::kOpDeliverBytes;
    uint64_t dst = client_dst + off;
    if (!CallbackExchange(h, &dst, 8, p + off, len, nullptr, 0) || len == 0) return;
  }
}

void Session::FetchFromClient(uint64_t client_src, void* bytes, size_t n) {
  auto* p = static_cast<uint8_t*>(bytes);
  for (size_t off = 0; off < n || off == 0; off += wire::kCopyChunk) {
    size_t len = std::min<size_t>(wire::kCopyChunk, n - off);
    wire::FrameHeader h{};
    h.op = ops::kOpFetchBytes;
    uint64_t req[2] = {client_src + off, len};
    if (!CallbackExchange(h, req, sizeof(req), nullptr, 0, p + off, len) || len == 0) return;
  }
}

void Session::Run() {
  Writer out;
  // Over a socket, the wait for the client's next call polls for FLYT_SOCKET_SPIN_US (200)
  // before it sleeps: a client's calls often come a few microseconds apart, and a sleeping
  // worker pays a wake-up for each (transport.h, SetSocketSpin).
  const char* spin = std::getenv("FLYT_SOCKET_SPIN_US");
  long spin_us = spin != nullptr && spin[0] != '\0' ? std::strtol(spin, nullptr, 10) : 200;
  conn_->SetSocketSpin(static_cast<int>(std::clamp(spin_us, 0L, 1000000L)));
  for (;;) {
    wire::FrameHeader h{};
    Status s = conn_->Receive(&h, sizeof(h));
    if (!s.ok()) {
      FLYT_INFO("session %llu ended: %s", static_cast<unsigned long long>(id_),
                s.message().c_str());
      break;
    }
    if (h.magic != wire::kMagic || (h.flags & wire::kFlagReply) ||
        h.payload_len > wire::kMaxPayload) {
      FLYT_WARN("session %llu from %s: malformed frame (magic %08x, op %u, %u bytes); closing",
                static_cast<unsigned long long>(id_), peer_.c_str(), h.magic, h.op, h.payload_len);
      break;
    }
    if (h.op == ops::kOpGoodbye) break;
    if (state_->slot != nullptr) {
      state_->slot->calls.fetch_add(1, std::memory_order_relaxed);
      state_->slot->bytes_in.fetch_add(sizeof(h) + h.payload_len, std::memory_order_relaxed);
    }
    // A live share change takes effect at the session's first call after it.
    FollowShare();
    if (exec_generation_.load(std::memory_order_relaxed) != state_->share.exec_generation()) {
      SwitchExec();
      KeepUserContextCurrent();
    }
    // While the client profiles, what CUPTI records for this frame carries
    // its call id (session_profiler.cc).
    bool profiled = profiling_;
    if (profiled) ProfilerBeginFrame(h.call_id);
    struct EndFrame {
      Session* s;
      bool on;
      ~EndFrame() {
        if (on) s->ProfilerEndFrame();
      }
    } end_frame{this, profiled};
    out.Clear();
    CUresult rc = CUDA_SUCCESS;
    replied_ = false;
    keep_deferred_ = false;
    reply_info_ = 0;
    if (h.op == ops::kOpCopyToDevice && !(h.flags & wire::kFlagWantReply) &&
        h.payload_len > kStagedMin && EnsureStaging()) {
      if (!StagedUpload(h, &rc)) break;
      if (rc != CUDA_SUCCESS && deferred_ == CUDA_SUCCESS) deferred_ = rc;
      continue;
    }
    FinishUploads();
    if (payload_.size() < h.payload_len) payload_.resize(h.payload_len);
    if (!conn_->Receive(payload_.data(), h.payload_len).ok()) break;
    Reader in(payload_.data(), h.payload_len);
    if (!Dispatch(h, in, out, &rc)) {
      FLYT_WARN("session %llu from %s: malformed or unknown request (op %u, %u bytes); closing",
                static_cast<unsigned long long>(id_), peer_.c_str(), h.op, h.payload_len);
      break;
    }
    if (IsStickyError(rc) && !sticky_logged_) {
      sticky_logged_ = true;
      if (state_->link != nullptr) state_->link->ReportSticky();
      FLYT_WARN(
          "session %llu (client pid %u): sticky error %d; this client's CUDA state is "
          "unusable until it exits, as on a local GPU",
          static_cast<unsigned long long>(id_), client_pid_, rc);
    }
    if (h.flags & wire::kFlagWantReply) {
      if (!replied_ && !Reply(h, rc, out)) break;
      if (moved_) break;  // the session goes on elsewhere (session_migrate.cc)
    } else if (rc != CUDA_SUCCESS && deferred_ == CUDA_SUCCESS) {
      uint64_t args[3] = {0, 0, 0};  // its first arguments, for whoever reads the log
      std::memcpy(args, payload_.data(), std::min<size_t>(h.payload_len, sizeof(args)));
      FLYT_DEBUG(
          "session %llu: asynchronous op %u failed with %d (deferred; arguments begin "
          "%#llx %#llx %#llx)",
          static_cast<unsigned long long>(id_), h.op, rc, static_cast<unsigned long long>(args[0]),
          static_cast<unsigned long long>(args[1]), static_cast<unsigned long long>(args[2]));
      deferred_ = rc;
    }
  }
  ReleaseEverything();
}

void Session::ReleaseEverything() {
  if (profiling_) ProfilerStop(profiled_kinds_);
  pager_.Stop();          // before the managed memory goes
  ReleaseNccl();          // its communicators use the client's memory and streams
  ReleaseUserContexts();  // their handles first, then each context
  ReleaseAll();
  ReleaseSharedHost();
  for (const auto& [device, more] : more_primaries_)  // destroyed with the session's own
    if (more.green != nullptr) old_greens_.push_back(more.green);
  ReleaseExec();
  if (retained_primary_) state_->api.cuDevicePrimaryCtxRelease_v2(primary_device_);
  retained_primary_ = false;
  for (const auto& [device, more] : more_primaries_) {
    CUresult rc = state_->api.cuDevicePrimaryCtxRelease_v2(device);
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("session %llu: releasing the primary context of device %d failed (error %d)",
                static_cast<unsigned long long>(id_), device, rc);
  }
  more_primaries_.clear();
}

void Session::ReleaseStaging() {
  DriverApi& a = state_->api;
  FinishUploads();
  ReleaseRmaStaging();
  transport::RemoteMemory* rma =
      staging_.local[0] != 0 || staging_.local[1] != 0 ? conn_->Rma() : nullptr;
  for (int i = 0; i < 2; ++i) {
    if (rma != nullptr && staging_.local[i] != 0) rma->UnregisterLocal(staging_.local[i]);
    if (staging_.done[i] != nullptr) a.cuEventDestroy_v2(staging_.done[i]);
    if (staging_.buf[i] != nullptr) a.cuMemFreeHost(staging_.buf[i]);
    staging_.done[i] = nullptr;
    staging_.buf[i] = nullptr;
  }
  staging_ = Staging{};
}

void Session::ReleaseAll() {
  DriverApi& a = state_->api;
  ReleaseStaging();
  ReleaseLinks();  // no device state: before the early return below
  NoteCaptures(-captures_.load());
  size_t total = 0;
  for (auto& set : handles_) total += set.size();
  if (total == 0 && host_funcs_in_flight_.load() == 0 && captured_.empty() &&
      retired_streams_.empty() && pt_stream_ == nullptr && VmmEmpty() && ipc_opened_.empty() &&
      pending_frees_.empty())
    return;
  if (exec_ != nullptr || primary_ != nullptr) a.cuCtxSetCurrent(exec_ ? exec_ : primary_);
  // Only this session's work: a context-wide synchronize would invalidate
  // another session's stream capture.
  SynchronizeSession();
  ReleaseIpc();  // closed, not freed: the memory is the exporter's
  if (pt_stream_ != nullptr) retired_streams_.push_back(pt_stream_);
  pt_stream_ = nullptr;
  for (auto& [device, more] : more_primaries_) {
    if (more.pt_stream != nullptr) retired_streams_.push_back(more.pt_stream);
    more.pt_stream = nullptr;
  }
  auto each = [&](HandleKind k, auto&& fn) {
    for (uint64_t h : handles_[static_cast<int>(k)]) fn(h);
    handles_[static_cast<int>(k)].clear();
  };
  each(HandleKind::kGraphExec, [&](uint64_t h) {
    a.cuGraphExecDestroy(reinterpret_cast<CUgraphExec>(RealHandle(HandleKind::kGraphExec, h)));
  });
  ReleaseExecRecords();  // the templates of executable graphs (session_graph_move.cc)
  ReleaseGraphNodes();
  // Graphs of captures still in progress go with their streams, not here.
  for (const auto& entry : capture_graphs_)
    handles_[static_cast<int>(HandleKind::kGraph)].erase(entry.first);
  capture_graphs_.clear();
  each(HandleKind::kGraph, [&](uint64_t h) {
    a.cuGraphDestroy(reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, h)));
  });
  ReleaseCaptured();
  auto real = [&](HandleKind k, uint64_t h) { return RealHandle(k, h); };
  each(HandleKind::kEvent, [&](uint64_t h) {
    a.cuEventDestroy_v2(reinterpret_cast<CUevent>(real(HandleKind::kEvent, h)));
  });
  each(HandleKind::kStream, [&](uint64_t h) { a.cuStreamDestroy_v2(RealStream(h)); });
  stream_map_.clear();
  for (CUstream st : retired_streams_) a.cuStreamDestroy_v2(st);
  retired_streams_.clear();
  for (CUgreenCtx g : old_greens_) {  // their streams are gone
    CUresult rc = a.cuGreenCtxDestroy(g);
    if (rc != CUDA_SUCCESS) FLYT_WARN("cuGreenCtxDestroy failed with error %d", rc);
  }
  old_greens_.clear();
  each(HandleKind::kArray, [&](uint64_t h) { a.cuArrayDestroy(reinterpret_cast<CUarray>(h)); });
  each(HandleKind::kMemory, [&](uint64_t h) {
    if (!IsSessionMapped(h)) a.cuMemFree_v2(static_cast<CUdeviceptr>(h));
  });
  ReleaseVmm();           // unmaps, releases, frees; refunds its own charges
  ReleaseMappedMemory();  // unmapped and released here, then the movable range
  // The session's memory no longer counts against the tenant's quota.
  uint64_t charged[kBoardDevices] = {};
  auto sum = [&](const std::unordered_map<uint64_t, uint64_t>& sizes,
                 const std::unordered_map<uint64_t, int>& devices) {
    for (auto& [h, bytes] : sizes) {
      auto d = devices.find(h);
      charged[BoardDevice(d != devices.end() ? d->second : 0)] += bytes;
    }
  };
  sum(memory_bytes_, memory_device_);
  sum(array_bytes_, array_device_);
  memory_bytes_.clear();
  array_bytes_.clear();
  memory_device_.clear();
  array_device_.clear();
  for (int d = 0; d < kBoardDevices; ++d)
    if (charged[d] != 0) RefundMemory(charged[d], d);
  // Modules of libraries go with their libraries.
  for (auto& [m, lib] : library_modules_) handles_[static_cast<int>(HandleKind::kModule)].erase(m);
  library_modules_.clear();
  kernel_library_.clear();
  function_library_.clear();
  each(HandleKind::kModule, [&](uint64_t h) {
    a.cuModuleUnload(reinterpret_cast<CUmodule>(real(HandleKind::kModule, h)));
  });
  each(HandleKind::kLibrary, [&](uint64_t h) {
    a.cuLibraryUnload(reinterpret_cast<CUlibrary>(real(HandleKind::kLibrary, h)));
  });
  for (auto& m : xlate_) m.clear();
  for (auto& m : rev_) m.clear();
  images_.clear();
  code_names_.clear();
  event_flags_.clear();
  event_recorded_.clear();
  async_allocs_.clear();
  globals_.clear();
  // Pools: the device's default pool is shared and stays; pools this session
  // created live until its worker exits (the memory of those it served went
  // with ReleaseMappedMemory).
  for (CUmemoryPool p : doomed_pools_) a.cuMemPoolDestroy(p);  // their memory went above
  doomed_pools_.clear();
  handles_[static_cast<int>(HandleKind::kMemPool)].clear();
  for (auto& set : handles_) set.clear();
  FLYT_INFO("session %llu: released %zu handles", static_cast<unsigned long long>(id_), total);
}

bool Session::Dispatch(const wire::FrameHeader& h, Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  req_ = h;
  if (!doomed_pools_.empty()) DestroyDrainedPools();
  bool per_thread = (h.flags & wire::kFlagPerThread) != 0;
  pt_call_ = per_thread;
  // In a green context the legacy entry points run on pt_stream_ (RealStream).
  if (CurrentIsGreen()) per_thread = false;
  switch (h.op) {
    case ops::kOpPrimaryCtxRetain: {
      int32_t dev = 0;
      if (!in.Get(&dev) || in.remaining() != 0) return false;
      if (retained_primary_ && dev != primary_device_) {  // another GPU of this server
        uint64_t handle = 0;
        *rc = RetainMorePrimary(dev, &handle);
        out.Put<uint64_t>(handle);
        return true;
      }
      CUcontext ctx = nullptr;
      *rc = a.cuDevicePrimaryCtxRetain(&ctx, dev);
      if (*rc == CUDA_SUCCESS) {
        primary_device_ = dev;
        if (retained_primary_) {
          a.cuDevicePrimaryCtxRelease_v2(dev);  // one reference per session is enough
        }
        retained_primary_ = true;
        primary_ = ctx;
        // A restored session keeps the client's old handle of its primary context.
        if (primary_client_ == 0) primary_client_ = reinterpret_cast<uintptr_t>(ctx);
        Adopt(HandleKind::kContext, primary_client_);
        EnterExec(dev);
        *rc = a.cuCtxSetCurrent(exec_);
        NoteCurrentContext(primary_client_);
      }
      out.Put<uint64_t>(*rc == CUDA_SUCCESS ? primary_client_ : 0);
      return true;
    }
    case ops::kOpSetCurrentContext: {
      uint64_t ctx = 0;
      if (!in.Get(&ctx) || in.remaining() != 0) return false;
      if (ctx != 0 && !Owns(HandleKind::kContext, ctx)) {
        *rc = CUDA_ERROR_INVALID_CONTEXT;
        return true;
      }
      *rc = a.cuCtxSetCurrent(RealContext(ctx));
      if (*rc == CUDA_SUCCESS) {
        NoteCurrentContext(ctx);
        StagingFollowsDevice();
      }
      return true;
    }
    case ops::kOpCtxCreate:  // contexts the client creates: server/session_contexts.cc
      return CtxCreate(in, out, rc);
    case ops::kOpCtxDestroy:
      return CtxDestroy(in, out, rc);
    case ops::kOpSetCaptureMode: {
      uint32_t mode = 0;
      if (!in.Get(&mode) || in.remaining() != 0) return false;
      if (mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      auto m = static_cast<CUstreamCaptureMode>(mode);
      *rc = a.cuThreadExchangeStreamCaptureMode != nullptr ? a.cuThreadExchangeStreamCaptureMode(&m)
                                                           : CUDA_ERROR_NOT_SUPPORTED;
      return true;
    }
    case ops::kOpDeviceInfo: {
      // The inventory with the share applied, after a live change. The
      // deferred error stays for the app's next reply.
      if (in.remaining() != 0) return false;
      std::vector<ops::DeviceInfo> devices = state_->share.Devices(&info_generation_);
      out.Put<uint32_t>(static_cast<uint32_t>(devices.size()));
      for (const auto& d : devices) out.Put(d);
      keep_deferred_ = true;
      *rc = CUDA_SUCCESS;
      return true;
    }
    case 153: {  // cuMemGetInfo_v2: what the tenant's quota leaves
      uint8_t want_free = 0, want_total = 0;
      if (!in.Get(&want_free) || !in.Get(&want_total) || in.remaining() != 0) return false;
      auto info = per_thread && a.cuMemGetInfo_v2_pt ? a.cuMemGetInfo_v2_pt : a.cuMemGetInfo_v2;
      if (info == nullptr) {
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        return true;
      }
      size_t free_bytes = 0, total_bytes = 0;
      *rc = info(&free_bytes, &total_bytes);
      if (*rc != CUDA_SUCCESS) return true;
      state_->share.ClampMemInfo(CurrentDevice(), &free_bytes, &total_bytes);
      if (want_free) out.Put(free_bytes);
      if (want_total) out.Put(total_bytes);
      return true;
    }
    case ops::kOpProfiler:
      return Profiler(in, out, rc);
    case ops::kOpNvmlSnapshot:
      return NvmlSnapshot(in, out, rc);
    case ops::kOpPrimaryCtxReset: {
      // cudaDeviceReset: this process's state goes, other sessions keep theirs.
      CUcontext keep = primary_;
      uint64_t keep_raw = primary_client_;
      std::vector<StashedHandle> user = StashUserHandles();  // contexts it created stay
      pager_.Clear();  // its managed memory goes with the rest
      ReleaseAll();
      if (keep != nullptr) Adopt(HandleKind::kContext, keep_raw);
      for (const auto& [device, more] : more_primaries_)  // other GPUs' primaries stay retained
        Adopt(HandleKind::kContext, reinterpret_cast<uintptr_t>(more.primary));
      // ReleaseAll made the first GPU's context current: the client's stays current.
      if (!more_primaries_.empty() && current_ctx_ != 0) {
        CUresult cur = a.cuCtxSetCurrent(RealContext(current_ctx_));
        if (cur != CUDA_SUCCESS)
          FLYT_WARN("session %llu: making the client's context current again failed (error %d)",
                    static_cast<unsigned long long>(id_), cur);
      }
      RestoreUserHandles(user);
      *rc = CUDA_SUCCESS;
      return in.remaining() == 0;
    }
    case ops::kOpMemRangeAttribute:  // managed memory: server/session_managed.cc
      return MemRangeAttribute(in, out, rc);
    case ops::kOpMemSetAccess:
      return VmmSetAccess(in, rc);
    case ops::kOpMemRetainAllocationHandle:
      return VmmRetainHandle(in, out, rc);
    case ops::kOpMemExportShareable:
      return VmmExportShareable(in, out, rc);
    case ops::kOpMemImportShareable:
      return VmmImportShareable(in, out, rc);
    case ops::kOpIpcGetMemHandle:  // CUDA IPC: server/session_ipc.cc
      return IpcGetMemHandle(in, out, rc);
    case ops::kOpIpcOpenMemHandle:
      return IpcOpenMemHandle(in, out, rc);
    case ops::kOpIpcCloseMemHandle:
      return IpcCloseMemHandle(in, rc);
    case ops::kOpIpcGetEventHandle:
      return IpcGetEventHandle(in, out, rc);
    case ops::kOpIpcOpenEventHandle:
      return IpcOpenEventHandle(in, out, rc);
    case ops::kOpLinkCreate:  // the JIT linker: server/session_link.cc
      return LinkCreate(in, out, rc);
    case ops::kOpLinkAddData:
      return LinkAddData(in, out, rc);
    case ops::kOpLinkComplete:
      return LinkComplete(in, out, rc);
    case ops::kOpLinkDestroy:
      return LinkDestroy(in, rc);
    case ops::kOpTensorMap:
      return TensorMap(in, out, rc);
    case ops::kOpLoadImage:
      return LoadImage(in, out, rc);
    case ops::kOpKernelGetFunction: {
      uint64_t k = 0;
      if (!in.Get(&k) || in.remaining() != 0) return false;
      if (!Owns(HandleKind::kKernel, k)) {
        *rc = CUDA_ERROR_INVALID_HANDLE;
        return true;
      }
      CUfunction f = nullptr;
      *rc =
          a.cuKernelGetFunction(&f, reinterpret_cast<CUkernel>(RealHandle(HandleKind::kKernel, k)));
      uint64_t client = 0;
      if (*rc == CUDA_SUCCESS) {
        client = ClientHandle(HandleKind::kFunction, reinterpret_cast<uintptr_t>(f));
        Adopt(HandleKind::kFunction, client);
        auto named = code_names_.find(k);
        if (named != code_names_.end() && code_names_.count(client) == 0)
          code_names_[client] = CodeName{named->second.image, named->second.name, false, k};
        auto lib = kernel_library_.find(k);  // for cuFuncGetModule
        if (lib != kernel_library_.end()) function_library_[client] = lib->second;
      }
      out.Put<uint64_t>(client);
      return true;
    }
    case ops::kOpFuncParamLayout: {
      uint64_t f = 0;
      uint8_t is_kernel = 0;
      if (!in.Get(&f) || !in.Get(&is_kernel) || in.remaining() != 0) return false;
      if (!Owns(is_kernel ? HandleKind::kKernel : HandleKind::kFunction, f)) {
        *rc = CUDA_ERROR_INVALID_HANDLE;
        return true;
      }
      *rc = DescribeFunction(RealHandle(is_kernel ? HandleKind::kKernel : HandleKind::kFunction, f),
                             is_kernel != 0, out);
      return true;
    }
    case ops::kOpLaunch:
      return Launch(in, per_thread, rc);
    case ops::kOpPark:  // the client is ready to move (session_migrate.cc)
      return Park(in, out, rc);
    case ops::kOpMovePoll:  // the reply header says whether a move waits
      *rc = in.remaining() == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
      return in.remaining() == 0;
    case ops::kOpMaxActiveClusters:
      return MaxActiveClusters(in, out, rc);
    case ops::kOpStreamCaptureInfo:
      return CaptureInfo(in, per_thread, out, rc);
    case ops::kOpCaptureDependencies:
      return CaptureDependencies(in, per_thread, rc);
    case ops::kOpMemPoolAttribute: {
      uint64_t pool = 0, value = 0;
      int32_t attr = 0;
      uint8_t set = 0;
      if (!in.Get(&pool) || !in.Get(&attr) || !in.Get(&set) || !in.Get(&value) ||
          in.remaining() != 0)
        return false;
      // The session answers for the pools it serves (session_pools.cc).
      *rc = PoolAttribute(pool, static_cast<CUmemPool_attribute>(attr), set != 0, &value);
      out.Put(value);
      return true;
    }
    case ops::kOpCopyToDevice:
      return CopyToDevice(in, per_thread, rc);
    case ops::kOpCopyFromDevice:
      return CopyFromDevice(in, per_thread, out, rc);
    case ops::kOpCopy3D:
      return Copy3D(in, per_thread, out, rc);
    case ops::kOpHostShare:
      return ShareHost(in, out, rc);
    case ops::kOpHostUnshare:
      return UnshareHost(in, rc);
    case ops::kOpHostMap:
      return MapHost(in, out, rc);
    case ops::kOpCopyShared:
      return CopyShared(in, per_thread, rc);
    case ops::kOpCopyFromDeviceStaged:
      return CopyFromDeviceStaged(in, per_thread, rc);
    case ops::kOpRmaAttach:
      return RmaAttach(in, out, rc);
    case ops::kOpRmaRegister:
      return RmaRegister(in, out, rc);
    case ops::kOpRmaUnregister:
      return RmaUnregister(in, rc);
    case ops::kOpCopyRma:
      return CopyRma(in, per_thread, rc);
    case ops::kOpHostFunc: {
      uint64_t stream = 0, id = 0;
      if (!in.Get(&stream) || !in.Get(&id) || in.remaining() != 0) return false;
      if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
        *rc = CUDA_ERROR_INVALID_HANDLE;
        return true;
      }
      bool captured = false;
      *rc = HostFunc(RealStream(stream), id, per_thread, &captured);
      if (captured) reply_info_ |= wire::kReplyCaptured;
      return true;
    }
    case ops::kOpGraphGetNodes:
      return GraphGetNodes(in, out, rc);
    case ops::kOpGraphKernelNode:
      return GraphKernelNode(in, out, rc);
    case ops::kOpGraphMemsetNode:
      return GraphMemsetNode(in, out, rc);
    case ops::kOpGraphHostNode:
      return GraphHostNode(in, out, rc);
    case ops::kOpGraphNode:
      return GraphNode(in, out, rc);
    case ops::kOpGraphNodeQuery:
      return GraphNodeQuery(in, out, rc);
    case ops::kOpGraphMisc:
      return GraphMisc(in, out, rc);
    case ops::kOpGraphTopology:
      return GraphTopology(in, out, rc);
    case 280:  // cuGraphExecEventRecordNodeSetEvent / cuGraphExecEventWaitNodeSetEvent:
    case 281:  // the node as the executable graph knows it (session_graph_move.cc)
      return ExecEventNodeSetEvent(h.op == 280, in, rc);
    case ops::kOpStreamBatchMemOp:
      return StreamBatchMemOp(in, per_thread, rc);
    case ops::kOpDriverMisc:
      return DriverMisc(in, per_thread, out, rc);
    case ops::kOpPlaceMemory:  // several servers: server/session_peer_copy.cc
      return PlaceMemory(in, rc);
    case ops::kOpPeerListen:
      return PeerListen(in, out, rc);
    case ops::kOpPeerReceive:
      return PeerReceive(in, per_thread, rc);
    case ops::kOpPeerSend:
      return PeerSend(in, per_thread, rc);
    case ops::kOpPeerDone:
      return PeerDone(in, rc);
    case ops::kOpNccl:  // NCCL run here for the client: server/session_nccl.cc
      return Nccl(in, out, rc);
    case 100:  // cuCtxSynchronize: this client's work, not other sessions'
      if (in.remaining() != 0) return false;
      *rc = SynchronizeSession();
      return true;
    case ops::kOpHostFuncFence: {
      uint64_t stream = 0;
      if (!in.Get(&stream) || in.remaining() != 0) return false;
      if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
        *rc = CUDA_ERROR_INVALID_HANDLE;
        return true;
      }
      auto sync =
          per_thread && a.cuStreamSynchronize_pt ? a.cuStreamSynchronize_pt : a.cuStreamSynchronize;
      *rc = sync(RealStream(stream));
      return true;
    }
    default: {
      bool known = false;
      uint64_t ended = 0;  // cuStreamEndCapture's stream (its first argument)
      if (h.op == 119) wire::Reader(in).Get(&ended);
      bool ok = DispatchGeneric(h.op, per_thread, in, out, rc, &known);
      if (ok && h.op == 119 && !capture_graphs_.empty()) SettleCaptureGraph(ended, *rc);
      // Captures in progress hold live SM changes back (they would move streams).
      if (ok && h.op == 118 && *rc == CUDA_SUCCESS) NoteCaptures(1);  // (and ToGraph)
      if (ok && h.op == 119 && captures_.load() > 0 && *rc != CUDA_ERROR_INVALID_HANDLE &&
          *rc != CUDA_ERROR_ILLEGAL_STATE && *rc != CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
        NoteCaptures(-1);
      return known && ok;
    }
  }
}

// Writes: u32 count, then per parameter {offset, size}. Under lazy loading the
// driver loads the function for the first question: a failure to load is the
// answer (nothing written).
CUresult Session::DescribeFunction(uint64_t handle, bool is_kernel, Writer& out) {
  std::vector<ops::ParamSlot> slots;
  if (CUresult r = DriverParamLayout(handle, is_kernel, &slots); r != CUDA_SUCCESS) return r;
  out.Put<uint32_t>(static_cast<uint32_t>(slots.size()));
  for (const auto& s : slots) out.Put(s);
  return CUDA_SUCCESS;
}

CUresult Session::DriverParamLayout(uint64_t handle, bool is_kernel,
                                    std::vector<ops::ParamSlot>* slots) {
  DriverApi& a = state_->api;
  slots->clear();
  for (size_t i = 0; i < ops::kMaxParams; ++i) {
    size_t off = 0, size = 0;
    CUresult r = is_kernel
                     ? a.cuKernelGetParamInfo(reinterpret_cast<CUkernel>(handle), i, &off, &size)
                     : a.cuFuncGetParamInfo(reinterpret_cast<CUfunction>(handle), i, &off, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
    if (r != CUDA_SUCCESS) return r;
    slots->push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(size)});
  }
  return CUDA_SUCCESS;
}

CUresult Session::LoadCode(const ImageBytes& image, bool library, uint64_t* handle) {
  DriverApi& a = state_->api;
  CUresult rc;
  if (library) {
    CUlibrary lib = nullptr;
    rc = a.cuLibraryLoadData(&lib, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    *handle = reinterpret_cast<uintptr_t>(lib);
  } else {
    CUmodule mod = nullptr;
    rc = a.cuModuleLoadData(&mod, image.data());
    *handle = reinterpret_cast<uintptr_t>(mod);
  }
  return rc;
}

std::vector<std::pair<uint64_t, std::string>> Session::CodeOf(uint64_t image, bool library) {
  DriverApi& a = state_->api;
  unsigned int count = 0;
  std::vector<uint64_t> fns;
  if (library) {
    CUlibrary lib = reinterpret_cast<CUlibrary>(image);
    std::vector<CUkernel> ks;
    if (a.cuLibraryGetKernelCount(&count, lib) == CUDA_SUCCESS && count > 0) ks.resize(count);
    if (!ks.empty() && a.cuLibraryEnumerateKernels(ks.data(), count, lib) == CUDA_SUCCESS)
      for (CUkernel k : ks) fns.push_back(reinterpret_cast<uintptr_t>(k));
  } else {
    CUmodule mod = reinterpret_cast<CUmodule>(image);
    std::vector<CUfunction> fs;
    if (a.cuModuleGetFunctionCount(&count, mod) == CUDA_SUCCESS && count > 0) fs.resize(count);
    if (!fs.empty() && a.cuModuleEnumerateFunctions(fs.data(), count, mod) == CUDA_SUCCESS)
      for (CUfunction f : fs) fns.push_back(reinterpret_cast<uintptr_t>(f));
  }
  std::vector<std::pair<uint64_t, std::string>> out;
  for (uint64_t raw : fns) {
    const char* name = nullptr;
    if (library) {
      a.cuKernelGetName(&name, reinterpret_cast<CUkernel>(raw));
    } else {
      a.cuFuncGetName(&name, reinterpret_cast<CUfunction>(raw));
    }
    out.emplace_back(raw, name != nullptr ? name : "");
  }
  return out;
}

// Writes u32 n, then per kernel (library) or function (module): u64 handle,
// string name, parameter layout; and adopts each handle for this session.
void Session::DescribeImage(uint64_t image, uint64_t image_client, bool library, Writer& out) {
  std::vector<std::pair<uint64_t, std::string>> code = CodeOf(image, library);
  out.Put<uint32_t>(static_cast<uint32_t>(code.size()));
  for (const auto& [raw, name] : code) {
    const HandleKind kind = library ? HandleKind::kKernel : HandleKind::kFunction;
    const uint64_t client = ClientHandle(kind, raw);
    Adopt(kind, client);
    code_names_[client] = CodeName{image_client, name, library, 0};
    if (library) kernel_library_[client] = image_client;
    out.Put(client);
    out.PutString(name);
    out.Put<uint32_t>(ops::kLayoutUnknown);  // asked for at the first launch
  }
}

// Request: u8 loader, u64 hash0, u64 hash1, u64 size, u8 has_bytes, [bytes].
// Reply: u64 handle, u32 n, n x {u64 handle, string name, layout}.
// CUDA_ERROR_NOT_FOUND without bytes asks the client to send the image.
bool Session::LoadImage(Reader& in, Writer& out, CUresult* rc) {
  uint8_t loader = 0, has_bytes = 0;
  uint64_t h0 = 0, h1 = 0, size = 0;
  if (!in.Get(&loader) || !in.Get(&h0) || !in.Get(&h1) || !in.Get(&size) || !in.Get(&has_bytes))
    return false;
  if (loader > 1 || size > wire::kMaxPayload) return false;
  // Without a main process (tests) images are this session's own.
  std::shared_ptr<const ImageBytes> image =
      state_->link != nullptr ? state_->link->FindImage(h0, h1) : nullptr;
  if (has_bytes) {
    if (in.remaining() != size) return false;
    const uint8_t* bytes = in.Skip(size);
    if (image == nullptr)
      image = state_->link != nullptr ? state_->link->PutImage(h0, h1, bytes, size)
                                      : ImageBytes::Copy(bytes, size);
  } else if (in.remaining() != 0) {
    return false;
  }
  if (image == nullptr) {
    *rc = CUDA_ERROR_NOT_FOUND;
    return true;
  }
  // The driver parses the image from its headers alone: bytes whose headers
  // reach past what was received would make it read beyond the buffer.
  ImageSpan span;
  if (!LocateImageWithin(image->data(), image->size(), &span)) {
    FLYT_WARN("session %llu: refused a code image of %zu bytes whose headers do not fit in it",
              static_cast<unsigned long long>(id_), image->size());
    *rc = CUDA_ERROR_INVALID_IMAGE;
    return true;
  }
  bool library = loader == static_cast<uint8_t>(ops::ImageLoader::kLibrary);
  uint64_t handle = 0;
  *rc = LoadCode(*image, library, &handle);
  if (*rc != CUDA_SUCCESS) return true;
  const HandleKind kind = library ? HandleKind::kLibrary : HandleKind::kModule;
  const uint64_t client = ClientHandle(kind, handle);
  Adopt(kind, client);
  images_[client] = ImageRecord{image, h0, h1, library, ++image_seq_};
  out.Put(client);
  DescribeImage(handle, client, library, out);
  return true;
}

// Launch head: u64 fn, u32 flags, u32 grid[3], u32 block[3], u32 shmem,
// u64 stream, u32 nattrs, nattrs x CUlaunchAttribute. `attrs` holds 65 entries
// (one spare for the cooperative attribute). Returns false when malformed;
// *rc = CUDA_ERROR_INVALID_HANDLE when a handle is not this session's.
bool Session::DecodeLaunchHead(Reader& in, CUlaunchConfig* cfg, CUlaunchAttribute* attrs,
                               uint64_t* fn, CUresult* rc) {
  uint64_t stream = 0;
  uint32_t flags = 0, grid[3], block[3], shmem = 0, nattrs = 0;
  if (!in.Get(fn) || !in.Get(&flags) || !in.GetBytes(grid, sizeof(grid)) ||
      !in.GetBytes(block, sizeof(block)) || !in.Get(&shmem) || !in.Get(&stream) ||
      !in.Get(&nattrs) || nattrs > 64)
    return false;
  if (!in.GetBytes(attrs, sizeof(CUlaunchAttribute) * nattrs)) return false;
  bool is_kernel = (flags & ops::kLaunchIsKernel) != 0;
  *rc = CUDA_SUCCESS;
  if (!Owns(is_kernel ? HandleKind::kKernel : HandleKind::kFunction, *fn) ||
      (stream > 2 && !Owns(HandleKind::kStream, stream)))
    *rc = CUDA_ERROR_INVALID_HANDLE;
  *fn = RealHandle(is_kernel ? HandleKind::kKernel : HandleKind::kFunction, *fn);
  if (flags & ops::kLaunchCooperative) {
    attrs[nattrs] = CUlaunchAttribute{};
    attrs[nattrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[nattrs].value.cooperative = 1;
    ++nattrs;
  }
  *cfg = CUlaunchConfig{};
  cfg->gridDimX = grid[0];
  cfg->gridDimY = grid[1];
  cfg->gridDimZ = grid[2];
  cfg->blockDimX = block[0];
  cfg->blockDimY = block[1];
  cfg->blockDimZ = block[2];
  cfg->sharedMemBytes = shmem;
  cfg->hStream = RealStream(stream);
  cfg->attrs = nattrs > 0 ? attrs : nullptr;
  cfg->numAttrs = nattrs;
  return true;
}

// Request: launch head, then the packed parameter block (blob).
bool Session::Launch(Reader& in, bool per_thread, CUresult* rc) {
  DriverApi& a = state_->api;
  CUlaunchConfig cfg;
  CUlaunchAttribute attrs[65];
  uint64_t fn = 0;
  if (!DecodeLaunchHead(in, &cfg, attrs, &fn, rc)) return false;
  const uint8_t* params = nullptr;
  uint32_t param_bytes = 0;
  if (!in.GetBlob(&params, &param_bytes, ops::kMaxParamBytes) || in.remaining() != 0) return false;
  if (*rc != CUDA_SUCCESS) return true;
  size_t size = param_bytes;
  alignas(16) static thread_local uint8_t aligned[ops::kMaxParamBytes + 16];
  std::memcpy(aligned, params, param_bytes);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, aligned, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  auto launch = per_thread && a.cuLaunchKernelEx_pt ? a.cuLaunchKernelEx_pt : a.cuLaunchKernelEx;
  *rc = launch(&cfg, reinterpret_cast<CUfunction>(fn), nullptr, param_bytes > 0 ? extra : nullptr);
  return true;
}

// Request: launch head. Reply: i32 clusters.
bool Session::MaxActiveClusters(Reader& in, Writer& out, CUresult* rc) {
  CUlaunchConfig cfg;
  CUlaunchAttribute attrs[65];
  uint64_t fn = 0;
  if (!DecodeLaunchHead(in, &cfg, attrs, &fn, rc) || in.remaining() != 0) return false;
  if (*rc != CUDA_SUCCESS) return true;
  if (state_->api.cuOccupancyMaxActiveClusters == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  int clusters = 0;
  *rc = state_->api.cuOccupancyMaxActiveClusters(&clusters, reinterpret_cast<CUfunction>(fn), &cfg);
  out.Put<int32_t>(clusters);
  return true;
}

// --- staged bulk copies
//
// Uploads: the bytes of a large host-to-device copy are received straight into
// one of two pinned buffers and copied asynchronously, while the next chunk is
// received into the other. A synchronous copy is complete before any other
// request of the session runs (FinishUploads), which is all an app can observe.
// Downloads: chunk i+1 moves from the GPU while chunk i is on the wire.

bool Session::EnsureStaging() {
  if (staging_.tried) return staging_.ok;
  staging_.tried = true;
  DriverApi& a = state_->api;
  if (primary_ == nullptr || a.cuMemHostAlloc == nullptr || a.cuEventCreate == nullptr)
    return false;
  for (int i = 0; i < 2; ++i) {
    if (a.cuMemHostAlloc(&staging_.buf[i], wire::kCopyChunk, 0) != CUDA_SUCCESS ||
        a.cuEventCreate(&staging_.done[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
      return false;
  }
  // A transport that registers memory (ucx://) registers these once: the bulk messages
  // received into them and sent from them need no registration of their own.
  if (transport::RemoteMemory* rma = conn_->Rma(); rma != nullptr) {
    for (int i = 0; i < 2; ++i) {
      if (!rma->RegisterLocal(staging_.buf[i], wire::kCopyChunk, false, &staging_.local[i]).ok())
        staging_.local[i] = 0;
    }
  }
  staging_.ok = true;
  return true;
}

void Session::FinishUploads() {
  for (int i = 0; i < 2; ++i) {
    if (!staging_.busy[i]) continue;
    staging_.busy[i] = false;
    CUresult rc = state_->api.cuEventSynchronize(staging_.done[i]);
    if (rc != CUDA_SUCCESS && deferred_ == CUDA_SUCCESS) deferred_ = rc;
  }
}

bool Session::StagedUpload(const wire::FrameHeader& h, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t dst = 0, stream = 0, client_src = 0;
  uint8_t async = 0;
  constexpr uint32_t kHead = 25;
  uint8_t head[kHead];
  if (h.payload_len < kHead || !conn_->Receive(head, kHead).ok()) return false;
  std::memcpy(&dst, head, 8);
  std::memcpy(&stream, head + 8, 8);
  async = head[16];
  std::memcpy(&client_src, head + 17, 8);
  size_t n = h.payload_len - kHead;
  *rc = CUDA_SUCCESS;
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) *rc = CUDA_ERROR_INVALID_HANDLE;
  if (stream == 0 && (h.flags & wire::kFlagPerThread)) stream = 2;  // CU_STREAM_PER_THREAD
  CUstream s = RealStream(stream);
  if (*rc == CUDA_SUCCESS && async && Capturing(s)) {
    // Into a graph: the bytes go to a mirror the graph's fetch node refills.
    void* mirror = NewMirror(n);
    if (mirror == nullptr) {
      std::vector<uint8_t> sink(n);
      *rc = CUDA_ERROR_OUT_OF_MEMORY;
      return conn_->Receive(sink.data(), n).ok();
    }
    if (!conn_->Receive(mirror, n).ok()) return false;
    *rc = CaptureUpload(s, dst, client_src, mirror, n);
    return true;
  }
  for (size_t off = 0; off < n;) {
    size_t len = std::min<size_t>(wire::kCopyChunk, n - off);
    int slot = staging_.next;
    staging_.next ^= 1;
    if (staging_.busy[slot]) {
      staging_.busy[slot] = false;
      CUresult e = a.cuEventSynchronize(staging_.done[slot]);
      if (e != CUDA_SUCCESS && *rc == CUDA_SUCCESS) *rc = e;
    }
    if (!conn_->Receive(staging_.buf[slot], len).ok()) return false;
    if (*rc == CUDA_SUCCESS) {
      *rc = a.cuMemcpyHtoDAsync_v2(dst + off, staging_.buf[slot], len, s);
      if (*rc == CUDA_SUCCESS) *rc = a.cuEventRecord(staging_.done[slot], s);
      staging_.busy[slot] = *rc == CUDA_SUCCESS;
    }
    off += len;
  }
  return true;
}

bool Session::StagedDownload(const wire::FrameHeader& req, uint64_t src, uint64_t size,
                             CUstream stream, CUresult* rc) {
  DriverApi& a = state_->api;
  const size_t chunk = wire::kCopyChunk;
  size_t chunks = (size + chunk - 1) / chunk;
  auto enqueue = [&](size_t i) {
    int slot = static_cast<int>(i % 2);
    size_t len = std::min<size_t>(chunk, size - i * chunk);
    CUresult e = a.cuMemcpyDtoHAsync_v2(staging_.buf[slot], src + i * chunk, len, stream);
    if (e == CUDA_SUCCESS) e = a.cuEventRecord(staging_.done[slot], stream);
    return e;
  };
  CUresult first = enqueue(0);
  CUresult second = chunks > 1 && first == CUDA_SUCCESS ? enqueue(1) : CUDA_SUCCESS;
  for (size_t i = 0; i < chunks; ++i) {
    int slot = static_cast<int>(i % 2);
    size_t len = std::min<size_t>(chunk, size - i * chunk);
    CUresult e = i == 0 ? first : (i == 1 ? second : CUDA_SUCCESS);
    if (e == CUDA_SUCCESS) e = a.cuEventSynchronize(staging_.done[slot]);
    if (i == 0) {
      if (e != CUDA_SUCCESS) {
        if (chunks > 1 && second == CUDA_SUCCESS) a.cuEventSynchronize(staging_.done[1]);
        *rc = e;  // an ordinary error reply, nothing streamed yet
        return true;
      }
      if (!SendReplyHeader(req, CUDA_SUCCESS, static_cast<uint32_t>(size))) return false;
      replied_ = true;
    } else if (e != CUDA_SUCCESS) {
      std::memset(staging_.buf[slot], 0, len);  // the header is out: report it next time
      if (deferred_ == CUDA_SUCCESS) deferred_ = e;
    }
    iovec iov{staging_.buf[slot], len};
    if (!conn_->Send(&iov, 1).ok()) return false;
    if (i + 2 < chunks) {
      CUresult next = enqueue(i + 2);
      if (next != CUDA_SUCCESS && deferred_ == CUDA_SUCCESS) deferred_ = next;
    }
  }
  *rc = CUDA_SUCCESS;
  return true;
}

// Request: u64 dst, u64 stream, u8 async, u64 client source, then the bytes.
bool Session::CopyToDevice(Reader& in, bool per_thread, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t dst = 0, stream = 0, client_src = 0;
  uint8_t async = 0;
  if (!in.Get(&dst) || !in.Get(&stream) || !in.Get(&async) || !in.Get(&client_src)) return false;
  size_t n = in.remaining();
  const uint8_t* src = in.Skip(n);
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  CUstream s = RealStream(stream == 0 && per_thread ? 2 : stream);
  if (async && Capturing(s)) {
    void* mirror = NewMirror(n);
    if (mirror == nullptr) {
      *rc = CUDA_ERROR_OUT_OF_MEMORY;
      return true;
    }
    std::memcpy(mirror, src, n);
    *rc = CaptureUpload(s, dst, client_src, mirror, n);
    return true;
  }
  if (async) {
    // The source is pageable server memory: the driver stages it before returning.
    *rc = a.cuMemcpyHtoDAsync_v2(dst, src, n, RealStream(stream));
  } else {
    auto copy = per_thread && a.cuMemcpyHtoD_v2_pt ? a.cuMemcpyHtoD_v2_pt : a.cuMemcpyHtoD_v2;
    *rc = copy(dst, src, n);
  }
  return true;
}

// Request: u64 src, u64 size, u64 stream, u8 async, u64 client destination.
// Reply: the bytes (none when captured into a graph).
bool Session::CopyFromDevice(Reader& in, bool per_thread, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t src = 0, size = 0, stream = 0, client_dst = 0;
  uint8_t async = 0;
  if (!in.Get(&src) || !in.Get(&size) || !in.Get(&stream) || !in.Get(&async) ||
      !in.Get(&client_dst) || in.remaining() != 0 || size > wire::kMaxPayload)
    return false;
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  // The per-thread default stream, when a per-thread call names stream 0.
  const uint64_t target = stream == 0 && per_thread ? 2 : stream;
  if (async && Capturing(RealStream(target))) {
    // Into a graph: each run of the graph delivers the bytes to the client.
    *rc = CaptureDownload(RealStream(target), src, client_dst, size);
    reply_info_ |= wire::kReplyCaptured;
    return true;
  }
  if (size > kStagedMin && EnsureStaging()) {
    if (!StagedDownload(req_, src, size, RealStream(target), rc))
      conn_->Shutdown();  // next receive ends it
    return true;
  }
  uint8_t* dst = out.Grow(size);
  if (async) {
    CUstream s = RealStream(target);
    *rc = a.cuMemcpyDtoHAsync_v2(dst, src, size, s);
    if (*rc == CUDA_SUCCESS) *rc = a.cuStreamSynchronize(s);
  } else {
    auto copy = per_thread && a.cuMemcpyDtoH_v2_pt ? a.cuMemcpyDtoH_v2_pt : a.cuMemcpyDtoH_v2;
    *rc = copy(dst, src, size);
  }
  if (*rc != CUDA_SUCCESS) out.Clear();
  return true;
}

// Request: CUDA_MEMCPY3D, u64 stream, u8 async, u8 src_host, u8 dst_host,
// [dense source bytes]. Reply: [dense destination bytes].
bool Session::Copy3D(Reader& in, bool per_thread, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  CUDA_MEMCPY3D d{};
  uint64_t stream = 0;
  uint8_t async = 0, src_host = 0, dst_host = 0;
  if (!in.Get(&d) || !in.Get(&stream) || !in.Get(&async) || !in.Get(&src_host) ||
      !in.Get(&dst_host))
    return false;
  uint64_t dense = static_cast<uint64_t>(d.WidthInBytes) * d.Height * d.Depth;
  if (d.Height > UINT32_MAX || d.Depth > UINT32_MAX || dense > wire::kMaxPayload) return false;
  if ((src_host && in.remaining() != dense) || (!src_host && in.remaining() != 0)) return false;
  if ((stream > 2 && !Owns(HandleKind::kStream, stream)) ||
      (d.srcMemoryType == CU_MEMORYTYPE_ARRAY &&
       !Owns(HandleKind::kArray, reinterpret_cast<uintptr_t>(d.srcArray))) ||
      (d.dstMemoryType == CU_MEMORYTYPE_ARRAY &&
       !Owns(HandleKind::kArray, reinterpret_cast<uintptr_t>(d.dstArray)))) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  if (src_host) {
    d.srcMemoryType = CU_MEMORYTYPE_HOST;
    d.srcHost = in.Skip(dense);
    d.srcXInBytes = d.srcY = d.srcZ = 0;
    d.srcPitch = d.WidthInBytes;
    d.srcHeight = d.Height;
  } else if (d.srcMemoryType == CU_MEMORYTYPE_HOST) {
    return false;  // a client address means nothing here
  }
  if (dst_host) {
    d.dstMemoryType = CU_MEMORYTYPE_HOST;
    d.dstHost = out.Grow(dense);
    d.dstXInBytes = d.dstY = d.dstZ = 0;
    d.dstPitch = d.WidthInBytes;
    d.dstHeight = d.Height;
  } else if (d.dstMemoryType == CU_MEMORYTYPE_HOST) {
    return false;
  }
  if (async) {
    *rc = a.cuMemcpy3DAsync_v2(&d, RealStream(stream));
    if (*rc == CUDA_SUCCESS && dst_host) *rc = a.cuStreamSynchronize(RealStream(stream));
  } else {
    auto copy = per_thread && a.cuMemcpy3D_v2_pt ? a.cuMemcpy3D_v2_pt : a.cuMemcpy3D_v2;
    *rc = copy(&d);
  }
  if (*rc != CUDA_SUCCESS) out.Clear();
  return true;
}

}  // namespace flyt::server
