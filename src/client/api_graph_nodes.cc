// Graph nodes built by hand beyond kernel/memset/host creation: memcpy
// (host memory stays in this process; the server reaches it over the callback
// channel at each launch), child graph, empty, event record/wait, memory
// allocation/free and conditional nodes, the generic cuGraphAddNode /
// cuGraphNodeSetParams / cuGraphExecNodeSetParams, node queries, clones,
// conditional handles and the graph memory attributes.
//
// Owns: the host node registry (what the app gave for each callback id) and
// the packing of kOpGraphNode / kOpGraphNodeQuery / kOpGraphMisc. With several
// servers (client/multi_server.cc) a request goes to the server of its graph,
// node or executable graph: its handles (dependencies, contexts, events, child
// graphs, arrays) must be that server's and go without their tags, device
// memory must be that server's, and the handles answered get its tag; handles
// of two servers are refused. Must not touch streams, captures or the callback
// channel's protocol; no stdout.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "client/client.h"
#include "client/user_objects.h"
#include "common/log.h"

using flyt::client::Client;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace flyt::client {
namespace {
struct HostNodeFn {
  CUhostFn fn;
  void* data;
};
std::mutex g_host_nodes_mu;
std::unordered_map<uint64_t, HostNodeFn>& HostNodes() {
  static auto* m = new std::unordered_map<uint64_t, HostNodeFn>;  // never destroyed
  return *m;
}
}  // namespace

void NoteGraphHostNode(uint64_t id, CUhostFn fn, void* data) {
  std::lock_guard<std::mutex> lock(g_host_nodes_mu);
  HostNodes()[id] = HostNodeFn{fn, data};
}
bool FindGraphHostNode(uint64_t id, CUhostFn* fn, void** data) {
  std::lock_guard<std::mutex> lock(g_host_nodes_mu);
  auto it = HostNodes().find(id);
  if (it == HostNodes().end()) return false;
  *fn = it->second.fn;
  *data = it->second.data;
  return true;
}
}  // namespace flyt::client

