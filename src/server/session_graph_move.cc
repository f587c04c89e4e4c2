// CUDA graphs of a moved session: the app's graphs (captured or built by
// hand) and its executable graphs, rebuilt node by node on the target under
// the client's graph, node and executable graph handle values
// (docs/architecture.md §7.4).
//
// Owns: the template each executable graph keeps (a copy of its graph made
// at instantiation, which takes every later change made through the
// executable graph: node parameters, enabled nodes, updates), the
// translation of the client's node handles for a restored executable graph
// (it was instantiated here from its template, whose nodes it knows), the
// graph sections of a snapshot (captured host work, graphs, executable graphs)
// and what refuses a move of graphs. Must not touch: how nodes are made for
// the app (session_graphs.cc, session_graph_nodes.cc), the snapshot's framing
// (session_snapshot.h), other sessions.
//
// What a graph may hold to move: kernel nodes (of code loaded through this
// session; the function by its client handle, the arguments as bytes, the
// launch attributes a node takes), memcpy nodes (device memory at the same
// addresses; the client's memory through Flyt's pinned mirrors, made again),
// memset, host nodes (the client's callbacks by id, Flyt's copy helpers),
// child graphs, empty nodes, event record and wait nodes. Refused, saying
// why: memory allocation and free nodes (the driver places their memory;
// another server cannot place it at the same address), conditional nodes
// (the driver picks their handle values, which kernels hold in their
// arguments), batch memory operation and external semaphore nodes.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/log.h"
#include "server/session.h"
#include "server/session_snapshot.h"

namespace flyt::server {

using marshal::HandleKind;

namespace {

constexpr int kMaxDepth = 16;  // child graphs inside child graphs
// Kernel node attributes a restore carries (none of them names an object).
constexpr CUkernelNodeAttrID kCarriedNodeAttrs[] = {
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
    CU_LAUNCH_ATTRIBUTE_PRIORITY,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
    CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
};

uint64_t Raw(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The nodes of a template's child graphs have no client handles.
const std::unordered_map<CUgraphNode, uint64_t> kNoNames;

std::string Err(const std::string& what, CUresult rc) {
  return what + ": CUDA error " + std::to_string(rc);
}

// Why a node of this type cannot be rebuilt on another server (empty: it can).
std::string UnmovableKind(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
    case CU_GRAPH_NODE_TYPE_MEMCPY:
    case CU_GRAPH_NODE_TYPE_MEMSET:
    case CU_GRAPH_NODE_TYPE_HOST:
    case CU_GRAPH_NODE_TYPE_GRAPH:
    case CU_GRAPH_NODE_TYPE_EMPTY:
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return "";
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      return "a memory allocation or free node (the driver places that memory; another server "
             "cannot place it at the same address)";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      return "a conditional node (the driver picks its handle value, which kernels hold in "
             "their arguments)";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
      return "a batch memory operation node (not movable yet)";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
      return "an external semaphore node (the semaphore belongs to this machine)";
    default:
      return "a node of type " + std::to_string(static_cast<int>(t)) + " that Flyt cannot rebuild";
  }
}

// Why `g` holds a node that cannot move (empty: none), child graphs included.
std::string UnmovableKinds(DriverApi& a, CUgraph g, int depth) {
  if (depth > kMaxDepth) return "child graphs nested more than 16 deep";
  size_t n = 0;
  CUresult rc = a.cuGraphGetNodes(g, nullptr, &n);
  std::vector<CUgraphNode> nodes(n);
  if (rc == CUDA_SUCCESS && n > 0) rc = a.cuGraphGetNodes(g, nodes.data(), &n);
  if (rc != CUDA_SUCCESS) return Err("listing its nodes", rc);
  for (size_t i = 0; i < n && i < nodes.size(); ++i) {
    CUgraphNodeType t{};
    rc = a.cuGraphNodeGetType(nodes[i], &t);
    if (rc != CUDA_SUCCESS) return Err("a node's type", rc);
    if (std::string why = UnmovableKind(t); !why.empty()) return why;
    if (t != CU_GRAPH_NODE_TYPE_GRAPH) continue;
    CUgraph child = nullptr;
    rc = a.cuGraphChildGraphNodeGetGraph(nodes[i], &child);
    if (rc != CUDA_SUCCESS) return Err("a child graph", rc);
    if (std::string why = UnmovableKinds(a, child, depth + 1); !why.empty()) return why;
  }
  return "";
}

}  // namespace

// --- executable graphs and their templates ----------------------------------------

void Session::MakeTemplate(ExecRecord* rec, CUgraph graph) {
  DriverApi& a = state_->api;
  rec->tmpl = nullptr;
  rec->tmpl_nodes.clear();
  rec->why = UnmovableKinds(a, graph, 0);
  if (!rec->why.empty()) {
    rec->why = "its graph holds " + rec->why;
    return;
  }
  CUgraph copy = nullptr;
  CUresult rc = a.cuGraphClone(&copy, graph);
  if (rc != CUDA_SUCCESS) {
    rec->why = Err("copying its graph failed", rc);
    return;
  }
  size_t n = 0;
  rc = a.cuGraphGetNodes(graph, nullptr, &n);
  std::vector<CUgraphNode> nodes(n);
  if (rc == CUDA_SUCCESS && n > 0) rc = a.cuGraphGetNodes(graph, nodes.data(), &n);
  for (size_t i = 0; rc == CUDA_SUCCESS && i < n && i < nodes.size(); ++i) {
    CUgraphNode in_copy = nullptr;
    rc = a.cuGraphNodeFindInClone(&in_copy, nodes[i], copy);
    if (rc == CUDA_SUCCESS)
      rec->tmpl_nodes[ClientHandle(HandleKind::kGraphNode, Raw(nodes[i]))] = in_copy;
  }
  if (rc != CUDA_SUCCESS) {
    rec->tmpl_nodes.clear();
    rec->why = Err("finding its nodes in a copy of its graph failed", rc);
    CUresult d = a.cuGraphDestroy(copy);
    if (d != CUDA_SUCCESS) FLYT_WARN("cuGraphDestroy of a graph template failed with error %d", d);
    return;
  }
  rec->tmpl = copy;
}

void Session::DropTemplate(ExecRecord* rec) {
  DriverApi& a = state_->api;
  for (CUgraph g : {rec->tmpl, rec->source == rec->tmpl ? nullptr : rec->source}) {
    if (g == nullptr) continue;
    CUresult rc = a.cuGraphDestroy(g);
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("cuGraphDestroy of a graph template failed with error %d", rc);
  }
  rec->tmpl = rec->source = nullptr;
  rec->tmpl_nodes.clear();
  rec->source_nodes.clear();
}

void Session::NoteInstantiated(uint64_t exec, uint64_t graph, unsigned long long flags) {
  auto old = execs_.find(exec);  // a value the driver gave out again
  if (old != execs_.end()) DropTemplate(&old->second);
  ExecRecord& rec = execs_[exec];
  rec = ExecRecord{};
  rec.flags = flags;
  MakeTemplate(&rec, reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph)));
}

