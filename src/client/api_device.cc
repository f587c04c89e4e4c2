// Entry points answered on the client: initialisation, driver version,
// devices (from the inventory the handshake brought), contexts, error names,
// cuGetProcAddress and cuGetExportTable.
// Legacy ABIs (cuDeviceGetUuid, cuGetProcAddress, cuCtxGetDevice) are defined
// here beside their successors, so cuda.h must not rename them.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <strings.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "client/client.h"
#include "client/export_tables.h"
#include "client/proc_address.h"
#include "client/query_cache.h"
#include "common/log.h"

namespace flyt::client {
struct ErrorName {
  int code;
  const char* name;
  const char* text;
};
extern const ErrorName kErrorNames[];
}  // namespace flyt::client

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::QueryCache;

namespace {

const flyt::ops::DeviceInfo* Dev(CUdevice d) {
  Client& c = Client::Get();
  return c.initialized() ? c.device(d) : nullptr;
}

// The calling thread's context stack below its current context (the top):
// cuCtxPushCurrent / PopCurrent, cuCtxCreate, cuCtxDestroy, cuCtxSetCurrent(NULL).
thread_local std::vector<CUcontext> t_stack;

// Makes the top of the stack current again after the current context is popped.
CUcontext PopStack() {
  CUcontext prev = nullptr;
  if (!t_stack.empty()) {
    prev = t_stack.back();
    t_stack.pop_back();
  }
  flyt::client::SetCurrentContext(prev);
  return prev;
}

}  // namespace

// Lets flyt-server refuse to load this library as NVIDIA's driver.
FLYT_API int flyt_client_marker() { return 1; }

// Flyt's own extension: the calls this process made so far, for benchmarks
// (tests/gpu/ml/bench_ml.py reads it with ctypes). out[0] synchronous calls,
// out[1] asynchronous calls, out[2] messages sent; returns how many it wrote.
FLYT_API int flyt_client_stats(uint64_t* out, int n) {
  if (out == nullptr || n <= 0) return 0;
  Client::CallStats s = Client::Get().Stats();
  const uint64_t values[] = {s.sync_calls, s.async_calls, s.sends};
  int count = n < 3 ? n : 3;
  for (int i = 0; i < count; ++i) out[i] = values[i];
  return count;
}