namespace {

uint64_t Raw(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Several servers: where the kOpGraphNode request being built goes, from the
// handles and device memory it names (NodeRequest starts it over).
thread_local flyt::client::ArgRoute t_node_route;
void NoteHandle(uint64_t h) {
  if (h != 0 && Client::Get().multi()) flyt::client::RouteArg(&t_node_route, Client::TagOf(h));
}
void NotePointer(uint64_t p) {
  Client& c = Client::Get();
  if (c.multi()) flyt::client::RouteArg(&t_node_route, c.ServerOfPointer(p));
}
// A handle the node's server answered, as the app holds it.
uint64_t Answered(uint64_t h, int server) { return server > 0 ? Client::Tag(h, server) : h; }

// Arrays of conditional nodes' body graphs (CUDA_CONDITIONAL_NODE_PARAMS::phGraph_out).
std::mutex g_bodies_mu;
std::vector<std::unique_ptr<CUgraph[]>>& BodyArrays() {
  static auto* v = new std::vector<std::unique_ptr<CUgraph[]>>;  // never destroyed
  return *v;
}

void PutNodeList(wire::Writer& w, const CUgraphNode* deps, size_t n) {
  w.Put<uint32_t>(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) {
    NoteHandle(Raw(deps[i]));
    w.Put<uint64_t>(Client::WireHandle(deps[i]));
  }
}

// Head of a kOpGraphNode request.
wire::Writer NodeRequest(uint8_t which, uint64_t target, uint64_t node, const CUgraphNode* deps,
                         size_t ndeps) {
  t_node_route = flyt::client::ArgRoute{};
  NoteHandle(target);
  NoteHandle(node);
  wire::Writer w;
  w.Put(which);
  w.Put(Client::WireValue(target));
  w.Put(Client::WireValue(node));
  if (which == ops::kGraphNodeAdd) PutNodeList(w, deps, ndeps);
  return w;
}

CUresult Check(size_t ndeps, const CUgraphNode* deps) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (ndeps > 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ndeps > (1u << 16)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// Sends a kOpGraphNode request; on an add, the reply's node goes to *node
// and the rest of the reply stays in *reply for the caller.
CUresult SendNode(const char* name, uint8_t which, const wire::Writer& w, CUgraphNode* node,
                  std::vector<uint8_t>* reply, wire::Reader* rest) {
  const int server = Client::Get().multi() ? t_node_route.server : -1;
  if (server == -2) return flyt::client::RefuseAcrossServers(name);
  flyt::client::GraphRoute route(server);
  CUresult rc = Client::Get().Call(name, ops::kOpGraphNode, w, ReplySink{reply});
  if (rc != CUDA_SUCCESS || which != ops::kGraphNodeAdd) return rc;
  *rest = wire::Reader(reply->data(), reply->size());
  uint64_t h = 0;
  if (!rest->Get(&h)) return CUDA_ERROR_UNKNOWN;
  if (node != nullptr) *node = reinterpret_cast<CUgraphNode>(Answered(h, server));
  return CUDA_SUCCESS;
}
CUresult SendNode(const char* name, uint8_t which, const wire::Writer& w, CUgraphNode* node) {
  std::vector<uint8_t> reply;
  wire::Reader rest(nullptr, 0);
  return SendNode(name, which, w, node, &reply, &rest);
}

// A copy's side: CU_MEMORYTYPE_UNIFIED resolved to device or host memory by
// what this process knows of device allocations.
void ResolveSide(CUmemorytype* type, CUdeviceptr* device, const void** host) {
  if (*type != CU_MEMORYTYPE_UNIFIED) return;
  if (Client::Get().FindDeviceRange(*device, 1)) {
    *type = CU_MEMORYTYPE_DEVICE;
  } else {
    *type = CU_MEMORYTYPE_HOST;
    *host = reinterpret_cast<const void*>(*device);
    *device = 0;
  }
}

CUresult PutCopy(wire::Writer& w, const CUDA_MEMCPY3D* p, CUcontext ctx) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEMCPY3D c = *p;
  const void* src_host = c.srcHost;
  const void* dst_host = c.dstHost;
  ResolveSide(&c.srcMemoryType, &c.srcDevice, &src_host);
  ResolveSide(&c.dstMemoryType, &c.dstDevice, &dst_host);
  c.srcHost = src_host;
  c.dstHost = const_cast<void*>(dst_host);
  bool src_client = c.srcMemoryType == CU_MEMORYTYPE_HOST;
  bool dst_client = c.dstMemoryType == CU_MEMORYTYPE_HOST;
  if ((src_client && c.srcHost == nullptr) || (dst_client && c.dstHost == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  if (Client::Get().multi()) {  // device memory and arrays of the node's server
    auto side = [](CUmemorytype t, CUdeviceptr device, CUarray* array) {
      if (t == CU_MEMORYTYPE_DEVICE) NotePointer(device);
      if (t == CU_MEMORYTYPE_ARRAY) {
        NoteHandle(Raw(*array));
        *array = reinterpret_cast<CUarray>(Client::WireHandle(*array));
      }
    };
    side(c.srcMemoryType, c.srcDevice, &c.srcArray);
    side(c.dstMemoryType, c.dstDevice, &c.dstArray);
  }
  NoteHandle(Raw(ctx));
  w.Put<uint32_t>(CU_GRAPH_NODE_TYPE_MEMCPY);
  w.Put(c);
  w.Put<uint64_t>(Client::WireHandle(ctx));
  w.Put<uint8_t>(src_client ? 1 : 0);
  w.Put<uint8_t>(dst_client ? 1 : 0);
  return CUDA_SUCCESS;
}

CUresult CopyNode(const char* name, uint8_t which, uint64_t target, uint64_t node,
                  const CUgraphNode* deps, size_t ndeps, const CUDA_MEMCPY3D* p, CUcontext ctx,
                  CUgraphNode* created) {
  if (CUresult rc = Check(ndeps, deps); rc != CUDA_SUCCESS) return rc;
  // Host sides are read and written by the server over the callback channel.
  if (CUresult rc = Client::Get().EnsureCallbackChannel(); rc != CUDA_SUCCESS) return rc;
  wire::Writer w = NodeRequest(which, target, node, deps, ndeps);
  if (CUresult rc = PutCopy(w, p, ctx); rc != CUDA_SUCCESS) return rc;
  // A later server reaches the host sides over its own link's channel.
  Client& c = Client::Get();
  if (c.multi() && t_node_route.server > 0 && t_node_route.server < c.server_count())
    if (CUresult rc = c.Link(t_node_route.server).EnsureCallbackChannel(); rc != CUDA_SUCCESS)
      return rc;
  return SendNode(name, which, w, created);
}

CUresult MemsetNode(const char* name, uint8_t which, uint64_t target, uint64_t node,
                    const CUgraphNode* deps, size_t ndeps, const CUDA_MEMSET_NODE_PARAMS* p,
                    CUcontext ctx, CUgraphNode* created) {
  if (CUresult rc = Check(ndeps, deps); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w = NodeRequest(which, target, node, deps, ndeps);
  NotePointer(p->dst);
  NoteHandle(Raw(ctx));
  w.Put<uint32_t>(CU_GRAPH_NODE_TYPE_MEMSET);
  w.Put(*p);
  w.Put<uint64_t>(Client::WireHandle(ctx));
  return SendNode(name, which, w, created);
}

// Nodes described by one u64 (child graph, event, free pointer) or nothing (empty).
CUresult ValueNode(const char* name, uint8_t which, uint64_t target, uint64_t node,
                   const CUgraphNode* deps, size_t ndeps, CUgraphNodeType type, uint64_t value,
                   CUgraphNode* created) {
  if (CUresult rc = Check(ndeps, deps); rc != CUDA_SUCCESS) return rc;
  wire::Writer w = NodeRequest(which, target, node, deps, ndeps);
  w.Put<uint32_t>(type);
  switch (type) {
    case CU_GRAPH_NODE_TYPE_GRAPH:  // handles of the node's server
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      NoteHandle(value);
      value = Client::WireValue(value);
      break;
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      NotePointer(value);
      break;
    default:
      break;
  }
  if (type != CU_GRAPH_NODE_TYPE_EMPTY) w.Put(value);
  return SendNode(name, which, w, created);
}

CUresult HostNode(const char* name, uint8_t which, uint64_t target, uint64_t node,
                  const CUgraphNode* deps, size_t ndeps, const CUDA_HOST_NODE_PARAMS* p,
                  CUgraphNode* created) {
  Client& c = Client::Get();
  if (CUresult rc = Check(ndeps, deps); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = c.EnsureCallbackChannel(); rc != CUDA_SUCCESS) return rc;
  // A later server calls back over its own link's channel, with that link's ids.
  const int server = flyt::client::GraphServer({target, node}, deps, ndeps);
  if (server == -2) return flyt::client::RefuseAcrossServers(name);
  Client& link = server > 0 ? c.Link(server) : c;
  if (server > 0)
    if (CUresult rc = link.EnsureCallbackChannel(); rc != CUDA_SUCCESS) return rc;
  CUhostFn fn = p->fn;
  void* data = p->userData;
  uint64_t id = link.RegisterGraphHostFunc([fn, data] { fn(data); });
  flyt::client::NoteGraphHostNode(Answered(id, server), fn, data);
  return ValueNode(name, which, target, node, deps, ndeps, CU_GRAPH_NODE_TYPE_HOST, id, created);
}

CUresult AllocNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t ndeps,
                   CUmemPoolProps* props, const CUmemAccessDesc* access, size_t naccess,
                   size_t bytes, CUdeviceptr* dptr) {
  if (CUresult rc = Check(ndeps, deps); rc != CUDA_SUCCESS) return rc;
  if (node == nullptr || props == nullptr || dptr == nullptr || bytes == 0 ||
      (naccess > 0 && access == nullptr) || naccess > ops::kMaxAccessDescs)
    return CUDA_ERROR_INVALID_VALUE;
  if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      props->handleTypes != CU_MEM_HANDLE_TYPE_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w = NodeRequest(ops::kGraphNodeAdd, Raw(g), 0, deps, ndeps);
  Client& c = Client::Get();
  const bool multi = c.multi();
  if (multi) flyt::client::RouteArg(&t_node_route, c.DeviceServer(props->location.id));
  w.Put<uint32_t>(CU_GRAPH_NODE_TYPE_MEM_ALLOC);
  w.Put<int32_t>(multi ? c.DeviceLocal(props->location.id) : props->location.id);
  w.Put<uint32_t>(static_cast<uint32_t>(naccess));
  for (size_t i = 0; i < naccess; ++i) {
    CUmemAccessDesc a = access[i];
    if (multi && a.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {  // that server's ordinals
      flyt::client::RouteArg(&t_node_route, c.DeviceServer(a.location.id));
      a.location.id = c.DeviceLocal(a.location.id);
    }
    w.Put(a);
  }
  w.Put<uint64_t>(bytes);
  std::vector<uint8_t> reply;
  wire::Reader rest(nullptr, 0);
  CUresult rc = SendNode("cuGraphAddMemAllocNode", ops::kGraphNodeAdd, w, node, &reply, &rest);
  if (rc != CUDA_SUCCESS) return rc;
  uint64_t p = 0;
  if (!rest.Get(&p)) return CUDA_ERROR_UNKNOWN;
  *dptr = p;
  // Device memory to copies and pointer queries, as natively once allocated.
  Client::Get().AddDeviceRange(p, bytes, false);
  return CUDA_SUCCESS;
}

CUresult ConditionalNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t ndeps,
                         CUDA_CONDITIONAL_NODE_PARAMS* p) {
  if (CUresult rc = Check(ndeps, deps); rc != CUDA_SUCCESS) return rc;
  if (node == nullptr || p == nullptr || p->size == 0 || p->size > ops::kMaxConditionalBodies)
    return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w = NodeRequest(ops::kGraphNodeAdd, Raw(g), 0, deps, ndeps);
  NoteHandle(Raw(p->ctx));
  const int server = Client::Get().multi() ? t_node_route.server : -1;
  w.Put<uint32_t>(CU_GRAPH_NODE_TYPE_CONDITIONAL);
  w.Put<uint64_t>(p->handle);
  w.Put<uint32_t>(p->type);
  w.Put<uint32_t>(p->size);
  w.Put<uint64_t>(Client::WireHandle(p->ctx));
  std::vector<uint8_t> reply;
  wire::Reader rest(nullptr, 0);
  CUresult rc = SendNode("cuGraphAddNode", ops::kGraphNodeAdd, w, node, &reply, &rest);
  if (rc != CUDA_SUCCESS) return rc;
  uint32_t n = 0;
  if (!rest.Get(&n) || n != p->size) return CUDA_ERROR_UNKNOWN;
  // phGraph_out points at an array the library owns for the node's life (as
  // the driver's); kept until the process exits.
  auto bodies = std::make_unique<CUgraph[]>(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t b = 0;
    if (!rest.Get(&b)) return CUDA_ERROR_UNKNOWN;
    bodies[i] = reinterpret_cast<CUgraph>(Answered(b, server));
  }
  p->phGraph_out = bodies.get();
  std::lock_guard<std::mutex> lock(g_bodies_mu);
  BodyArrays().push_back(std::move(bodies));
  return CUDA_SUCCESS;
}

// kOpGraphNodeQuery: the node's type and the rest of the reply (handles in it
// are the node's server's, without its tag: see Answered).
CUresult Query(const char* name, CUgraphNode node, CUgraphNodeType* type,
               std::vector<uint8_t>* reply, wire::Reader* rest) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(node));
  flyt::client::GraphRoute route(flyt::client::GraphServer({Raw(node)}));
  CUresult rc = c.Call(name, ops::kOpGraphNodeQuery, w, ReplySink{reply});
  if (rc != CUDA_SUCCESS) return rc;
  *rest = wire::Reader(reply->data(), reply->size());
  uint32_t t = 0;
  if (!rest->Get(&t)) return CUDA_ERROR_UNKNOWN;
  *type = static_cast<CUgraphNodeType>(t);
  return CUDA_SUCCESS;
}

// Reads one value of a node of `want` type (CUDA_ERROR_INVALID_VALUE for another type).
template <typename T>
CUresult QueryValue(const char* name, CUgraphNode node, CUgraphNodeType want, T* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint8_t> reply;
  wire::Reader rest(nullptr, 0);
  CUgraphNodeType type{};
  CUresult rc = Query(name, node, &type, &reply, &rest);
  if (rc != CUDA_SUCCESS) return rc;
  if (type != want) return CUDA_ERROR_INVALID_VALUE;
  return rest.Get(out) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

// `server`: where it goes (GraphServer; -1 with one server).
CUresult Misc(const char* name, const wire::Writer& w, uint64_t* out, int server = -1) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (server == -2) return flyt::client::RefuseAcrossServers(name);
  flyt::client::GraphRoute route(server);
  std::vector<uint8_t> reply;
  CUresult rc = c.Call(name, ops::kOpGraphMisc, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS || out == nullptr) return rc;
  wire::Reader r(reply.data(), reply.size());
  return r.Get(out) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

void NotSupportedOnce(const char* what) {
  static std::mutex mu;
  static auto* seen = new std::unordered_map<std::string, bool>;
  std::lock_guard<std::mutex> lock(mu);
  if ((*seen)[what]) return;
  (*seen)[what] = true;
  FLYT_WARN("%s: not supported by Flyt (CUDA_ERROR_NOT_SUPPORTED)", what);
}

// cuGraphNodeSetParams / cuGraphExecNodeSetParams for the kinds served.
CUresult SetNodeParams(const char* name, uint8_t which, uint64_t target, CUgraphNode node,
                       CUgraphNodeParams* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t n = Raw(node);
  bool exec = which == ops::kGraphNodeExecSet;
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const auto* k = reinterpret_cast<const CUDA_KERNEL_NODE_PARAMS*>(&p->kernel);
      return exec
                 ? cuGraphExecKernelNodeSetParams_v2(reinterpret_cast<CUgraphExec>(target), node, k)
                 : cuGraphKernelNodeSetParams_v2(node, k);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return CopyNode(name, which, target, n, nullptr, 0, &p->memcpy.copyParams, p->memcpy.copyCtx,
                      nullptr);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS m{p->memset.dst,         p->memset.pitch, p->memset.value,
                                p->memset.elementSize, p->memset.width, p->memset.height};
      return MemsetNode(name, which, target, n, nullptr, 0, &m, p->memset.ctx, nullptr);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      CUDA_HOST_NODE_PARAMS h{p->host.fn, p->host.userData};
      return HostNode(name, which, target, n, nullptr, 0, &h, nullptr);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
      return ValueNode(name, which, target, n, nullptr, 0, p->type, Raw(p->graph.graph), nullptr);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return exec ? cuGraphExecEventRecordNodeSetEvent(reinterpret_cast<CUgraphExec>(target), node,
                                                       p->eventRecord.event)
                  : cuGraphEventRecordNodeSetEvent(node, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return exec ? cuGraphExecEventWaitNodeSetEvent(reinterpret_cast<CUgraphExec>(target), node,
                                                     p->eventWait.event)
                  : cuGraphEventWaitNodeSetEvent(node, p->eventWait.event);
    default:
      NotSupportedOnce(name);
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

}  // namespace

FLYT_API CUresult cuGraphAddMemcpyNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                       size_t n, const CUDA_MEMCPY3D* p, CUcontext ctx) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return CopyNode("cuGraphAddMemcpyNode", ops::kGraphNodeAdd, Raw(g), 0, deps, n, p, ctx, node);
}
FLYT_API CUresult cuGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D* p) {
  return CopyNode("cuGraphMemcpyNodeSetParams", ops::kGraphNodeSet, Raw(node), 0, nullptr, 0, p,
                  nullptr, nullptr);
}
FLYT_API CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                 const CUDA_MEMCPY3D* p, CUcontext ctx) {
  return CopyNode("cuGraphExecMemcpyNodeSetParams", ops::kGraphNodeExecSet, Raw(exec), Raw(node),
                  nullptr, 0, p, ctx, nullptr);
}
FLYT_API CUresult cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D* p) {
  CUresult rc = QueryValue("cuGraphMemcpyNodeGetParams", node, CU_GRAPH_NODE_TYPE_MEMCPY, p);
  if (rc == CUDA_SUCCESS && Client::Get().multi()) {  // arrays as the app holds them
    const int server = flyt::client::GraphServer({Raw(node)});
    if (p->srcMemoryType == CU_MEMORYTYPE_ARRAY)
      p->srcArray = reinterpret_cast<CUarray>(Answered(Raw(p->srcArray), server));
    if (p->dstMemoryType == CU_MEMORYTYPE_ARRAY)
      p->dstArray = reinterpret_cast<CUarray>(Answered(Raw(p->dstArray), server));
  }
  return rc;
}

