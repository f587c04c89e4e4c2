// Placement: which GPU gets a new tenant allocation (or which GPUs, for a tenant with several).
//
// Owns: an in-memory index of the cluster's GPUs (capacity, SMs and memory in use, whether
// their node takes new work) and the choice of a GPU for a request, by host preference then
// policy. It does not own allocations, talk to nodes or touch the database: the cluster
// manager tells it what exists (AddGpu/Reserve at registration and on restart) and what
// changed (Reserve/Release on allocate, resize, free). Not thread-safe: the cluster manager
// calls it under its own lock.
//
// Index: GPUs of schedulable nodes sit in buckets by free SM count (an ordered map; a few
// hundred distinct counts at most), each bucket ordered by free memory. A pick visits at most
// one GPU per bucket: spread takes, from the fullest-SM bucket down, the bucket's most free
// GPU if it has the memory; pack takes, from the first bucket with enough SMs up, the least
// free GPU with enough memory. A second set keyed by free memory answers "nothing has that
// much memory" at once. Same-host candidates come from a per-host list (a handful of GPUs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace flyt::cluster {

enum class Policy { kSpread, kPack };  // spread: most free first; pack: fullest GPU that fits first

struct PlacementOptions {
  Policy policy = Policy::kSpread;
  bool oversubscribe_sm = false;      // Place/CanResize ignore the SM limit
  bool oversubscribe_memory = false;  // Place/CanResize ignore the memory limit
};

struct GpuCapacity {
  std::string uuid, node_id, host_ip;
  int sm_total = 0;
  int64_t memory_total = 0;  // bytes
};

struct GpuUsage {
  GpuCapacity capacity;
  int sm_used = 0;
  int64_t memory_used = 0;  // bytes
  bool schedulable = true;  // false while its node is drained or down
  int allocations = 0;      // Reserve calls minus Release calls
};

// Restricts PlaceGroup to some GPUs (a tenant that moves): only GPUs of `nodes` (empty:
// any node), and never a GPU of `avoid_nodes` or in `avoid_gpus` (the tenant's own);
// `gpu` set: that GPU only.
struct PlacementFilter {
  std::set<std::string> nodes, avoid_nodes, avoid_gpus;
  std::string gpu;
};

struct PlacementRequest {
  std::string vm_ip, host_ip;  // host_ip: the VM's host; its GPUs are tried first
  int sm = 0;
  int64_t memory_bytes = 0;
};

class Placement {
 public:
  explicit Placement(PlacementOptions options = {});
  ~Placement();
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;
  Placement(Placement&&) noexcept;
  Placement& operator=(Placement&&) noexcept;

  void set_options(const PlacementOptions& options) { options_ = options; }
  const PlacementOptions& options() const { return options_; }

  // Adds a GPU or updates its capacity, node and host (usage is kept). A GPU added to a
  // node marked unschedulable is unschedulable too. Usage reserved on a uuid before its
  // AddGpu (a restarted manager loading allocations before nodes register) is applied now.
  void AddGpu(const GpuCapacity& gpu);
  // Drops the node's GPUs and their usage, and forgets its schedulable flag.
  void RemoveNode(const std::string& node_id);
  // Drain / node down (false) or back (true). Remembered for a node not yet known, so that
  // GPUs it registers later follow it. Existing allocations stay accounted either way.
  void SetNodeSchedulable(const std::string& node_id, bool schedulable);
  // Accounts an allocation of (sm, memory) on uuid, with no capacity check. On an unknown
  // uuid the usage is held until that GPU is added. A resize is Release(old) + Reserve(new).
  void Reserve(const std::string& uuid, int sm, int64_t memory);
  // Undoes a Reserve; usage never goes below zero.
  void Release(const std::string& uuid, int sm, int64_t memory);

  // Picks a schedulable GPU for the request: GPUs whose host_ip equals request.host_ip
  // first (shared-memory mode possible), then all others; within each group spread takes the
  // one with most free (SMs, then memory), pack the one with least free that still fits.
  // Never exceeds sm_total/memory_total unless the options allow. Does NOT reserve.
  // Failure says what was asked and the best that is free, e.g. "no GPU has 64 SMs and
  // 80.0 GiB free (most free: 32 SMs, 40.0 GiB on GPU-xx of node n3)".
  Status Place(const PlacementRequest& request, std::string* gpu_uuid) const;
  // Picks `count` distinct schedulable GPUs, each able to take the request's share, for a
  // tenant with several GPUs. One node when one can take them all (the VM's host first,
  // then by policy: spread the node whose picked GPUs have the most free, pack the least);
  // otherwise across as few nodes as it can, the nodes with most fitting GPUs first.
  // *one_node says which it was. The picks come in an order that keeps a node's GPUs
  // together. Does NOT reserve. Failure says how many GPUs could take the share.
  // `filter` (optional) narrows the GPUs that may be picked (a move, see PlacementFilter).
  Status PlaceGroup(const PlacementRequest& request, int count, std::vector<std::string>* uuids,
                    bool* one_node, const PlacementFilter* filter = nullptr) const;
  // Whether uuid can grow by (sm_delta, memory_delta); deltas may be negative, and a
  // shrink always fits. The node's schedulable flag does not matter here.
  Status CanResize(const std::string& uuid, int sm_delta, int64_t memory_delta) const;

  const GpuUsage* Find(const std::string& uuid) const;  // nullptr if unknown
  std::vector<GpuUsage> List() const;                   // ordered by node_id, then uuid
  size_t gpu_count() const { return gpus_.size(); }

 private:
  struct Entry;
  struct ByMemoryThenSm {
    bool operator()(const Entry* a, const Entry* b) const;
  };
  struct Node {
    bool schedulable = true;
    std::vector<Entry*> gpus;
  };
  struct Pending {  // usage reserved on a uuid not added yet
    int sm = 0;
    int64_t memory = 0;
    int allocations = 0;
  };

  // Unlink/Link take a schedulable GPU out of / into the ordered sets around a key change.
  void Unlink(Entry* e);
  void Link(Entry* e);
  void DetachFromGroups(Entry* e);  // from its node's and host's lists
  void AttachToGroups(Entry* e);
  bool Fits(const Entry& e, int sm, int64_t memory) const;
  // True if a is a better pick than b under the current policy.
  bool Better(const Entry& a, const Entry& b) const;
  const Entry* PickGlobal(int sm, int64_t memory) const;
  std::string Refusal(int sm, int64_t memory) const;

  PlacementOptions options_;
  uint64_t next_seq_ = 0;
  std::unordered_map<std::string, std::unique_ptr<Entry>> gpus_;  // by uuid
  std::unordered_map<std::string, Node> nodes_;                   // by node_id
  std::unordered_map<std::string, std::vector<Entry*>> hosts_;    // by host_ip
  std::unordered_map<std::string, Pending> pending_;              // by uuid
  using Bucket = std::set<Entry*, ByMemoryThenSm>;
  std::map<int64_t, Bucket> by_sm_;             // free SMs -> schedulable GPUs with that many
  std::set<Entry*, ByMemoryThenSm> by_memory_;  // all schedulable GPUs
};

// "40.0 GiB" (or "512.0 MiB" below 1 GiB): how placement messages print memory.
std::string FormatMemory(int64_t bytes);

}  // namespace flyt::cluster
