// One client process served by flyt-server.
//
// Owns: the session's handshake, its frame loop (calls executed in order),
// the handles it created (validated on every use, freed when the client exits
// or dies), its deferred error of asynchronous calls, its current context and
// the execution context the tenant's SM share gives it (a green context of its
// own, moved with its streams after a live change: session_share.cc), and the
// memory its allocations charge to the tenant's quota.
// A malformed frame ends this session only. Must not touch another session's
// state; shared state lives in ServerState (image cache, device inventory).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "protocol/codec.h"
#include "protocol/marshal.h"
#include "protocol/ops.h"
#include "protocol/wire.h"
#include "server/address_span.h"
#include "server/driver_api.h"
#include "server/image_cache.h"
#include "server/managed_pager.h"
#include "server/nccl_api.h"
#include "server/pool_ledger.h"
#include "server/share.h"
#include "server/worker_channel.h"
#include "transport/tls_server.h"
#include "transport/transport.h"

namespace flyt::server {

// Movable-memory slots a session reserves its memory in (session_movable.cc).
inline constexpr int kMovableSlots = 64;

class MainLink;
class SnapshotReader;
class SnapshotWriter;
struct WorkerSlot;
class TenantBoard;
class WorkerPool;

// One process's view of the server: the main process (acceptor, pool,
// control socket) and each worker have their own; what is the tenant's lives
// in the tenant board (server/tenant_board.h).
struct ServerState {
  DriverApi api;
  // The tenant's share (memory quota, SM count) and its live changes. Its
  // memory counters are the board's.
  Share share;
  // Read end of the pipe that replaced this process's stdout, where NVIDIA's
  // driver writes device printf output; -1 when not captured.
  int device_output_fd = -1;
  std::string token;
  int driver_version = 0;
  std::vector<ops::DeviceInfo> devices;
  TenantBoard* board = nullptr;
  // --- worker only
  WorkerSlot* slot = nullptr;  // this worker's slot in the board
  MainLink* link = nullptr;    // requests to the main process (code images)
  uint64_t share_seen = 0;     // the board's share generation this worker adopted
  // --- main process only
  WorkerPool* pool = nullptr;
  // The data-plane listeners' bound addresses (real ports).
  std::vector<std::string> listen;
  // Offered in the handshake: the shm:// listener (empty: none) and this
  // kernel's boot id, so that a client on the same host can move to it.
  std::string shm_offer;
  std::string boot_id;
  int64_t start_ns = 0;  // steady clock at the server's start
  // NCCL for the clients (server/session_nccl.cc): loaded at a session's first
  // NCCL call; the sim backend's own under --backend sim.
  bool sim_backend = false;
  NcclApi nccl;
  bool nccl_tried = false;
  std::string nccl_error;  // why NCCL could not be loaded ("": it was)
  // --movable-memory: cuMemAlloc memory at addresses another server can take
  // over (server/session_movable.cc).
  bool movable_memory = false;
  // How a worker dials a tls:// target when it moves a session there (--tls-peer-ca, and
  // --tls-cert/--tls-key as its client certificate).
  transport::TlsDialFiles migrate_tls;
};

// Builds the device inventory (the share is applied to it when sent).
Status DescribeDevices(ServerState* state);
// Monotonic clock in nanoseconds.
int64_t SteadyNowNs();
// Points this worker's stdout at a pipe so that device printf output can be
// forwarded to its client.
Status CaptureDeviceOutput(ServerState* state);

// A session's virtual memory (cuMemCreate / cuMemMap, session_vmm.cc). Handle
// values are the client's (a restored session's driver gives others: VmmReal).
struct VmmAccess {  // one cuMemSetAccess over part of a mapping, replayed by a restore
  uint64_t offset = 0, size = 0;
  std::vector<CUmemAccessDesc> descs;
};
struct VmmMapping {
  uint64_t size = 0;
  uint64_t handle = 0;
  uint64_t offset = 0;            // into the allocation
  std::vector<VmmAccess> access;  // in the order the app set it
};
struct VmmHandle {
  uint64_t charged = 0;      // bytes charged to the quota at cuMemCreate
  int device = 0;            // on this device (its location)
  uint32_t refs = 0;         // references the client holds (create, retain - release)
  uint32_t driver_refs = 0;  // references held on the driver's handle (a restore holds one)
  uint32_t mappings = 0;     // this session's mappings of it
  uint64_t size = 0;         // cuMemCreate's size (0: imported, not known)
  CUmemAllocationProp prop{};
  bool shared = false;  // exported to or imported from another process
};

class Session {
 public:
  // Host-side work captured into a graph (session_graphs.cc).
  struct CapturedWork {
    enum class Kind { kHostFunc, kDeliver, kFetch } kind;
    Session* session;
    uint64_t id = 0;           // client host function id
    uint64_t client_addr = 0;  // where the bytes live in the client
    void* mirror = nullptr;    // pinned server buffer of the copy
    size_t len = 0;
    bool owns_mirror = false;  // exactly one entry owns (and frees) each mirror
  };
  // `conn` passed the handshake in the main process (server/acceptor.h),
  // which gave the client `ticket`.
  Session(ServerState* state, std::unique_ptr<transport::Connection> conn,
          const channel::Ticket& ticket);
  ~Session();
  // Serves the client until it leaves, dies or misbehaves; then frees all it owned.
  void Run();
  // Frees all the session owns (Run's end; a restore that failed).
  void ReleaseEverything();
  // The client's second connection, for host functions (from the main process).
  void AttachCallbackChannel(std::unique_ptr<transport::Connection> conn);
  // The client's third connection, on which its pager moves managed pages.
  // Its copies run in the primary context, which the client made before its
  // first managed allocation (so before this channel).
  void AttachPagingChannel(std::unique_ptr<transport::Connection> conn) {
    pager_.Attach(std::move(conn), &state_->api, primary_);
  }
  // The session's managed ranges, which the pager may touch.
  ManagedPager& pager() { return pager_; }
  // After cuModuleGetGlobal / cuLibraryGetGlobal / cuLibraryGetManaged: when
  // the global is managed memory, the pager learns its block (owned by
  // `image`) and the reply says so (wire::kReplyManaged).
  void NoteGlobal(uint64_t ptr, uint64_t image);
  // Ends Run: the main process is gone.
  void Abort();