FLYT_API CUresult cuGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* p) {
  return MemsetNode("cuGraphMemsetNodeSetParams", ops::kGraphNodeSet, Raw(node), 0, nullptr, 0, p,
                    nullptr, nullptr);
}
FLYT_API CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                 const CUDA_MEMSET_NODE_PARAMS* p, CUcontext ctx) {
  return MemsetNode("cuGraphExecMemsetNodeSetParams", ops::kGraphNodeExecSet, Raw(exec), Raw(node),
                    nullptr, 0, p, ctx, nullptr);
}
FLYT_API CUresult cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS* p) {
  return QueryValue("cuGraphMemsetNodeGetParams", node, CU_GRAPH_NODE_TYPE_MEMSET, p);
}

FLYT_API CUresult cuGraphHostNodeSetParams(CUgraphNode node, const CUDA_HOST_NODE_PARAMS* p) {
  return HostNode("cuGraphHostNodeSetParams", ops::kGraphNodeSet, Raw(node), 0, nullptr, 0, p,
                  nullptr);
}
FLYT_API CUresult cuGraphExecHostNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                               const CUDA_HOST_NODE_PARAMS* p) {
  return HostNode("cuGraphExecHostNodeSetParams", ops::kGraphNodeExecSet, Raw(exec), Raw(node),
                  nullptr, 0, p, nullptr);
}
FLYT_API CUresult cuGraphHostNodeGetParams(CUgraphNode node, CUDA_HOST_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t id = 0;
  CUresult rc = QueryValue("cuGraphHostNodeGetParams", node, CU_GRAPH_NODE_TYPE_HOST, &id);
  if (rc != CUDA_SUCCESS) return rc;
  CUhostFn fn = nullptr;
  void* data = nullptr;
  id = Answered(id, flyt::client::GraphServer({Raw(node)}));
  if (!flyt::client::FindGraphHostNode(id, &fn, &data)) return CUDA_ERROR_INVALID_VALUE;
  p->fn = fn;
  p->userData = data;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuGraphAddChildGraphNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                           size_t n, CUgraph child) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = ValueNode("cuGraphAddChildGraphNode", ops::kGraphNodeAdd, Raw(g), 0, deps, n,
                          CU_GRAPH_NODE_TYPE_GRAPH, Raw(child), node);
  // The node holds a copy of the child, with its user objects' references.
  if (rc == CUDA_SUCCESS && flyt::client::user_objects::Any())
    flyt::client::user_objects::ChildGraphAdded(g, child);
  return rc;
}
FLYT_API CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph* out) {
  uint64_t g = 0;
  CUresult rc = QueryValue("cuGraphChildGraphNodeGetGraph", node, CU_GRAPH_NODE_TYPE_GRAPH, &g);
  if (rc == CUDA_SUCCESS)
    *out = reinterpret_cast<CUgraph>(Answered(g, flyt::client::GraphServer({Raw(node)})));
  return rc;
}
FLYT_API CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                     CUgraph child) {
  return ValueNode("cuGraphExecChildGraphNodeSetParams", ops::kGraphNodeExecSet, Raw(exec),
                   Raw(node), nullptr, 0, CU_GRAPH_NODE_TYPE_GRAPH, Raw(child), nullptr);
}
FLYT_API CUresult cuGraphAddEmptyNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                      size_t n) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return ValueNode("cuGraphAddEmptyNode", ops::kGraphNodeAdd, Raw(g), 0, deps, n,
                   CU_GRAPH_NODE_TYPE_EMPTY, 0, node);
}
FLYT_API CUresult cuGraphAddEventRecordNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                            size_t n, CUevent ev) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return ValueNode("cuGraphAddEventRecordNode", ops::kGraphNodeAdd, Raw(g), 0, deps, n,
                   CU_GRAPH_NODE_TYPE_EVENT_RECORD, Raw(ev), node);
}
FLYT_API CUresult cuGraphAddEventWaitNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                          size_t n, CUevent ev) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return ValueNode("cuGraphAddEventWaitNode", ops::kGraphNodeAdd, Raw(g), 0, deps, n,
                   CU_GRAPH_NODE_TYPE_WAIT_EVENT, Raw(ev), node);
}
FLYT_API CUresult cuGraphEventRecordNodeGetEvent(CUgraphNode node, CUevent* out) {
  uint64_t e = 0;
  CUresult rc =
      QueryValue("cuGraphEventRecordNodeGetEvent", node, CU_GRAPH_NODE_TYPE_EVENT_RECORD, &e);
  if (rc == CUDA_SUCCESS)
    *out = reinterpret_cast<CUevent>(Answered(e, flyt::client::GraphServer({Raw(node)})));
  return rc;
}
FLYT_API CUresult cuGraphEventWaitNodeGetEvent(CUgraphNode node, CUevent* out) {
  uint64_t e = 0;
  CUresult rc = QueryValue("cuGraphEventWaitNodeGetEvent", node, CU_GRAPH_NODE_TYPE_WAIT_EVENT, &e);
  if (rc == CUDA_SUCCESS)
    *out = reinterpret_cast<CUevent>(Answered(e, flyt::client::GraphServer({Raw(node)})));
  return rc;
}

