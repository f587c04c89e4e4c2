// Moving a session: live migration to another flyt-server, and checkpoint to a
// file with restore from it (docs/architecture.md §7.4).
//
// Owns: the park (the client stops sending until told where to go on), what a
// session's snapshot holds and how it is written and read back, the restore
// of that state under the client's handle values and device addresses, the
// translation of handles a restored session needs, and the memory a restore
// maps with the driver's VMM calls at the client's old addresses.
// Must not touch: other sessions, the client's connection outside the park's
// reply, the framing of the snapshot (server/session_snapshot.h).
//
// What moves: device memory from cuMemAlloc/cuMemAllocPitch and, with
// --movable-memory, stream-ordered allocations with the pools the session
// serves (contents, addresses, pool handles and attributes;
// session_pools.cc), the app's own
// VMM (session_vmm_move.cc), modules and libraries with their functions and
// kernels (and the attributes the app set on them), the globals the app looked
// up (contents; the address must come out the same), streams (flags,
// priority), events (flags), graphs and executable graphs with the host work
// captured into them (session_graph_move.cc), texture objects over linear and
// pitch-2D device memory (their values too: RestoreTextures), context limits,
// the deferred error. What refuses a move, before anything is paused: see Unmovable().
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/log.h"
#include "server/session.h"
#include "server/session_snapshot.h"
#include "server/tenant_board.h"
#include "server/worker.h"
#include "transport/transport.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

namespace {

constexpr size_t kCopyChunk = 8u << 20;  // pinned bounce buffer of memory copies
constexpr int kConnectTimeoutMs = 10000;
constexpr int kRestoreTimeoutMs = 10 * 60 * 1000;  // the target restores at most this long
// The lists a snapshot holds after its limits (all empty when the client had
// not touched the GPU): pools (2), memory, VMM (3), images, code, globals,
// streams, events, graphs (3), texture objects.
constexpr int kListsAfterLimits = 15;
// A restore makes one texture object per value up to the largest the session
// holds: a session whose values went higher than this is refused a move.
constexpr uint64_t kMaxTextureValue = 1 << 16;

int K(HandleKind k) { return static_cast<int>(k); }

// Function attributes an app may set, carried to the new server.
constexpr CUfunction_attribute kSettableAttributes[] = {
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
};
constexpr CUlimit kCarriedLimits[] = {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE,
                                      CU_LIMIT_MALLOC_HEAP_SIZE};

uint64_t RandomWord() {
  std::random_device rd;
  return ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
}

// A pinned bounce buffer for memory contents, freed on scope exit.
struct Bounce {
  DriverApi& a;
  void* p = nullptr;
  explicit Bounce(DriverApi& api) : a(api) {
    if (a.cuMemHostAlloc(&p, kCopyChunk, 0) != CUDA_SUCCESS) p = nullptr;
  }
  ~Bounce() {
    if (p != nullptr) a.cuMemFreeHost(p);
  }
};

std::string Describe(CUresult rc) { return "CUDA error " + std::to_string(rc); }

// What this process has mapped over [lo, hi): the /proc/self/maps lines (the
// driver keeps device addresses out of the host's way with host mappings),
// or "nothing of the host's".
std::string HostMappingsOver(uint64_t lo, uint64_t hi) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return "unknown";
  std::string out;
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long a = 0, b = 0;
    if (std::sscanf(line, "%llx-%llx", &a, &b) != 2 || b <= lo || a >= hi) continue;
    std::string l(line);
    while (!l.empty() && (l.back() == '\n' || l.back() == ' ')) l.pop_back();
    out += (out.empty() ? "" : "; ") + l;
  }
  std::fclose(f);
  return out.empty() ? "nothing of the host's" : out;
}

}  // namespace

void Session::RequestMove(const channel::MoveOrder& order) {
  {
    std::lock_guard<std::mutex> lock(move_mu_);
    move_order_ = order;
    move_wanted_.store(true, std::memory_order_release);
  }
  // A client that makes no call would never see the request in a reply: its
  // callback channel, where it has one, tells it to ask (kOpMovePoll).
  wire::FrameHeader h{};
  h.op = ops::kOpParkNudge;
  CallbackExchange(h, nullptr, 0, nullptr, 0, nullptr, 0, /*wait_for_channel=*/false);
}

uint64_t Session::ClientHandle(HandleKind kind, uint64_t real) {
  if (kind == HandleKind::kStream) {
    // A stream the driver made now may carry the value of a stream the
    // client had on the old server: that value still means the old one.
    if (stream_map_.empty() || stream_map_.count(real) == 0) return real;
    uint64_t synthetic = next_synthetic_++;
    stream_map_[synthetic] = reinterpret_cast<CUstream>(real);
    return synthetic;
  }
  auto& fwd = xlate_[K(kind)];
  auto& rev = rev_[K(kind)];
  if (fwd.empty()) return real;
  auto known = rev.find(real);
  if (known != rev.end()) return known->second;
  if (fwd.count(real) == 0) return real;
  uint64_t synthetic = next_synthetic_++;
  fwd[synthetic] = real;
  rev[real] = synthetic;
  return synthetic;
}

void Session::NoteTexObject(uint64_t value, const CUDA_RESOURCE_DESC* res,
                            const CUDA_TEXTURE_DESC* tex, const CUDA_RESOURCE_VIEW_DESC* view) {
  if (value == 0 || res == nullptr || tex == nullptr) return;
  TextureRecord& t = textures_[value];
  t.res = *res;
  t.tex = *tex;
  t.has_view = view != nullptr;
  t.view = view != nullptr ? *view : CUDA_RESOURCE_VIEW_DESC{};
}

void Session::NoteGlobalName(uint64_t ptr, uint64_t size, uint64_t image, const char* name) {
  if (ptr == 0 || name == nullptr || pager_.Contains(ptr, 1)) return;  // managed: not moved
  globals_[ptr] = GlobalRecord{size, image, name};
}

