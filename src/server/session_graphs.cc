// Session handlers for CUDA graphs: host functions and host copies captured
// into graphs, node lists, and graphs built node by node.
//
// A graph that copies to or from host memory must reach the *client's* memory
// every time it runs. Flyt captures such a copy against a pinned mirror buffer
// on the server plus a host node that moves the bytes over the session's
// callback channel: fetch-then-copy for uploads, copy-then-deliver for
// downloads. These helper nodes are left out of node lists, so the app sees the
// graph it built. Must not touch other sessions' graphs.
//
// Handles: the client's values arrive and leave; the driver's objects behind
// them differ in a restored session (RealHandle / ClientHandle, and ExecNode
// for a node named to an executable graph, session_graph_move.cc).
#include <cstring>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

namespace {

void RunCapturedHostFunc(void* p) {
  auto* w = static_cast<Session::CapturedWork*>(p);
  w->session->RunClientHostFunc(w->id, true);
}
void DeliverCaptured(void* p) {
  auto* w = static_cast<Session::CapturedWork*>(p);
  w->session->DeliverToClient(w->client_addr, w->mirror, w->len);
}
void FetchCaptured(void* p) {
  auto* w = static_cast<Session::CapturedWork*>(p);
  w->session->FetchFromClient(w->client_addr, w->mirror, w->len);
}

constexpr uint32_t kMaxNodeList = 1u << 16;

}  // namespace

CUhostFn Session::FetchHelper() { return FetchCaptured; }
bool Session::IsFlytHelperNode(CUgraphNode node) {
  DriverApi& a = state_->api;
  CUgraphNodeType type{};
  CUDA_HOST_NODE_PARAMS host{};
  return a.cuGraphNodeGetType(node, &type) == CUDA_SUCCESS && type == CU_GRAPH_NODE_TYPE_HOST &&
         a.cuGraphHostNodeGetParams(node, &host) == CUDA_SUCCESS &&
         (host.fn == DeliverCaptured || host.fn == FetchCaptured);
}
CUhostFn Session::DeliverHelper() { return DeliverCaptured; }
CUhostFn Session::RunCapturedHostFuncFn() { return RunCapturedHostFunc; }

bool Session::Capturing(CUstream stream) {
  DriverApi& a = state_->api;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return a.cuStreamIsCapturing != nullptr &&
         a.cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS &&
         status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

// The dependency set a capturing stream reports: Flyt's helper nodes (a host copy's
// delivery) are shown as the nodes before them, as the topology calls show them.
bool Session::CaptureInfo(Reader& in, bool per_thread, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t stream = 0;
  if (!in.Get(&stream) || in.remaining() != 0) return false;
  auto info = per_thread && a.cuStreamGetCaptureInfo_v3_pt ? a.cuStreamGetCaptureInfo_v3_pt
                                                           : a.cuStreamGetCaptureInfo_v3;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  const CUgraphNode* deps = nullptr;
  const CUgraphEdgeData* edges = nullptr;
  size_t count = 0;
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
  } else if (info == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
  } else {
    *rc = info(RealStream(stream), &status, &id, &graph, &deps, &edges, &count);
  }
  std::vector<std::pair<CUgraphNode, CUgraphEdgeData>> shown;
  for (size_t i = 0; *rc == CUDA_SUCCESS && deps != nullptr && i < count; ++i) {
    const CUgraphEdgeData data = edges != nullptr ? edges[i] : CUgraphEdgeData{};
    if (!IsFlytHelperNode(deps[i])) {
      shown.emplace_back(deps[i], data);
      continue;
    }
    std::vector<std::pair<CUgraphNode, CUgraphEdgeData>> before;
    if (VisibleNeighbours(deps[i], false, &before) != CUDA_SUCCESS) continue;
    for (const auto& b : before) shown.emplace_back(b.first, CUgraphEdgeData{});
  }
  const uint64_t client_graph =
      graph != nullptr ? ClientHandle(HandleKind::kGraph, reinterpret_cast<uintptr_t>(graph)) : 0;
  // The app may add nodes to the capture's graph by hand: it may name it from now on.
  if (client_graph != 0 && !Owns(HandleKind::kGraph, client_graph)) {
    Adopt(HandleKind::kGraph, client_graph);
    capture_graphs_[client_graph] = stream;
  }
  out.Put<uint32_t>(status);
  out.Put<uint64_t>(id);
  out.Put<uint64_t>(client_graph);
  out.Put<uint64_t>(shown.size());
  for (const auto& [node, data] : shown) {
    const uint64_t client = ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(node));
    Adopt(HandleKind::kGraphNode, client);
    out.Put<uint64_t>(client);
    out.Put(data);
  }
  return true;
}

