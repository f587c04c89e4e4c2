// kOpDriverMisc (protocol/ops.h): small driver calls of several kinds that the
// generic path cannot carry: the module of a function or library, host and peer atomic
// capabilities, cuPointerSetAttribute, cuGraphInstantiateWithParams,
// cuOccupancyMaxPotentialClusterSize, cuCtxSetFlags and the stream memory
// operations of the ABI before CUDA 11.7. Also a kernel node's parameters for
// kOpGraphNodeQuery, and kernel node attributes that name an event.
//
// Owns: library_modules_ (modules that libraries own: adopted as the
// session's, never unloaded on their own, forgotten with their library).
// Must not touch other sessions' handles; every handle is checked before it
// reaches the driver.
#include <algorithm>
#include <cstring>

#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

namespace {
uint64_t Raw(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The operations of an atomic-capabilities question, after its devices: u32 n,
// n x u32 CUatomicOperation (the answer: n x u32 capability bits).
bool ReadAtomicOps(wire::Reader& in, std::vector<CUatomicOperation>* asked) {
  uint32_t n = 0;
  if (!in.Get(&n) || n == 0 || n > ops::kMaxAtomicOps || in.remaining() != n * sizeof(uint32_t))
    return false;
  asked->resize(n);
  for (auto& op : *asked) {
    uint32_t v = 0;
    in.Get(&v);
    op = static_cast<CUatomicOperation>(v);
  }
  return true;
}
}  // namespace

uint64_t Session::ClientContext(CUcontext real) const {
  if (real == nullptr) return 0;
  if (real == exec_ || real == primary_) return Raw(primary_);
  for (const auto& [raw, uc] : user_contexts_)
    if (RealContext(raw) == real) return raw;
  return 0;
}

void Session::ForgetLibraryModules(uint64_t library) {
  for (auto it = library_modules_.begin(); it != library_modules_.end();) {
    if (it->second == library) {
      handles_[static_cast<int>(HandleKind::kModule)].erase(it->first);
      if (!user_owned_.empty()) DropContextHandle(HandleKind::kModule, it->first);
      it = library_modules_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = kernel_library_.begin(); it != kernel_library_.end();)
    it = it->second == library ? kernel_library_.erase(it) : std::next(it);
  for (auto it = function_library_.begin(); it != function_library_.end();)
    it = it->second == library ? function_library_.erase(it) : std::next(it);
}

CUresult Session::KernelNodeSetAttribute(CUgraphNode node, CUkernelNodeAttrID attr,
                                         const CUkernelNodeAttrValue* value) {
  CUkernelNodeAttrValue v{};
  if (value != nullptr) {
    v = *value;
    CUevent* ev = nullptr;
    if (attr == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT) ev = &v.programmaticEvent.event;
    if (attr == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) ev = &v.launchCompletionEvent.event;
    if (ev != nullptr && *ev != nullptr) {
      if (!Owns(HandleKind::kEvent, Raw(*ev))) return CUDA_ERROR_INVALID_HANDLE;
      *ev = reinterpret_cast<CUevent>(RealHandle(HandleKind::kEvent, Raw(*ev)));
    }
  }
  if (state_->api.cuGraphKernelNodeSetAttribute == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return state_->api.cuGraphKernelNodeSetAttribute(node, attr, value != nullptr ? &v : nullptr);
}

CUresult Session::KernelNodeArgs(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS* out_p,
                                 std::vector<ops::ParamSlot>* out_slots,
                                 std::vector<uint8_t>* out_blob) {
  DriverApi& a = state_->api;
  if (a.cuGraphKernelNodeGetParams_v2 == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUDA_KERNEL_NODE_PARAMS& p = *out_p;
  p = CUDA_KERNEL_NODE_PARAMS{};
  CUresult rc = a.cuGraphKernelNodeGetParams_v2(node, &p);
  if (rc != CUDA_SUCCESS) return rc;
  const uint64_t func = Raw(p.func), kern = Raw(p.kern);
  std::vector<ops::ParamSlot>& slots = *out_slots;
  slots.clear();
  if (func != 0 || kern != 0)  // those found before any failure
    DriverParamLayout(func != 0 ? func : kern, func == 0, &slots);
  uint32_t bytes = 0;
  for (const ops::ParamSlot& slot : slots) {
    if (slot.offset + slot.size > ops::kMaxParamBytes) return CUDA_ERROR_UNKNOWN;
    bytes = std::max(bytes, slot.offset + slot.size);
  }
  std::vector<uint8_t>& blob = *out_blob;
  blob.clear();
  if (p.kernelParams != nullptr) {
    blob.assign(bytes, 0);
    for (size_t i = 0; i < slots.size(); ++i)
      if (p.kernelParams[i] != nullptr)
        std::memcpy(blob.data() + slots[i].offset, p.kernelParams[i], slots[i].size);
  } else if (p.extra != nullptr) {
    // The node holds one argument buffer (Flyt launches with one, so a
    // captured kernel's node does).
    const void* buf = nullptr;
    size_t size = 0;
    for (int i = 0; i < 16 && p.extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = p.extra[i + 1];
      if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && p.extra[i + 1] != nullptr)
        size = *static_cast<const size_t*>(p.extra[i + 1]);
    }
    if (buf != nullptr && size <= ops::kMaxParamBytes) {
      blob.assign(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + size);
    }
  }
  return CUDA_SUCCESS;
}

// Writes the KERNEL part of a kOpGraphNodeQuery reply (protocol/ops.h).
CUresult Session::DescribeKernelNode(CUgraphNode node, Writer& out) {
  CUDA_KERNEL_NODE_PARAMS p{};
  std::vector<ops::ParamSlot> slots;
  std::vector<uint8_t> blob;
  CUresult rc = KernelNodeArgs(node, &p, &slots, &blob);
  if (rc != CUDA_SUCCESS) return rc;
  // Handles the driver names are the client's from now on (a kernel node made
  // from a CUkernel may answer with that kernel's function in its context,
  // which is then known as made from that kernel: session_graph_move.cc).
  uint64_t func = 0, kern = 0;
  if (p.func != nullptr) {
    func = ClientFunctionOf(Raw(p.func));
    Adopt(HandleKind::kFunction, func);
  }
  if (p.kern != nullptr) {
    kern = ClientHandle(HandleKind::kKernel, Raw(p.kern));
    Adopt(HandleKind::kKernel, kern);
  }
  out.Put(func);
  out.Put(kern);
  out.Put(ClientContext(p.ctx));
  const uint32_t dims[6] = {p.gridDimX,  p.gridDimY,  p.gridDimZ,
                            p.blockDimX, p.blockDimY, p.blockDimZ};
  out.PutBytes(dims, sizeof(dims));
  out.Put<uint32_t>(p.sharedMemBytes);
  out.Put<uint32_t>(static_cast<uint32_t>(slots.size()));
  for (const auto& s : slots) out.Put(s);
  out.PutBlob(blob.data(), blob.size());
  return CUDA_SUCCESS;
}

// FuncGetModule / LibraryGetModule: u64 handle -> u64 module, u8 owned by a
// library, u64 library, (owned) the module's functions.
bool Session::ModuleOf(uint8_t sub, Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t h = 0;
  if (!in.Get(&h) || in.remaining() != 0) return false;
  const bool of_function = sub == ops::kDriverMiscFuncGetModule;
  if (!Owns(of_function ? HandleKind::kFunction : HandleKind::kLibrary, h)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  auto fn = of_function ? a.cuFuncGetModule : nullptr;
  if ((of_function && fn == nullptr) || (!of_function && a.cuLibraryGetModule == nullptr)) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  CUmodule m = nullptr;
  *rc = of_function ? fn(&m, reinterpret_cast<CUfunction>(RealHandle(HandleKind::kFunction, h)))
                    : a.cuLibraryGetModule(
                          &m, reinterpret_cast<CUlibrary>(RealHandle(HandleKind::kLibrary, h)));
  if (*rc != CUDA_SUCCESS) return true;
  const uint64_t mod = m != nullptr ? ClientHandle(HandleKind::kModule, Raw(m)) : 0;
  if (mod == 0) {
    *rc = CUDA_ERROR_NOT_FOUND;
    return true;
  }
  bool owned = !Owns(HandleKind::kModule, mod) || LibraryOwnsModule(mod);
  uint64_t library = 0;
  if (owned) {
    auto known = library_modules_.find(mod);
    if (known != library_modules_.end()) {
      library = known->second;
    } else if (!of_function) {
      library = h;
    } else {
      auto lib = function_library_.find(h);
      if (lib != function_library_.end()) library = lib->second;
    }
    Adopt(HandleKind::kModule, mod);
    library_modules_[mod] = library;
  }
  out.Put(mod);
  out.Put<uint8_t>(owned ? 1 : 0);
  out.Put(library);
  if (owned) DescribeImage(Raw(m), mod, false, out);
  return true;
}

bool Session::StreamMemOpV1(Reader& in, bool per_thread, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t kind = 0;
  uint64_t stream = 0;
  if (!in.Get(&kind) || kind > ops::kMemOpV1Batch || !in.Get(&stream)) return false;
  auto pick = [&](auto base, auto pt) { return per_thread && pt != nullptr ? pt : base; };
  const uint64_t real_raw = stream == 0 && per_thread ? 2 : stream;
  if (kind == ops::kMemOpV1Batch) {
    uint32_t flags = 0, count = 0;
    if (!in.Get(&flags) || !in.Get(&count) || count > ops::kMaxBatchMemOps ||
        in.remaining() != count * sizeof(CUstreamBatchMemOpParams))
      return false;
    std::vector<CUstreamBatchMemOpParams> ops(count);
    if (count > 0) std::memcpy(ops.data(), in.Skip(in.remaining()), count * sizeof(ops[0]));
    if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
      *rc = CUDA_ERROR_INVALID_HANDLE;
      return true;
    }
    auto batch = pick(a.cuStreamBatchMemOp_v1, a.cuStreamBatchMemOp_v1_pt);
    *rc = batch == nullptr
              ? CUDA_ERROR_NOT_SUPPORTED
              : batch(RealStream(real_raw), count, count > 0 ? ops.data() : nullptr, flags);
    return true;
  }
  uint64_t addr = 0, value = 0;
  uint32_t flags = 0;
  if (!in.Get(&addr) || !in.Get(&value) || !in.Get(&flags) || in.remaining() != 0) return false;
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  CUstream s = RealStream(real_raw);
  const auto v32 = static_cast<cuuint32_t>(value);
  switch (kind) {
    case ops::kMemOpV1Wait32: {
      auto f = pick(a.cuStreamWaitValue32_v1, a.cuStreamWaitValue32_v1_pt);
      *rc = f == nullptr ? CUDA_ERROR_NOT_SUPPORTED : f(s, addr, v32, flags);
      break;
    }
    case ops::kMemOpV1Write32: {
      auto f = pick(a.cuStreamWriteValue32_v1, a.cuStreamWriteValue32_v1_pt);
      *rc = f == nullptr ? CUDA_ERROR_NOT_SUPPORTED : f(s, addr, v32, flags);
      break;
    }
    case ops::kMemOpV1Wait64: {
      auto f = pick(a.cuStreamWaitValue64_v1, a.cuStreamWaitValue64_v1_pt);
      *rc = f == nullptr ? CUDA_ERROR_NOT_SUPPORTED : f(s, addr, value, flags);
      break;
    }
    default: {
      auto f = pick(a.cuStreamWriteValue64_v1, a.cuStreamWriteValue64_v1_pt);
      *rc = f == nullptr ? CUDA_ERROR_NOT_SUPPORTED : f(s, addr, value, flags);
      break;
    }
  }
  return true;
}

bool Session::DriverMisc(Reader& in, bool per_thread, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t sub = 0;
  *rc = CUDA_SUCCESS;
  if (!in.Get(&sub)) return false;
  switch (sub) {
    case ops::kDriverMiscFuncGetModule:
    case ops::kDriverMiscLibraryGetModule:
      return ModuleOf(sub, in, out, rc);
    case ops::kDriverMiscHostAtomicCaps: {
      int32_t dev = 0;
      std::vector<CUatomicOperation> asked;
      if (!in.Get(&dev) || !ReadAtomicOps(in, &asked)) return false;
      if (a.cuDeviceGetHostAtomicCapabilities == nullptr) {
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        return true;
      }
      std::vector<unsigned> caps(asked.size(), 0);
      *rc = a.cuDeviceGetHostAtomicCapabilities(caps.data(), asked.data(),
                                                static_cast<unsigned>(asked.size()), dev);
      for (unsigned c : caps) out.Put<uint32_t>(c);
      return true;
    }
    case ops::kDriverMiscP2PAtomicCaps: {  // between two GPUs of this server
      int32_t src = 0, dst = 0;
      std::vector<CUatomicOperation> asked;
      if (!in.Get(&src) || !in.Get(&dst) || !ReadAtomicOps(in, &asked)) return false;
      if (a.cuDeviceGetP2PAtomicCapabilities == nullptr) {
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        return true;
      }
      std::vector<unsigned> caps(asked.size(), 0);
      *rc = a.cuDeviceGetP2PAtomicCapabilities(caps.data(), asked.data(),
                                               static_cast<unsigned>(asked.size()), src, dst);
      for (unsigned c : caps) out.Put<uint32_t>(c);
      return true;
    }
    case ops::kDriverMiscPointerSetAttribute: {
      uint32_t attr = 0, value = 0;
      uint64_t ptr = 0;
      if (!in.Get(&attr) || !in.Get(&value) || !in.Get(&ptr) || in.remaining() != 0) return false;
      // Only the driver's own allocations take attributes; it checks the
      // pointer against them, and this worker holds no other client's.
      *rc = a.cuPointerSetAttribute == nullptr
                ? CUDA_ERROR_NOT_SUPPORTED
                : a.cuPointerSetAttribute(&value, static_cast<CUpointer_attribute>(attr), ptr);
      return true;
    }
    case ops::kDriverMiscInstantiateWithParams: {
      uint64_t graph = 0, flags = 0, stream = 0;
      if (!in.Get(&graph) || !in.Get(&flags) || !in.Get(&stream) || in.remaining() != 0)
        return false;
      if (!Owns(HandleKind::kGraph, graph) || (stream > 2 && !Owns(HandleKind::kStream, stream))) {
        *rc = CUDA_ERROR_INVALID_HANDLE;
        return true;
      }
      auto fn = per_thread && a.cuGraphInstantiateWithParams_pt != nullptr
                    ? a.cuGraphInstantiateWithParams_pt
                    : a.cuGraphInstantiateWithParams;
      if (fn == nullptr) {
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        return true;
      }
      CUDA_GRAPH_INSTANTIATE_PARAMS p{};
      p.flags = flags;
      p.hUploadStream = RealStream(stream);
      CUgraphExec exec = nullptr;
      *rc = fn(&exec, reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph)), &p);
      uint64_t client = 0;
      if (*rc == CUDA_SUCCESS) {
        client = ClientHandle(HandleKind::kGraphExec, Raw(exec));
        Adopt(HandleKind::kGraphExec, client);
        NoteInstantiated(client, graph, flags);  // its template (session_graph_move.cc)
      }
      const uint64_t err_client =
          p.hErrNode_out != nullptr ? ClientHandle(HandleKind::kGraphNode, Raw(p.hErrNode_out)) : 0;
      const uint64_t err_node = Owns(HandleKind::kGraphNode, err_client) ? err_client : 0;
      out.Put<uint64_t>(client);
      out.Put<uint32_t>(static_cast<uint32_t>(p.result_out));
      out.Put<uint64_t>(err_node);
      return true;
    }
    case ops::kDriverMiscMaxPotentialClusterSize: {
      CUlaunchConfig cfg;
      CUlaunchAttribute attrs[65];
      uint64_t fn = 0;
      if (!DecodeLaunchHead(in, &cfg, attrs, &fn, rc) || in.remaining() != 0) return false;
      if (*rc != CUDA_SUCCESS) return true;
      if (a.cuOccupancyMaxPotentialClusterSize == nullptr) {
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        return true;
      }
      int size = 0;
      *rc = a.cuOccupancyMaxPotentialClusterSize(&size, reinterpret_cast<CUfunction>(fn), &cfg);
      out.Put<int32_t>(size);
      return true;
    }
    case ops::kDriverMiscStreamMemOpV1:
      return StreamMemOpV1(in, per_thread, rc);
    case ops::kDriverMiscCtxSetFlags: {
      uint32_t flags = 0;
      if (!in.Get(&flags) || in.remaining() != 0) return false;
      if (a.cuCtxSetFlags == nullptr) {
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        return true;
      }
      *rc = a.cuCtxSetFlags(flags);
      unsigned now = 0;
      if (*rc == CUDA_SUCCESS) *rc = a.cuCtxGetFlags(&now);
      out.Put<uint32_t>(now);
      return true;
    }
    case ops::kDriverMiscHostKeepMapped: {
      uint64_t addr = 0;
      if (!in.Get(&addr) || in.remaining() != 0) return false;
      // A kernel may read it through its device pointer now: it refuses a move (the next
      // server might not map it there).
      if (shared_host_.count(addr) == 0) {
        *rc = CUDA_ERROR_INVALID_VALUE;
      } else {
        left_host_.erase(addr);
      }
      return true;
    }
    case ops::kDriverMiscCtxGetFlags: {
      if (in.remaining() != 0) return false;
      unsigned now = 0;
      *rc = a.cuCtxGetFlags(&now);
      out.Put<uint32_t>(now);
      return true;
    }
    default:
      return false;
  }
}

}  // namespace flyt::server