std::string Session::Unmovable() {
  auto any = [&](HandleKind k) { return !handles_[K(k)].empty(); };
  if (sticky_logged_) return "the process hit a sticky error";
  if (captures_.load() > 0) return "a stream capture is in progress";
  // Surfaces and textures over arrays first: they say more than the arrays under them.
  if (!surfaces_.empty())
    return "it holds surface objects (they are made of CUDA arrays; not movable yet)";
  for (const auto& [value, t] : textures_) {
    if (t.res.resType != CU_RESOURCE_TYPE_LINEAR && t.res.resType != CU_RESOURCE_TYPE_PITCH2D)
      return "it holds texture objects over CUDA arrays (only textures over linear or pitch-2D "
             "device memory move)";
  }
  if (!textures_.empty() && textures_.rbegin()->first > kMaxTextureValue)
    return "it holds a texture object of value " + std::to_string(textures_.rbegin()->first) +
           " (a target makes one object per value up to the largest, at most " +
           std::to_string(kMaxTextureValue) + ")";
  if (any(HandleKind::kArray)) return "it holds CUDA arrays (not movable yet)";
  if (std::string why = PoolsUnmovable(); !why.empty()) return why;  // session_pools.cc
  if (!async_allocs_.empty())
    return std::string("it holds stream-ordered allocations of the driver's pools") +
           (state_->movable_memory
                ? " (captured into a graph, or from a pool the session does not serve)"
                : " (a flyt-server with --movable-memory serves cudaMallocAsync from memory "
                  "that moves)");
  if (pager_.Any()) return "it holds managed memory (not movable yet)";
  if (std::string why = VmmUnmovable(); !why.empty()) return why;
  if (!ipc_opened_.empty() || !ipc_exported_mem_.empty() || !ipc_exported_events_.empty())
    return "it shares memory or events with other processes over CUDA IPC";
  if (!user_contexts_.empty()) return "it created contexts of its own (not movable yet)";
  if (!nccl_comms_.empty())
    return "it holds NCCL communicators (their peers would have to move with it; not movable yet)";
  if (!more_primaries_.empty()) return "it uses several GPUs (not movable yet)";
  if (!links_.empty()) return "a JIT link is in progress";
  if (!peer_listeners_.empty()) return "a copy between two servers is in progress";
  // A staging area of device-to-host copies stays behind: the client makes another; a
  // pinned buffer whose memfd the client kept is shared with the next server.
  if (shared_host_.size() > left_host_.size())
    return "it has pinned host memory mapped for the GPU (cudaHostAllocMapped, "
           "cudaHostRegister, a device pointer asked for over a socket) or more pinned buffers "
           "shared over shm than Flyt keeps movable (512); not movable yet";
  if (profiling_) return "a profiler is recording it";
  if (primary_ == nullptr) return "";  // nothing on the GPU yet
  for (uint64_t f : handles_[K(HandleKind::kFunction)])
    if (code_names_.count(f) == 0 && handles_[K(HandleKind::kKernel)].count(f) == 0)
      return "it holds a function of unknown origin";
  for (const auto& [h, c] : code_names_)
    if (images_.count(c.image) == 0 && library_modules_.count(c.image) != 0)
      return "it holds functions of a library's module (cuLibraryGetModule, cuFuncGetModule; "
             "not movable yet)";
  return GraphsUnmovable();  // session_graph_move.cc
}

// --- the snapshot ----------------------------------------------------------------
//
// header: magic, version, key[2], client pid, device, primary context handle,
//         deferred error, i32 placed slot (kOpPlaceMemory; -1: none)
// limits: count, {u32 limit, u64 value}
// streams: count, {u64 handle, u32 flags, i32 priority, u64 images loaded before it},
//         in creation order
// pools:  the pools the session serves and the device's current pool
//         (session_pools.cc, WritePools)
// memory:  count, {u64 base, u64 size, u64 charged} (contents at the end)
// images: count, {u64 handle, u8 library, u64 h0, u64 h1, bytes}
// code:   count, {u64 handle, u8 kernel, u64 image, string name, u64 from_kernel,
//                 count, {i32 attribute, i32 value}}
// globals: count, {u64 ptr, u64 size, u64 image, string name, bytes}
// events:  count, {u64 handle, u32 flags}
// graphs:  session_graph_move.cc, WriteGraphs
// textures: count, {u64 value, CUDA_RESOURCE_DESC, CUDA_TEXTURE_DESC, u8 has view,
//           CUDA_RESOURCE_VIEW_DESC}, by value (linear and pitch-2D resources only)
// memory contents, in the order of the list
// trailer: magic

