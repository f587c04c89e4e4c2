// Flyt's libcupti.so.13: CUPTI's activity API for programs whose GPU is remote.
//
// Owns: the activity kinds the app enabled, its buffer callbacks, its external
// correlation stacks (per thread), and the records not yet handed to it. GPU
// records (kernels, copies, memsets) come from the server's CUPTI through
// libcuda's profiler table (common/profiler_abi.h); their correlation id is the
// id of the Flyt call that issued the work, and each such call, made while the
// app had pushed external ids, yields CUPTI's external correlation records.
// The callback API's runtime domain and RUNTIME records come from cudart's own
// reports of each runtime call (libcuda's tools-callback table): while they are
// on, each runtime call gets a correlation id that the driver calls it makes, and
// the GPU work they issue, share, as natively. The driver domain and DRIVER
// records come from libcuda's reports of each driver call the app (or cudart)
// makes (the profiler table's driver hook); a driver call outside any runtime
// call gets an id of its own, shared by the GPU work it issues.
// Timestamps are moved onto this host's clock (or the app's timestamp callback).
// Must not call into libcuda while holding its lock (libcuda calls the call
// hook under its own), nor write to stdout.
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/cupti_records.h"
#include "common/profiler_abi.h"
#include "cupti_cbid_names.inc"  // kRuntimeCallbackNames, kDriverCallbackNames

#define FLYT_CUPTI_EXPORT extern "C" __attribute__((visibility("default")))

namespace flyt::cupti {

void MaybeHoldBuffer();

namespace {

using profiler::Table;

// A line to stderr when FLYT_LOG asks for it: any level but "off", or only
// "debug" for debug lines (what a flush handed over, on which clock).
void VLog(bool debug, const char* fmt, va_list ap) {
  const char* level = std::getenv("FLYT_LOG");
  if (level == nullptr || std::strcmp(level, "off") == 0) return;
  if (debug && std::strcmp(level, "debug") != 0) return;
  char line[512];
  std::vsnprintf(line, sizeof line, fmt, ap);
  std::fprintf(stderr, "flyt-cupti: %s\n", line);
}

void Log(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VLog(false, fmt, ap);
  va_end(ap);
}

void Debug(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VLog(true, fmt, ap);
  va_end(ap);
}

// FLYT_LOG=debug, read once: for the per-call lines below.
bool Debugging() {
  static const bool on = [] {
    const char* level = std::getenv("FLYT_LOG");
    return level != nullptr && std::strcmp(level, "debug") == 0;
  }();
  return on;
}

void LogOnce(const std::string& key, const char* fmt, ...) {
  static std::mutex mu;
  static auto* seen = new std::set<std::string>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen->insert(key).second) return;
  }
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  Log("%s", line);
}

using cupti_records::RealtimeNs;

struct State {
  std::mutex mu;
  std::set<int> enabled;        // CUpti_ActivityKind the app enabled
  uint32_t gpu_kinds = 0;       // 1 << ops::GpuActivityKind the server records
  bool server_started = false;  // the server may hold records: drain at each flush
  // The record kind of kernels: the one the app enabled last.
  CUpti_ActivityKind kernel_kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  int64_t server_offset = 0;  // add to a server timestamp: this host's realtime
  CUpti_BuffersCallbackRequestFunc requested = nullptr;
  CUpti_BuffersCallbackCompleteFunc completed = nullptr;
  CUpti_TimestampCallbackFunc timestamp = nullptr;
  // A reading of CLOCK_REALTIME and of the app's timestamp callback at the
  // same moment, and the callback's ticks per nanosecond since (its clock may
  // be a TSC: Kineto's is).
  uint64_t anchor_realtime = 0, anchor_ticks = 0;
  double ticks_per_ns = 1.0;
  std::vector<std::vector<uint8_t>> pending;
  // The buffer the app gave for the records to come: CUPTI asks for one as
  // soon as it records, and Kineto only flushes when it has given one out.
  // Written with delivery_mu held; delivery_mu is taken before mu.
  cupti_records::AppBuffer held;
  std::mutex delivery_mu;       // the app's buffer callbacks run one at a time
  std::set<std::string> names;  // kernel names: valid for the process's life
  uint64_t dropped = 0;
  CUptiResult last_error = CUPTI_SUCCESS;
  // The callback API: one subscriber, as CUPTI allows, and the runtime and driver
  // calls it asked for.
  CUpti_CallbackFunc subscriber = nullptr;
  void* subscriber_data = nullptr;
  std::string subscriber_name;  // cuptiSubscribe_v2's
  std::vector<bool> runtime_callbacks = std::vector<bool>(CUPTI_RUNTIME_TRACE_CBID_SIZE);
  std::vector<bool> driver_callbacks = std::vector<bool>(CUPTI_DRIVER_TRACE_CBID_SIZE);
  // Runtime calls left out of RUNTIME records (cuptiActivityEnableRuntimeApi).
  std::vector<bool> runtime_records_off = std::vector<bool>(CUPTI_RUNTIME_TRACE_CBID_SIZE);
  // Driver calls left out of DRIVER records (cuptiActivityEnableDriverApi).
  std::vector<bool> driver_records_off = std::vector<bool>(CUPTI_DRIVER_TRACE_CBID_SIZE);
  bool runtime_reporting = false;  // cudart reports its calls to RuntimeCall
  bool driver_reporting = false;   // libcuda reports the app's driver calls to DriverCall
  // Flyt call id -> correlation id, while runtime or driver calls are reported.
  std::unordered_map<uint64_t, uint32_t> call_correlation;
  std::map<CUcontext, uint32_t> context_uids;
  CUpti_ActivityThreadIdType thread_id_type = CUPTI_ACTIVITY_THREAD_ID_TYPE_DEFAULT;
};
State& S() {
  static State* s = new State;  // never destroyed: the app may flush at exit
  return *s;
}
std::atomic<bool> g_correlate{false};
// The external correlation stacks of a thread. Trivially destructible: libcuda
// calls OnCall during the process's exit, after thread-local destructors ran.
constexpr int kExternalKinds = CUPTI_EXTERNAL_CORRELATION_KIND_SIZE;
constexpr uint32_t kMaxExternalDepth = 64;
struct ExternalStacks {
  uint64_t ids[kExternalKinds][kMaxExternalDepth];
  uint32_t depth[kExternalKinds];
};
thread_local ExternalStacks t_external;
// The runtime calls of a thread under way (a runtime call may call another).
constexpr uint32_t kMaxRuntimeDepth = 16;
struct RuntimeFrames {
  uint32_t correlation[kMaxRuntimeDepth];
  uint64_t start[kMaxRuntimeDepth];
  uint32_t depth;
  bool in_callback;  // the subscriber's own calls are not reported
};
thread_local RuntimeFrames t_runtime;
// The driver calls of a thread under way: the app's call, and calls its callbacks made.
constexpr uint32_t kMaxDriverDepth = 16;
struct DriverFrames {
  uint32_t correlation[kMaxDriverDepth];
  uint32_t depth;
  // Driver-domain callbacks running on this thread. A callback's own driver calls are
  // reported (as natively); those of a callback of such a call are not, which bounds
  // the recursion of a subscriber that calls the driver from every callback.
  uint32_t in_callback;
};
thread_local DriverFrames t_driver;
std::atomic<uint32_t> g_next_correlation{0};
// The app has enabled kinds and Flyt holds no buffer of its: the next call that
// records asks for one (MaybeHoldBuffer), as CUPTI asks when it first records.
std::atomic<bool> g_want_buffer{false};

