// Stream-capture queries. Defined beside the legacy ABIs of the same names
// (cuStreamGetCaptureInfo v1, _v2, _v3), so cuda.h must not rename them.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "client/client.h"

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

// --- stream capture state: a capturing stream's status, id, graph and the nodes the
// next captured work will depend on (kOpStreamCaptureInfo), and changes to that set
// (kOpCaptureDependencies: cuStreamUpdateCaptureDependencies, cuStreamBeginCaptureToGraph),
// as NVIDIA's graphConditionalNodes sample and NCCL use them to add nodes by hand.

// With several servers (client/multi_server.cc) these go to the stream's server (the
// current context's for a default stream): the stream, graph and nodes sent without
// their tags, the graph and nodes answered tagged, a capture id of server k >= 1 with k
// in its top byte (ids stay unique in the process, as natively). Nodes or a graph of
// another server are refused (RefuseAcrossServers).

namespace {

// The server of a capture call on stream `s`: -1 with one server (no change).
int StreamServer(CUstream s) {
  Client& c = Client::Get();
  return c.multi() ? c.StreamRoute(s) : -1;
}

// The arrays cuStreamGetCaptureInfo hands out, per stream: valid until the stream's
// dependencies change (the driver's rule), so they are replaced only when they do.
struct CapturedDeps {
  std::vector<CUgraphNode> nodes;
  std::vector<CUgraphEdgeData> edges;
};
std::mutex& DepsMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::pair<CUstream, bool>, CapturedDeps>& DepsByStream() {
  static auto* map = new std::map<std::pair<CUstream, bool>, CapturedDeps>;
  return *map;
}
bool DefaultEdge(const CUgraphEdgeData& e) {
  static const CUgraphEdgeData kDefault{};
  return std::memcmp(&e, &kDefault, sizeof(e)) == 0;
}
CUresult CaptureInfo(const char* name, CUstream s, bool pt, CUstreamCaptureStatus* status,
                     cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                     const CUgraphEdgeData** edges, size_t* count) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!c.AnyCapture()) {
    // No capture anywhere in this process: PyTorch asks around every
    // allocation and cuBLAS call, so this must cost no round trip.
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (id) *id = 0;
    if (graph) *graph = nullptr;
    if (deps) *deps = nullptr;
    if (edges) *edges = nullptr;
    if (count) *count = 0;
    return CUDA_SUCCESS;
  }
  const int server = StreamServer(s);
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(s));
  std::vector<uint8_t> reply;
  Client::RouteScope route(server);
  CUresult rc =
      c.Call(name, ops::kOpStreamCaptureInfo, w, ReplySink{&reply}, pt ? wire::kFlagPerThread : 0);
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint32_t st = 0;
  uint64_t i = 0, g = 0, n = 0;
  if (!r.Get(&st) || !r.Get(&i) || !r.Get(&g) || !r.Get(&n)) return CUDA_ERROR_UNKNOWN;
  if (n > r.remaining() / 16) return CUDA_ERROR_UNKNOWN;
  CapturedDeps now;
  now.nodes.resize(n);
  now.edges.resize(n);
  bool lossy = false;
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t node = 0;
    if (!r.Get(&node) || !r.Get(&now.edges[k])) return CUDA_ERROR_UNKNOWN;
    now.nodes[k] = reinterpret_cast<CUgraphNode>(Client::Tag(node, server));
    lossy = lossy || !DefaultEdge(now.edges[k]);
  }
  // Asked for the nodes and not their edge data while some edge has data: the driver
  // refuses rather than lose it.
  if (deps != nullptr && edges == nullptr && lossy) return CUDA_ERROR_LOSSY_QUERY;
  *status = static_cast<CUstreamCaptureStatus>(st);
  if (id) *id = Client::Tag(i, server);
  if (graph) *graph = reinterpret_cast<CUgraph>(Client::Tag(g, server));
  if (count) *count = n;
  if (deps == nullptr && edges == nullptr) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> lock(DepsMutex());
  CapturedDeps& kept = DepsByStream()[{s, pt}];
  const bool same = kept.nodes == now.nodes && std::memcmp(kept.edges.data(), now.edges.data(),
                                                           n * sizeof(CUgraphEdgeData)) == 0;
  if (!same) kept = std::move(now);
  if (deps) *deps = n > 0 ? kept.nodes.data() : nullptr;
  if (edges) *edges = n > 0 ? kept.edges.data() : nullptr;
  return CUDA_SUCCESS;
}