Status Session::WriteSnapshot(SnapshotWriter& out, const uint64_t key[2]) {
  DriverApi& a = state_->api;
  out.Put(kSnapshotMagic);
  out.Put(kSnapshotVersion);
  out.Put(key[0]);
  out.Put(key[1]);
  out.Put<uint32_t>(client_pid_);
  out.Put<int32_t>(primary_ != nullptr ? primary_device_ : -1);
  out.Put<uint64_t>(primary_client_);
  out.Put<uint32_t>(deferred_);
  out.Put<int32_t>(placed_slot_);
  // Limits, as the app left them.
  std::vector<std::pair<uint32_t, uint64_t>> limits;
  for (CUlimit l : kCarriedLimits) {
    size_t v = 0;
    if (primary_ != nullptr && a.cuCtxGetLimit(&v, l) == CUDA_SUCCESS) limits.emplace_back(l, v);
  }
  out.Put<uint64_t>(limits.size());
  for (auto& [l, v] : limits) {
    out.Put(l);
    out.Put(v);
  }
  // The code images in load order (written below, after the memory).
  std::vector<std::pair<uint64_t, const ImageRecord*>> images;
  for (auto& [h, rec] : images_) images.emplace_back(h, &rec);
  std::sort(images.begin(), images.end(),
            [](auto& x, auto& y) { return x.second->seq < y.second->seq; });
  // Streams, in creation order, each with how many of those images were loaded before it
  // (Session::StreamOrigin): the target makes them between the same loads.
  std::vector<std::pair<StreamOrigin, uint64_t>> streams;
  for (uint64_t h : handles_[K(HandleKind::kStream)]) {
    auto o = stream_origin_.find(h);
    streams.emplace_back(o != stream_origin_.end() ? o->second : StreamOrigin{}, h);
  }
  std::sort(streams.begin(), streams.end(),
            [](auto& x, auto& y) { return x.first.seq < y.first.seq; });
  out.Put<uint64_t>(streams.size());
  for (const auto& [made, h] : streams) {
    const uint64_t after_image = made.after_image;
    unsigned flags = 0;
    int priority = 0;
    CUstream s = RealStream(h);
    if (a.cuStreamGetFlags(s, &flags) != CUDA_SUCCESS) flags = CU_STREAM_DEFAULT;
    if (a.cuStreamGetPriority(s, &priority) != CUDA_SUCCESS) priority = 0;
    const uint64_t after = static_cast<uint64_t>(std::count_if(
        images.begin(), images.end(), [&](auto& im) { return im.second->seq <= after_image; }));
    out.Put(h);
    out.Put<uint32_t>(flags);
    out.Put<int32_t>(priority);
    out.Put(after);
  }
  if (Status st = WritePools(out); !st.ok()) return st;  // session_pools.cc
  std::vector<std::pair<uint64_t, uint64_t>> memory;     // base, size
  for (uint64_t base : handles_[K(HandleKind::kMemory)]) {
    CUdeviceptr b = 0;
    size_t size = 0;
    auto restored = mapped_allocs_.find(base);
    if (restored == mapped_allocs_.end()) {
      CUresult r = a.cuMemGetAddressRange_v2(&b, &size, base);
      if (r != CUDA_SUCCESS || b != base)
        return Status::Error("cannot tell the size of the allocation at " + std::to_string(base));
    } else {
      size = restored->second.size;
    }
    memory.emplace_back(base, size);
  }
  std::sort(memory.begin(), memory.end());
  out.Put<uint64_t>(memory.size());
  for (auto& [base, size] : memory) {
    auto charged = memory_bytes_.find(base);
    out.Put(base);
    out.Put(size);
    out.Put<uint64_t>(charged != memory_bytes_.end() ? charged->second : 0);
  }
  if (Status st = WriteVmmLayout(out); !st.ok()) return st;  // session_vmm_move.cc
  // Code, in load order.
  out.Put<uint64_t>(images.size());
  for (auto& [h, rec] : images) {
    out.Put(h);
    out.Put<uint8_t>(rec->library);
    out.Put(rec->h0);
    out.Put(rec->h1);
    out.Put<uint64_t>(rec->bytes->size());
    out.Bytes(rec->bytes->data(), rec->bytes->size());
  }
  std::vector<uint64_t> code;  // each once (a kernel may be known as a function too)
  std::unordered_set<uint64_t> listed;
  for (HandleKind k : {HandleKind::kKernel, HandleKind::kFunction})
    for (uint64_t h : handles_[K(k)])
      if (code_names_.count(h) != 0 && listed.insert(h).second) code.push_back(h);
  out.Put<uint64_t>(code.size());
  for (uint64_t h : code) {
    const CodeName& c = code_names_.at(h);
    out.Put(h);
    out.Put<uint8_t>(c.kernel);
    out.Put(c.image);
    out.String(c.name);
    out.Put(c.from_kernel);
    std::vector<std::pair<int32_t, int32_t>> attrs;
    const uint64_t real = RealHandle(c.kernel ? HandleKind::kKernel : HandleKind::kFunction, h);
    for (CUfunction_attribute attr : kSettableAttributes) {
      int v = 0;
      CUresult r = c.kernel ? a.cuKernelGetAttribute(&v, attr, reinterpret_cast<CUkernel>(real),
                                                     primary_device_)
                            : a.cuFuncGetAttribute(&v, attr, reinterpret_cast<CUfunction>(real));
      if (r == CUDA_SUCCESS) attrs.emplace_back(attr, v);
    }
    out.Put<uint64_t>(attrs.size());
    for (auto& [attr, v] : attrs) {
      out.Put(attr);
      out.Put(v);
    }
  }
  Bounce bounce(a);
  if (bounce.p == nullptr) return Status::Error("no pinned memory for the copy");
  auto put_bytes = [&](uint64_t base, uint64_t size) -> Status {
    for (uint64_t off = 0; off < size; off += kCopyChunk) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyChunk, size - off));
      CUresult r = a.cuMemcpyDtoH_v2(bounce.p, base + off, n);
      if (r != CUDA_SUCCESS) return Status::Error("reading device memory: " + Describe(r));
      out.Bytes(bounce.p, n);
    }
    return out.status();
  };
  out.Put<uint64_t>(globals_.size());
  for (auto& [ptr, g] : globals_) {
    out.Put(ptr);
    out.Put(g.size);
    out.Put(g.image);
    out.String(g.name);
    if (Status st = put_bytes(ptr, g.size); !st.ok()) return st;
  }
  // Events in the order they were last recorded (never recorded first): the
  // target records them again in this order.
  std::vector<std::pair<uint64_t, uint64_t>> events;  // seq, handle
  for (uint64_t h : handles_[K(HandleKind::kEvent)]) {
    auto r = event_recorded_.find(h);
    events.emplace_back(r != event_recorded_.end() ? r->second : 0, h);
  }
  std::sort(events.begin(), events.end());
  out.Put<uint64_t>(events.size());
  for (auto& [seq, h] : events) {
    auto f = event_flags_.find(h);
    out.Put(h);
    out.Put<uint32_t>(f != event_flags_.end() ? f->second : 0);
  }
  if (Status st = WriteGraphs(&out); !st.ok()) return st;  // session_graph_move.cc
  WriteTextures(out);
  for (auto& [base, size] : memory)
    if (Status st = put_bytes(base, size); !st.ok()) return st;
  if (Status st = WriteVmmContents(out, bounce.p); !st.ok()) return st;
  out.Put(kSnapshotMagic);
  return out.Flush();
}

