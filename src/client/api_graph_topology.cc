// A graph's topology: cuGraphGetEdges, cuGraphGetRootNodes,
// cuGraphNodeGetDependencies / DependentNodes, cuGraphAddDependencies /
// RemoveDependencies (the CUDA 12.3+ ABIs with edge data and the older ones without),
// cuGraphDestroyNode and cuGraphNodeSetEnabled / GetEnabled.
//
// Owns: the packing of kOpGraphTopology (protocol/ops.h) and the output conventions the
// driver documents: a null array asks for the count, entries past the end are set to
// NULL, and a query without edge data of an edge that has some is
// CUDA_ERROR_LOSSY_QUERY. With several servers (client/multi_server.cc) a request goes
// to the server of its graph, node or executable graph (handles sent without their tags,
// nodes answered with it); handles of two servers are refused. Must not touch node
// contents (api_graph_nodes.cc); no stdout.
#include <cstring>
#include <vector>

#include "client/client.h"

using flyt::client::Client;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace {

uint64_t Raw(const void* p) { return reinterpret_cast<uintptr_t>(p); }
uint64_t Wire(const void* p) { return Client::WireHandle(p); }

// Several servers: the server the calling thread's last list came from (AskList).
thread_local int t_list_server = -1;
CUgraphNode Answered(uint64_t h) {
  return reinterpret_cast<CUgraphNode>(t_list_server > 0 ? Client::Tag(h, t_list_server) : h);
}

bool DataSet(const CUgraphEdgeData& d) {
  static const CUgraphEdgeData kZero{};
  return std::memcmp(&d, &kZero, sizeof(d)) != 0;
}

// `server`: where it goes (GraphServer; -1 with one server).
CUresult Ask(const char* name, const wire::Writer& w, std::vector<uint8_t>* reply, int server) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (server == -2) return flyt::client::RefuseAcrossServers(name);
  flyt::client::GraphRoute route(server);
  return c.Call(name, ops::kOpGraphTopology, w, ReplySink{reply});
}

// Asks for a list (kGraphTopoEdges / Roots / Neighbours) about `target`; on success *r
// is past the count *n, each entry `entry` bytes long.
CUresult AskList(const char* name, uint8_t which, uint64_t target, const uint8_t* extra,
                 size_t entry, std::vector<uint8_t>* reply, wire::Reader* r, uint32_t* n) {
  wire::Writer w;
  w.Put<uint8_t>(which);
  w.Put<uint64_t>(Client::WireValue(target));
  if (extra != nullptr) w.Put<uint8_t>(*extra);
  t_list_server = flyt::client::GraphServer({target});
  CUresult rc = Ask(name, w, reply, t_list_server);
  if (rc != CUDA_SUCCESS) return rc;
  *r = wire::Reader(reply->data(), reply->size());
  if (!r->Get(n) || *n > r->remaining() / entry) return CUDA_ERROR_UNKNOWN;
  return CUDA_SUCCESS;
}

// Copies up to *count entries into the arrays (NULLs past the end) and writes the number
// copied, or without arrays the total, to *count.
CUresult Deliver(const std::vector<CUgraphNode>& a, const std::vector<CUgraphNode>* b,
                 const std::vector<CUgraphEdgeData>& data, CUgraphNode* out_a, CUgraphNode* out_b,
                 CUgraphEdgeData* out_data, size_t* count) {
  if (out_a == nullptr) {
    *count = a.size();
    return CUDA_SUCCESS;
  }
  bool lossy = false;
  for (size_t i = 0; i < *count; ++i) {
    const bool have = i < a.size();
    out_a[i] = have ? a[i] : nullptr;
    if (out_b != nullptr && b != nullptr) out_b[i] = have ? (*b)[i] : nullptr;
    if (out_data != nullptr) out_data[i] = have ? data[i] : CUgraphEdgeData{};
    lossy = lossy || (have && out_data == nullptr && DataSet(data[i]));
  }
  if (*count > a.size()) *count = a.size();
  return lossy ? CUDA_ERROR_LOSSY_QUERY : CUDA_SUCCESS;
}

