// The client library's connection to flyt-server and the state it keeps locally.
//
// Owns: the one connection of this process (lazy, made by cuInit), request
// framing, buffering of asynchronous calls until the next synchronous one, the
// deferred errors the server reports, and the state that lets hot calls be
// answered without a round trip: device inventory, contexts, device
// allocations, pinned host buffers (with their one-sided registrations over
// ucx://, client/rma.cc), kernel tables with parameter layouts.
// Lives inside other people's processes: no stdout, no exit(), no global
// constructors that can fail, no hang when the server is gone.
#pragma once

#include <cuda.h>
// The client's own definitions and calls of the traced driver entry points use their
// internal names (gen_driver_trace.py; the exported names are the wrappers that report
// calls to CUPTI's driver API domain, client/driver_trace.h).
#include "driver_impl_names.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "protocol/codec.h"
#include "protocol/marshal.h"
#include "protocol/ops.h"
#include "protocol/wire.h"
#include "transport/transport.h"

#define FLYT_API extern "C" __attribute__((visibility("default")))

namespace flyt::client {

struct FuncInfo {
  std::string name;
  std::vector<ops::ParamSlot> params;
  uint32_t param_bytes = 0;
  // False until the server described the parameters (ops::kLayoutUnknown):
  // FuncLayout asks for them, and registers a described copy that keeps this
  // one alive (the name cuKernelGetName handed out stays valid).
  bool layout_known = true;
  std::shared_ptr<const FuncInfo> superseded;
  bool is_kernel = false;
  uint64_t image = 0;  // library or module handle
};

struct ImageInfo {
  bool is_library = false;
  // A module a library owns (cuLibraryGetModule, cuFuncGetModule): the app
  // may not unload it, and it goes with `owner` (0: its library is not known).
  bool library_owned = false;
  uint64_t owner = 0;
  std::unordered_map<std::string, uint64_t> by_name;
};

// Where a synchronous call's reply payload goes.
struct ReplySink {
  std::vector<uint8_t>* vec = nullptr;  // resized to the payload
  void* raw = nullptr;                  // or straight into caller memory...
  size_t raw_size = 0;                  // ...of exactly this many bytes
  // A staged device-to-host copy of several chunks (ops::kOpCopyFromDeviceStaged): each
  // chunk the server announces before the reply is handed to *staged (its index), then
  // acked. The reply's status says whether all of them came.
  const std::function<void(uint64_t)>* staged = nullptr;
  uint64_t staged_chunks = 0;
};

class Client {
 public:
  // The process-wide client; never destroyed. With several servers (FLYT_SERVER
  // "A,B,..."; client/multi_server.cc) it is server 0's link and holds all local
  // state; Call and Post send each call to the server it is routed to.
  static Client& Get();

  // --- several servers (client/multi_server.cc)
  // Handles of server k >= 1 (streams, events, contexts, modules, functions, ...)
  // carry k in their top byte, so that handles of two servers never collide and
  // say where they belong; the wire carries them without it. Server 0's handles
  // are the server's own values (a single server is unchanged).
  static constexpr int kTagShift = 56;
  static uint64_t Tag(uint64_t h, int server) {
    return h == 0 || server <= 0 ? h : h | (static_cast<uint64_t>(server) << kTagShift);
  }
  static int TagOf(uint64_t h) { return static_cast<int>(h >> kTagShift); }
  static uint64_t Untag(uint64_t h) { return h & ((uint64_t{1} << kTagShift) - 1); }
  template <typename H>
  static H TagHandle(H h, int server) {
    return reinterpret_cast<H>(Tag(reinterpret_cast<uintptr_t>(h), server));
  }
  // A handle as the wire carries it: without its tag with several servers, as it
  // is with one (a moved session's handles may use the top byte themselves).
  static uint64_t WireValue(uint64_t h) { return several_ ? Untag(h) : h; }
  template <typename H>
  static uint64_t WireHandle(H h) {
    return WireValue(reinterpret_cast<uintptr_t>(h));
  }
  // More than one server: calls are routed.
  bool multi() const { return !peers_.empty(); }
  int server_count() const { return 1 + static_cast<int>(peers_.size()); }
  // The server of a global device ordinal, and the ordinal on that server.
  int DeviceServer(int dev) const {
    return dev >= 0 && static_cast<size_t>(dev) < dev_server_.size() ? dev_server_[dev] : 0;
  }
  int DeviceLocal(int dev) const {
    return dev >= 0 && static_cast<size_t>(dev) < dev_local_.size() ? dev_local_[dev] : dev;
  }
  // The global ordinal of server `server`'s device `local` (-1: none).
  int GlobalDevice(int server, int local) const;
  // The link to server k (0: this object).
  Client& Link(int server) { return server <= 0 ? *this : *peers_[server - 1]; }
  // The server the calling thread's calls go to now: a RouteScope's, else the
  // current context's.
  int RouteNow() const;
  // The server that runs work on `stream`: its tag, or the current context's for a
  // default stream (null, legacy, per-thread).
  int StreamRoute(CUstream stream) const;
  // The server the calling thread's last call or post went to.
  static int LastRoute();
  // The server whose device memory holds p, or that reserved the address range
  // holding it (cuMemAddressReserve); -1: no known device range.
  int ServerOfPointer(uint64_t p);
  // True when [p, p+n) overlaps a known device range or reserved address range
  // (of any server).
  bool OverlapsDeviceRange(uint64_t p, uint64_t n);
  // Routes the calling thread's calls to `server` while it lives (-1: no change).
  class RouteScope {
   public:
    explicit RouteScope(int server);
    ~RouteScope();
    RouteScope(const RouteScope&) = delete;
    RouteScope& operator=(const RouteScope&) = delete;