FLYT_API CUresult cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                         size_t n, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AllocNode(node, g, deps, n, &p->poolProps, p->accessDescs, p->accessDescCount, p->bytesize,
                   &p->dptr);
}
FLYT_API CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint8_t> reply;
  wire::Reader rest(nullptr, 0);
  CUgraphNodeType type{};
  CUresult rc = Query("cuGraphMemAllocNodeGetParams", node, &type, &reply, &rest);
  if (rc != CUDA_SUCCESS) return rc;
  if (type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
  uint64_t bytes = 0, dptr = 0;
  int32_t dev = 0;
  if (!rest.Get(&bytes) || !rest.Get(&dptr) || !rest.Get(&dev)) return CUDA_ERROR_UNKNOWN;
  *p = CUDA_MEM_ALLOC_NODE_PARAMS{};
  p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->poolProps.location.id = dev;
  p->bytesize = bytes;
  p->dptr = dptr;
  return CUDA_SUCCESS;
}
FLYT_API CUresult cuGraphAddMemFreeNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                        size_t n, CUdeviceptr dptr) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return ValueNode("cuGraphAddMemFreeNode", ops::kGraphNodeAdd, Raw(g), 0, deps, n,
                   CU_GRAPH_NODE_TYPE_MEM_FREE, dptr, node);
}
FLYT_API CUresult cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr* out) {
  uint64_t p = 0;
  CUresult rc = QueryValue("cuGraphMemFreeNodeGetParams", node, CU_GRAPH_NODE_TYPE_MEM_FREE, &p);
  if (rc == CUDA_SUCCESS) *out = p;
  return rc;
}

