// GPUs of several servers as one ordinal list (FLYT_SERVER "A,B,...",
// docs/architecture.md §8.4).
//
// Owns: the links to servers 1.. (each a Client of its own: connection, queue,
// callback channel, deferred errors), the merged device list (server 0's GPUs
// first, each later server's with a PCI domain of its own), where a call goes
// (its handles' tags, its device ordinals and pointers, else the current
// context's server), the answers of calls whose arguments name two servers
// (peer capability refused as between GPUs without P2P, copies server to
// server, a stream waiting for another server's event), and kernels of a
// library loaded again on another server when launched there.
// Must not touch: a single server's path (Client::Call, Post and Forward stay
// as they were; every branch here is behind Client::multi()).
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/managed_memory.h"
#include "common/log.h"

namespace flyt::client {

namespace {

// Movable-memory slots the servers of one client place their cuMemAlloc memory
// in (kOpPlaceMemory): server k uses slot kFirstPlacedSlot + k, so the servers'
// addresses never meet (slots are 1 TiB apart; server/session_movable.cc).
constexpr uint32_t kFirstPlacedSlot = 1;
// Server k's GPUs get PCI domain (their own + k * kDomainStep): two servers that
// share one physical GPU still show two distinct bus ids (NCCL keys GPUs by them).
constexpr int kDomainStep = 0x1000;

// Set while a GraphRoute lives: the thread's graph ops were translated for their server.
thread_local bool t_graph_routed = false;

std::mutex& RefusedMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

}  // namespace

CUresult RefuseAcrossServers(const char* name) {
  static auto* seen = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(RefusedMutex());
  if (seen->insert(name).second)
    FLYT_WARN(
        "%s: its arguments belong to GPUs of two servers, which Flyt does not serve for this "
        "call yet (CUDA_ERROR_NOT_SUPPORTED)",
        name);
  return CUDA_ERROR_NOT_SUPPORTED;
}

int Client::RouteCall(const char* name, uint16_t op, const wire::Writer& req) {
  int k = RouteNow();
  switch (op) {
    // Host memory shared with, registered with or mapped by a server, NVML and
    // the profiler: server 0's (the fast copy paths take them only for server 0's
    // memory). Managed memory's pages go on each server's paging channel, never here.
    case ops::kOpHostShare:
    case ops::kOpHostUnshare:
    case ops::kOpHostMap:
    case ops::kOpCopyShared:
    case ops::kOpCopyRma:
    case ops::kOpRmaAttach:
    case ops::kOpRmaRegister:
    case ops::kOpRmaUnregister:
    case ops::kOpCopyFromDeviceStaged:
    case ops::kOpNvmlSnapshot:
    case ops::kOpProfiler:
    case ops::kOpManagedFetch:
    case ops::kOpManagedPush:
    case ops::kOpManagedShare:
      return 0;
    default:
      break;
  }
  if (k == 0) return 0;
  if (k >= server_count()) return -static_cast<int>(CUDA_ERROR_INVALID_HANDLE);
  bool served = false;
  switch (op) {
    // Hand-written calls whose handles and pointers are translated for server k.
    case ops::kOpPrimaryCtxRetain:
    case ops::kOpPrimaryCtxReset:
    case ops::kOpCtxCreate:
    case ops::kOpCtxDestroy:
    case ops::kOpDeviceInfo:
    case ops::kOpLoadImage:
    case ops::kOpKernelGetFunction:
    case ops::kOpFuncParamLayout:
    case ops::kOpLaunch:
    case ops::kOpCopyToDevice:
    case ops::kOpCopyFromDevice:
    case ops::kOpCopy3D:
    case ops::kOpHostFunc:
    case ops::kOpMovePoll:
    case ops::kOpPlaceMemory:
    case ops::kOpPeerListen:
    case ops::kOpPeerReceive:
    case ops::kOpPeerSend:
    case ops::kOpPeerDone:
    case ops::kOpMemPoolAttribute:
    case ops::kOpMaxActiveClusters:
    case ops::kOpNccl:        // communicators of this server's GPUs (src/nccl/)
    case ops::kOpLinkCreate:  // the JIT linker: a state stays on its server (api_link.cc)
    case ops::kOpLinkAddData:
    case ops::kOpLinkComplete:
    case ops::kOpLinkDestroy:
    case ops::kOpTensorMap:            // the server of the tensor's memory (api_tensor_map.cc)
    case ops::kOpStreamCaptureInfo:    // the capturing stream's server (api_capture.cc)
    case ops::kOpCaptureDependencies:  // ... with nodes (and a graph) of that server
    case ops::kOpMemSetAccess:         // the server of the reservation (api_vmm.cc)
    case ops::kOpMemRetainAllocationHandle:
    case ops::kOpMemExportShareable:  // the allocation handle's server
    case ops::kOpMemImportShareable:  // the server the exporter named
    case ops::kOpStreamBatchMemOp:    // the stream's server (api_stream_memops.cc)
    case ops::kOpIpcGetMemHandle:     // the memory's or event's server; opened by the
    case ops::kOpIpcGetEventHandle:   // current device's (api_ipc.cc)
    case ops::kOpIpcOpenMemHandle:
    case ops::kOpIpcCloseMemHandle:
    case ops::kOpIpcOpenEventHandle:
    case ops::kOpMemRangeAttribute:  // the managed memory's server (api_managed.cc)
      served = true;
      break;
    case ops::kOpDriverMisc:  // the current context's flags, a function's cluster size,
                              // legacy stream memory operations (the stream's server)
      served = req.size() > 0 && (req.data()[0] == ops::kDriverMiscCtxGetFlags ||
                                  req.data()[0] == ops::kDriverMiscMaxPotentialClusterSize ||
                                  req.data()[0] == ops::kDriverMiscStreamMemOpV1);
      break;
    case ops::kOpGraphGetNodes:  // hand-built graphs: their handles sent for this server
    case ops::kOpGraphKernelNode:
    case ops::kOpGraphMemsetNode:
    case ops::kOpGraphHostNode:
    case ops::kOpGraphNode:
    case ops::kOpGraphNodeQuery:
    case ops::kOpGraphMisc:
    case ops::kOpGraphTopology:
      served = t_graph_routed;
      break;
    default:  // generic calls: their handles, ordinals and pointers translated (Forward)
      served = op >= 100 && op < 300;
      break;
  }
  if (served) return k;
  static auto* seen = new std::set<std::string>();
  {
    std::lock_guard<std::mutex> lock(RefusedMutex());
    if (seen->insert(name).second)
      FLYT_WARN(
          "%s: not served yet for a GPU of the second or a later server of FLYT_SERVER "
          "(CUDA_ERROR_NOT_SUPPORTED)",
          name);
  }
  return -static_cast<int>(CUDA_ERROR_NOT_SUPPORTED);
}

int GraphServer(std::initializer_list<uint64_t> handles, const CUgraphNode* deps, size_t ndeps) {
  if (!Client::Get().multi()) return -1;
  ArgRoute route;
  for (uint64_t h : handles)
    if (h != 0) RouteArg(&route, Client::TagOf(h));
  for (size_t i = 0; deps != nullptr && i < ndeps; ++i)
    if (deps[i] != nullptr) RouteArg(&route, Client::TagOf(reinterpret_cast<uintptr_t>(deps[i])));
  return route.server;
}

GraphRoute::GraphRoute(int server) : route_(server), saved_(t_graph_routed), set_(server >= 0) {
  if (set_) t_graph_routed = true;
}
GraphRoute::~GraphRoute() {
  if (set_) t_graph_routed = saved_;
}

void RouteArg(ArgRoute* route, int server) {
  if (route->server == -2 || server < 0) return;
  if (route->server == -1 || route->server == server) {
    route->server = server;
  } else {
    route->other = server;
    route->server = -2;
  }
}

void DistinctUuid(uint8_t uuid[16], int server, const std::vector<const uint8_t*>& earlier) {
  auto taken = [&] {
    for (const uint8_t* e : earlier)
      if (std::memcmp(e, uuid, 16) == 0) return true;
    return false;
  };
  for (int round = 0; round < 256 && taken(); ++round)
    uuid[15] ^= static_cast<uint8_t>(0x40 + server + round);
}

int Client::GlobalDevice(int server, int local) const {
  for (size_t i = 0; i < dev_server_.size(); ++i)
    if (dev_server_[i] == server && dev_local_[i] == local) return static_cast<int>(i);
  return server == 0 && dev_server_.empty() ? local : -1;
}

int Client::ServerOfPointer(uint64_t p) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = device_ranges_.upper_bound(p);
  if (it != device_ranges_.begin()) {
    --it;
    const uint64_t b = it->first, s = it->second.first;
    if (p - b < s || (s == 0 && p == b)) {
      auto owner = range_owner_.find(b);
      return owner == range_owner_.end() ? -1 : DeviceServer(owner->second.second);
    }
  }
  // An address reserved with cuMemAddressReserve (api_vmm.cc): the reserving server's.
  auto r = vmm_reserved_.upper_bound(p);
  if (r == vmm_reserved_.begin()) return -1;
  --r;
  return p - r->first < r->second.size ? r->second.server : -1;
}