void Session::NoteExecUpdated(uint64_t exec, uint64_t graph) {
  auto it = execs_.find(exec);
  if (it == execs_.end()) return;
  ExecRecord& rec = it->second;
  // The graph it was instantiated from here (a restored one) stays: its
  // nodes are the ones exec-level calls name.
  if (rec.tmpl != nullptr && rec.tmpl != rec.source) {
    CUresult rc = state_->api.cuGraphDestroy(rec.tmpl);
    if (rc != CUDA_SUCCESS)
      FLYT_WARN("cuGraphDestroy of a graph template failed with error %d", rc);
  }
  rec.tmpl = nullptr;
  MakeTemplate(&rec, reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, graph)));
}

CUgraphNode Session::ExecNode(uint64_t exec, uint64_t node) const {
  if (!execs_.empty()) {
    auto it = execs_.find(exec);
    if (it != execs_.end() && it->second.source != nullptr) {
      auto n = it->second.source_nodes.find(node);
      if (n != it->second.source_nodes.end()) return n->second;
    }
  }
  return reinterpret_cast<CUgraphNode>(RealHandle(HandleKind::kGraphNode, node));
}

void Session::MirrorExecChange(uint64_t exec, uint64_t node, const char* what,
                               const std::function<CUresult(CUgraphNode)>& apply) {
  auto it = execs_.find(exec);
  if (it == execs_.end() || it->second.tmpl == nullptr) return;
  ExecRecord& rec = it->second;
  auto t = rec.tmpl_nodes.find(node);
  CUresult rc = t == rec.tmpl_nodes.end() ? CUDA_ERROR_INVALID_VALUE : apply(t->second);
  if (rc == CUDA_SUCCESS) return;
  if (rec.tmpl != rec.source) {
    CUresult d = state_->api.cuGraphDestroy(rec.tmpl);
    if (d != CUDA_SUCCESS) FLYT_WARN("cuGraphDestroy of a graph template failed with error %d", d);
  }
  rec.tmpl = nullptr;
  rec.tmpl_nodes.clear();
  rec.why = std::string("its ") + what + " changed in a way Flyt cannot copy (error " +
            std::to_string(rc) + ")";
}

void Session::NoteNodeEnabled(uint64_t exec, uint64_t node, bool enabled) {
  auto it = execs_.find(exec);
  if (it == execs_.end()) return;
  if (enabled) {
    it->second.disabled.erase(node);
  } else {
    it->second.disabled.insert(node);
  }
}

void Session::ExecForgotten(uint64_t exec) {
  auto it = execs_.find(exec);
  if (it == execs_.end()) return;
  DropTemplate(&it->second);
  execs_.erase(it);
}

void Session::ReleaseExecRecords() {
  for (auto& [exec, rec] : execs_) DropTemplate(&rec);
  execs_.clear();
}