// --- the park --------------------------------------------------------------------

bool Session::Park(Reader& in, Writer& out, CUresult* rc) {
  if (in.remaining() != 0) return false;
  *rc = CUDA_SUCCESS;
  keep_deferred_ = true;  // an earlier call's error moves with the session
  channel::MoveOrder order;
  {
    std::lock_guard<std::mutex> lock(move_mu_);
    order = move_order_;
  }
  const bool wanted = move_wanted_.exchange(false);
  move_asked_ = false;
  auto go_on = [&](const std::string& why) {
    out.Put<uint8_t>(static_cast<uint8_t>(ops::ParkAction::kContinue));
    out.PutString("");
    out.Put<uint64_t>(0);
    out.Put<uint64_t>(0);
    if (!why.empty()) {
      FLYT_WARN("session %llu (client pid %u) stays here: %s", static_cast<unsigned long long>(id_),
                client_pid_, why.c_str());
      ReportOutcome(channel::Report::Kind::kMove, false, why);
    }
    return true;
  };
  if (!wanted) return go_on("");
  const auto t0 = SteadyNowNs();
  // Everything the client sent is done on the CPU side; now on the GPU too.
  if (primary_ != nullptr) {
    state_->api.cuCtxSetCurrent(exec_ != nullptr ? exec_ : primary_);
    if (CUresult r = SynchronizeSession(); r != CUDA_SUCCESS) {
      if (deferred_ == CUDA_SUCCESS) deferred_ = r;
      return go_on("its work failed while draining (" + Describe(r) + ")");
    }
  }
  ReapFrees(true);  // stream-ordered frees the drain completed
  TrimPools();      // and the pools' idle memory beyond their thresholds, as a sync does
  std::string why = Unmovable();
  if (!why.empty()) return go_on("cannot move: " + why);
  uint64_t key[2] = {RandomWord(), RandomWord()};
  const bool checkpoint = order.mode == channel::MoveOrder::Mode::kCheckpoint;
  std::string done;
  if (checkpoint) {
    const std::string path = order.where + "/session-" + std::to_string(id_) + ".flyt";
    const std::string tmp = path + ".partial";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return go_on("cannot write " + tmp + ": " + std::strerror(errno));
    SnapshotWriter w(fd);
    Status st = WriteSnapshot(w, key);
    if (st.ok() && ::fsync(fd) != 0) st = Status::Error(std::string("fsync: ") + strerror(errno));
    ::close(fd);
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
      st = Status::Error("rename to " + path + ": " + std::strerror(errno));
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return go_on("checkpoint failed: " + st.message());
    }
    done = "checkpointed to " + path + " (" + std::to_string(w.written()) + " bytes)";
  } else {
    transport::Address addr;
    Status st = transport::ParseAddress(order.where, &addr);
    if (st.ok() && addr.kind != transport::Address::Kind::kTcp &&
        addr.kind != transport::Address::Kind::kUnix &&
        addr.kind != transport::Address::Kind::kTls && addr.kind != transport::Address::Kind::kShm)
      st = Status::Error("migration goes over tcp://, tls://, unix:// or shm:// only");
    std::unique_ptr<transport::Connection> target;
    transport::Liveness live;
    live.connect_timeout_ms = kConnectTimeoutMs;
    live.dead_peer_timeout_ms = kRestoreTimeoutMs;
    // A tls:// target is checked against --tls-peer-ca, as a client checks its server.
    if (st.ok()) {
      st = addr.kind == transport::Address::Kind::kTls
               ? transport::DialTls(addr, live, state_->migrate_tls, &target)
               : transport::Dial(addr, live, &target);
    }
    uint64_t written = 0;
    if (st.ok()) {
      Writer hello;
      wire::HelloRequest req{wire::kProtocolVersion, 0, client_pid_,
                             static_cast<uint32_t>(order.token.size())};
      hello.Put(req);
      hello.PutBytes(order.token.data(), order.token.size());
      wire::FrameHeader h{wire::kMagic,
                          ops::kOpRestoreSession,
                          wire::kFlagWantReply,
                          0,
                          static_cast<uint32_t>(hello.size()),
                          0,
                          0,
                          0};
      iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t*>(hello.data()), hello.size()}};
      st = target->Send(iov, 2);
      // The target answers twice: whether it takes the session (token,
      // version), and once the session is restored there.
      target->SetReceiveTimeout(kRestoreTimeoutMs);
      auto answer = [&]() {
        wire::FrameHeader rep{};
        Status s = target->Receive(&rep, sizeof(rep));
        if (s.ok() && (rep.magic != wire::kMagic || rep.payload_len > 65536))
          s = Status::Error("the target answered with a malformed frame");
        std::vector<uint8_t> payload;
        if (s.ok()) {
          payload.resize(rep.payload_len);
          s = target->Receive(payload.data(), payload.size());
        }
        if (s.ok() && rep.status != CUDA_SUCCESS) {
          Reader r(payload.data(), payload.size());
          std::string message;
          r.GetString(&message);
          s = Status::Error("the target refused it: " + message);
        }
        return s;
      };
      if (st.ok()) st = answer();
      SnapshotWriter w(target.get());
      if (st.ok()) {
        st = WriteSnapshot(w, key);
        // A target that failed part way says why before it hangs up.
        Status why = answer();
        if (st.ok() || !why.ok()) st = why;
      }
      written = w.written();
    }
    if (!st.ok()) return go_on("migration to " + order.where + " failed: " + st.message());
    done = "migrated to " + order.where + " (" + std::to_string(written) + " bytes)";
  }
  const double pause_ms = static_cast<double>(SteadyNowNs() - t0) / 1e6;
  char took[64];
  std::snprintf(took, sizeof(took), " in %.1f ms", pause_ms);
  done += took;
  if (checkpoint && order.leave_running) {
    FLYT_INFO("session %llu %s; it goes on here", static_cast<unsigned long long>(id_),
              done.c_str());
    ReportOutcome(channel::Report::Kind::kMove, true, done);
    return go_on("");
  }
  out.Put<uint8_t>(
      static_cast<uint8_t>(checkpoint ? ops::ParkAction::kWaitResume : ops::ParkAction::kResumeAt));
  out.PutString(checkpoint ? "" : order.where);
  out.Put(key[0]);
  out.Put(key[1]);
  moved_ = true;  // Run ends after this reply; the session's state here goes
  FLYT_INFO("session %llu (client pid %u) %s", static_cast<unsigned long long>(id_), client_pid_,
            done.c_str());
  // The client hears where it goes on before the control socket hears of the
  // move: an operator may stop this server as soon as it has the answer.
  if (!Reply(req_, *rc, out))
    FLYT_WARN("session %llu: the client did not get the park's answer",
              static_cast<unsigned long long>(id_));
  replied_ = true;
  ReportOutcome(channel::Report::Kind::kMove, true, done);
  return true;
}