// cuStreamUpdateCaptureDependencies and cuStreamBeginCaptureToGraph. A node the app
// names that comes right before one of Flyt's helper nodes in the current set stands
// for that helper, so that what the app adds next still runs after the delivery.
bool Session::CaptureDependencies(Reader& in, bool per_thread, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t which = 0, with_edges = 0;
  uint64_t stream = 0, graph = 0;
  uint32_t flags = 0, mode = 0, n = 0;
  if (!in.Get(&which) || !in.Get(&stream)) return false;
  if (which == ops::kCaptureDepsUpdate) {
    if (!in.Get(&flags)) return false;
  } else if (which == ops::kCaptureDepsToGraph) {
    if (!in.Get(&graph) || !in.Get(&mode)) return false;
  } else {
    return false;
  }
  if (!in.Get(&with_edges) || !in.Get(&n) || n > kMaxNodeList) return false;
  std::vector<CUgraphNode> nodes(n);
  std::vector<CUgraphEdgeData> edges(n);
  bool owned = true;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t node = 0;
    if (!in.Get(&node) || !in.Get(&edges[i])) return false;
    owned = owned && Owns(HandleKind::kGraphNode, node);
    nodes[i] = reinterpret_cast<CUgraphNode>(RealHandle(HandleKind::kGraphNode, node));
  }
  if (in.remaining() != 0) return false;
  if ((stream > 2 && !Owns(HandleKind::kStream, stream)) ||
      (which == ops::kCaptureDepsToGraph && !Owns(HandleKind::kGraph, graph))) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  if (!owned) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  const CUstream s = RealStream(stream == 0 && per_thread ? 2 : stream);
  const CUgraphEdgeData* data = with_edges ? edges.data() : nullptr;
  if (which == ops::kCaptureDepsToGraph) {
    auto to_graph = per_thread && a.cuStreamBeginCaptureToGraph_pt
                        ? a.cuStreamBeginCaptureToGraph_pt
                        : a.cuStreamBeginCaptureToGraph;
    if (to_graph == nullptr) {
      *rc = CUDA_ERROR_NOT_SUPPORTED;
      return true;
    }
    *rc = to_graph(s, reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph)),
                   n > 0 ? nodes.data() : nullptr, n > 0 ? data : nullptr, n,
                   static_cast<CUstreamCaptureMode>(mode));
    if (*rc == CUDA_SUCCESS) NoteCaptures(1);  // as cuStreamBeginCapture (session.cc)
    return true;
  }
  auto update = per_thread && a.cuStreamUpdateCaptureDependencies_v2_pt
                    ? a.cuStreamUpdateCaptureDependencies_v2_pt
                    : a.cuStreamUpdateCaptureDependencies_v2;
  auto info = per_thread && a.cuStreamGetCaptureInfo_v3_pt ? a.cuStreamGetCaptureInfo_v3_pt
                                                           : a.cuStreamGetCaptureInfo_v3;
  if (update == nullptr || info == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUgraphNode* current = nullptr;
  size_t count = 0;
  if (info(s, &status, nullptr, nullptr, &current, nullptr, &count) == CUDA_SUCCESS &&
      current != nullptr) {
    for (size_t i = 0; i < count; ++i) {
      if (!IsFlytHelperNode(current[i])) continue;
      std::vector<std::pair<CUgraphNode, CUgraphEdgeData>> before;
      if (VisibleNeighbours(current[i], false, &before) != CUDA_SUCCESS) continue;
      static const CUgraphEdgeData kDefault{};
      for (uint32_t k = 0; k < n; ++k)  // ports on the edge: the node itself
        for (const auto& b : before)
          if (nodes[k] == b.first && std::memcmp(&edges[k], &kDefault, sizeof(kDefault)) == 0)
            nodes[k] = current[i];
    }
  }
  *rc = update(s, n > 0 ? nodes.data() : nullptr, n > 0 ? data : nullptr, n, flags);
  return true;
}

void Session::SettleCaptureGraph(uint64_t stream, CUresult rc) {
  for (auto it = capture_graphs_.begin(); it != capture_graphs_.end();) {
    if (it->second != stream) {
      ++it;
      continue;
    }
    // Ended: handed to the app (already held), or invalidated and freed by the driver.
    if (rc != CUDA_SUCCESS && !Capturing(RealStream(stream))) Forget(HandleKind::kGraph, it->first);
    if (rc == CUDA_SUCCESS || !Capturing(RealStream(stream)))
      it = capture_graphs_.erase(it);
    else
      ++it;
  }
}