// Request: u64 exec, u64 node, u64 event (the generic encoding of ops 280/281).
bool Session::ExecEventNodeSetEvent(bool record, wire::Reader& in, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t exec = 0, node = 0, event = 0;
  if (!in.Get(&exec) || !in.Get(&node) || !in.Get(&event) || in.remaining() != 0) return false;
  auto fn = record ? a.cuGraphExecEventRecordNodeSetEvent : a.cuGraphExecEventWaitNodeSetEvent;
  if (fn == nullptr) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  if (!Owns(HandleKind::kGraphExec, exec) || !Owns(HandleKind::kGraphNode, node) ||
      !Owns(HandleKind::kEvent, event)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  CUevent ev = reinterpret_cast<CUevent>(RealHandle(HandleKind::kEvent, event));
  *rc = fn(reinterpret_cast<CUgraphExec>(RealHandle(HandleKind::kGraphExec, exec)),
           ExecNode(exec, node), ev);
  if (*rc == CUDA_SUCCESS)
    MirrorExecChange(exec, node, "event", [&](CUgraphNode t) {
      return record ? a.cuGraphEventRecordNodeSetEvent(t, ev)
                    : a.cuGraphEventWaitNodeSetEvent(t, ev);
    });
  return true;
}

// --- code a kernel node runs --------------------------------------------------------

uint64_t Session::ClientFunctionOf(uint64_t real) {
  // A kernel the driver takes for a function (cudart launches CUkernels so).
  auto& kernels = rev_[static_cast<int>(HandleKind::kKernel)];
  auto k = kernels.find(real);
  if (k != kernels.end()) return k->second;
  const uint64_t client = ClientHandle(HandleKind::kFunction, real);
  if (code_names_.count(client) != 0) return client;
  // A kernel's function in this context: known as made from that kernel.
  const char* name = nullptr;
  DriverApi& a = state_->api;
  if (a.cuFuncGetName(&name, reinterpret_cast<CUfunction>(real)) != CUDA_SUCCESS || name == nullptr)
    return client;
  for (const auto& [h, c] : code_names_) {
    if (!c.kernel || c.name != name) continue;
    CUfunction f = nullptr;
    if (a.cuKernelGetFunction(&f, reinterpret_cast<CUkernel>(RealHandle(HandleKind::kKernel, h))) ==
            CUDA_SUCCESS &&
        Raw(f) == real) {
      code_names_[client] = CodeName{c.image, c.name, false, h};
      return client;
    }
  }
  return client;
}

// --- writing graphs ------------------------------------------------------------------
//
// captured: count, {u8 kind, u64 id, u64 client_addr, u64 len, u8 owns_mirror,
//                   i64 mirror (the owning entry's index; -1 none)}
// graphs:   count, {graph}
// execs:    count, {u64 handle, u64 flags, graph (the template), count, {u64 disabled node}}
// graph:    u64 handle, u8 owned, count, {node} in an order where dependencies come first
// node:     u64 handle, u8 owned, u32 type, count, {u32 dependency index, CUgraphEdgeData},
//           then by type: KERNEL u64 code, u8 is_kernel, u32 dims[6], u32 shared bytes,
//           u64 n, n bytes of arguments, count, {i32 attribute, CUkernelNodeAttrValue};
//           MEMCPY CUDA_MEMCPY3D, i64 src mirror, u64 src offset, i64 dst mirror,
//           u64 dst offset; MEMSET CUDA_MEMSET_NODE_PARAMS; HOST u64 captured index;
//           GRAPH graph; EVENT_RECORD / WAIT_EVENT u64 event; EMPTY nothing.

struct Session::GraphWriter {
  SnapshotWriter* out = nullptr;                                   // null: only the checks
  std::unordered_map<const void*, uint64_t> work;                  // CapturedWork -> index
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> mirrors;       // base -> owner, bytes
  std::unordered_map<uint64_t, std::pair<uint64_t, bool>> code;    // real -> client, kernel
  std::unordered_map<std::string, std::vector<uint64_t>> kernels;  // name -> client kernels
  // Writing a template: its nodes' client handles (the graph's it copies).
  const std::unordered_map<CUgraphNode, uint64_t>* names = nullptr;
  template <typename T>
  void Put(const T& v) {
    if (out != nullptr) out->Put(v);
  }
  void Bytes(const void* p, size_t n) {
    if (out != nullptr) out->Bytes(p, n);
  }
  // The mirror that holds p: its owner's index and p's offset in it.
  bool Mirror(uint64_t p, int64_t* index, uint64_t* offset) const {
    auto it = mirrors.upper_bound(p);
    if (it == mirrors.begin()) return false;
    --it;
    if (p - it->first >= std::max<uint64_t>(it->second.second, 1)) return false;
    *index = static_cast<int64_t>(it->second.first);
    *offset = p - it->first;
    return true;
  }
};

Status Session::WriteGraph(GraphWriter& w, CUgraph g, uint64_t client, bool owned, int depth) {
  DriverApi& a = state_->api;
  if (depth > kMaxDepth) return Status::Error("it holds child graphs nested more than 16 deep");
  size_t n = 0;
  CUresult rc = a.cuGraphGetNodes(g, nullptr, &n);
  std::vector<CUgraphNode> nodes(n);
  if (rc == CUDA_SUCCESS && n > 0) rc = a.cuGraphGetNodes(g, nodes.data(), &n);
  if (rc != CUDA_SUCCESS) return Status::Error(Err("listing a graph's nodes", rc));
  nodes.resize(std::min(n, nodes.size()));
  // Dependencies, and an order in which they come first.
  std::unordered_map<CUgraphNode, size_t> at;
  for (size_t i = 0; i < nodes.size(); ++i) at[nodes[i]] = i;
  std::vector<std::vector<std::pair<size_t, CUgraphEdgeData>>> deps(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    size_t count = 0;
    rc = a.cuGraphNodeGetDependencies_v2(nodes[i], nullptr, nullptr, &count);
    std::vector<CUgraphNode> from(count);
    std::vector<CUgraphEdgeData> data(count);
    if (rc == CUDA_SUCCESS && count > 0)
      rc = a.cuGraphNodeGetDependencies_v2(nodes[i], from.data(), data.data(), &count);
    if (rc != CUDA_SUCCESS) return Status::Error(Err("a node's dependencies", rc));
    for (size_t j = 0; j < count && j < from.size(); ++j) {
      auto f = at.find(from[j]);
      if (f == at.end()) return Status::Error("a graph node depends on a node of another graph");
      deps[i].emplace_back(f->second, data[j]);
    }
  }
  std::vector<size_t> order, placed(nodes.size(), SIZE_MAX);
  while (order.size() < nodes.size()) {
    bool progress = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (placed[i] != SIZE_MAX) continue;
      bool ready = std::all_of(deps[i].begin(), deps[i].end(),
                               [&](const auto& d) { return placed[d.first] != SIZE_MAX; });
      if (!ready) continue;
      placed[i] = order.size();
      order.push_back(i);
      progress = true;
    }
    if (!progress) return Status::Error("a graph has a cycle");
  }
  w.Put(client);
  w.Put<uint8_t>(owned);
  w.Put<uint64_t>(nodes.size());
  for (size_t i : order) {
    CUgraphNode node = nodes[i];
    uint64_t node_client = 0;
    bool node_owned = false;
    if (w.names != nullptr) {
      auto name = w.names->find(node);
      if (name != w.names->end()) node_client = name->second;
    } else {
      node_client = ClientHandle(HandleKind::kGraphNode, Raw(node));
      node_owned = handles_[static_cast<int>(HandleKind::kGraphNode)].count(node_client) != 0;
    }
    CUgraphNodeType type{};
    rc = a.cuGraphNodeGetType(node, &type);
    if (rc != CUDA_SUCCESS) return Status::Error(Err("a node's type", rc));
    if (std::string why = UnmovableKind(type); !why.empty())
      return Status::Error("it holds a CUDA graph with " + why);
    w.Put(node_client);
    w.Put<uint8_t>(node_owned);
    w.Put<uint32_t>(type);
    w.Put<uint64_t>(deps[i].size());
    for (const auto& [d, data] : deps[i]) {
      w.Put<uint32_t>(static_cast<uint32_t>(placed[d]));
      w.Put(data);
    }
    switch (type) {
      case CU_GRAPH_NODE_TYPE_KERNEL: {
        CUDA_KERNEL_NODE_PARAMS p{};
        std::vector<ops::ParamSlot> slots;
        std::vector<uint8_t> blob;
        rc = KernelNodeArgs(node, &p, &slots, &blob);
        if (rc != CUDA_SUCCESS) return Status::Error(Err("a kernel node's parameters", rc));
        // The code by the client's handle: a kernel, a function, or a kernel's function.
        const uint64_t real = p.kern != nullptr ? Raw(p.kern) : Raw(p.func);
        auto known = w.code.find(real);
        std::pair<uint64_t, bool> code{0, false};
        if (known != w.code.end()) {
          code = known->second;
        } else if (p.func != nullptr) {
          const char* name = nullptr;
          if (a.cuFuncGetName(&name, p.func) == CUDA_SUCCESS && name != nullptr) {
            auto same = w.kernels.find(name);
            for (uint64_t k : same != w.kernels.end() ? same->second : std::vector<uint64_t>{}) {
              CUfunction f = nullptr;
              if (a.cuKernelGetFunction(&f, reinterpret_cast<CUkernel>(RealHandle(
                                                HandleKind::kKernel, k))) == CUDA_SUCCESS &&
                  f == p.func)
                code = {k, true};
            }
          }
        }
        if (code.first == 0)
          return Status::Error(
              "it holds a CUDA graph with a kernel node whose code did not come through this "
              "session");
        const uint32_t dims[6] = {p.gridDimX,  p.gridDimY,  p.gridDimZ,
                                  p.blockDimX, p.blockDimY, p.blockDimZ};
        w.Put(code.first);
        w.Put<uint8_t>(code.second);
        w.Bytes(dims, sizeof(dims));
        w.Put<uint32_t>(p.sharedMemBytes);
        w.Put<uint64_t>(blob.size());
        w.Bytes(blob.data(), blob.size());
        std::vector<std::pair<int32_t, CUkernelNodeAttrValue>> attrs;
        for (CUkernelNodeAttrID id : kCarriedNodeAttrs) {
          CUkernelNodeAttrValue v{};
          // An attribute this driver does not keep for nodes is not carried.
          if (a.cuGraphKernelNodeGetAttribute != nullptr &&
              a.cuGraphKernelNodeGetAttribute(node, id, &v) == CUDA_SUCCESS)
            attrs.emplace_back(static_cast<int32_t>(id), v);
        }
        w.Put<uint64_t>(attrs.size());
        for (const auto& [id, v] : attrs) {
          w.Put(id);
          w.Put(v);
        }
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMCPY: {
        CUDA_MEMCPY3D c{};
        rc = a.cuGraphMemcpyNodeGetParams(node, &c);
        if (rc != CUDA_SUCCESS) return Status::Error(Err("a memcpy node's parameters", rc));
        int64_t mirror[2] = {-1, -1};
        uint64_t offset[2] = {0, 0};
        const CUmemorytype types[2] = {c.srcMemoryType, c.dstMemoryType};
        const uint64_t host[2] = {Raw(c.srcHost), Raw(c.dstHost)};
        const uint64_t unified[2] = {c.srcDevice, c.dstDevice};
        for (int s = 0; s < 2; ++s) {
          if (types[s] == CU_MEMORYTYPE_ARRAY)
            return Status::Error("it holds a CUDA graph with a copy node of a CUDA array");
          if (types[s] == CU_MEMORYTYPE_HOST && !w.Mirror(host[s], &mirror[s], &offset[s]))
            return Status::Error(
                "it holds a CUDA graph with a copy node of host memory of the server's");
          if (types[s] == CU_MEMORYTYPE_UNIFIED) w.Mirror(unified[s], &mirror[s], &offset[s]);
        }
        w.Put(c);
        w.Put(mirror[0]);
        w.Put(offset[0]);
        w.Put(mirror[1]);
        w.Put(offset[1]);
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        CUDA_MEMSET_NODE_PARAMS m{};
        rc = a.cuGraphMemsetNodeGetParams(node, &m);
        if (rc != CUDA_SUCCESS) return Status::Error(Err("a memset node's parameters", rc));
        w.Put(m);
        break;
      }
      case CU_GRAPH_NODE_TYPE_HOST: {
        CUDA_HOST_NODE_PARAMS h{};
        rc = a.cuGraphHostNodeGetParams(node, &h);
        if (rc != CUDA_SUCCESS) return Status::Error(Err("a host node's parameters", rc));
        auto work = w.work.find(h.userData);
        if ((h.fn != RunCapturedHostFuncFn() && h.fn != FetchHelper() && h.fn != DeliverHelper()) ||
            work == w.work.end())
          return Status::Error("it holds a CUDA graph with a host node Flyt did not make");
        w.Put<uint64_t>(work->second);
        break;
      }
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        CUgraph child = nullptr;
        rc = a.cuGraphChildGraphNodeGetGraph(node, &child);
        if (rc != CUDA_SUCCESS) return Status::Error(Err("a child graph", rc));
        uint64_t child_client = 0;
        bool child_owned = false;
        if (w.names == nullptr) {
          child_client = ClientHandle(HandleKind::kGraph, Raw(child));
          child_owned = handles_[static_cast<int>(HandleKind::kGraph)].count(child_client) != 0;
        }
        const auto* names = w.names;
        w.names = names != nullptr ? &kNoNames : nullptr;
        Status st = WriteGraph(w, child, child_client, child_owned, depth + 1);
        w.names = names;
        if (!st.ok()) return st;
        break;
      }
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
        CUevent e = nullptr;
        rc = type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? a.cuGraphEventRecordNodeGetEvent(node, &e)
                                                     : a.cuGraphEventWaitNodeGetEvent(node, &e);
        if (rc != CUDA_SUCCESS) return Status::Error(Err("an event node's event", rc));
        const uint64_t event = ClientHandle(HandleKind::kEvent, Raw(e));
        if (!Owns(HandleKind::kEvent, event))
          return Status::Error("it holds a CUDA graph with an event node whose event is gone");
        w.Put(event);
        break;
      }
      default:  // EMPTY
        break;
    }
  }
  return w.out != nullptr ? w.out->status() : Status::Ok();
}