   private:
    int saved_;
    bool set_;
  };
  // [base, base+size) of `server` overlaps device memory of another server.
  bool CollidesAcrossServers(uint64_t base, uint64_t size, int server);
  // A copy between device memory of two servers, server to server (never
  // through this process): ordered after the source's and the target's
  // earlier work (client/multi_server.cc).
  CUresult CopyAcrossServers(const char* name, uint64_t dst, int dst_server, uint64_t src,
                             int src_server, size_t n, CUstream stream, bool async, bool pt);

  // Connects and shakes hands once (cuInit). Later calls return the same result.
  CUresult Init();
  bool initialized() const { return init_rc_ == CUDA_SUCCESS && init_done_; }

  // Synchronous call: flushes queued asynchronous calls, sends, waits.
  // Also the coherence points of managed memory (client/managed_memory.h).
  CUresult Call(const char* name, uint16_t op, const wire::Writer& req, ReplySink sink,
                uint16_t flags = 0);
  // Asynchronous call: queued and sent with the next synchronous one (or when
  // the queue is full). `bulk` bytes follow the request without being copied.
  CUresult Post(const char* name, uint16_t op, const wire::Writer& req, uint16_t flags = 0,
                const void* bulk = nullptr, size_t bulk_len = 0);
  CUresult Flush();
  // Called with each app call's id while a profiler listens (nullptr: none).
  void SetCallHook(void (*hook)(uint64_t call_id));
  // wire::ReplyInfo bits of the calling thread's last synchronous reply.
  static uint32_t LastReplyInfo();
  // Calls made since start: synchronous (waited for a reply), asynchronous
  // (queued), and messages sent on the connection (flyt_client_stats).
  struct CallStats {
    uint64_t sync_calls = 0;
    uint64_t async_calls = 0;
    uint64_t sends = 0;
  };
  CallStats Stats() const;
  // With FLYT_CALL_COUNTS=1: "SYNC|ASYNC count name" lines, most frequent
  // first, of every call so far (flyt_client_call_counts).
  std::string CallCounts();

  // Queues a host function behind the stream's work (cuLaunchHostFunc): the
  // server's driver asks for it over a second connection when the stream
  // reaches it, and it runs on this process's callback thread.
  CUresult EnqueueHostFunc(CUstream stream, std::function<void()> fn, bool per_thread);
  // Registers a host function that a graph runs at each launch; returns its id.
  uint64_t RegisterGraphHostFunc(std::function<void()> fn);
  // Opens the second connection on which the server asks for host-side work.
  CUresult EnsureCallbackChannel();
  // Opens another connection to this process's session: `op` is its first
  // frame (ops::kOpAttachCallbackChannel, kOpAttachPagingChannel); `what`
  // names it in the log.
  CUresult DialSideChannel(uint16_t op, const char* what,
                           std::unique_ptr<transport::Connection>* out);
  // Waits until host functions queued on `stream` (any stream for the legacy
  // default stream) have run: an asynchronous upload queued behind them must
  // see what they wrote, so its bytes may only be read afterwards.
  void WaitHostFuncs(CUstream stream);

  // --- answers without a round trip
  // Stream captures begun and not yet ended in this process. While there is
  // none, no stream can be capturing (a capture only starts with
  // cuStreamBeginCapture), so capture queries are answered here. The count
  // errs high (a begin that may have failed still counts), never low.
  void CaptureBegan() { active_captures_.fetch_add(1, std::memory_order_acq_rel); }
  void CaptureEnded();
  bool AnyCapture() const { return active_captures_.load(std::memory_order_acquire) > 0; }
  // After a synchronous call whose reply came once `stream`'s work had
  // finished (a device-to-host copy with bytes, cuStreamSynchronize): while no
  // call at all follows it, synchronizing that stream again is answered here.
  void NoteStreamDrained(CUstream stream, bool per_thread);
  bool StreamDrained(CUstream stream, bool per_thread);

  // --- devices (answered locally)
  int device_count() const { return static_cast<int>(devices_.size()); }
  const ops::DeviceInfo* device(int ordinal) const {
    return ordinal >= 0 && ordinal < device_count() ? &devices_[ordinal] : nullptr;
  }
  int driver_version() const { return driver_version_; }

  // --- contexts
  CUresult RetainPrimary(CUdevice dev, CUcontext* out);
  CUresult ReleasePrimary(CUdevice dev);
  bool PrimaryState(CUdevice dev, unsigned* flags, int* active);
  // cuCtxGetFlags of an active primary context: its flags with the bits the
  // driver adds (asked of the server the first time).
  CUresult PrimaryContextFlags(CUdevice dev, unsigned* flags);
  void SetPrimaryFlags(CUdevice dev, unsigned flags);
  CUresult ResetPrimary(CUdevice dev);
  int ContextDevice(CUcontext ctx);       // -1 when unknown
  CUcontext PrimaryHandle(CUdevice dev);  // stable for the process's life; null before retain
  // Contexts the app creates (cuCtxCreate): made on the server (which makes
  // it current there) and known here until destroyed. DestroyContext refuses
  // the primary context and unknown handles (CUDA_ERROR_INVALID_CONTEXT) and
  // forgets the allocations and modules the context took along.
  CUresult CreateContext(CUdevice dev, unsigned flags, CUcontext* out);
  CUresult DestroyContext(CUcontext ctx);
  struct CreatedContext {
    int device = 0;
    unsigned flags = 0;  // as the server's driver reports them (cuCtxGetFlags)
    uint64_t id = 0;     // cuCtxGetId: unique in the process, never a primary's
  };
  bool FindCreatedContext(CUcontext ctx, CreatedContext* out);
  // cuCtxSetFlags: the flags the server's driver now reports for `ctx`.
  void SetContextFlags(CUcontext ctx, unsigned flags);