// The correlation id of the runtime or driver call this thread is in, or 0.
uint32_t CurrentCorrelation() {
  if (t_driver.depth > 0)
    return t_driver.correlation[std::min(t_driver.depth, kMaxDriverDepth) - 1];
  if (t_runtime.depth > 0)
    return t_runtime.correlation[std::min(t_runtime.depth, kMaxRuntimeDepth) - 1];
  return 0;
}

const Table* Driver() {
  static const Table* table = [] {
    using GetTable = CUresult (*)(const void**, const CUuuid*);
    // The app's cudart may have opened libcuda.so.1 locally: open it (again).
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_NOW);
    auto get =
        driver != nullptr ? reinterpret_cast<GetTable>(dlsym(driver, "cuGetExportTable")) : nullptr;
    const void* t = nullptr;
    CUuuid id;
    std::memcpy(id.bytes, profiler::kTableUuid, sizeof id.bytes);
    if (get == nullptr || get(&t, &id) != CUDA_SUCCESS || t == nullptr ||
        static_cast<const Table*>(t)->size < profiler::kTableSizeV1) {
      Log("this libcupti is Flyt's and needs Flyt's libcuda.so.1 (run the program with "
          "`flyt run`); GPU activity is not recorded");
      return static_cast<const Table*>(nullptr);
    }
    return static_cast<const Table*>(t);
  }();
  return table;
}

template <typename T>
void PushLocked(const T& rec) {
  cupti_records::Append(&S().pending, rec);
}

// This host's time for a timestamp of the server's clock, on the app's
// timestamp callback's scale when it registered one.
uint64_t LocalTimeLocked(uint64_t server_ns) {
  State& s = S();
  uint64_t t = static_cast<uint64_t>(static_cast<int64_t>(server_ns) + s.server_offset);
  if (s.timestamp == nullptr) return t;
  double since = static_cast<double>(static_cast<int64_t>(t - s.anchor_realtime));
  return s.anchor_ticks + static_cast<uint64_t>(static_cast<int64_t>(since * s.ticks_per_ns));
}

// Re-reads both clocks; the rate comes from the first reading and this one.
void CalibrateLocked() {
  State& s = S();
  if (s.timestamp == nullptr) return;
  uint64_t rt = RealtimeNs(), ticks = s.timestamp();
  if (s.anchor_realtime == 0) {
    s.anchor_realtime = rt;
    s.anchor_ticks = ticks;
    return;
  }
  if (rt - s.anchor_realtime > 1000000)
    s.ticks_per_ns =
        static_cast<double>(ticks - s.anchor_ticks) / static_cast<double>(rt - s.anchor_realtime);
}

// The external correlation records of one correlation id: the id on top of
// each stack the app pushed.
void EmitExternalLocked(uint32_t correlation) {
  for (int kind = 0; kind < kExternalKinds; ++kind) {
    uint32_t depth = t_external.depth[kind];
    if (depth == 0) continue;
    CUpti_ActivityExternalCorrelation e{};
    e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    e.externalKind = static_cast<CUpti_ExternalCorrelationKind>(kind);
    e.externalId = t_external.ids[kind][depth - 1];
    e.correlationId = correlation;
    PushLocked(e);
  }
}

// libcuda's hook: an app call is about to go to the server. While runtime or
// driver calls are reported, the call takes the correlation id of the driver or
// runtime call it is part of (whose external records went out at its enter), or
// one of its own.
void OnCall(uint64_t call_id) {
  State& s = S();
  bool correlate = g_correlate.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.runtime_reporting && !s.driver_reporting) {
    if (correlate) EmitExternalLocked(static_cast<uint32_t>(call_id));
    return;
  }
  uint32_t correlation = CurrentCorrelation();  // ids start at 1: 0 is none
  if (correlation == 0) {
    correlation = ++g_next_correlation;
    if (correlate) EmitExternalLocked(correlation);
  }
  if (s.call_correlation.size() >= (1u << 20)) s.call_correlation.clear();  // bounded
  s.call_correlation[call_id] = correlation;
  if (Debugging())
    Debug("call %llu: correlation %u (runtime depth %u, driver depth %u)",
          static_cast<unsigned long long>(call_id), correlation, t_runtime.depth, t_driver.depth);
}

