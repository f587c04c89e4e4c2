// The cluster manager: Flyt's single public endpoint.
//
// Owns: the live view of the cluster (VMs' required resources, nodes and their
// GPUs, allocations and the usage their servers report), every decision made on
// it (placement, start/stop/resize of a tenant's flyt-server through its node
// manager, restart-or-free when a server dies, node-down detection, automatic
// deallocation of idle shares) and the audit trail of those decisions (events).
// Every change is written through to the Store before it is answered, so a
// restarted manager rebuilds its view from the database and the node managers'
// re-registrations. Must not touch GPUs or processes itself: node managers do.
// A VM with N GPUs has N allocations, one flyt-server per GPU (ordinal 0..N-1, one
// token), placed together by Placement::PlaceGroup: it gets all of them or none, is
// resized, freed and restarted-or-freed as a whole, and its client is told the
// servers' endpoints as one comma-separated list in ordinal order.
// Moving a VM (migration.cc: migrate, checkpoint, restore, migrate-auto, drain-node's
// moves): new servers are started on the target GPUs with the VM's share and token, the
// source node managers tell the old servers to move their sessions there, and only when
// every session of every moved server arrived is the VM's placement switched and the old
// servers stopped; otherwise the sessions that did move are sent back, the targets are
// stopped and the VM runs where it was. A VM moves whole or not at all. The targets are in
// the store (state "migrating") while they move: a cluster manager that restarts mid-move
// finishes or undoes it (RecoverMoves).
// Verbs and fields: docs/control_plane.md.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/metrics_text.h"
#include "cluster/placement.h"
#include "control/channel.h"
#include "store/store.h"

namespace flyt::cluster {

struct ClusterOptions {
  int64_t heartbeat_ms = 1000;             // asked of node managers
  int64_t node_dead_after_heartbeats = 3;  // missed heartbeats before a node is down
  int64_t idle_grace_ms = 300000;          // auto-deallocation; 0 = off
  int64_t max_server_restarts = 3;         // per allocation, then its share is freed
  int64_t node_call_timeout_ms = 30000;    // start-server waits for readiness
  int64_t migrate_wait_ms = 30000;         // a move waits this long for sessions to park
  int64_t rebalance_interval_ms = 0;       // migrate-auto this often; 0 = only when asked
  // A restore on another node ships the checkpoint's files through the cluster manager:
  // at most this many bytes (all servers of the VM together).
  int64_t checkpoint_ship_max_bytes = int64_t{16} << 30;
  PlacementOptions placement;
};

// A restore on another node that the cluster manager's last run left at `stage` (see
// CheckpointRecord::Restoring): true when the restart finishes it, false when it rolls it
// back. Once the waiting processes may have been told the new addresses ("told",
// "restored") it goes on if every target server still runs (a told process does not go back
// to its old server); before that, nothing was promised and it is rolled back.
bool RestoreRecoveryGoesOn(const std::string& stage, bool targets_alive);

class ClusterManager {
 public:
  ClusterManager(ClusterOptions options, std::unique_ptr<store::Store> store,
                 control::Credentials creds);
  ~ClusterManager();

  // Rebuilds the view from the store and starts the monitor thread.
  Status Start();
  void Stop();
  // Answers one request of an authenticated peer (control::Handler).
  control::Json Handle(const control::Peer& peer, const control::Json& request);
  // The cluster in Prometheus text format (/metrics): per node, GPU and tenant,
  // SMs and memory promised and used, sessions, calls, restarts; requests and
  // events since start; allocation latency.
  std::string MetricsText();
  // What the dashboard draws, as JSON: nodes with their GPUs, VMs, tenants'
  // servers and the last 30 events (the list verbs' answers, together).
  std::string DashboardJson();

 private:
  using Clock = std::chrono::steady_clock;
  struct NodeState {
    store::Node row;
    std::vector<store::Gpu> gpus;
    Clock::time_point last_seen;
    // What its servers listen on, "tcp://" or "tls://", as it registered ("" : not said).
    std::string server_scheme;
    std::shared_ptr<std::mutex> call_mu = std::make_shared<std::mutex>();
    std::shared_ptr<std::unique_ptr<control::Channel>> channel =
        std::make_shared<std::unique_ptr<control::Channel>>();
  };
  struct AllocState {
    store::Allocation row;
    control::Json report;  // the server's last ServerReport (sessions, memory_used, ...)
    int restarts = 0;
    bool busy = false;          // a start/stop/resize is in flight: others wait
    bool checkpointed = false;  // its sessions wait in a checkpoint: never idle-freed
  };
  // The last checkpoint of a VM, until restored: where restore finds it by default.
  struct CheckpointRecord {
    std::string dir;
    bool leave_running = false;
    int64_t time_ms = 0;
    std::vector<std::string> alloc_ids, node_ids, gpu_uuids, endpoints;  // by ordinal
    std::string token;  // to start the servers again at the same addresses
    int sm = 0;
    int64_t memory_bytes = 0;
    // A restore of it on another node in flight (RestoreElsewhere), in the store with the
    // record (field "restoring") so that a cluster manager that dies mid-restore finishes or
    // undoes it when it starts again (RecoverRestore). stage: "" (none), then "chosen" (the
    // target allocations recorded), "started" (their servers run), "shipped" (the files are
    // in the target node manager's incoming/<transfer>), "told" (the waiting processes may
    // have been told the new addresses: no way back), "restored" (the new servers restored).
    struct Restoring {
      std::string stage, node, transfer;
      std::vector<std::string> target_ids, target_endpoints, copy_dirs;  // by ordinal
    } restoring;
  };