void Session::ReportOutcome(channel::Report::Kind kind, bool ok, const std::string& message) {
  if (state_->link == nullptr) return;
  channel::Report r;
  r.kind = kind;
  r.ok = ok;
  r.session = id_;
  r.message = message;
  state_->link->Report(r);
}

// --- the restore -----------------------------------------------------------------

Status Session::RestoreMemoryLayout(SnapshotReader& in, std::vector<RestoredAlloc>* allocs,
                                    const RestoredPools& pools) {
  DriverApi& a = state_->api;
  uint64_t n = 0;
  if (!in.Count(&n)) return in.status();
  allocs->resize(n);
  for (auto& x : *allocs)
    if (!in.Get(&x.base) || !in.Get(&x.size) || !in.Get(&x.charged)) return in.status();
  bool pool_regions = false;
  for (const RestoredPool& p : pools.pools) pool_regions = pool_regions || !p.regions.empty();
  if (allocs->empty() && !pool_regions) return Status::Ok();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = primary_device_;
  size_t gran = 0;
  CUresult r = a.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS || gran == 0)
    return Status::Error("cuMemGetAllocationGranularity: " + Describe(r));
  // The pools' regions first, whole and each on its own (idle ones too), as
  // the pools' books had them (session_pools.cc).
  if (Status st = RestorePoolRegions(pools, gran); !st.ok()) return st;
  // Regions: the allocations' granules, merged where they touch (the driver
  // packs small allocations into one granule).
  std::vector<std::pair<uint64_t, uint64_t>> regions;  // [lo, hi), sorted
  for (const auto& x : *allocs) {
    if (InMappedRegion(x.base)) continue;  // in a pool's region
    if (x.size == 0 || x.base + x.size < x.base ||
        (!regions.empty() && x.base < regions.back().first))
      return Status::Error("a damaged snapshot (allocations out of order)");
    uint64_t lo = x.base / gran * gran, hi = (x.base + x.size + gran - 1) / gran * gran;
    if (!regions.empty() && lo <= regions.back().second) {
      regions.back().second = std::max(regions.back().second, hi);
    } else {
      regions.emplace_back(lo, hi);
    }
  }
  uint64_t charged = 0;
  for (const auto& x : *allocs) charged += x.charged;
  if (!ChargeMemory(charged))
    return Status::Error("the tenant's memory quota here cannot take " + std::to_string(charged) +
                         " bytes");
  for (const auto& x : *allocs) {
    Adopt(HandleKind::kMemory, x.base);
    if (x.charged != 0) NoteAllocation(HandleKind::kMemory, x.base, x.charged);
  }
  for (auto& [lo, hi] : regions) {
    bool handled = false;  // movable memory: into its reservation (session_movable.cc)
    Status st = RestoreMovableRegion(lo, hi - lo, gran, &handled);
    if (!st.ok()) return st;
    if (handled) continue;
    CUdeviceptr got = 0;
    r = a.cuMemAddressReserve(&got, hi - lo, gran, lo, 0);
    if (r != CUDA_SUCCESS) return Status::Error("cuMemAddressReserve: " + Describe(r));
    if (got != lo) {
      a.cuMemAddressFree(got, hi - lo);
      char where[64];
      std::snprintf(where, sizeof(where), "0x%llx+0x%llx", static_cast<unsigned long long>(lo),
                    static_cast<unsigned long long>(hi - lo));
      return Status::Error(std::string("the device addresses ") + where +
                           " are taken here (host mappings: " + HostMappingsOver(lo, hi) +
                           "; a session keeps its addresses movable when its server runs with "
                           "--movable-memory)");
    }
    r = MapNewRegion(lo, hi - lo, primary_device_, /*own_reservation=*/true);
    if (r != CUDA_SUCCESS) return Status::Error("mapping device memory: " + Describe(r));
  }
  for (const auto& x : *allocs) {
    auto reg = std::prev(mapped_regions_.upper_bound(x.base));
    reg->second.live++;
    mapped_allocs_[x.base] = MappedPlace{reg->first, x.size};
    RestorePoolAllocation(x.base, x.size);  // counted in its pool, if it has one
  }
  // The pools' idle regions count against the quota here as they did there.
  std::vector<uint64_t> idle;
  for (const auto& [base, reg] : mapped_regions_)
    if (reg.pool != 0 && reg.live == 0) idle.push_back(base);
  for (uint64_t base : idle) ChargeIdleRegion(base);
  return Status::Ok();
}

