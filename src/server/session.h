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
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "protocol/codec.h"
#include "protocol/marshal.h"
#include "protocol/ops.h"
#include "protocol/wire.h"
#include "server/driver_api.h"
#include "server/share.h"
#include "transport/transport.h"

namespace flyt::server {

// Kernel images by content hash, shared by all sessions of this server, so an
// image crosses the wire once per server.
class ImageCache {
 public:
  std::shared_ptr<const std::vector<uint8_t>> Find(uint64_t h0, uint64_t h1);
  void Insert(uint64_t h0, uint64_t h1, std::vector<uint8_t> bytes);

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, std::pair<uint64_t, std::shared_ptr<const std::vector<uint8_t>>>>
      images_;
  size_t bytes_ = 0;
};

struct ServerState {
  DriverApi api;
  // The tenant's share (memory quota, SM count) and its live changes.
  Share share;
  // Read end of the pipe that replaced the server's stdout, where NVIDIA's
  // driver writes device printf output; -1 when not captured.
  int device_output_fd = -1;
  std::string token;
  int driver_version = 0;
  std::vector<ops::DeviceInfo> devices;
  ImageCache images;
  std::mutex sessions_mu;
  std::unordered_map<uint64_t, class Session*> sessions;  // live sessions by id
  std::atomic<uint64_t> next_session{1};
  std::atomic<int> live_sessions{0};
  // Requests served (all sessions), for the control socket's stats.
  std::atomic<uint64_t> calls{0};
  // Steady-clock nanoseconds of the server's start and of the end of the last
  // session (0: none ended yet).
  int64_t start_ns = 0;
  std::atomic<int64_t> last_session_end_ns{0};
  // The data-plane listeners' bound addresses (real ports).
  std::vector<std::string> listen;
  // Offered in the handshake: the shm:// listener (empty: none) and this
  // kernel's boot id, so that a client on the same host can move to it.
  std::string shm_offer;
  std::string boot_id;
  // A session hit a sticky error (illegal address, ...): the shared context is
  // unusable until it is reset, which happens once no session is left.
  std::atomic<bool> context_poisoned{false};
  // The server's own reference to the primary context keeps it warm between
  // clients; it is dropped to reset a poisoned context.
  std::mutex context_mu;
  bool server_holds_context = false;
  // How this server was started, to start it afresh (see Session::Run); a
  // live share change rewrites its --memory-quota / --sm-count.
  mutable std::mutex argv_mu;
  std::vector<std::string> argv;
  int original_stdout = -1;
};

// Builds the device inventory (the share is applied to it when sent).
Status DescribeDevices(ServerState* state);
// Monotonic clock in nanoseconds.
int64_t SteadyNowNs();
// Replaces this server process with a fresh copy of itself (same arguments).
void RestartServer(const ServerState& state);
// Points the server's stdout at a pipe so that device printf output can be
// forwarded to the client whose call flushed it.
Status CaptureDeviceOutput(ServerState* state);

// A session's virtual memory (cuMemCreate / cuMemMap, session_vmm.cc).
struct VmmMapping {
  uint64_t size = 0;
  uint64_t handle = 0;
};
struct VmmHandle {
  uint64_t charged = 0;   // bytes charged to the quota at cuMemCreate
  uint32_t refs = 0;      // references the client holds (create, retain - release)
  uint32_t mappings = 0;  // this session's mappings of it
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
  Session(ServerState* state, std::unique_ptr<transport::Connection> conn);
  ~Session();
  // Serves the client until it leaves, dies or misbehaves; then frees all it owned.
  void Run();

