// CUPTI activity for a profiled client: kOpProfiler (protocol/ops.h).
//
// Owns: turning NVIDIA's CUPTI on in this worker process while its client
// profiles, tagging each of the client's frames with the frame's call id (a
// CUPTI external correlation id pushed around the frame), and handing the
// records back to the client as ops::GpuActivity, with the call id in place of
// the server's correlation id. The client's libcupti (src/cupti/) makes them
// CUPTI records again. The sim backend's CUPTI (server/sim_cupti.cc) serves CI.
// A worker serves one client process, so CUPTI's process-wide state is the
// session's. Must not touch another session's state.
#include <cupti.h>

#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "server/cupti_api.h"
#include "server/session.h"

namespace flyt::server {
namespace {

using wire::Reader;
using wire::Writer;

constexpr CUpti_ExternalCorrelationKind kCallIdKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;
// Records kept between two drains; more are counted as dropped.
constexpr size_t kMaxPending = 1u << 20;
constexpr size_t kBufferBytes = 4u << 20;

// What CUPTI delivered and the drains have not taken yet. CUPTI's buffer
// callbacks carry no user pointer: one collector per process.
struct Collector {
  std::mutex mu;
  CuptiApi api;
  bool callbacks = false;
  std::vector<ops::GpuActivity> records;  // correlation id in call_id until drained
  std::vector<std::string> names;
  std::unordered_map<uint32_t, uint64_t> call_of;  // CUPTI correlation id -> call id
  uint64_t dropped = 0;
};
Collector& C() {
  static Collector* c = new Collector;  // CUPTI may deliver at exit
  return *c;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

// The fields every GPU record of CUPTI has (the correlation id goes in call_id
// until a drain resolves it).
template <typename Record>
void TakeCommon(const Record* r, ops::GpuActivity* g) {
  g->call_id = r->correlationId;
  g->start_ns = r->start;
  g->end_ns = r->end;
  g->device = r->deviceId;
  g->context = r->contextId;
  g->stream = r->streamId;
  g->graph_id = r->graphId;
}

void Take(const CUpti_Activity* r) {
  Collector& c = C();
  ops::GpuActivity g{};
  std::string name;
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(r);
      if (e->externalKind == kCallIdKind) c.call_of[e->correlationId] = e->externalId;
      return;
    }
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      g.kind = ops::kActivityKernel;
      TakeCommon(k, &g);
      g.grid[0] = k->gridX, g.grid[1] = k->gridY, g.grid[2] = k->gridZ;
      g.block[0] = k->blockX, g.block[1] = k->blockY, g.block[2] = k->blockZ;
      g.static_smem = k->staticSharedMemory;
      g.dynamic_smem = k->dynamicSharedMemory;
      g.registers = k->registersPerThread;
      if (k->name != nullptr) name = k->name;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      g.kind = ops::kActivityMemcpy;
      g.copy_kind = m->copyKind;
      g.src_kind = m->srcKind;
      g.dst_kind = m->dstKind;
      TakeCommon(m, &g);
      g.bytes = m->bytes;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      g.kind = ops::kActivityMemset;
      g.src_kind = static_cast<uint8_t>(m->memoryKind);
      TakeCommon(m, &g);
      g.bytes = m->bytes;
      g.value = m->value;
      break;
    }
    case CUPTI_ACTIVITY_KIND_OVERHEAD: {
      auto* o = reinterpret_cast<const CUpti_ActivityOverhead3*>(r);
      free(o->overheadData);  // CUPTI's details, ours to free; the client gets none
      // This worker's own buffer handling is not the app's: the client's
      // libcupti records the app's buffer requests itself.
      if (o->overheadKind == CUPTI_ACTIVITY_OVERHEAD_ACTIVITY_BUFFER_REQUEST ||
          o->overheadKind == CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH)
        return;
      g.kind = ops::kActivityOverhead;
      g.value = static_cast<uint32_t>(o->overheadKind);
      g.copy_kind = static_cast<uint8_t>(o->objectKind);
      g.call_id = o->correlationId;
      g.start_ns = o->start;
      g.end_ns = o->end;
      if (o->objectKind == CUPTI_ACTIVITY_OBJECT_DEVICE ||
          o->objectKind == CUPTI_ACTIVITY_OBJECT_CONTEXT ||
          o->objectKind == CUPTI_ACTIVITY_OBJECT_STREAM) {
        g.device = o->objectId.dcs.deviceId;
        g.context = o->objectId.dcs.contextId;
        g.stream = o->objectId.dcs.streamId;
      }
      break;
    }
    default:
      return;
  }
  if (c.records.size() >= kMaxPending) {
    ++c.dropped;
    return;
  }
  c.records.push_back(g);
  c.names.push_back(std::move(name));
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Collector& c = C();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    CUpti_Activity* r = nullptr;
    while (c.api.cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) Take(r);
  }
  free(buffer);
}

// CUPTI kinds behind each GpuActivity kind.
constexpr CUpti_ActivityKind kCuptiKinds[] = {
    CUPTI_ACTIVITY_KIND_INVALID, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_OVERHEAD};
static_assert(sizeof(kCuptiKinds) / sizeof(kCuptiKinds[0]) == ops::kActivityLast + 1);

}  // namespace