// The correlation id of the GPU work a Flyt call issued.
uint32_t CorrelationLocked(uint64_t call_id) {
  auto it = S().call_correlation.find(call_id);
  if (it == S().call_correlation.end() && Debugging())
    Debug("GPU work of call %llu: no correlation id noted for that call",
          static_cast<unsigned long long>(call_id));
  return it != S().call_correlation.end() ? it->second : static_cast<uint32_t>(call_id);
}

// The fields every GPU record of CUPTI has, from a server record.
template <typename Record>
void FillCommonLocked(Record* r, const ops::GpuActivity* g) {
  r->start = LocalTimeLocked(g->start_ns);
  r->end = LocalTimeLocked(g->end_ns);
  r->deviceId = g->device;
  r->contextId = g->context;
  r->streamId = g->stream;
  r->correlationId = CorrelationLocked(g->call_id);
  r->graphId = g->graph_id;
}

// One server record as the CUPTI record the app expects. Records of kinds
// disabled since are still delivered, as CUPTI does: the server recorded only
// what was enabled at the time.
void OnRecord(void*, const ops::GpuActivity* g, const char* name) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (g->kind == ops::kActivityKernel) {
    CUpti_ActivityKernel10 k{};
    k.kind = s.kernel_kind;
    FillCommonLocked(&k, g);
    k.completed = k.end;
    k.queued = k.submitted = CUPTI_TIMESTAMP_UNKNOWN;
    k.gridX = g->grid[0], k.gridY = g->grid[1], k.gridZ = g->grid[2];
    k.blockX = g->block[0], k.blockY = g->block[1], k.blockZ = g->block[2];
    k.staticSharedMemory = g->static_smem;
    k.dynamicSharedMemory = g->dynamic_smem;
    k.registersPerThread = static_cast<uint16_t>(g->registers);
    k.name = s.names.insert(name).first->c_str();
    PushLocked(k);
    Debug("kernel record %s: server start %llu, app clock %llu..%llu", name,
          static_cast<unsigned long long>(g->start_ns), static_cast<unsigned long long>(k.start),
          static_cast<unsigned long long>(k.end));
  } else if (g->kind == ops::kActivityMemcpy) {
    CUpti_ActivityMemcpy6 m{};
    m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    FillCommonLocked(&m, g);
    m.copyKind = g->copy_kind;
    m.srcKind = g->src_kind;
    m.dstKind = g->dst_kind;
    m.bytes = g->bytes;
    PushLocked(m);
  } else if (g->kind == ops::kActivityMemset) {
    CUpti_ActivityMemset4 m{};
    m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
    FillCommonLocked(&m, g);
    m.value = g->value;
    m.bytes = g->bytes;
    m.memoryKind = g->src_kind;
    PushLocked(m);
  } else if (g->kind == ops::kActivityOverhead) {
    CUpti_ActivityOverhead3 o{};
    o.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
    o.overheadKind = static_cast<CUpti_ActivityOverheadKind>(g->value);
    o.objectKind = static_cast<CUpti_ActivityObjectKind>(g->copy_kind);
    if (o.objectKind == CUPTI_ACTIVITY_OBJECT_PROCESS ||
        o.objectKind == CUPTI_ACTIVITY_OBJECT_THREAD) {
      // The server worker's process and thread mean nothing here: the work was
      // this process's (its main thread: which of its threads made the call is
      // not kept).
      o.objectId.pt.processId = static_cast<uint32_t>(getpid());
      o.objectId.pt.threadId = static_cast<uint32_t>(getpid());
    } else {
      o.objectId.dcs.deviceId = g->device;
      o.objectId.dcs.contextId = g->context;
      o.objectId.dcs.streamId = g->stream;
    }
    o.start = LocalTimeLocked(g->start_ns);
    o.end = LocalTimeLocked(g->end_ns);
    o.correlationId = g->call_id != 0 ? CorrelationLocked(g->call_id) : 0;
    PushLocked(o);
  }
}

// The server-side kind behind a CUPTI kind, or -1 for kinds answered here.
int GpuKind(CUpti_ActivityKind k) {
  switch (k) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return ops::kActivityKernel;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return ops::kActivityMemcpy;
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return ops::kActivityMemset;
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
      return ops::kActivityOverhead;
    default:
      return -1;
  }
}

// The kinds whose records come from reports of API calls.
bool ApiKind(CUpti_ActivityKind k) {
  return k == CUPTI_ACTIVITY_KIND_RUNTIME || k == CUPTI_ACTIVITY_KIND_DRIVER;
}

CUptiResult Fail(CUptiResult r) {
  S().last_error = r;
  return r;
}

}  // namespace

void RequestRecorded(uint8_t** buffer, size_t* size, size_t* max_records);

// With delivery_mu held: while the app profiles, holds a buffer of the app's
// for the records to come.
void HoldBufferDelivering() {
  State& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.held.data != nullptr || s.enabled.empty() || s.requested == nullptr) return;
  }
  g_want_buffer = false;
  cupti_records::AppBuffer buffer = cupti_records::Request(RequestRecorded);
  std::lock_guard<std::mutex> lock(s.mu);
  s.held = buffer;
}

// At the exit of a reported runtime or driver call, whose record is about to
// be written: holds a buffer of the app's if none is held. CUPTI asks for one
// when it first records (inside the app's call), and Kineto flushes only when
// it has given one out. Not from libcuda's per-call hook (OnCall), which runs
// under the client's lock: the app's callback is not called there. Skipped
// while this or another thread delivers (the app's completion callback may
// call CUDA); the next reported call asks.
void MaybeHoldBuffer() {
  if (!g_want_buffer.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> delivering(S().delivery_mu, std::try_to_lock);
  if (delivering.owns_lock()) HoldBufferDelivering();
}

// Hands the pending records to the app's buffers (cuptiActivityFlushAll),
// the held buffer first, and gives every buffer back.
CUptiResult Deliver() {
  State& s = S();
  std::lock_guard<std::mutex> delivering(s.delivery_mu);
  std::vector<std::vector<uint8_t>> records;
  cupti_records::AppBuffer held;
  CUpti_BuffersCallbackRequestFunc req;
  CUpti_BuffersCallbackCompleteFunc done;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    records.swap(s.pending);
    std::swap(held, s.held);
    req = s.requested;
    done = s.completed;
  }
  CUptiResult rc = CUPTI_SUCCESS;
  if (!records.empty() || held.data != nullptr) {
    if (req == nullptr || done == nullptr) return Fail(CUPTI_ERROR_INVALID_OPERATION);
    bool had_buffer = held.data != nullptr;
    size_t delivered = cupti_records::Deliver(records, held, RequestRecorded, done);
    Debug("delivered %zu of %zu records to the app (%s)", delivered, records.size(),
          had_buffer ? "into the buffer it gave before" : "into buffers asked for now");
    if (delivered < records.size()) {
      std::lock_guard<std::mutex> lock(s.mu);
      s.dropped += records.size() - delivered;
      rc = Fail(CUPTI_ERROR_OUT_OF_MEMORY);
    }
  }
  g_want_buffer = true;
  return rc;
}

