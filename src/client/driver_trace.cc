// Reporting the app's driver API calls to Flyt's libcupti: see driver_trace.h.
// generated_cuda_meta.h declares the parameters of every ABI, legacy ones included.
#define __CUDA_API_VERSION_INTERNAL 1
#include "client/driver_trace.h"

#include <cupti_driver_cbid.h>
#include <generated_cuda_meta.h>

#include <cstring>

// The implementations (or their "not supported" stubs) behind two exported entry
// points: calling those would report Flyt's own call.
extern "C" {
__attribute__((visibility("hidden"))) CUresult flyt_impl_cuCtxGetCurrent(CUcontext* ctx);
__attribute__((visibility("hidden"))) CUresult flyt_impl_cuFuncGetName(const char** name,
                                                                       CUfunction f);
}

namespace flyt::client {

std::atomic<profiler::DriverApiHook> g_driver_api_hook{nullptr};

void SetDriverApiHook(profiler::DriverApiHook hook) {
  g_driver_api_hook.store(hook, std::memory_order_release);
}

namespace {

CUcontext Current() {
  CUcontext ctx = nullptr;
  if (flyt_impl_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

// The function a launch names, for CUpti_CallbackData::symbolName.
CUfunction LaunchedFunction(uint32_t cbid, const void* params) {
  if (params == nullptr) return nullptr;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
      return static_cast<const cuLaunchKernel_params*>(params)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
      return static_cast<const cuLaunchKernel_ptsz_params*>(params)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
      return static_cast<const cuLaunchKernelEx_params*>(params)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
      return static_cast<const cuLaunchKernelEx_ptsz_params*>(params)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
      return static_cast<const cuLaunchCooperativeKernel_params*>(params)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
      return static_cast<const cuLaunchCooperativeKernel_ptsz_params*>(params)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunch:
      return static_cast<const cuLaunch_params*>(params)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid:
      return static_cast<const cuLaunchGrid_params*>(params)->f;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync:
      return static_cast<const cuLaunchGridAsync_params*>(params)->f;
    default:
      return nullptr;
  }
}

}  // namespace

DriverTrace::DriverTrace(uint32_t cbid, const char* name, const void* params) noexcept
    : hook_(g_driver_api_hook.load(std::memory_order_acquire)) {
  std::memset(&record_, 0, sizeof record_);
  if (hook_ == nullptr) return;  // cleared since the wrapper looked
  record_.size = sizeof record_;
  record_.cbid = cbid;
  record_.site = 0;
  record_.function_name = name;
  record_.params = params;
  record_.return_value = &result_;  // CUDA_SUCCESS until the exit
  record_.context = Current();
  if (CUfunction f = LaunchedFunction(cbid, params); f != nullptr) {
    const char* symbol = nullptr;
    if (flyt_impl_cuFuncGetName(&symbol, f) == CUDA_SUCCESS) record_.symbol_name = symbol;
  }
  hook_(&record_);
}

CUresult DriverTrace::Exit(CUresult result) noexcept {
  if (hook_ == nullptr) return result;
  result_ = result;
  record_.site = 1;
  record_.context = Current();
  hook_(&record_);
  return result;
}

}  // namespace flyt::client