// With FLYT_CALL_COUNTS=1 in the environment: writes "SYNC|ASYNC count name"
// lines (NUL-terminated, truncated to len) and returns the full text's length.
FLYT_API size_t flyt_client_call_counts(char* buf, size_t len) {
  std::string text = Client::Get().CallCounts();
  if (buf != nullptr && len > 0) {
    size_t n = text.size() < len - 1 ? text.size() : len - 1;
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

FLYT_API CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return Client::Get().Init();
}

FLYT_API CUresult cuDriverGetVersion(int* v) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  *v = c.initialized() ? c.driver_version() : CUDA_VERSION;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGetCount(int* n) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  *n = c.device_count();
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (Dev(ordinal) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  const auto* info = Dev(d);
  if (info == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::strncpy(name, info->name, static_cast<size_t>(len) - 1);
  name[len - 1] = '\0';
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice d) {
  const auto* info = Dev(d);
  if (info == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(uuid->bytes, info->uuid, 16);
  return CUDA_SUCCESS;
}
FLYT_API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice d) { return cuDeviceGetUuid_v2(uuid, d); }

FLYT_API CUresult cuDeviceGetLuid(char* luid, unsigned int* mask, CUdevice d) {
  const auto* info = Dev(d);
  if (info == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (luid) std::memcpy(luid, info->luid, 8);
  if (mask) *mask = info->luid_mask;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  const auto* info = Dev(d);
  if (info == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = __atomic_load_n(&info->total_mem, __ATOMIC_RELAXED);  // a share change updates it
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  const auto* info = Dev(d);
  if (info == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (v == nullptr || a <= 0 || a >= flyt::ops::kMaxDeviceAttribute)
    return CUDA_ERROR_INVALID_VALUE;
  int value = __atomic_load_n(&info->attributes[a], __ATOMIC_RELAXED);  // a share change updates it
  if (value == flyt::ops::kAttributeRefused) return CUDA_ERROR_INVALID_VALUE;  // as the driver
  *v = value;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice d) {
  const auto* info = Dev(d);
  if (info == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (major) *major = info->attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
  if (minor) *minor = info->attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGetProperties(CUdevprop* p, CUdevice d) {
  const auto* info = Dev(d);
  if (info == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int* a = info->attributes;
  p->maxThreadsPerBlock = a[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK];
  p->maxThreadsDim[0] = a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X];
  p->maxThreadsDim[1] = a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y];
  p->maxThreadsDim[2] = a[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z];
  p->maxGridSize[0] = a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X];
  p->maxGridSize[1] = a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y];
  p->maxGridSize[2] = a[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z];
  p->sharedMemPerBlock = a[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK];
  p->totalConstantMemory = a[CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY];
  p->SIMDWidth = a[CU_DEVICE_ATTRIBUTE_WARP_SIZE];
  p->memPitch = a[CU_DEVICE_ATTRIBUTE_MAX_PITCH];
  p->regsPerBlock = a[CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK];
  p->clockRate = a[CU_DEVICE_ATTRIBUTE_CLOCK_RATE];
  p->textureAlign = a[CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT];
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGetPCIBusId(char* out, int len, CUdevice d) {
  const auto* info = Dev(d);
  if (info == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (out == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(out, static_cast<size_t>(len), "%08x:%02x:%02x.0",
                info->attributes[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID],
                info->attributes[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID],
                info->attributes[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* id) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < c.device_count(); ++i) {
    char buf[32];
    cuDeviceGetPCIBusId(buf, sizeof(buf), i);
    if (strcasecmp(buf, id) == 0 || strcasecmp(buf + 4, id) == 0) {
      *dev = i;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

// Peer capability is the server's driver's answer (NVLink or PCIe P2P between
// two GPUs of the server), asked once per ordered pair and kept: it does not
// change while the process runs. A device is never its own peer.
FLYT_API CUresult cuDeviceCanAccessPeer(int* can, CUdevice a, CUdevice b) {
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (Dev(a) == nullptr || Dev(b) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (a == b) {
    *can = 0;
    return CUDA_SUCCESS;
  }
  constexpr int kPairs = 64;                          // ordinals below 64 are kept
  static std::atomic<int8_t> known[kPairs * kPairs];  // 0 unknown, 1 no, 2 yes
  const bool keep = a < kPairs && b < kPairs;
  if (keep) {
    int8_t k = known[a * kPairs + b].load(std::memory_order_relaxed);
    if (k != 0) {
      *can = k == 2 ? 1 : 0;
      return CUDA_SUCCESS;
    }
  }
  int answer = 0;
  CUresult rc = Forward<283, true, false>("cuDeviceCanAccessPeer", &answer, a, b);
  if (rc != CUDA_SUCCESS) return rc;
  if (keep) known[a * kPairs + b].store(answer ? 2 : 1, std::memory_order_relaxed);
  *can = answer;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDeviceGetExecAffinitySupport(int* pi, CUexecAffinityType, CUdevice d) {
  if (Dev(d) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pi = 0;
  return CUDA_SUCCESS;
}

// --- contexts

FLYT_API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return Client::Get().RetainPrimary(d, ctx);
}

FLYT_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return Client::Get().ReleasePrimary(d);
}

FLYT_API CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* flags, int* active) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return Client::Get().PrimaryState(d, flags, active) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FLYT_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int flags) {
  if (Dev(d) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  Client::Get().SetPrimaryFlags(d, flags);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  CUcontext ctx = Client::Get().PrimaryHandle(d);
  if (ctx != nullptr) flyt::client::DestroyContextLocalStorage(ctx);
  return Client::Get().ResetPrimary(d);
}

FLYT_API CUresult cuDevicePrimaryCtxReset(CUdevice d) { return cuDevicePrimaryCtxReset_v2(d); }
FLYT_API CUresult cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned int flags) {
  return cuDevicePrimaryCtxSetFlags_v2(d, flags);
}

// Profiler control (cudaProfilerStart/Stop): with no profiler attached the
// driver answers success and does nothing; no profiler attaches to a client's
// worker through Flyt, so the answer is the same. A context must be current.
FLYT_API CUresult cuProfilerStart() {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return flyt::client::CurrentContext() != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
FLYT_API CUresult cuProfilerStop() { return cuProfilerStart(); }

// Context limits: the answers are kept per context (QueryCache), since
// libraries ask before launches (cuDNN before each fused-attention launch),
// and only cuCtxSetLimit changes them; not the stack size, which the driver
// grows for a kernel that needs more.
FLYT_API CUresult cuCtxGetLimit(size_t* value, CUlimit limit) {
  QueryCache& q = QueryCache::Get();
  const uint64_t ctx = reinterpret_cast<uintptr_t>(flyt::client::CurrentContext());
  if (value != nullptr && ctx != 0 && q.FindLimit(ctx, limit, value)) return CUDA_SUCCESS;
  CUresult rc = Forward<101, true, false>("cuCtxGetLimit", value, limit);
  if (rc == CUDA_SUCCESS && value != nullptr && ctx != 0 && limit != CU_LIMIT_STACK_SIZE)
    q.PutLimit(ctx, limit, *value);
  return rc;
}
FLYT_API CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  QueryCache::Get().LimitsChanged();
  return Forward<102, true, false>("cuCtxSetLimit", limit, value);
}

FLYT_API CUresult cuCtxGetCurrent(CUcontext* ctx) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = flyt::client::CurrentContext();
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx == nullptr) {  // pops the top of the stack (nothing when it is empty)
    PopStack();
    return CUDA_SUCCESS;
  }
  if (Client::Get().ContextDevice(ctx) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  flyt::client::SetCurrentContext(ctx);  // replaces the top
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (ctx == nullptr || Client::Get().ContextDevice(ctx) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext cur = flyt::client::CurrentContext();
  if (cur != nullptr) t_stack.push_back(cur);
  flyt::client::SetCurrentContext(ctx);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuCtxPopCurrent_v2(CUcontext* out) {
  CUcontext cur = flyt::client::CurrentContext();
  if (cur == nullptr) return CUDA_ERROR_INVALID_CONTEXT;  // an empty stack
  if (out) *out = cur;
  PopStack();
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
FLYT_API CUresult cuCtxPopCurrent(CUcontext* out) { return cuCtxPopCurrent_v2(out); }

// --- contexts the app creates (cuCtxCreate / cuCtxDestroy)
//
// Each is a context of the app's worker process on the server (a green context
// of the tenant's SM share when the share has one), pushed onto the calling
// thread's stack as the driver does. Execution affinity is not offered
// (cuDeviceGetExecAffinitySupport answers 0): the tenant's share decides the SMs.

namespace {

CUresult CreateAndPush(CUcontext* pctx, unsigned flags, CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (Dev(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  CUcontext ctx = nullptr;
  CUresult rc = c.CreateContext(dev, flags, &ctx);
  if (rc != CUDA_SUCCESS) return rc;
  CUcontext cur = flyt::client::CurrentContext();
  if (cur != nullptr) t_stack.push_back(cur);
  flyt::client::SetCurrentContext(ctx);
  *pctx = ctx;
  return CUDA_SUCCESS;
}

CUresult CheckAffinity(const CUexecAffinityParam* params, int count) {
  if (count < 0 || (count > 0 && params == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  return count > 0 ? CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY : CUDA_SUCCESS;
}

}  // namespace

FLYT_API CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                                 CUdevice dev) {
  if (params != nullptr) {
    // Execution affinity or CUDA-in-graphics, not both; no graphics API here.
    if (params->numExecAffinityParams > 0 && params->cigParams != nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    if (params->cigParams != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = CheckAffinity(params->execAffinityParams, params->numExecAffinityParams);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CreateAndPush(pctx, flags, dev);
}

FLYT_API CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int count,
                                 unsigned int flags, CUdevice dev) {
  CUresult rc = CheckAffinity(params, count);
  return rc != CUDA_SUCCESS ? rc : CreateAndPush(pctx, flags, dev);
}

FLYT_API CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return CreateAndPush(pctx, flags, dev);
}

FLYT_API CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return CreateAndPush(pctx, flags, dev);
}

FLYT_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The primary context (cuDevicePrimaryCtxRelease / Reset are its calls), a
  // context destroyed before, or no context at all.
  if (!c.FindCreatedContext(ctx, nullptr)) return CUDA_ERROR_INVALID_CONTEXT;
  // cudart's state of it goes first, with the dying context current (as natively).
  CUcontext caller = flyt::client::CurrentContext();
  flyt::client::SetCurrentContext(ctx);
  flyt::client::DestroyContextLocalStorage(ctx);
  flyt::client::SetCurrentContext(caller);
  CUresult rc = c.DestroyContext(ctx);
  if (c.FindCreatedContext(ctx, nullptr)) return rc;  // the server never answered
  // Popped from the calling thread's stack when current to it; other threads
  // keep it current (their calls then fail), and so does a stack entry below.
  if (flyt::client::CurrentContext() == ctx) PopStack();
  return rc;
}

FLYT_API CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

FLYT_API CUresult cuCtxGetDevice(CUdevice* dev) {
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int d = Client::Get().ContextDevice(flyt::client::CurrentContext());
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = d;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuCtxGetDevice_v2(CUdevice* dev, CUcontext ctx) {
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int d = Client::Get().ContextDevice(ctx != nullptr ? ctx : flyt::client::CurrentContext());
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = d;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuCtxGetFlags(unsigned int* flags) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client::CreatedContext created;
  if (Client::Get().FindCreatedContext(flyt::client::CurrentContext(), &created)) {
    *flags = created.flags;
    return CUDA_SUCCESS;
  }
  int d = Client::Get().ContextDevice(flyt::client::CurrentContext());
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  return Client::Get().PrimaryContextFlags(d, flags);
}

FLYT_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (Client::Get().ContextDevice(ctx != nullptr ? ctx : flyt::client::CurrentContext()) < 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  *version = 3020;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = ctx != nullptr ? ctx : flyt::client::CurrentContext();
  Client::CreatedContext created;
  if (c != nullptr && Client::Get().FindCreatedContext(c, &created)) {
    *id = created.id;
    return CUDA_SUCCESS;
  }
  int d = Client::Get().ContextDevice(c);
  if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *id = static_cast<unsigned long long>(d) + 1;
  return CUDA_SUCCESS;
}

// Stream capture mode is per thread: it decides which calls are legal while a
// capture runs (an allocation in global mode invalidates it). The client keeps
// each thread's mode and the server's session thread takes it on before that
// thread's next call (Client::SyncContextLocked).
FLYT_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      *mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = flyt::client::CurrentCaptureMode();
  flyt::client::SetCaptureMode(*mode);
  *mode = old;
  return CUDA_SUCCESS;
}

// --- errors

FLYT_API CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto* e = flyt::client::kErrorNames; e->name != nullptr; ++e)
    if (e->code == static_cast<int>(error)) {
      *name = e->name;
      return CUDA_SUCCESS;
    }
  *name = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

FLYT_API CUresult cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto* e = flyt::client::kErrorNames; e->name != nullptr; ++e)
    if (e->code == static_cast<int>(error)) {
      *text = e->text;
      return CUDA_SUCCESS;
    }
  *text = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

// --- entry point discovery

FLYT_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult* status) {
  CUresult rc = flyt::client::LookupDriverProc(symbol, version, flags, pfn, status);
  FLYT_TRACE("cuGetProcAddress(%s, %d, %llu) -> %p", symbol ? symbol : "(null)", version,
             static_cast<unsigned long long>(flags), pfn ? *pfn : nullptr);
  return rc;
}

FLYT_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}

FLYT_API CUresult cuGetExportTable(const void** table, const CUuuid* id) {
  return flyt::client::GetExportTable(table, id);
}

FLYT_API CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }

FLYT_API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  if (ctx != nullptr && Client::Get().ContextDevice(ctx) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  return flyt::client::Forward<100, true, false>("cuCtxSynchronize_v2");
}
