// Session handlers for graph nodes built by hand beyond kernel/memset/host
// (kOpGraphNode, kOpGraphNodeQuery, kOpGraphMisc): memcpy, child graph,
// empty, event record/wait, memory allocation/free and conditional nodes, node
// queries, clones, conditional handles and the graph memory attributes.
//
// A memcpy node that touches the client's host memory becomes a child graph
// node holding two nodes: a host node that fetches the client's bytes into a
// pinned mirror and a copy from the mirror (upload), or a copy into the mirror
// and a host node that delivers the bytes to the client (download). The host
// nodes move the bytes over the callback channel (session_graphs.cc), so each
// launch reads and writes the client's memory in graph order, and a download's
// bytes are in the client's memory when the graph's stream is synchronized.
// Queries answer such a node as the memcpy node the app built.
//
// Memory of allocation nodes is charged to the tenant's quota when the node is
// added and refunded when the graph that holds it is destroyed, or at the
// session's end. Owns: graph_allocs_, cond_handles_, subgraphs_. Must not
// touch other sessions' graphs.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

// Logs a refusal once per worker (one client process).
#define FLYT_WARN_ONCE(...)                           \
  do {                                                \
    static std::atomic<bool> once{false};             \
    if (!once.exchange(true)) FLYT_WARN(__VA_ARGS__); \
  } while (0)

namespace {

// The host side of a copy as one contiguous client range: its offset from the
// side's base pointer, or false when rows are apart (not served).
bool ContiguousHostSide(const CUDA_MEMCPY3D& p, bool src, uint64_t* offset) {
  size_t x = src ? p.srcXInBytes : p.dstXInBytes, y = src ? p.srcY : p.dstY,
         z = src ? p.srcZ : p.dstZ, pitch = src ? p.srcPitch : p.dstPitch,
         height = src ? p.srcHeight : p.dstHeight;
  bool one_row = p.Height == 1 && p.Depth == 1;
  if (!one_row && (pitch != p.WidthInBytes || (p.Depth > 1 && height != p.Height))) return false;
  if (one_row) {
    if ((y != 0 || z != 0) && pitch == 0) return false;
  }
  *offset = (static_cast<uint64_t>(z) * (height ? height : p.Height) + y) * pitch + x;
  return true;
}

constexpr uint64_t kMaxCopyBytes = 1ull << 40;

// Bytes a copy moves; 0 when a dimension is 0 or the product is absurd (a
// hostile frame must not size a mirror smaller than the copy).
uint64_t CopyBytes(const CUDA_MEMCPY3D& p) {
  uint64_t wh = 0, n = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(p.WidthInBytes), p.Height, &wh) ||
      __builtin_mul_overflow(wh, static_cast<uint64_t>(p.Depth), &n) || n > kMaxCopyBytes)
    return 0;
  return n;
}

}  // namespace