// --- runtime calls, as cudart reports them -------------------------------------

// Now on the clock the app's records use.
uint64_t AppNowLocked() {
  State& s = S();
  return s.timestamp != nullptr ? s.timestamp() : RealtimeNs();
}

uint32_t ThreadIdLocked() {
  if (S().thread_id_type == CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM)
    return static_cast<uint32_t>(syscall(SYS_gettid));
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(pthread_self()));
}

// An overhead of this thread's, part of the call it is in (start and end on
// the app's clock).
void PushThreadOverheadLocked(CUpti_ActivityOverheadKind kind, uint64_t start, uint64_t end) {
  CUpti_ActivityOverhead3 o{};
  o.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
  o.overheadKind = kind;
  o.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
  o.objectId.pt.processId = static_cast<uint32_t>(getpid());
  o.objectId.pt.threadId = ThreadIdLocked();
  o.start = start;
  o.end = end;
  o.correlationId = CurrentCorrelation();
  PushLocked(o);
}

// libcuda loaded a code image on this thread (start and end: CLOCK_REALTIME).
// Inside a runtime call that is cudart loading a module the call needs (lazy
// loading): CUPTI reports that as a RUNTIME_TRIGGERED_MODULE_LOADING overhead
// of the call. An image the app loads itself is no overhead.
void OnModuleLoad(uint64_t start_ns, uint64_t end_ns) {
  if (t_runtime.depth == 0) return;
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.enabled.count(CUPTI_ACTIVITY_KIND_OVERHEAD)) return;
  // LocalTimeLocked takes the server's clock: this host's less the offset.
  auto app_time = [&](uint64_t ns) {
    return LocalTimeLocked(static_cast<uint64_t>(static_cast<int64_t>(ns) - s.server_offset));
  };
  PushThreadOverheadLocked(CUPTI_ACTIVITY_OVERHEAD_RUNTIME_TRIGGERED_MODULE_LOADING,
                           app_time(start_ns), app_time(end_ns));
}

// The app's buffer-request callback, timed: CUPTI records the time an app
// spends giving it a buffer as an ACTIVITY_BUFFER_REQUEST overhead.
void RequestRecorded(uint8_t** buffer, size_t* size, size_t* max_records) {
  State& s = S();
  CUpti_BuffersCallbackRequestFunc req;
  uint64_t start, end;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    req = s.requested;
    start = AppNowLocked();
  }
  req(buffer, size, max_records);
  std::lock_guard<std::mutex> lock(s.mu);
  end = AppNowLocked();
  if (s.enabled.count(CUPTI_ACTIVITY_KIND_OVERHEAD))
    PushThreadOverheadLocked(CUPTI_ACTIVITY_OVERHEAD_ACTIVITY_BUFFER_REQUEST, start, end);
}

uint32_t ContextUidLocked(CUcontext ctx) {
  State& s = S();
  auto [it, added] = s.context_uids.emplace(ctx, 0);
  if (added) it->second = static_cast<uint32_t>(s.context_uids.size());
  return it->second;
}

uint32_t ContextUid(CUcontext ctx) {
  std::lock_guard<std::mutex> lock(S().mu);
  return ContextUidLocked(ctx);
}

// One report of cudart's: a runtime call's enter or exit. Hands the subscriber
// its callback and, at the exit, keeps the call's RUNTIME record.
void RuntimeCall(uint32_t cbid, const void* raw) {
  using flyt::profiler::RuntimeCallRecord;
  const auto* rec = static_cast<const RuntimeCallRecord*>(raw);
  if (rec == nullptr || rec->size < sizeof(RuntimeCallRecord) || t_runtime.in_callback) return;
  State& s = S();
  const bool enter = rec->site == CUPTI_API_ENTER;
  if (!enter) MaybeHoldBuffer();  // its RUNTIME record is about to be written
  CUpti_CallbackFunc subscriber = nullptr;
  void* data = nullptr;
  CUpti_CallbackData info{};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    RuntimeFrames& f = t_runtime;
    uint32_t correlation = 0;
    if (enter) {
      correlation = ++g_next_correlation;
      if (f.depth < kMaxRuntimeDepth) {
        f.correlation[f.depth] = correlation;
        f.start[f.depth] = AppNowLocked();
      }
      ++f.depth;
      if (g_correlate.load(std::memory_order_relaxed)) EmitExternalLocked(correlation);
    } else {
      if (f.depth == 0) return;  // reporting was switched on during the call
      uint32_t top = std::min(f.depth, kMaxRuntimeDepth) - 1;
      correlation = f.correlation[top];
      if (s.enabled.count(CUPTI_ACTIVITY_KIND_RUNTIME) != 0 &&
          (cbid >= s.runtime_records_off.size() || !s.runtime_records_off[cbid])) {
        CUpti_ActivityAPI a{};
        a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
        a.cbid = cbid;
        a.start = f.start[top];
        a.end = AppNowLocked();
        a.processId = static_cast<uint32_t>(getpid());
        a.threadId = ThreadIdLocked();
        a.correlationId = correlation;
        a.returnValue =
            rec->return_value != nullptr ? *static_cast<const int*>(rec->return_value) : 0;
        PushLocked(a);
      }
      --f.depth;
    }
    if (s.subscriber != nullptr && cbid < s.runtime_callbacks.size() && s.runtime_callbacks[cbid]) {
      subscriber = s.subscriber;
      data = s.subscriber_data;
      info.callbackSite = enter ? CUPTI_API_ENTER : CUPTI_API_EXIT;
      info.functionName = rec->function_name;
      info.functionParams = rec->params;
      info.functionReturnValue = rec->return_value;
      info.symbolName = rec->symbol_name;
      info.context = rec->context;
      info.contextUid = rec->context_uid;
      info.correlationData = rec->correlation_data;
      info.correlationId = correlation;
    }
  }
  if (subscriber == nullptr) return;
  t_runtime.in_callback = true;
  subscriber(data, CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &info);
  t_runtime.in_callback = false;
}

