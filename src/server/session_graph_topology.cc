// A graph's topology as the app sees it: edges, root nodes, a node's dependencies and
// dependents, adding and removing edges, destroying nodes, and enabling nodes of an
// executable graph (kOpGraphTopology, protocol/ops.h).
//
// Owns: the handlers of kOpGraphTopology and the contraction of Flyt's helper nodes
// (host nodes that move client memory in a captured graph): they are never shown, and
// the nodes on either side of one are shown joined by a default edge. Must not touch
// node contents (session_graph_nodes.cc) or captures (session_graphs.cc). Handles
// cross as the client's values (RealHandle / ClientHandle / ExecNode).
#include <algorithm>
#include <cstring>
#include <set>

#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

namespace {

constexpr uint32_t kMaxEdges = 1u << 16;
static_assert(sizeof(CUgraphEdgeData) == 8, "edge data travels as 8 bytes");
using Neighbours = std::vector<std::pair<CUgraphNode, CUgraphEdgeData>>;

uint64_t Raw(CUgraphNode n) { return reinterpret_cast<uintptr_t>(n); }
CUgraphNode AsNode(uint64_t raw) { return reinterpret_cast<CUgraphNode>(raw); }

}  // namespace

CUresult Session::VisibleNeighbours(CUgraphNode node, bool dependents, Neighbours* out) {
  DriverApi& a = state_->api;
  auto query = dependents ? a.cuGraphNodeGetDependentNodes_v2 : a.cuGraphNodeGetDependencies_v2;
  if (query == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  std::vector<CUgraphNode> work = {node};
  std::set<CUgraphNode> seen = {node};
  while (!work.empty()) {
    CUgraphNode n = work.back();
    work.pop_back();
    size_t count = 0;
    CUresult rc = query(n, nullptr, nullptr, &count);
    std::vector<CUgraphNode> list(count);
    std::vector<CUgraphEdgeData> data(count);
    if (rc == CUDA_SUCCESS && count > 0) rc = query(n, list.data(), data.data(), &count);
    if (rc != CUDA_SUCCESS) return rc;
    for (size_t i = 0; i < count && i < list.size(); ++i) {
      if (!seen.insert(list[i]).second) continue;
      if (IsFlytHelperNode(list[i])) {
        work.push_back(list[i]);  // look through it
        continue;
      }
      out->emplace_back(list[i], n == node ? data[i] : CUgraphEdgeData{});
    }
  }
  return CUDA_SUCCESS;
}

// See kOpGraphTopology in protocol/ops.h.
bool Session::GraphTopology(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t which = 0;
  *rc = CUDA_SUCCESS;
  if (!in.Get(&which)) return false;
  switch (which) {
    case ops::kGraphTopoEdges:
    case ops::kGraphTopoRoots: {
      uint64_t graph = 0;
      if (!in.Get(&graph) || in.remaining() != 0) return false;
      if (!Owns(HandleKind::kGraph, graph)) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      std::vector<CUgraphNode> nodes;
      *rc = VisibleNodes(reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph)), &nodes);
      if (*rc != CUDA_SUCCESS) return true;
      Writer list;
      uint32_t count = 0;
      for (CUgraphNode node : nodes) {
        Neighbours deps;
        *rc = VisibleNeighbours(node, false, &deps);
        if (*rc != CUDA_SUCCESS) return true;
        if (which == ops::kGraphTopoRoots) {
          if (deps.empty()) {
            list.Put<uint64_t>(ClientHandle(HandleKind::kGraphNode, Raw(node)));
            ++count;
          }
          continue;
        }
        for (const auto& [from, data] : deps) {
          const uint64_t client = ClientHandle(HandleKind::kGraphNode, Raw(from));
          Adopt(HandleKind::kGraphNode, client);
          list.Put<uint64_t>(client);
          list.Put<uint64_t>(ClientHandle(HandleKind::kGraphNode, Raw(node)));
          list.Put(data);
          ++count;
        }
      }
      out.Put<uint32_t>(count);
      out.PutBytes(list.data(), list.size());
      return true;
    }
    case ops::kGraphTopoNeighbours: {
      uint64_t node = 0;
      uint8_t dependents = 0;
      if (!in.Get(&node) || !in.Get(&dependents) || in.remaining() != 0) return false;
      if (!Owns(HandleKind::kGraphNode, node)) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      Neighbours list;
      *rc = VisibleNeighbours(AsNode(RealHandle(HandleKind::kGraphNode, node)), dependents != 0,
                              &list);
      if (*rc != CUDA_SUCCESS) return true;
      out.Put<uint32_t>(static_cast<uint32_t>(list.size()));
      for (const auto& [n, data] : list) {
        const uint64_t client = ClientHandle(HandleKind::kGraphNode, Raw(n));
        Adopt(HandleKind::kGraphNode, client);
        out.Put<uint64_t>(client);
        out.Put(data);
      }
      return true;
    }
    case ops::kGraphTopoAddEdges:
    case ops::kGraphTopoRemoveEdges: {
      uint64_t graph = 0;
      uint32_t n = 0;
      if (!in.Get(&graph) || !in.Get(&n) || n > kMaxEdges) return false;
      std::vector<CUgraphNode> from(n), to(n);
      std::vector<CUgraphEdgeData> data(n);
      bool owned = Owns(HandleKind::kGraph, graph);
      for (uint32_t i = 0; i < n; ++i) {
        uint64_t f = 0, t = 0;
        if (!in.Get(&f) || !in.Get(&t) || !in.Get(&data[i])) return false;
        owned = owned && Owns(HandleKind::kGraphNode, f) && Owns(HandleKind::kGraphNode, t);
        from[i] = AsNode(RealHandle(HandleKind::kGraphNode, f));
        to[i] = AsNode(RealHandle(HandleKind::kGraphNode, t));
      }
      if (in.remaining() != 0) return false;
      if (!owned) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      CUgraph g = reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph));
      auto call = which == ops::kGraphTopoAddEdges ? a.cuGraphAddDependencies_v2
                                                   : a.cuGraphRemoveDependencies_v2;
      *rc = call == nullptr ? CUDA_ERROR_NOT_SUPPORTED
                            : call(g, from.data(), to.data(), data.data(), n);
      return true;
    }
    case ops::kGraphTopoDestroyNode: {
      uint64_t node = 0;
      if (!in.Get(&node) || in.remaining() != 0) return false;
      if (!Owns(HandleKind::kGraphNode, node)) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      *rc = a.cuGraphDestroyNode(AsNode(RealHandle(HandleKind::kGraphNode, node)));
      if (*rc == CUDA_SUCCESS) Forget(HandleKind::kGraphNode, node);
      return true;
    }
    case ops::kGraphTopoSetEnabled:
    case ops::kGraphTopoGetEnabled: {
      uint64_t exec = 0, node = 0;
      uint32_t enabled = 0;
      if (!in.Get(&exec) || !in.Get(&node)) return false;
      if (which == ops::kGraphTopoSetEnabled && !in.Get(&enabled)) return false;
      if (in.remaining() != 0) return false;
      if (!Owns(HandleKind::kGraphExec, exec) || !Owns(HandleKind::kGraphNode, node)) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return true;
      }
      CUgraphExec e = reinterpret_cast<CUgraphExec>(RealHandle(HandleKind::kGraphExec, exec));
      if (which == ops::kGraphTopoSetEnabled) {
        *rc = a.cuGraphNodeSetEnabled(e, ExecNode(exec, node), enabled);
        if (*rc == CUDA_SUCCESS) NoteNodeEnabled(exec, node, enabled != 0);
      } else {
        *rc = a.cuGraphNodeGetEnabled(e, ExecNode(exec, node), &enabled);
        out.Put<uint32_t>(enabled);
      }
      return true;
    }
    default:
      return false;
  }
}

}  // namespace flyt::server