  // Verbs.
  control::Json HandleVerb(const control::Peer& peer, const control::Json& req);
  control::Json RegisterNode(const control::Peer& peer, const control::Json& req);
  control::Json Heartbeat(const control::Peer& peer, const control::Json& req);
  control::Json ServerExited(const control::Peer& peer, const control::Json& req);
  control::Json RequestAllocation(const std::string& vm_ip);
  control::Json Deallocate(const std::string& vm_ip, const std::string& why);
  control::Json ChangeConfig(const control::Json& req, int direction);  // 0 set, +1 inc, -1 dec
  control::Json ListVms();
  control::Json ListNodes();
  control::Json ListServers();
  control::Json ListEvents(const control::Json& req);
  control::Json Show(const control::Json& req);
  control::Json DrainNode(const control::Json& req, bool drain);
  control::Json VmAdd(const control::Json& req);
  control::Json VmRemove(const control::Json& req);
  control::Json VmImport(const control::Json& req);
  // Session moves (migration.cc).
  control::Json Migrate(const control::Json& req);
  control::Json Checkpoint(const control::Json& req);
  control::Json Restore(const control::Json& req);
  control::Json MigrateAuto(const control::Json& req);
  // A checkpointed process asks (through its client manager) where the server it waits at
  // runs now: {endpoint} ("" while its checkpoint waits for a restore).
  control::Json LocateServer(const control::Json& req);
  // Restore of the recorded checkpoint `rec` on `node` (GPU `gpu`, or any), another node than
  // the one it was taken on: new servers there, the files shipped from the checkpoint's
  // node(s) into the target node manager's run folder, the waiting processes told the new
  // address (LocateServer), the VM switched there once restored. mu_ held, VM not busy.
  control::Json RestoreElsewhere(std::unique_lock<std::mutex>* lock, const std::string& vm_ip,
                                 const CheckpointRecord& rec, const std::string& node,
                                 const std::string& gpu, int64_t wait_ms);
  // Moves the VM's servers for which `moves` is true to GPUs that `filter` allows (the
  // VM's own GPUs are always avoided), all or none: Ok({vm_ip, moved:[...], ...}) or an
  // Error that says why; the VM then runs where it was. `why` goes into the events.
  control::Json MoveVm(const std::string& vm_ip, PlacementFilter filter,
                       const std::function<bool(const store::Allocation&)>& moves,
                       const std::string& why, int64_t wait_ms);
  // Forgets a move's target allocation (its share, its row in the store); the caller stops
  // its server.
  void DropMoveTargetLocked(const std::string& alloc_id);
  // After a restart with moves half done (targets in the store as "migrating"): once their
  // nodes registered again, each move is finished (the target has sessions, or the source is
  // gone) or undone (event migrate-recovered), so the VM runs on exactly one server per GPU.
  void RecoverMoves(std::vector<std::string> targets);
  void RecoverMove(const std::string& target_id);
  // After a restart with a restore on another node half done (its checkpoint record's
  // "restoring"): once the nodes reported, finishes it (the waiting processes may have been
  // told the new addresses and the target servers run) or rolls it back (the target servers
  // stopped, their allocations and the shipped copy dropped, the checkpoint waits as before);
  // event restore-recovered.
  void RecoverRestore(const std::string& vm_ip);
  // Waits until each of `nodes` reported since this run started (or the usual deadline
  // passed); false when stopping.
  bool WaitNodesReported(const std::vector<std::string>& nodes);
  // Before a server that gave its sessions away stops: waits (a few seconds at most) until
  // it has none left, and moves those that came late (a pending order, a process that
  // connected meanwhile) to `to` as well.
  void SettleServer(const std::string& vm_ip, const std::string& node_id,
                    const std::string& alloc_id, const std::string& to, const std::string& token,
                    int64_t wait_ms);
  // One call on a connection of its own (a move may take wait_ms): other calls to the
  // node do not wait behind it.
  control::Json CallNodeAlone(const std::string& node_id, const std::string& verb,
                              const control::Json& args, int64_t timeout_ms, Status* status);
  // Checkpoint records in the store (table checkpoints: they outlive a restart of the
  // cluster manager, and are dropped once restored).
  void LoadCheckpointsLocked(const std::vector<store::Checkpoint>& rows);
  void PersistCheckpointLocked(const std::string& vm_ip, const CheckpointRecord& record);
  void DropCheckpointLocked(const std::string& vm_ip);
  // A restore's old allocations once the VM runs elsewhere: their servers stopped, their
  // share released, their rows deleted.
  void RetireAllocationsLocked(const std::vector<std::string>& ids);
  // What list-vms and show say of a VM's checkpoint waiting for a restore (no token).
  static control::Json CheckpointJson(const CheckpointRecord& record);
  // Restore of a VM that lost its servers: starts them again on the checkpoint's nodes and
  // GPUs, at its endpoints (same port) and with its token, as the VM's allocations. Null on
  // success, else the Error.
  control::Json StartAtCheckpointLocked(std::unique_lock<std::mutex>* lock,
                                        const std::string& vm_ip, const CheckpointRecord& rec);
  // Waits until none of the VM's allocations is busy; false after kBusyWait.
  bool WaitNotBusyLocked(std::unique_lock<std::mutex>* lock, const std::string& vm_ip);
  // What is promised on each node that is up (migrate-auto's measure).
  struct NodeLoad {
    int64_t sm_used = 0, sm_total = 0, memory_used = 0, memory_total = 0;
    // The larger of promised SMs and promised memory over capacity, 0..1 (more when
    // oversubscribed).
    double Load() const;
  };
  std::map<std::string, NodeLoad> NodeLoadsLocked() const;