// One report of libcuda's: a driver call's enter or exit. Hands the subscriber
// its callback and, at the exit, keeps the call's DRIVER record.
void DriverCall(flyt::profiler::DriverCallRecord* rec) {
  if (rec == nullptr || rec->size < sizeof(flyt::profiler::DriverCallRecord)) return;
  State& s = S();
  DriverFrames& f = t_driver;
  const bool enter = rec->site == CUPTI_API_ENTER;
  if (enter) {
    rec->taken = 0;
    if (f.in_callback > 1) return;  // see DriverFrames
  } else if (rec->taken == 0) {
    return;
  } else {
    MaybeHoldBuffer();  // its DRIVER record is about to be written
  }
  const uint32_t cbid = rec->cbid;
  CUpti_CallbackFunc subscriber = nullptr;
  void* data = nullptr;
  CUpti_CallbackData info{};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (enter) {
      uint32_t correlation;
      if (t_runtime.depth > 0) {  // cudart's call, or one a runtime callback made
        correlation = t_runtime.correlation[std::min(t_runtime.depth, kMaxRuntimeDepth) - 1];
      } else {
        correlation = ++g_next_correlation;
        if (g_correlate.load(std::memory_order_relaxed)) EmitExternalLocked(correlation);
      }
      rec->correlation_id = correlation;
      rec->start = AppNowLocked();
      // Inside a runtime call: reported to callbacks, but natively such a call has no
      // DRIVER record (on the H200, the cuLaunchKernel of a cudaLaunchKernel has none,
      // and Kineto keys its events by correlation id, which the runtime record holds).
      rec->taken = t_runtime.depth > 0 ? 2 : 1;
      if (f.depth < kMaxDriverDepth) f.correlation[f.depth] = correlation;
      ++f.depth;
    } else {
      if (f.depth > 0) --f.depth;
      if (rec->taken == 1 && s.enabled.count(CUPTI_ACTIVITY_KIND_DRIVER) != 0 &&
          (cbid >= s.driver_records_off.size() || !s.driver_records_off[cbid])) {
        CUpti_ActivityAPI a{};
        a.kind = CUPTI_ACTIVITY_KIND_DRIVER;
        a.cbid = cbid;
        a.start = rec->start;
        a.end = AppNowLocked();
        a.processId = static_cast<uint32_t>(getpid());
        a.threadId = ThreadIdLocked();
        a.correlationId = rec->correlation_id;
        a.returnValue = rec->return_value != nullptr ? *rec->return_value : CUDA_SUCCESS;
        PushLocked(a);
      }
    }
    if (s.subscriber != nullptr && cbid < s.driver_callbacks.size() && s.driver_callbacks[cbid]) {
      subscriber = s.subscriber;
      data = s.subscriber_data;
      info.callbackSite = enter ? CUPTI_API_ENTER : CUPTI_API_EXIT;
      info.functionName = rec->function_name;
      info.functionParams = rec->params;
      info.functionReturnValue = const_cast<CUresult*>(rec->return_value);
      info.symbolName = rec->symbol_name;
      info.context = rec->context;
      info.contextUid = rec->context != nullptr ? ContextUidLocked(rec->context) : 0;
      info.correlationData = &rec->correlation_data;
      info.correlationId = rec->correlation_id;
    }
  }
  if (subscriber == nullptr) return;
  ++f.in_callback;
  subscriber(data, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &info);
  --f.in_callback;
}

// Switches the reports of one domain's calls on while a subscriber wants its callbacks or
// the app records its activity (DRIVER: libcuda's own calls; RUNTIME: cudart's, through
// the tools-callback table), and off otherwise.
CUptiResult UpdateDomainReporting(bool driver) {
  State& s = S();
  bool on;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const std::vector<bool>& wanted = driver ? s.driver_callbacks : s.runtime_callbacks;
    on = s.enabled.count(driver ? CUPTI_ACTIVITY_KIND_DRIVER : CUPTI_ACTIVITY_KIND_RUNTIME) != 0 ||
         (s.subscriber != nullptr && std::find(wanted.begin(), wanted.end(), true) != wanted.end());
    if (on == (driver ? s.driver_reporting : s.runtime_reporting)) return CUPTI_SUCCESS;
  }
  const Table* t = Driver();
  if (t == nullptr || t->size < (driver ? profiler::kTableSizeDriverHook : sizeof(Table))) {
    LogOnce(driver ? "driver reports" : "runtime reports",
            driver ? "this libcuda.so.1 cannot report driver calls (Flyt's libcuda and libcupti "
                     "of different versions); no driver callbacks or DRIVER records"
                   : "this libcuda.so.1 cannot report runtime calls (Flyt's libcuda and "
                     "libcupti of different versions); no runtime callbacks or records");
    return CUPTI_SUCCESS;
  }
  if (on) t->set_call_hook(OnCall);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    // The call -> correlation map stays when reporting stops: the GPU work of the last
    // calls is drained after that (Kineto disables the kinds, then flushes), and its
    // records need their calls' ids. The map is bounded where it grows (OnCall).
    (driver ? s.driver_reporting : s.runtime_reporting) = on;
  }
  if (driver)
    t->set_driver_hook(on ? DriverCall : nullptr);
  else
    t->set_runtime_hooks(on ? RuntimeCall : nullptr, on ? ContextUid : nullptr);
  return CUPTI_SUCCESS;
}