  // --- device allocations (ranges) and pinned host buffers
  void AddDeviceRange(uint64_t base, uint64_t size, bool reserve_va);
  bool RemoveDeviceRange(uint64_t base);
  // True when [p, p+n) lies in a known device range; *base/*size describe it.
  bool FindDeviceRange(uint64_t p, uint64_t n, uint64_t* base = nullptr, uint64_t* size = nullptr);
  // The context current when the range at `base` was added, and its device
  // (pointer attributes CONTEXT and DEVICE_ORDINAL); false for an unknown base.
  bool DeviceRangeOwner(uint64_t base, CUcontext* ctx, int* device);
  struct HostBuffer {
    uintptr_t base = 0;
    size_t size = 0;
    unsigned flags = 0;
    bool owned = false;        // allocated here (cuMemHostAlloc), not an app buffer
    uint64_t server_addr = 0;  // shared with the server (shm://): its mapping there; 0: not shared
    uint64_t device_ptr = 0;   // the GPU's pointer to a shared buffer; 0: not mapped
    // Read and written by the server itself (ucx://, client/rma.cc): the server's id of
    // its key and the transport's registration, both of connection generation rma_gen.
    uint64_t rma_key = 0;
    uint64_t rma_handle = 0;
    uint64_t rma_gen = 0;
    bool rma_refused = false;  // registering it failed on connection generation rma_gen
    // Mapped for the GPU over a socket (api_memory.cc, managed_memory.h): the server holds
    // pinned memory at the same address, and this process's pages are a coherent view.
    bool coherent = false;
    // A shared buffer's memfd, kept so that after a move the next server maps the
    // same memory (Client::ReshareHostBuffersLocked); -1: none kept.
    int share_fd = -1;
    bool Covers(const void* p, size_t n) const {
      auto v = reinterpret_cast<uintptr_t>(p);
      return v >= base && v - base <= size && n <= size - (v - base);
    }
  };
  void AddHostBuffer(const HostBuffer& b);
  bool RemoveHostBuffer(const void* base, HostBuffer* out);
  // The pinned or registered buffer that holds p.
  bool FindHostBuffer(const void* p, HostBuffer* out);
  // AnyUnmappedPinned: some pinned or registered buffer has no GPU mapping yet (one
  // relaxed load). MaybeUnmappedPinned: also, `p` may lie in one (a bound that only
  // widens; FindHostBuffer says for sure).
  bool AnyUnmappedPinned() const { return unmapped_pinned_.load(std::memory_order_relaxed) > 0; }
  bool MaybeUnmappedPinned(uint64_t p) const {
    return AnyUnmappedPinned() && p >= pinned_lo_.load(std::memory_order_relaxed) &&
           p < pinned_hi_.load(std::memory_order_relaxed);
  }
  // Memory shared with the server: a shared-memory transport (not wrapped in
  // the emulator). ShareFd passes a sealed memfd; *id names it in a request.
  bool SharesMemory();
  CUresult ShareFd(int fd, uint64_t* id);
  // A request built from one connection's state (a shared buffer's or the staging
  // area's address at the server) may only go on that connection: while a
  // SameConnection lives, a call or post of the calling thread finds the connection
  // generation `gen` still current, or is not sent and answers CUDA_ERROR_NOT_READY with
  // Stale() true (another thread's park moved the session in between). Stale() is
  // cleared when a SameConnection starts.
  uint64_t ConnectionGeneration() const { return conn_gen_.load(); }
  class SameConnection {
   public:
    explicit SameConnection(uint64_t gen);
    ~SameConnection();
    SameConnection(const SameConnection&) = delete;
    SameConnection& operator=(const SameConnection&) = delete;
    static bool Stale();

   private:
    uint64_t saved_;
  };
  // After a move (session_move.cc): pinned buffers shared with the old server are
  // shared with the new one (their kept memfd, at the same address where it is
  // free there), or become private memory where the new server shares none.
  void ReshareHostBuffersLocked();
  // A pageable device-to-host copy over shm://: the GPU writes chunks into a staging
  // area shared with the server and this process copies each out as it lands
  // (client/staged_copy.cc). False: not available here (another transport, a capture,
  // an older server, FLYT_SHM_STAGED=off, or the server refused the area); the caller
  // takes the byte path. True: *rc is the copy's result.
  bool StagedDownload(const char* name, void* dst, CUdeviceptr src, size_t n, CUstream stream,
                      bool async, bool per_thread, CUresult* rc);
  // --- one-sided copies of pinned memory (client/rma.cc; ucx://). The server's key id
  // for the pinned or registered buffer that holds [p, p+n); a buffer not registered yet
  // is registered when `first_use_worth_it`. False: the copy travels as bytes (another
  // transport, FLYT_RMA=off, a capture, or the server or transport refused).
  bool RmaKey(const void* p, size_t n, bool first_use_worth_it, uint64_t* key);
  // Copies of at least this many bytes register a buffer (FLYT_RMA_MIN_BYTES).
  size_t rma_min_bytes() const { return rma_min_bytes_; }
  // A buffer that goes (cuMemFreeHost, cuMemHostUnregister): the server drops its key
  // once its work on the buffer is done, then the registration goes.
  CUresult RmaForget(const HostBuffer& b);

