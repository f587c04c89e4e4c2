// The profiler table (common/profiler_abi.h) that Flyt's libcupti asks for.
//
// Owns: kOpProfiler calls on behalf of libcupti and the call hook it sets; hands the
// runtime-call hooks to export_tables.cc and the driver-call hook to driver_trace.cc.
// Must not keep records: the server holds them until a drain, libcupti after.
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/driver_trace.h"
#include "client/export_tables.h"
#include "common/cupti_records.h"
#include "common/log.h"
#include "common/profiler_abi.h"
#include "protocol/codec.h"

namespace flyt::client {

std::atomic<profiler::ModuleLoadHook> g_module_load_hook{nullptr};

namespace {

using cupti_records::RealtimeNs;

CUresult Start(uint32_t kinds, uint32_t* enabled, uint64_t* server_now, uint64_t* local_now,
               char* why, size_t why_len) {
  if (enabled == nullptr || server_now == nullptr || local_now == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  if (CUresult rc = c.Init(); rc != CUDA_SUCCESS) return rc;
  wire::Writer w;
  w.Put(ops::kProfilerStart);
  w.Put(kinds);
  std::vector<uint8_t> reply;
  uint64_t t0 = RealtimeNs();
  CUresult rc = c.Call("cuptiActivityEnable", ops::kOpProfiler, w, ReplySink{&reply});
  uint64_t t1 = RealtimeNs();
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  std::string text;
  if (!r.Get(enabled) || !r.Get(server_now) || !r.GetString(&text)) return CUDA_ERROR_UNKNOWN;
  *local_now = t0 + (t1 - t0) / 2;
  if (why != nullptr && why_len > 0) {
    size_t n = std::min(text.size(), why_len - 1);
    std::memcpy(why, text.data(), n);
    why[n] = '\0';
  }
  return CUDA_SUCCESS;
}

CUresult Stop(uint32_t kinds) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_SUCCESS;
  wire::Writer w;
  w.Put(ops::kProfilerStop);
  w.Put(kinds);
  std::vector<uint8_t> reply;
  return c.Call("cuptiActivityDisable", ops::kOpProfiler, w, ReplySink{&reply});
}

CUresult Drain(int forced, profiler::RecordFn each, void* opaque, uint32_t* dropped) {
  if (each == nullptr || dropped == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *dropped = 0;
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_SUCCESS;
  wire::Writer w;
  w.Put(ops::kProfilerDrain);
  w.Put(static_cast<uint8_t>(forced != 0));
  std::vector<uint8_t> reply;
  CUresult rc = c.Call("cuptiActivityFlushAll", ops::kOpProfiler, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint64_t now = 0;
  uint32_t n = 0;
  if (!r.Get(&now) || !r.Get(dropped) || !r.Get(&n)) return CUDA_ERROR_UNKNOWN;
  std::string name;
  for (uint32_t i = 0; i < n; ++i) {
    ops::GpuActivity g{};
    if (!r.Get(&g) || g.name_len > (1u << 20)) return CUDA_ERROR_UNKNOWN;
    name.resize(g.name_len);
    if (!r.GetBytes(name.data(), g.name_len)) return CUDA_ERROR_UNKNOWN;
    each(opaque, &g, name.c_str());
  }
  return CUDA_SUCCESS;
}

void SetCallHook(profiler::CallHook hook) { Client::Get().SetCallHook(hook); }

void SetModuleLoadHook(profiler::ModuleLoadHook hook) { g_module_load_hook.store(hook); }

}  // namespace

const void* ProfilerTable() {
  static const profiler::Table table{sizeof(profiler::Table),
                                     Start,
                                     Stop,
                                     Drain,
                                     SetCallHook,
                                     SetRuntimeApiHooks,
                                     SetDriverApiHook,
                                     SetModuleLoadHook};
  return &table;
}

}  // namespace flyt::client