// Both kinds of report, after a change to what the app asked for.
CUptiResult UpdateReporting() {
  CUptiResult r = UpdateDomainReporting(false);
  CUptiResult d = UpdateDomainReporting(true);
  return r != CUPTI_SUCCESS ? r : d;
}

}  // namespace flyt::cupti

using namespace flyt::cupti;
namespace ops = flyt::ops;

FLYT_CUPTI_EXPORT CUptiResult cuptiGetVersion(uint32_t* version) {
  if (version == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  *version = CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiGetTimestamp(uint64_t* timestamp) {
  if (timestamp == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  auto cb = S().timestamp;
  *timestamp = cb != nullptr ? cb() : RealtimeNs();
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult
cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc fn) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().timestamp = fn;
  S().anchor_realtime = 0;
  S().ticks_per_ns = 1.0;
  CalibrateLocked();
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityRegisterCallbacks(
    CUpti_BuffersCallbackRequestFunc requested, CUpti_BuffersCallbackCompleteFunc completed) {
  if (requested == nullptr || completed == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  {
    std::lock_guard<std::mutex> lock(S().mu);
    S().requested = requested;
    S().completed = completed;
  }
  g_want_buffer = true;
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  State& s = S();
  int gpu = GpuKind(kind);
  if (gpu > 0) {
    const Table* t = Driver();
    if (t == nullptr) return Fail(CUPTI_ERROR_NOT_INITIALIZED);
    uint32_t enabled = 0;
    uint64_t server_now = 0, local_now = 0;
    char why[512] = "";
    CUresult rc = t->start(1u << gpu, &enabled, &server_now, &local_now, why, sizeof why);
    if (rc != CUDA_SUCCESS || !(enabled & (1u << gpu))) {
      Log("cuptiActivityEnable(%d): the GPU server cannot record it: %s", kind,
          rc != CUDA_SUCCESS ? "the call to the server failed" : why);
      return Fail(CUPTI_ERROR_NOT_INITIALIZED);
    }
    t->set_call_hook(OnCall);
    if (kind == CUPTI_ACTIVITY_KIND_OVERHEAD && t->size >= flyt::profiler::kTableSizeModuleLoadHook)
      t->set_module_load_hook(OnModuleLoad);
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.gpu_kinds |= enabled;
      s.server_started = true;
      if (gpu == ops::kActivityKernel) s.kernel_kind = kind;
      s.server_offset = static_cast<int64_t>(local_now) - static_cast<int64_t>(server_now);
      s.enabled.insert(kind);
    }
    g_want_buffer = true;
    return CUPTI_SUCCESS;
  }
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      if (const Table* t = Driver()) t->set_call_hook(OnCall);
      g_correlate = true;
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:  // cudart's reports: UpdateReporting below
    case CUPTI_ACTIVITY_KIND_DRIVER:   // libcuda's reports: UpdateReporting below
      break;
    default:
      LogOnce("kind" + std::to_string(kind),
              "cuptiActivityEnable(%d): activity kind not supported through Flyt", kind);
      return Fail(CUPTI_ERROR_NOT_SUPPORTED);
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.enabled.insert(kind);
  }
  g_want_buffer = true;
  return ApiKind(kind) ? UpdateReporting() : CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityEnableContext(CUcontext, CUpti_ActivityKind kind) {
  return cuptiActivityEnable(kind);
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  State& s = S();
  int gpu = GpuKind(kind);
  bool stop_server = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.enabled.erase(kind);
    if (kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) g_correlate = false;
    if (gpu > 0) {
      bool still =
          (gpu == ops::kActivityKernel) && (s.enabled.count(CUPTI_ACTIVITY_KIND_KERNEL) ||
                                            s.enabled.count(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
      stop_server = !still && (s.gpu_kinds & (1u << gpu));
      if (stop_server) s.gpu_kinds &= ~(1u << gpu);
    }
  }
  if (stop_server) {
    if (const Table* t = Driver()) t->stop(1u << gpu);
  }
  if (kind == CUPTI_ACTIVITY_KIND_OVERHEAD) {
    const Table* t = Driver();
    if (t != nullptr && t->size >= flyt::profiler::kTableSizeModuleLoadHook)
      t->set_module_load_hook(nullptr);
  }
  return ApiKind(kind) ? UpdateReporting() : CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityDisableContext(CUcontext, CUpti_ActivityKind kind) {
  return cuptiActivityDisable(kind);
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag) {
  const Table* t = S().server_started ? Driver() : nullptr;
  if (t != nullptr) {
    {
      std::lock_guard<std::mutex> lock(S().mu);
      CalibrateLocked();
    }
    uint32_t dropped = 0;
    CUresult rc =
        t->drain((flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != 0, OnRecord, nullptr, &dropped);
    if (rc != CUDA_SUCCESS) Log("cuptiActivityFlushAll: the GPU server's records were lost");
    std::lock_guard<std::mutex> lock(S().mu);
    S().dropped += dropped;
    State& s = S();
    Debug(
        "cuptiActivityFlushAll(%u): %zu records pending, %u dropped; now %llu on the app's clock "
        "(realtime %llu, %.4f ticks/ns, server offset %lld ns)",
        flag, s.pending.size(), dropped,
        static_cast<unsigned long long>(s.timestamp != nullptr ? s.timestamp() : RealtimeNs()),
        static_cast<unsigned long long>(RealtimeNs()), s.ticks_per_ns,
        static_cast<long long>(s.server_offset));
  }
  return Deliver();
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityFlush(CUcontext, uint32_t, uint32_t flag) {
  return cuptiActivityFlushAll(flag);
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid,
                                                         CUpti_Activity** record) {
  CUptiResult r = flyt::cupti_records::Next(buffer, valid, record);
  return r == CUPTI_ERROR_INVALID_PARAMETER ? Fail(r) : r;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext, uint32_t,
                                                                size_t* dropped) {
  if (dropped == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  std::lock_guard<std::mutex> lock(S().mu);
  *dropped = S().dropped;
  S().dropped = 0;
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult
cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id) {
  if (kind <= CUPTI_EXTERNAL_CORRELATION_KIND_INVALID ||
      kind >= CUPTI_EXTERNAL_CORRELATION_KIND_SIZE)
    return Fail(CUPTI_ERROR_INVALID_KIND);
  uint32_t& depth = t_external.depth[kind];
  if (depth == kMaxExternalDepth) {
    LogOnce("external depth", "cuptiActivityPushExternalCorrelationId: more than %u ids pushed",
            kMaxExternalDepth);
    return Fail(CUPTI_ERROR_MAX_LIMIT_REACHED);
  }
  t_external.ids[kind][depth++] = id;
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult
cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t* id) {
  if (kind <= CUPTI_EXTERNAL_CORRELATION_KIND_INVALID ||
      kind >= CUPTI_EXTERNAL_CORRELATION_KIND_SIZE)
    return Fail(CUPTI_ERROR_INVALID_KIND);
  uint32_t& depth = t_external.depth[kind];
  if (depth == 0) return Fail(CUPTI_ERROR_QUEUE_EMPTY);
  --depth;
  if (id != nullptr) *id = t_external.ids[kind][depth];
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivitySetAttribute(CUpti_ActivityAttribute attr, size_t* size,
                                                        void* value) {
  if (size == nullptr || value == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  // Buffer sizes and pool limits shape CUPTI's own buffers; Flyt's records are
  // handed over at each flush, so the values are accepted and have no effect.
  (void)attr;
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiActivityEnableLatencyTimestamps(uint8_t) {
  return CUPTI_SUCCESS;
}
FLYT_CUPTI_EXPORT CUptiResult cuptiActivityEnableCudaEventDeviceTimestamps(uint8_t) {
  return CUPTI_SUCCESS;
}
FLYT_CUPTI_EXPORT CUptiResult cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) {
  if (cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  std::lock_guard<std::mutex> lock(S().mu);
  S().driver_records_off[cbid] = enable == 0;
  return CUPTI_SUCCESS;
}
FLYT_CUPTI_EXPORT CUptiResult cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) {
  if (cbid >= CUPTI_RUNTIME_TRACE_CBID_SIZE) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  std::lock_guard<std::mutex> lock(S().mu);
  S().runtime_records_off[cbid] = enable == 0;
  return CUPTI_SUCCESS;
}

// The callback API: one subscriber; runtime-domain callbacks are delivered from
// cudart's reports, driver-domain ones from libcuda's; other domains are accepted
// and not delivered yet (logged once; docs/compatibility.md).
FLYT_CUPTI_EXPORT CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle* subscriber,
                                                CUpti_CallbackFunc callback, void* userdata,
                                                CUpti_SubscriberParams* params) {
  static int token;
  if (subscriber == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  // The fields the caller's struct has (structSize: CUpti_SubscriberParams_STRUCT_SIZE).
  const size_t have = params != nullptr ? params->structSize : 0;
  auto has = [have](size_t offset, size_t size) { return have >= offset + size; };
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.subscriber != nullptr) {
    if (has(offsetof(CUpti_SubscriberParams, oldSubscriberSize), sizeof(size_t)) &&
        params->oldSubscriberName != nullptr && params->oldSubscriberSize > 0)
      std::snprintf(params->oldSubscriberName, params->oldSubscriberSize, "%s",
                    s.subscriber_name.c_str());
    return Fail(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  }
  s.subscriber = callback;
  s.subscriber_data = userdata;
  s.subscriber_name = "CUPTI";
  if (has(offsetof(CUpti_SubscriberParams, subscriberName), sizeof(const char*)) &&
      params->subscriberName != nullptr)
    s.subscriber_name =
        std::string("CUPTI for ") +
        std::string(params->subscriberName).substr(0, CUPTI_SUBSCRIBER_NAME_MAX_LEN);
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(&token);
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber,
                                             CUpti_CallbackFunc callback, void* userdata) {
  return cuptiSubscribe_v2(subscriber, callback, userdata, nullptr);
}

FLYT_CUPTI_EXPORT CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
  if (subscriber == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  State& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.subscriber = nullptr;
    s.subscriber_data = nullptr;
    s.subscriber_name.clear();
    std::fill(s.runtime_callbacks.begin(), s.runtime_callbacks.end(), false);
    std::fill(s.driver_callbacks.begin(), s.driver_callbacks.end(), false);
  }
  return UpdateReporting();
}

namespace {

// The subscriber's switches of a domain whose callbacks are kept per id, or nullptr.
std::vector<bool>* CallbackBitsLocked(CUpti_CallbackDomain domain) {
  State& s = S();
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) return &s.runtime_callbacks;
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) return &s.driver_callbacks;
  return nullptr;
}

// Sets one callback (cbid) or a whole domain (cbid < 0) of the subscriber's.
CUptiResult SetCallbacks(bool enable, CUpti_SubscriberHandle subscriber,
                         CUpti_CallbackDomain domain, int64_t cbid) {
  if (subscriber == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  State& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.subscriber == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
    std::vector<bool>* bits = CallbackBitsLocked(domain);
    if (bits != nullptr) {
      if (cbid >= static_cast<int64_t>(bits->size())) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
      if (cbid < 0)
        std::fill(bits->begin(), bits->end(), enable);
      else
        (*bits)[static_cast<size_t>(cbid)] = enable;
    } else if (domain <= CUPTI_CB_DOMAIN_INVALID || domain >= CUPTI_CB_DOMAIN_SIZE) {
      return Fail(CUPTI_ERROR_INVALID_PARAMETER);
    }
  }
  if (enable && domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API)
    LogOnce("callbacks" + std::to_string(domain),
            "cuptiEnableCallback(domain %d): callbacks of this domain are not delivered through "
            "Flyt yet (the runtime and driver API domains are)",
            domain);
  return UpdateReporting();
}

}  // namespace

FLYT_CUPTI_EXPORT CUptiResult cuptiEnableCallback(uint32_t enable,
                                                  CUpti_SubscriberHandle subscriber,
                                                  CUpti_CallbackDomain domain,
                                                  CUpti_CallbackId cbid) {
  return SetCallbacks(enable != 0, subscriber, domain, cbid);
}
FLYT_CUPTI_EXPORT CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                                CUpti_CallbackDomain domain) {
  return SetCallbacks(enable != 0, subscriber, domain, -1);
}
FLYT_CUPTI_EXPORT CUptiResult cuptiEnableAllDomains(uint32_t enable,
                                                    CUpti_SubscriberHandle subscriber) {
  for (int d = CUPTI_CB_DOMAIN_INVALID + 1; d < CUPTI_CB_DOMAIN_SIZE; ++d) {
    CUptiResult r = SetCallbacks(enable != 0, subscriber, static_cast<CUpti_CallbackDomain>(d), -1);
    if (r != CUPTI_SUCCESS) return r;
  }
  return CUPTI_SUCCESS;
}
FLYT_CUPTI_EXPORT CUptiResult cuptiGetCallbackState(uint32_t* enable,
                                                    CUpti_SubscriberHandle subscriber,
                                                    CUpti_CallbackDomain domain,
                                                    CUpti_CallbackId cbid) {
  if (enable == nullptr || subscriber == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::vector<bool>* bits = CallbackBitsLocked(domain);
  if (bits == nullptr || cbid >= bits->size()) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  *enable = (*bits)[cbid] ? 1 : 0;
  return CUPTI_SUCCESS;
}

// The name of a runtime or driver callback id: the id's own, as CUPTI's headers spell
// it (e.g. "cudaMemcpy_v3020", "cuMemcpyHtoD_v2"); generated from them.
FLYT_CUPTI_EXPORT CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                                                   const char** name) {
  if (name == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  *name = nullptr;
  const char* const* names = nullptr;
  size_t count = 0;
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    names = kRuntimeCallbackNames;
    count = std::size(kRuntimeCallbackNames);
  } else if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    names = kDriverCallbackNames;
    count = std::size(kDriverCallbackNames);
  }
  if (names == nullptr || cbid >= count || names[cbid] == nullptr)
    return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  *name = names[cbid];
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiSetThreadIdType(CUpti_ActivityThreadIdType type) {
  if (type != CUPTI_ACTIVITY_THREAD_ID_TYPE_DEFAULT && type != CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM)
    return Fail(CUPTI_ERROR_NOT_SUPPORTED);
  std::lock_guard<std::mutex> lock(S().mu);
  S().thread_id_type = type;
  return CUPTI_SUCCESS;
}
FLYT_CUPTI_EXPORT CUptiResult cuptiGetThreadIdType(CUpti_ActivityThreadIdType* type) {
  if (type == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  std::lock_guard<std::mutex> lock(S().mu);
  *type = S().thread_id_type;
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiFinalize() {
  State& s = S();
  uint32_t kinds = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    kinds = s.gpu_kinds;
    s.gpu_kinds = 0;
    s.enabled.clear();
    s.pending.clear();
    s.subscriber = nullptr;
    s.subscriber_data = nullptr;
    s.subscriber_name.clear();
    std::fill(s.runtime_callbacks.begin(), s.runtime_callbacks.end(), false);
    std::fill(s.driver_callbacks.begin(), s.driver_callbacks.end(), false);
    g_correlate = false;
  }
  UpdateReporting();  // off
  if (const Table* t = Driver()) {
    if (kinds != 0) t->stop(kinds);
    t->set_call_hook(nullptr);
  }
  return Deliver();  // nothing pending: the held buffer goes back empty
}

FLYT_CUPTI_EXPORT CUptiResult cuptiGetLastError() {
  CUptiResult r = S().last_error;
  S().last_error = CUPTI_SUCCESS;
  return r;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiGetDeviceId(CUcontext, uint32_t* device) {
  if (device == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  *device = 0;
  return CUPTI_SUCCESS;
}

FLYT_CUPTI_EXPORT CUptiResult cuptiGetResultString(CUptiResult result, const char** str) {
  if (str == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  switch (result) {
#define FLYT_NAME(r) \
  case r:            \
    *str = #r;       \
    return CUPTI_SUCCESS;
    FLYT_NAME(CUPTI_SUCCESS)
    FLYT_NAME(CUPTI_ERROR_INVALID_PARAMETER)
    FLYT_NAME(CUPTI_ERROR_INVALID_DEVICE)
    FLYT_NAME(CUPTI_ERROR_INVALID_CONTEXT)
    FLYT_NAME(CUPTI_ERROR_INVALID_KIND)
    FLYT_NAME(CUPTI_ERROR_OUT_OF_MEMORY)
    FLYT_NAME(CUPTI_ERROR_INVALID_OPERATION)
    FLYT_NAME(CUPTI_ERROR_NOT_INITIALIZED)
    FLYT_NAME(CUPTI_ERROR_MAX_LIMIT_REACHED)
    FLYT_NAME(CUPTI_ERROR_QUEUE_EMPTY)
    FLYT_NAME(CUPTI_ERROR_NOT_SUPPORTED)
    FLYT_NAME(CUPTI_ERROR_UNKNOWN)
#undef FLYT_NAME
    default:
      *str = "CUPTI_ERROR_UNKNOWN";
      return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  }
}

// Every other CUPTI entry point (generated from the headers: cupti_unsupported.cc).
extern "C" CUptiResult flyt_cupti_unsupported(const char* name) {
  LogOnce(name, "%s is not supported through Flyt; returning CUPTI_ERROR_NOT_SUPPORTED", name);
  return Fail(CUPTI_ERROR_NOT_SUPPORTED);
}
