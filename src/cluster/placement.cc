#include "cluster/placement.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <tuple>
#include <utility>

namespace flyt::cluster {

struct Placement::Entry {
  GpuUsage usage;
  uint64_t seq = 0;     // insertion order: the last tie-break, keeps picks deterministic
  bool linked = false;  // in by_sm_ / by_memory_
  int64_t free_sm() const { return int64_t{usage.capacity.sm_total} - usage.sm_used; }
  int64_t free_memory() const { return usage.capacity.memory_total - usage.memory_used; }
  const std::string& uuid() const { return usage.capacity.uuid; }
  const std::string& node_id() const { return usage.capacity.node_id; }
};

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;

template <typename E>
auto SmKey(const E* e) {
  return std::make_tuple(e->free_sm(), e->free_memory(), e->seq);
}
template <typename E>
auto MemoryKey(const E* e) {
  return std::make_tuple(e->free_memory(), e->free_sm(), e->seq);
}

template <typename T>
void EraseValue(std::vector<T>* v, const T& value) {
  v->erase(std::remove(v->begin(), v->end(), value), v->end());
}

std::string Sms(int64_t n) { return std::to_string(n) + (n == 1 ? " SM" : " SMs"); }

std::string Share(int64_t sm, int64_t memory) { return Sms(sm) + ", " + FormatMemory(memory); }

}  // namespace

std::string FormatMemory(int64_t bytes) {
  char buf[48];
  if (bytes == 0 || std::llabs(bytes) >= kGiB) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / kGiB);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / kMiB);
  }
  return buf;
}

bool Placement::ByMemoryThenSm::operator()(const Entry* a, const Entry* b) const {
  return MemoryKey(a) < MemoryKey(b);
}

Placement::Placement(PlacementOptions options) : options_(options) {}
Placement::~Placement() = default;
Placement::Placement(Placement&&) noexcept = default;
Placement& Placement::operator=(Placement&&) noexcept = default;

void Placement::Unlink(Entry* e) {
  if (!e->linked) return;
  auto bucket = by_sm_.find(e->free_sm());
  bucket->second.erase(e);
  if (bucket->second.empty()) by_sm_.erase(bucket);
  by_memory_.erase(e);
  e->linked = false;
}

void Placement::Link(Entry* e) {
  if (e->linked || !e->usage.schedulable) return;
  by_sm_[e->free_sm()].insert(e);
  by_memory_.insert(e);
  e->linked = true;
}

void Placement::AttachToGroups(Entry* e) {
  Node& node = nodes_[e->node_id()];
  node.gpus.push_back(e);
  e->usage.schedulable = node.schedulable;
  if (!e->usage.capacity.host_ip.empty()) hosts_[e->usage.capacity.host_ip].push_back(e);
}

void Placement::DetachFromGroups(Entry* e) {
  if (auto it = nodes_.find(e->node_id()); it != nodes_.end()) EraseValue(&it->second.gpus, e);
  const std::string& host = e->usage.capacity.host_ip;
  if (auto it = hosts_.find(host); it != hosts_.end()) {
    EraseValue(&it->second, e);
    if (it->second.empty()) hosts_.erase(it);
  }
}

void Placement::AddGpu(const GpuCapacity& gpu) {
  auto it = gpus_.find(gpu.uuid);
  if (it == gpus_.end()) {
    auto entry = std::make_unique<Entry>();
    Entry* e = entry.get();
    e->usage.capacity = gpu;
    e->seq = next_seq_++;
    if (auto p = pending_.find(gpu.uuid); p != pending_.end()) {
      e->usage.sm_used = p->second.sm;
      e->usage.memory_used = p->second.memory;
      e->usage.allocations = p->second.allocations;
      pending_.erase(p);
    }
    gpus_.emplace(gpu.uuid, std::move(entry));
    AttachToGroups(e);
    Link(e);
    return;
  }
  Entry* e = it->second.get();
  Unlink(e);
  const bool moved = e->node_id() != gpu.node_id || e->usage.capacity.host_ip != gpu.host_ip;
  if (moved) DetachFromGroups(e);
  e->usage.capacity = gpu;
  if (moved) AttachToGroups(e);
  Link(e);
}

void Placement::RemoveNode(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  for (Entry* e : it->second.gpus) {
    Unlink(e);
    const std::string& host = e->usage.capacity.host_ip;
    if (auto h = hosts_.find(host); h != hosts_.end()) {
      EraseValue(&h->second, e);
      if (h->second.empty()) hosts_.erase(h);
    }
    gpus_.erase(e->uuid());  // destroys e
  }
  nodes_.erase(it);
}