  // --- virtual memory management (client/api_vmm.cc). A reserved range
  // keeps this process's host memory out of it, as allocations do; a mapped
  // range is device memory to copies and pointer queries (FindDeviceRange),
  // and adjacent mapped ranges count as one.
  // `server`: the one that reserved it (ServerOfPointer answers it for the range).
  void AddReservation(uint64_t base, uint64_t size, int server = 0);
  // True when [base, base+size) is a reservation and holds no mapped range
  // (then it is forgotten); with `force`, it and the ranges inside go anyway.
  bool RemoveReservation(uint64_t base, uint64_t size, bool force);
  bool FindReservation(uint64_t p, uint64_t* base, uint64_t* size);
  void AddMappedRange(uint64_t base, uint64_t size);
  // True when mapped ranges tile [base, base+size) exactly; they are then
  // forgotten. With `force`, the ranges inside go whatever they are.
  bool RemoveMappedRanges(uint64_t base, uint64_t size, bool force);
  // References the app holds on an allocation handle (cuMemCreate and
  // cuMemRetainAllocationHandle add one, cuMemRelease drops one); false when none.
  void AddVmmHandleRef(uint64_t handle);
  bool DropVmmHandleRef(uint64_t handle, bool* last = nullptr);  // *last: it was the last

  // --- code
  void AddImage(uint64_t handle, bool is_library, std::vector<std::pair<uint64_t, FuncInfo>> fns);
  // A library's module, with its functions (client/api_driver_misc.cc).
  void AddLibraryModule(uint64_t module, uint64_t library,
                        std::vector<std::pair<uint64_t, FuncInfo>> fns);
  // Forgets the image, and the modules a library being removed owns.
  void RemoveImage(uint64_t handle);
  // What this process knows of an image: false when nothing.
  bool ImageKind(uint64_t image, bool* is_library, bool* library_owned);
  uint64_t FindInImage(uint64_t image, const std::string& name);
  std::shared_ptr<const FuncInfo> Func(uint64_t handle);
  void AliasFunc(uint64_t alias, std::shared_ptr<const FuncInfo> info);
  size_t ImageFuncCount(uint64_t image, std::vector<uint64_t>* out);
  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as the app set it; -1 if never.
  // Handles of one kernel (a library's kernel, its copy on another server, the
  // functions got from them) share the value once linked: the app may set it on one
  // and launch another (this check only spares a round trip; the driver has the last word).
  void SetMaxDynamicShared(uint64_t func, int bytes);
  int MaxDynamicShared(uint64_t func);
  void LinkKernelHandles(uint64_t a, uint64_t b);

 private:
  Client() = default;
  CUresult Fail(const std::string& why);
  // The handshake on conn_ (ops::kOpHello) and what the server answered.
  struct Hello {
    wire::HelloReply rep{};
    std::string message;  // the reason of a refusal
    bool answered = false;
    std::vector<ops::DeviceInfo> devices;
    std::string shm_offer;  // the server's shm:// address, if it has one
    std::string boot_id;    // the server's kernel (transport::KernelBootId)
    uint32_t features = 0;  // ops::kServerFeature* (0 from older servers)
  };
  CUresult SayHello(Hello* out);
  // The device list of a welcome (hello or resume reply): u32 count, then
  // each DeviceInfo. False when malformed or longer than kMaxDevices.
  static constexpr uint32_t kMaxDevices = 64;
  static bool ReadDeviceList(wire::Reader& r, std::vector<ops::DeviceInfo>* out);
  // When the server offers shared memory and runs on this kernel (same host
  // or a container on it), moves to a new session over shm:// (FLYT_SHM=off: never).
  void MoveToSharedMemory(Hello* hello);
  CUresult SendLocked(const wire::FrameHeader& h, const wire::Writer& req, const void* bulk,
                      size_t bulk_len);
  CUresult FlushLocked();
  // Sends iov[0..n) as one message (its first entry the queued frames, if any), counts
  // it, and empties the queue; a failure marks the connection lost.
  CUresult SendMessageLocked(iovec* iov, int n);
  // The connection failed (`during`: the call that noticed, or null): every later remote call
  // fails with CUDA_ERROR_DEVICE_UNAVAILABLE; says so in the log once, with what to do.
  CUresult MarkLostLocked(const char* during, const std::string& why);
  CUresult SyncContextLocked();
  // Call without the callback-channel check: managed memory's hooks around it.
  CUresult CallManaged(const char* name, uint16_t op, const wire::Writer& req, ReplySink sink,
                       uint16_t flags);
  CUresult CallUnhooked(const char* name, uint16_t op, const wire::Writer& req, ReplySink sink,
                        uint16_t flags);
  // The same with mu_ held (the caller's); t0_ns: when the call began, for FLYT_TRACE.
  CUresult CallLocked(const char* name, uint16_t op, const wire::Writer& req, ReplySink sink,
                      uint16_t flags, uint64_t t0_ns);
  // Calls and posts so far (under mu_): changes with every one of them.
  uint64_t CallsLocked() const { return sync_calls_.load() + async_calls_.load(); }
  // Appends a small no-reply frame to the queue.
  void QueueLocked(uint16_t op, const void* payload, uint32_t n);
  // Receives the reply to call `id` (device output frames before it go to
  // stdout); on failure the connection is marked broken.
  CUresult ReceiveStagedLocked(const char* name, const ReplySink& sink);
  CUresult ReceiveReplyLocked(const char* name, uint64_t id, ReplySink sink,
                              wire::FrameHeader* out);
  // Fetches the device inventory again after the server said the tenant's
  // share changed (wire::kReplyConfigChanged).
  void RefreshDevicesLocked();
  void ServeCallbacks(std::shared_ptr<transport::Connection> conn, uint64_t generation);
  // Stores a new device inventory (same device count) where other threads
  // read it without a lock.
  void UpdateDevicesLocked(const std::vector<ops::DeviceInfo>& devices);
  // --- the session moves (client/session_move.cc)
  // After a reply with wire::kReplyMoveWanted: tells the server that every
  // call sent is answered (ops::kOpPark) and goes where its reply says.
  void ParkLocked();
  // Continues the session at `where` (ops::kOpResume with `key`), asking
  // again until `deadline_ms` while the session is not there yet.
  void ResumeLocked(const std::string& where, const uint64_t key[2], int deadline_ms);
  bool parking_ = false;     // under mu_
  bool park_again_ = false;  // under mu_: asked to park while parking
  void RunHostFunc(uint64_t id, bool persistent);
  void TraceCall(const char* name, const char* cls, uint64_t t0_ns);