Status Session::WriteGraphs(SnapshotWriter* out) {
  GraphWriter w;
  w.out = out;
  for (size_t i = 0; i < captured_.size(); ++i) {
    const CapturedWork& c = *captured_[i];
    w.work[&c] = i;
    if (c.owns_mirror) w.mirrors[Raw(c.mirror)] = {i, c.len};
  }
  w.Put<uint64_t>(captured_.size());
  for (const auto& c : captured_) {
    int64_t mirror = -1;
    uint64_t offset = 0;
    if (!c->owns_mirror && c->mirror != nullptr &&
        (!w.Mirror(Raw(c->mirror), &mirror, &offset) || offset != 0))
      return Status::Error("captured host work uses a buffer Flyt does not know");
    w.Put<uint8_t>(static_cast<uint8_t>(c->kind));
    w.Put(c->id);
    w.Put(c->client_addr);
    w.Put<uint64_t>(c->len);
    w.Put<uint8_t>(c->owns_mirror);
    w.Put(mirror);
  }
  for (const auto& [h, c] : code_names_) {
    const HandleKind kind = c.kernel ? HandleKind::kKernel : HandleKind::kFunction;
    if (!Owns(kind, h)) continue;
    w.code[RealHandle(kind, h)] = {h, c.kernel};
    if (c.kernel) w.kernels[c.name].push_back(h);
  }
  std::vector<uint64_t> graphs;
  for (uint64_t g : handles_[static_cast<int>(HandleKind::kGraph)])
    if (subgraphs_.count(g) == 0) graphs.push_back(g);
  std::sort(graphs.begin(), graphs.end());
  w.Put<uint64_t>(graphs.size());
  for (uint64_t g : graphs) {
    Status st =
        WriteGraph(w, reinterpret_cast<CUgraph>(RealHandle(HandleKind::kGraph, g)), g, true, 0);
    if (!st.ok()) return st;
  }
  std::vector<uint64_t> execs(handles_[static_cast<int>(HandleKind::kGraphExec)].begin(),
                              handles_[static_cast<int>(HandleKind::kGraphExec)].end());
  std::sort(execs.begin(), execs.end());
  w.Put<uint64_t>(execs.size());
  for (uint64_t e : execs) {
    auto rec = execs_.find(e);
    if (rec == execs_.end())
      return Status::Error("it holds an executable graph Flyt did not see instantiated");
    if (rec->second.tmpl == nullptr)
      return Status::Error("it holds an executable graph that cannot move: " + rec->second.why);
    std::unordered_map<CUgraphNode, uint64_t> names;
    for (const auto& [client, node] : rec->second.tmpl_nodes) names[node] = client;
    w.Put(e);
    w.Put<uint64_t>(rec->second.flags);
    w.names = &names;
    Status st = WriteGraph(w, rec->second.tmpl, 0, false, 0);
    w.names = nullptr;
    if (!st.ok()) return st;
    w.Put<uint64_t>(rec->second.disabled.size());
    for (uint64_t node : rec->second.disabled) w.Put(node);
  }
  return out != nullptr ? out->status() : Status::Ok();
}