CUresult Edges(CUgraph g, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
               size_t* count) {
  if (count == nullptr || (from == nullptr) != (to == nullptr) ||
      (data != nullptr && from == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint8_t> reply;
  wire::Reader r(nullptr, 0);
  uint32_t n = 0;
  CUresult rc =
      AskList("cuGraphGetEdges", ops::kGraphTopoEdges, Raw(g), nullptr, 24, &reply, &r, &n);
  if (rc != CUDA_SUCCESS) return rc;
  std::vector<CUgraphNode> f(n), t(n);
  std::vector<CUgraphEdgeData> d(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t a = 0, b = 0;
    if (!r.Get(&a) || !r.Get(&b) || !r.Get(&d[i])) return CUDA_ERROR_UNKNOWN;
    f[i] = Answered(a);
    t[i] = Answered(b);
  }
  return Deliver(f, &t, d, from, to, data, count);
}

CUresult Neighbours(const char* name, CUgraphNode node, bool dependents, CUgraphNode* out,
                    CUgraphEdgeData* data, size_t* count) {
  if (count == nullptr || (data != nullptr && out == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  const uint8_t which_way = dependents ? 1 : 0;
  std::vector<uint8_t> reply;
  wire::Reader r(nullptr, 0);
  uint32_t n = 0;
  CUresult rc = AskList(name, ops::kGraphTopoNeighbours, Raw(node), &which_way, 16, &reply, &r, &n);
  if (rc != CUDA_SUCCESS) return rc;
  std::vector<CUgraphNode> list(n);
  std::vector<CUgraphEdgeData> d(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t a = 0;
    if (!r.Get(&a) || !r.Get(&d[i])) return CUDA_ERROR_UNKNOWN;
    list[i] = Answered(a);
  }
  return Deliver(list, nullptr, d, out, nullptr, data, count);
}

CUresult ChangeEdges(const char* name, uint8_t which, CUgraph g, const CUgraphNode* from,
                     const CUgraphNode* to, const CUgraphEdgeData* data, size_t n) {
  if (n > 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (n > (1u << 16)) return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint8_t>(which);
  w.Put<uint64_t>(Wire(g));
  w.Put<uint32_t>(static_cast<uint32_t>(n));
  flyt::client::ArgRoute where;
  const bool multi = Client::Get().multi();
  if (multi) flyt::client::RouteArg(&where, Client::TagOf(Raw(g)));
  for (size_t i = 0; i < n; ++i) {
    if (multi) {
      flyt::client::RouteArg(&where, Client::TagOf(Raw(from[i])));
      flyt::client::RouteArg(&where, Client::TagOf(Raw(to[i])));
    }
    w.Put<uint64_t>(Wire(from[i]));
    w.Put<uint64_t>(Wire(to[i]));
    w.Put(data != nullptr ? data[i] : CUgraphEdgeData{});
  }
  std::vector<uint8_t> reply;
  return Ask(name, w, &reply, multi ? where.server : -1);
}

CUresult Enabled(const char* name, uint8_t which, CUgraphExec exec, CUgraphNode node, unsigned set,
                 unsigned* get) {
  wire::Writer w;
  w.Put<uint8_t>(which);
  w.Put<uint64_t>(Wire(exec));
  w.Put<uint64_t>(Wire(node));
  if (which == ops::kGraphTopoSetEnabled) w.Put<uint32_t>(set);
  std::vector<uint8_t> reply;
  CUresult rc = Ask(name, w, &reply, flyt::client::GraphServer({Raw(exec), Raw(node)}));
  if (rc != CUDA_SUCCESS || get == nullptr) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint32_t v = 0;
  if (!r.Get(&v)) return CUDA_ERROR_UNKNOWN;
  *get = v;
  return CUDA_SUCCESS;
}

}  // namespace

// The CUDA 13 header maps these names to their _v2 ABIs; the unsuffixed symbols keep
// the older ABIs (no edge data) for programs built against earlier headers.
#undef cuGraphGetEdges
#undef cuGraphNodeGetDependencies
#undef cuGraphNodeGetDependentNodes
#undef cuGraphAddDependencies
#undef cuGraphRemoveDependencies

FLYT_API CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode* from, CUgraphNode* to,
                                     CUgraphEdgeData* data, size_t* count) {
  return Edges(g, from, to, data, count);
}
FLYT_API CUresult cuGraphGetEdges(CUgraph g, CUgraphNode* from, CUgraphNode* to, size_t* count) {
  return Edges(g, from, to, nullptr, count);
}
FLYT_API CUresult cuGraphGetRootNodes(CUgraph g, CUgraphNode* roots, size_t* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint8_t> reply;
  wire::Reader r(nullptr, 0);
  uint32_t n = 0;
  CUresult rc =
      AskList("cuGraphGetRootNodes", ops::kGraphTopoRoots, Raw(g), nullptr, 8, &reply, &r, &n);
  if (rc != CUDA_SUCCESS) return rc;
  std::vector<CUgraphNode> list(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t a = 0;
    if (!r.Get(&a)) return CUDA_ERROR_UNKNOWN;
    list[i] = Answered(a);
  }
  return Deliver(list, nullptr, std::vector<CUgraphEdgeData>(n), roots, nullptr, nullptr, count);
}
FLYT_API CUresult cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode* deps,
                                                CUgraphEdgeData* data, size_t* count) {
  return Neighbours("cuGraphNodeGetDependencies", node, false, deps, data, count);
}
FLYT_API CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode* deps, size_t* count) {
  return Neighbours("cuGraphNodeGetDependencies", node, false, deps, nullptr, count);
}
FLYT_API CUresult cuGraphNodeGetDependentNodes_v2(CUgraphNode node, CUgraphNode* deps,
                                                  CUgraphEdgeData* data, size_t* count) {
  return Neighbours("cuGraphNodeGetDependentNodes", node, true, deps, data, count);
}
FLYT_API CUresult cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode* deps, size_t* count) {
  return Neighbours("cuGraphNodeGetDependentNodes", node, true, deps, nullptr, count);
}
FLYT_API CUresult cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode* from,
                                            const CUgraphNode* to, const CUgraphEdgeData* data,
                                            size_t n) {
  return ChangeEdges("cuGraphAddDependencies", ops::kGraphTopoAddEdges, g, from, to, data, n);
}
FLYT_API CUresult cuGraphAddDependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                         size_t n) {
  return ChangeEdges("cuGraphAddDependencies", ops::kGraphTopoAddEdges, g, from, to, nullptr, n);
}
FLYT_API CUresult cuGraphRemoveDependencies_v2(CUgraph g, const CUgraphNode* from,
                                               const CUgraphNode* to, const CUgraphEdgeData* data,
                                               size_t n) {
  return ChangeEdges("cuGraphRemoveDependencies", ops::kGraphTopoRemoveEdges, g, from, to, data, n);
}
FLYT_API CUresult cuGraphRemoveDependencies(CUgraph g, const CUgraphNode* from,
                                            const CUgraphNode* to, size_t n) {
  return ChangeEdges("cuGraphRemoveDependencies", ops::kGraphTopoRemoveEdges, g, from, to, nullptr,
                     n);
}
FLYT_API CUresult cuGraphDestroyNode(CUgraphNode node) {
  wire::Writer w;
  w.Put<uint8_t>(ops::kGraphTopoDestroyNode);
  w.Put<uint64_t>(Wire(node));
  std::vector<uint8_t> reply;
  return Ask("cuGraphDestroyNode", w, &reply, flyt::client::GraphServer({Raw(node)}));
}
FLYT_API CUresult cuGraphNodeSetEnabled(CUgraphExec exec, CUgraphNode node, unsigned enabled) {
  return Enabled("cuGraphNodeSetEnabled", ops::kGraphTopoSetEnabled, exec, node, enabled, nullptr);
}
FLYT_API CUresult cuGraphNodeGetEnabled(CUgraphExec exec, CUgraphNode node, unsigned* enabled) {
  if (enabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Enabled("cuGraphNodeGetEnabled", ops::kGraphTopoGetEnabled, exec, node, 0, enabled);
}