  // --- several servers (client/multi_server.cc)
  // Connects this link to server_ and shakes hands; fills devices_ etc.
  CUresult Open();
  // Set once by Init when the process has several servers.
  static inline bool several_ = false;
  // The peers' links (server k at peers_[k-1]), made by Init, never destroyed.
  std::vector<Client*> peers_;
  std::vector<int> dev_server_, dev_local_;  // by global ordinal (empty: one server)
  int index_ = 0;                            // this link's server
  bool member_ = false;                      // a link of several (contexts are translated)
  // The server's own handle of a context of this link made current last by
  // this link, sent when the calling thread's context belongs to another server.
  CUcontext fallback_ctx_ = nullptr;  // under mu_
  // The host another server dials for a copy to this one (the host this
  // process named for it; 127.0.0.1 for a server on this host's sockets).
  std::string dial_host_;
  bool tls_link_ = false;  // this process named the server with tls:// (before any move to shm)
  // Where a call goes with several servers: its server, or -(CUresult) when it
  // is refused (a call not served yet for a later server's GPU: logged once).
  int RouteCall(const char* name, uint16_t op, const wire::Writer& req);
  // Opens the links to servers 1.. of `list` and merges their devices.
  CUresult OpenPeers(const std::vector<std::string>& list);
  // The server made `raw` (its own handle) current (primary retain).
  void NoteServerMadeCurrent(uint64_t raw);

  std::mutex mu_;  // the connection, the queue, call ids
  std::unique_ptr<transport::Connection> conn_;
  // Counts the connections conn_ has had (under mu_): what one-sided registrations
  // belong to (a session that moved has a new connection and registers again).
  std::atomic<uint64_t> conn_gen_{1};
  // One-sided copies (client/rma.cc): registrations one at a time (before mu_).
  std::mutex rma_mu_;
  // The staging area of device-to-host copies (client/staged_copy.cc); stage_mu_ is
  // held for a whole staged copy (before mu_), so one copy at a time uses the area.
  std::mutex stage_mu_;
  struct StageArea {
    uint8_t* base = nullptr;  // our mapping; nullptr: none on this connection
    size_t chunk = 0;
    unsigned slots = 0;
    uint64_t server_addr = 0;
    uint64_t gen = 0;  // the connection generation it was shared on (0: never tried)
  } stage_;
  std::atomic<uint32_t> server_features_{0};  // ops::kServerFeature*
  bool rma_enabled_ = false;                  // FLYT_RMA is not "off" and the address is ucx://
  size_t rma_min_bytes_ = 64 << 10;           // FLYT_RMA_MIN_BYTES
  uint64_t rma_attached_gen_ = 0;             // under mu_: the server has our memory's address
  std::atomic<uint64_t> rma_refused_gen_{0};  // written under mu_: the server or transport said no
  std::vector<uint8_t> queue_;
  uint64_t next_call_ = 1;
  // The id of an app's call, announced to the profiler (common/profiler_abi.h).
  uint64_t NextAppCallIdLocked();
  CUresult broken_ = CUDA_SUCCESS;  // once set, every remote call fails with it
  std::string server_;
  std::string token_;  // sent in every handshake
  transport::Address address_;
  transport::Liveness liveness_;
  uint64_t session_id_ = 0;
  uint64_t session_secret_ = 0;
  CUcontext sent_ctx_ = nullptr;
  CUstreamCaptureMode sent_capture_mode_ = CU_STREAM_CAPTURE_MODE_GLOBAL;
  // Written under mu_, read by Stats() from any thread; under mu_ their sum
  // (CallsLocked) numbers every call and post.
  std::atomic<uint64_t> sync_calls_{0};
  std::atomic<uint64_t> async_calls_{0};
  std::atomic<uint64_t> sends_{0};
  std::atomic<int> active_captures_{0};
  struct Drained {
    bool valid = false;
    uint64_t stream = 0;
    uint64_t seq = 0;
  } drained_;                        // under mu_
  bool count_calls_ = false;         // FLYT_CALL_COUNTS=1, read once by Init()
  uint64_t last_send_ns_ = 0;        // under mu_
  int reply_spin_us_ = 1000;         // FLYT_SHM_REPLY_SPIN_US
  int socket_spin_us_ = 200;         // FLYT_SOCKET_SPIN_US
  uint64_t reply_spin_gen_ = 0;      // under mu_: the connection generation it was set for
  uint64_t flush_after_ns_ = 20000;  // FLYT_FLUSH_US
  // Without FLYT_FLUSH_US, queued calls also wait until the time since the last send is
  // kSendCostShare times what a send costs this thread (an average, under mu_), so that
  // sending stays a small part of a paced caller's time on a transport whose sends are
  // dear (a TCP send is a system call through the whole network stack).
  bool flush_adaptive_ = true;
  uint64_t send_cost_ns_ = 0;
  std::unordered_map<const char*, uint64_t> sync_by_name_, async_by_name_;  // under mu_