// Several servers: every node (and the graph, if any) is `server`'s (true with one).
bool OnServer(int server, uint64_t graph, const CUgraphNode* nodes, size_t n) {
  if (server < 0) return true;
  if (graph != 0 && Client::TagOf(graph) != server) return false;
  for (size_t k = 0; nodes != nullptr && k < n && k <= (1u << 16); ++k) {  // (SendDeps bounds n)
    const uint64_t node = reinterpret_cast<uintptr_t>(nodes[k]);
    if (node != 0 && Client::TagOf(node) != server) return false;
  }
  return true;
}

// Sends kOpCaptureDependencies to `server` (-1: no change): `w` already holds the
// sub-operation and its fields; the node list (with edge data) is appended.
CUresult SendDeps(const char* name, bool pt, int server, wire::Writer& w, const CUgraphNode* nodes,
                  const CUgraphEdgeData* edges, size_t n) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (n > 0 && nodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (n > (1u << 16)) return CUDA_ERROR_INVALID_VALUE;
  if (!OnServer(server, 0, nodes, n))
    return flyt::client::RefuseAcrossServers(name);  // a node of another server's graph
  w.Put<uint8_t>(edges != nullptr ? 1 : 0);
  w.Put<uint32_t>(static_cast<uint32_t>(n));
  for (size_t k = 0; k < n; ++k) {
    w.Put<uint64_t>(Client::WireValue(reinterpret_cast<uintptr_t>(nodes[k])));
    w.Put(edges != nullptr ? edges[k] : CUgraphEdgeData{});
  }
  Client::RouteScope route(server);
  return c.Call(name, ops::kOpCaptureDependencies, w, ReplySink{}, pt ? wire::kFlagPerThread : 0);
}
CUresult UpdateDeps(const char* name, bool pt, CUstream s, CUgraphNode* nodes,
                    const CUgraphEdgeData* edges, size_t n, unsigned flags) {
  wire::Writer w;
  w.Put<uint8_t>(ops::kCaptureDepsUpdate);
  w.Put<uint64_t>(Client::WireHandle(s));
  w.Put<uint32_t>(flags);
  return SendDeps(name, pt, StreamServer(s), w, nodes, edges, n);
}
CUresult CaptureToGraph(const char* name, bool pt, CUstream s, CUgraph g, const CUgraphNode* nodes,
                        const CUgraphEdgeData* edges, size_t n, CUstreamCaptureMode mode) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  const int server = StreamServer(s);
  const uint64_t graph = reinterpret_cast<uintptr_t>(g);
  if (!OnServer(server, graph, nodes, n))            // checked before the capture is counted
    return flyt::client::RefuseAcrossServers(name);  // a graph or node of another server
  if (server >= c.server_count()) return CUDA_ERROR_INVALID_HANDLE;
  // Host functions and host copies captured into the graph run over it (the
  // stream's server's).
  CUresult rc = c.EnsureCallbackChannel();
  if (rc == CUDA_SUCCESS && server > 0) rc = c.Link(server).EnsureCallbackChannel();
  if (rc != CUDA_SUCCESS) return rc;
  c.CaptureBegan();  // as BeginCapture (api_graph.cc): counted before it is sent
  wire::Writer w;
  w.Put<uint8_t>(ops::kCaptureDepsToGraph);
  w.Put<uint64_t>(Client::WireHandle(s));
  w.Put<uint64_t>(Client::WireValue(graph));
  w.Put<uint32_t>(static_cast<uint32_t>(mode));
  return SendDeps(name, pt, server, w, nodes, edges, n);
}
CUresult IsCapturing(const char* name, CUstream s, bool pt, CUstreamCaptureStatus* status) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!c.AnyCapture()) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  return pt ? Forward<120, true, true>(name, s, status)
            : Forward<120, true, false>(name, s, status);
}

CUresult EndCapture(const char* name, CUstream s, bool pt, CUgraph* graph) {
  CUresult rc =
      pt ? Forward<119, true, true>(name, s, graph) : Forward<119, true, false>(name, s, graph);
  // These answers end the capture; any other leaves the count high (safe).
  if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
      rc == CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
    Client::Get().CaptureEnded();
  return rc;
}
}  // namespace