void Placement::SetNodeSchedulable(const std::string& node_id, bool schedulable) {
  Node& node = nodes_[node_id];
  node.schedulable = schedulable;
  for (Entry* e : node.gpus) {
    if (e->usage.schedulable == schedulable) continue;
    Unlink(e);
    e->usage.schedulable = schedulable;
    Link(e);
  }
}

void Placement::Reserve(const std::string& uuid, int sm, int64_t memory) {
  auto it = gpus_.find(uuid);
  if (it == gpus_.end()) {
    Pending& p = pending_[uuid];
    p.sm += sm;
    p.memory += memory;
    p.allocations++;
    return;
  }
  Entry* e = it->second.get();
  Unlink(e);
  e->usage.sm_used += sm;
  e->usage.memory_used += memory;
  e->usage.allocations++;
  Link(e);
}

void Placement::Release(const std::string& uuid, int sm, int64_t memory) {
  auto it = gpus_.find(uuid);
  if (it == gpus_.end()) {
    auto p = pending_.find(uuid);
    if (p == pending_.end()) return;
    p->second.sm = std::max(0, p->second.sm - sm);
    p->second.memory = std::max<int64_t>(0, p->second.memory - memory);
    if (--p->second.allocations <= 0) pending_.erase(p);
    return;
  }
  Entry* e = it->second.get();
  Unlink(e);
  e->usage.sm_used = std::max(0, e->usage.sm_used - sm);
  e->usage.memory_used = std::max<int64_t>(0, e->usage.memory_used - memory);
  e->usage.allocations = std::max(0, e->usage.allocations - 1);
  Link(e);
}

bool Placement::Fits(const Entry& e, int sm, int64_t memory) const {
  // A share larger than the whole GPU never fits, oversubscribed or not.
  if (sm > e.usage.capacity.sm_total || memory > e.usage.capacity.memory_total) return false;
  if (!options_.oversubscribe_sm && e.free_sm() < sm) return false;
  if (!options_.oversubscribe_memory && e.free_memory() < memory) return false;
  return true;
}

bool Placement::Better(const Entry& a, const Entry& b) const {
  return options_.policy == Policy::kSpread ? SmKey(&b) < SmKey(&a) : SmKey(&a) < SmKey(&b);
}

const Placement::Entry* Placement::PickGlobal(int sm, int64_t memory) const {
  if (by_sm_.empty()) return nullptr;
  const bool check_sm = !options_.oversubscribe_sm, check_memory = !options_.oversubscribe_memory;
  // Nothing anywhere has that much free: answer without a walk.
  if (check_sm && by_sm_.rbegin()->first < sm) return nullptr;
  if (check_memory && (*by_memory_.rbegin())->free_memory() < memory) return nullptr;
  // Within a bucket Fits() fails only on a GPU smaller than the share (mixed GPU models), so
  // each bucket costs one lookup in a homogeneous cluster.
  if (options_.policy == Policy::kSpread) {
    for (auto b = by_sm_.rbegin(); b != by_sm_.rend(); ++b) {
      if (check_sm && b->first < sm) break;  // all further buckets have fewer
      for (auto it = b->second.rbegin(); it != b->second.rend(); ++it) {
        if (check_memory && (*it)->free_memory() < memory) break;
        if (Fits(**it, sm, memory)) return *it;
      }
    }
    return nullptr;
  }
  Entry probe;  // key (memory, lowest, 0): before every GPU with at least `memory` free
  probe.usage.capacity.memory_total = memory;
  probe.usage.capacity.sm_total = std::numeric_limits<int>::min();
  probe.usage.sm_used = std::numeric_limits<int>::max();
  for (auto b = check_sm ? by_sm_.lower_bound(sm) : by_sm_.begin(); b != by_sm_.end(); ++b) {
    auto it = check_memory ? b->second.lower_bound(&probe) : b->second.begin();
    for (; it != b->second.end(); ++it) {
      if (Fits(**it, sm, memory)) return *it;
    }
  }
  return nullptr;
}