  std::mutex callback_mu_;  // the callback channel and the queued host functions
  bool callback_channel_ = false;
  std::atomic<bool> callback_wanted_{false};              // open it after the next answered call
  std::shared_ptr<transport::Connection> callback_conn_;  // the live one
  uint64_t callback_generation_ = 0;  // a moved session's old channel ends quietly
  uint64_t next_host_func_ = 1;
  struct HostFunc {
    std::function<void()> fn;
    uint64_t stream;
  };
  std::unordered_map<uint64_t, HostFunc> host_funcs_;  // queued, by callback id
  std::unordered_map<uint64_t, int> host_funcs_per_stream_;
  std::condition_variable host_funcs_cv_;

  std::once_flag init_once_;
  bool init_done_ = false;
  CUresult init_rc_ = CUDA_ERROR_NOT_INITIALIZED;
  int driver_version_ = 0;
  std::vector<ops::DeviceInfo> devices_;

  std::mutex state_mu_;  // everything below
  struct Primary {
    CUcontext ctx = nullptr;
    int refs = 0;
    unsigned flags = 0;
    // Bits the driver keeps in an active primary context's flags beyond those
    // asked for (cuCtxGetFlags), learnt from the server once.
    unsigned driver_bits = 0;
    bool driver_bits_known = false;
  };
  std::vector<Primary> primaries_;
  std::unordered_map<CUcontext, CreatedContext> created_contexts_;  // cuCtxCreate
  uint64_t next_context_id_ = 0;  // ids after the primaries' (1..device count)
  std::map<uint64_t, std::pair<uint64_t, bool>> device_ranges_;  // base -> size, reserved
  // base -> the context current at its allocation, and that context's device.
  std::map<uint64_t, std::pair<CUcontext, int>> range_owner_;
  std::map<uintptr_t, HostBuffer> host_buffers_;  // by base
  std::atomic<int64_t> unmapped_pinned_{0};       // host_buffers_ without a device pointer
  std::atomic<uint64_t> pinned_lo_{UINT64_MAX}, pinned_hi_{0};  // all buffers ever held
  // Virtual memory (client/api_vmm.cc).
  struct VmmReservation {
    uint64_t size = 0;
    bool held = false;  // this process holds the host VA (HoldAddressRange)
    int server = 0;     // the server that reserved it (several servers)
  };
  std::map<uint64_t, VmmReservation> vmm_reserved_;         // by base
  std::map<uint64_t, uint64_t> vmm_mapped_;                 // base -> size
  std::unordered_map<uint64_t, uint32_t> vmm_handle_refs_;  // handle -> app's references
  void ForgetVmmLocked();  // cudaDeviceReset: the server released it all
  bool FindMappedLocked(uint64_t p, uint64_t n, uint64_t* base, uint64_t* size);
  std::unordered_map<uint64_t, std::shared_ptr<const FuncInfo>> funcs_;
  std::unordered_map<uint64_t, ImageInfo> images_;
  std::unordered_map<uint64_t, int> max_dynamic_shared_;  // by the root of its handles
  std::unordered_map<uint64_t, uint64_t> kernel_link_;    // a handle -> its root's way

