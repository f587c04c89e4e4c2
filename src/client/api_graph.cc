// Graph entry points that need the client's knowledge: stream capture start
// (which opens the callback channel graphs use to reach host memory), node
// lists, and kernel/memset nodes built by hand (parameters packed with the
// kernel's layout, as for launches). With several servers (client/multi_server.cc)
// these go to the server of their graph, node or executable graph (its handles
// sent without their tags, the nodes it answers tagged), a kernel node's
// function is that server's copy, and handles of two servers are refused.
#include <cstring>

#include "client/client.h"
#include "client/user_objects.h"

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;
namespace user_objects = flyt::client::user_objects;

namespace {

CUresult BeginCapture(const char* name, CUstream s, CUstreamCaptureMode mode, bool pt) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  // Host functions and host copies captured into the graph run over it (with
  // several servers, over the capturing stream's server's).
  CUresult rc = c.EnsureCallbackChannel();
  if (rc == CUDA_SUCCESS && c.multi()) {
    const int server = c.StreamRoute(s);
    if (server > 0 && server < c.server_count()) rc = c.Link(server).EnsureCallbackChannel();
  }
  if (rc != CUDA_SUCCESS) return rc;
  // Counted before it is sent: even a failing answer (perhaps an earlier
  // call's deferred error) may come after the capture began on the server.
  c.CaptureBegan();
  return pt ? Forward<118, true, true>(name, s, mode) : Forward<118, true, false>(name, s, mode);
}

void PutNodeList(wire::Writer& w, const CUgraphNode* deps, size_t n) {
  w.Put<uint32_t>(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) w.Put<uint64_t>(Client::WireHandle(deps[i]));
}

// Sends a request whose reply is one node handle (the server's, tagged with
// its index with several servers).
CUresult CallForNode(const char* name, uint16_t op, const wire::Writer& w, CUgraphNode* node) {
  std::vector<uint8_t> reply;
  Client& c = Client::Get();
  CUresult rc = c.Call(name, op, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS || node == nullptr) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint64_t h = 0;
  if (!r.Get(&h)) return CUDA_ERROR_UNKNOWN;
  if (c.multi()) [[unlikely]]
    h = Client::Tag(h, Client::LastRoute());
  *node = reinterpret_cast<CUgraphNode>(h);
  return CUDA_SUCCESS;
}

// which: 0 add to graph `target`, 1 set node `target`, 2 set `node` of exec `target`.
CUresult KernelNode(const char* name, uint8_t which, uint64_t target, uint64_t node,
                    const CUgraphNode* deps, size_t ndeps, const CUDA_KERNEL_NODE_PARAMS* p,
                    CUgraphNode* created) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (p == nullptr || (ndeps > 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  uint64_t fn = reinterpret_cast<uintptr_t>(p->func != nullptr ? static_cast<void*>(p->func)
                                                               : static_cast<void*>(p->kern));
  // Several servers: the graph's server, and the function's copy there.
  const int server = flyt::client::GraphServer({target, node}, which == 0 ? deps : nullptr, ndeps);
  if (server == -2) return flyt::client::RefuseAcrossServers(name);
  if (server >= 0) {
    fn = flyt::client::FunctionOnServer(fn, server);
    if (fn == 0) return CUDA_ERROR_INVALID_HANDLE;  // a module's function of another server
  }
  flyt::client::GraphRoute route(server);
  auto info = flyt::client::FuncLayout(fn);
  if (info == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  wire::Writer w;
  w.Put(which);
  w.Put(Client::WireValue(target));
  w.Put(Client::WireValue(node));
  if (which == 0) PutNodeList(w, deps, ndeps);
  w.Put(Client::WireValue(fn));
  w.Put<uint8_t>(info->is_kernel ? 1 : 0);
  unsigned dims[6] = {p->gridDimX,  p->gridDimY,  p->gridDimZ,
                      p->blockDimX, p->blockDimY, p->blockDimZ};
  w.PutBytes(dims, sizeof(dims));
  w.Put<uint32_t>(p->sharedMemBytes);
  CUresult rc = flyt::client::PackKernelParams(*info, p->kernelParams, p->extra, w);
  if (rc != CUDA_SUCCESS) return rc;
  rc = CallForNode(name, ops::kOpGraphKernelNode, w, created);
  // cuGraphKernelNodeGetParams answers in the form the node's arguments last came in.
  const bool through_extra = p->kernelParams == nullptr && p->extra != nullptr;
  if (rc == CUDA_SUCCESS && which == 0 && created != nullptr)
    flyt::client::NoteKernelNodeArgs(*created, through_extra);
  if (rc == CUDA_SUCCESS && which == 1)
    flyt::client::NoteKernelNodeArgs(reinterpret_cast<CUgraphNode>(target), through_extra);
  return rc;
}

// The CUDA 10/11 ABI's parameters (no kernel, no context) as the CUDA 12 ones.
CUDA_KERNEL_NODE_PARAMS FromV1(const CUDA_KERNEL_NODE_PARAMS_v1& p) {
  CUDA_KERNEL_NODE_PARAMS v2{};
  v2.func = p.func;
  v2.gridDimX = p.gridDimX;
  v2.gridDimY = p.gridDimY;
  v2.gridDimZ = p.gridDimZ;
  v2.blockDimX = p.blockDimX;
  v2.blockDimY = p.blockDimY;
  v2.blockDimZ = p.blockDimZ;
  v2.sharedMemBytes = p.sharedMemBytes;
  v2.kernelParams = p.kernelParams;
  v2.extra = p.extra;
  return v2;
}

}  // namespace

FLYT_API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return BeginCapture("cuStreamBeginCapture_v2", s, mode, false);
}
FLYT_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return BeginCapture("cuStreamBeginCapture_v2_ptsz", s, mode, true);
}