FLYT_API CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType* type) {
  if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint8_t> reply;
  wire::Reader rest(nullptr, 0);
  return Query("cuGraphNodeGetType", node, type, &reply, &rest);
}

FLYT_API CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph g,
                                                 CUcontext ctx, unsigned def, unsigned flags) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint8_t>(ops::kGraphMiscCondHandle);
  w.Put<uint64_t>(Client::WireHandle(g));
  w.Put<uint64_t>(Client::WireHandle(ctx));
  w.Put<uint32_t>(def);
  w.Put<uint32_t>(flags);
  uint64_t h = 0;
  CUresult rc =
      Misc("cuGraphConditionalHandleCreate", w, &h, flyt::client::GraphServer({Raw(g), Raw(ctx)}));
  if (rc == CUDA_SUCCESS) *out = h;
  return rc;
}

FLYT_API CUresult cuGraphClone(CUgraph* out, CUgraph g) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint8_t>(ops::kGraphMiscClone);
  w.Put<uint64_t>(Client::WireHandle(g));
  uint64_t c = 0;
  const int server = flyt::client::GraphServer({Raw(g)});
  CUresult rc = Misc("cuGraphClone", w, &c, server);
  if (rc == CUDA_SUCCESS) *out = reinterpret_cast<CUgraph>(Answered(c, server));
  if (rc == CUDA_SUCCESS && flyt::client::user_objects::Any())
    flyt::client::user_objects::GraphCloned(g, *out);
  return rc;
}
FLYT_API CUresult cuGraphNodeFindInClone(CUgraphNode* out, CUgraphNode node, CUgraph clone) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint8_t>(ops::kGraphMiscFindInClone);
  w.Put<uint64_t>(Client::WireHandle(node));
  w.Put<uint64_t>(Client::WireHandle(clone));
  uint64_t n = 0;
  const int server = flyt::client::GraphServer({Raw(node), Raw(clone)});
  CUresult rc = Misc("cuGraphNodeFindInClone", w, &n, server);
  if (rc == CUDA_SUCCESS) *out = reinterpret_cast<CUgraphNode>(Answered(n, server));
  return rc;
}