CUresult Session::BuildCopyGraph(const CUDA_MEMCPY3D& p, CUcontext ctx, bool src_client,
                                 CUgraph* out) {
  DriverApi& a = state_->api;
  uint64_t off = 0;
  if (!ContiguousHostSide(p, src_client, &off)) {
    FLYT_WARN_ONCE(
        "graph memcpy node with pitched rows in client host memory: not supported "
        "(CUDA_ERROR_NOT_SUPPORTED)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  uint64_t n = CopyBytes(p);
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  void* mirror = NewMirror(n);
  if (mirror == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t base = reinterpret_cast<uintptr_t>(src_client ? p.srcHost : p.dstHost);
  auto w = std::make_unique<CapturedWork>(
      CapturedWork{src_client ? CapturedWork::Kind::kFetch : CapturedWork::Kind::kDeliver, this});
  w->client_addr = base + off;
  w->mirror = mirror;
  w->len = n;
  CUDA_MEMCPY3D m = p;
  if (src_client) {
    m.srcMemoryType = CU_MEMORYTYPE_HOST;
    m.srcHost = mirror;
    m.srcXInBytes = m.srcY = m.srcZ = 0;
    m.srcPitch = p.WidthInBytes;
    m.srcHeight = p.Height;
  } else {
    m.dstMemoryType = CU_MEMORYTYPE_HOST;
    m.dstHost = mirror;
    m.dstXInBytes = m.dstY = m.dstZ = 0;
    m.dstPitch = p.WidthInBytes;
    m.dstHeight = p.Height;
  }
  CUgraph g = nullptr;
  CUresult rc = a.cuGraphCreate(&g, 0);
  if (rc != CUDA_SUCCESS) return rc;
  CUDA_HOST_NODE_PARAMS host{};
  host.fn = src_client ? FetchHelper() : DeliverHelper();
  host.userData = w.get();
  CUgraphNode first = nullptr, second = nullptr;
  if (src_client) {
    rc = a.cuGraphAddHostNode(&first, g, nullptr, 0, &host);
    if (rc == CUDA_SUCCESS) rc = a.cuGraphAddMemcpyNode(&second, g, &first, 1, &m, ctx);
  } else {
    rc = a.cuGraphAddMemcpyNode(&first, g, nullptr, 0, &m, ctx);
    if (rc == CUDA_SUCCESS) rc = a.cuGraphAddHostNode(&second, g, &first, 1, &host);
  }
  if (rc != CUDA_SUCCESS) {
    a.cuGraphDestroy(g);
    return rc;
  }
  captured_.push_back(std::move(w));
  *out = g;
  return CUDA_SUCCESS;
}

bool Session::CopyWrapperParts(CUgraphNode node, CUgraphNode* copy, CUgraphNode* host,
                               CapturedWork** work) {
  DriverApi& a = state_->api;
  CUgraphNodeType type{};
  CUgraph inner = nullptr;
  if (a.cuGraphNodeGetType(node, &type) != CUDA_SUCCESS || type != CU_GRAPH_NODE_TYPE_GRAPH ||
      a.cuGraphChildGraphNodeGetGraph(node, &inner) != CUDA_SUCCESS)
    return false;
  CUgraphNode nodes[2];
  size_t n = 2;
  if (a.cuGraphGetNodes(inner, nodes, &n) != CUDA_SUCCESS || n != 2) return false;
  CUgraphNode found_copy = nullptr, found_host = nullptr;
  CapturedWork* found_work = nullptr;
  for (CUgraphNode x : nodes) {
    CUgraphNodeType t{};
    if (a.cuGraphNodeGetType(x, &t) != CUDA_SUCCESS) return false;
    CUDA_HOST_NODE_PARAMS hp{};
    if (t == CU_GRAPH_NODE_TYPE_MEMCPY) {
      found_copy = x;
    } else if (t == CU_GRAPH_NODE_TYPE_HOST && a.cuGraphHostNodeGetParams(x, &hp) == CUDA_SUCCESS &&
               (hp.fn == FetchHelper() || hp.fn == DeliverHelper())) {
      found_host = x;
      found_work = static_cast<CapturedWork*>(hp.userData);
    }
  }
  if (found_copy == nullptr || found_host == nullptr) return false;
  if (copy) *copy = found_copy;
  if (host) *host = found_host;
  if (work) *work = found_work;
  return true;
}

bool Session::ReadNodeDesc(Reader& in, NodeDesc* d, CUresult* rc) {
  uint32_t type = 0;
  if (!in.Get(&type)) return false;
  d->type = static_cast<CUgraphNodeType>(type);
  switch (d->type) {
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      uint8_t sc = 0, dc = 0;
      if (!in.Get(&d->copy) || !in.Get(&d->ctx) || !in.Get(&sc) || !in.Get(&dc)) return false;
      d->src_client = sc != 0;
      d->dst_client = dc != 0;
      auto side_ok = [](CUmemorytype t) {
        return t == CU_MEMORYTYPE_HOST || t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_ARRAY;
      };
      if (!side_ok(d->copy.srcMemoryType) || !side_ok(d->copy.dstMemoryType) ||
          (d->src_client && d->copy.srcMemoryType != CU_MEMORYTYPE_HOST) ||
          (d->dst_client && d->copy.dstMemoryType != CU_MEMORYTYPE_HOST))
        *rc = CUDA_ERROR_INVALID_VALUE;
      // Host memory is the client's (reached through a mirror), never this process's.
      if ((d->copy.srcMemoryType == CU_MEMORYTYPE_HOST && !d->src_client) ||
          (d->copy.dstMemoryType == CU_MEMORYTYPE_HOST && !d->dst_client) ||
          CopyBytes(d->copy) == 0)
        *rc = CUDA_ERROR_INVALID_VALUE;
      if (d->copy.srcMemoryType == CU_MEMORYTYPE_ARRAY ||
          d->copy.dstMemoryType == CU_MEMORYTYPE_ARRAY) {
        if (*rc == CUDA_SUCCESS) {
          FLYT_WARN_ONCE("graph memcpy node with a CUDA array: not supported");
          *rc = CUDA_ERROR_NOT_SUPPORTED;
        }
      }
      if (d->src_client && d->dst_client && *rc == CUDA_SUCCESS) {
        FLYT_WARN_ONCE("graph memcpy node from host to host memory: not supported");
        *rc = CUDA_ERROR_NOT_SUPPORTED;
      }
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET:
      if (!in.Get(&d->memset) || !in.Get(&d->ctx)) return false;
      break;
    case CU_GRAPH_NODE_TYPE_HOST:
    case CU_GRAPH_NODE_TYPE_GRAPH:
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      if (!in.Get(&d->value)) return false;
      if (d->type == CU_GRAPH_NODE_TYPE_GRAPH && !Owns(HandleKind::kGraph, d->value))
        *rc = CUDA_ERROR_INVALID_VALUE;
      if (d->type == CU_GRAPH_NODE_TYPE_GRAPH) d->value = RealHandle(HandleKind::kGraph, d->value);
      if ((d->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ||
           d->type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) &&
          !Owns(HandleKind::kEvent, d->value))
        *rc = CUDA_ERROR_INVALID_HANDLE;
      if (d->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD || d->type == CU_GRAPH_NODE_TYPE_WAIT_EVENT)
        d->value = RealHandle(HandleKind::kEvent, d->value);
      break;
    case CU_GRAPH_NODE_TYPE_EMPTY:
      break;
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      uint32_t n = 0;
      if (!in.Get(&d->device) || !in.Get(&n) || n > ops::kMaxAccessDescs) return false;
      d->access.resize(n);
      for (auto& x : d->access)
        if (!in.Get(&x)) return false;
      if (!in.Get(&d->value)) return false;  // bytes
      if (d->value == 0 || d->value > kMaxCopyBytes) *rc = CUDA_ERROR_INVALID_VALUE;
      break;
    }
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      if (!in.Get(&d->value) || !in.Get(&d->cond_type) || !in.Get(&d->cond_size) ||
          !in.Get(&d->ctx))
        return false;
      if (cond_handles_.count(d->value) == 0 || d->cond_size == 0 ||
          d->cond_size > ops::kMaxConditionalBodies)
        *rc = CUDA_ERROR_INVALID_VALUE;
      break;
    default:
      if (*rc == CUDA_SUCCESS) {
        FLYT_WARN("graph node of type %u built by hand: not supported", type);
        *rc = CUDA_ERROR_NOT_SUPPORTED;
      }
      break;
  }
  if (d->ctx != 0 && !Owns(HandleKind::kContext, d->ctx)) *rc = CUDA_ERROR_INVALID_HANDLE;
  return true;
}

// Request and reply: see ops::kOpGraphNode.
bool Session::GraphNode(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t which = 0;
  uint64_t target = 0, node_raw = 0;
  std::vector<CUgraphNode> deps;
  NodeDesc d;
  *rc = CUDA_SUCCESS;
  if (!in.Get(&which) || which > ops::kGraphNodeExecSet || !in.Get(&target) || !in.Get(&node_raw))
    return false;
  if (which == ops::kGraphNodeAdd && !ReadNodeList(in, &deps, rc)) return false;
  if (!ReadNodeDesc(in, &d, rc) || in.remaining() != 0) return false;
  HandleKind target_kind = which == ops::kGraphNodeAdd   ? HandleKind::kGraph
                           : which == ops::kGraphNodeSet ? HandleKind::kGraphNode
                                                         : HandleKind::kGraphExec;
  if (!Owns(target_kind, target) ||
      (which == ops::kGraphNodeExecSet && !Owns(HandleKind::kGraphNode, node_raw)))
    *rc = CUDA_ERROR_INVALID_HANDLE;
  if (*rc != CUDA_SUCCESS) return true;
  CUgraph graph = reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, target));
  CUgraphNode node = which == ops::kGraphNodeSet
                         ? reinterpret_cast<CUgraphNode>(RealHandle(HandleKind::kGraphNode, target))
                         : ExecNode(target, node_raw);
  CUgraphExec exec = reinterpret_cast<CUgraphExec>(RealHandle(HandleKind::kGraphExec, target));
  const bool exec_set = which == ops::kGraphNodeExecSet;
  CUcontext ctx = RealContext(d.ctx);
  CUgraphNode created = nullptr;
  const bool add = which == ops::kGraphNodeAdd;
  switch (d.type) {
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      bool wrapped = d.src_client || d.dst_client;
      if (add) {
        if (!wrapped) {
          *rc = a.cuGraphAddMemcpyNode(&created, graph, deps.data(), deps.size(), &d.copy, ctx);
          break;
        }
        auto sub = subgraphs_.find(target);
        if (sub != subgraphs_.end() && sub->second != 0) {
          // A conditional body may not hold host nodes, and the client's
          // memory is reached through one.
          FLYT_WARN_ONCE(
              "graph memcpy node with host memory inside a conditional node's body: not "
              "supported (CUDA_ERROR_NOT_SUPPORTED)");
          *rc = CUDA_ERROR_NOT_SUPPORTED;
          break;
        }
        CUgraph inner = nullptr;
        *rc = BuildCopyGraph(d.copy, ctx, d.src_client, &inner);
        if (*rc != CUDA_SUCCESS) break;
        *rc = a.cuGraphAddChildGraphNode(&created, graph, deps.data(), deps.size(), inner);
        a.cuGraphDestroy(inner);
        break;
      }
      CUgraphNode copy = nullptr, host = nullptr;
      CapturedWork* work = nullptr;
      bool is_wrapper = CopyWrapperParts(node, &copy, &host, &work);
      if (is_wrapper != wrapped ||
          (is_wrapper && (work->kind == CapturedWork::Kind::kFetch) != d.src_client)) {
        *rc = CUDA_ERROR_INVALID_VALUE;  // natively a copy's kind cannot change either
        break;
      }
      if (!wrapped) {
        *rc = which == ops::kGraphNodeSet
                  ? a.cuGraphMemcpyNodeSetParams(node, &d.copy)
                  : a.cuGraphExecMemcpyNodeSetParams(exec, node, &d.copy, ctx);
        if (*rc == CUDA_SUCCESS && exec_set)
          MirrorExecChange(target, node_raw, "copy parameters",
                           [&](CUgraphNode t) { return a.cuGraphMemcpyNodeSetParams(t, &d.copy); });
        break;
      }
      CUgraph inner = nullptr;
      *rc = BuildCopyGraph(d.copy, ctx, d.src_client, &inner);
      if (*rc != CUDA_SUCCESS) break;
      if (which == ops::kGraphNodeExecSet) {
        *rc = a.cuGraphExecChildGraphNodeSetParams(exec, node, inner);
        if (*rc == CUDA_SUCCESS)
          MirrorExecChange(target, node_raw, "copy parameters",
                           [&](CUgraphNode t) { return SetCopyWrapper(t, inner); });
      } else {
        *rc = SetCopyWrapper(node, inner);  // the node's own graph takes the new parameters
      }
      a.cuGraphDestroy(inner);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET:
      if (add) {
        *rc = a.cuGraphAddMemsetNode(&created, graph, deps.data(), deps.size(), &d.memset, ctx);
      } else if (which == ops::kGraphNodeSet) {
        *rc = a.cuGraphMemsetNodeSetParams(node, &d.memset);
      } else {
        *rc = a.cuGraphExecMemsetNodeSetParams(exec, node, &d.memset, ctx);
        if (*rc == CUDA_SUCCESS)
          MirrorExecChange(target, node_raw, "memset parameters", [&](CUgraphNode t) {
            return a.cuGraphMemsetNodeSetParams(t, &d.memset);
          });
      }
      break;
    case CU_GRAPH_NODE_TYPE_HOST: {
      if (which == ops::kGraphNodeExecSet && a.cuGraphExecHostNodeSetParams == nullptr) {
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }
      auto w = std::make_unique<CapturedWork>(
          CapturedWork{CapturedWork::Kind::kHostFunc, this, d.value});
      CUDA_HOST_NODE_PARAMS p{};
      p.fn = RunCapturedHostFuncFn();
      p.userData = w.get();
      // The executable graph's copy of the node calls the new callback id.
      *rc = add ? a.cuGraphAddHostNode(&created, graph, deps.data(), deps.size(), &p)
            : which == ops::kGraphNodeSet ? a.cuGraphHostNodeSetParams(node, &p)
                                          : a.cuGraphExecHostNodeSetParams(exec, node, &p);
      if (*rc == CUDA_SUCCESS) captured_.push_back(std::move(w));
      if (*rc == CUDA_SUCCESS && exec_set)
        MirrorExecChange(target, node_raw, "host function",
                         [&](CUgraphNode t) { return a.cuGraphHostNodeSetParams(t, &p); });
      break;
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (add) {
        *rc = a.cuGraphAddChildGraphNode(&created, graph, deps.data(), deps.size(),
                                         reinterpret_cast<CUgraph>(d.value));
      } else if (which == ops::kGraphNodeExecSet) {
        *rc = a.cuGraphExecChildGraphNodeSetParams(exec, node, reinterpret_cast<CUgraph>(d.value));
        // The template's child graph node cannot take another graph's parameters.
        if (*rc == CUDA_SUCCESS)
          MirrorExecChange(target, node_raw, "child graph",
                           [](CUgraphNode) { return CUDA_ERROR_NOT_SUPPORTED; });
      } else {
        *rc = CUDA_ERROR_INVALID_VALUE;  // as natively: a child graph node's graph is fixed
      }
      break;
    case CU_GRAPH_NODE_TYPE_EMPTY:
      if (add) {
        *rc = a.cuGraphAddEmptyNode(&created, graph, deps.data(), deps.size());
      } else {
        *rc = CUDA_SUCCESS;
      }
      break;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      if (!add) {
        FLYT_WARN_ONCE("setting an event node's event: not supported");
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }
      CUevent ev = reinterpret_cast<CUevent>(d.value);
      *rc = d.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD
                ? a.cuGraphAddEventRecordNode(&created, graph, deps.data(), deps.size(), ev)
                : a.cuGraphAddEventWaitNode(&created, graph, deps.data(), deps.size(), ev);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      if (!add) {
        *rc = CUDA_ERROR_INVALID_VALUE;  // natively not updatable
        break;
      }
      if (!ChargeMemory(d.value, d.device)) {
        *rc = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      CUDA_MEM_ALLOC_NODE_PARAMS p{};
      p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
      p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      p.poolProps.location.id = d.device;
      p.accessDescs = d.access.empty() ? nullptr : d.access.data();
      p.accessDescCount = d.access.size();
      p.bytesize = d.value;
      *rc = a.cuGraphAddMemAllocNode(&created, graph, deps.data(), deps.size(), &p);
      if (*rc != CUDA_SUCCESS) {
        RefundMemory(d.value, d.device);
        break;
      }
      graph_allocs_[p.dptr] = GraphAlloc{target, d.value, d.device};
      // As natively, memory a graph allocated may also be freed outside any
      // graph (cuMemFree, cuMemFreeAsync) once the graph has run.
      Adopt(HandleKind::kMemory, p.dptr);
      const uint64_t client =
          ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(created));
      out.Put<uint64_t>(client);
      out.Put<uint64_t>(p.dptr);
      Adopt(HandleKind::kGraphNode, client);
      return true;
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      if (!add) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      // Only pointers the session knows reach the driver; others get the
      // driver's answer to memory no graph allocated.
      if (graph_allocs_.count(d.value) == 0 && memory_bytes_.count(d.value) == 0) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      *rc = a.cuGraphAddMemFreeNode(&created, graph, deps.data(), deps.size(), d.value);
      break;
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
      if (!add) {
        FLYT_WARN_ONCE("setting a conditional node's parameters: not supported");
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }
      if (a.cuGraphAddNode_v2 == nullptr) {
        FLYT_WARN_ONCE("conditional graph nodes: the server's driver has no cuGraphAddNode_v2");
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        break;
      }
      CUgraphNodeParams p{};
      p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
      p.conditional.handle = d.value;
      p.conditional.type = static_cast<CUgraphConditionalNodeType>(d.cond_type);
      p.conditional.size = d.cond_size;
      p.conditional.ctx = ctx;
      *rc = a.cuGraphAddNode_v2(&created, graph, deps.data(), nullptr, deps.size(), &p);
      if (*rc != CUDA_SUCCESS) break;
      if (p.conditional.phGraph_out == nullptr) {  // the driver's array of the bodies
        *rc = CUDA_ERROR_UNKNOWN;
        break;
      }
      std::vector<CUgraph> bodies(p.conditional.phGraph_out,
                                  p.conditional.phGraph_out + d.cond_size);
      const uint64_t client =
          ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(created));
      Adopt(HandleKind::kGraphNode, client);
      out.Put<uint64_t>(client);
      out.Put<uint32_t>(d.cond_size);
      for (CUgraph b : bodies) {
        uint64_t raw = ClientHandle(HandleKind::kGraph, reinterpret_cast<uintptr_t>(b));
        Adopt(HandleKind::kGraph, raw);
        subgraphs_[raw] = target;
        out.Put(raw);
      }
      return true;
    }
    default:
      *rc = CUDA_ERROR_NOT_SUPPORTED;
      break;
  }
  if (add) {
    uint64_t client = 0;
    if (*rc == CUDA_SUCCESS) {
      client = ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(created));
      Adopt(HandleKind::kGraphNode, client);
    }
    out.Put<uint64_t>(client);
  }
  return true;
}