  friend void AfterForkInChild();
};

// Maps [base, base+size) PROT_NONE in this process if it is free, so that no
// host memory lands on the GPU's addresses; true when it now holds the range
// (munmap it when the GPU range goes).
bool HoldAddressRange(uint64_t base, uint64_t size);

// A sealed memfd of `bytes` mapped here and shared with the server, which maps it and
// registers it with the driver (kOpHostShare; client/api_memory.cc).
// CUDA_ERROR_NOT_SUPPORTED: this connection cannot share memory. `name` names the memfd
// (/proc/PID/maps shows it).
CUresult AllocSharedHost(size_t bytes, unsigned flags, Client::HostBuffer* b,
                         const char* name = "flyt-pinned");
// Closes the memfd a shared buffer kept for a move (its buffer goes).
void ForgetShareFd(Client::HostBuffer* b);

// A global of loaded code that the server said is a __managed__ variable
// (wire::kReplyManaged): maps the host side of its block (client/api_managed.cc).
CUresult MapManagedGlobal(CUdeviceptr p, uint64_t image);

// The GPU (ordinal) of the VMM mapping holding `p` (cuMemMap of a handle this
// process made, retained or imported); false when not known (client/api_vmm.cc).
bool VmmMappedDevice(uint64_t p, int* device);

// True when `base` is memory this process opened with cuIpcOpenMemHandle and
// has not closed (client/api_ipc.cc): it is freed with cuIpcCloseMemHandle only.
bool IsIpcMapping(uint64_t base);

// Flyt's libcupti's hook for code images loaded (common/profiler_abi.h), or null.
extern std::atomic<void (*)(uint64_t start_ns, uint64_t end_ns)> g_module_load_hook;

// A kernel or function with its parameter layout, fetched from the server if
// not known yet (the first launch: the server's driver loads the kernel then,
// as lazy loading does natively). Null when the handle is unknown or the
// layout cannot be had (`why`, if given: the driver's answer).
std::shared_ptr<const FuncInfo> FuncLayout(uint64_t func, CUresult* why = nullptr);
// Appends a launch's parameter block (blob) built from kernelParams or extra.
CUresult PackKernelParams(const FuncInfo& info, void** params, void** extra, wire::Writer& w);
// Pinned host memory reached through its host address (natively every pinned buffer is the
// GPU's on a UVA system): the buffer holding `p`, if it has no GPU mapping yet, is mapped
// where it is, as cuMemHostGetDevicePointer maps it (client/api_memory.cc).
void MapPinnedIfUnmapped(const char* name, uint64_t p);

// The calling thread's stream-capture mode (cuThreadExchangeStreamCaptureMode).
CUstreamCaptureMode CurrentCaptureMode();
void SetCaptureMode(CUstreamCaptureMode mode);

// Reads a kOpLoadImage-style function list (u32 n, then per function u64
// handle, name, parameter layout) into `fns` (client/api_code.cc).
bool ReadFunctionList(wire::Reader& r, bool is_kernel,
                      std::vector<std::pair<uint64_t, FuncInfo>>* fns);

// Kernel nodes built by hand (client/api_driver_misc.cc): whether the app last
// gave the node its arguments through `extra` (cuGraphKernelNodeGetParams
// answers in the same form, as natively).
void NoteKernelNodeArgs(CUgraphNode node, bool through_extra);
// Whether a kernel node's arguments last came through `extra`.
bool KernelNodeThroughExtra(CUgraphNode node);
// cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) on the device range
// at `base`, for cuPointerGetAttribute; forgotten when the range goes.
bool SyncMemops(uint64_t base);
void ForgetSyncMemops(uint64_t base);

// Host nodes of graphs (client/api_graph_nodes.cc): the function and data the
// app gave for a callback id, for cuGraphHostNodeGetParams.
void NoteGraphHostNode(uint64_t id, CUhostFn fn, void* data);
bool FindGraphHostNode(uint64_t id, CUhostFn* fn, void** data);

// The calling thread's current context (cuCtxGetCurrent).
CUcontext CurrentContext();
void SetCurrentContext(CUcontext ctx);

// Several servers (client/multi_server.cc): a library's image, kept to load it
// on another server when one of its kernels is first used there; its kernel's
// handle on `server` (0: none); the image loaded on the calling thread's route
// (client/api_code.cc).
void NoteLibraryImage(uint64_t library, const void* bytes, size_t n);
void ForgetLibraryImage(uint64_t library);
uint64_t KernelOnServer(uint64_t kernel, int server);
// A function handle as `server` knows it: itself when it is that server's, a
// library kernel's copy there (loaded on first use), else 0 (a module's function
// of another server).
uint64_t FunctionOnServer(uint64_t f, int server);
// A CUfunction argument as the driver reads it: a CUkernel passed as a function
// means the current context's function of that kernel, i.e. its copy on the
// current context's server. Anything else, and every call with one server,
// is unchanged.
CUfunction FunctionHere(CUfunction f);
uint64_t LibraryOnServer(uint64_t library, int server);
// Why the calling thread's last KernelOnServer/FunctionOnServer gave 0:
// CUDA_ERROR_NOT_SUPPORTED for a library with __managed__ variables (one copy
// per process natively), else CUDA_ERROR_INVALID_HANDLE.
CUresult NoCopyError();
// A call whose arguments belong to GPUs of two servers that is not served yet:
// its name logged once, CUDA_ERROR_NOT_SUPPORTED.
CUresult RefuseAcrossServers(const char* name);
CUresult LoadImageOn(const void* image, bool library, uint64_t* handle);
// A GPU's UUID as this process shows it: a later server's GPU whose UUID an
// earlier one in the list already has (two servers on one GPU) gets a UUID of
// its own, one byte changed, so CUDA and NVML show distinct devices alike.
// `earlier`: the UUIDs shown for the GPUs before it (16 bytes each).
void DistinctUuid(uint8_t uuid[16], int server, const std::vector<const uint8_t*>& earlier);

// Which arguments of generic op `op` are device pointers (kind 0: CUdeviceptr),
// device ordinals (1: CUdevice) or device ordinals it answers (2: CUdevice*): a
// bit per argument (generated from cuda.h).
uint32_t GenericArgMask(uint16_t op, int kind);

// With several servers: where a generic call goes, from its handles, device
// ordinals and device pointers (client/multi_server.cc). -1: the current
// context's server; -2: its arguments name two servers (`other` is the second).
struct ArgRoute {
  int server = -1;
  int other = -1;
};
void RouteArg(ArgRoute* route, int server);
// A generic call whose arguments name two servers: the few that have an
// answer (peer attributes, a stream waiting for another server's event,
// copies between servers) get it; every other one is refused once in the log.
CUresult ForwardAcross(const char* name, uint16_t op, const ArgRoute& route, const uint64_t* values,
                       size_t n);
// Several servers: the server of a hand-built graph op's handles (graphs,
// nodes, executable graphs, contexts, events; 0 values ignored): -1 with one
// server or none tagged (the current context's), -2 when they name two servers.
int GraphServer(std::initializer_list<uint64_t> handles, const CUgraphNode* deps = nullptr,
                size_t ndeps = 0);
// While it lives, the calling thread's hand-built graph ops (kOpGraph*), whose
// handles its caller sent without their tags, go to `server` (-1: no change,
// as with one server); a graph op outside one is refused for a later server.
class GraphRoute {
 public:
  explicit GraphRoute(int server);
  ~GraphRoute();
  GraphRoute(const GraphRoute&) = delete;
  GraphRoute& operator=(const GraphRoute&) = delete;