// The server's driver writes the DOT file on the GPU host; its bytes come back and are
// written here, where the app asked for them.
FLYT_API CUresult cuGraphDebugDotPrint(CUgraph g, const char* path, unsigned int flags) {
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  wire::Writer w;
  w.Put<uint8_t>(ops::kGraphMiscDotPrint);
  w.Put<uint64_t>(Client::WireHandle(g));
  w.Put<uint32_t>(flags);
  std::vector<uint8_t> dot;
  flyt::client::GraphRoute route(flyt::client::GraphServer({Raw(g)}));
  CUresult rc = c.Call("cuGraphDebugDotPrint", ops::kOpGraphMisc, w, ReplySink{&dot});
  if (rc != CUDA_SUCCESS) return rc;
  FILE* f = std::fopen(path, "we");
  if (f == nullptr) return CUDA_ERROR_OPERATING_SYSTEM;
  const bool written = std::fwrite(dot.data(), 1, dot.size(), f) == dot.size();
  return std::fclose(f) == 0 && written ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

FLYT_API CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr,
                                               void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  Client& c = Client::Get();
  w.Put<uint8_t>(ops::kGraphMiscMemAttrGet);
  w.Put<int32_t>(c.multi() ? c.DeviceLocal(dev) : dev);
  w.Put<int32_t>(attr);
  uint64_t v = 0;
  CUresult rc = Misc("cuDeviceGetGraphMemAttribute", w, &v, c.multi() ? c.DeviceServer(dev) : -1);
  if (rc == CUDA_SUCCESS) *static_cast<cuuint64_t*>(value) = v;
  return rc;
}
FLYT_API CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr,
                                               void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  Client& c = Client::Get();
  w.Put<uint8_t>(ops::kGraphMiscMemAttrSet);
  w.Put<int32_t>(c.multi() ? c.DeviceLocal(dev) : dev);
  w.Put<int32_t>(attr);
  w.Put<uint64_t>(*static_cast<cuuint64_t*>(value));
  return Misc("cuDeviceSetGraphMemAttribute", w, nullptr, c.multi() ? c.DeviceServer(dev) : -1);
}