CUresult Session::SetCopyWrapper(CUgraphNode wrapper, CUgraph inner) {
  DriverApi& a = state_->api;
  CUgraphNode copy = nullptr, host = nullptr;
  if (!CopyWrapperParts(wrapper, &copy, &host, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  CUgraphNode new_copy = nullptr, new_host = nullptr;
  CUgraphNode parts[2];
  size_t n = 2;
  CUresult rc = a.cuGraphGetNodes(inner, parts, &n);
  for (size_t i = 0; rc == CUDA_SUCCESS && i < n; ++i) {
    CUgraphNodeType t{};
    rc = a.cuGraphNodeGetType(parts[i], &t);
    (t == CU_GRAPH_NODE_TYPE_MEMCPY ? new_copy : new_host) = parts[i];
  }
  if (rc == CUDA_SUCCESS && (new_copy == nullptr || new_host == nullptr)) rc = CUDA_ERROR_UNKNOWN;
  CUDA_MEMCPY3D mp{};
  CUDA_HOST_NODE_PARAMS hp{};
  if (rc == CUDA_SUCCESS) rc = a.cuGraphMemcpyNodeGetParams(new_copy, &mp);
  if (rc == CUDA_SUCCESS) rc = a.cuGraphHostNodeGetParams(new_host, &hp);
  if (rc == CUDA_SUCCESS) rc = a.cuGraphMemcpyNodeSetParams(copy, &mp);
  if (rc == CUDA_SUCCESS) rc = a.cuGraphHostNodeSetParams(host, &hp);
  return rc;
}

// Request: u64 node. Reply: see ops::kOpGraphNodeQuery.
bool Session::GraphNodeQuery(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t raw = 0;
  *rc = CUDA_SUCCESS;
  if (!in.Get(&raw) || in.remaining() != 0) return false;
  if (!Owns(HandleKind::kGraphNode, raw)) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  CUgraphNode node = reinterpret_cast<CUgraphNode>(RealHandle(HandleKind::kGraphNode, raw));
  CUgraphNodeType type{};
  *rc = a.cuGraphNodeGetType(node, &type);
  if (*rc != CUDA_SUCCESS) return true;
  CUgraphNode copy = nullptr;
  CapturedWork* work = nullptr;
  if (type == CU_GRAPH_NODE_TYPE_GRAPH && CopyWrapperParts(node, &copy, nullptr, &work)) {
    CUDA_MEMCPY3D p{};
    *rc = a.cuGraphMemcpyNodeGetParams(copy, &p);
    if (*rc != CUDA_SUCCESS) return true;
    void* client = reinterpret_cast<void*>(static_cast<uintptr_t>(work->client_addr));
    if (work->kind == CapturedWork::Kind::kFetch) {
      p.srcHost = client;
    } else {
      p.dstHost = client;
    }
    out.Put<uint32_t>(CU_GRAPH_NODE_TYPE_MEMCPY);
    out.Put(p);
    return true;
  }
  out.Put<uint32_t>(type);
  switch (type) {
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      CUDA_MEMCPY3D p{};
      *rc = a.cuGraphMemcpyNodeGetParams(node, &p);
      out.Put(p);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS p{};
      *rc = a.cuGraphMemsetNodeGetParams(node, &p);
      out.Put(p);
      break;
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      CUDA_HOST_NODE_PARAMS p{};
      *rc = a.cuGraphHostNodeGetParams(node, &p);
      uint64_t id = 0;
      if (*rc == CUDA_SUCCESS && p.fn == RunCapturedHostFuncFn())
        id = static_cast<CapturedWork*>(p.userData)->id;
      out.Put(id);
      break;
    }
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      CUgraph g = nullptr;
      *rc = a.cuGraphChildGraphNodeGetGraph(node, &g);
      uint64_t graw =
          g != nullptr ? ClientHandle(HandleKind::kGraph, reinterpret_cast<uintptr_t>(g)) : 0;
      if (*rc == CUDA_SUCCESS && !Owns(HandleKind::kGraph, graw)) {
        Adopt(HandleKind::kGraph, graw);
        subgraphs_[graw] = 0;  // its parent is not known here
      }
      out.Put(graw);
      break;
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      CUevent e = nullptr;
      *rc = type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? a.cuGraphEventRecordNodeGetEvent(node, &e)
                                                    : a.cuGraphEventWaitNodeGetEvent(node, &e);
      out.Put<uint64_t>(
          e != nullptr ? ClientHandle(HandleKind::kEvent, reinterpret_cast<uintptr_t>(e)) : 0);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      CUDA_MEM_ALLOC_NODE_PARAMS p{};
      *rc = a.cuGraphMemAllocNodeGetParams(node, &p);
      out.Put<uint64_t>(p.bytesize);
      out.Put<uint64_t>(p.dptr);
      out.Put<int32_t>(p.poolProps.location.id);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE: {
      CUdeviceptr p = 0;
      *rc = a.cuGraphMemFreeNodeGetParams(node, &p);
      out.Put<uint64_t>(p);
      break;
    }
    case CU_GRAPH_NODE_TYPE_KERNEL:
      *rc = DescribeKernelNode(node, out);
      break;
    default:
      break;
  }
  return true;
}

// Request and reply: see ops::kOpGraphMisc.
bool Session::GraphMisc(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t sub = 0;
  *rc = CUDA_SUCCESS;
  if (!in.Get(&sub)) return false;
  switch (sub) {
    case ops::kGraphMiscClone: {
      uint64_t g = 0;
      if (!in.Get(&g) || in.remaining() != 0) return false;
      if (!Owns(HandleKind::kGraph, g)) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      CUgraph clone = nullptr;
      *rc = a.cuGraphClone(&clone, reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, g)));
      uint64_t client = 0;
      if (*rc == CUDA_SUCCESS) {
        client = ClientHandle(HandleKind::kGraph, reinterpret_cast<uintptr_t>(clone));
        Adopt(HandleKind::kGraph, client);
        NewTopLevelGraph(client);
      }
      out.Put<uint64_t>(client);
      return true;
    }
    case ops::kGraphMiscFindInClone: {
      uint64_t node = 0, clone = 0;
      if (!in.Get(&node) || !in.Get(&clone) || in.remaining() != 0) return false;
      if (!Owns(HandleKind::kGraphNode, node) || !Owns(HandleKind::kGraph, clone)) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      CUgraphNode found = nullptr;
      *rc = a.cuGraphNodeFindInClone(
          &found, reinterpret_cast<CUgraphNode>(RealHandle(HandleKind::kGraphNode, node)),
          reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, clone)));
      uint64_t client = 0;
      if (*rc == CUDA_SUCCESS) {
        client = ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(found));
        Adopt(HandleKind::kGraphNode, client);
      }
      out.Put<uint64_t>(client);
      return true;
    }
    case ops::kGraphMiscCondHandle: {
      uint64_t g = 0, ctx = 0;
      uint32_t def = 0, flags = 0;
      if (!in.Get(&g) || !in.Get(&ctx) || !in.Get(&def) || !in.Get(&flags) || in.remaining() != 0)
        return false;
      if (!Owns(HandleKind::kGraph, g) || (ctx != 0 && !Owns(HandleKind::kContext, ctx))) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      if (a.cuGraphConditionalHandleCreate == nullptr) {
        FLYT_WARN_ONCE("cuGraphConditionalHandleCreate: not in the server's driver");
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        return true;
      }
      CUgraphConditionalHandle h = 0;
      *rc = a.cuGraphConditionalHandleCreate(
          &h, reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, g)), RealContext(ctx), def,
          flags);
      if (*rc == CUDA_SUCCESS) cond_handles_.insert(h);
      out.Put<uint64_t>(h);
      return true;
    }
    case ops::kGraphMiscMemAttrGet:
    case ops::kGraphMiscMemAttrSet: {
      int32_t dev = 0, attr = 0;
      uint64_t value = 0;
      if (!in.Get(&dev) || !in.Get(&attr)) return false;
      if (sub == ops::kGraphMiscMemAttrSet && !in.Get(&value)) return false;
      if (in.remaining() != 0) return false;
      if (attr < CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT || attr > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      auto fn = sub == ops::kGraphMiscMemAttrGet ? a.cuDeviceGetGraphMemAttribute
                                                 : a.cuDeviceSetGraphMemAttribute;
      *rc = fn(dev, static_cast<CUgraphMem_attribute>(attr), &value);
      if (sub == ops::kGraphMiscMemAttrGet) out.Put(value);
      return true;
    }
    case ops::kGraphMiscMemTrim: {
      int32_t dev = 0;
      if (!in.Get(&dev) || in.remaining() != 0) return false;
      *rc = a.cuDeviceGraphMemTrim(dev);
      return true;
    }
    case ops::kGraphMiscDotPrint: {
      uint64_t g = 0;
      uint32_t flags = 0;
      if (!in.Get(&g) || !in.Get(&flags) || in.remaining() != 0) return false;
      if (!Owns(HandleKind::kGraph, g)) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      *rc = DotPrint(reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, g)), flags, out);
      return true;
    }
    default:
      return false;
  }
}