CUresult Session::HostFunc(CUstream stream, uint64_t id, bool per_thread, bool* captured) {
  DriverApi& a = state_->api;
  auto launch = per_thread && a.cuLaunchHostFunc_pt ? a.cuLaunchHostFunc_pt : a.cuLaunchHostFunc;
  if (launch == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUstream query = stream == nullptr && per_thread ? CU_STREAM_PER_THREAD : stream;
  *captured = Capturing(query);
  if (*captured) {
    // A graph node: runs at every launch of the graph, for the session's life.
    auto w = std::make_unique<CapturedWork>(CapturedWork{CapturedWork::Kind::kHostFunc, this, id});
    CUresult rc = launch(stream, RunCapturedHostFunc, w.get());
    if (rc == CUDA_SUCCESS) captured_.push_back(std::move(w));
    return rc;
  }
  struct Pending {
    Session* session;
    uint64_t id;
  };
  auto* call = new Pending{this, id};
  host_funcs_in_flight_++;
  CUresult rc = launch(
      stream,
      [](void* p) {
        auto* c = static_cast<Pending*>(p);
        c->session->RunClientHostFunc(c->id, false);
        c->session->host_funcs_in_flight_--;
        delete c;
      },
      call);
  if (rc != CUDA_SUCCESS) {
    host_funcs_in_flight_--;
    delete call;
  }
  return rc;
}

void* Session::NewMirror(size_t n) {
  DriverApi& a = state_->api;
  void* p = nullptr;
  // Allocating is not allowed while this thread captures, unless relaxed.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged = a.cuThreadExchangeStreamCaptureMode != nullptr &&
                   a.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  CUresult rc = a.cuMemHostAlloc(&p, n > 0 ? n : 1, 0);
  if (exchanged) a.cuThreadExchangeStreamCaptureMode(&mode);
  if (rc != CUDA_SUCCESS) return nullptr;
  auto owner = std::make_unique<CapturedWork>(CapturedWork{CapturedWork::Kind::kFetch, this});
  owner->mirror = p;
  owner->len = n;  // the mirror's size (a snapshot allocates it again)
  owner->owns_mirror = true;
  captured_.push_back(std::move(owner));
  return p;
}

CUresult Session::CaptureDownload(CUstream stream, uint64_t src, uint64_t client_dst, size_t n) {
  DriverApi& a = state_->api;
  void* mirror = NewMirror(n);
  if (mirror == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = a.cuMemcpyDtoHAsync_v2(mirror, src, n, stream);
  if (rc != CUDA_SUCCESS) return rc;
  auto w = std::make_unique<CapturedWork>(CapturedWork{CapturedWork::Kind::kDeliver, this});
  w->client_addr = client_dst;
  w->mirror = mirror;
  w->len = n;
  rc = a.cuLaunchHostFunc(stream, DeliverCaptured, w.get());
  if (rc == CUDA_SUCCESS) captured_.push_back(std::move(w));
  return rc;
}

CUresult Session::CaptureUpload(CUstream stream, uint64_t dst, uint64_t client_src, void* mirror,
                                size_t n) {
  DriverApi& a = state_->api;
  auto w = std::make_unique<CapturedWork>(CapturedWork{CapturedWork::Kind::kFetch, this});
  w->client_addr = client_src;
  w->mirror = mirror;
  w->len = n;
  CUresult rc = a.cuLaunchHostFunc(stream, FetchCaptured, w.get());
  if (rc != CUDA_SUCCESS) return rc;
  captured_.push_back(std::move(w));
  return a.cuMemcpyHtoDAsync_v2(dst, mirror, n, stream);
}

bool Session::ReadNodeList(Reader& in, std::vector<CUgraphNode>* deps, CUresult* rc) {
  uint32_t n = 0;
  if (!in.Get(&n) || n > kMaxNodeList) return false;
  deps->resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t raw = 0;
    if (!in.Get(&raw)) return false;
    if (!Owns(HandleKind::kGraphNode, raw)) *rc = CUDA_ERROR_INVALID_HANDLE;
    (*deps)[i] = reinterpret_cast<CUgraphNode>(RealHandle(HandleKind::kGraphNode, raw));
  }
  return true;
}

// Request: u64 graph. Reply: u64 n, n x u64 node.
bool Session::GraphGetNodes(Reader& in, Writer& out, CUresult* rc) {
  uint64_t graph = 0;
  if (!in.Get(&graph) || in.remaining() != 0) return false;
  if (!Owns(HandleKind::kGraph, graph)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  std::vector<CUgraphNode> visible;
  *rc = VisibleNodes(reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph)), &visible);
  if (*rc != CUDA_SUCCESS) return true;
  out.Put<uint64_t>(visible.size());
  for (CUgraphNode v : visible)
    out.Put<uint64_t>(ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(v)));
  return true;
}