Status Session::RestoreMemoryContents(SnapshotReader& in,
                                      const std::vector<RestoredAlloc>& allocs) {
  DriverApi& a = state_->api;
  Bounce bounce(a);
  if (bounce.p == nullptr) return Status::Error("no pinned memory for the copy");
  for (const auto& x : allocs) {
    for (uint64_t off = 0; off < x.size; off += kCopyChunk) {
      size_t len = static_cast<size_t>(std::min<uint64_t>(kCopyChunk, x.size - off));
      if (!in.Bytes(bounce.p, len)) return in.status();
      CUresult r = a.cuMemcpyHtoD_v2(x.base + off, bounce.p, len);
      if (r != CUDA_SUCCESS) return Status::Error("writing device memory: " + Describe(r));
    }
  }
  return Status::Ok();
}

Status Session::RestoreStreams(const std::vector<RestoredStream>& streams, uint64_t images_loaded,
                               size_t* next) {
  DriverApi& a = state_->api;
  for (; *next < streams.size() && streams[*next].after_images <= images_loaded; ++*next) {
    const RestoredStream& rs = streams[*next];
    CUstream s = nullptr;
    CUresult r = a.cuStreamCreateWithPriority(&s, rs.flags, rs.priority);
    if (r != CUDA_SUCCESS) return Status::Error("cuStreamCreateWithPriority: " + Describe(r));
    stream_map_[rs.client] = s;
    Adopt(HandleKind::kStream, rs.client);
  }
  return Status::Ok();
}

Status Session::RestoreCode(SnapshotReader& in, const std::vector<RestoredStream>& streams,
                            size_t* next_stream) {
  DriverApi& a = state_->api;
  uint64_t n = 0;
  if (!in.Count(&n)) return in.status();
  // Image handle (client) -> name -> the new driver handle.
  std::map<uint64_t, std::map<std::string, uint64_t>> by_name;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t client = 0, h0 = 0, h1 = 0, size = 0;
    uint8_t library = 0;
    if (!in.Get(&client) || !in.Get(&library) || !in.Get(&h0) || !in.Get(&h1) || !in.Get(&size))
      return in.status();
    if (size > wire::kMaxPayload) return Status::Error("an image of " + std::to_string(size));
    std::vector<uint8_t> bytes(size);
    if (!in.Bytes(bytes.data(), size)) return in.status();
    if (Status st = RestoreStreams(streams, i, next_stream); !st.ok()) return st;
    std::shared_ptr<const ImageBytes> image =
        state_->link != nullptr ? state_->link->PutImage(h0, h1, bytes.data(), size)
                                : ImageBytes::Copy(bytes.data(), size);
    uint64_t real = 0;
    CUresult r = LoadCode(*image, library != 0, &real);
    if (r != CUDA_SUCCESS) return Status::Error("loading code here: " + Describe(r));
    const HandleKind kind = library ? HandleKind::kLibrary : HandleKind::kModule;
    xlate_[K(kind)][client] = real;
    rev_[K(kind)][real] = client;
    Adopt(kind, client);
    images_[client] = ImageRecord{image, h0, h1, library != 0, ++image_seq_};
    auto& names = by_name[client];
    for (const auto& [handle, name] : CodeOf(real, library != 0))
      if (!name.empty()) names[name] = handle;
  }
  if (Status st = RestoreStreams(streams, n, next_stream); !st.ok()) return st;  // the rest
  if (!in.Count(&n)) return in.status();
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t client = 0, image = 0, from_kernel = 0, nattrs = 0;
    uint8_t kernel = 0;
    std::string name;
    if (!in.Get(&client) || !in.Get(&kernel) || !in.Get(&image) || !in.String(&name) ||
        !in.Get(&from_kernel) || !in.Count(&nattrs))
      return in.status();
    std::vector<std::pair<int32_t, int32_t>> attrs(nattrs);
    for (auto& [attr, v] : attrs)
      if (!in.Get(&attr) || !in.Get(&v)) return in.status();
    uint64_t real = 0;
    if (from_kernel != 0) {
      CUfunction f = nullptr;
      CUresult r = a.cuKernelGetFunction(
          &f, reinterpret_cast<CUkernel>(RealHandle(HandleKind::kKernel, from_kernel)));
      if (r != CUDA_SUCCESS) return Status::Error("cuKernelGetFunction: " + Describe(r));
      real = reinterpret_cast<uintptr_t>(f);
    } else {
      auto img = by_name.find(image);
      auto it = img != by_name.end() ? img->second.find(name) : decltype(img->second.end()){};
      if (img == by_name.end() || it == img->second.end())
        return Status::Error("the kernel " + name + " is not in its code here");
      real = it->second;
    }
    const HandleKind kind = kernel ? HandleKind::kKernel : HandleKind::kFunction;
    xlate_[K(kind)][client] = real;
    rev_[K(kind)][real] = client;
    Adopt(kind, client);
    code_names_[client] = CodeName{image, name, kernel != 0, from_kernel};
    for (auto& [attr, v] : attrs) {
      int now = 0;
      auto at = static_cast<CUfunction_attribute>(attr);
      CUresult r = kernel ? a.cuKernelGetAttribute(&now, at, reinterpret_cast<CUkernel>(real),
                                                   primary_device_)
                          : a.cuFuncGetAttribute(&now, at, reinterpret_cast<CUfunction>(real));
      if (r == CUDA_SUCCESS && now == v) continue;
      r = kernel ? a.cuKernelSetAttribute(at, v, reinterpret_cast<CUkernel>(real), primary_device_)
                 : a.cuFuncSetAttribute(reinterpret_cast<CUfunction>(real), at, v);
      if (r != CUDA_SUCCESS)
        return Status::Error("setting attribute " + std::to_string(attr) + " of " + name + ": " +
                             Describe(r));
    }
  }
  // Globals: the contents, at the address the client knows. Every one is checked before a
  // move is refused, so that the message says how many moved and by how much.
  if (!in.Count(&n)) return in.status();
  uint64_t misplaced = 0;
  std::string first_misplaced;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t ptr = 0, size = 0, image = 0;
    std::string name;
    if (!in.Get(&ptr) || !in.Get(&size) || !in.Get(&image) || !in.String(&name)) return in.status();
    auto img = images_.find(image);
    if (img == images_.end()) return Status::Error("the global " + name + " has no code");
    CUdeviceptr got = 0;
    size_t got_size = 0;
    const uint64_t real =
        RealHandle(img->second.library ? HandleKind::kLibrary : HandleKind::kModule, image);
    CUresult r =
        img->second.library
            ? a.cuLibraryGetGlobal(&got, &got_size, reinterpret_cast<CUlibrary>(real), name.c_str())
            : a.cuModuleGetGlobal_v2(&got, &got_size, reinterpret_cast<CUmodule>(real),
                                     name.c_str());
    if (r != CUDA_SUCCESS) return Status::Error("the global " + name + ": " + Describe(r));
    std::vector<uint8_t> bytes(size);
    if (size > (1ull << 30) || !in.Bytes(bytes.data(), size)) return in.status();
    if (got != ptr || got_size != size) {
      if (misplaced++ == 0) {
        char where[160];
        std::snprintf(where, sizeof(where),
                      " (at 0x%llx, %llu bytes, on the source; 0x%llx, %zu bytes, here)",
                      static_cast<unsigned long long>(ptr), static_cast<unsigned long long>(size),
                      static_cast<unsigned long long>(got), got_size);
        first_misplaced = name + where;
      }
      continue;
    }
    r = a.cuMemcpyHtoD_v2(ptr, bytes.data(), size);
    if (r != CUDA_SUCCESS) return Status::Error("writing the global " + name + ": " + Describe(r));
    globals_[ptr] = GlobalRecord{size, image, name};
  }
  if (misplaced != 0)
    return Status::Error(std::to_string(misplaced) + " of " + std::to_string(n) +
                         " globals the app looked up land at other addresses here, first " +
                         first_misplaced +
                         ": the driver placed this process's code differently; the app's "
                         "pointers to them would be wrong");
  return Status::Ok();
}