// Graphs and executable graphs as user objects' references follow them
// (client/user_objects.h); otherwise forwarded as the generic calls are.
FLYT_API CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph g,
                                              unsigned long long flags) {
  CUresult rc = Forward<220, true, false>("cuGraphInstantiateWithFlags", exec, g, flags);
  if (rc == CUDA_SUCCESS && exec != nullptr && user_objects::Any())
    user_objects::Instantiated(g, *exec);
  return rc;
}
FLYT_API CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
  CUresult rc = Forward<221, false, false>("cuGraphLaunch", exec, s);
  if (rc == CUDA_SUCCESS && user_objects::Any()) user_objects::Launched(exec, s, false);
  return rc;
}
FLYT_API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) {
  CUresult rc = Forward<221, false, true>("cuGraphLaunch_ptsz", exec, s);
  if (rc == CUDA_SUCCESS && user_objects::Any()) user_objects::Launched(exec, s, true);
  return rc;
}
FLYT_API CUresult cuGraphExecDestroy(CUgraphExec exec) {
  if (user_objects::Any()) user_objects::ExecDestroying(exec);
  return Forward<222, false, false>("cuGraphExecDestroy", exec);
}
FLYT_API CUresult cuGraphDestroy(CUgraph g) {
  CUresult rc = Forward<223, false, false>("cuGraphDestroy", g);
  if (rc == CUDA_SUCCESS && user_objects::Any()) user_objects::GraphDestroyed(g);
  return rc;
}

FLYT_API CUresult cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* count) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(g));
  std::vector<uint8_t> reply;
  const int server = flyt::client::GraphServer({reinterpret_cast<uintptr_t>(g)});
  flyt::client::GraphRoute route(server);
  CUresult rc = c.Call("cuGraphGetNodes", ops::kOpGraphGetNodes, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint64_t n = 0;
  if (!r.Get(&n) || n > r.remaining() / 8) return CUDA_ERROR_UNKNOWN;
  if (nodes != nullptr) {
    for (uint64_t i = 0; i < n && i < *count; ++i) {
      uint64_t h = 0;
      r.Get(&h);
      nodes[i] = reinterpret_cast<CUgraphNode>(server > 0 ? Client::Tag(h, server) : h);
    }
    if (*count > n)
      for (size_t i = n; i < *count; ++i) nodes[i] = nullptr;
  }
  *count = n;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuGraphAddKernelNode_v2(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                          size_t n, const CUDA_KERNEL_NODE_PARAMS* p) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return KernelNode("cuGraphAddKernelNode", 0, reinterpret_cast<uintptr_t>(g), 0, deps, n, p, node);
}
FLYT_API CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode node,
                                                const CUDA_KERNEL_NODE_PARAMS* p) {
  return KernelNode("cuGraphKernelNodeSetParams", 1, reinterpret_cast<uintptr_t>(node), 0, nullptr,
                    0, p, nullptr);
}
FLYT_API CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                    const CUDA_KERNEL_NODE_PARAMS* p) {
  return KernelNode("cuGraphExecKernelNodeSetParams", 2, reinterpret_cast<uintptr_t>(exec),
                    reinterpret_cast<uintptr_t>(node), nullptr, 0, p, nullptr);
}