bool Client::OverlapsDeviceRange(uint64_t p, uint64_t n) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto overlaps = [&](const auto& ranges, auto size_of) {
    auto it = ranges.lower_bound(p + n);  // the first range starting at or after the end
    if (it == ranges.begin()) return false;
    --it;
    return it->first + std::max<uint64_t>(size_of(it->second), 1) > p;
  };
  return overlaps(device_ranges_, [](const auto& v) { return v.first; }) ||
         overlaps(vmm_reserved_, [](const auto& v) { return v.size; });
}

void Client::NoteServerMadeCurrent(uint64_t raw) {
  std::lock_guard<std::mutex> lock(mu_);
  sent_ctx_ = reinterpret_cast<CUcontext>(raw);
  if (fallback_ctx_ == nullptr) fallback_ctx_ = sent_ctx_;
}

CUresult Client::OpenPeers(const std::vector<std::string>& list) {
  std::vector<Client*> peers;
  for (size_t k = 1; k < list.size(); ++k) {
    auto* p = new Client();  // never destroyed, as the process's first link
    p->index_ = static_cast<int>(k);
    p->member_ = true;
    p->server_ = list[k];
    p->token_ = token_;
    p->count_calls_ = count_calls_;
    p->reply_spin_us_ = reply_spin_us_;
    p->flush_after_ns_ = flush_after_ns_;
    p->rma_enabled_ = rma_enabled_;
    p->rma_min_bytes_ = rma_min_bytes_;
    p->init_done_ = true;
    p->init_rc_ = CUDA_SUCCESS;
    CUresult rc = p->Open();
    if (rc != CUDA_SUCCESS) return rc;  // the process has no CUDA: the links stay unused
    peers.push_back(p);
  }
  member_ = true;
  several_ = true;
  dev_server_.assign(devices_.size(), 0);
  dev_local_.clear();
  for (size_t i = 0; i < devices_.size(); ++i) dev_local_.push_back(static_cast<int>(i));
  for (size_t k = 0; k < peers.size(); ++k) {
    const int server = static_cast<int>(k) + 1;
    for (size_t i = 0; i < peers[k]->devices_.size(); ++i) {
      ops::DeviceInfo d = peers[k]->devices_[i];
      d.attributes[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID] += kDomainStep * server;
      devices_.push_back(d);
      dev_server_.push_back(server);
      dev_local_.push_back(static_cast<int>(i));
    }
    if (peers[k]->driver_version_ < driver_version_) driver_version_ = peers[k]->driver_version_;
  }
  if (devices_.size() > kMaxDevices) return Fail("FLYT_SERVER: more than 64 GPUs in all");
  for (size_t g = 1; g < devices_.size(); ++g) {  // two servers on one GPU: distinct UUIDs
    std::vector<const uint8_t*> earlier;
    for (size_t e = 0; e < g; ++e) earlier.push_back(devices_[e].uuid);
    DistinctUuid(devices_[g].uuid, dev_server_[g], earlier);
  }
  primaries_.resize(devices_.size());
  peers_ = std::move(peers);
  // Disjoint device addresses: each server places its memory in a slot of its own.
  for (int k = 0; k < server_count(); ++k) {
    Client& link = Link(k);
    if ((link.server_features_.load() & ops::kServerFeaturePeers) == 0) {
      FLYT_WARN(
          "flyt-server at %s is older than this library: its device addresses may meet another "
          "server's (an allocation that does is refused), and copies to and from it between "
          "servers are refused",
          link.server_.c_str());
      continue;
    }
    wire::Writer w;
    w.Put<uint32_t>(kFirstPlacedSlot + static_cast<uint32_t>(k));
    RouteScope route(k);
    CUresult rc = Call("placement", ops::kOpPlaceMemory, w, ReplySink{});
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("flyt-server at %s did not place this process's memory apart (error %d)",
                link.server_.c_str(), rc);
  }
  FLYT_INFO("%d servers, %zu GPU(s) in all: ordinals follow the order of FLYT_SERVER",
            server_count(), devices_.size());
  return CUDA_SUCCESS;
}

