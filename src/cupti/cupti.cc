// Flyt's libcupti.so.13: CUPTI's activity API for programs whose GPU is remote.
//
// Owns: the activity kinds the app enabled, its buffer callbacks, its external
// correlation stacks (per thread), and the records not yet handed to it. GPU
// records (kernels, copies, memsets) come from the server's CUPTI through
// libcuda's profiler table (common/profiler_abi.h); their correlation id is the
// id of the Flyt call that issued the work, and each such call, made while the
// app had pushed external ids, yields CUPTI's external correlation records.
// Timestamps are moved onto this host's clock (or the app's timestamp callback).
// Must not call into libcuda while holding its lock (libcuda calls the call
// hook under its own), nor write to stdout.
#include <cupti.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/cupti_records.h"
#include "common/profiler_abi.h"

#define FLYT_CUPTI_EXPORT extern "C" __attribute__((visibility("default")))

namespace flyt::cupti {
namespace {

using profiler::Table;

// Messages go to stderr only when FLYT_LOG asks for them (as libcuda's do).
void Log(const char* fmt, ...) {
  const char* level = std::getenv("FLYT_LOG");
  if (level == nullptr || std::strcmp(level, "off") == 0) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "flyt-cupti: %s\n", line);
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
        static_cast<const Table*>(t)->size < sizeof(Table)) {
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

// libcuda's hook: an app call is about to go to the server.
void OnCall(uint64_t call_id) {
  if (!g_correlate.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(S().mu);
  for (int kind = 0; kind < kExternalKinds; ++kind) {
    uint32_t depth = t_external.depth[kind];
    if (depth == 0) continue;
    CUpti_ActivityExternalCorrelation e{};
    e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    e.externalKind = static_cast<CUpti_ExternalCorrelationKind>(kind);
    e.externalId = t_external.ids[kind][depth - 1];
    e.correlationId = static_cast<uint32_t>(call_id);
    PushLocked(e);
  }
}

// The fields every GPU record of CUPTI has, from a server record.
template <typename Record>
void FillCommonLocked(Record* r, const ops::GpuActivity* g) {
  r->start = LocalTimeLocked(g->start_ns);
  r->end = LocalTimeLocked(g->end_ns);
  r->deviceId = g->device;
  r->contextId = g->context;
  r->streamId = g->stream;
  r->correlationId = static_cast<uint32_t>(g->call_id);
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
    default:
      return -1;
  }
}

CUptiResult Fail(CUptiResult r) {
  S().last_error = r;
  return r;
}

}  // namespace

// With delivery_mu held: while the app profiles, holds a buffer of the app's
// for the records to come.
void HoldBufferDelivering() {
  State& s = S();
  CUpti_BuffersCallbackRequestFunc req = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.held.data != nullptr || s.enabled.empty() || s.requested == nullptr) return;
    req = s.requested;
  }
  cupti_records::AppBuffer buffer = cupti_records::Request(req);
  std::lock_guard<std::mutex> lock(s.mu);
  s.held = buffer;
}

void HoldBuffer() {
  std::lock_guard<std::mutex> delivering(S().delivery_mu);
  HoldBufferDelivering();
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
    size_t delivered = cupti_records::Deliver(records, held, req, done);
    if (delivered < records.size()) {
      std::lock_guard<std::mutex> lock(s.mu);
      s.dropped += records.size() - delivered;
      rc = Fail(CUPTI_ERROR_OUT_OF_MEMORY);
    }
  }
  HoldBufferDelivering();
  return rc;
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
  HoldBuffer();
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
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.gpu_kinds |= enabled;
      s.server_started = true;
      if (gpu == ops::kActivityKernel) s.kernel_kind = kind;
      s.server_offset = static_cast<int64_t>(local_now) - static_cast<int64_t>(server_now);
      s.enabled.insert(kind);
    }
    HoldBuffer();
    return CUPTI_SUCCESS;
  }
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      if (const Table* t = Driver()) t->set_call_hook(OnCall);
      g_correlate = true;
      break;
    }
    // Accepted and produce no records through Flyt (docs/compatibility.md): the
    // API records need cudart's tools callbacks, the overhead records are
    // CUPTI's own bookkeeping, which Flyt does not have.
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER:
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
      LogOnce("kind" + std::to_string(kind),
              "cuptiActivityEnable(%d): accepted; Flyt records no activity of this kind yet", kind);
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
  HoldBuffer();
  return CUPTI_SUCCESS;
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
  return CUPTI_SUCCESS;
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
FLYT_CUPTI_EXPORT CUptiResult cuptiActivityEnableDriverApi(CUpti_CallbackId, uint8_t) {
  return CUPTI_SUCCESS;
}
FLYT_CUPTI_EXPORT CUptiResult cuptiActivityEnableRuntimeApi(CUpti_CallbackId, uint8_t) {
  return CUPTI_SUCCESS;
}

// The callback API: subscribing works, and callbacks are not delivered through
// Flyt yet (logged once; docs/compatibility.md).
FLYT_CUPTI_EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc,
                                             void*) {
  static int token;
  if (subscriber == nullptr) return Fail(CUPTI_ERROR_INVALID_PARAMETER);
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(&token);
  return CUPTI_SUCCESS;
}
FLYT_CUPTI_EXPORT CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle) { return CUPTI_SUCCESS; }
FLYT_CUPTI_EXPORT CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle,
                                                  CUpti_CallbackDomain domain,
                                                  CUpti_CallbackId cbid) {
  if (enable)
    LogOnce("callbacks",
            "cuptiEnableCallback(domain %d, cbid %u): CUPTI callbacks are not "
            "delivered through Flyt yet",
            domain, cbid);
  return CUPTI_SUCCESS;
}
FLYT_CUPTI_EXPORT CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle sub,
                                                CUpti_CallbackDomain domain) {
  return cuptiEnableCallback(enable, sub, domain, 0);
}
FLYT_CUPTI_EXPORT CUptiResult cuptiEnableAllDomains(uint32_t enable, CUpti_SubscriberHandle sub) {
  return cuptiEnableCallback(enable, sub, CUPTI_CB_DOMAIN_INVALID, 0);
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
    g_correlate = false;
  }
  if (const Table* t = kinds != 0 ? Driver() : nullptr) {
    t->stop(kinds);
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