void Session::ProfilerBeginFrame(uint64_t call_id) {
  C().api.cuptiActivityPushExternalCorrelationId(kCallIdKind, call_id);
}

void Session::ProfilerEndFrame() {
  uint64_t ignored = 0;
  C().api.cuptiActivityPopExternalCorrelationId(kCallIdKind, &ignored);
}

void Session::ProfilerStop(uint32_t kinds) {
  Collector& c = C();
  if (!c.api.loaded) return;
  for (int k = ops::kActivityKernel; k <= ops::kActivityLast; ++k)
    if ((kinds & (1u << k)) && (profiled_kinds_ & (1u << k)))
      c.api.cuptiActivityDisable(kCuptiKinds[k]);
  profiled_kinds_ &= ~kinds;
  if (profiled_kinds_ == 0 && profiling_) {
    c.api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
    if (!state_->api.is_sim) c.api.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER);
    profiling_ = false;
  }
}

bool Session::Profiler(Reader& in, Writer& out, CUresult* rc) {
  uint8_t which = 0;
  if (!in.Get(&which)) return false;
  Collector& c = C();
  if (which == ops::kProfilerStart) {
    uint32_t kinds = 0;
    if (!in.Get(&kinds)) return false;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (!c.api.loaded) {
        if (state_->api.is_sim) {
          FillSimCupti(&c.api);
        } else if (Status s = LoadCupti(&c.api); !s.ok()) {
          why = s.message();
        }
      }
    }
    uint32_t enabled = 0;
    uint64_t now = 0;
    if (c.api.loaded && !c.callbacks) {
      CUptiResult r = c.api.cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted);
      if (r == CUPTI_SUCCESS) {
        c.callbacks = true;
      } else {
        why = "CUPTI on the GPU host refused its buffer callbacks (CUPTI error " +
              std::to_string(r) + ")";
      }
    }
    if (c.callbacks) {
      CUptiResult r = c.api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
      // CUPTI correlates an external id with the driver calls it records:
      // their own records are dropped in Take().
      if (r == CUPTI_SUCCESS && !state_->api.is_sim)
        r = c.api.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
      if (r == CUPTI_SUCCESS) profiling_ = true;
      for (int k = ops::kActivityKernel; r == CUPTI_SUCCESS && k <= ops::kActivityLast; ++k) {
        if (!(kinds & (1u << k))) continue;
        CUptiResult e = (profiled_kinds_ & (1u << k)) ? CUPTI_SUCCESS
                                                      : c.api.cuptiActivityEnable(kCuptiKinds[k]);
        if (e == CUPTI_SUCCESS) {
          enabled |= 1u << k;
        } else {
          why = "CUPTI on the GPU host refused activity kind " + std::to_string(kCuptiKinds[k]) +
                " (CUPTI error " + std::to_string(e) + ")";
        }
      }
      if (r != CUPTI_SUCCESS)
        why = "CUPTI on the GPU host refused external correlation (CUPTI error " +
              std::to_string(r) + ")";
      profiled_kinds_ |= enabled;
      c.api.cuptiGetTimestamp(&now);
      if (!profiling_) ProfilerStop(profiled_kinds_);
    }
    if (!why.empty())
      FLYT_WARN("session %llu: profiling: %s", static_cast<unsigned long long>(id_), why.c_str());
    out.Put(enabled);
    out.Put(now);
    out.PutString(why);
    *rc = CUDA_SUCCESS;
    return true;
  }
  if (which == ops::kProfilerStop) {
    uint32_t kinds = 0;
    if (!in.Get(&kinds)) return false;
    ProfilerStop(kinds);
    *rc = CUDA_SUCCESS;
    return true;
  }
  if (which != ops::kProfilerDrain) return false;
  uint8_t forced = 0;
  if (!in.Get(&forced)) return false;
  uint64_t now = 0;
  std::vector<ops::GpuActivity> records;
  std::vector<std::string> names;
  uint64_t dropped = 0;
  if (c.api.loaded) {
    c.api.cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
    c.api.cuptiGetTimestamp(&now);
    size_t cupti_dropped = 0;
    if (c.api.cuptiActivityGetNumDroppedRecords(nullptr, 0, &cupti_dropped) == CUPTI_SUCCESS)
      dropped += cupti_dropped;
    std::lock_guard<std::mutex> lock(c.mu);
    records.swap(c.records);
    names.swap(c.names);
    dropped += c.dropped;
    c.dropped = 0;
    for (auto& g : records) {
      auto it = c.call_of.find(static_cast<uint32_t>(g.call_id));
      g.call_id = it != c.call_of.end() ? it->second : 0;
    }
    // Work still in flight may need its correlation at the next drain; the
    // rest is not needed again.
    if (forced || c.call_of.size() > kMaxPending) c.call_of.clear();
  }
  out.Put(now);
  out.Put(static_cast<uint32_t>(dropped > UINT32_MAX ? UINT32_MAX : dropped));
  out.Put(static_cast<uint32_t>(records.size()));
  for (size_t i = 0; i < records.size(); ++i) {
    records[i].name_len = static_cast<uint32_t>(names[i].size());
    out.Put(records[i]);
    out.PutBytes(names[i].data(), names[i].size());
  }
  *rc = CUDA_SUCCESS;
  return true;
}

}  // namespace flyt::server