CUresult Session::VisibleNodes(CUgraph g, std::vector<CUgraphNode>* out) {
  DriverApi& a = state_->api;
  size_t n = 0;
  CUresult rc = a.cuGraphGetNodes(g, nullptr, &n);
  std::vector<CUgraphNode> nodes(n);
  if (rc == CUDA_SUCCESS && n > 0) rc = a.cuGraphGetNodes(g, nodes.data(), &n);
  if (rc != CUDA_SUCCESS) return rc;
  for (size_t i = 0; i < n && i < nodes.size(); ++i) {
    if (IsFlytHelperNode(nodes[i])) continue;
    Adopt(HandleKind::kGraphNode,
          ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(nodes[i])));
    out->push_back(nodes[i]);
  }
  return CUDA_SUCCESS;
}

// Request: u8 which (0 add, 1 set node, 2 set node of exec), u64 target (graph,
// node or exec), u64 node (which 2), [node list (which 0)], u64 fn,
// u8 is_kernel, u32 grid[3], u32 block[3], u32 shmem, blob params.
// Reply (which 0): u64 node.
bool Session::GraphKernelNode(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t which = 0, is_kernel = 0;
  uint64_t target = 0, node = 0, fn = 0;
  uint32_t grid[3], block[3], shmem = 0;
  std::vector<CUgraphNode> deps;
  *rc = CUDA_SUCCESS;
  if (!in.Get(&which) || which > 2 || !in.Get(&target) || !in.Get(&node)) return false;
  if (which == 0 && !ReadNodeList(in, &deps, rc)) return false;
  const uint8_t* blob = nullptr;
  uint32_t blob_len = 0;
  if (!in.Get(&fn) || !in.Get(&is_kernel) || !in.GetBytes(grid, sizeof(grid)) ||
      !in.GetBytes(block, sizeof(block)) || !in.Get(&shmem) ||
      !in.GetBlob(&blob, &blob_len, ops::kMaxParamBytes) || in.remaining() != 0)
    return false;
  HandleKind target_kind = which == 0   ? HandleKind::kGraph
                           : which == 1 ? HandleKind::kGraphNode
                                        : HandleKind::kGraphExec;
  if (!Owns(target_kind, target) || (which == 2 && !Owns(HandleKind::kGraphNode, node)) ||
      !Owns(is_kernel ? HandleKind::kKernel : HandleKind::kFunction, fn))
    *rc = CUDA_ERROR_INVALID_HANDLE;
  if (*rc != CUDA_SUCCESS) return true;
  fn = RealHandle(is_kernel ? HandleKind::kKernel : HandleKind::kFunction, fn);
  const uint64_t client_target = target, client_node = node;
  if (which == 0) target = RealHandle(HandleKind::kGraph, target);
  if (which == 1) target = RealHandle(HandleKind::kGraphNode, target);
  if (which == 2) {
    node = reinterpret_cast<uintptr_t>(ExecNode(target, node));
    target = RealHandle(HandleKind::kGraphExec, target);
  }
  // Parameter pointers into the blob, laid out as the driver reports.
  std::vector<uint8_t> params(blob, blob + blob_len);
  std::vector<void*> pointers;
  std::vector<ops::ParamSlot> slots;
  DriverParamLayout(fn, is_kernel, &slots);  // those found before any failure, as the driver has
  for (const ops::ParamSlot& slot : slots) {
    if (slot.offset + slot.size > params.size()) {
      *rc = CUDA_ERROR_INVALID_VALUE;
      return true;
    }
    pointers.push_back(params.data() + slot.offset);
  }
  CUDA_KERNEL_NODE_PARAMS p{};
  if (is_kernel) {
    p.kern = reinterpret_cast<CUkernel>(fn);
  } else {
    p.func = reinterpret_cast<CUfunction>(fn);
  }
  p.gridDimX = grid[0];
  p.gridDimY = grid[1];
  p.gridDimZ = grid[2];
  p.blockDimX = block[0];
  p.blockDimY = block[1];
  p.blockDimZ = block[2];
  p.sharedMemBytes = shmem;
  p.kernelParams = pointers.empty() ? nullptr : pointers.data();
  if (which == 0) {
    CUgraphNode created = nullptr;
    *rc = a.cuGraphAddKernelNode_v2(&created, reinterpret_cast<CUgraph>(target), deps.data(),
                                    deps.size(), &p);
    uint64_t client = 0;
    if (*rc == CUDA_SUCCESS) {
      client = ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(created));
      Adopt(HandleKind::kGraphNode, client);
    }
    out.Put<uint64_t>(client);
  } else if (which == 1) {
    *rc = a.cuGraphKernelNodeSetParams_v2(reinterpret_cast<CUgraphNode>(target), &p);
  } else {
    *rc = a.cuGraphExecKernelNodeSetParams_v2(reinterpret_cast<CUgraphExec>(target),
                                              reinterpret_cast<CUgraphNode>(node), &p);
    // The executable graph's template follows (session_graph_move.cc).
    if (*rc == CUDA_SUCCESS)
      MirrorExecChange(client_target, client_node, "kernel parameters",
                       [&](CUgraphNode t) { return a.cuGraphKernelNodeSetParams_v2(t, &p); });
  }
  return true;
}