  // Handle bookkeeping used by the generic handlers.
  bool Owns(marshal::HandleKind kind, uint64_t value) const;
  void Adopt(marshal::HandleKind kind, uint64_t value);
  void Forget(marshal::HandleKind kind, uint64_t value);
  DriverApi& api() { return state_->api; }
  // Memory quota bookkeeping of the generic allocation handlers: charged
  // before the driver allocates, recorded per handle, refunded when freed.
  bool ChargeMemory(uint64_t bytes) {
    if (!state_->share.Charge(bytes)) return false;
    charged_ += bytes;
    return true;
  }
  void RefundMemory(uint64_t bytes) {
    state_->share.Refund(bytes);
    uint64_t c = charged_.load();
    while (!charged_.compare_exchange_weak(c, c > bytes ? c - bytes : 0)) {
    }
  }
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
  // The stream that runs a client's stream handle now: after a live SM change
  // the session's streams move to new streams in the new context, under the
  // same client-visible handles. 0, 1 and 2 follow the current context.
  CUstream RealStream(uint64_t raw) const;
  // The context behind a client's context handle (its primary context stands
  // for the session's execution context, possibly a green context).
  CUcontext RealContext(uint64_t raw) const;
  // True while a stream capture of this session is in progress.
  bool capturing() const { return captures_.load() > 0; }
  // For NVML's process list (session_nvml.cc), read by other sessions' threads:
  // the client's pid (0 before the handshake), the device of its context (-1:
  // none yet) and the bytes it holds against the quota.
  uint32_t client_pid() const { return client_pid_.load(); }
  int context_device() const { return context_device_.load(); }
  uint64_t memory_charged() const { return charged_.load(); }
  // True when this session runs under an older execution config than the server's.
  bool switch_pending() const { return exec_generation_.load() != state_->share.exec_generation(); }
  // Runs a client host function: asks the client over the callback channel and
  // waits for it to finish. Called on the driver's callback thread.
  void RunClientHostFunc(uint64_t id, bool persistent);
  // Graph-captured copies between the GPU and the client's memory: at each run
  // of the graph, the bytes go to / come from the client over the callback channel.
  void DeliverToClient(uint64_t client_dst, const void* bytes, size_t n);
  void FetchFromClient(uint64_t client_src, void* bytes, size_t n);

 private:
  enum class Opening { kRefused, kSession, kCallbackChannel };
  Opening Handshake();
  bool AttachCallbackChannel(const wire::FrameHeader& h);
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
  // kOpNvmlSnapshot (session_nvml.cc).
  bool NvmlSnapshot(wire::Reader& in, wire::Writer& out, CUresult* rc);
  // --- virtual memory management, hand-written calls (session_vmm.cc)
  bool VmmSetAccess(wire::Reader& in, CUresult* rc);
  bool VmmRetainHandle(wire::Reader& in, wire::Writer& out, CUresult* rc);
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
  // --- graphs (session_graphs.cc)
  bool Capturing(CUstream stream);
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
  bool CallbackExchange(wire::FrameHeader h, const void* a, size_t na, const void* b, size_t nb,
                        void* reply, size_t reply_len);
  bool CopyToDevice(wire::Reader& in, bool per_thread, CUresult* rc);
  bool CopyFromDevice(wire::Reader& in, bool per_thread, wire::Writer& out, CUresult* rc);
  bool Copy3D(wire::Reader& in, bool per_thread, wire::Writer& out, CUresult* rc);
  // --- pinned host memory shared with the client (session_shared_host.cc)
  bool ShareHost(wire::Reader& in, wire::Writer& out, CUresult* rc);
  bool UnshareHost(wire::Reader& in, CUresult* rc);
  CUresult UnshareHostRegion(uint64_t addr, uint64_t bytes);
  bool InSharedHost(uint64_t addr, uint64_t n) const;
  bool CopyShared(wire::Reader& in, bool per_thread, CUresult* rc);
  void ReleaseSharedHost();
  void DescribeFunction(uint64_t handle, bool is_kernel, wire::Writer& out);
  void DescribeImage(uint64_t image, bool library, wire::Writer& out);
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
  // Shared pinned host regions: server address -> bytes (mapped and registered).
  std::map<uint64_t, uint64_t> shared_host_;
  // Virtual memory (session_vmm.cc): reservations (base -> size), mappings
  // by base, and allocation handles with the references the client holds.
  std::map<uint64_t, uint64_t> vmm_reserved_;
  std::map<uint64_t, VmmMapping> vmm_mapped_;
  std::unordered_map<uint64_t, VmmHandle> vmm_handles_;
  std::atomic<int> captures_{0};
  // For NVML (client_pid(), context_device(), memory_charged()).
  std::atomic<uint32_t> client_pid_{0};
  std::atomic<int> context_device_{-1};
  std::atomic<uint64_t> charged_{0};
  bool keep_deferred_ = false;  // this reply must not carry the deferred error
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
    CUevent done[2] = {nullptr, nullptr};
    bool busy[2] = {false, false};
    int next = 0;
    bool tried = false;
    bool ok = false;
  } staging_;
  // The callback channel (second connection of the same client).
  std::mutex callback_mu_;
  std::condition_variable callback_cv_;
  std::unique_ptr<transport::Connection> callback_conn_;
  std::atomic<int> host_funcs_in_flight_{0};
};

}  // namespace flyt::server