FLYT_API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  return IsCapturing("cuStreamIsCapturing", s, false, status);
}
FLYT_API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* status) {
  return IsCapturing("cuStreamIsCapturing_ptsz", s, true, status);
}
FLYT_API CUresult cuStreamEndCapture(CUstream s, CUgraph* graph) {
  return EndCapture("cuStreamEndCapture", s, false, graph);
}
FLYT_API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* graph) {
  return EndCapture("cuStreamEndCapture_ptsz", s, true, graph);
}

FLYT_API CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus* st, cuuint64_t* id) {
  return CaptureInfo("cuStreamGetCaptureInfo", s, false, st, id, nullptr, nullptr, nullptr,
                     nullptr);
}
FLYT_API CUresult cuStreamGetCaptureInfo_ptsz(CUstream s, CUstreamCaptureStatus* st,
                                              cuuint64_t* id) {
  return CaptureInfo("cuStreamGetCaptureInfo_ptsz", s, true, st, id, nullptr, nullptr, nullptr,
                     nullptr);
}
FLYT_API CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus* st, cuuint64_t* id,
                                            CUgraph* g, const CUgraphNode** deps, size_t* n) {
  return CaptureInfo("cuStreamGetCaptureInfo_v2", s, false, st, id, g, deps, nullptr, n);
}
FLYT_API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream s, CUstreamCaptureStatus* st,
                                                 cuuint64_t* id, CUgraph* g,
                                                 const CUgraphNode** deps, size_t* n) {
  return CaptureInfo("cuStreamGetCaptureInfo_v2_ptsz", s, true, st, id, g, deps, nullptr, n);
}
FLYT_API CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus* st, cuuint64_t* id,
                                            CUgraph* g, const CUgraphNode** deps,
                                            const CUgraphEdgeData** edges, size_t* n) {
  return CaptureInfo("cuStreamGetCaptureInfo_v3", s, false, st, id, g, deps, edges, n);
}
FLYT_API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream s, CUstreamCaptureStatus* st,
                                                 cuuint64_t* id, CUgraph* g,
                                                 const CUgraphNode** deps,
                                                 const CUgraphEdgeData** edges, size_t* n) {
  return CaptureInfo("cuStreamGetCaptureInfo_v3_ptsz", s, true, st, id, g, deps, edges, n);
}

FLYT_API CUresult cuStreamUpdateCaptureDependencies(CUstream s, CUgraphNode* deps, size_t n,
                                                    unsigned int flags) {
  return UpdateDeps("cuStreamUpdateCaptureDependencies", false, s, deps, nullptr, n, flags);
}
FLYT_API CUresult cuStreamUpdateCaptureDependencies_ptsz(CUstream s, CUgraphNode* deps, size_t n,
                                                         unsigned int flags) {
  return UpdateDeps("cuStreamUpdateCaptureDependencies_ptsz", true, s, deps, nullptr, n, flags);
}
FLYT_API CUresult cuStreamUpdateCaptureDependencies_v2(CUstream s, CUgraphNode* deps,
                                                       const CUgraphEdgeData* edges, size_t n,
                                                       unsigned int flags) {
  return UpdateDeps("cuStreamUpdateCaptureDependencies_v2", false, s, deps, edges, n, flags);
}
FLYT_API CUresult cuStreamUpdateCaptureDependencies_v2_ptsz(CUstream s, CUgraphNode* deps,
                                                            const CUgraphEdgeData* edges, size_t n,
                                                            unsigned int flags) {
  return UpdateDeps("cuStreamUpdateCaptureDependencies_v2_ptsz", true, s, deps, edges, n, flags);
}
FLYT_API CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode* deps,
                                              const CUgraphEdgeData* edges, size_t n,
                                              CUstreamCaptureMode mode) {
  return CaptureToGraph("cuStreamBeginCaptureToGraph", false, s, g, deps, edges, n, mode);
}
FLYT_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode* deps,
                                                   const CUgraphEdgeData* edges, size_t n,
                                                   CUstreamCaptureMode mode) {
  return CaptureToGraph("cuStreamBeginCaptureToGraph_ptsz", true, s, g, deps, edges, n, mode);
}
