// Driver calls of several kinds, each small: the module of a function or a
// library and the library of a kernel (answered here when this process knows
// the answer exactly), a kernel node's parameters (in memory this library owns,
// as the driver's are the node's), cuGraphInstantiateWithParams and the CUDA
// 10/11 cuGraphInstantiate, context flags and execution affinity, host and
// peer atomic capabilities, cuPointerSetAttribute and the stream memory operations of the
// ABI before CUDA 11.7. They reach the server through kOpDriverMisc
// (protocol/ops.h, server/session_driver_misc.cc) and kOpGraphNodeQuery.
//
// Owns: the kernel node parameter copies handed to the app, which form each
// node's arguments last came in, and which device ranges have
// CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set. No stdout, no exit, no throwing.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "client/client.h"
#include "client/user_objects.h"

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::FuncInfo;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

// The pre-CUDA 11.7 ABI's per-thread symbols, which cuda.h does not declare.
FLYT_API CUresult cuStreamWaitValue32_ptsz(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
FLYT_API CUresult cuStreamWriteValue32_ptsz(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
FLYT_API CUresult cuStreamWaitValue64_ptsz(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
FLYT_API CUresult cuStreamWriteValue64_ptsz(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
FLYT_API CUresult cuStreamBatchMemOp_ptsz(CUstream, unsigned int, CUstreamBatchMemOpParams_v1*,
                                          unsigned int);
FLYT_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec*, CUgraph,
                                                    CUDA_GRAPH_INSTANTIATE_PARAMS*);
FLYT_API CUresult cuGraphInstantiate_v2(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);

namespace {

uint64_t Raw(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A kOpDriverMisc call; the reply's payload goes to *reply.
CUresult Misc(const char* name, const wire::Writer& w, std::vector<uint8_t>* reply,
              bool per_thread = false) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return c.Call(name, ops::kOpDriverMisc, w, ReplySink{reply},
                per_thread ? wire::kFlagPerThread : 0);
}

// FuncGetModule / LibraryGetModule on the server: a library's module is
// learnt with its functions, so that cuModuleGetFunction finds them.
CUresult ModuleFromServer(const char* name, uint8_t sub, uint64_t handle, CUmodule* out) {
  wire::Writer w;
  w.Put<uint8_t>(sub);
  w.Put<uint64_t>(handle);
  std::vector<uint8_t> reply;
  CUresult rc = Misc(name, w, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint64_t mod = 0, library = 0;
  uint8_t owned = 0;
  if (!r.Get(&mod) || !r.Get(&owned) || !r.Get(&library)) return CUDA_ERROR_UNKNOWN;
  if (owned != 0) {
    std::vector<std::pair<uint64_t, FuncInfo>> fns;
    if (!flyt::client::ReadFunctionList(r, false, &fns)) return CUDA_ERROR_UNKNOWN;
    Client::Get().AddLibraryModule(mod, library, std::move(fns));
  }
  *out = reinterpret_cast<CUmodule>(mod);
  return CUDA_SUCCESS;
}

// --- kernel node parameters handed to the app: the node's, until its
// parameters change (as natively), kept by node handle.
struct KernelArgs {
  std::vector<uint64_t> storage;  // the argument bytes, 8-byte aligned
  std::vector<void*> pointers;    // kernelParams
  size_t size = 0;
  void* extra[5] = {};
};
std::mutex g_args_mu;
std::unordered_map<uint64_t, std::unique_ptr<KernelArgs>>& NodeArgs() {
  static auto* m = new std::unordered_map<uint64_t, std::unique_ptr<KernelArgs>>;  // never freed
  return *m;
}
std::unordered_map<uint64_t, bool>& NodeThroughExtra() {
  static auto* m = new std::unordered_map<uint64_t, bool>;  // never freed
  return *m;
}

std::mutex g_sync_mu;
std::set<uint64_t>& SyncMemopsRanges() {
  static auto* s = new std::set<uint64_t>;  // never freed
  return *s;
}

// Fills a CUDA 12 CUDA_KERNEL_NODE_PARAMS from the server's description.
CUresult KernelNodeParams(const char* name, CUgraphNode node, CUDA_KERNEL_NODE_PARAMS* p) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(node));
  std::vector<uint8_t> reply;
  // Several servers: the node's server; the handles it answers get its tag.
  const int server = flyt::client::GraphServer({Raw(node)});
  flyt::client::GraphRoute route(server);
  CUresult rc = c.Call(name, ops::kOpGraphNodeQuery, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint32_t type = 0;
  if (!r.Get(&type)) return CUDA_ERROR_UNKNOWN;
  if (type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  uint64_t func = 0, kern = 0, ctx = 0;
  uint32_t dims[6] = {}, shmem = 0, n = 0;
  if (!r.Get(&func) || !r.Get(&kern) || !r.Get(&ctx) || !r.GetBytes(dims, sizeof(dims)) ||
      !r.Get(&shmem) || !r.Get(&n) || n > ops::kMaxParams)
    return CUDA_ERROR_UNKNOWN;
  if (server > 0) {
    func = Client::Tag(func, server);
    kern = Client::Tag(kern, server);
    ctx = Client::Tag(ctx, server);
  }
  std::vector<ops::ParamSlot> slots(n);
  if (n > 0 && !r.GetBytes(slots.data(), n * sizeof(ops::ParamSlot))) return CUDA_ERROR_UNKNOWN;
  const uint8_t* blob = nullptr;
  uint32_t blob_len = 0;
  if (!r.GetBlob(&blob, &blob_len, ops::kMaxParamBytes)) return CUDA_ERROR_UNKNOWN;
  for (const auto& s : slots)
    if (s.offset + static_cast<uint64_t>(s.size) > blob_len) return CUDA_ERROR_UNKNOWN;
  std::lock_guard<std::mutex> lock(g_args_mu);
  auto& held = NodeArgs()[Raw(node)];
  // The same bytes as handed out before keep their memory: an app may hold it.
  if (held == nullptr || held->size != blob_len || held->pointers.size() != n ||
      std::memcmp(held->storage.data(), blob, blob_len) != 0) {
    auto args = std::make_unique<KernelArgs>();
    args->storage.assign((blob_len + 7) / 8 + 1, 0);
    if (blob_len > 0) std::memcpy(args->storage.data(), blob, blob_len);
    args->size = blob_len;
    auto* base = reinterpret_cast<uint8_t*>(args->storage.data());
    for (const auto& s : slots) args->pointers.push_back(base + s.offset);
    // In the driver's order (measured on the H200): the size, then the buffer.
    args->extra[0] = CU_LAUNCH_PARAM_BUFFER_SIZE;
    args->extra[1] = &args->size;
    args->extra[2] = CU_LAUNCH_PARAM_BUFFER_POINTER;
    args->extra[3] = base;
    args->extra[4] = CU_LAUNCH_PARAM_END;
    held = std::move(args);
  }
  auto ex = NodeThroughExtra().find(Raw(node));
  const bool through_extra = ex != NodeThroughExtra().end() && ex->second;
  *p = CUDA_KERNEL_NODE_PARAMS{};
  p->func = reinterpret_cast<CUfunction>(func);
  p->kern = reinterpret_cast<CUkernel>(kern);
  p->ctx = reinterpret_cast<CUcontext>(ctx);
  p->gridDimX = dims[0];
  p->gridDimY = dims[1];
  p->gridDimZ = dims[2];
  p->blockDimX = dims[3];
  p->blockDimY = dims[4];
  p->blockDimZ = dims[5];
  p->sharedMemBytes = shmem;
  if (through_extra) {
    p->extra = held->extra;
  } else {
    p->kernelParams = held->pointers.empty() ? nullptr : held->pointers.data();
  }
  return CUDA_SUCCESS;
}

CUresult ExecAffinity(CUexecAffinityParam* p, CUexecAffinityType type) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int dev = c.ContextDevice(flyt::client::CurrentContext());
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult rc = Forward<282, true, false>("cuCtxGetExecAffinity", p, type);
  // Under an SM share the tenant's GPU has the share's SMs (the inventory's).
  const ops::DeviceInfo* d = c.device(dev);
  const int sms = d != nullptr ? d->attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] : 0;
  if (rc == CUDA_SUCCESS && type == CU_EXEC_AFFINITY_TYPE_SM_COUNT && sms > 0 &&
      p->param.smCount.val > static_cast<unsigned>(sms))
    p->param.smCount.val = static_cast<unsigned>(sms);
  return rc;
}

// The pre-11.7 ABI of stream memory operations: with several servers, to the
// stream's server (its handle untagged), as the _v2 calls (api_stream_memops.cc).
CUresult MemOpV1(const char* name, bool per_thread, uint8_t kind, CUstream s, CUdeviceptr addr,
                 uint64_t value, unsigned flags) {
  const uint64_t address = addr;
  const int server = flyt::client::StreamMemOpServer(s, &address, 1);
  if (server == -2) return flyt::client::RefuseAcrossServers(name);
  wire::Writer w;
  w.Put<uint8_t>(ops::kDriverMiscStreamMemOpV1);
  w.Put<uint8_t>(kind);
  w.Put<uint64_t>(Client::WireHandle(s));
  w.Put<uint64_t>(addr);
  w.Put<uint64_t>(value);
  w.Put<uint32_t>(flags);
  std::vector<uint8_t> reply;
  Client::RouteScope route(server);
  return Misc(name, w, &reply, per_thread);
}

CUresult BatchV1(const char* name, bool per_thread, CUstream s, unsigned count,
                 CUstreamBatchMemOpParams_v1* params, unsigned flags) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count > ops::kMaxBatchMemOps || (count > 0 && params == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  static_assert(sizeof(CUstreamBatchMemOpParams_v1) == 48, "the v1 batch is 48-byte entries");
  std::vector<uint64_t> addresses(count);
  for (unsigned i = 0; i < count; ++i) addresses[i] = flyt::client::MemOpAddress(params[i]);
  const int server = flyt::client::StreamMemOpServer(s, addresses.data(), count);
  if (server == -2) return flyt::client::RefuseAcrossServers(name);
  wire::Writer w;
  w.Put<uint8_t>(ops::kDriverMiscStreamMemOpV1);
  w.Put<uint8_t>(ops::kMemOpV1Batch);
  w.Put<uint64_t>(Client::WireHandle(s));
  w.Put<uint32_t>(flags);
  w.Put<uint32_t>(count);
  if (count > 0) w.PutBytes(params, count * sizeof(CUstreamBatchMemOpParams_v1));
  std::vector<uint8_t> reply;
  Client::RouteScope route(server);
  return Misc(name, w, &reply, per_thread);
}

CUresult InstantiateWithParams(const char* name, bool per_thread, CUgraphExec* exec, CUgraph g,
                               CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  if (exec == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint8_t>(ops::kDriverMiscInstantiateWithParams);
  w.Put<uint64_t>(Raw(g));
  w.Put<uint64_t>(p->flags);
  w.Put<uint64_t>(Raw(p->hUploadStream));
  std::vector<uint8_t> reply;
  CUresult rc = Misc(name, w, &reply, per_thread);
  wire::Reader r(reply.data(), reply.size());
  uint64_t h = 0, err_node = 0;
  uint32_t result = 0;
  if (!r.Get(&h) || !r.Get(&result) || !r.Get(&err_node)) {
    // No answer from the driver (a handle the server refused, a lost connection).
    p->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
    p->hErrNode_out = nullptr;
    return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_UNKNOWN;
  }
  p->result_out = static_cast<CUgraphInstantiateResult>(result);
  p->hErrNode_out = reinterpret_cast<CUgraphNode>(err_node);
  if (rc == CUDA_SUCCESS) *exec = reinterpret_cast<CUgraphExec>(h);
  if (rc == CUDA_SUCCESS && flyt::client::user_objects::Any())
    flyt::client::user_objects::Instantiated(g, *exec);
  return rc;
}

}  // namespace

namespace flyt::client {

void NoteKernelNodeArgs(CUgraphNode node, bool through_extra) {
  std::lock_guard<std::mutex> lock(g_args_mu);
  if (through_extra) {
    NodeThroughExtra()[Raw(node)] = true;
  } else {
    NodeThroughExtra().erase(Raw(node));
  }
}

bool KernelNodeThroughExtra(CUgraphNode node) {
  std::lock_guard<std::mutex> lock(g_args_mu);
  auto it = NodeThroughExtra().find(Raw(node));
  return it != NodeThroughExtra().end() && it->second;
}

bool SyncMemops(uint64_t base) {
  std::lock_guard<std::mutex> lock(g_sync_mu);
  return SyncMemopsRanges().count(base) != 0;
}

void ForgetSyncMemops(uint64_t base) {
  std::lock_guard<std::mutex> lock(g_sync_mu);
  SyncMemopsRanges().erase(base);
}

}  // namespace flyt::client

// --- handle to handle

// A module's function: its module is known here. A library's function (from
// cuKernelGetFunction, e.g. cudart's) belongs to the library's module in the
// function's context, which the server's driver names.
FLYT_API CUresult cuFuncGetModule(CUmodule* hmod, CUfunction f) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (hmod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto info = c.Func(Raw(f));
  bool is_library = false;
  if (info != nullptr && !info->is_kernel && c.ImageKind(info->image, &is_library, nullptr) &&
      !is_library) {
    *hmod = reinterpret_cast<CUmodule>(info->image);
    return CUDA_SUCCESS;
  }
  return ModuleFromServer("cuFuncGetModule", ops::kDriverMiscFuncGetModule, Raw(f), hmod);
}

FLYT_API CUresult cuKernelGetLibrary(CUlibrary* lib, CUkernel k) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (lib == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto info = c.Func(Raw(k));
  if (info == nullptr || !info->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  bool is_library = false;
  if (!c.ImageKind(info->image, &is_library, nullptr) || !is_library) return CUDA_ERROR_NOT_FOUND;
  *lib = reinterpret_cast<CUlibrary>(info->image);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuLibraryGetModule(CUmodule* mod, CUlibrary lib) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (mod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return ModuleFromServer("cuLibraryGetModule", ops::kDriverMiscLibraryGetModule, Raw(lib), mod);
}

// --- graphs

FLYT_API CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS* p) {
  return KernelNodeParams("cuGraphKernelNodeGetParams", node, p);
}
#undef cuGraphKernelNodeGetParams
FLYT_API CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2{};
  CUresult rc = KernelNodeParams("cuGraphKernelNodeGetParams", node, &v2);
  if (rc != CUDA_SUCCESS) return rc;
  *p = CUDA_KERNEL_NODE_PARAMS_v1{};
  // The CUDA 11 structure has no kernel field: a node of a CUkernel names its function.
  p->func = v2.func != nullptr ? v2.func : reinterpret_cast<CUfunction>(v2.kern);
  p->gridDimX = v2.gridDimX;
  p->gridDimY = v2.gridDimY;
  p->gridDimZ = v2.gridDimZ;
  p->blockDimX = v2.blockDimX;
  p->blockDimY = v2.blockDimY;
  p->blockDimZ = v2.blockDimZ;
  p->sharedMemBytes = v2.sharedMemBytes;
  p->kernelParams = v2.kernelParams;
  p->extra = v2.extra;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph g,
                                               CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return InstantiateWithParams("cuGraphInstantiateWithParams", false, exec, g, p);
}
FLYT_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph g,
                                                    CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return InstantiateWithParams("cuGraphInstantiateWithParams_ptsz", true, exec, g, p);
}

// The CUDA 10 and 11 ABIs: no flags, the failing node and a log instead. The
// log is left empty (an empty string when there is room for one).
FLYT_API CUresult cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph g, CUgraphNode* err_node,
                                        char* log, size_t log_size) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_GRAPH_INSTANTIATE_PARAMS p{};
  CUresult rc = InstantiateWithParams("cuGraphInstantiate", false, exec, g, &p);
  if (err_node != nullptr) *err_node = p.hErrNode_out;
  if (log != nullptr && log_size > 0) log[0] = '\0';
  return rc;
}
#undef cuGraphInstantiate
FLYT_API CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph g, CUgraphNode* err_node, char* log,
                                     size_t log_size) {
  return cuGraphInstantiate_v2(exec, g, err_node, log, log_size);
}