// cuGraphDebugDotPrint writes a file on this host: into a private temporary file
// whose bytes go to the client, which writes them where the app asked.
CUresult Session::DotPrint(CUgraph graph, unsigned flags, Writer& out) {
  DriverApi& a = state_->api;
  if (a.cuGraphDebugDotPrint == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  char path[] = "/tmp/flyt-graph-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    FLYT_WARN("cuGraphDebugDotPrint: cannot make a temporary file: %s", std::strerror(errno));
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  CUresult rc = a.cuGraphDebugDotPrint(graph, path, flags);
  struct stat st {};
  if (rc == CUDA_SUCCESS && (fstat(fd, &st) != 0 || st.st_size < 0 ||
                             static_cast<uint64_t>(st.st_size) > wire::kMaxPayload / 2))
    rc = CUDA_ERROR_OPERATING_SYSTEM;
  if (rc == CUDA_SUCCESS) {
    const size_t size = static_cast<size_t>(st.st_size);
    uint8_t* dst = out.Grow(size);
    size_t got = 0;
    while (got < size) {
      ssize_t n = pread(fd, dst + got, size - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != size) rc = CUDA_ERROR_OPERATING_SYSTEM;
  }
  close(fd);
  unlink(path);
  return rc;
}

void Session::GraphForgotten(uint64_t graph) {
  subgraphs_.erase(graph);
  // Body graphs go with their parent: their handles are no longer the client's.
  std::vector<uint64_t> bodies;
  for (auto& [sub, parent] : subgraphs_)
    if (parent == graph) bodies.push_back(sub);
  for (uint64_t b : bodies) Forget(HandleKind::kGraph, b);
  std::vector<uint64_t> gone;
  for (auto it = graph_allocs_.begin(); it != graph_allocs_.end();) {
    if (it->second.graph == graph) {
      RefundMemory(it->second.bytes, it->second.device);
      gone.push_back(it->first);
      it = graph_allocs_.erase(it);
    } else {
      ++it;
    }
  }
  // Memory the graph never allocated (never launched) or freed itself is no
  // longer the client's; memory a launch left allocated stays until freed.
  for (uint64_t p : gone) {
    CUdeviceptr base = 0;
    size_t size = 0;
    if (state_->api.cuMemGetAddressRange_v2(&base, &size, p) != CUDA_SUCCESS)
      Forget(HandleKind::kMemory, p);
  }
}

void Session::ReleaseGraphNodes() {
  // Graphs owned by nodes go with their parents: never destroyed on their own.
  for (auto& [g, parent] : subgraphs_) handles_[static_cast<int>(HandleKind::kGraph)].erase(g);
  subgraphs_.clear();
  for (auto& [ptr, alloc] : graph_allocs_) RefundMemory(alloc.bytes, alloc.device);
  graph_allocs_.clear();
  cond_handles_.clear();
}

}  // namespace flyt::server