  // Handle bookkeeping used by the generic handlers.
  bool Owns(marshal::HandleKind kind, uint64_t value) const;
  void Adopt(marshal::HandleKind kind, uint64_t value);
  void Forget(marshal::HandleKind kind, uint64_t value);
  DriverApi& api() { return state_->api; }
  // A graph owned by a node (a conditional node's body, a child graph node's
  // graph): the client may use it but not destroy it (session_graph_nodes.cc).
  bool OwnedByNode(uint64_t graph) const { return subgraphs_.count(graph) != 0; }
  // The driver made a top-level graph at this address: an earlier node-owned graph
  // there (a child graph whose parent the session never learnt, since destroyed) is gone.
  void NewTopLevelGraph(uint64_t graph) { subgraphs_.erase(graph); }
  // Memory quota bookkeeping of the generic allocation handlers: charged
  // before the driver allocates, recorded per handle, refunded when freed.
  // The quota holds per GPU: `device` is where the memory is (-1: the device
  // of the session's current context, where the driver allocates).
  // Over the quota, the session's idle pool memory is given back first (as when the
  // GPU is full), then the charge is tried once more.
  bool ChargeMemory(uint64_t bytes, int device = -1);
  void RefundMemory(uint64_t bytes, int device);
  // The device of the context the session's thread has current.
  int CurrentDevice() const;
  void NoteAllocation(marshal::HandleKind kind, uint64_t handle, uint64_t bytes);
  // Virtual memory management (session_vmm.cc): the generic handlers of these
  // calls decode the arguments and call these instead of the driver. They
  // accept only the session's own ranges and handles (CUDA_ERROR_INVALID_VALUE
  // otherwise: the driver crashes on a bogus handle), charge cuMemCreate to
  // the quota, and keep what ReleaseVmm undoes at the session's end.
  CUresult VmmAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
  CUresult VmmAddressFree(CUdeviceptr ptr, size_t size);
  CUresult VmmCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags);
  CUresult VmmRelease(CUmemGenericAllocationHandle handle);
  CUresult VmmMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
  CUresult VmmUnmap(CUdeviceptr ptr, size_t size);
  CUresult VmmGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr);
  CUresult VmmGetProperties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle);
  // cuGraphKernelNodeSetAttribute: an attribute that names an event
  // (programmatic and launch completion events) must name one of the session's
  // (session_driver_misc.cc).
  CUresult KernelNodeSetAttribute(CUgraphNode node, CUkernelNodeAttrID attr,
                                  const CUkernelNodeAttrValue* value);
  // A module a library owns (cuLibraryGetModule, cuFuncGetModule of a
  // library's function): the app may not unload it (CUDA_ERROR_NOT_PERMITTED,
  // as natively); it goes with its library.
  bool LibraryOwnsModule(uint64_t module) const { return library_modules_.count(module) != 0; }
  // The stream that runs a client's stream handle now: after a live SM change
  // the session's streams move to new streams in the new context, under the
  // same client-visible handles. 0, 1 and 2 follow the current context.
  CUstream RealStream(uint64_t raw) const;
  // The context behind a client's context handle (its primary context stands
  // for the session's execution context, possibly a green context).
  CUcontext RealContext(uint64_t raw) const;
  // The context copy and memset nodes the session builds run in (the driver refuses none).
  CUcontext NodeContext() const { return exec_ != nullptr ? exec_ : primary_; }
  // Runs a client host function: asks the client over the callback channel and
  // waits for it to finish. Called on the driver's callback thread.
  void RunClientHostFunc(uint64_t id, bool persistent);
  // Graph-captured copies between the GPU and the client's memory: at each run
  // of the graph, the bytes go to / come from the client over the callback channel.
  void DeliverToClient(uint64_t client_dst, const void* bytes, size_t n);
  void FetchFromClient(uint64_t client_src, void* bytes, size_t n);

 private:
  // Adopts a live share change the main process published in the board.
  void FollowShare();
  // Keeps the board's slot in step with the session's captures.
  void NoteCaptures(int delta);
  // Executes one request. Returns false when the frame is malformed (the
  // session then ends); otherwise *rc is the call's result.
  bool Dispatch(const wire::FrameHeader& h, wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool DispatchGeneric(uint16_t op, bool per_thread, wire::Reader& in, wire::Writer& out,
                       CUresult* rc, bool* known);
  bool LoadImage(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool DecodeLaunchHead(wire::Reader& in, CUlaunchConfig* cfg, CUlaunchAttribute* attrs,
                        uint64_t* fn, CUresult* rc);
  bool Launch(wire::Reader& in, bool per_thread, CUresult* rc);
  bool MaxActiveClusters(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // kOpMemRangeAttribute: cuMemRangeGetAttribute (session_managed.cc).
  bool MemRangeAttribute(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // kOpNvmlSnapshot (session_nvml.cc).
  bool NvmlSnapshot(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // kOpProfiler (session_profiler.cc): CUPTI activity of this client's work.
  bool Profiler(wire::Reader& in, wire::Writer& out, CUresult* rc);
  void ProfilerStop(uint32_t kinds);
  void ProfilerBeginFrame(uint64_t call_id);
  void ProfilerEndFrame();
  // --- virtual memory management, hand-written calls (session_vmm.cc)
  bool VmmSetAccess(wire::Reader& in, CUresult* rc);
  bool VmmRetainHandle(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // Shareable handles between client processes of this server (POSIX file
  // descriptors, kept by the main process: MainLink::PutShareable).
  bool VmmExportShareable(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool VmmImportShareable(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // The mappings inside [ptr, ptr+size), a range of one reservation that
  // cuts no mapping in two; false when it is not such a range.
  bool VmmUnmappable(uint64_t ptr, uint64_t size, std::map<uint64_t, VmmMapping>::iterator* first,
                     std::map<uint64_t, VmmMapping>::iterator* last);
  // The mapping that holds `ptr`, or vmm_mapped_.end().
  std::map<uint64_t, VmmMapping>::iterator VmmMappingAt(uint64_t ptr);
  void VmmDropHandleIfUnused(uint64_t handle);
  // Forgets the mappings [first, last) (unmapped, or freed with their
  // reservation): each handle loses one mapping and goes when unused.
  void VmmForgetMappings(std::map<uint64_t, VmmMapping>::iterator first,
                         std::map<uint64_t, VmmMapping>::iterator last);
  bool VmmEmpty() const {
    return vmm_reserved_.empty() && vmm_mapped_.empty() && vmm_handles_.empty();
  }
  // Unmaps, releases and frees all the session's VMM state (ReleaseAll).
  void ReleaseVmm();
  // With --movable-memory (session_movable.cc): a reservation the app asked
  // for, carved out of the session's movable range so that another server can
  // reserve it again, or granted by the driver at the fixed address the app
  // asked for outside it; *handled false when it is left to the driver (bad
  // arguments, no movable range).
  CUresult VmmCarve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                    unsigned long long flags, bool* handled);
  // Allocation handles of a restored session: the driver's value behind the
  // client's, and the client's value for one the driver returned.
  uint64_t VmmReal(uint64_t client) const {
    if (vmm_real_.empty()) return client;
    auto it = vmm_real_.find(client);
    return it == vmm_real_.end() ? client : it->second;
  }
  uint64_t VmmClient(uint64_t real);
  void VmmForgetHandleValue(uint64_t client);
  // Moving the session (session_vmm_move.cc): why its VMM state cannot move
  // (empty: it can), and that state in a snapshot and back.
  std::string VmmUnmovable() const;
  // The layout goes first (its addresses are claimed before anything else),
  // the contents last; `bounce` is a pinned buffer of 8 MiB.
  Status WriteVmmLayout(SnapshotWriter& out);
  Status WriteVmmContents(SnapshotWriter& out, void* bounce);
  Status RestoreVmmLayout(SnapshotReader& in);
  Status RestoreVmmContents(SnapshotReader& in, void* bounce);
  // Copies one allocation's bytes through a mapping of it at `window` (reserved,
  // at least its size), to the snapshot (write) or from it.
  Status CopyVmmHandle(uint64_t real, uint64_t size, int device, uint64_t window, bool write,
                       SnapshotWriter* out, SnapshotReader* in, void* bounce);
  // --- graphs (session_graphs.cc)
  bool Capturing(CUstream stream);
  // kOpStreamCaptureInfo and kOpCaptureDependencies (protocol/ops.h).
  bool CaptureInfo(wire::Reader& in, bool per_thread, wire::Writer& out, CUresult* rc);
  bool CaptureDependencies(wire::Reader& in, bool per_thread, CUresult* rc);
  // After cuStreamEndCapture of client stream `stream` answered `rc`: the graph the app
  // learned of while it was captured is the app's now, or the driver freed it.
  void SettleCaptureGraph(uint64_t stream, CUresult rc);
  CUresult DotPrint(CUgraph graph, unsigned flags, wire::Writer& out);  // kGraphMiscDotPrint
  CUresult HostFunc(CUstream stream, uint64_t id, bool per_thread, bool* captured);
  CUresult CaptureDownload(CUstream stream, uint64_t src, uint64_t client_dst, size_t n);
  // Takes a pinned buffer holding the bytes (from NewMirror).
  CUresult CaptureUpload(CUstream stream, uint64_t dst, uint64_t client_src, void* mirror,
                         size_t n);
  void* NewMirror(size_t n);
  bool GraphGetNodes(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool GraphKernelNode(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool GraphMemsetNode(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool GraphHostNode(wire::Reader& in, wire::Writer& out, CUresult* rc);
  CUresult SynchronizeSession();
  bool ReadNodeList(wire::Reader& in, std::vector<CUgraphNode>* deps, CUresult* rc);
  void ReleaseCaptured();
  // --- graph nodes built by hand (session_graph_nodes.cc)
  // A node as kOpGraphNode describes it.
  struct NodeDesc {
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    CUDA_MEMCPY3D copy{};
    bool src_client = false, dst_client = false;  // a host side in the client's memory
    CUDA_MEMSET_NODE_PARAMS memset{};
    uint64_t ctx = 0;
    uint64_t value = 0;  // callback id, graph, event, pointer, bytes or conditional handle
    int32_t device = 0;
    std::vector<CUmemAccessDesc> access;
    uint32_t cond_type = 0, cond_size = 0;
  };
  struct GraphAlloc {
    uint64_t graph = 0;  // the graph whose allocation node made it
    uint64_t bytes = 0;  // charged to the quota
    int device = 0;      // on this device
  };
  bool GraphNode(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool GraphNodeQuery(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool GraphMisc(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool GraphTopology(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool StreamBatchMemOp(wire::Reader& in, bool per_thread, CUresult* rc);
  // --- kOpDriverMisc (session_driver_misc.cc)
  bool DriverMisc(wire::Reader& in, bool per_thread, wire::Writer& out, CUresult* rc);
  bool ModuleOf(uint8_t sub, wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool StreamMemOpV1(wire::Reader& in, bool per_thread, CUresult* rc);
  // A kernel node's parameters and its argument bytes laid out as the
  // function's parameters (from kernelParams or an `extra` buffer).
  CUresult KernelNodeArgs(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS* p,
                          std::vector<ops::ParamSlot>* slots, std::vector<uint8_t>* blob);
  // kOpGraphNodeQuery of a kernel node: its parameters with the argument bytes.
  CUresult DescribeKernelNode(CUgraphNode node, wire::Writer& out);
  // The client's handle of a function the driver names (a kernel node's): one
  // it knows, or the function of one of its kernels, which it learns as such.
  uint64_t ClientFunctionOf(uint64_t real);
  // The client's handle of a context the driver names (0: none of the client's).
  uint64_t ClientContext(CUcontext real) const;
  // The session's end or a library's unload: the modules its libraries own.
  void ForgetLibraryModules(uint64_t library);
  std::unordered_map<uint64_t, uint64_t> library_modules_;   // module -> owning library
  std::unordered_map<uint64_t, uint64_t> kernel_library_;    // kernel -> its library
  std::unordered_map<uint64_t, uint64_t> function_library_;  // cuKernelGetFunction's -> library
  // Whether `node` is one of Flyt's own helper nodes (client memory in a captured graph).
  bool IsFlytHelperNode(CUgraphNode node);
  // The nodes of `g` the app sees (helper nodes left out), each adopted as the session's.
  CUresult VisibleNodes(CUgraph g, std::vector<CUgraphNode>* out);
  // The app-visible dependencies (or dependents) of `node`, through helper nodes.
  CUresult VisibleNeighbours(CUgraphNode node, bool dependents,
                             std::vector<std::pair<CUgraphNode, CUgraphEdgeData>>* out);
  bool ReadNodeDesc(wire::Reader& in, NodeDesc* d, CUresult* rc);
  // A graph of [fetch host node -> copy] or [copy -> deliver host node]
  // through a new pinned mirror, for a copy one side of which is client memory.
  CUresult BuildCopyGraph(const CUDA_MEMCPY3D& p, CUcontext ctx, bool src_client, CUgraph* out);
  // True when `node` is a child graph node made by BuildCopyGraph; its parts.
  bool CopyWrapperParts(CUgraphNode node, CUgraphNode* copy, CUgraphNode* host,
                        CapturedWork** work);
  // Gives the wrapper node `wrapper` the copy and host parameters of `inner`
  // (a graph BuildCopyGraph made).
  CUresult SetCopyWrapper(CUgraphNode wrapper, CUgraph inner);
  // Forget(kGraph): refunds the graph's allocation nodes.
  void GraphForgotten(uint64_t graph);
  // ReleaseAll: graphs owned by nodes are left to their parents; charges refunded.
  void ReleaseGraphNodes();
  static CUhostFn FetchHelper();
  static CUhostFn DeliverHelper();
  static CUhostFn RunCapturedHostFuncFn();
  std::unordered_map<uint64_t, GraphAlloc> graph_allocs_;  // by device pointer
  std::unordered_set<uint64_t> cond_handles_;              // conditional handles made here
  // Graphs of captures in progress that cuStreamGetCaptureInfo named to the app (client
  // graph -> client stream): usable by the app's calls, but the capture's until it ends.
  std::unordered_map<uint64_t, uint64_t> capture_graphs_;
  // Body and child graphs the client has handles of -> the graph that owns
  // them (0: not known); never destroyed on their own.
  std::unordered_map<uint64_t, uint64_t> subgraphs_;
  bool CallbackExchange(wire::FrameHeader h, const void* a, size_t na, const void* b, size_t nb,
                        void* reply, size_t reply_len, bool wait_for_channel = true);
  bool CopyToDevice(wire::Reader& in, bool per_thread, CUresult* rc);
  bool CopyFromDevice(wire::Reader& in, bool per_thread, wire::Writer& out, CUresult* rc);
  bool Copy3D(wire::Reader& in, bool per_thread, wire::Writer& out, CUresult* rc);
  // --- pinned host memory shared with the client (session_shared_host.cc)
  bool ShareHost(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool UnshareHost(wire::Reader& in, CUresult* rc);
  bool MapHost(wire::Reader& in, wire::Writer& out, CUresult* rc);  // kOpHostMap
  CUresult UnshareHostRegion(uint64_t addr, uint64_t bytes);
  bool InSharedHost(uint64_t addr, uint64_t n) const;
  bool CopyShared(wire::Reader& in, bool per_thread, CUresult* rc);
  void ReleaseSharedHost();
  // Pageable device-to-host copies through a staging area in shared pinned memory
  // (session_staged_copy.cc).
  bool CopyFromDeviceStaged(wire::Reader& in, bool per_thread, CUresult* rc);
  CUresult DescribeFunction(uint64_t handle, bool is_kernel, wire::Writer& out);
  // The parameters of a kernel or function as the server's driver lays them out,
  // in order (at most ops::kMaxParams). Returns the driver's answer when one
  // other than the end of the list (CUDA_ERROR_INVALID_VALUE) stopped it: under
  // lazy loading, a failure to load the function; `slots` has those before it.
  CUresult DriverParamLayout(uint64_t handle, bool is_kernel, std::vector<ops::ParamSlot>* slots);
  void DescribeImage(uint64_t image, uint64_t image_client, bool library, wire::Writer& out);
  // Loads an image as a library or a module (the driver's handle in *handle).
  CUresult LoadCode(const ImageBytes& image, bool library, uint64_t* handle);
  // The kernels (library) or functions (module) of loaded code, with their
  // names ("" where the driver gives none).
  std::vector<std::pair<uint64_t, std::string>> CodeOf(uint64_t image, bool library);
  void ReleaseAll();
  void ReleaseStaging();
  // Execution context (server/share.h): made at the primary context's retain,
  // moved at the first call after a live SM change, destroyed at the end.
  CUresult MakeExec(int device, const ExecConfig& config, CUgreenCtx* green, CUcontext* ctx);
  void EnterExec(int device);
  void SwitchExec();
  void ReleaseExec();
  void ForwardDeviceOutput();
  wire::FrameHeader ReplyHeader(const wire::FrameHeader& req, CUresult rc, uint32_t payload_len);
  bool SendReplyHeader(const wire::FrameHeader& req, CUresult rc, uint32_t payload_len);
  // Bulk copies through pinned staging buffers, so that the network and the
  // GPU work at the same time (see session.cc).
  bool EnsureStaging();
  void FinishUploads();
  bool StagedUpload(const wire::FrameHeader& h, CUresult* rc);
  bool StagedDownload(const wire::FrameHeader& req, uint64_t src, uint64_t size, CUstream stream,
                      CUresult* rc);
  bool Reply(const wire::FrameHeader& req, CUresult rc, const wire::Writer& out);

  ServerState* state_;
  std::unique_ptr<transport::Connection> conn_;
  uint64_t id_ = 0;
  std::string peer_;
  std::unordered_set<uint64_t> handles_[static_cast<int>(marshal::HandleKind::kCount)];
  CUresult deferred_ = CUDA_SUCCESS;
  CUcontext primary_ = nullptr;  // the client's handle for its context
  int primary_device_ = 0;
  // Primary contexts of the server's other devices, retained after the first
  // (primary_device_): by device, the context (its value is also the client's
  // handle) and, under an SM share of green contexts, the session's green
  // context of that device, which RealContext gives for the handle, with its
  // stand-in per-thread default stream. Live SM changes and moves concern
  // primary_device_ only: another device keeps the size it was made with.
  struct MorePrimary {
    CUcontext primary = nullptr;
    CUgreenCtx green = nullptr;
    CUcontext exec = nullptr;  // green's context, else primary
    mutable CUstream pt_stream = nullptr;
  };
  std::map<int, MorePrimary> more_primaries_;
  // The entry of more_primaries_ whose context is current, or null.
  const MorePrimary* CurrentMore() const;
  // kOpPrimaryCtxRetain of a device other than primary_device_.
  CUresult RetainMorePrimary(int device, uint64_t* handle);
  // After the current context changed: the staging buffers' events belong to
  // the context they were made in, so moving to another GPU releases them
  // (made again lazily there).
  void StagingFollowsDevice();
  int staging_device_ = -1;     // -1: primary_device_
  CUcontext exec_ = nullptr;    // what the session's thread has current: primary_ or green_'s
  CUgreenCtx green_ = nullptr;  // this session's green context, if the share has one
  int exec_device_ = -1;        // the device exec_ belongs to
  std::atomic<uint64_t> exec_generation_{0};
  uint64_t info_generation_ = 0;           // device inventory generation the client has
  std::vector<CUgreenCtx> old_greens_;     // earlier green contexts, kept for their streams
  std::vector<CUstream> retired_streams_;  // streams replaced at a switch, kept so that
                                           // their handle values cannot be reused
  std::unordered_map<uint64_t, CUstream> stream_map_;  // client handle -> its stream now
  // Green contexts have no per-thread default stream (the driver answers
  // CUDA_ERROR_INVALID_HANDLE): a blocking stream of the session's green
  // context stands in for it (made on first use, retired at a switch).
  mutable CUstream pt_stream_ = nullptr;
  bool pt_call_ = false;  // the current call asked for the per-thread default stream
  // Bytes charged to the quota per memory / array handle.
  std::unordered_map<uint64_t, uint64_t> memory_bytes_;
  std::unordered_map<uint64_t, uint64_t> array_bytes_;
  // The device each of them was charged on, where it is not 0.
  std::unordered_map<uint64_t, int> memory_device_, array_device_;
  // Shared pinned host regions: server address -> bytes (mapped and registered).
  std::map<uint64_t, uint64_t> shared_host_;
  // Those of them a move leaves behind: staging areas (ops::kHostShareStaging), which
  // the client makes again, and buffers whose memfd the client keeps
  // (ops::kHostShareMovable), which it shares with the next server.
  std::set<uint64_t> left_host_;
  uint64_t mapped_host_bytes_ = 0;  // of shared_host_, mapped over a socket (kOpHostMap)
  // Virtual memory (session_vmm.cc): reservations (base -> size), mappings
  // by base, and allocation handles with the references the client holds.
  std::map<uint64_t, uint64_t> vmm_reserved_;
  std::map<uint64_t, VmmMapping> vmm_mapped_;
  std::unordered_map<uint64_t, VmmHandle> vmm_handles_;
  std::unordered_set<uint64_t> vmm_carved_;  // reservations inside movable_ (by base)
  std::unordered_map<uint64_t, uint64_t> vmm_real_, vmm_client_;  // a restore's handle values
  std::vector<uint64_t> vmm_order_;  // restored handles in snapshot order (their contents)
  std::atomic<int> captures_{0};
  uint32_t client_pid_ = 0;
  bool sticky_logged_ = false;
  bool profiling_ = false;       // CUPTI records this client's frames
  uint32_t profiled_kinds_ = 0;  // 1 << ops::GpuActivityKind
  bool keep_deferred_ = false;   // this reply must not carry the deferred error
  bool retained_primary_ = false;
  std::vector<uint8_t> payload_;
  uint64_t secret_ = 0;
  bool replied_ = false;     // the handler already sent the reply (streamed)
  uint32_t reply_info_ = 0;  // wire::ReplyInfo bits of the reply being built
  // Host-side work captured into graphs (host functions, copy mirrors); lives
  // as long as the session because graphs may run until then.
  std::vector<std::unique_ptr<CapturedWork>> captured_;
  wire::FrameHeader req_{};  // the request being dispatched
  struct Staging {
    void* buf[2] = {nullptr, nullptr};
    uint64_t local[2] = {0, 0};  // registrations with the transport (RemoteMemory), 0: none
    CUevent done[2] = {nullptr, nullptr};
    bool busy[2] = {false, false};
    int next = 0;
    bool tried = false;
    bool ok = false;
  } staging_;
  // The callback channel (second connection of the same client).
  ManagedPager pager_;
  std::mutex callback_mu_;
  std::condition_variable callback_cv_;
  std::unique_ptr<transport::Connection> callback_conn_;
  std::atomic<int> host_funcs_in_flight_{0};

  // --- one-sided copies of the client's pinned memory (server/session_rma.cc) ---
 private:
  // A client buffer the session may read and write: its key (transport::RemoteMemory).
  struct RmaRegion {
    uint64_t base = 0, size = 0;
  };
  // A pinned staging buffer of the session's, registered with the transport once.
  struct RmaSlot {
    Session* session = nullptr;
    void* buf = nullptr;
    uint64_t local = 0;      // its registration (0: none)
    CUevent done = nullptr;  // recorded behind its last use on a stream
    bool busy = false;       // `done` not waited for yet
    // Busy with bytes for the client, written by a host function behind the copy
    // (RmaWriteToClient): where they go.
    bool to_client = false;
    uint64_t client = 0, len = 0, key = 0;
    bool lost = false;  // a transfer into it failed: never used or freed again
  };
  bool RmaAttach(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool RmaRegister(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool RmaUnregister(wire::Reader& in, CUresult* rc);
  bool CopyRma(wire::Reader& in, bool per_thread, CUresult* rc);
  // Synchronous copies straight to and from device memory (ops::kRmaDirect).
  CUresult CopyRmaDirect(bool to_device, uint64_t device, uint64_t key, uint64_t client, uint64_t n,
                         CUstream stream, bool per_thread);
  // Whether [device, device+n) lies in one plain device allocation of the session.
  bool RmaDirectRange(uint64_t device, uint64_t n);
  bool EnsureRmaStaging();
  // The next staging buffer, once its earlier use is done (an error of that use in *rc).
  RmaSlot* TakeRmaSlot(CUresult* rc);
  // Waits for pending writes of bytes to [client, client+n) (stream order: a later read
  // of those bytes must see them).
  void FinishRmaWrites(uint64_t client, uint64_t n);
  // A read or write failed: the client is gone or misbehaves; the session ends.
  CUresult RmaTransportFailed(const Status& why);
  static void RmaWriteToClient(void* slot);
  // Frees the staging buffers (their events belong to the current context).
  void ReleaseRmaStaging();
  transport::RemoteMemory* rma_ = nullptr;  // conn_'s, once the client attached
  bool rma_direct_ = false;
  std::map<uint64_t, RmaRegion> rma_keys_;  // by key id
  std::vector<std::unique_ptr<RmaSlot>> rma_slots_;
  size_t rma_next_ = 0;
  bool rma_tried_ = false;
  std::atomic<bool> rma_failed_{false};
  // --- end of one-sided copies -------------------------------------------------

  // --- CUDA IPC (server/session_ipc.cc) ----------------------------------------
 public:
  // True when [p, p+n) lies in memory this session opened with cuIpcOpenMemHandle.
  bool IpcMapped(uint64_t p, uint64_t n) const;

 private:
  bool IpcGetMemHandle(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool IpcOpenMemHandle(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool IpcCloseMemHandle(wire::Reader& in, CUresult* rc);
  bool IpcGetEventHandle(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool IpcOpenEventHandle(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // Closes the IPC memory the session still has open (ReleaseAll).
  void ReleaseIpc();
  struct IpcOpened {
    uint64_t size = 0;
    uint32_t refs = 0;  // opens not yet closed
  };
  std::map<uint64_t, IpcOpened> ipc_opened_;  // by base
  // The handles this client exported (their 64 bytes): it may not open them.
  std::unordered_set<std::string> ipc_exported_mem_, ipc_exported_events_;
  // --- end of CUDA IPC ---------------------------------------------------------

  // --- contexts the client created (server/session_contexts.cc) ----------------
 private:
  struct UserContext {
    int device = 0;
    CUgreenCtx green = nullptr;            // a green context of the tenant's SM share, or null
    mutable CUstream pt_stream = nullptr;  // a green one's stand-in per-thread default stream
  };
  bool CtxCreate(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool CtxDestroy(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // kOpSetCurrentContext and the primary's retain: which context the session's
  // thread now has current (the client's handle; 0: none).
  void NoteCurrentContext(uint64_t raw);
  // Adopt / Forget: handles made while a user context is current go with it.
  void NoteContextHandle(marshal::HandleKind kind, uint64_t value);
  void DropContextHandle(marshal::HandleKind kind, uint64_t value);
  bool UserOwned(marshal::HandleKind kind, uint64_t value) const;
  // The current context is a green one (the session's or a user context).
  bool CurrentIsGreen() const;
  // RealStream for the default streams while a user context is current.
  CUstream UserDefaultStream(uint64_t raw) const;
  // Frees the context's handles (refunding their memory), then the context;
  // appends the freed allocations and modules to the lists when given.
  CUresult DestroyUserContext(uint64_t raw, std::vector<uint64_t>* memory,
                              std::vector<uint64_t>* modules);
  // After SwitchExec: the user context the client had current stays current.
  void KeepUserContextCurrent();
  // cudaDeviceReset (kOpPrimaryCtxReset) resets the primary context only:
  // the user contexts' handles are set aside around ReleaseAll.
  struct StashedHandle {
    marshal::HandleKind kind;
    uint64_t value;
    uint64_t bytes;  // charged to the quota (memory, arrays)
  };
  std::vector<StashedHandle> StashUserHandles();
  void RestoreUserHandles(const std::vector<StashedHandle>& stash);
  // The session's end: destroys the user contexts the client left.
  void ReleaseUserContexts();
  std::map<uint64_t, UserContext> user_contexts_;  // by the client's handle
  uint64_t current_ctx_ = 0;   // the client's handle current on the session's thread
  uint64_t current_user_ = 0;  // current_ctx_ when it is a user context, else 0
  // (kind, handle) -> the user context current at its creation.
  std::map<std::pair<uint8_t, uint64_t>, uint64_t> user_owned_;
  // --- end of contexts the client created -------------------------------------

  // --- the JIT linker (server/session_link.cc) ---------------------------------
 private:
  // A link state of the driver's and what the driver writes through its
  // options for as long as it lives: the option arrays and the log buffers.
  struct LinkState {
    CUlinkState state = nullptr;
    std::vector<CUjit_option> options;
    std::vector<void*> values;
    std::vector<char> info_log, error_log;  // the server's buffers
    int info_at = -1, error_at = -1;        // index of the *_LOG_BUFFER option
  };
  bool LinkCreate(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool LinkAddData(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool LinkComplete(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool LinkDestroy(wire::Reader& in, CUresult* rc);
  // kOpTensorMap: TMA descriptors (server/session_tensor_map.cc).
  bool TensorMap(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // The create options' values and the logs, as the reply carries them.
  void PutLinkOutputs(const LinkState& link, wire::Writer& out) const;
  // Destroys the link states the client left (ReleaseAll).
  void ReleaseLinks();
  std::map<uint64_t, std::unique_ptr<LinkState>> links_;  // by the driver's handle
  // --- end of the JIT linker ---------------------------------------------------

  // --- moving the session to another server or a file (session_migrate.cc) -----
 public:
  // From the worker's control thread: the next reply asks the client to park
  // (wire::kReplyMoveWanted); at the park the session moves.
  void RequestMove(const channel::MoveOrder& order);
  // Before any client: recreates a moved session's state from its snapshot,
  // under the client's handle values and at its device addresses. *key is
  // what the client resumes with (ops::kOpResume).
  Status Restore(SnapshotReader& in, uint64_t key[2]);
  // The client's connection to this restored session.
  void Resume(std::unique_ptr<transport::Connection> conn);
  // Handles of a restored session: the driver's object behind the client's
  // value, and the client's value for an object the driver returned (the
  // client's old value when it had one; a value no live handle has else).
  // Identity until the session is restored. A CUkernel stands for a function
  // wherever one is expected (as the driver takes it), so a function's value
  // may be a kernel's.
  uint64_t RealHandle(marshal::HandleKind kind, uint64_t client) const {
    const auto& m = xlate_[static_cast<int>(kind)];
    if (!m.empty()) {
      auto it = m.find(client);
      if (it != m.end()) return it->second;
    }
    if (kind == marshal::HandleKind::kFunction)
      return RealHandle(marshal::HandleKind::kKernel, client);
    return client;
  }
  uint64_t ClientHandle(marshal::HandleKind kind, uint64_t real);
  // Hooks of the generic handlers: what a snapshot needs that the driver does
  // not tell afterwards.
  void NoteEventFlags(uint64_t event, unsigned flags) { event_flags_[event] = flags; }
  void NoteEventRecorded(uint64_t event) { event_recorded_[event] = ++record_seq_; }
  void NoteAsyncAllocation(uint64_t ptr) { async_allocs_.insert(ptr); }
  // Texture and surface objects alive. Their values are the driver's and kernels
  // get them as arguments: a restore makes each texture again from the
  // descriptors it was made with, under the same value (session_migrate.cc,
  // RestoreTextures). Surface objects keep a session from moving.
  void NoteTexObject(uint64_t value, const CUDA_RESOURCE_DESC* res, const CUDA_TEXTURE_DESC* tex,
                     const CUDA_RESOURCE_VIEW_DESC* view);
  void NoteBindlessObject(uint64_t value, bool surface, bool alive) {
    if (!surface) {
      textures_.erase(value);  // made ones come through NoteTexObject
    } else if (alive) {
      surfaces_.insert(value);
    } else {
      surfaces_.erase(value);
    }
  }
  void NoteGlobalName(uint64_t ptr, uint64_t size, uint64_t image, const char* name);
  // --- memory the session maps itself (session_movable.cc): restored at the
  // client's old addresses, or movable (--movable-memory).
  // In place of cuMemAlloc / cuMemAllocPitch / cuMemGetAddressRange (session_vmm.h).
  CUresult MemAlloc(CUdeviceptr* dptr, size_t bytes);
  CUresult MemAllocPitch(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                         unsigned element);
  CUresult MemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p);
  // An allocation's base the session mapped; cuMemFree of it goes to FreeMapped.
  bool IsSessionMapped(uint64_t ptr) const {
    return !mapped_allocs_.empty() && mapped_allocs_.count(ptr) != 0;
  }
  // Whether p lies in memory the session mapped (not the driver's cuMemAlloc memory).
  bool InMappedRegion(uint64_t p) const;
  CUresult FreeMapped(uint64_t ptr);
  // Stream-ordered allocations in movable memory: served so when the app
  // names no memory pool and the stream does not capture; freed once the
  // stream's earlier work is done (*kept: still allocated, on an error).
  // *pool: the client's handle of the pool it is served from (the device's
  // current pool, session_pools.cc).
  bool ServesAsyncAlloc(CUstream stream, uint64_t* pool);
  CUresult MemAllocAsync(CUdeviceptr* dptr, size_t bytes, uint64_t pool);
  // --- stream-ordered memory pools the session serves (session_pools.cc)
  // In place of the driver's calls (session_vmm.h), with their arguments.
  CUresult MemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props);
  CUresult MemPoolDestroy(CUmemoryPool pool);
  // Pools the app destroyed while memory of theirs was still allocated: the
  // driver's pool is destroyed once none is (session_pools.cc).
  void DestroyDrainedPools();
  CUresult MemPoolTrimTo(CUmemoryPool pool, size_t keep);
  CUresult MemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                 CUstream stream);
  // cuMemPoolGetAttribute / SetAttribute of the client's pool handle
  // (kOpMemPoolAttribute); *value in and out as 64 bits.
  CUresult PoolAttribute(uint64_t pool, CUmemPool_attribute attr, bool set, uint64_t* value);
  // The client's handle of the pool the session serves for the driver's
  // `real` pool, adding a device's default pool at its first use; 0 when the
  // driver serves it.
  uint64_t ServedPool(uint64_t real);
  // Gives idle regions of the session's pools back above their release thresholds.
  void TrimPools();
  // Gives back every idle region of every pool (the GPU is full); whether any was.
  bool ReleaseIdlePoolMemory();
  CUresult FreeMappedAsync(uint64_t ptr, CUstream stream, bool* kept);
  // Frees what stream-ordered frees left whose streams got there (wait: all).
  void ReapFrees(bool wait);

 private:
  bool Park(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // Why this session cannot move now (empty: it can).
  std::string Unmovable();
  Status WriteSnapshot(SnapshotWriter& out, const uint64_t key[2]);
  // Reserves and maps the client's device ranges at their addresses (before
  // anything else can take them), then fills them.
  struct RestoredAlloc {
    uint64_t base = 0, size = 0, charged = 0;
  };
  struct RestoredPools;
  Status RestoreMemoryLayout(SnapshotReader& in, std::vector<RestoredAlloc>* allocs,
                             const RestoredPools& pools);
  Status RestoreMemoryContents(SnapshotReader& in, const std::vector<RestoredAlloc>& allocs);
  struct RestoredStream {
    uint64_t client = 0;
    uint32_t flags = 0;
    int32_t priority = 0;
    uint64_t after_images = 0;  // images the source had loaded before making it
  };
  // Code in load order, making each stream once as many images are loaded as on the source.
  Status RestoreCode(SnapshotReader& in, const std::vector<RestoredStream>& streams,
                     size_t* next_stream);
  Status RestoreStreams(const std::vector<RestoredStream>& streams, uint64_t images_loaded,
                        size_t* next);
  // Texture objects (session_migrate.cc): each with its value and descriptors;
  // the target makes one object per value up to the largest live one, in order
  // (a fresh process's driver hands out 1, 2, 3, ...), checks every value and
  // destroys those that stood in for the source's holes.
  void WriteTextures(SnapshotWriter& out);
  Status RestoreTextures(SnapshotReader& in);
  // Sends a move or restore outcome to the main process (control socket).
  void ReportOutcome(channel::Report::Kind kind, bool ok, const std::string& message);
  void ReleaseMappedMemory();
  // Pools in a snapshot (session_pools.cc): why they cannot move (empty: they
  // can); the pools and their regions, written before the memory list; read
  // back before the memory is mapped, and made again once it is.
  std::string PoolsUnmovable();
  Status WritePools(SnapshotWriter& out);
  struct RestoredPool {
    uint64_t client = 0;
    uint8_t is_default = 0, destroyed = 0;
    int32_t device = 0;
    CUmemPoolProps props{};
    uint64_t release_threshold = 0, used_high = 0, reserved_high = 0;
    int32_t reuse[3] = {1, 1, 1};
    struct Region {
      uint64_t base = 0, size = 0;
      uint8_t small = 0;
    };
    std::vector<Region> regions;
  };
  struct RestoredPools {
    std::vector<RestoredPool> pools;
    std::vector<std::pair<int32_t, uint64_t>> current;  // device, the client's pool
  };
  Status ReadPools(SnapshotReader& in, RestoredPools* pools);
  // Maps the pools' regions at their addresses (before the memory list).
  Status RestorePoolRegions(const RestoredPools& pools, uint64_t gran);
  // After the memory list: an allocation inside a pool's region counted as its.
  void RestorePoolAllocation(uint64_t base, uint64_t size);
  // The driver's pools behind the client's handles, with their attributes.
  Status RestorePools(const RestoredPools& pools);
  std::mutex move_mu_;
  channel::MoveOrder move_order_;  // under move_mu_
  std::atomic<bool> move_wanted_{false};
  bool move_asked_ = false;  // the client was told to park
  bool moved_ = false;       // the session lives elsewhere now: Run ends
  struct ImageRecord {
    std::shared_ptr<const ImageBytes> bytes;
    uint64_t h0 = 0, h1 = 0;
    bool library = false;
    uint64_t seq = 0;  // load order
  };
  std::map<uint64_t, ImageRecord> images_;  // by the client's handle
  uint64_t image_seq_ = 0;
  // Where each live stream was made among the code loads: the driver gives a stream memory
  // of its own in the range it also places code in, so a restore makes the streams between
  // the same loads as the source did, or the code (and its globals) lands elsewhere.
  struct StreamOrigin {
    uint64_t seq = 0;          // creation order
    uint64_t after_image = 0;  // image_seq_ when it was made
  };
  std::unordered_map<uint64_t, StreamOrigin> stream_origin_;  // by the client's handle
  uint64_t stream_seq_ = 0;
  struct CodeName {
    uint64_t image = 0;  // client handle of the module or library
    std::string name;
    bool kernel = false;       // a CUkernel (library), else a CUfunction
    uint64_t from_kernel = 0;  // a function made by cuKernelGetFunction from this kernel
  };
  std::unordered_map<uint64_t, CodeName> code_names_;  // by the client's handle
  std::unordered_map<uint64_t, unsigned> event_flags_;
  // When each event was last recorded (record_seq_ order): a restore records
  // them again in that order, so elapsed times between them keep their sign.
  std::unordered_map<uint64_t, uint64_t> event_recorded_;
  uint64_t record_seq_ = 0;
  std::unordered_set<uint64_t> async_allocs_;
  struct TextureRecord {  // what cuTexObjectCreate was given
    CUDA_RESOURCE_DESC res{};
    CUDA_TEXTURE_DESC tex{};
    bool has_view = false;
    CUDA_RESOURCE_VIEW_DESC view{};
  };
  std::map<uint64_t, TextureRecord> textures_;  // by value
  std::unordered_set<uint64_t> surfaces_;       // surface objects by value
  struct GlobalRecord {
    uint64_t size = 0;
    uint64_t image = 0;
    std::string name;
  };
  std::map<uint64_t, GlobalRecord> globals_;  // by device address
  std::unordered_map<uint64_t, uint64_t> xlate_[static_cast<int>(marshal::HandleKind::kCount)];
  std::unordered_map<uint64_t, uint64_t> rev_[static_cast<int>(marshal::HandleKind::kCount)];
  uint64_t next_synthetic_ = 0xf17e000000000000ull;
  uint64_t primary_client_ = 0;  // the client's handle of the primary context
  struct MappedRegion {
    uint64_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
    uint32_t live = 0;  // allocations still inside
    // Reserved for itself (a restore); else part of movable_.
    bool own_reservation = true;
    uint64_t pool = 0;          // the client's handle of the pool it backs (pool_ledger_), or 0
    int device = 0;             // where its memory is
    bool idle_charged = false;  // a pool's idle region, counted against the quota
  };
  // Physical memory mapped at `at` (reserved already), readable and writable
  // from `device`; recorded in mapped_regions_ with no allocation inside. On
  // failure nothing stays (an own reservation is freed too).
  CUresult MapNewRegion(uint64_t at, uint64_t size, int device, bool own_reservation);
  // Unmaps and releases one region and frees or returns its addresses; the first error.
  CUresult ReleaseRegion(uint64_t base, const MappedRegion& reg);
  // The session's reservation for movable memory, made at its first use (in
  // the slot that holds `prefer` when it can).
  CUresult ReserveMovable(int device, uint64_t prefer = 0);
  // Reserves the reservation slot at `base` as movable_; ALREADY_MAPPED when
  // the driver put it elsewhere.
  CUresult ReserveSlot(uint64_t base, uint64_t gran);
  // A restore: the reservation slot that holds `addr` made movable_ here (or
  // it is already); an error when addr is in no slot or another one.
  Status EnsureMovableSlot(uint64_t addr, uint64_t gran);
  // A restore: maps [lo, lo+size) in the reservation slot it came from, made
  // movable_ here; *handled false when lo is not movable memory.
  Status RestoreMovableRegion(uint64_t lo, uint64_t size, uint64_t gran, bool* handled);
  // In the pool `pool` (the client's handle; pool_ledger_) when not 0.
  CUresult MovableAlloc(uint64_t bytes, uint64_t* out, uint64_t pool = 0);
  std::map<uint64_t, MappedRegion> mapped_regions_;  // by base
  struct MappedPlace {
    uint64_t region = 0;  // base of its region
    uint64_t size = 0;
  };
  std::map<uint64_t, MappedPlace> mapped_allocs_;  // by allocation base
  // An allocation's place given back once its stream's work is done.
  CUresult ReleasePlace(uint64_t ptr, const MappedPlace& place);
  // What one allocation counts in its pool's used bytes (session_pools.cc).
  uint64_t PoolUse(const MappedPlace& place) const;
  // Unmaps an idle region of a pool and takes it off the books.
  CUresult ReleasePoolRegion(uint64_t base);
  // A pool's idle region holds GPU memory as natively: it counts against the
  // tenant's quota while idle (an allocation placed in it is charged itself).
  // Where the quota has no room, the pool gives the region back instead.
  void ChargeIdleRegion(uint64_t base);
  void RefundIdleRegion(uint64_t base);
  // The quota's charge alone (no idle pool memory given back).
  bool ChargeShare(uint64_t bytes, int device);
  struct PendingFree {
    CUevent done = nullptr;  // recorded on the freeing stream
    uint64_t ptr = 0;
    MappedPlace place;
  };
  std::vector<PendingFree> pending_frees_;
  AddressSpan movable_;                           // free addresses of the reservation
  std::map<uint64_t, AddressSpan> small_chunks_;  // by region base: room for small allocations
  uint64_t granularity_ = 0;
  bool movable_failed_ = false;  // no reservation could be made: the driver's cuMemAlloc
  // The movable-memory slot a client of several servers asked for (kOpPlaceMemory;
  // -1: none): its cuMemAlloc/Pitch memory, the pools the session serves and the
  // app's own reservations go there even without --movable-memory.
  int placed_slot_ = -1;
  bool PlacesMemory() const { return state_->movable_memory || placed_slot_ >= 0; }
  // Copies between two servers of one client (session_peer_copy.cc): one-time
  // listeners by transfer id, and the results of receives by transfer id.
  struct PeerListener {
    int fd = -1;
    uint64_t key[2] = {0, 0};
    uint64_t bytes = 0;
  };
  std::map<uint64_t, PeerListener> peer_listeners_;
  std::map<uint64_t, CUresult> peer_results_;
  uint64_t next_transfer_ = 1;
  bool PlaceMemory(wire::Reader& in, CUresult* rc);
  bool PeerListen(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool PeerReceive(wire::Reader& in, bool per_thread, CUresult* rc);
  bool PeerSend(wire::Reader& in, bool per_thread, CUresult* rc);
  bool PeerDone(wire::Reader& in, CUresult* rc);

  // --- NCCL run for the client (session_nccl.cc) -------------------------------
  bool Nccl(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // Aborts the communicators the client left (it exited or died).
  void ReleaseNccl();
  // The client's communicators (NCCL's pointers), with their device.
  std::map<uint64_t, int> nccl_comms_;
  std::set<std::pair<uint64_t, uint64_t>> nccl_registrations_;  // (comm, handle)
  std::set<std::pair<uint64_t, int>> nccl_ops_;                 // (comm, PreMulSum op)
  int nccl_group_depth_ = 0;
  // Where NCCL writes the communicators it splits or shrinks in the background (it
  // writes when done): kept for the session's life. Token (index + 1) -> the slot.
  std::vector<std::unique_ptr<NcclComm>> nccl_child_slots_;
  std::map<uint64_t, int> nccl_child_device_;  // token -> the parent's device
  void ClosePeerListeners();
  // Pools the session serves (session_pools.cc): their books, and what the
  // driver does not tell of them afterwards, by the client's handle.
  PoolLedger pool_ledger_;
  struct PoolOrigin {
    int device = 0;
    bool is_default = false;
    CUmemPoolProps props{};
  };
  std::map<uint64_t, PoolOrigin> pool_origin_;
  std::vector<CUmemoryPool> doomed_pools_;  // destroyed by the app, the driver's still live
  // --- end of moving the session ------------------------------------------------

  // --- graphs of a moved session (server/session_graph_move.cc) ----------------
 public:
  // After an instantiation (cuGraphInstantiateWithFlags / WithParams) and an
  // update (cuGraphExecUpdate): the executable graph's template, a copy of its
  // graph as it runs, from which a restore instantiates it again.
  void NoteInstantiated(uint64_t exec, uint64_t graph, unsigned long long flags);
  void NoteExecUpdated(uint64_t exec, uint64_t graph);
  // The driver's node to name with executable graph `exec` for the client's
  // `node` (a restored executable graph was instantiated from its template).
  CUgraphNode ExecNode(uint64_t exec, uint64_t node) const;
  // After a change to `node` of executable graph `exec` that the driver took:
  // `apply` makes the same change to the template's node; if it cannot, the
  // executable graph stops being movable, saying `what` changed.
  void MirrorExecChange(uint64_t exec, uint64_t node, const char* what,
                        const std::function<CUresult(CUgraphNode)>& apply);
  void NoteNodeEnabled(uint64_t exec, uint64_t node, bool enabled);

 private:
  struct ExecRecord {
    unsigned long long flags = 0;
    CUgraph tmpl = nullptr;                                // null: not movable (why says why)
    std::unordered_map<uint64_t, CUgraphNode> tmpl_nodes;  // client node -> template's
    // A restored executable graph: the graph it was instantiated from here and
    // its nodes (which exec-level calls name), kept while it lives.
    CUgraph source = nullptr;
    std::unordered_map<uint64_t, CUgraphNode> source_nodes;
    std::unordered_set<uint64_t> disabled;  // client nodes disabled in it
    std::string why;
  };
  // A template of `graph` (driver's handle) for `rec`; rec.why on failure.
  void MakeTemplate(ExecRecord* rec, CUgraph graph);
  void DropTemplate(ExecRecord* rec);
  void ExecForgotten(uint64_t exec);
  void ReleaseExecRecords();
  bool ExecEventNodeSetEvent(bool record, wire::Reader& in, CUresult* rc);
  // Why the session's graphs cannot move (empty: they can): a dry run of WriteGraphs.
  std::string GraphsUnmovable();
  // The captured host work, the client's graphs and the executable graphs in a
  // snapshot (out null: only the checks), and back.
  Status WriteGraphs(SnapshotWriter* out);
  Status RestoreGraphs(SnapshotReader& in);
  struct GraphWriter;
  struct GraphReader;
  Status WriteGraph(GraphWriter& w, CUgraph g, uint64_t client, bool owned, int depth);
  // Reads one graph into `g` (empty); `visible`: the client's handles name its
  // objects; `nested`: a child graph; `top` gets its nodes (client handle, node).
  Status ReadGraph(GraphReader& r, CUgraph g, bool visible, bool nested, int depth,
                   std::vector<std::pair<uint64_t, CUgraphNode>>* top);
  std::unordered_map<uint64_t, ExecRecord> execs_;  // by the client's handle
  // --- end of graphs of a moved session ------------------------------------------
};

}  // namespace flyt::server