Status Placement::Place(const PlacementRequest& request, std::string* gpu_uuid) const {
  if (gpu_uuid == nullptr) return Status::Error("placement: no output for the GPU uuid");
  if (request.sm < 0 || request.memory_bytes < 0) {
    return Status::Error("bad placement request for VM " + request.vm_ip + ": " +
                         Share(request.sm, request.memory_bytes) + " (negative)");
  }
  const Entry* best = nullptr;
  if (!request.host_ip.empty()) {
    if (auto h = hosts_.find(request.host_ip); h != hosts_.end()) {
      for (const Entry* e : h->second) {
        if (!e->usage.schedulable || !Fits(*e, request.sm, request.memory_bytes)) continue;
        if (best == nullptr || Better(*e, *best)) best = e;
      }
    }
  }
  if (best == nullptr) best = PickGlobal(request.sm, request.memory_bytes);
  if (best == nullptr) return Status::Error(Refusal(request.sm, request.memory_bytes));
  *gpu_uuid = best->uuid();
  return Status::Ok();
}

Status Placement::PlaceGroup(const PlacementRequest& request, int count,
                             std::vector<std::string>* uuids, bool* one_node,
                             const PlacementFilter* filter) const {
  if (uuids == nullptr || one_node == nullptr)
    return Status::Error("placement: no output for the GPU uuids");
  if (count < 1) return Status::Error("bad placement request: " + std::to_string(count) + " GPUs");
  if (request.sm < 0 || request.memory_bytes < 0) {
    return Status::Error("bad placement request for VM " + request.vm_ip + ": " +
                         Share(request.sm, request.memory_bytes) + " (negative)");
  }
  uuids->clear();
  if (count == 1 && filter == nullptr) {  // exactly Place's pick
    uuids->emplace_back();
    Status st = Place(request, &uuids->back());
    if (!st.ok()) uuids->clear();
    *one_node = st.ok();
    return st;
  }
  // Each node's GPUs that can take the share, best first.
  struct Candidate {
    const std::string* node = nullptr;
    bool vm_host = false;
    std::vector<const Entry*> gpus;
    int64_t free_sm = 0;  // of the `count` best (or all, if fewer)
  };
  std::vector<Candidate> nodes;
  size_t fitting = 0;
  size_t allowed = 0;  // GPUs the filter lets through, fitting or not
  for (const auto& [node_id, node] : nodes_) {
    if (!node.schedulable) continue;
    if (filter != nullptr && ((!filter->nodes.empty() && !filter->nodes.count(node_id)) ||
                              filter->avoid_nodes.count(node_id)))
      continue;
    Candidate c;
    c.node = &node_id;
    for (const Entry* e : node.gpus) {
      if (filter != nullptr && (filter->avoid_gpus.count(e->uuid()) ||
                                (!filter->gpu.empty() && filter->gpu != e->uuid())))
        continue;
      allowed += e->usage.schedulable;
      if (!e->usage.schedulable || !Fits(*e, request.sm, request.memory_bytes)) continue;
      c.gpus.push_back(e);
      c.vm_host =
          c.vm_host || (!request.host_ip.empty() && e->usage.capacity.host_ip == request.host_ip);
    }
    if (c.gpus.empty()) continue;
    std::sort(c.gpus.begin(), c.gpus.end(),
              [this](const Entry* a, const Entry* b) { return Better(*a, *b); });
    for (size_t i = 0; i < c.gpus.size() && i < static_cast<size_t>(count); ++i)
      c.free_sm += c.gpus[i]->free_sm();
    fitting += c.gpus.size();
    nodes.push_back(std::move(c));
  }
  if (fitting < static_cast<size_t>(count) && filter != nullptr) {
    return Status::Error("only " + std::to_string(fitting) + " of the " + std::to_string(allowed) +
                         " GPU(s) that may take it " + (allowed == 1 ? "has " : "have ") +
                         Share(request.sm, request.memory_bytes) + " free, " +
                         std::to_string(count) + " needed");
  }
  if (fitting < static_cast<size_t>(count)) {
    return Status::Error(
        "only " + std::to_string(fitting) + " of the " + std::to_string(count) +
        " GPUs asked for have " + Share(request.sm, request.memory_bytes) + " free" +
        (fitting == 0 ? " (" + Refusal(request.sm, request.memory_bytes) + ")" : ""));
  }
  const bool spread = options_.policy == Policy::kSpread;
  // The order to try nodes in: the VM's host first; then, for one node, by policy on the
  // free SMs of the picks; across nodes, most fitting GPUs first (fewest nodes).
  auto by = [&](bool whole) {
    return [&, whole](const Candidate& a, const Candidate& b) {
      if (a.vm_host != b.vm_host) return a.vm_host;
      if (!whole && a.gpus.size() != b.gpus.size()) return a.gpus.size() > b.gpus.size();
      if (a.free_sm != b.free_sm) return spread ? a.free_sm > b.free_sm : a.free_sm < b.free_sm;
      return Better(*a.gpus[0], *b.gpus[0]);  // Place's tie-break, on each node's best
    };
  };
  std::vector<const Candidate*> whole;
  for (const Candidate& c : nodes)
    if (c.gpus.size() >= static_cast<size_t>(count)) whole.push_back(&c);
  if (!whole.empty()) {
    const Candidate* best =
        *std::min_element(whole.begin(), whole.end(),
                          [&](const Candidate* a, const Candidate* b) { return by(true)(*a, *b); });
    for (int i = 0; i < count; ++i) uuids->push_back(best->gpus[i]->uuid());
    *one_node = true;
    return Status::Ok();
  }
  std::sort(nodes.begin(), nodes.end(), by(false));
  for (const Candidate& c : nodes) {
    for (const Entry* e : c.gpus) {
      if (uuids->size() == static_cast<size_t>(count)) break;
      uuids->push_back(e->uuid());
    }
  }
  *one_node = false;
  return Status::Ok();
}