 private:
  Client::RouteScope route_;
  bool saved_;
  bool set_;
};
// Stream memory operations (client/api_stream_memops.cc): the memory a batch entry
// names (0: none, a flush or barrier); with several servers, the server operations
// on `stream` touching `addresses` go to (the stream's, a default stream's the
// current context's), -2 when one is another server's memory, -1 with one server.
uint64_t MemOpAddress(const CUstreamBatchMemOpParams& p);
int StreamMemOpServer(CUstream stream, const uint64_t* addresses, size_t n);
// A 2D/3D copy between device memory of two servers (both sides
// CU_MEMORYTYPE_DEVICE): its rows, or its slices when the rows are packed,
// each copied server to server (Client::CopyAcrossServers).
CUresult Copy3DAcrossServers(const char* name, const CUDA_MEMCPY3D& d, int dst_server,
                             int src_server, CUstream stream, bool async, bool pt);

namespace detail {
template <typename T>
uint64_t ArgBits(T v) {
  if constexpr (marshal::kIsHandle<T>) {
    return reinterpret_cast<uintptr_t>(v);
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    return static_cast<uint64_t>(v);  // enums too: ForwardAcross passes attributes on
  } else if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<uintptr_t>(v);  // an output (ForwardAcross answers some)
  } else {
    return 0;
  }
}

// One argument on the wire of server `server`: handles without their tag,
// device ordinals as that server's.
template <typename T>
void EncodeRouted(wire::Writer& w, T v, bool device_ordinal) {
  if constexpr (marshal::kIsHandle<T>) {
    w.Put<uint64_t>(Client::Untag(reinterpret_cast<uintptr_t>(v)));
  } else if constexpr (std::is_integral_v<T>) {
    if (device_ordinal) {
      w.Put(static_cast<T>(Client::Get().DeviceLocal(static_cast<int>(v))));
    } else {
      marshal::EncodeArg(w, v);
    }
  } else {
    marshal::EncodeArg(w, v);
  }
}

// An output: a handle the server made gets the server's tag, a device ordinal
// it answers is the process's.
template <typename T>
bool DecodeRouted(wire::Reader& r, T v, int server, bool device_ordinal) {
  if (!marshal::DecodeOut(r, v)) return false;
  if constexpr (std::is_same_v<T, CUdevice*>) {
    if (device_ordinal && v != nullptr) *v = Client::Get().GlobalDevice(server, *v);
  }
  if constexpr (std::is_pointer_v<T>) {
    using P = std::remove_cv_t<std::remove_pointer_t<T>>;
    if constexpr (marshal::kIsHandle<P>) {
      if (v != nullptr) *v = Client::TagHandle(*v, server);
    }
  }
  return true;
}

// Sends a generic call's marshalled arguments: queued (ASYNC) or answered (SYNC), whose
// reply `decode_outs` reads into the output arguments.
template <uint16_t Op, bool Sync, bool PerThread, typename DecodeOuts>
CUresult SendForwarded(Client& c, const char* name, const wire::Writer& w,
                       DecodeOuts&& decode_outs) {
  uint16_t flags = PerThread ? wire::kFlagPerThread : 0;
  if constexpr (!Sync) {
    return c.Post(name, Op, w, flags);
  } else {
    std::vector<uint8_t> reply;
    CUresult rc = c.Call(name, Op, w, ReplySink{&reply}, flags);
    if (rc != CUDA_SUCCESS) return rc;
    wire::Reader r(reply.data(), reply.size());
    return decode_outs(r) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
  }
}

// An argument of a generic call with several servers: a CUfunction that is a
// library kernel becomes the current server's copy (FunctionHere).
template <typename T>
T HereArg(T v) {
  if constexpr (std::is_same_v<T, CUfunction>) {
    return FunctionHere(v);
  } else {
    return v;
  }
}

template <uint16_t Op, bool Sync, bool PerThread, typename... Args, size_t... I>
CUresult ForwardMultiHere(Client& c, const char* name, std::index_sequence<I...>, Args... args) {
  const uint64_t values[] = {ArgBits(args)..., 0};
  const bool handles[] = {marshal::kIsHandle<Args>..., false};
  const uint32_t ptrs = GenericArgMask(Op, 0), devs = GenericArgMask(Op, 1);
  [[maybe_unused]] const uint32_t dev_outs = GenericArgMask(Op, 2);
  ArgRoute route;
  // Peer access acts on the current context; the argument is the peer's.
  if constexpr (Op == 284 || Op == 285) RouteArg(&route, c.RouteNow());
  for (size_t i = 0; i < sizeof...(Args); ++i) {
    if (handles[i] && values[i] > 2) {  // not null, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
      RouteArg(&route, Client::TagOf(values[i]));
    } else if ((devs >> i) & 1u) {
      RouteArg(&route, c.DeviceServer(static_cast<int>(values[i])));
    } else if ((ptrs >> i) & 1u) {
      int s = c.ServerOfPointer(values[i]);
      if (s >= 0) RouteArg(&route, s);
    }
  }
  if (route.server == -2) return ForwardAcross(name, Op, route, values, sizeof...(Args));
  if (route.server >= c.server_count()) return CUDA_ERROR_INVALID_HANDLE;
  Client::RouteScope scope(route.server);
  const int server = c.RouteNow();
  wire::Writer w;
  (EncodeRouted(w, args, ((devs >> I) & 1u) != 0), ...);
  return SendForwarded<Op, Sync, PerThread>(c, name, w, [&](wire::Reader& r) {
    return (DecodeRouted(r, args, server, ((dev_outs >> I) & 1u) != 0) && ...);
  });
}

template <uint16_t Op, bool Sync, bool PerThread, typename... Args, size_t... I>
CUresult ForwardMulti(Client& c, const char* name, std::index_sequence<I...> seq, Args... args) {
  return ForwardMultiHere<Op, Sync, PerThread>(c, name, seq, HereArg(args)...);
}
}  // namespace detail

// A generic remoted call: arguments marshalled from the prototype (protocol/marshal.h).
template <uint16_t Op, bool Sync, bool PerThread, typename... Args>
CUresult Forward(const char* name, Args... args) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (c.multi()) [[unlikely]]
    return detail::ForwardMulti<Op, Sync, PerThread>(c, name, std::index_sequence_for<Args...>{},
                                                     args...);
  wire::Writer w;
  (marshal::EncodeArg(w, args), ...);
  return detail::SendForwarded<Op, Sync, PerThread>(
      c, name, w, [&](wire::Reader& r) { return (marshal::DecodeOut(r, args) && ...); });
}

}  // namespace flyt::client