bool Client::CollidesAcrossServers(uint64_t base, uint64_t size, int server) {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto it = device_ranges_.lower_bound(base);
  auto clash = [&](std::map<uint64_t, std::pair<uint64_t, bool>>::iterator r) {
    if (r == device_ranges_.end() || r->first == base) return false;
    const uint64_t b = r->first, s = r->second.first;
    if (!(b < base + size && base < b + s)) return false;
    auto owner = range_owner_.find(b);
    return owner != range_owner_.end() && DeviceServer(owner->second.second) != server;
  };
  if (clash(it)) return true;
  return it != device_ranges_.begin() && clash(std::prev(it));
}

CUresult Client::CopyAcrossServers(const char* name, uint64_t dst, int dst_server, uint64_t src,
                                   int src_server, size_t n, CUstream stream, bool async, bool pt) {
  (void)pt;
  if (n == 0) return CUDA_SUCCESS;
  if (dst_server < 0 || src_server < 0 || dst_server >= server_count() ||
      src_server >= server_count())
    return CUDA_ERROR_INVALID_VALUE;
  if (!FindDeviceRange(dst, n) || !FindDeviceRange(src, n)) return CUDA_ERROR_INVALID_VALUE;
  Client& target = Link(dst_server);
  Client& source = Link(src_server);
  if ((target.server_features_.load() & ops::kServerFeaturePeers) == 0 ||
      (source.server_features_.load() & ops::kServerFeaturePeers) == 0)
    return RefuseAcrossServers(name);
  // The servers' own connection is plain TCP: bytes of a process that reaches its
  // servers over tls:// do not travel between them in the clear.
  if (target.tls_link_ || source.tls_link_) {
    static std::once_flag said;
    std::call_once(said, [] {
      FLYT_WARN(
          "copies between servers reached over tls:// are refused (CUDA_ERROR_NOT_SUPPORTED): "
          "the servers' connection to each other is not encrypted yet");
    });
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const uint64_t raw_stream = reinterpret_cast<uintptr_t>(stream);
  const int stream_server = raw_stream > 2 ? TagOf(raw_stream) : -1;
  // One copy between servers at a time in this process: a target's session
  // waits for its sender, so two threads copying opposite ways at once would
  // each hold up the other's sender behind its own receive.
  static auto* across_mu = new std::mutex();
  std::lock_guard<std::mutex> one_at_a_time(*across_mu);
  // 1. The target opens a one-time listener.
  std::vector<uint8_t> reply;
  CUresult rc;
  {
    wire::Writer w;
    w.Put<uint64_t>(n);
    RouteScope route(dst_server);
    rc = Call(name, ops::kOpPeerListen, w, ReplySink{&reply});
  }
  if (rc != CUDA_SUCCESS) return rc;
  uint64_t id = 0, key0 = 0, key1 = 0;
  uint16_t port = 0;
  wire::Reader r(reply.data(), reply.size());
  if (!r.Get(&id) || !r.Get(&port) || !r.Get(&key0) || !r.Get(&key1)) return CUDA_ERROR_UNKNOWN;
  // 2. It takes the bytes behind its stream's earlier work (sent now: the
  // source may not wait for a target that has not been told).
  {
    wire::Writer w;
    w.Put<uint64_t>(id);
    w.Put<uint64_t>(dst);
    w.Put<uint64_t>(n);
    w.Put<uint64_t>(stream_server == dst_server ? Untag(raw_stream) : 0);
    RouteScope route(dst_server);
    rc = Post(name, ops::kOpPeerReceive, w);
    if (rc == CUDA_SUCCESS) rc = target.Flush();
  }
  if (rc != CUDA_SUCCESS) return rc;
  // 3. The source sends them straight there, behind its own earlier work.
  {
    wire::Writer w;
    w.PutString(target.dial_host_);
    w.Put<uint16_t>(port);
    w.Put<uint64_t>(key0);
    w.Put<uint64_t>(key1);
    w.Put<uint64_t>(src);
    w.Put<uint64_t>(n);
    w.Put<uint64_t>(stream_server == src_server ? Untag(raw_stream) : 0);
    RouteScope route(src_server);
    rc = Call(name, ops::kOpPeerSend, w, ReplySink{});
  }
  // 4. A synchronous copy (or a failed one) waits for the target's verdict; an
  // asynchronous one reports a failure there at its next synchronizing call.
  if (!async || rc != CUDA_SUCCESS) {
    wire::Writer w;
    w.Put<uint64_t>(id);
    RouteScope route(dst_server);
    CUresult done = Call(name, ops::kOpPeerDone, w, ReplySink{});
    if (rc == CUDA_SUCCESS) rc = done;
  }
  return rc;
}

CUresult Copy3DAcrossServers(const char* name, const CUDA_MEMCPY3D& d, int dst_server,
                             int src_server, CUstream stream, bool async, bool pt) {
  Client& c = Client::Get();
  if (c.AnyCapture()) return RefuseAcrossServers(name);  // not into a graph being captured
  const size_t w = d.WidthInBytes;
  // As the driver checks them: rows fit their pitch, slices their height.
  if (d.Height * d.Depth > 1 && (d.srcPitch < w || d.dstPitch < w)) return CUDA_ERROR_INVALID_VALUE;
  if (d.Depth > 1 && (d.srcHeight < d.Height || d.dstHeight < d.Height))
    return CUDA_ERROR_INVALID_VALUE;
  auto at = [&](bool src, size_t y, size_t z) {
    const uint64_t base = src ? d.srcDevice : d.dstDevice;
    const size_t x0 = src ? d.srcXInBytes : d.dstXInBytes, y0 = src ? d.srcY : d.dstY,
                 z0 = src ? d.srcZ : d.dstZ, pitch = src ? d.srcPitch : d.dstPitch,
                 height = src ? d.srcHeight : d.dstHeight;
    return base + ((z0 + z) * height + y0 + y) * pitch + x0;
  };
  // Rows packed on both sides (pitch == width) go as one copy per slice,
  // others row by row: each piece a copy server to server, in order.
  const bool packed = d.srcPitch == w && d.dstPitch == w;
  const size_t rows = packed ? d.Height : 1;
  for (size_t z = 0; z < d.Depth; ++z) {
    for (size_t y = 0; y < d.Height; y += rows) {
      CUresult rc = c.CopyAcrossServers(name, at(false, y, z), dst_server, at(true, y, z),
                                        src_server, w * rows, stream, async, pt);
      if (rc != CUDA_SUCCESS) return rc;
    }
  }
  return CUDA_SUCCESS;
}

// --- kernels of libraries on other servers

namespace {

struct LibraryImage {
  std::vector<uint8_t> bytes;  // the image, to load it on another server
  std::map<int, uint64_t> on;  // server -> the library's handle there
};

thread_local bool t_loading_copy = false;  // LibraryOnServer is loading a copy
// Why the calling thread's last LibraryOnServer gave no copy.
thread_local CUresult t_no_copy = CUDA_ERROR_INVALID_HANDLE;

std::mutex& KernelMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::map<uint64_t, LibraryImage>& Libraries() {  // by the handle the app holds
  static auto* m = new std::map<uint64_t, LibraryImage>();
  return *m;
}
std::map<std::pair<uint64_t, int>, uint64_t>& KernelsOn() {  // (kernel, server) -> handle
  static auto* m = new std::map<std::pair<uint64_t, int>, uint64_t>();
  return *m;
}

}  // namespace

void NoteLibraryImage(uint64_t library, const void* bytes, size_t n) {
  if (t_loading_copy) return;  // a copy on another server: the original keeps the bytes
  std::lock_guard<std::mutex> lock(KernelMutex());
  LibraryImage& img = Libraries()[library];
  img.bytes.assign(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + n);
  img.on[Client::TagOf(library)] = library;
}

void ForgetLibraryImage(uint64_t library) {
  std::lock_guard<std::mutex> lock(KernelMutex());
  Libraries().erase(library);
  for (auto it = KernelsOn().begin(); it != KernelsOn().end();) {
    auto info = Client::Get().Func(it->first.first);
    if (info != nullptr && info->image == library) {
      it = KernelsOn().erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t LibraryOnServer(uint64_t library, int server) {
  t_no_copy = CUDA_ERROR_INVALID_HANDLE;
  if (Client::TagOf(library) == server) return library;
  // Its __managed__ variables are one per process natively: a copy on another
  // server would have variables of its own that neither this process's host
  // code nor the first server's kernels see.
  if (managed::OwnsAny(library)) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
      FLYT_ERROR(
          "a library with __managed__ variables is used on a GPU of another server of "
          "FLYT_SERVER than the one it was loaded on: its variables would be two copies, so its "
          "kernels are not launched there (CUDA_ERROR_NOT_SUPPORTED). Keep such a program's "
          "kernels on the GPUs of one server");
    t_no_copy = CUDA_ERROR_NOT_SUPPORTED;
    return 0;
  }
  std::vector<uint8_t> bytes;
  {
    std::lock_guard<std::mutex> lock(KernelMutex());
    auto lib = Libraries().find(library);
    if (lib == Libraries().end()) return 0;
    auto on = lib->second.on.find(server);
    if (on != lib->second.on.end()) return on->second;
    bytes = lib->second.bytes;
  }
  // The library's first use there: load it there (its kernels become known).
  uint64_t there = 0;
  {
    Client::RouteScope route(server);
    t_loading_copy = true;
    const CUresult rc = LoadImageOn(bytes.data(), true, &there);
    t_loading_copy = false;
    if (rc != CUDA_SUCCESS) return 0;
  }
  std::lock_guard<std::mutex> lock(KernelMutex());
  auto lib = Libraries().find(library);
  if (lib == Libraries().end()) return there;
  auto [it, fresh] = lib->second.on.emplace(server, there);
  return it->second;  // another thread's load, if it came first (this one stays loaded)
}

uint64_t KernelOnServer(uint64_t kernel, int server) {
  t_no_copy = CUDA_ERROR_INVALID_HANDLE;
  Client& c = Client::Get();
  if (Client::TagOf(kernel) == server) return kernel;
  auto info = c.Func(kernel);
  if (info == nullptr || !info->is_kernel) return 0;
  {
    std::lock_guard<std::mutex> lock(KernelMutex());
    auto k = KernelsOn().find({kernel, server});
    if (k != KernelsOn().end()) return k->second;
  }
  const uint64_t there = LibraryOnServer(info->image, server);
  if (there == 0) return 0;
  const uint64_t found = c.FindInImage(there, info->name);
  if (found != 0) {
    c.LinkKernelHandles(kernel, found);
    std::lock_guard<std::mutex> lock(KernelMutex());
    KernelsOn()[{kernel, server}] = found;
  }
  return found;
}

uint64_t FunctionOnServer(uint64_t f, int server) {
  t_no_copy = CUDA_ERROR_INVALID_HANDLE;
  if (Client::TagOf(f) == server) return f;
  auto info = Client::Get().Func(f);
  return info != nullptr && info->is_kernel ? KernelOnServer(f, server) : 0;
}

CUresult NoCopyError() { return t_no_copy; }

CUfunction FunctionHere(CUfunction f) {
  Client& c = Client::Get();
  const uint64_t raw = reinterpret_cast<uintptr_t>(f);
  if (!c.multi() || raw == 0) return f;
  const uint64_t here = FunctionOnServer(raw, c.RouteNow());
  return here != 0 ? reinterpret_cast<CUfunction>(here) : f;
}

// --- calls whose arguments name two servers

CUresult ForwardAcross(const char* name, uint16_t op, const ArgRoute& route, const uint64_t* values,
                       size_t n) {
  Client& c = Client::Get();
  auto out_int = [&](size_t i) { return reinterpret_cast<int*>(values[i]); };
  // Work between servers cannot go into a graph being captured.
  const bool across_work = op == 115 || op == 167 || op == 168 || op == 174 || op == 175;
  if (across_work && c.AnyCapture()) return RefuseAcrossServers(name);
  switch (op) {
    case 283:  // cuDeviceCanAccessPeer: as between two GPUs without P2P
    case 286:  // cuDeviceGetP2PAttribute: every attribute 0
      if (n < 1 || out_int(0) == nullptr) return CUDA_ERROR_INVALID_VALUE;
      *out_int(0) = 0;
      return CUDA_SUCCESS;
    case 284:  // cuCtxEnablePeerAccess
      return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    case 285:  // cuCtxDisablePeerAccess
      return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    case 115: {  // cuStreamWaitEvent: the host waits for the event, then the stream goes on
      if (n < 2) return CUDA_ERROR_INVALID_VALUE;
      return Forward<134, true, false>("cuEventSynchronize", reinterpret_cast<CUevent>(values[1]));
    }
    case 167:  // cuMemcpyDtoD_v2 (dst, src, n)
    case 168:  // cuMemcpyDtoDAsync_v2 (dst, src, n, stream)
      if (n < 3) return CUDA_ERROR_INVALID_VALUE;
      return c.CopyAcrossServers(
          name, values[0], c.ServerOfPointer(values[0]), values[1], c.ServerOfPointer(values[1]),
          values[2], op == 168 && n >= 4 ? reinterpret_cast<CUstream>(values[3]) : nullptr,
          op == 168, false);
    case 174:  // cuMemcpyPeer (dst, dstCtx, src, srcCtx, n)
    case 175:  // cuMemcpyPeerAsync (..., stream)
      if (n < 5) return CUDA_ERROR_INVALID_VALUE;
      return c.CopyAcrossServers(
          name, values[0], Client::TagOf(values[1]), values[2], Client::TagOf(values[3]), values[4],
          op == 175 && n >= 6 ? reinterpret_cast<CUstream>(values[5]) : nullptr, op == 175, false);
    case 193: {  // cuKernelGetAttribute (value, attrib, kernel, dev): the kernel there
      if (n < 4) return CUDA_ERROR_INVALID_VALUE;
      const int dev = static_cast<int>(values[3]);
      const uint64_t k = KernelOnServer(values[2], c.DeviceServer(dev));
      if (k == 0) return CUDA_ERROR_INVALID_HANDLE;
      return Forward<193, true, false>(name, out_int(0),
                                       static_cast<CUfunction_attribute>(values[1]),
                                       reinterpret_cast<CUkernel>(k), static_cast<CUdevice>(dev));
    }
    case 194: {  // cuKernelSetAttribute (attrib, value, kernel, dev)
      if (n < 4) return CUDA_ERROR_INVALID_VALUE;
      const int dev = static_cast<int>(values[3]);
      const uint64_t k = KernelOnServer(values[2], c.DeviceServer(dev));
      if (k == 0) return CUDA_ERROR_INVALID_HANDLE;
      return Forward<194, false, false>(name, static_cast<CUfunction_attribute>(values[0]),
                                        static_cast<int>(values[1]), reinterpret_cast<CUkernel>(k),
                                        static_cast<CUdevice>(dev));
    }
    case 195: {  // cuKernelSetCacheConfig (kernel, config, dev)
      if (n < 3) return CUDA_ERROR_INVALID_VALUE;
      const int dev = static_cast<int>(values[2]);
      const uint64_t k = KernelOnServer(values[0], c.DeviceServer(dev));
      if (k == 0) return CUDA_ERROR_INVALID_HANDLE;
      return Forward<195, false, false>(name, reinterpret_cast<CUkernel>(k),
                                        static_cast<CUfunc_cache>(values[1]),
                                        static_cast<CUdevice>(dev));
    }
    default:
      (void)route;
      return RefuseAcrossServers(name);
  }
}

}  // namespace flyt::client