// The ABI before CUDA 12 (CUDA_KERNEL_NODE_PARAMS_v1).
#undef cuGraphAddKernelNode
#undef cuGraphKernelNodeSetParams
#undef cuGraphExecKernelNodeSetParams
FLYT_API CUresult cuGraphAddKernelNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                       size_t n, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (node == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_KERNEL_NODE_PARAMS v2 = FromV1(*p);
  return KernelNode("cuGraphAddKernelNode", 0, reinterpret_cast<uintptr_t>(g), 0, deps, n, &v2,
                    node);
}
FLYT_API CUresult cuGraphKernelNodeSetParams(CUgraphNode node,
                                             const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_KERNEL_NODE_PARAMS v2 = FromV1(*p);
  return KernelNode("cuGraphKernelNodeSetParams", 1, reinterpret_cast<uintptr_t>(node), 0, nullptr,
                    0, &v2, nullptr);
}
FLYT_API CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                 const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_KERNEL_NODE_PARAMS v2 = FromV1(*p);
  return KernelNode("cuGraphExecKernelNodeSetParams", 2, reinterpret_cast<uintptr_t>(exec),
                    reinterpret_cast<uintptr_t>(node), nullptr, 0, &v2, nullptr);
}

FLYT_API CUresult cuGraphAddHostNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                     size_t n, const CUDA_HOST_NODE_PARAMS* p) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (node == nullptr || p == nullptr || p->fn == nullptr || (n > 0 && deps == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = c.EnsureCallbackChannel();
  if (rc != CUDA_SUCCESS) return rc;
  const int server = flyt::client::GraphServer({reinterpret_cast<uintptr_t>(g)}, deps, n);
  if (server == -2) return flyt::client::RefuseAcrossServers("cuGraphAddHostNode");
  flyt::client::GraphRoute route(server);
  // A later server calls back over its own link's channel, with that link's ids.
  Client& link = server > 0 ? c.Link(server) : c;
  if (server > 0 && (rc = link.EnsureCallbackChannel()) != CUDA_SUCCESS) return rc;
  CUhostFn fn = p->fn;
  void* data = p->userData;
  uint64_t id = link.RegisterGraphHostFunc([fn, data] { fn(data); });
  flyt::client::NoteGraphHostNode(server > 0 ? Client::Tag(id, server) : id, fn, data);
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(g));
  PutNodeList(w, deps, n);
  w.Put(id);
  return CallForNode("cuGraphAddHostNode", ops::kOpGraphHostNode, w, node);
}

FLYT_API CUresult cuGraphAddMemsetNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                       size_t n, const CUDA_MEMSET_NODE_PARAMS* p, CUcontext ctx) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (node == nullptr || p == nullptr || (n > 0 && deps == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  const int server = flyt::client::GraphServer(
      {reinterpret_cast<uintptr_t>(g), reinterpret_cast<uintptr_t>(ctx)}, deps, n);
  if (server == -2 ||
      (server > 0 && c.ServerOfPointer(p->dst) >= 0 && c.ServerOfPointer(p->dst) != server))
    return flyt::client::RefuseAcrossServers("cuGraphAddMemsetNode");
  flyt::client::GraphRoute route(server);
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(g));
  PutNodeList(w, deps, n);
  w.Put(*p);
  w.Put<uint64_t>(Client::WireHandle(ctx));
  return CallForNode("cuGraphAddMemsetNode", ops::kOpGraphMemsetNode, w, node);
}
