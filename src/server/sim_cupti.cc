// The sim backend's CUPTI (server/sim_cupti.h, server/cupti_api.h).
//
// Records go into the app's buffers (bufferRequested/bufferCompleted) at each
// flush, each preceded by its size in a u64, which cuptiActivityGetNextRecord
// reads. Stream ids follow CUPTI's numbering: 7 for the legacy default stream,
// 13 and up for streams in the order they first run work.
#include "server/sim_cupti.h"

#include <cupti.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "common/cupti_records.h"
#include "server/cupti_api.h"

namespace flyt::server::sim_cupti {
namespace {

struct State {
  std::mutex mu;
  std::set<int> kinds;  // CUpti_ActivityKind enabled
  CUpti_BuffersCallbackRequestFunc requested = nullptr;
  CUpti_BuffersCallbackCompleteFunc completed = nullptr;
  std::vector<std::vector<uint8_t>> pending;  // records not yet flushed
  std::map<CUstream, uint32_t> stream_ids;
  std::set<std::string> names;   // kernel names: valid as long as the process
  std::set<std::string> loaded;  // kernels launched before (lazy loading's overhead is once)
  uint32_t next_stream_id = 13;
  uint32_t correlation = 0;
};
State& S() {
  static State* s = new State;  // never destroyed: threads may record at exit
  return *s;
}
std::atomic<bool> g_recording{false};
thread_local std::map<int, std::vector<uint64_t>> t_external;  // kind -> stack

bool EnabledLocked(CUpti_ActivityKind k) { return S().kinds.count(k) != 0; }

uint32_t StreamIdLocked(CUstream s) {
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return 7;
  auto [it, added] = S().stream_ids.emplace(s, S().next_stream_id);
  if (added) ++S().next_stream_id;
  return it->second;
}

template <typename T>
void PushLocked(const T& rec) {
  cupti_records::Append(&S().pending, rec);
}

// A new correlation id, and the external ids pushed on this thread for it.
uint32_t CorrelateLocked() {
  uint32_t id = ++S().correlation;
  if (!EnabledLocked(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION)) return id;
  for (auto& [kind, stack] : t_external) {
    if (stack.empty()) continue;
    CUpti_ActivityExternalCorrelation e{};
    e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    e.externalKind = static_cast<CUpti_ExternalCorrelationKind>(kind);
    e.externalId = stack.back();
    e.correlationId = id;
    PushLocked(e);
  }
  return id;
}

CUptiResult GetVersion(uint32_t* v) {
  if (v == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  *v = CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}
CUptiResult GetResultString(CUptiResult r, const char** s) {
  if (s == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  *s = r == CUPTI_SUCCESS ? "CUPTI_SUCCESS" : "CUPTI error (sim)";
  return CUPTI_SUCCESS;
}
CUptiResult GetTimestamp(uint64_t* t) {
  if (t == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  *t = Now();
  return CUPTI_SUCCESS;
}
CUptiResult Enable(CUpti_ActivityKind k) {
  switch (k) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_MEMCPY:
    case CUPTI_ACTIVITY_KIND_MEMSET:
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
      break;
    default:
      return CUPTI_ERROR_NOT_COMPATIBLE;
  }
  std::lock_guard<std::mutex> lock(S().mu);
  S().kinds.insert(k);
  g_recording = true;
  return CUPTI_SUCCESS;
}
CUptiResult Disable(CUpti_ActivityKind k) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().kinds.erase(k);
  g_recording = !S().kinds.empty();
  return CUPTI_SUCCESS;
}
CUptiResult RegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
                              CUpti_BuffersCallbackCompleteFunc done) {
  if (req == nullptr || done == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  std::lock_guard<std::mutex> lock(S().mu);
  S().requested = req;
  S().completed = done;
  return CUPTI_SUCCESS;
}
CUptiResult FlushAll(uint32_t) {
  std::vector<std::vector<uint8_t>> records;
  CUpti_BuffersCallbackRequestFunc req;
  CUpti_BuffersCallbackCompleteFunc done;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    records.swap(S().pending);
    req = S().requested;
    done = S().completed;
  }
  if (records.empty()) return CUPTI_SUCCESS;
  if (req == nullptr || done == nullptr) return CUPTI_ERROR_INVALID_OPERATION;
  return cupti_records::Deliver(records, {}, req, done) == records.size()
             ? CUPTI_SUCCESS
             : CUPTI_ERROR_OUT_OF_MEMORY;
}
CUptiResult GetNextRecord(uint8_t* buffer, size_t valid, CUpti_Activity** record) {
  return cupti_records::Next(buffer, valid, record);
}
CUptiResult GetNumDropped(CUcontext, uint32_t, size_t* n) {
  if (n == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  *n = 0;
  return CUPTI_SUCCESS;
}
CUptiResult PushExternal(CUpti_ExternalCorrelationKind kind, uint64_t id) {
  t_external[kind].push_back(id);
  return CUPTI_SUCCESS;
}
CUptiResult PopExternal(CUpti_ExternalCorrelationKind kind, uint64_t* id) {
  auto& stack = t_external[kind];
  if (stack.empty()) return CUPTI_ERROR_QUEUE_EMPTY;
  if (id != nullptr) *id = stack.back();
  stack.pop_back();
  return CUPTI_SUCCESS;
}

// The fields every GPU record of CUPTI has.
template <typename Record>
void FillCommonLocked(Record* r, CUstream stream, uint64_t start, uint64_t end,
                      uint32_t correlation = 0) {
  r->start = start;
  r->end = end;
  r->deviceId = 0;
  r->contextId = 1;
  r->streamId = StreamIdLocked(stream);
  r->correlationId = correlation != 0 ? correlation : CorrelateLocked();
}

}  // namespace

bool Recording() { return g_recording.load(std::memory_order_relaxed); }

uint64_t Now() { return cupti_records::RealtimeNs(); }

void RecordKernel(const std::string& name, const CUlaunchConfig& cfg, uint64_t start,
                  uint64_t end) {
  std::lock_guard<std::mutex> lock(S().mu);
  CUpti_ActivityKind kind = EnabledLocked(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
                                ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
                                : CUPTI_ACTIVITY_KIND_KERNEL;
  if (!EnabledLocked(kind)) return;
  uint32_t correlation = CorrelateLocked();
  // A function's first launch loads it, as the driver's lazy loading does, and
  // CUPTI reports that as an overhead of the launch.
  if (EnabledLocked(CUPTI_ACTIVITY_KIND_OVERHEAD) && S().loaded.insert(name).second) {
    CUpti_ActivityOverhead3 o{};
    o.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
    o.overheadKind = CUPTI_ACTIVITY_OVERHEAD_LAZY_FUNCTION_LOADING;
    o.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
    o.objectId.pt.processId = static_cast<uint32_t>(getpid());
    o.objectId.pt.threadId = static_cast<uint32_t>(gettid());
    o.start = start;
    o.end = start + 1;
    o.correlationId = correlation;
    PushLocked(o);
  }
  CUpti_ActivityKernel10 k{};
  k.kind = kind;
  FillCommonLocked(&k, cfg.hStream, start, end, correlation);
  k.completed = end;
  k.queued = k.submitted = start;
  k.gridX = static_cast<int32_t>(cfg.gridDimX);
  k.gridY = static_cast<int32_t>(cfg.gridDimY);
  k.gridZ = static_cast<int32_t>(cfg.gridDimZ);
  k.blockX = static_cast<int32_t>(cfg.blockDimX);
  k.blockY = static_cast<int32_t>(cfg.blockDimY);
  k.blockZ = static_cast<int32_t>(cfg.blockDimZ);
  k.dynamicSharedMemory = static_cast<int32_t>(cfg.sharedMemBytes);
  k.registersPerThread = 32;
  k.name = S().names.insert(name).first->c_str();
  PushLocked(k);
}

void RecordMemcpy(uint8_t copy_kind, uint8_t src_kind, uint8_t dst_kind, uint64_t bytes,
                  CUstream stream, uint64_t start, uint64_t end) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (!EnabledLocked(CUPTI_ACTIVITY_KIND_MEMCPY)) return;
  CUpti_ActivityMemcpy6 m{};
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = copy_kind;
  m.srcKind = src_kind;
  m.dstKind = dst_kind;
  m.bytes = bytes;
  FillCommonLocked(&m, stream, start, end);
  PushLocked(m);
}

void RecordMemset(uint32_t value, uint64_t bytes, CUstream stream, uint64_t start, uint64_t end) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (!EnabledLocked(CUPTI_ACTIVITY_KIND_MEMSET)) return;
  CUpti_ActivityMemset4 m{};
  m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  m.value = value;
  m.bytes = bytes;
  FillCommonLocked(&m, stream, start, end);
  m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  PushLocked(m);
}

}  // namespace flyt::server::sim_cupti

namespace flyt::server {

void FillSimCupti(CuptiApi* api) {
  using namespace sim_cupti;
  api->cuptiGetVersion = GetVersion;
  api->cuptiGetResultString = GetResultString;
  api->cuptiGetTimestamp = GetTimestamp;
  api->cuptiActivityEnable = Enable;
  api->cuptiActivityDisable = Disable;
  api->cuptiActivityRegisterCallbacks = RegisterCallbacks;
  api->cuptiActivityFlushAll = FlushAll;
  api->cuptiActivityGetNextRecord = GetNextRecord;
  api->cuptiActivityGetNumDroppedRecords = GetNumDropped;
  api->cuptiActivityPushExternalCorrelationId = PushExternal;
  api->cuptiActivityPopExternalCorrelationId = PopExternal;
  api->loaded = true;
  api->from = "sim";
}

}  // namespace flyt::server
