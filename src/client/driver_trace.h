// Reporting the app's driver API calls to Flyt's libcupti (CUPTI's driver API domain).
//
// Owns: the driver-API hook libcupti sets through the profiler table
// (common/profiler_abi.h), and DriverTrace, which the generated wrappers of
// driver_trace_wrappers.cc (gen_driver_trace.py) put around an implementation while
// the hook is set. Must not touch the implementations or the connection: it only
// reads the current context and a launched kernel's name, through the implementations
// themselves, and never calls an exported entry point (that would report Flyt's own call).
// Without a hook, a wrapper costs one relaxed load and a tail call.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>

#include "common/profiler_abi.h"

namespace flyt::client {

extern __attribute__((visibility("hidden"))) std::atomic<profiler::DriverApiHook> g_driver_api_hook;

inline bool DriverTraceOn() { return g_driver_api_hook.load(std::memory_order_relaxed) != nullptr; }

// Sets (or, with nullptr, clears) the hook every traced call is reported to.
void SetDriverApiHook(profiler::DriverApiHook hook);

// One traced call: reports the enter on construction, the exit in Exit.
class DriverTrace {
 public:
  DriverTrace(uint32_t cbid, const char* name, const void* params) noexcept;
  DriverTrace(const DriverTrace&) = delete;
  DriverTrace& operator=(const DriverTrace&) = delete;
  // Reports the exit with the call's result; returns the result.
  CUresult Exit(CUresult result) noexcept;

 private:
  profiler::DriverCallRecord record_;
  profiler::DriverApiHook hook_;
  CUresult result_ = CUDA_SUCCESS;
};

}  // namespace flyt::client