// The generic node entry points.
FLYT_API CUresult cuGraphAddNode_v2(CUgraphNode* node, CUgraph g, const CUgraphNode* deps,
                                    const CUgraphEdgeData* edges, size_t n, CUgraphNodeParams* p) {
  if (node == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (edges != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      const CUgraphEdgeData& e = edges[i];
      if (e.from_port != 0 || e.to_port != 0 || e.type != 0) {
        NotSupportedOnce("cuGraphAddNode with edge data (programmatic ports)");
        return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
  }
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return cuGraphAddKernelNode_v2(node, g, deps, n,
                                     reinterpret_cast<const CUDA_KERNEL_NODE_PARAMS*>(&p->kernel));
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return cuGraphAddMemcpyNode(node, g, deps, n, &p->memcpy.copyParams, p->memcpy.copyCtx);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS m{p->memset.dst,         p->memset.pitch, p->memset.value,
                                p->memset.elementSize, p->memset.width, p->memset.height};
      return cuGraphAddMemsetNode(node, g, deps, n, &m, p->memset.ctx);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      CUDA_HOST_NODE_PARAMS h{p->host.fn, p->host.userData};
      return cuGraphAddHostNode(node, g, deps, n, &h);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) {
        NotSupportedOnce("cuGraphAddNode: child graph moved into its parent");
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      return cuGraphAddChildGraphNode(node, g, deps, n, p->graph.graph);
    case CU_GRAPH_NODE_TYPE_EMPTY:
      return cuGraphAddEmptyNode(node, g, deps, n);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return cuGraphAddEventRecordNode(node, g, deps, n, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return cuGraphAddEventWaitNode(node, g, deps, n, p->eventWait.event);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
      return AllocNode(node, g, deps, n, &p->alloc.poolProps, p->alloc.accessDescs,
                       p->alloc.accessDescCount, p->alloc.bytesize, &p->alloc.dptr);
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      return cuGraphAddMemFreeNode(node, g, deps, n, p->free.dptr);
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      return ConditionalNode(node, g, deps, n, &p->conditional);
    default:
      NotSupportedOnce("cuGraphAddNode for external semaphore and batch memory operation nodes");
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}
#undef cuGraphAddNode
FLYT_API CUresult cuGraphAddNode(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t n,
                                 CUgraphNodeParams* p) {
  return cuGraphAddNode_v2(node, g, deps, nullptr, n, p);
}
FLYT_API CUresult cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams* p) {
  return SetNodeParams("cuGraphNodeSetParams", ops::kGraphNodeSet, Raw(node), node, p);
}
FLYT_API CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                           CUgraphNodeParams* p) {
  return SetNodeParams("cuGraphExecNodeSetParams", ops::kGraphNodeExecSet, Raw(exec), node, p);
}