// --- contexts and devices

FLYT_API CUresult cuCtxSetFlags(unsigned int flags) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  CUcontext cur = flyt::client::CurrentContext();
  if (c.ContextDevice(cur) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  wire::Writer w;
  w.Put<uint8_t>(ops::kDriverMiscCtxSetFlags);
  w.Put<uint32_t>(flags);
  std::vector<uint8_t> reply;
  CUresult rc = Misc("cuCtxSetFlags", w, &reply);
  wire::Reader r(reply.data(), reply.size());
  uint32_t now = 0;
  // cuCtxGetFlags is answered here: it reports what the driver now has.
  if (rc == CUDA_SUCCESS && r.Get(&now)) c.SetContextFlags(cur, now);
  return rc;
}

FLYT_API CUresult cuCtxGetExecAffinity(CUexecAffinityParam* p, CUexecAffinityType type) {
  return ExecAffinity(p, type);
}

namespace {
// Atomic capabilities the server's driver answers for `devices` (the host's: one
// device; between two GPUs: both), asked in pieces of at most kMaxAtomicOps: the
// answers are per operation.
CUresult AskAtomicCaps(const char* name, uint8_t sub, std::initializer_list<int32_t> devices,
                       unsigned int* caps, const CUatomicOperation* operations,
                       unsigned int count) {
  for (unsigned at = 0; at < count; at += ops::kMaxAtomicOps) {
    const unsigned n = std::min<unsigned>(count - at, ops::kMaxAtomicOps);
    wire::Writer w;
    w.Put<uint8_t>(sub);
    for (int32_t d : devices) w.Put<int32_t>(d);
    w.Put<uint32_t>(n);
    for (unsigned i = 0; i < n; ++i) w.Put<uint32_t>(static_cast<uint32_t>(operations[at + i]));
    std::vector<uint8_t> reply;
    CUresult rc = Misc(name, w, &reply);
    if (rc != CUDA_SUCCESS) return rc;
    wire::Reader r(reply.data(), reply.size());
    for (unsigned i = 0; i < n; ++i) {
      uint32_t v = 0;
      if (!r.Get(&v)) return CUDA_ERROR_UNKNOWN;
      caps[at + i] = v;
    }
  }
  return CUDA_SUCCESS;
}
}  // namespace

