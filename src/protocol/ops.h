// Op ids and shared message layouts for the hand-written calls.
//
// Owns: the stable op ids of calls that need hand-written marshalling
// (handshake, code loading, launches, copies, contexts, host callbacks, IPC, the JIT
// linker) and the plain structs both sides exchange for them. Generic calls have their ids in
// protocol/api_list.h. Ids are stable across versions: append only.
#pragma once

#include <cstdint>

namespace flyt::ops {

// The welcome's trailing u32 of server features (after the boot id).
enum : uint32_t {
  // Sessions may be asked to move while their process is idle: the client
  // opens its callback channel at once, on which kOpParkNudge comes.
  kServerFeatureMovable = 1,
  // kOpCopyFromDeviceStaged is served (pageable device-to-host copies over shm://).
  kServerFeatureStagedDownload = 2,
  // kOpPlaceMemory and the copies between servers (kOpPeer*) are served.
  kServerFeaturePeers = 4,
};

// What a client does after kOpPark.
enum class ParkAction : uint8_t {
  kContinue = 0,    // go on with this connection (the move did not happen or was not wanted)
  kResumeAt = 1,    // the session is now at `address`: resume there with the key
  kWaitResume = 2,  // checkpointed: resume at this server's address once it is restored
};

enum : uint16_t {
  kOpHello = 1,
  kOpGoodbye = 2,
  // First frame of a second connection that carries host functions
  // (cuLaunchHostFunc) back to the client: u64 session id, u64 secret.
  kOpAttachCallbackChannel = 3,
  // First frame of a third connection on which the client's pager fetches and
  // pushes pages of managed memory (server/managed_pager.h): u64 session id,
  // u64 secret. It never waits behind the session's calls.
  kOpAttachPagingChannel = 4,
  // Moving a session to another server, or to a checkpoint file
  // (server/session_migrate.cc, docs/architecture.md §7.4). After a reply with
  // wire::kReplyMoveWanted the client sends kOpPark: every call it sent before
  // is done; the reply says what next: u8 ParkAction, string address, u64
  // key[2].
  kOpPark = 5,
  // First frame of a connection that continues a moved session: a
  // HelloRequest with its token, then u64 key[2]. Answered as kOpHello;
  // CUDA_ERROR_NOT_READY while no worker holds the key yet (ask again).
  kOpResume = 6,
  // First frame of a connection from a server that moves a session here: a
  // HelloRequest with this server's token. The snapshot's bytes follow
  // (server/session_snapshot.h); the reply (status, string message) comes
  // once the session is restored.
  kOpRestoreSession = 7,
  // Asks nothing: its reply carries wire::kReplyMoveWanted when a move waits.
  // A client sends it when told kOpParkNudge, so that an idle process parks.
  kOpMovePoll = 8,
  kOpPrimaryCtxRetain = 10,
  kOpSetCurrentContext = 11,
  // u32 CUstreamCaptureMode: the calling client thread's capture mode
  // (cuThreadExchangeStreamCaptureMode), set on the session's thread before
  // the calls that follow, as kOpSetCurrentContext does for the context.
  kOpSetCaptureMode = 96,
  kOpPrimaryCtxReset = 12,
  // Contexts the app creates (server/session_contexts.cc). kOpCtxCreate: i32
  // device, u32 flags -> u64 context (made current on the session's thread),
  // u32 its flags. kOpCtxDestroy: u64 context -> u32 n, n x u64 device
  // allocations it took along, u32 m, m x u64 modules it took along.
  kOpCtxCreate = 13,
  kOpCtxDestroy = 14,
  // The device inventory (u32 n, n x DeviceInfo) with the tenant's share
  // applied; the client asks again after a reply with kReplyConfigChanged.
  kOpDeviceInfo = 15,
  kOpLoadImage = 20,          // cuLibraryLoadData / cuModuleLoadData / FatBinary
  kOpKernelGetFunction = 21,  // cuKernelGetFunction
  kOpFuncParamLayout = 22,    // layout of a function the client has not seen
  kOpLaunch = 30,             // cuLaunchKernel / cooperative / Ex
  kOpMaxActiveClusters = 31,  // cuOccupancyMaxActiveClusters (launch head only)
  kOpCopyToDevice = 40,       // host bytes -> device (sync or async)
  kOpCopyFromDevice = 41,     // device -> host bytes (reply carries them)
  kOpCopy3D = 42,             // 2D/3D copies (descriptor + dense host bytes)
  kOpHostFuncFence = 50,      // cuLaunchHostFunc: wait until the stream drains
  kOpMemsetUnified = 51,
  kOpHostFunc = 52,      // u64 stream, u64 callback id; reply info says if captured
  kOpRunHostFunc = 53,   // server -> client on the callback channel: call_id = callback id
  kOpHostFuncDone = 54,  // client -> server on the callback channel: call_id = callback id
  // Server -> client on the callback channel, when a graph runs a captured copy:
  kOpDeliverBytes = 55,  // u64 client address, then bytes to store there
  kOpFetchBytes = 56,    // u64 client address, u64 length: reply (HostFuncDone) carries them
  // Server -> client on the callback channel: a move waits for the session;
  // the client acks (HostFuncDone) at once and sends kOpMovePoll.
  kOpParkNudge = 57,
  // Graphs built by hand and node lists.
  kOpGraphGetNodes = 80,    // u64 graph -> u64 n, n x u64 node (Flyt's own nodes left out)
  kOpGraphKernelNode = 81,  // see Session::GraphKernelNode
  kOpGraphMemsetNode = 82,
  kOpGraphHostNode = 83,  // u64 graph, node list, u64 callback id -> u64 node  // u64 graph, u32 n,
                          // n x u64 dep, CUDA_MEMSET_NODE_PARAMS, u64 ctx
  // Server-to-client notice sent just before a reply: bytes the GPU printed
  // (device printf) for the client's stdout.
  kOpDeviceOutput = 60,
  // cuMemPoolGetAttribute / SetAttribute: u64 pool, i32 attr, u8 set, u64 value.
  kOpMemPoolAttribute = 70,
  // cuStreamGetCaptureInfo*: u64 stream -> u32 status, u64 id, u64 graph, u64 n,
  // n x (u64 node, 8-byte CUgraphEdgeData): what the next captured node depends on.
  kOpStreamCaptureInfo = 71,
  // Pinned host memory shared with the server (shm:// only; see
  // server/session_shared_host.cc). kOpHostShare: u64 descriptor id (shared
  // through the transport), u64 bytes, u32 flags, u64 client address ->
  // u64 server address, u64 device pointer. kOpHostUnshare: u64 server address.
  // A flags bit of Flyt's own: the region is the client's staging area of
  // kOpCopyFromDeviceStaged, which a move does not carry (the client makes it again).
  kOpHostShare = 90,
  kOpHostUnshare = 91,
  // A copy between the device and shared host memory: u8 to_device, u64 device
  // pointer, u64 server address, u64 bytes, u64 stream, u8 async.
  kOpCopyShared = 92,
  // The tenant's view for Flyt's NVML library (src/nvml/): u32 flags (0) ->
  // NvmlHead, head.device_count x NvmlDevice, head.process_count x NvmlProcess.
  // The deferred error of earlier asynchronous calls stays for the app.
  kOpNvmlSnapshot = 93,
  // Virtual memory management (the rest is generic: protocol/api_list.h).
  // cuMemSetAccess: u64 ptr, u64 size, u32 count, count x CUmemAccessDesc.
  kOpMemSetAccess = 94,
  // cuMemRetainAllocationHandle: u8 want handle, u64 address -> u64 handle.
  kOpMemRetainAllocationHandle = 95,
  // CUDA IPC (server/session_ipc.cc). Handles are the driver's 64 bytes,
  // passed through unopened (kIpcHandleBytes).
  kOpIpcGetMemHandle = 84,     // u64 device pointer -> handle
  kOpIpcOpenMemHandle = 85,    // handle, u32 flags -> u64 device pointer, u64 bytes mapped
  kOpIpcCloseMemHandle = 86,   // u64 device pointer (as the open returned it)
  kOpIpcGetEventHandle = 87,   // u64 event -> handle
  kOpIpcOpenEventHandle = 88,  // handle -> u64 event (an event handle of the session)
  // VMM shareable handles of type POSIX file descriptor, between client
  // processes of one server (server/session_vmm.cc): the exporter's worker
  // gives the driver's descriptor to the main process under a random key and
  // secret; the client wraps them in a descriptor of its own (a sealed memfd)
  // that the app passes on as it would the driver's; the importer's worker
  // gets the driver's descriptor back from the main process.
  kOpMemExportShareable = 300,  // u64 handle, u32 handle type, u64 flags -> u64 key, u64 secret
  kOpMemImportShareable = 301,  // u64 key, u64 secret, u32 handle type -> u64 handle
  // The JIT linker (server/session_link.cc): the link state lives on the server.
  // Options go as u32 n, n x (u32 CUjit_option, u64 value); the log buffers are
  // the server's own, of the sizes asked. Outputs (with a complete reply, and with
  // an add-data reply, failing or not): u32 n, n x u64 the create options' values
  // now, then the info log and the error log (u32 length, bytes, no NUL each).
  kOpLinkCreate = 302,    // options -> u64 state
  kOpLinkAddData = 303,   // u64 state, u32 type, u8 has name, string name, blob data, options
  kOpLinkComplete = 304,  // u64 state -> outputs, then (success only) u64 size, cubin bytes
  kOpLinkDestroy = 305,   // u64 state
  // TMA descriptors (server/session_tensor_map.cc): a tensor_map::Request
  // (protocol/tensor_map.h) -> the 128-byte CUtensorMap.
  kOpTensorMap = 306,
  // Graphs built by hand, the node kinds beyond kernel/memset/host
  // (server/session_graph_nodes.cc, client/api_graph_nodes.cc).
  // kOpGraphNode: u8 which (kGraphNodeAdd/Set/ExecSet), u64 target (graph,
  // node or exec), u64 node (ExecSet), node list (Add: u32 n, n x u64), then a
  // node description: u32 CUgraphNodeType and by type
  //   MEMCPY: CUDA_MEMCPY3D (memory types resolved, no UNIFIED), u64 ctx,
  //           u8 src in client memory, u8 dst in client memory
  //   MEMSET: CUDA_MEMSET_NODE_PARAMS, u64 ctx      HOST: u64 callback id
  //   GRAPH: u64 child graph    EMPTY: -    EVENT_RECORD / WAIT_EVENT: u64 event
  //   MEM_ALLOC: i32 device, u32 n, n x CUmemAccessDesc, u64 bytes
  //   MEM_FREE: u64 device pointer
  //   CONDITIONAL: u64 handle, u32 CUgraphConditionalNodeType, u32 size, u64 ctx
  // Reply (Add): u64 node; MEM_ALLOC adds u64 pointer, CONDITIONAL u32 n, n x u64 body graph.
  kOpGraphNode = 310,
  // u64 node -> u32 type as the app built it, then by type: MEMCPY CUDA_MEMCPY3D
  // (client addresses), MEMSET CUDA_MEMSET_NODE_PARAMS, GRAPH u64 graph,
  // EVENT_* u64 event, MEM_ALLOC u64 bytes, u64 pointer, i32 device, MEM_FREE
  // u64 pointer, HOST u64 callback id, KERNEL u64 function, u64 kernel, u64
  // context (the client's handles), u32 grid[3], u32 block[3], u32 shared
  // bytes, u32 n, n x ParamSlot, blob (the argument bytes); others nothing.
  kOpGraphNodeQuery = 311,
  // u8 kGraphMisc*, then: Clone u64 graph -> u64 graph; FindInClone u64 node,
  // u64 clone -> u64 node; CondHandle u64 graph, u64 ctx, u32 default, u32
  // flags -> u64 handle; MemAttrGet i32 device, i32 attr -> u64 value;
  // MemAttrSet i32 device, i32 attr, u64 value; MemTrim i32 device.
  kOpGraphMisc = 312,
  // Graph topology (server/session_graph_topology.cc, client/api_graph_topology.cc):
  // u8 kGraphTopo*, then Edges u64 graph -> u32 n, n x (u64 from, u64 to,
  // CUgraphEdgeData); Roots u64 graph -> u32 n, n x u64 node; Neighbours u64 node,
  // u8 dependents -> u32 n, n x (u64 node, CUgraphEdgeData); AddEdges / RemoveEdges
  // u64 graph, u32 n, n x (u64 from, u64 to, CUgraphEdgeData); DestroyNode u64 node;
  // SetEnabled u64 exec, u64 node, u32 enabled; GetEnabled u64 exec, u64 node -> u32.
  // Flyt's helper nodes (client memory in a captured graph) are left out and their
  // neighbours joined by default edges, so the app sees the graph it captured.
  kOpGraphTopology = 313,
  // cuStreamBatchMemOp_v2 (server/session_stream_memops.cc): u64 stream, u32 flags,
  // u32 count, count x CUstreamBatchMemOpParams (48 bytes each, device addresses).
  kOpStreamBatchMemOp = 314,
  // Managed memory, on the paging channel only (server/managed_pager.cc,
  // client/managed_memory.cc). Fetch: u64 address, u32 length, u8 shared ->
  // the bytes (none when shared: they were written into the shared pages).
  // Push: u32 n, u8 shared, n x (u64 address, u32 length), then (unless
  // shared) the n runs' bytes back to back -> nothing. Every run lies inside
  // one managed allocation of the session. Share (shm:// only): u64 descriptor
  // id (a sealed memfd passed on this connection), u64 base, u64 size: the
  // client's pages of that allocation, which fetches and pushes marked shared
  // then copy to and from directly.
  kOpManagedFetch = 315,
  kOpManagedPush = 316,
  kOpManagedShare = 318,
  // cuMemRangeGetAttribute (main connection): u32 attribute, u64 address, u64
  // count, u64 data size -> data size bytes.
  kOpMemRangeAttribute = 317,
  // Driver calls of several kinds, each small (server/session_driver_misc.cc,
  // client/api_driver_misc.cc): u8 kDriverMisc*, then
  //   FuncGetModule u64 function / LibraryGetModule u64 library -> u64 module,
  //     u8 owned by a library (not one the app loaded), u64 that library (0:
  //     not known), then, when owned, the module's functions as kOpLoadImage
  //     describes them (u32 n, ...)
  //   CtxSetFlags u32 flags -> u32 the current context's flags now
  //   HostAtomicCaps i32 device, u32 n, n x u32 CUatomicOperation -> n x u32
  //   PointerSetAttribute u32 attribute, u32 value, u64 pointer
  //   InstantiateWithParams u64 graph, u64 flags, u64 upload stream -> u64 exec,
  //     u32 CUgraphInstantiateResult, u64 error node
  //   MaxPotentialClusterSize: a launch head (kOpLaunch's) -> i32 cluster size
  //   StreamMemOpV1 (the ABI before CUDA 11.7): u8 kMemOpV1*, u64 stream, then
  //     Wait32/Write32/Wait64/Write64 u64 address, u64 value, u32 flags;
  //     Batch u32 flags, u32 count, count x CUstreamBatchMemOpParams_v1
  kOpDriverMisc = 319,
  // One-sided copies of the client's pinned memory (ucx://: server/session_rma.cc,
  // client/rma.cc, transport::RemoteMemory). The client registers a pinned or
  // registered host buffer once; the server then reads and writes it directly.
  // kOpRmaAttach: blob the client's memory address (RemoteMemory::LocalAddress, at
  //   most kMaxRmaAddress bytes) -> u32 kRma* flags.
  // kOpRmaRegister: u64 base, u64 size, blob packed key (at most kMaxRmaKey bytes)
  //   -> u64 key id.
  // kOpRmaUnregister: u64 key id (the session's work drains first, as cuMemFreeHost
  //   waits for the device).
  // kOpCopyRma: u8 to_device, u64 device pointer, u64 key id, u64 client address,
  //   u64 bytes, u64 stream, u8 async. [client address, +bytes) lies in the key's
  //   buffer. Host-to-device bytes are read when the frame runs; device-to-host bytes
  //   are written in stream order (asynchronous ones by a host function behind the copy).
  kOpRmaAttach = 320,
  kOpRmaRegister = 321,
  kOpRmaUnregister = 322,
  kOpCopyRma = 323,
  // A capture's dependency set (server/session_graphs.cc): u8 kCaptureDeps*, u64 stream,
  // then Update: u32 flags; ToGraph: u64 graph, u32 mode; then u8 with edge data,
  // u32 n, n x (u64 node, 8-byte CUgraphEdgeData).
  kOpCaptureDependencies = 324,
  // A pageable device-to-host copy through a staging area of shared pinned memory
  // (shm://; client/staged_copy.cc, server/session_staged_copy.cc): u64 device source,
  // u64 bytes, u64 stream, u8 async, u64 staging area (server address of a region the
  // client shared with kOpHostShare), u64 chunk bytes, u32 slots. The GPU writes chunk i
  // into slot i % slots. One chunk: the reply comes once it is there. Several: before the
  // reply the server sends one StagedNotice per chunk in order, up to and including the
  // first that failed; the client answers each successful one with a u64 ack (the chunk's
  // index) once it copied the slot out, and the server reuses a slot only after its ack.
  kOpCopyFromDeviceStaged = 325,
  // Pinned host memory the GPU maps, over a socket transport (server/session_shared_host.cc,
  // client/api_memory.cc): u64 client address (page-aligned), u64 bytes (pages), u32 flags ->
  // u64 device pointer (equal to the address). The server places pinned, mapped memory at
  // the client's address (CUDA_ERROR_ALREADY_MAPPED when that range is taken there) and
  // names it to the paging channel, which keeps the client's view of it coherent as it does
  // managed memory's. kOpHostUnshare with that address frees it.
  kOpHostMap = 326,
  // Several servers for one client process (server/session_peer_copy.cc, client/
  // multi_server.cc). kOpPlaceMemory: u32 slot -> the session places its
  // cuMemAlloc/cuMemAllocPitch memory, the stream-ordered pools it serves and the
  // app's cuMemAddressReserve ranges in that movable-memory slot, so that the
  // client's servers give out disjoint addresses. A copy between two servers:
  // kOpPeerListen (target; u64 bytes -> u64 transfer id, u16 port, u64 key[2]) opens a
  // one-time TCP listener; kOpPeerReceive (target; u64 transfer id, u64 dst, u64 bytes,
  // u64 stream) takes the bytes from it into device memory; kOpPeerSend (source; string
  // host, u16 port, u64 key[2], u64 src, u64 bytes, u64 stream) sends them there, after
  // the stream's (or, for another server's stream, the session's) earlier work;
  // kOpPeerDone (target; u64 transfer id) answers with the receive's result. The
  // copies are served only to a session that was placed first (else NOT_PERMITTED).
  kOpPlaceMemory = 327,
  kOpPeerListen = 328,
  kOpPeerReceive = 329,
  kOpPeerSend = 330,
  kOpPeerDone = 331,
  // NCCL, run by the server for its client (client's libnccl.so.2: src/nccl/;
  // server/session_nccl.cc): u8 NcclOp, then its arguments (below). Reply: i32
  // ncclResult_t, string NCCL's last error when not success, then the outputs.
  kOpNccl = 332,
  // CUPTI activity of a profiled client (server/session_profiler.cc, src/cupti/):
  // u8 kProfiler*, then Start: u32 GpuActivity kinds (bit 1 << kind) -> u32 kinds
  // enabled, u64 server timestamp (ns), string why the others are not; Stop: u32
  // kinds; Drain: u8 forced -> u64 server timestamp, u32 records dropped, u32 n,
  // n x (GpuActivity, name bytes).
  kOpProfiler = 107,
};

enum : uint8_t { kProfilerStart = 1, kProfilerStop = 2, kProfilerDrain = 3 };

// What the server's CUPTI recorded for one piece of a client's GPU work.
// Timestamps are the server's CUPTI clock; call_id is the frame that issued
// the work (its correlation id on the client), 0 when unknown. An overhead
// record (the driver or CUPTI working on behalf of a call: lazy function
// loading, module loading, instrumentation) has its CUpti_ActivityOverheadKind
// in value, its CUpti_ActivityObjectKind in copy_kind and, for device, context
// and stream objects, their ids in device, context and stream.
enum GpuActivityKind : uint8_t {
  kActivityKernel = 1,
  kActivityMemcpy = 2,
  kActivityMemset = 3,
  kActivityOverhead = 4,
};
inline constexpr int kActivityLast = kActivityOverhead;
struct GpuActivity {
  uint8_t kind;
  uint8_t copy_kind;  // memcpy: CUpti_ActivityMemcpyKind
  uint8_t src_kind;   // memcpy: CUpti_ActivityMemoryKind; memset: its memory kind
  uint8_t dst_kind;
  uint32_t name_len;  // kernel: bytes of its name after the record
  uint64_t call_id;
  uint64_t start_ns;
  uint64_t end_ns;
  uint64_t bytes;
  uint32_t device;
  uint32_t context;
  uint32_t stream;
  uint32_t value;  // memset: its value; overhead: its kind
  int32_t grid[3];
  int32_t block[3];
  int32_t static_smem;
  int32_t dynamic_smem;
  uint32_t registers;
  uint32_t graph_id;
};
static_assert(sizeof(GpuActivity) == 96);

inline constexpr uint32_t kIpcHandleBytes = 64;  // CU_IPC_HANDLE_SIZE

// Which loader the app called; the server answers with the same kind of handle.
enum class ImageLoader : uint8_t { kLibrary = 0, kModule = 1 };

// In a kOpLoadImage function list, in place of a parameter count: the layout
// is not sent. Asking the driver for it (cuKernelGetParamInfo) loads the kernel
// under lazy loading, which natively happens at its first launch; the client
// asks (kOpFuncParamLayout) when it first needs it, inside that launch.
inline constexpr uint32_t kLayoutUnknown = 0xffffffffu;

// Layout of one kernel parameter, as cuKernelGetParamInfo reports it.
struct ParamSlot {
  uint32_t offset;
  uint32_t size;
};

// kOpCopyFromDeviceStaged: chunk `index` is in its slot (status 0), or failed.
struct StagedNotice {
  uint32_t index;
  uint32_t status;  // CUresult
};
static_assert(sizeof(StagedNotice) == 8);
inline constexpr uint32_t kMaxStagedSlots = 16;
inline constexpr uint32_t kHostShareStaging = 1u << 31;  // kOpHostShare flags
// kOpHostShare: the client keeps the memfd, and shares it with the next server
// after a move (so the region does not keep its session from moving).
inline constexpr uint32_t kHostShareMovable = 1u << 30;

// kOpRmaAttach reply flags.
enum : uint32_t {
  // Synchronous copies go straight between the client's memory and device memory
  // (UCX reaches GPU memory here, or the sim backend's device memory is host memory).
  kRmaDirect = 1,
};

// Upper bounds that make hostile input harmless.
inline constexpr uint32_t kMaxRmaAddress = 64 * 1024;  // a UCP worker address
inline constexpr uint32_t kMaxRmaKey = 4096;           // a packed UCX remote key
inline constexpr uint32_t kMaxParams = 1024;
inline constexpr uint32_t kMaxParamBytes = 32764;  // CUDA 12.1+ limit for kernel params
inline constexpr uint32_t kMaxKernelsPerImage = 1u << 20;
inline constexpr uint32_t kMaxNameLen = 64 * 1024;
inline constexpr uint32_t kMaxAccessDescs = 64;  // cuMemSetAccess: one per device is plenty
// The JIT linker (kOpLink*).
inline constexpr uint32_t kMaxLinkOptions = 256;        // options of one cuLinkCreate / AddData
inline constexpr uint32_t kMaxLinkLogBytes = 4u << 20;  // a log buffer the server makes
// cuStreamBatchMemOp: the driver takes at most 256 operations per call.
inline constexpr uint32_t kMaxBatchMemOps = 256;
// Graph nodes (kOpGraphNode).
inline constexpr uint32_t kMaxConditionalBodies = 4096;  // SWITCH bodies of one node
enum GraphNodeWhich : uint8_t { kGraphNodeAdd = 0, kGraphNodeSet = 1, kGraphNodeExecSet = 2 };
enum GraphTopo : uint8_t {
  kGraphTopoEdges = 0,
  kGraphTopoRoots = 1,
  kGraphTopoNeighbours = 2,
  kGraphTopoAddEdges = 3,
  kGraphTopoRemoveEdges = 4,
  kGraphTopoDestroyNode = 5,
  kGraphTopoSetEnabled = 6,
  kGraphTopoGetEnabled = 7,
};
enum CaptureDeps : uint8_t { kCaptureDepsUpdate = 0, kCaptureDepsToGraph = 1 };
enum GraphMisc : uint8_t {
  kGraphMiscClone = 0,
  kGraphMiscFindInClone = 1,
  kGraphMiscCondHandle = 2,
  kGraphMiscMemAttrGet = 3,
  kGraphMiscMemAttrSet = 4,
  kGraphMiscMemTrim = 5,
  kGraphMiscDotPrint = 6,  // u64 graph, u32 flags -> the DOT file's bytes
};

// kOpNccl sub-operations. A config is u32 bytes, those bytes (ncclConfig_t as
// the app filled it; 0 bytes: none), string netName, string commName.
enum NcclOp : uint8_t {
  kNcclVersion = 1,      // -> i32 version
  kNcclUniqueId = 2,     // -> 128 bytes
  kNcclInit = 3,         // i32 nranks, i32 rank, u32 n ids, n x 128 bytes, config -> comm info
  kNcclInitAll = 4,      // i32 n, n x i32 device (the server's ordinals) -> n x comm info
  kNcclSplit = 5,        // u64 comm, i32 color, i32 key, config -> comm info (comm 0: none)
  kNcclShrink = 6,       // u64 comm, u32 n, n x i32 rank, config, i32 flags -> comm info
  kNcclFinalize = 7,     // u64 comm
  kNcclDestroy = 8,      // u64 comm
  kNcclAbort = 9,        // u64 comm
  kNcclAsyncError = 10,  // u64 comm -> i32 the communicator's asynchronous result
  kNcclLastError = 11,   // u64 comm (0: none) -> string
  // u8 NcclCollective, u64 send, u64 recv, u64 count, i32 type, i32 op, i32 root or
  // peer, u64 comm, u64 stream (the server's value)
  kNcclCollective = 12,
  kNcclGroupStart = 13,
  kNcclGroupEnd = 14,
  kNcclRedOpCreate =
      15,  // u64 comm, i32 type, i32 residence, u64 scalar (bytes or pointer) -> i32 op
  kNcclRedOpDestroy = 16,  // u64 comm, i32 op
  kNcclRegister = 17,      // u64 comm, u64 buffer, u64 bytes -> u64 handle
  kNcclDeregister = 18,    // u64 comm, u64 handle
  kNcclCommInfo = 19,      // u64 comm -> comm info (count and rank as NCCL answers them now)
  // u64 token (a split or shrink NCCL was still making) -> comm info (comm 0: none, or
  // not made yet)
  kNcclResolve = 20,
  // u32 n, n x (string name, string value): the app's NCCL settings (nccl::ForwardedEnv),
  // set before the server loads NCCL for this client (ignored once it has).
  kNcclEnv = 21,
};
// A communicator as a reply describes it (comm info): u64 comm, i32 nranks, i32 rank,
// i32 device (the server's ordinal); nranks 0 while NCCL has not finished making it.
enum NcclCollective : uint8_t {
  kNcclAllReduce = 1,
  kNcclBroadcast = 2,
  kNcclReduce = 3,
  kNcclAllGather = 4,
  kNcclReduceScatter = 5,
  kNcclAlltoAll = 6,
  kNcclSend = 7,
  kNcclRecv = 8,
};
inline constexpr uint32_t kMaxNcclIds = 64;          // ncclCommInitRankScalable's ids
inline constexpr uint32_t kMaxNcclDevices = 64;      // ncclCommInitAll's devices
inline constexpr uint32_t kMaxNcclRanks = 1u << 20;  // ncclCommShrink's excluded ranks

// kOpDriverMisc sub-operations.
enum : uint8_t {
  kDriverMiscFuncGetModule = 0,
  kDriverMiscLibraryGetModule = 1,
  kDriverMiscHostAtomicCaps = 2,
  kDriverMiscPointerSetAttribute = 3,
  kDriverMiscInstantiateWithParams = 4,
  kDriverMiscMaxPotentialClusterSize = 5,
  kDriverMiscStreamMemOpV1 = 6,
  kDriverMiscCtxSetFlags = 7,
  kDriverMiscCtxGetFlags = 8,  // reply: u32 the current context's flags, as the driver has them
  // i32 src i32 dst u32 n, n x u32 operation -> n x u32 capabilities
  kDriverMiscP2PAtomicCaps = 9,
  // u64 the server's address of a pinned buffer shared over shm (kHostShareMovable): the
  // app asked for its device pointer, so a move may no longer leave it behind
  kDriverMiscHostKeepMapped = 10,
};
enum : uint8_t {
  kMemOpV1Wait32 = 0,
  kMemOpV1Write32 = 1,
  kMemOpV1Wait64 = 2,
  kMemOpV1Write64 = 3,
  kMemOpV1Batch = 4,
};
inline constexpr uint32_t kMaxAtomicOps = 64;  // cuDeviceGetHostAtomicCapabilities

// Launch flags (kOpLaunch).
enum LaunchFlags : uint32_t {
  kLaunchCooperative = 1,
  kLaunchIsKernel = 2,  // handle is a CUkernel (context-independent)
};

// Device inventory sent in the handshake reply; all device queries are then
// answered on the client.
inline constexpr int kMaxDeviceAttribute = 160;
// The value of an attribute the server's driver refused (one it does not
// know): the client answers CUDA_ERROR_INVALID_VALUE for it, as the driver does.
inline constexpr int32_t kAttributeRefused = INT32_MIN;
struct DeviceInfo {
  char name[256];
  uint8_t uuid[16];
  uint64_t total_mem;
  int32_t attributes[kMaxDeviceAttribute];  // indexed by CUdevice_attribute
  uint8_t luid[8];
  uint32_t luid_mask;
};

// kOpNvmlSnapshot reply (docs/nvml.md). Fixed-size records, no padding.
inline constexpr uint32_t kNvmlSnapshotVersion = 2;
inline constexpr uint32_t kMaxNvmlDevices = 64;
inline constexpr uint32_t kMaxNvmlProcesses = 4096;
struct NvmlHead {
  uint32_t version;       // kNvmlSnapshotVersion
  uint32_t head_size;     // sizeof(NvmlHead), sizeof(NvmlDevice), sizeof(NvmlProcess):
  uint32_t device_size;   // the client checks them
  uint32_t process_size;  //
  uint32_t device_count;
  uint32_t process_count;
  int32_t cuda_driver_version;  // cuDriverGetVersion (the client library puts its own)
  uint32_t reserved;
  char driver_version[80];  // NVIDIA's driver version text; "" when unknown
  char nvml_version[80];    // the GPU host's NVML version text; "" when unknown
};
// Which NvmlDevice fields hold values (the others answer NVML_ERROR_NOT_SUPPORTED).
enum NvmlValid : uint32_t {
  kNvmlHasUtilization = 1u << 0,
  kNvmlHasTemperature = 1u << 1,
  kNvmlHasPower = 1u << 2,
  kNvmlHasPowerLimit = 1u << 3,
  kNvmlHasClocks = 1u << 4,
  kNvmlHasMaxClocks = 1u << 5,
  kNvmlHasPerfState = 1u << 6,
  kNvmlHasFan = 1u << 7,
  kNvmlHasMinor = 1u << 8,
  kNvmlHasPciIds = 1u << 9,
};
// Where the utilization comes from.
enum class NvmlUtilSource : uint32_t {
  kNone = 0,
  kServerProcess = 1,  // the GPU host's NVML, samples of flyt-server's own process
  kWholeGpu = 2,       // the GPU host's NVML, the whole GPU (other tenants included)
  kSim = 3,            // the sim backend's fixed values
};
// Interconnect facts of one GPU as the GPU host's NVML answers them (docs/nvml.md):
// what NCCL and other libraries ask before they start. Each answer carries the
// nvmlReturn_t the host's NVML gave, so errors come back as they were.
inline constexpr uint32_t kNvmlMaxLinks = 18;   // NVML_NVLINK_MAX_LINKS
inline constexpr uint32_t kNvmlP2pIndices = 5;  // NVML_P2P_CAPS_INDEX_READ .. _PCI
inline constexpr uint32_t kNvmlLinkCaps = 6;    // NVML_NVLINK_CAP_P2P_SUPPORTED .. _VALID
enum NvmlPcie : uint32_t {                      // NvmlTopology::pcie order
  kPcieMaxGeneration = 0,
  kPcieMaxWidth = 1,
  kPcieCurrGeneration = 2,
  kPcieCurrWidth = 3,
  kPcieMaxSpeed = 4,  // MB/s
  kPcieCount = 5,
};
struct NvmlLink {
  int32_t state_rc;               // nvmlDeviceGetNvLinkState
  uint32_t active;                // nvmlEnableState_t
  int32_t remote_rc;              // nvmlDeviceGetNvLinkRemotePciInfo_v2
  uint8_t remote_pci[68];         // nvmlPciInfo_t
  int32_t cap_rc[kNvmlLinkCaps];  // nvmlDeviceGetNvLinkCapability
  uint32_t cap[kNvmlLinkCaps];
};
struct NvmlTopology {
  int32_t pcie_rc[kPcieCount];
  uint32_t pcie[kPcieCount];
  // Toward each device j of the snapshot (by index): nvmlDeviceGetP2PStatus per caps
  // index, and nvmlDeviceGetTopologyCommonAncestor.
  uint8_t p2p_rc[kNvmlP2pIndices][kMaxNvmlDevices];
  uint8_t p2p[kNvmlP2pIndices][kMaxNvmlDevices];  // nvmlGpuP2PStatus_t
  uint8_t level_rc[kMaxNvmlDevices];
  uint8_t level[kMaxNvmlDevices];  // nvmlGpuTopologyLevel_t / 10
  NvmlLink links[kNvmlMaxLinks];
};
struct NvmlDevice {
  char name[96];
  uint8_t uuid[16];  // the real GPU's
  uint32_t valid;    // NvmlValid bits
  uint32_t util_source;
  uint32_t pci_domain, pci_bus, pci_device;
  uint32_t pci_device_id, pci_subsystem_id;  // kNvmlHasPciIds
  uint32_t minor;                            // kNvmlHasMinor
  int32_t cc_major, cc_minor;
  uint32_t sm_count;               // the tenant's SMs
  uint32_t sm_total;               // the GPU's
  uint64_t memory_total;           // the tenant's quota, else the GPU's memory
  uint64_t memory_used;            // what the tenant's sessions hold
  uint64_t memory_free;            // total - used, and no more than the GPU has free
  uint32_t util_gpu, util_memory;  // percent
  uint32_t temperature_c, fan_percent;
  uint32_t power_mw, power_limit_mw;
  uint32_t perf_state;        // 0 (P0) .. 15
  uint32_t clock_mhz[4];      // nvmlClockType_t order: graphics, SM, memory, video
  uint32_t max_clock_mhz[4];  //
  uint32_t reserved;
  NvmlTopology topology;
};
struct NvmlProcess {
  uint32_t pid;     // in the client's own PID namespace (its handshake)
  uint32_t device;  // device index it has a context on
  uint64_t used_memory;
};
static_assert(sizeof(NvmlHead) == 192);
static_assert(sizeof(NvmlLink) == 128);
static_assert(sizeof(NvmlTopology) == 40 + 12 * kMaxNvmlDevices + 128 * kNvmlMaxLinks);
static_assert(sizeof(NvmlDevice) == 248 + sizeof(NvmlTopology));
static_assert(sizeof(NvmlProcess) == 16);

}  // namespace flyt::ops
