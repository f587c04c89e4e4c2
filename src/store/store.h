// The cluster manager's database (docs/control_plane.md, "Database").
//
// Owns: the Flyt schema and its versioned migrations (table schema_migrations),
// and every read and write of vm_required_resources, nodes, gpus, allocations
// and events, on SQLite or PostgreSQL alike (sql_database.h). Thread-safe: one
// mutex serialises all calls. Must not make placement or policy decisions (the
// cluster manager owns those) and must not talk to the network other than the
// database connection.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace flyt::store {

class Database;

// One row of vm_required_resources: what a VM is entitled to.
struct VmRequirement {
  std::string vm_ip, host_ip;
  int compute_units = 0;  // SMs
  double memory_gb = 0;   // column `memory`, GB, as in Flyt's MongoDB collection
  int gpus = 1;           // how many GPUs, each with the share above (one flyt-server each)
};

struct Node {
  std::string node_id, hostname, address, host_ip, state;
  bool mps = false;
  int64_t registered_ms = 0, last_heartbeat_ms = 0;
};

struct Gpu {
  std::string uuid, node_id, name, driver_version, cuda_version;
  int index = 0, sm_count = 0;
  int64_t memory_bytes = 0;
};

// One flyt-server: one GPU of a VM. A VM with N GPUs has N rows, ordinal 0 .. N-1, which
// share the VM's token.
struct Allocation {
  std::string alloc_id, vm_ip, node_id, gpu_uuid, token, endpoint, state;
  int ordinal = 0;  // column gpu_ordinal: the GPU's place in the VM's device list
  int sm = 0;
  int64_t memory_bytes = 0, created_ms = 0, updated_ms = 0, last_client_ms = 0;
};

// The last checkpoint of a VM (flytctl checkpoint), until it is restored. `record` is the
// cluster manager's own description (JSON: the servers' allocation ids, nodes, GPUs,
// endpoints, the token and share), stored as it is.
struct Checkpoint {
  std::string vm_ip, dir, record;
  int64_t time_ms = 0;
};

struct Event {
  int64_t id = 0, time_ms = 0;
  std::string kind, subject, detail;
};

class Store {
 public:
  // url: "sqlite:PATH" (file created, parent dir must exist), "sqlite::memory:", or
  // "postgresql://..." / "postgres://..." (a libpq conninfo URI). Runs pending migrations.
  static Status Open(const std::string& url, std::unique_ptr<Store>* out);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Highest migration applied; "sqlite" or "postgresql".
  int schema_version() const;
  std::string dialect() const;

  // VMs. vm_ip and host_ip must not be empty, compute_units and memory_gb >= 0, gpus >= 1.
  Status UpsertVm(const VmRequirement& vm);
  Status RemoveVm(const std::string& vm_ip, bool* existed);  // existed may be null
  Status GetVm(const std::string& vm_ip, VmRequirement* out, bool* found);
  Status ListVms(std::vector<VmRequirement>* out);  // sorted by vm_ip
  // All rows in one transaction (nothing is written if one is invalid); when a
  // vm_ip appears twice the later entry wins.
  Status UpsertVms(const std::vector<VmRequirement>& vms);

  // Nodes and their GPUs. ReplaceGpus makes `gpus` the node's whole GPU list in
  // one transaction (each Gpu's node_id is taken from `node_id`).
  Status UpsertNode(const Node& node);
  Status ListNodes(std::vector<Node>* out);  // sorted by node_id
  Status ReplaceGpus(const std::string& node_id, const std::vector<Gpu>& gpus);
  Status ListGpus(std::vector<Gpu>* out);  // sorted by node_id, then index

  // Allocations: PutAllocation inserts or updates by alloc_id; deleting an
  // unknown alloc_id is not an error.
  Status PutAllocation(const Allocation& alloc);
  Status DeleteAllocation(const std::string& alloc_id);
  Status ListAllocations(std::vector<Allocation>* out);  // sorted by alloc_id

  // Checkpoints, one per VM: PutCheckpoint inserts or replaces by vm_ip; deleting an
  // unknown one is not an error.
  Status PutCheckpoint(const Checkpoint& checkpoint);
  Status DeleteCheckpoint(const std::string& vm_ip);
  Status ListCheckpoints(std::vector<Checkpoint>* out);  // sorted by vm_ip

  // Event log. AddEvent stamps the current time; ListEvents returns events with
  // id > after_id in ascending id order, at most `limit` (limit <= 0: all).
  Status AddEvent(const std::string& kind, const std::string& subject, const std::string& detail);
  Status ListEvents(int64_t after_id, int limit, std::vector<Event>* out);

 private:
  explicit Store(std::unique_ptr<Database> db);
  Status Migrate();
  Status UpsertVmBatch(const std::vector<const VmRequirement*>& batch);

  mutable std::mutex mu_;
  std::unique_ptr<Database> db_;
  int schema_version_ = 0;
};

}  // namespace flyt::store