FLYT_API CUresult cuDeviceGetHostAtomicCapabilities(unsigned int* caps,
                                                    const CUatomicOperation* operations,
                                                    unsigned int count, CUdevice dev) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || dev >= c.device_count()) return CUDA_ERROR_INVALID_DEVICE;
  if (caps == nullptr || operations == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  return AskAtomicCaps("cuDeviceGetHostAtomicCapabilities", ops::kDriverMiscHostAtomicCaps, {dev},
                       caps, operations, count);
}

// Atomic operations between two GPUs of the server, as its driver answers
// (NVLink or PCIe).
FLYT_API CUresult cuDeviceGetP2PAtomicCapabilities(unsigned int* caps,
                                                   const CUatomicOperation* operations,
                                                   unsigned int count, CUdevice src, CUdevice dst) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (src < 0 || src >= c.device_count() || dst < 0 || dst >= c.device_count())
    return CUDA_ERROR_INVALID_DEVICE;
  if (caps == nullptr || operations == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  return AskAtomicCaps("cuDeviceGetP2PAtomicCapabilities", ops::kDriverMiscP2PAtomicCaps,
                       {src, dst}, caps, operations, count);
}

// Only CU_POINTER_ATTRIBUTE_SYNC_MEMOPS is settable; the server's driver
// checks the attribute and the pointer. Flyt's session already completes each
// synchronous operation before the next call, so the setting changes no order;
// cuPointerGetAttribute reads it back.
FLYT_API CUresult cuPointerSetAttribute(const void* value, CUpointer_attribute attr,
                                        CUdeviceptr ptr) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned v = 0;
  std::memcpy(&v, value, sizeof(v));  // SYNC_MEMOPS takes an unsigned int
  wire::Writer w;
  w.Put<uint8_t>(ops::kDriverMiscPointerSetAttribute);
  w.Put<uint32_t>(static_cast<uint32_t>(attr));
  w.Put<uint32_t>(v);
  w.Put<uint64_t>(ptr);
  std::vector<uint8_t> reply;
  CUresult rc = Misc("cuPointerSetAttribute", w, &reply);
  uint64_t base = 0;
  if (rc == CUDA_SUCCESS && attr == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS &&
      c.FindDeviceRange(ptr, 0, &base, nullptr)) {
    std::lock_guard<std::mutex> lock(g_sync_mu);
    if (v != 0) {
      SyncMemopsRanges().insert(base);
    } else {
      SyncMemopsRanges().erase(base);
    }
  }
  return rc;
}