std::string Session::GraphsUnmovable() {
  if (captured_.empty() && handles_[static_cast<int>(HandleKind::kGraph)].empty() &&
      handles_[static_cast<int>(HandleKind::kGraphExec)].empty())
    return "";
  Status st = WriteGraphs(nullptr);
  return st.ok() ? "" : st.message();
}

// --- reading graphs -------------------------------------------------------------------

struct Session::GraphReader {
  SnapshotReader& in;
  size_t first_work = 0;  // captured_ index of the snapshot's first entry
  size_t works = 0;
};

Status Session::ReadGraph(GraphReader& r, CUgraph g, bool visible, bool nested, int depth,
                          std::vector<std::pair<uint64_t, CUgraphNode>>* top) {
  DriverApi& a = state_->api;
  SnapshotReader& in = r.in;
  if (depth > kMaxDepth) return Status::Error("a damaged snapshot (graphs nested too deep)");
  uint64_t client = 0, n = 0;
  uint8_t owned = 0;
  if (!in.Get(&client) || !in.Get(&owned) || !in.Count(&n)) return in.status();
  auto map = [&](HandleKind kind, uint64_t c, uint64_t real) {
    xlate_[static_cast<int>(kind)][c] = real;
    rev_[static_cast<int>(kind)][real] = c;
  };
  if (visible && client != 0) {
    map(HandleKind::kGraph, client, Raw(g));
    if (owned) {
      Adopt(HandleKind::kGraph, client);
      if (nested) subgraphs_[client] = 0;  // a child graph the client was told of
    }
  }
  std::vector<CUgraphNode> made;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t node_client = 0, ndeps = 0;
    uint8_t node_owned = 0;
    uint32_t type = 0;
    if (!in.Get(&node_client) || !in.Get(&node_owned) || !in.Get(&type) || !in.Count(&ndeps))
      return in.status();
    std::vector<CUgraphNode> deps;
    std::vector<std::pair<CUgraphNode, CUgraphEdgeData>> special;  // edges with data
    static const CUgraphEdgeData kPlain{};
    for (uint64_t d = 0; d < ndeps; ++d) {
      uint32_t index = 0;
      CUgraphEdgeData data{};
      if (!in.Get(&index) || !in.Get(&data)) return in.status();
      if (index >= made.size()) return Status::Error("a damaged snapshot (a node's dependency)");
      if (std::memcmp(&data, &kPlain, sizeof(data)) == 0) {
        deps.push_back(made[index]);
      } else {
        special.emplace_back(made[index], data);
      }
    }
    CUgraphNode node = nullptr;
    CUresult rc = CUDA_SUCCESS;
    switch (static_cast<CUgraphNodeType>(type)) {
      case CU_GRAPH_NODE_TYPE_KERNEL: {
        uint64_t code = 0, nblob = 0, nattrs = 0;
        uint8_t is_kernel = 0;
        uint32_t dims[6], shmem = 0;
        if (!in.Get(&code) || !in.Get(&is_kernel) || !in.Bytes(dims, sizeof(dims)) ||
            !in.Get(&shmem) || !in.Count(&nblob))
          return in.status();
        if (nblob > ops::kMaxParamBytes) return Status::Error("a damaged snapshot (arguments)");
        std::vector<uint8_t> blob(nblob);
        if (!in.Bytes(blob.data(), blob.size()) || !in.Count(&nattrs)) return in.status();
        std::vector<std::pair<int32_t, CUkernelNodeAttrValue>> attrs(nattrs);
        for (auto& [id, v] : attrs)
          if (!in.Get(&id) || !in.Get(&v)) return in.status();
        const HandleKind kind = is_kernel ? HandleKind::kKernel : HandleKind::kFunction;
        if (!Owns(kind, code))
          return Status::Error("a kernel node's code is not in the snapshot's code");
        const uint64_t fn = RealHandle(kind, code);
        std::vector<void*> pointers;
        std::vector<ops::ParamSlot> slots;
        DriverParamLayout(fn, is_kernel, &slots);  // those found before any failure
        for (const ops::ParamSlot& slot : slots) {
          if (slot.offset + slot.size > blob.size())
            return Status::Error("a kernel node's arguments do not fit its function here");
          pointers.push_back(blob.data() + slot.offset);
        }
        CUDA_KERNEL_NODE_PARAMS p{};
        if (is_kernel) {
          p.kern = reinterpret_cast<CUkernel>(fn);
        } else {
          p.func = reinterpret_cast<CUfunction>(fn);
        }
        p.gridDimX = dims[0];
        p.gridDimY = dims[1];
        p.gridDimZ = dims[2];
        p.blockDimX = dims[3];
        p.blockDimY = dims[4];
        p.blockDimZ = dims[5];
        p.sharedMemBytes = shmem;
        p.kernelParams = pointers.empty() ? nullptr : pointers.data();
        rc = a.cuGraphAddKernelNode_v2(&node, g, deps.data(), deps.size(), &p);
        for (size_t k = 0; rc == CUDA_SUCCESS && k < attrs.size(); ++k) {
          auto id = static_cast<CUkernelNodeAttrID>(attrs[k].first);
          CUkernelNodeAttrValue now{};
          if (a.cuGraphKernelNodeGetAttribute(node, id, &now) == CUDA_SUCCESS &&
              std::memcmp(&now, &attrs[k].second, sizeof(now)) == 0)
            continue;
          rc = a.cuGraphKernelNodeSetAttribute(node, id, &attrs[k].second);
          if (rc != CUDA_SUCCESS)
            return Status::Error(Err("setting kernel node attribute " + std::to_string(id), rc));
        }
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMCPY: {
        CUDA_MEMCPY3D c{};
        int64_t mirror[2] = {-1, -1};
        uint64_t offset[2] = {0, 0};
        if (!in.Get(&c) || !in.Get(&mirror[0]) || !in.Get(&offset[0]) || !in.Get(&mirror[1]) ||
            !in.Get(&offset[1]))
          return in.status();
        for (int s = 0; s < 2; ++s) {
          if (mirror[s] < 0) continue;
          if (static_cast<uint64_t>(mirror[s]) >= r.works ||
              !captured_[r.first_work + mirror[s]]->owns_mirror ||
              offset[s] >= std::max<uint64_t>(captured_[r.first_work + mirror[s]]->len, 1))
            return Status::Error("a damaged snapshot (a copy node's mirror)");
          auto* p = static_cast<uint8_t*>(captured_[r.first_work + mirror[s]]->mirror) + offset[s];
          CUmemorytype& t = s == 0 ? c.srcMemoryType : c.dstMemoryType;
          if (t == CU_MEMORYTYPE_UNIFIED) {
            (s == 0 ? c.srcDevice : c.dstDevice) = Raw(p);
          } else if (s == 0) {
            c.srcHost = p;
          } else {
            c.dstHost = p;
          }
        }
        rc = a.cuGraphAddMemcpyNode(&node, g, deps.data(), deps.size(), &c, NodeContext());
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        CUDA_MEMSET_NODE_PARAMS m{};
        if (!in.Get(&m)) return in.status();
        rc = a.cuGraphAddMemsetNode(&node, g, deps.data(), deps.size(), &m, NodeContext());
        break;
      }
      case CU_GRAPH_NODE_TYPE_HOST: {
        uint64_t index = 0;
        if (!in.Get(&index)) return in.status();
        if (index >= r.works) return Status::Error("a damaged snapshot (a host node's work)");
        CapturedWork* work = captured_[r.first_work + index].get();
        CUDA_HOST_NODE_PARAMS h{};
        h.fn = work->kind == CapturedWork::Kind::kHostFunc ? RunCapturedHostFuncFn()
               : work->kind == CapturedWork::Kind::kFetch  ? FetchHelper()
                                                           : DeliverHelper();
        h.userData = work;
        rc = a.cuGraphAddHostNode(&node, g, deps.data(), deps.size(), &h);
        break;
      }
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        // An empty child graph whose own graph is then built in place: the
        // client's handles of its nodes name the nodes the driver keeps.
        CUgraph empty = nullptr;
        rc = a.cuGraphCreate(&empty, 0);
        if (rc != CUDA_SUCCESS) return Status::Error(Err("cuGraphCreate", rc));
        rc = a.cuGraphAddChildGraphNode(&node, g, deps.data(), deps.size(), empty);
        CUresult d = a.cuGraphDestroy(empty);
        if (rc == CUDA_SUCCESS && d != CUDA_SUCCESS) rc = d;
        CUgraph inner = nullptr;
        if (rc == CUDA_SUCCESS) rc = a.cuGraphChildGraphNodeGetGraph(node, &inner);
        if (rc != CUDA_SUCCESS) return Status::Error(Err("making a child graph node", rc));
        Status st = ReadGraph(r, inner, visible, /*nested=*/true, depth + 1, nullptr);
        if (!st.ok()) return st;
        break;
      }
      case CU_GRAPH_NODE_TYPE_EMPTY:
        rc = a.cuGraphAddEmptyNode(&node, g, deps.data(), deps.size());
        break;
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
        uint64_t event = 0;
        if (!in.Get(&event)) return in.status();
        if (!Owns(HandleKind::kEvent, event))
          return Status::Error("an event node's event is not in the snapshot");
        CUevent e = reinterpret_cast<CUevent>(RealHandle(HandleKind::kEvent, event));
        rc = type == CU_GRAPH_NODE_TYPE_EVENT_RECORD
                 ? a.cuGraphAddEventRecordNode(&node, g, deps.data(), deps.size(), e)
                 : a.cuGraphAddEventWaitNode(&node, g, deps.data(), deps.size(), e);
        break;
      }
      default:
        return Status::Error("a damaged snapshot (a graph node of type " + std::to_string(type) +
                             ")");
    }
    if (rc != CUDA_SUCCESS)
      return Status::Error(Err("rebuilding a graph node of type " + std::to_string(type), rc));
    for (const auto& [from, data] : special) {
      rc = a.cuGraphAddDependencies_v2(g, &from, &node, &data, 1);
      if (rc != CUDA_SUCCESS) return Status::Error(Err("an edge with data", rc));
    }
    made.push_back(node);
    if (visible && node_client != 0) {
      map(HandleKind::kGraphNode, node_client, Raw(node));
      if (node_owned) Adopt(HandleKind::kGraphNode, node_client);
    }
    if (top != nullptr) top->emplace_back(node_client, node);
  }
  return Status::Ok();
}