  // Helpers; names ending in Locked need mu_ held.
  control::Json CallNode(const std::string& node_id, const std::string& verb,
                         const control::Json& args, Status* status);
  void EventLocked(const std::string& kind, const std::string& subject, const std::string& detail);
  void PersistAllocLocked(const AllocState& a);
  // An allocation whose server now serves the VM at `endpoint`: running, not busy, saved.
  void MarkRunningLocked(AllocState& a, const std::string& endpoint);
  void FreeAllocLocked(const std::string& alloc_id);
  // Frees every allocation of the VM; the servers of those other than `except` whose node is
  // up are stopped in the background (the VM runs with all its GPUs or none).
  void FreeVmLocked(const std::string& vm_ip, const std::string& except);
  // The VM's allocations in ordinal order (empty: none).
  std::vector<AllocState*> MembersLocked(const std::string& vm_ip);
  bool AnyBusyLocked(const std::string& vm_ip);
  control::Json AllocJsonLocked(const AllocState& a) const;
  // What a VM's client and the operator see of its allocation: one server's JSON as is; for
  // several GPUs, the servers' fields joined in ordinal order (endpoint "e0,e1", ...) and
  // the servers themselves under "servers".
  control::Json VmAllocJsonLocked(const std::string& vm_ip);
  control::Json NodeJsonLocked(const NodeState& n) const;
  void ApplyReportsLocked(const std::string& node_id, const control::Json& servers, bool adopt);
  void MonitorLoop();
  void ForgetChannelLocked(NodeState* n);
  void StopServerAsync(const std::string& node_id, const std::string& alloc_id);
  static int64_t NowMs();

  ClusterOptions options_;
  std::unique_ptr<store::Store> store_;
  control::Credentials creds_;

  std::mutex mu_;
  std::condition_variable changed_;  // an allocation stopped being busy
  std::map<std::string, store::VmRequirement> vms_;
  std::map<std::string, NodeState> nodes_;
  std::map<std::string, AllocState> allocs_;                   // by alloc_id
  std::map<std::string, std::vector<std::string>> vm_allocs_;  // vm_ip -> alloc_ids, by ordinal
  Placement placement_;
  std::map<std::string, CheckpointRecord> checkpoints_;  // by vm_ip, until restored
  int64_t started_ms_ = 0;                               // Start(), wall clock
  // Checkpoints restored on another node: vm_ip -> {the endpoint its processes waited at ->
  // the server's endpoint now}, for LocateServer.
  std::map<std::string, std::map<std::string, std::string>> relocated_;
  // Servers a move replaced that the last run did not stop (store state "stopping"):
  // alloc_id -> vm_ip, until their node reports them and they are stopped.
  std::map<std::string, std::string> replaced_;
  Clock::time_point last_rebalance_ = Clock::now();
  std::atomic<bool> rebalancing_{false};  // an automatic migrate-auto is running
  // Since start, for /metrics: events by kind, requests by (verb, outcome), and
  // how long allocation requests took to answer.
  std::map<std::string, uint64_t> event_counts_;
  std::map<std::pair<std::string, std::string>, uint64_t> request_counts_;
  Histogram allocation_seconds_{{0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30}};
  // How long a VM's move took (from the plan to the old servers stopped), moves done only.
  Histogram migration_seconds_{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};

  std::atomic<bool> stopping_{false};
  std::thread monitor_;
  std::mutex bg_mu_;
  std::vector<std::thread> background_;
};

}  // namespace flyt::cluster