bool Session::GraphMemsetNode(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t graph = 0, ctx = 0;
  std::vector<CUgraphNode> deps;
  CUDA_MEMSET_NODE_PARAMS p{};
  *rc = CUDA_SUCCESS;
  if (!in.Get(&graph) || !ReadNodeList(in, &deps, rc) || !in.Get(&p) || !in.Get(&ctx) ||
      in.remaining() != 0)
    return false;
  if (!Owns(HandleKind::kGraph, graph) || (ctx != 0 && !Owns(HandleKind::kContext, ctx)))
    *rc = CUDA_ERROR_INVALID_HANDLE;
  if (*rc != CUDA_SUCCESS) return true;
  CUgraphNode created = nullptr;
  *rc = a.cuGraphAddMemsetNode(&created,
                               reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph)),
                               deps.data(), deps.size(), &p, RealContext(ctx));
  uint64_t client = 0;
  if (*rc == CUDA_SUCCESS) {
    client = ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(created));
    Adopt(HandleKind::kGraphNode, client);
  }
  out.Put<uint64_t>(client);
  return true;
}

// Request: u64 graph, node list, u64 callback id. Reply: u64 node.
bool Session::GraphHostNode(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t graph = 0, id = 0;
  std::vector<CUgraphNode> deps;
  *rc = CUDA_SUCCESS;
  if (!in.Get(&graph) || !ReadNodeList(in, &deps, rc) || !in.Get(&id) || in.remaining() != 0)
    return false;
  if (!Owns(HandleKind::kGraph, graph)) *rc = CUDA_ERROR_INVALID_HANDLE;
  if (*rc != CUDA_SUCCESS) return true;
  if (a.cuGraphAddHostNode == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  auto w = std::make_unique<CapturedWork>(CapturedWork{CapturedWork::Kind::kHostFunc, this, id});
  CUDA_HOST_NODE_PARAMS p{};
  p.fn = RunCapturedHostFunc;
  p.userData = w.get();
  CUgraphNode created = nullptr;
  *rc = a.cuGraphAddHostNode(&created,
                             reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph)),
                             deps.data(), deps.size(), &p);
  uint64_t client = 0;
  if (*rc == CUDA_SUCCESS) {
    captured_.push_back(std::move(w));
    client = ClientHandle(HandleKind::kGraphNode, reinterpret_cast<uintptr_t>(created));
    Adopt(HandleKind::kGraphNode, client);
  }
  out.Put<uint64_t>(client);
  return true;
}

// cudaDeviceSynchronize of one client: its streams, its per-thread stream and
// the legacy stream; another session's capture or long kernels are not its.
CUresult Session::SynchronizeSession() {
  DriverApi& a = state_->api;
  CUresult first = CUDA_SUCCESS;
  auto keep = [&](CUresult rc) {
    if (first == CUDA_SUCCESS) first = rc;
  };
  for (uint64_t s : handles_[static_cast<int>(HandleKind::kStream)])
    keep(a.cuStreamSynchronize(RealStream(s)));
  keep(a.cuStreamSynchronize(RealStream(2)));  // per-thread default (or its stand-in)
  keep(a.cuStreamSynchronize(nullptr));
  return first;
}

void Session::ReleaseCaptured() {
  for (auto& w : captured_)
    if (w->owns_mirror) state_->api.cuMemFreeHost(w->mirror);
  captured_.clear();
}

}  // namespace flyt::server