Status Session::Restore(SnapshotReader& in, uint64_t key[2]) {
  DriverApi& a = state_->api;
  uint64_t magic = 0;
  uint32_t version = 0, pid = 0, deferred = 0;
  int32_t device = -1, placed = -1;
  uint64_t primary = 0;
  if (!in.Get(&magic) || !in.Get(&version)) return in.status();
  if (magic != kSnapshotMagic) return Status::Error("not a Flyt session snapshot");
  if (version != kSnapshotVersion)
    return Status::Error("the snapshot is of format " + std::to_string(version) +
                         " and this server reads only format " + std::to_string(kSnapshotVersion) +
                         " (another Flyt version wrote it: restore it with that version)");
  if (!in.Get(&key[0]) || !in.Get(&key[1]) || !in.Get(&pid) || !in.Get(&device) ||
      !in.Get(&primary) || !in.Get(&deferred) || !in.Get(&placed))
    return in.status();
  // A client of several servers: its memory here stays in the slot its other servers
  // keep clear of (kOpPlaceMemory), whatever this server's --movable-memory.
  if (placed >= kMovableSlots || placed < -1)
    return Status::Error("a damaged snapshot (placed slot)");
  placed_slot_ = placed;
  client_pid_ = pid;
  deferred_ = static_cast<CUresult>(deferred);
  if (state_->slot != nullptr) state_->slot->client_pid = pid;
  uint64_t nlimits = 0;
  if (!in.Count(&nlimits)) return in.status();
  std::vector<std::pair<uint32_t, uint64_t>> limits(nlimits);
  for (auto& [l, v] : limits)
    if (!in.Get(&l) || !in.Get(&v)) return in.status();
  if (device < 0) {  // the client had not touched the GPU yet
    uint64_t rest = 0;
    for (int i = 0; i < kListsAfterLimits; ++i)
      if (!in.Count(&rest) || rest != 0)
        return in.status().ok() ? Status::Error("a snapshot with state but no context")
                                : in.status();
    if (!in.Get(&magic) || magic != kSnapshotMagic) return Status::Error("a damaged snapshot");
    return Status::Ok();
  }
  if (device >= static_cast<int32_t>(state_->devices.size()))
    return Status::Error("the session used GPU " + std::to_string(device) + ", this server has " +
                         std::to_string(state_->devices.size()));
  CUcontext ctx = nullptr;
  CUresult r = a.cuDevicePrimaryCtxRetain(&ctx, device);
  if (r != CUDA_SUCCESS) return Status::Error("cuDevicePrimaryCtxRetain: " + Describe(r));
  primary_device_ = device;
  retained_primary_ = true;
  primary_ = ctx;
  primary_client_ = primary;
  Adopt(HandleKind::kContext, primary_client_);
  EnterExec(device);
  r = a.cuCtxSetCurrent(exec_);
  if (r != CUDA_SUCCESS) return Status::Error("cuCtxSetCurrent: " + Describe(r));
  NoteCurrentContext(primary_client_);
  std::vector<RestoredStream> streams;
  uint64_t n = 0;
  if (!in.Count(&n)) return in.status();
  for (uint64_t i = 0; i < n; ++i) {
    RestoredStream s;
    if (!in.Get(&s.client) || !in.Get(&s.flags) || !in.Get(&s.priority) || !in.Get(&s.after_images))
      return in.status();
    streams.push_back(s);
  }
  size_t next_stream = 0;  // RestoreCode makes them between the loads they came between
  // Memory first: its addresses must be free, which gets less likely with
  // every other object made here (a larger stack limit reallocates the
  // context's local memory, code takes device memory). Its contents come last.
  RestoredPools pools;
  Status st = ReadPools(in, &pools);  // session_pools.cc
  if (!st.ok()) return st;
  std::vector<RestoredAlloc> allocs;
  st = RestoreMemoryLayout(in, &allocs, pools);
  if (!st.ok()) return st;
  st = RestoreVmmLayout(in);  // the app's own VMM (session_vmm_move.cc)
  if (!st.ok()) return st;
  st = RestorePools(pools);  // the driver's pools behind the client's handles
  if (!st.ok()) return st;
  for (auto& [l, v] : limits) {
    size_t now = 0;
    if (a.cuCtxGetLimit(&now, static_cast<CUlimit>(l)) == CUDA_SUCCESS && now == v) continue;
    r = a.cuCtxSetLimit(static_cast<CUlimit>(l), v);
    if (r != CUDA_SUCCESS)
      return Status::Error("cuCtxSetLimit(" + std::to_string(l) + "): " + Describe(r));
  }
  st = RestoreCode(in, streams, &next_stream);  // makes the streams between the same loads
  if (!st.ok()) return st;
  if (!in.Count(&n)) return in.status();
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t client = 0;
    uint32_t flags = 0;
    if (!in.Get(&client) || !in.Get(&flags)) return in.status();
    CUevent e = nullptr;
    r = a.cuEventCreate(&e, flags);
    if (r != CUDA_SUCCESS) return Status::Error("cuEventCreate: " + Describe(r));
    // Recorded, so that queries and waits see a completed event, as they did
    // after the drain on the old server.
    a.cuEventRecord(e, nullptr);
    xlate_[K(HandleKind::kEvent)][client] = reinterpret_cast<uintptr_t>(e);
    rev_[K(HandleKind::kEvent)][reinterpret_cast<uintptr_t>(e)] = client;
    Adopt(HandleKind::kEvent, client);
    event_flags_[client] = flags;
    NoteEventRecorded(client);  // in the source's order: the next move keeps it
  }
  st = RestoreGraphs(in);  // after the code and events its nodes name
  if (!st.ok()) return st;
  st = RestoreTextures(in);  // over the memory mapped above (contents come later)
  if (!st.ok()) return st;
  st = RestoreMemoryContents(in, allocs);
  if (!st.ok()) return st;
  {
    Bounce bounce(a);
    if (bounce.p == nullptr) return Status::Error("no pinned memory for the copy");
    st = RestoreVmmContents(in, bounce.p);
    if (!st.ok()) return st;
  }
  if (!in.Get(&magic) || magic != kSnapshotMagic)
    return in.status().ok() ? Status::Error("a damaged snapshot (no trailer)") : in.status();
  r = a.cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return Status::Error("cuCtxSynchronize: " + Describe(r));
  return Status::Ok();
}