std::string Placement::Refusal(int sm, int64_t memory) const {
  const bool over_sm = options_.oversubscribe_sm, over_memory = options_.oversubscribe_memory;
  std::string msg;
  if (over_sm && over_memory) {
    msg = "no GPU can take " + Sms(sm) + " and " + FormatMemory(memory);
  } else if (over_sm) {
    msg = "no GPU has " + FormatMemory(memory) + " free for " + Sms(sm);
  } else if (over_memory) {
    msg = "no GPU has " + Sms(sm) + " free for " + FormatMemory(memory);
  } else {
    msg = "no GPU has " + Sms(sm) + " and " + FormatMemory(memory) + " free";
  }
  msg += " (";
  if (over_sm || over_memory) {
    msg += std::string(over_sm ? (over_memory ? "SMs and memory" : "SMs") : "memory") +
           " oversubscribed; ";
  }
  if (by_sm_.empty()) {
    msg += gpus_.empty() ? "no GPU registered)"
                         : "no schedulable GPU: all " + std::to_string(gpus_.size()) +
                               " are on drained or down nodes)";
    return msg;
  }
  auto describe = [](const Entry* e) {
    return Share(e->free_sm(), e->free_memory()) + " on " + e->uuid() + " of node " + e->node_id();
  };
  const Entry* most_sm = *by_sm_.rbegin()->second.rbegin();
  const Entry* most_memory = *by_memory_.rbegin();
  msg += "most free: " + describe(most_sm);
  if (most_memory->free_memory() > most_sm->free_memory()) msg += "; " + describe(most_memory);
  return msg + ")";
}

Status Placement::CanResize(const std::string& uuid, int sm_delta, int64_t memory_delta) const {
  auto it = gpus_.find(uuid);
  if (it == gpus_.end()) return Status::Error("unknown GPU " + uuid);
  const Entry& e = *it->second;
  const bool sm_short = sm_delta > 0 && !options_.oversubscribe_sm && e.free_sm() < sm_delta;
  const bool memory_short =
      memory_delta > 0 && !options_.oversubscribe_memory && e.free_memory() < memory_delta;
  if (!sm_short && !memory_short) return Status::Ok();
  std::string grow;
  if (sm_delta > 0) grow = Sms(sm_delta);
  if (memory_delta > 0) grow += (grow.empty() ? "" : " and ") + FormatMemory(memory_delta);
  return Status::Error("cannot grow by " + grow + " on " + e.uuid() + " of node " + e.node_id() +
                       " (free: " + Share(e.free_sm(), e.free_memory()) + " of " +
                       Share(e.usage.capacity.sm_total, e.usage.capacity.memory_total) + ")");
}

const GpuUsage* Placement::Find(const std::string& uuid) const {
  auto it = gpus_.find(uuid);
  return it == gpus_.end() ? nullptr : &it->second->usage;
}

std::vector<GpuUsage> Placement::List() const {
  std::vector<GpuUsage> out;
  out.reserve(gpus_.size());
  for (const auto& [uuid, e] : gpus_) out.push_back(e->usage);
  std::sort(out.begin(), out.end(), [](const GpuUsage& a, const GpuUsage& b) {
    return std::tie(a.capacity.node_id, a.capacity.uuid) <
           std::tie(b.capacity.node_id, b.capacity.uuid);
  });
  return out;
}

}  // namespace flyt::cluster