// --- stream memory operations, the ABI before CUDA 11.7 (cuda.h maps these
// names to the _v2 ABI, so they are named here by their symbols)

#undef cuStreamWaitValue32
#undef cuStreamWriteValue32
#undef cuStreamWaitValue64
#undef cuStreamWriteValue64
#undef cuStreamBatchMemOp

#define FLYT_MEMOP_V1(sym, kind, type)                                                     \
  FLYT_API CUresult sym(CUstream s, CUdeviceptr addr, type value, unsigned int flags) {    \
    if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;                   \
    return MemOpV1(#sym, false, ops::kind, s, addr, value, flags);                         \
  }                                                                                        \
  FLYT_API CUresult sym##_ptsz(CUstream s, CUdeviceptr addr, type value, unsigned flags) { \
    if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;                   \
    return MemOpV1(#sym "_ptsz", true, ops::kind, s, addr, value, flags);                  \
  }
FLYT_MEMOP_V1(cuStreamWaitValue32, kMemOpV1Wait32, cuuint32_t)
FLYT_MEMOP_V1(cuStreamWriteValue32, kMemOpV1Write32, cuuint32_t)
FLYT_MEMOP_V1(cuStreamWaitValue64, kMemOpV1Wait64, cuuint64_t)
FLYT_MEMOP_V1(cuStreamWriteValue64, kMemOpV1Write64, cuuint64_t)
#undef FLYT_MEMOP_V1

FLYT_API CUresult cuStreamBatchMemOp(CUstream s, unsigned int count,
                                     CUstreamBatchMemOpParams_v1* params, unsigned int flags) {
  return BatchV1("cuStreamBatchMemOp", false, s, count, params, flags);
}
FLYT_API CUresult cuStreamBatchMemOp_ptsz(CUstream s, unsigned int count,
                                          CUstreamBatchMemOpParams_v1* params, unsigned int flags) {
  return BatchV1("cuStreamBatchMemOp_ptsz", true, s, count, params, flags);
}

// Measured natively (H200, driver 580): attributes copied into a kernel node
// whose arguments last came through `extra` are refused; a node with
// kernelParams, of the same graph or another, takes them.
FLYT_API CUresult cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  if (dst != nullptr && flyt::client::KernelNodeThroughExtra(dst)) return CUDA_ERROR_INVALID_VALUE;
  return Forward<276, true, false>("cuGraphKernelNodeCopyAttributes", dst, src);
}