// --- texture objects ------------------------------------------------------------

void Session::WriteTextures(SnapshotWriter& out) {
  out.Put<uint64_t>(textures_.size());
  for (const auto& [value, t] : textures_) {  // by value
    out.Put(value);
    out.Put(t.res);
    out.Put(t.tex);
    out.Put<uint8_t>(t.has_view ? 1 : 0);
    out.Put(t.view);
  }
}

// The driver hands out texture object values from a free list, 1, 2, 3, ...
// in a fresh process (bench/results/2026-11-26-h200-texture-object-values.md),
// and this worker made none before. So every value up to the largest live one
// is made in order: a live one from its own descriptors, a hole from the first
// live one's (a stand-in, destroyed once all are made). Any value that comes
// out otherwise fails the restore, and the session stays on its source.
Status Session::RestoreTextures(SnapshotReader& in) {
  DriverApi& a = state_->api;
  uint64_t n = 0;
  if (!in.Count(&n)) return in.status();
  std::map<uint64_t, TextureRecord> live;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t value = 0;
    TextureRecord t;
    uint8_t has_view = 0;
    if (!in.Get(&value) || !in.Get(&t.res) || !in.Get(&t.tex) || !in.Get(&has_view) ||
        !in.Get(&t.view))
      return in.status();
    t.has_view = has_view != 0;
    if (value == 0 || value > kMaxTextureValue || !live.emplace(value, t).second)
      return Status::Error("a damaged snapshot (texture object value " + std::to_string(value) +
                           ")");
  }
  if (live.empty()) return Status::Ok();
  const TextureRecord& stand_in = live.begin()->second;
  const uint64_t top = live.rbegin()->first;
  std::vector<CUtexObject> made;  // made[v - 1] has value v
  auto undo = [&] {
    for (CUtexObject o : made) a.cuTexObjectDestroy(o);
  };
  for (uint64_t v = 1; v <= top; ++v) {
    auto it = live.find(v);
    const TextureRecord& t = it != live.end() ? it->second : stand_in;
    CUtexObject got = 0;
    CUresult r = a.cuTexObjectCreate(&got, &t.res, &t.tex, t.has_view ? &t.view : nullptr);
    if (r != CUDA_SUCCESS) {
      undo();
      const char* what = it != live.end() ? "" : " (a stand-in for a value the source had free)";
      return Status::Error("making texture object " + std::to_string(v) + " again" + what + ": " +
                           Describe(r));
    }
    made.push_back(got);
    if (got != v) {
      undo();
      return Status::Error("texture object " + std::to_string(v) + " came out as " +
                           std::to_string(got) +
                           " here (this driver hands out texture object values in another "
                           "order; the app's kernels take the values as arguments)");
    }
  }
  for (uint64_t v = 1; v <= top; ++v) {
    if (live.count(v) != 0) continue;
    CUresult r = a.cuTexObjectDestroy(made[v - 1]);
    if (r != CUDA_SUCCESS)
      return Status::Error("destroying stand-in texture object " + std::to_string(v) + ": " +
                           Describe(r));
  }
  textures_ = std::move(live);
  return Status::Ok();
}

void Session::Resume(std::unique_ptr<transport::Connection> conn) {
  conn_ = std::move(conn);
  peer_ = conn_->Peer();
}

}  // namespace flyt::server