Status Session::RestoreGraphs(SnapshotReader& in) {
  DriverApi& a = state_->api;
  uint64_t n = 0;
  if (!in.Count(&n)) return in.status();
  GraphReader r{in, captured_.size(), n};
  for (uint64_t i = 0; i < n; ++i) {
    uint8_t kind = 0, owns = 0;
    uint64_t id = 0, client_addr = 0, len = 0;
    int64_t mirror = -1;
    if (!in.Get(&kind) || !in.Get(&id) || !in.Get(&client_addr) || !in.Get(&len) ||
        !in.Get(&owns) || !in.Get(&mirror))
      return in.status();
    if (kind > static_cast<uint8_t>(CapturedWork::Kind::kFetch) || len > (1ull << 40) ||
        (mirror >= 0 && static_cast<uint64_t>(mirror) >= i))
      return Status::Error("a damaged snapshot (captured host work)");
    auto w = std::make_unique<CapturedWork>(
        CapturedWork{static_cast<CapturedWork::Kind>(kind), this, id});
    w->client_addr = client_addr;
    w->len = static_cast<size_t>(len);
    if (owns) {
      void* p = nullptr;
      CUresult rc = a.cuMemHostAlloc(&p, len > 0 ? len : 1, 0);
      if (rc != CUDA_SUCCESS) return Status::Error(Err("a pinned mirror for a graph's copy", rc));
      w->mirror = p;
      w->owns_mirror = true;
    } else if (mirror >= 0) {
      const CapturedWork& owner = *captured_[r.first_work + mirror];
      if (!owner.owns_mirror) return Status::Error("a damaged snapshot (a mirror's owner)");
      w->mirror = owner.mirror;
    }
    captured_.push_back(std::move(w));
  }
  if (!in.Count(&n)) return in.status();
  for (uint64_t i = 0; i < n; ++i) {
    CUgraph g = nullptr;
    CUresult rc = a.cuGraphCreate(&g, 0);
    if (rc != CUDA_SUCCESS) return Status::Error(Err("cuGraphCreate", rc));
    Status st = ReadGraph(r, g, true, false, 0, nullptr);  // adopted: freed with the session
    if (!st.ok()) return st;
  }
  if (!in.Count(&n)) return in.status();
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t client = 0, flags = 0;
    if (!in.Get(&client) || !in.Get(&flags)) return in.status();
    ExecRecord rec;
    rec.flags = flags;
    CUresult rc = a.cuGraphCreate(&rec.source, 0);
    if (rc != CUDA_SUCCESS) return Status::Error(Err("cuGraphCreate", rc));
    std::vector<std::pair<uint64_t, CUgraphNode>> top;
    Status st = ReadGraph(r, rec.source, false, false, 0, &top);
    uint64_t ndisabled = 0;
    if (st.ok() && !in.Count(&ndisabled)) st = in.status();
    std::vector<uint64_t> disabled(ndisabled);
    for (uint64_t& d : disabled)
      if (st.ok() && !in.Get(&d)) st = in.status();
    for (const auto& [node_client, node] : top)
      if (node_client != 0) rec.source_nodes[node_client] = node;
    CUgraphExec exec = nullptr;
    if (st.ok()) {
      // An upload at instantiation happened on the source; the flag is not one
      // the executable graph reports.
      rc = a.cuGraphInstantiateWithFlags(&exec, rec.source,
                                         flags & ~CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
      if (rc != CUDA_SUCCESS) st = Status::Error(Err("instantiating a graph again", rc));
    }
    if (!st.ok()) {
      DropTemplate(&rec);
      return st;
    }
    xlate_[static_cast<int>(HandleKind::kGraphExec)][client] = Raw(exec);
    rev_[static_cast<int>(HandleKind::kGraphExec)][Raw(exec)] = client;
    Adopt(HandleKind::kGraphExec, client);
    rec.tmpl = rec.source;  // the template too: exec-level changes go into it
    rec.tmpl_nodes = rec.source_nodes;
    for (uint64_t node : disabled) {
      auto it = rec.source_nodes.find(node);
      if (it == rec.source_nodes.end()) {
        DropTemplate(&rec);
        return Status::Error("a damaged snapshot (a disabled node)");
      }
      rc = a.cuGraphNodeSetEnabled(exec, it->second, 0);
      if (rc != CUDA_SUCCESS) {
        DropTemplate(&rec);
        return Status::Error(Err("disabling a node of an executable graph", rc));
      }
      rec.disabled.insert(node);
    }
    execs_[client] = std::move(rec);
  }
  return Status::Ok();
}

}  // namespace flyt::server
