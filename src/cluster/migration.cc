// The cluster manager's session moves: migrate, checkpoint, restore, migrate-auto and the
// moves of drain-node (see cluster_manager.h and docs/control_plane.md).
//
// A move never leaves a VM half moved: the target servers are started first (same share,
// same token), then each source server is told to move its sessions to its target and the
// answers are read; only when every session of every moved server arrived is the VM's
// placement switched (store and client manager answers) and the old servers stopped.
// Otherwise the sessions that did move are sent back to where they came from, the targets
// are stopped and their shares freed, and the error says why. The targets are in the store
// (state "migrating") while they move, so a cluster manager that dies mid-move finishes or
// rolls it back when it starts again (RecoverMoves). A checkpoint is restored where it was
// taken, or on another node with its files shipped there through the node managers
// (RestoreElsewhere); its waiting processes then ask where to go (LocateServer).
#include <algorithm>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "cluster/cluster_manager.h"
#include "cluster/gpu_group.h"
#include "common/log.h"

namespace flyt::cluster {
namespace {

// The UUID of a node's GPU given by UUID or index; otherwise why not, naming the node's GPUs.
std::string FindNodeGpu(const std::vector<store::Gpu>& gpus, const std::string& node,
                        const std::string& asked, std::string* uuid) {
  std::string known;
  for (const auto& g : gpus) {
    if (g.uuid == asked || std::to_string(g.index) == asked) *uuid = g.uuid;
    known += (known.empty() ? "" : ", ") + std::to_string(g.index) + " " + g.uuid;
  }
  if (!uuid->empty()) return "";
  return "node " + node + " has no GPU '" + asked +
         "' (it has: " + (known.empty() ? "none" : known) + ")";
}

using control::Error;
using control::Json;
using control::Ok;

constexpr auto kBusyWait = std::chrono::seconds(60);
// Beyond wait_ms: how long a node manager and its server may take to answer a move.
constexpr int64_t kAnswerMarginMs = 20000;
constexpr int64_t kMaxWaitMs = 10 * 60 * 1000;
// After a move, before the old server stops: polls of its session count (every
// kSettlePollMs), and rounds of moving sessions that arrived late.
constexpr int kSettlePolls = 50;
constexpr int kSettlePollMs = 100;
constexpr int kSettleRounds = 2;

std::string Str(const Json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t Int(const Json& j, const char* name, int64_t fallback = 0) {
  if (!j.is_object()) return fallback;
  auto it = j.find(name);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : fallback;
}

bool Bool(const Json& j, const char* name, bool fallback) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string Percent(double load) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f%%", load * 100.0);
  return buf;
}

std::string Sessions(int64_t n) { return std::to_string(n) + (n == 1 ? " session" : " sessions"); }

// Test hook (FLYT_TEST_CRASH_AT=POINT): the cluster manager dies here as with kill -9, so a
// test can restart it with a move half done. Points: "migrate-started" (the targets run,
// no session was asked to move), "migrate-moved" (the sessions moved, the placement is not
// switched yet), "migrate-switched" (switched, the old servers not stopped yet). A restore
// on another node (RestoreElsewhere): "restore-chosen" (the target allocations recorded,
// nothing started), "restore-started" (the target servers run, no file shipped),
// "restore-shipped" (the files are on the target node, no process told),
// "restore-told" (the waiting processes may ask and get the new addresses, nothing restored
// yet), "restore-restored" (the new servers restored the files, the VM not switched yet).
void CrashPoint(const char* point) {
  const char* at = std::getenv("FLYT_TEST_CRASH_AT");
  if (at == nullptr || std::strcmp(at, point) != 0) return;
  FLYT_ERROR("FLYT_TEST_CRASH_AT=%s: the cluster manager dies here (test hook)", point);
  std::raise(SIGKILL);
}

// "tcp://" or "tls://" (the kinds of server a session moves between), else empty.
std::string Scheme(const std::string& endpoint) {
  for (const char* s : {"tcp://", "tls://"}) {
    if (endpoint.rfind(s, 0) == 0) return s;
  }
  return "";
}

// The folder of a checkpoint that holds the sessions of the VM's server of this ordinal.
std::string GpuDir(const std::string& dir, int ordinal) {
  return dir + "/gpu" + std::to_string(ordinal);
}

// One server's part of a VM-wide checkpoint or restore: the server, its folder DIR/gpuN,
// and what its node manager answered (undo: a checkpoint's restore after a failure).
struct ServerCall {
  std::string alloc_id, node_id, endpoint, dir;
  int ordinal = 0;
  Status status, undo;
  Json answer, undo_answer;
};

ServerCall CallFor(const store::Allocation& row, const std::string& dir) {
  ServerCall c;
  c.alloc_id = row.alloc_id;
  c.node_id = row.node_id;
  c.endpoint = row.endpoint;
  c.ordinal = row.ordinal;
  c.dir = GpuDir(dir, c.ordinal);
  return c;
}

// Why `verb` cannot run for a VM whose server is not running.
std::string NotRunning(const std::string& verb, const std::string& vm_ip,
                       const store::Allocation& row) {
  return "cannot " + verb + " VM " + vm_ip + ": its server " + row.alloc_id + " on node " +
         row.node_id + " is " + row.state;
}

int64_t WaitMsOf(const Json& req, int64_t fallback) {
  auto it = req.find("wait_ms");
  if (it == req.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return fallback;
  return std::min(it->get<int64_t>(), kMaxWaitMs);
}

// What went wrong in a server's answer to migrate (done_key "moved") or checkpoint
// ("checkpointed"): empty when every session asked was done.
std::string MoveProblem(const Json& answer, const char* done_key) {
  const int64_t asked = Int(answer, "asked"), done = Int(answer, done_key),
                stayed = Int(answer, "stayed"), pending = Int(answer, "pending");
  if (done == asked && stayed == 0 && pending == 0) return "";
  std::string why;
  for (const Json& s : answer.value("sessions", Json::array())) {
    if (s.value("ok", false)) continue;
    why += (why.empty() ? "" : "; ") + std::string("session ") +
           std::to_string(s.value("session", uint64_t{0})) + ": " + s.value("message", "");
  }
  if (pending > 0) {
    why += (why.empty() ? "" : "; ") + Sessions(pending) +
           " did not park in time (the process made no call within wait_ms)";
  }
  return std::to_string(asked) + " asked, " + std::to_string(done) + " " + done_key + ", " +
         std::to_string(stayed) + " stayed" + (why.empty() ? "" : " (" + why + ")");
}

// What went wrong in a server's answer to restore: empty when every file was restored.
std::string RestoreProblem(const Json& answer) {
  const int64_t files = Int(answer, "files"), restored = Int(answer, "restored");
  std::string why;
  for (const Json& f : answer.value("failed", Json::array()))
    why += (why.empty() ? "" : "; ") + f.value("file", "") + ": " + f.value("message", "");
  for (const Json& s : answer.value("sessions", Json::array())) {
    if (!s.value("ok", false)) why += (why.empty() ? "" : "; ") + s.value("message", "");
  }
  if (restored == files && why.empty() && Int(answer, "pending") == 0) return "";
  return std::to_string(files) + " file(s), " + std::to_string(restored) + " restored" +
         (why.empty() ? "" : " (" + why + ")");
}

}  // namespace

double ClusterManager::NodeLoad::Load() const {
  const double sm = sm_total > 0 ? static_cast<double>(sm_used) / sm_total : 0.0;
  const double mem = memory_total > 0 ? static_cast<double>(memory_used) / memory_total : 0.0;
  return std::max(sm, mem);
}

std::map<std::string, ClusterManager::NodeLoad> ClusterManager::NodeLoadsLocked() const {
  std::map<std::string, NodeLoad> out;
  for (const auto& [id, n] : nodes_) {
    if (n.row.state != "up" || n.gpus.empty()) continue;
    NodeLoad& l = out[id];
    for (const auto& g : n.gpus) {
      l.sm_total += g.sm_count;
      l.memory_total += g.memory_bytes;
      if (const GpuUsage* u = placement_.Find(g.uuid)) {
        l.sm_used += u->sm_used;
        l.memory_used += u->memory_used;
      }
    }
  }
  return out;
}

bool ClusterManager::WaitNotBusyLocked(std::unique_lock<std::mutex>* lock,
                                       const std::string& vm_ip) {
  auto deadline = Clock::now() + kBusyWait;
  while (AnyBusyLocked(vm_ip)) {
    if (changed_.wait_until(*lock, deadline) == std::cv_status::timeout) return false;
  }
  return true;
}

Json ClusterManager::CallNodeAlone(const std::string& node_id, const std::string& verb,
                                   const Json& args, int64_t timeout_ms, Status* status) {
  std::string address;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) {
      *status = Status::Error("unknown node " + node_id);
      return Json();
    }
    if (it->second.row.state == "down") {
      *status = Status::Error("node " + node_id + " is down");
      return Json();
    }
    address = it->second.row.address;
  }
  std::unique_ptr<control::Channel> channel;
  Status s = control::Channel::Dial(address, creds_, "cluster", "cluster-manager", 5000, &channel);
  if (!s.ok()) {
    *status = Status::Error("node " + node_id + " unreachable: " + s.message());
    return Json();
  }
  Json answer;
  s = channel->Call(verb, args, &answer, static_cast<int>(timeout_ms));
  channel->Close();
  *status = s.ok() || (answer.is_object() && answer.contains("ok"))
                ? s
                : Status::Error("node " + node_id + ": " + s.message());
  return answer;
}

// ---------------------------------------------------------------- checkpoint records

void ClusterManager::LoadCheckpointsLocked(const std::vector<store::Checkpoint>& rows) {
  for (const store::Checkpoint& row : rows) {
    Json j = Json::parse(row.record, nullptr, /*allow_exceptions=*/false);
    CheckpointRecord r;
    r.dir = row.dir;
    r.time_ms = row.time_ms;
    if (j.is_object()) {
      r.leave_running = Bool(j, "leave_running", false);
      r.token = Str(j, "token");
      r.sm = static_cast<int>(Int(j, "sm"));
      r.memory_bytes = Int(j, "memory_bytes");
      for (const Json& srv : j.value("servers", Json::array())) {
        r.alloc_ids.push_back(Str(srv, "alloc_id"));
        r.node_ids.push_back(Str(srv, "node_id"));
        r.gpu_uuids.push_back(Str(srv, "gpu_uuid"));
        r.endpoints.push_back(Str(srv, "endpoint"));
      }
      const Json rs = j.value("restoring", Json::object());
      if (rs.is_object() && !Str(rs, "stage").empty()) {
        r.restoring.stage = Str(rs, "stage");
        r.restoring.node = Str(rs, "node_id");
        r.restoring.transfer = Str(rs, "transfer");
        for (const Json& t : rs.value("targets", Json::array())) {
          r.restoring.target_ids.push_back(Str(t, "alloc_id"));
          r.restoring.target_endpoints.push_back(Str(t, "endpoint"));
          r.restoring.copy_dirs.push_back(Str(t, "dir"));
        }
      }
    }
    if (r.endpoints.empty()) {
      FLYT_WARN("ignoring the stored checkpoint of VM %s: unreadable record", row.vm_ip.c_str());
      continue;
    }
    // Its processes still wait (unless they went on running): the servers are not idle.
    for (const std::string& id : r.alloc_ids) {
      if (auto it = allocs_.find(id); it != allocs_.end() && !r.leave_running) {
        it->second.checkpointed = true;
      }
    }
    checkpoints_[row.vm_ip] = std::move(r);
  }
}

void ClusterManager::PersistCheckpointLocked(const std::string& vm_ip, const CheckpointRecord& r) {
  Json servers = Json::array();
  for (size_t i = 0; i < r.endpoints.size(); ++i) {
    servers.push_back(Json{{"alloc_id", r.alloc_ids[i]},
                           {"node_id", r.node_ids[i]},
                           {"gpu_uuid", r.gpu_uuids[i]},
                           {"endpoint", r.endpoints[i]}});
  }
  Json record{{"leave_running", r.leave_running},
              {"token", r.token},
              {"sm", r.sm},
              {"memory_bytes", r.memory_bytes},
              {"servers", servers}};
  if (!r.restoring.stage.empty()) {
    const CheckpointRecord::Restoring& rs = r.restoring;
    Json targets = Json::array();
    for (size_t i = 0; i < rs.target_ids.size(); ++i) {
      targets.push_back(
          Json{{"alloc_id", rs.target_ids[i]},
               {"endpoint", i < rs.target_endpoints.size() ? rs.target_endpoints[i] : ""},
               {"dir", i < rs.copy_dirs.size() ? rs.copy_dirs[i] : ""}});
    }
    record["restoring"] = Json{
        {"stage", rs.stage}, {"node_id", rs.node}, {"transfer", rs.transfer}, {"targets", targets}};
  }
  Status s = store_->PutCheckpoint({vm_ip, r.dir, record.dump(), r.time_ms});
  if (!s.ok()) {
    FLYT_ERROR("cannot store the checkpoint of VM %s: %s", vm_ip.c_str(), s.message().c_str());
  }
}

Json ClusterManager::CheckpointJson(const CheckpointRecord& r) {
  return Json{{"dir", r.dir},
              {"time_ms", r.time_ms},
              {"leave_running", r.leave_running},
              {"node_id", JoinEndpoints(DistinctNodes(r.node_ids))},
              {"endpoint", JoinEndpoints(r.endpoints)}};
}

void ClusterManager::RetireAllocationsLocked(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    auto it = allocs_.find(id);
    if (it == allocs_.end()) continue;
    StopServerAsync(it->second.row.node_id, id);
    placement_.Release(it->second.row.gpu_uuid, it->second.row.sm, it->second.row.memory_bytes);
    Status s = store_->DeleteAllocation(id);
    if (!s.ok()) FLYT_ERROR("cannot delete allocation %s: %s", id.c_str(), s.message().c_str());
    allocs_.erase(it);
  }
}

void ClusterManager::DropCheckpointLocked(const std::string& vm_ip) {
  if (checkpoints_.erase(vm_ip) == 0) return;
  Status s = store_->DeleteCheckpoint(vm_ip);
  if (!s.ok()) {
    FLYT_ERROR("cannot delete the checkpoint of VM %s: %s", vm_ip.c_str(), s.message().c_str());
  }
}

// ---------------------------------------------------------------- moving a VM

void ClusterManager::SettleServer(const std::string& vm_ip, const std::string& node_id,
                                  const std::string& alloc_id, const std::string& to,
                                  const std::string& token, int64_t wait_ms) {
  for (int round = 0; round < kSettleRounds; ++round) {
    int64_t left = -1;
    for (int poll = 0; poll < kSettlePolls; ++poll) {
      Status ls;
      Json servers = CallNode(node_id, "list-servers", Json::object(), &ls);
      left = 0;
      for (const Json& r : servers.value("servers", Json::array())) {
        if (Str(r, "alloc_id") == alloc_id) left = Int(r, "sessions");
      }
      if (!ls.ok() || left == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(kSettlePollMs));
    }
    if (left <= 0) return;
    Status again;
    Json a = CallNodeAlone(
        node_id, "migrate",
        Json{{"alloc_id", alloc_id}, {"to", to}, {"token", token}, {"wait_ms", wait_ms}},
        wait_ms + kAnswerMarginMs, &again);
    FLYT_INFO("VM %s: %lld session(s) still on %s moved to %s: %s", vm_ip.c_str(),
              static_cast<long long>(left), alloc_id.c_str(), to.c_str(),
              again.ok() ? MoveProblem(a, "moved").c_str() : again.message().c_str());
  }
}

Json ClusterManager::MoveVm(const std::string& vm_ip, PlacementFilter filter,
                            const std::function<bool(const store::Allocation&)>& moves,
                            const std::string& why, int64_t wait_ms) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  auto fail = [&](const std::string& code, const std::string& message) {  // mu_ held
    EventLocked("migrate-failed", vm_ip, message + " [" + why + "]");
    return Error(code, message);
  };
  if (!vms_.count(vm_ip)) return Error("unknown_vm", "unknown VM " + vm_ip);
  if (!WaitNotBusyLocked(&lock, vm_ip)) {
    return fail("internal", "VM " + vm_ip + " stays busy (another change is in flight); try again");
  }
  std::vector<AllocState*> members = MembersLocked(vm_ip);
  if (members.empty()) {
    return Error("unknown_allocation", "VM " + vm_ip +
                                           " has no server to move (it is placed when its next "
                                           "client asks)");
  }
  for (const AllocState* a : members) {
    if (a->row.state != "running") {
      return fail("server_failed", "cannot move VM " + vm_ip + ": its server " + a->row.alloc_id +
                                       " on node " + a->row.node_id + " is " + a->row.state);
    }
    if (a->checkpointed) {
      return fail("bad_request", "cannot move VM " + vm_ip +
                                     ": its processes wait in a checkpoint; `flytctl restore "
                                     "--vm " +
                                     vm_ip +
                                     "` first (with --node NODE it is restored on that node)");
    }
  }
  struct Move {
    int ordinal = 0;
    std::string from_id, from_node, from_gpu, from_endpoint;
    std::string to_id, to_node, to_gpu, to_endpoint;
    Status start, migrate, back;
    Json answer, back_answer;
  };
  std::vector<Move> mv;
  std::vector<std::string> member_ids;
  for (const AllocState* a : members) {
    member_ids.push_back(a->row.alloc_id);
    filter.avoid_gpus.insert(a->row.gpu_uuid);  // never onto one of its own GPUs
    if (!moves(a->row)) continue;
    Move m;
    m.ordinal = a->row.ordinal;
    m.from_id = a->row.alloc_id;
    m.from_node = a->row.node_id;
    m.from_gpu = a->row.gpu_uuid;
    m.from_endpoint = a->row.endpoint;
    mv.push_back(std::move(m));
  }
  std::vector<std::string> where;
  for (const AllocState* a : members) where.push_back(a->row.node_id);
  if (mv.empty()) {
    return Error("bad_request", "VM " + vm_ip + " has nothing to move: it is on " +
                                    DescribeGpuNodes(where) + " already");
  }
  const size_t n = members.size(), k = mv.size();
  const std::string gpu_of = n > 1 ? " of " + std::to_string(n) : "";
  // Sessions move only between servers of one kind: nodes that said they start the other
  // kind are left out (an explicit target among them is refused saying so).
  const std::string kind = Scheme(mv[0].from_endpoint);
  std::string other_kind;
  for (const auto& [id, ns] : nodes_) {
    if (kind.empty() || ns.server_scheme.empty() || ns.server_scheme == kind) continue;
    filter.avoid_nodes.insert(id);
    if (filter.nodes.count(id)) other_kind = id;
  }
  if (!other_kind.empty()) {
    return fail("bad_request", "cannot move VM " + vm_ip + " to node " + other_kind +
                                   ": its servers listen on " + nodes_[other_kind].server_scheme +
                                   " and the VM's on " + kind +
                                   "; sessions move only between servers of the same kind (set "
                                   "server_tls alike on both nodes)");
  }
  const store::VmRequirement& vm = vms_[vm_ip];
  PlacementRequest pr{vm_ip, vm.host_ip, members[0]->row.sm, members[0]->row.memory_bytes};
  std::vector<std::string> gpus;
  bool one_node = false;
  Status s = placement_.PlaceGroup(pr, static_cast<int>(k), &gpus, &one_node, &filter);
  if (!s.ok()) {
    return fail("no_capacity", "cannot move VM " + vm_ip + ": " + s.message() +
                                   "; nothing was started, the VM stays where it is");
  }
  for (const Move& m : mv) {
    if (Scheme(m.from_endpoint).empty()) {
      return fail("bad_request", "cannot move VM " + vm_ip + ": its server at " + m.from_endpoint +
                                     " is neither a tcp:// nor a tls:// server (sessions move "
                                     "over tcp:// or tls:// only)");
    }
  }
  // The target allocations: the VM's share and token, the moved server's ordinal. They join
  // the VM (and the store) only when the move is done.
  const std::string token = members[0]->row.token;
  const int64_t now = NowMs();
  std::vector<Json> starts(k);
  std::string plan;
  for (size_t j = 0; j < k; ++j) {
    Move& m = mv[j];
    const AllocState& src = allocs_[m.from_id];
    AllocState t;
    t.busy = true;
    t.row = src.row;
    t.row.alloc_id = "a-" + control::RandomHex(6);
    t.row.node_id = placement_.Find(gpus[j])->capacity.node_id;
    t.row.gpu_uuid = gpus[j];
    t.row.state = "migrating";
    t.row.endpoint.clear();
    t.row.created_ms = t.row.updated_ms = now;
    placement_.Reserve(gpus[j], t.row.sm, t.row.memory_bytes);
    m.to_id = t.row.alloc_id;
    m.to_node = t.row.node_id;
    m.to_gpu = gpus[j];
    starts[j] = Json{{"alloc_id", m.to_id},
                     {"gpu_uuid", m.to_gpu},
                     {"sm", t.row.sm},
                     {"memory_bytes", t.row.memory_bytes},
                     {"token", token}};
    // In the store as "migrating" (not a member of the VM yet): a cluster manager that
    // restarts with the move half done finds it there and finishes or undoes it
    // (RecoverMoves).
    PersistAllocLocked(t);
    allocs_[t.row.alloc_id] = std::move(t);
    plan += (plan.empty() ? "" : "; ") +
            (n > 1 ? "GPU " + std::to_string(m.ordinal) + gpu_of + ": " : std::string()) + "node " +
            m.from_node + " (" + m.from_gpu + ") -> node " + m.to_node + " (" + m.to_gpu + ", " +
            m.to_id + ")";
  }
  for (AllocState* a : members) a->busy = true;
  EventLocked("migrate-asked", vm_ip, "moving VM " + vm_ip + ": " + plan + " [" + why + "]");
  lock.unlock();

  // 1. The targets start (all of them, or the move stops here).
  RunEach(k, [&](size_t j) {
    Json a = CallNode(mv[j].to_node, "start-server", starts[j], &mv[j].start);
    mv[j].to_endpoint = Str(a, "endpoint");
  });
  lock.lock();
  for (const Move& m : mv) {
    if (auto it = allocs_.find(m.to_id); it != allocs_.end() && m.start.ok()) {
      it->second.row.endpoint = m.to_endpoint;  // where a recovery sends sessions back from
      PersistAllocLocked(it->second);
    }
  }
  lock.unlock();
  CrashPoint("migrate-started");
  std::string failure;
  for (const Move& m : mv) {
    if (!failure.empty()) break;
    if (!m.start.ok()) {
      failure = "the target server on node " + m.to_node + " did not start: " + m.start.message();
    } else if (Scheme(m.to_endpoint) != Scheme(m.from_endpoint)) {
      // A process that talks TLS to its server must not go on in the clear, and one that
      // talks plain TCP may have no CA to check a TLS server with.
      failure = "the target server listens at " + m.to_endpoint + " but the VM's server at " +
                m.from_endpoint + " is " + Scheme(m.from_endpoint) +
                ": sessions move only between servers of the same kind (set server_tls alike "
                "on node " +
                m.from_node + " and node " + m.to_node + ")";
    }
  }
  // 2. Each source server moves its sessions to its target.
  if (failure.empty()) {
    RunEach(k, [&](size_t j) {
      Move& m = mv[j];
      m.answer = CallNodeAlone(m.from_node, "migrate",
                               Json{{"alloc_id", m.from_id},
                                    {"to", m.to_endpoint},
                                    {"token", token},
                                    {"wait_ms", wait_ms}},
                               wait_ms + kAnswerMarginMs, &m.migrate);
      if (m.migrate.ok()) {
        std::string p = MoveProblem(m.answer, "moved");
        if (!p.empty()) m.migrate = Status::Error(p);
      }
    });
    for (const Move& m : mv) {
      if (m.migrate.ok()) continue;
      failure = "the server on node " + m.from_node +
                (n > 1 ? " (GPU " + std::to_string(m.ordinal) + gpu_of + ")" : std::string()) +
                " did not move all its sessions: " + m.migrate.message();
      break;
    }
    if (failure.empty()) CrashPoint("migrate-moved");
  }
  if (!failure.empty()) {
    // 3a. Undo: the sessions that did move go back, then the targets are stopped.
    RunEach(k, [&](size_t j) {
      Move& m = mv[j];
      if (Int(m.answer, "moved") > 0) {
        m.back_answer = CallNodeAlone(m.to_node, "migrate",
                                      Json{{"alloc_id", m.to_id},
                                           {"to", m.from_endpoint},
                                           {"token", token},
                                           {"wait_ms", wait_ms}},
                                      wait_ms + kAnswerMarginMs, &m.back);
        if (m.back.ok()) {
          std::string p = MoveProblem(m.back_answer, "moved");
          if (!p.empty()) m.back = Status::Error(p);
        }
      }
      if (m.start.ok()) {
        // A session whose order was still pending when the move was given up may arrive
        // at the target late: it goes back too before the target stops.
        SettleServer(vm_ip, m.to_node, m.to_id, m.from_endpoint, token, wait_ms);
        Status st;
        CallNode(m.to_node, "stop-server", Json{{"alloc_id", m.to_id}}, &st);
        if (!st.ok()) {
          FLYT_WARN("stop-server %s on %s: %s", m.to_id.c_str(), m.to_node.c_str(),
                    st.message().c_str());
        }
      }
    });
    std::string undo;
    for (const Move& m : mv) {
      const int64_t moved = Int(m.answer, "moved");
      if (moved == 0) continue;
      undo += "; " + Sessions(moved) + " that had moved to node " + m.to_node +
              (m.back.ok() ? " went back" : " could not go back (" + m.back.message() + ")");
    }
    lock.lock();
    for (const Move& m : mv) DropMoveTargetLocked(m.to_id);
    for (const std::string& id : member_ids) {
      if (auto it = allocs_.find(id); it != allocs_.end()) it->second.busy = false;
    }
    changed_.notify_all();
    return fail("server_failed", "moving VM " + vm_ip + " failed: " + failure + undo +
                                     "; the VM runs where it was and the target allocation" +
                                     (k > 1 ? "s were" : " was") + " released");
  }
  // 3b. Done: the targets take the moved servers' places (ordinal, store, client answers);
  // the old servers are stopped.
  lock.lock();
  bool intact = true;
  for (const std::string& id : member_ids) intact = intact && allocs_.count(id);
  for (const Move& m : mv) intact = intact && allocs_.count(m.to_id);
  if (!intact) {
    // The VM was freed meanwhile (a server died for good): the new servers go too.
    for (const Move& m : mv) {
      DropMoveTargetLocked(m.to_id);
      StopServerAsync(m.to_node, m.to_id);
    }
    for (const std::string& id : member_ids) {
      if (auto it = allocs_.find(id); it != allocs_.end()) it->second.busy = false;
    }
    changed_.notify_all();
    return fail("server_failed", "VM " + vm_ip + " lost a server while it moved; nothing kept");
  }
  std::vector<std::string>& ids = vm_allocs_[vm_ip];
  Json moved = Json::array();
  int64_t sessions = 0;
  std::string done;
  for (const Move& m : mv) {
    // The old server is "stopping" in the store before the target is "running": a cluster
    // manager that restarts in between finds one server of this GPU (and stops the other).
    AllocState& from = allocs_[m.from_id];
    from.row.state = "stopping";  // stays busy until stopped and freed
    from.row.updated_ms = NowMs();
    PersistAllocLocked(from);
    MarkRunningLocked(allocs_[m.to_id], m.to_endpoint);
    std::replace(ids.begin(), ids.end(), m.from_id, m.to_id);
    sessions += Int(m.answer, "moved");
    moved.push_back(Json{{"ordinal", m.ordinal},
                         {"from_alloc_id", m.from_id},
                         {"from_node", m.from_node},
                         {"from_gpu", m.from_gpu},
                         {"from_endpoint", m.from_endpoint},
                         {"alloc_id", m.to_id},
                         {"node_id", m.to_node},
                         {"gpu_uuid", m.to_gpu},
                         {"endpoint", m.to_endpoint},
                         {"sessions", Int(m.answer, "moved")}});
    done += (done.empty() ? "" : "; ") +
            (n > 1 ? "GPU " + std::to_string(m.ordinal) + ": " : std::string()) + "node " +
            m.from_node + " -> node " + m.to_node + " at " + m.to_endpoint;
  }
  for (const std::string& id : member_ids) {
    AllocState& a = allocs_[id];
    if (a.row.state != "stopping") a.busy = false;
  }
  std::vector<std::string> now_nodes;
  for (const AllocState* a : MembersLocked(vm_ip)) now_nodes.push_back(a->row.node_id);
  EventLocked("migrate-done", vm_ip,
              "VM " + vm_ip + " moved (" + Sessions(sessions) + "): " + done + "; now " +
                  DescribeGpuNodes(now_nodes) + ", new processes get " +
                  VmAllocJsonLocked(vm_ip).value("endpoint", "") + " [" + why + "]");
  Json result{{"vm_ip", vm_ip},
              {"moved", moved},
              {"sessions", sessions},
              {"allocation", VmAllocJsonLocked(vm_ip)}};
  changed_.notify_all();
  lock.unlock();
  CrashPoint("migrate-switched");
  RunEach(k, [&](size_t j) {
    // A moved session's worker answers its client (go to the target) just after it
    // reported: stop the old server once it has no session left. A process that connected
    // to it after the move began (it asked for the endpoint before) is moved too.
    SettleServer(vm_ip, mv[j].from_node, mv[j].from_id, mv[j].to_endpoint, token, wait_ms);
    Status st;
    CallNode(mv[j].from_node, "stop-server", Json{{"alloc_id", mv[j].from_id}}, &st);
    if (!st.ok()) {
      FLYT_WARN("stop-server %s on %s after its move: %s", mv[j].from_id.c_str(),
                mv[j].from_node.c_str(), st.message().c_str());
    }
  });
  lock.lock();
  for (const Move& m : mv) {
    if (auto it = allocs_.find(m.from_id); it != allocs_.end()) it->second.busy = false;
    FreeAllocLocked(m.from_id);
  }
  changed_.notify_all();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  migration_seconds_.Observe(seconds);
  result["seconds"] = seconds;
  return Ok(result);
}

// ---------------------------------------------------------------- a restart mid-move

void ClusterManager::DropMoveTargetLocked(const std::string& alloc_id) {
  auto it = allocs_.find(alloc_id);
  if (it == allocs_.end()) return;
  placement_.Release(it->second.row.gpu_uuid, it->second.row.sm, it->second.row.memory_bytes);
  Status s = store_->DeleteAllocation(alloc_id);
  if (!s.ok()) FLYT_ERROR("cannot delete allocation %s: %s", alloc_id.c_str(), s.message().c_str());
  allocs_.erase(it);
  changed_.notify_all();
}

bool RestoreRecoveryGoesOn(const std::string& stage, bool targets_alive) {
  return targets_alive && (stage == "told" || stage == "restored");
}

void ClusterManager::RecoverMoves(std::vector<std::string> targets) {
  // Restores on another node first (their targets are theirs to settle, all at once).
  std::vector<std::string> restoring;
  std::set<std::string> theirs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [vm_ip, rec] : checkpoints_) {
      if (rec.restoring.stage.empty()) continue;
      restoring.push_back(vm_ip);
      theirs.insert(rec.restoring.target_ids.begin(), rec.restoring.target_ids.end());
    }
  }
  for (const std::string& vm_ip : restoring) {
    if (stopping_.load()) return;
    RecoverRestore(vm_ip);
  }
  for (const std::string& id : targets) {
    if (stopping_.load()) return;
    if (!theirs.count(id)) RecoverMove(id);
  }
}

bool ClusterManager::WaitNodesReported(const std::vector<std::string>& nodes) {
  // A node that registered again lists its servers; one that does not within the usual
  // deadline counts as having lost them.
  const int64_t deadline_ms = NowMs() +
                              options_.heartbeat_ms * options_.node_dead_after_heartbeats +
                              options_.node_call_timeout_ms;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool all = true;
      for (const std::string& node : nodes) {
        auto it = nodes_.find(node);
        all = all && (node.empty() ||
                      (it != nodes_.end() && it->second.row.last_heartbeat_ms >= started_ms_));
      }
      if (all) return true;
    }
    if (stopping_.load()) return false;
    if (NowMs() >= deadline_ms) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void ClusterManager::RecoverRestore(const std::string& vm_ip) {
  CheckpointRecord rec;
  std::vector<std::string> old_ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = checkpoints_.find(vm_ip);
    if (r == checkpoints_.end() || r->second.restoring.stage.empty()) return;
    rec = r->second;
    for (AllocState* a : MembersLocked(vm_ip)) old_ids.push_back(a->row.alloc_id);
  }
  const CheckpointRecord::Restoring& rs = rec.restoring;
  const std::string& node = rs.node;
  const size_t n = rs.target_ids.size();
  std::vector<std::string> nodes = DistinctNodes(rec.node_ids);
  nodes.push_back(node);
  if (!WaitNodesReported(nodes)) return;
  // What the target node runs of the restore's servers.
  struct Side {
    bool alive = false;
    int64_t sessions = 0;
    std::string endpoint;
  };
  std::vector<Side> to(n);
  {
    Status ls;
    Json servers = CallNode(node, "list-servers", Json::object(), &ls);
    for (const Json& srv : servers.value("servers", Json::array())) {
      for (size_t i = 0; i < n; ++i) {
        if (Str(srv, "alloc_id") != rs.target_ids[i]) continue;
        to[i].alive = Str(srv, "state") == "running" || Str(srv, "state") == "starting";
        to[i].sessions = Int(srv, "sessions");
        to[i].endpoint = Str(srv, "endpoint");
      }
    }
  }
  bool alive = n == rec.endpoints.size() && n > 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; ++i) {
      if (to[i].endpoint.empty() && i < rs.target_endpoints.size())
        to[i].endpoint = rs.target_endpoints[i];
      alive = alive && to[i].alive && !to[i].endpoint.empty() && allocs_.count(rs.target_ids[i]);
    }
  }
  const bool on = RestoreRecoveryGoesOn(rs.stage, alive);
  const int64_t wait_ms = options_.migrate_wait_ms;
  const std::string from = JoinEndpoints(DistinctNodes(rec.node_ids));
  const std::string head = "the cluster manager restarted while VM " + vm_ip + "'s checkpoint " +
                           rec.dir + " (node " + from + ") was being restored on node " + node +
                           " (stage " + rs.stage + ")";
  std::string detail;
  if (on) {
    // The processes may have been told: they go on there. Those that ask now are told too,
    // and a server that had not restored its files yet restores them now.
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < n; ++i) {
        for (auto& [old, now] : relocated_[vm_ip]) {
          if (now == rec.endpoints[i]) now = to[i].endpoint;
        }
        relocated_[vm_ip][rec.endpoints[i]] = to[i].endpoint;
      }
    }
    int64_t sessions = 0, restored = 0;
    std::string problems;
    for (size_t i = 0; i < n; ++i) {
      sessions += to[i].sessions;
      const std::string dir = i < rs.copy_dirs.size() ? rs.copy_dirs[i] : "";
      if (to[i].sessions > 0 || dir.empty()) continue;
      Status st;
      Json answer = CallNodeAlone(
          node, "restore", Json{{"alloc_id", rs.target_ids[i]}, {"dir", dir}, {"wait_ms", wait_ms}},
          wait_ms + kAnswerMarginMs, &st);
      if (st.ok()) {
        if (std::string p = RestoreProblem(answer); !p.empty()) st = Status::Error(p);
      }
      restored += Int(answer, "restored");
      if (!st.ok()) problems += "; server " + rs.target_ids[i] + ": " + st.message();
    }
    for (size_t i = 0; i < rec.node_ids.size(); ++i) {
      Status sp;
      CallNode(rec.node_ids[i], "spend-checkpoint",
               Json{{"dir", GpuDir(rec.dir, static_cast<int>(i))}}, &sp);
    }
    Status dropped;
    CallNode(node, "drop-checkpoint-copy", Json{{"transfer", rs.transfer}}, &dropped);
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string>& ids = vm_allocs_[vm_ip];
    ids.clear();
    std::string where;
    for (size_t i = 0; i < n; ++i) {
      auto it = allocs_.find(rs.target_ids[i]);
      if (it == allocs_.end()) continue;
      MarkRunningLocked(it->second, to[i].endpoint);
      ids.push_back(rs.target_ids[i]);
      where += (where.empty() ? "" : ", ") + to[i].endpoint;
    }
    RetireAllocationsLocked(old_ids);
    DropCheckpointLocked(vm_ip);
    detail = head + ": finished the restore, the VM runs on node " + node + " at " + where + " (" +
             Sessions(sessions) + " there, " + Sessions(restored) +
             " restored now); the old server(s) stopped, the source files spent, the "
             "shipped copy dropped; its processes are told the new address, new processes "
             "get " +
             VmAllocJsonLocked(vm_ip).value("endpoint", "") + problems;
    changed_.notify_all();
    EventLocked("restore-recovered", vm_ip, detail);
    return;
  }
  // Nothing was promised (or a target server is gone): the targets go, the copy too, and the
  // checkpoint waits as before, intact on its node.
  int stopped = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!to[i].alive) continue;
    Status st;
    CallNode(node, "stop-server", Json{{"alloc_id", rs.target_ids[i]}}, &st);
    stopped += st.ok();
    if (!st.ok()) {
      FLYT_WARN("stop-server %s on %s: %s", rs.target_ids[i].c_str(), node.c_str(),
                st.message().c_str());
    }
  }
  Status dropped;
  CallNode(node, "drop-checkpoint-copy", Json{{"transfer", rs.transfer}}, &dropped);
  std::lock_guard<std::mutex> lock(mu_);
  relocated_.erase(vm_ip);
  for (const std::string& id : rs.target_ids) DropMoveTargetLocked(id);
  if (auto r = checkpoints_.find(vm_ip); r != checkpoints_.end()) {
    r->second.restoring = CheckpointRecord::Restoring();
    PersistCheckpointLocked(vm_ip, r->second);
  }
  for (AllocState* m : MembersLocked(vm_ip)) m->busy = false;
  changed_.notify_all();
  detail = head + ": rolled back, " + std::to_string(stopped) +
           " target server(s) stopped and their allocation(s) released, the shipped copy (" +
           (rs.transfer.empty() ? std::string("none") : "incoming/" + rs.transfer) + ") dropped" +
           (dropped.ok() ? std::string() : " (could not drop it: " + dropped.message() + ")") +
           "; the checkpoint's files stay on node " + from +
           " and its processes still wait for `flytctl restore`" +
           (RestoreRecoveryGoesOn(rs.stage, true)
                ? " (a target server was gone: a process already told its address waits "
                  "there in vain)"
                : "");
  EventLocked("restore-recovered", vm_ip, detail);
}

void ClusterManager::RecoverMove(const std::string& target_id) {
  std::string vm_ip, from_id, from_node, from_endpoint, to_node, to_endpoint, token;
  int ordinal = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto t = allocs_.find(target_id);
    if (t == allocs_.end()) return;
    vm_ip = t->second.row.vm_ip;
    ordinal = t->second.row.ordinal;
    to_node = t->second.row.node_id;
    to_endpoint = t->second.row.endpoint;
    token = t->second.row.token;
    for (AllocState* a : MembersLocked(vm_ip)) {
      if (a->row.ordinal != ordinal) continue;
      from_id = a->row.alloc_id;
      from_node = a->row.node_id;
      from_endpoint = a->row.endpoint;
    }
  }
  // Both nodes report first (a node that registered again lists its servers); one that does
  // not within the usual deadline counts as having lost its server.
  const int64_t deadline_ms = NowMs() +
                              options_.heartbeat_ms * options_.node_dead_after_heartbeats +
                              options_.node_call_timeout_ms;
  auto reported = [&](const std::string& node) {
    auto it = nodes_.find(node);
    return node.empty() || (it != nodes_.end() && it->second.row.last_heartbeat_ms >= started_ms_);
  };
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reported(to_node) && reported(from_node)) break;
    }
    if (stopping_.load()) return;
    if (NowMs() >= deadline_ms) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // What each side holds now: the server's state, endpoint and sessions.
  struct Side {
    bool alive = false;
    int64_t sessions = 0;
    std::string endpoint;
  };
  auto look = [&](const std::string& node, const std::string& alloc_id) {
    Side side;
    if (node.empty()) return side;
    Status ls;
    Json servers = CallNode(node, "list-servers", Json::object(), &ls);
    for (const Json& r : servers.value("servers", Json::array())) {
      if (Str(r, "alloc_id") != alloc_id) continue;
      side.alive = Str(r, "state") == "running" || Str(r, "state") == "starting";
      side.sessions = Int(r, "sessions");
      side.endpoint = Str(r, "endpoint");
    }
    return side;
  };
  Side to = look(to_node, target_id), from = look(from_node, from_id);
  if (to_endpoint.empty()) to_endpoint = to.endpoint;
  // The sessions that arrived at the target keep running there (their processes were told
  // to go on there); with none there, the source keeps the VM.
  // (A restore's target with no old server left to fall back on keeps nothing unless it has
  // sessions: the checkpoint then waits for another restore.)
  const bool forward =
      to.alive && !to_endpoint.empty() && (to.sessions > 0 || (!from.alive && !from_id.empty()));
  const int64_t wait_ms = options_.migrate_wait_ms;
  std::string detail;
  if (forward) {
    if (from.alive) {
      // Sessions still at the source (their order was pending) follow; then it stops.
      SettleServer(vm_ip, from_node, from_id, to_endpoint, token, wait_ms);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto f = allocs_.find(from_id); f != allocs_.end()) f->second.row.state = "stopping";
      }
      Status st;
      CallNode(from_node, "stop-server", Json{{"alloc_id", from_id}}, &st);
    }
  } else if (to.alive) {
    // A session whose order was pending may still arrive at the target: it goes back.
    if (!from_endpoint.empty() && from.alive) {
      SettleServer(vm_ip, to_node, target_id, from_endpoint, token, wait_ms);
    }
    Status st;
    CallNode(to_node, "stop-server", Json{{"alloc_id", target_id}}, &st);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto t = allocs_.find(target_id);
  if (t == allocs_.end()) return;
  if (forward) {
    t->second.row.state = "running";
    t->second.row.endpoint = to_endpoint;
    t->second.row.updated_ms = NowMs();
    t->second.busy = false;
    std::vector<std::string>& ids = vm_allocs_[vm_ip];
    if (std::find(ids.begin(), ids.end(), from_id) != ids.end() && !from_id.empty()) {
      std::replace(ids.begin(), ids.end(), from_id, target_id);
    } else {
      ids.push_back(target_id);
      std::sort(ids.begin(), ids.end(), [this](const std::string& x, const std::string& y) {
        return allocs_[x].row.ordinal < allocs_[y].row.ordinal;
      });
    }
    PersistAllocLocked(t->second);
    if (!from_id.empty()) {
      if (auto f = allocs_.find(from_id); f != allocs_.end()) {
        placement_.Release(f->second.row.gpu_uuid, f->second.row.sm, f->second.row.memory_bytes);
        Status s = store_->DeleteAllocation(from_id);
        if (!s.ok())
          FLYT_ERROR("cannot delete allocation %s: %s", from_id.c_str(), s.message().c_str());
        allocs_.erase(f);
      }
    }
    detail = "the cluster manager restarted while VM " + vm_ip + " moved from node " +
             (from_node.empty() ? std::string("?") : from_node) + " to node " + to_node +
             ": finished the move, " + Sessions(to.sessions) + " at " + to_endpoint +
             (from.alive ? " (the old server " + from_id + " was stopped)"
                         : " (the old server was gone)") +
             "; new processes get " + VmAllocJsonLocked(vm_ip).value("endpoint", "");
  } else {
    DropMoveTargetLocked(target_id);
    detail = "the cluster manager restarted while VM " + vm_ip + " moved from node " +
             (from_node.empty() ? std::string("?") : from_node) + " to node " + to_node +
             ": rolled back, " +
             (to.alive ? "no session had arrived at the target " + target_id + ", stopped"
                       : std::string("the target server ") + target_id + " is gone") +
             (from.alive
                  ? "; the VM runs on node " + from_node + " at " + from_endpoint + " (" +
                        Sessions(from.sessions) + ")"
                  : "; the VM's server on node " + from_node + " is gone too: its share is freed");
    if (!from.alive && !from_id.empty()) {
      for (AllocState* m : MembersLocked(vm_ip)) m->busy = false;
      FreeVmLocked(vm_ip, "");
    }
  }
  for (AllocState* m : MembersLocked(vm_ip)) {
    bool other_move = false;  // another half-done move of this VM still settles
    for (const auto& [id, a] : allocs_) {
      other_move = other_move || (a.row.vm_ip == vm_ip && a.row.state == "migrating");
    }
    if (!other_move) m->busy = false;
  }
  changed_.notify_all();
  EventLocked("migrate-recovered", vm_ip, detail);
}

// ---------------------------------------------------------------- verbs

Json ClusterManager::Migrate(const Json& req) {
  const std::string vm_ip = Str(req, "vm_ip");
  const std::string node = Str(req, "node_id");
  std::string gpu = Str(req, "gpu");
  if (vm_ip.empty()) return Error("bad_request", "migrate needs vm_ip");
  if (node.empty()) return Error("bad_request", "migrate needs the target node (node_id)");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto refuse = [&](const std::string& code, const std::string& message) {
      EventLocked("migrate-failed", vm_ip, message + " [operator: migrate to node " + node + "]");
      return Error(code, message);
    };
    auto it = nodes_.find(node);
    if (it == nodes_.end()) return refuse("unknown_node", "unknown node " + node);
    if (it->second.row.state != "up") {
      return refuse("bad_request", "cannot move VM " + vm_ip + ": node " + node + " is " +
                                       it->second.row.state + " and takes no new tenants");
    }
    if (!gpu.empty()) {
      std::string uuid;
      if (std::string why = FindNodeGpu(it->second.gpus, node, gpu, &uuid); !why.empty())
        return refuse("bad_request", why);
      gpu = uuid;
      if (MembersLocked(vm_ip).size() > 1) {
        return refuse("bad_request", "VM " + vm_ip + " has " +
                                         std::to_string(MembersLocked(vm_ip).size()) +
                                         " GPUs: give a node, not one GPU");
      }
    }
  }
  PlacementFilter filter;
  filter.nodes = {node};
  filter.gpu = gpu;
  return MoveVm(
      vm_ip, filter,
      [&](const store::Allocation& a) {
        return a.node_id != node || (!gpu.empty() && a.gpu_uuid != gpu);
      },
      "operator: migrate to node " + node + (gpu.empty() ? "" : " GPU " + gpu),
      WaitMsOf(req, options_.migrate_wait_ms));
}

Json ClusterManager::Checkpoint(const Json& req) {
  const std::string vm_ip = Str(req, "vm_ip");
  std::string dir = Str(req, "dir");
  const bool leave_running = Bool(req, "leave_running", false);
  const int64_t wait_ms = WaitMsOf(req, options_.migrate_wait_ms);
  if (vm_ip.empty()) return Error("bad_request", "checkpoint needs vm_ip");
  if (dir.empty() || dir[0] != '/') {
    return Error("bad_request",
                 "checkpoint needs an absolute path (dir) on the node(s) of the VM's servers");
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::unique_lock<std::mutex> lock(mu_);
  if (!vms_.count(vm_ip)) return Error("unknown_vm", "unknown VM " + vm_ip);
  if (!WaitNotBusyLocked(&lock, vm_ip)) {
    return Error("internal", "VM " + vm_ip + " stays busy (another change is in flight)");
  }
  std::vector<AllocState*> members = MembersLocked(vm_ip);
  if (members.empty()) {
    return Error("unknown_allocation", "VM " + vm_ip + " has no server: nothing to checkpoint");
  }
  std::vector<ServerCall> calls;
  for (AllocState* a : members) {
    if (a->row.state != "running") {
      return Error("server_failed", NotRunning("checkpoint", vm_ip, a->row));
    }
    if (a->checkpointed) {
      return Error("bad_request", "VM " + vm_ip + "'s processes already wait in a checkpoint (" +
                                      checkpoints_[vm_ip].dir + "); restore it first");
    }
    calls.push_back(CallFor(a->row, dir));
  }
  for (AllocState* a : members) a->busy = true;
  lock.unlock();
  const size_t n = calls.size();
  // Every server at once: with leave_running false, each of its processes is parked and
  // written, and none resumes before restore (so the VM's state is one consistent cut).
  RunEach(n, [&](size_t i) {
    ServerCall& c = calls[i];
    c.answer = CallNodeAlone(c.node_id, "checkpoint",
                             Json{{"alloc_id", c.alloc_id},
                                  {"dir", c.dir},
                                  {"leave_running", leave_running},
                                  {"wait_ms", wait_ms}},
                             wait_ms + kAnswerMarginMs, &c.status);
    if (c.status.ok()) {
      std::string p = MoveProblem(c.answer, "checkpointed");
      if (!p.empty()) c.status = Status::Error(p);
    }
  });
  std::string failure;
  for (const ServerCall& c : calls) {
    if (c.status.ok()) continue;
    failure = "the server on node " + c.node_id +
              (n > 1 ? " (GPU " + std::to_string(c.ordinal) + ")" : std::string()) + ": " +
              c.status.message();
    break;
  }
  std::string undo;
  if (!failure.empty() && !leave_running) {
    // All or nothing: the processes that were written resume from their files at once.
    RunEach(n, [&](size_t i) {
      ServerCall& c = calls[i];
      if (Int(c.answer, "checkpointed") == 0) return;
      c.undo_answer =
          CallNodeAlone(c.node_id, "restore",
                        Json{{"alloc_id", c.alloc_id}, {"dir", c.dir}, {"wait_ms", wait_ms}},
                        wait_ms + kAnswerMarginMs, &c.undo);
      if (c.undo.ok()) {
        std::string p = RestoreProblem(c.undo_answer);
        if (!p.empty()) c.undo = Status::Error(p);
      }
    });
    for (const ServerCall& c : calls) {
      const int64_t written = Int(c.answer, "checkpointed");
      if (written == 0) continue;
      undo += "; " + Sessions(written) + " written on node " + c.node_id +
              (c.undo.ok() ? " resumed in place" : " could not resume (" + c.undo.message() + ")");
    }
  }
  lock.lock();
  int64_t sessions = 0;
  Json servers = Json::array();
  CheckpointRecord record;
  record.dir = dir;
  record.leave_running = leave_running;
  record.time_ms = NowMs();
  std::string where;
  for (const ServerCall& c : calls) {
    sessions += Int(c.answer, "checkpointed");
    servers.push_back(Json{{"ordinal", c.ordinal},
                           {"alloc_id", c.alloc_id},
                           {"node_id", c.node_id},
                           {"endpoint", c.endpoint},
                           {"dir", c.dir},
                           {"sessions", Int(c.answer, "checkpointed")}});
    record.alloc_ids.push_back(c.alloc_id);
    record.node_ids.push_back(c.node_id);
    record.endpoints.push_back(c.endpoint);
    if (auto it = allocs_.find(c.alloc_id); it != allocs_.end()) {
      record.gpu_uuids.push_back(it->second.row.gpu_uuid);
      record.token = it->second.row.token;
      record.sm = it->second.row.sm;
      record.memory_bytes = it->second.row.memory_bytes;
    } else {
      record.gpu_uuids.emplace_back();
    }
    where +=
        (where.empty() ? "" : ", ") + c.dir + " on node " + c.node_id + " (" + c.endpoint + ")";
    if (auto it = allocs_.find(c.alloc_id); it != allocs_.end()) {
      it->second.busy = false;
      // Processes wait in it (a server without any has nothing to restore).
      if (failure.empty() && !leave_running && Int(c.answer, "checkpointed") > 0) {
        it->second.checkpointed = true;
      }
    }
  }
  changed_.notify_all();
  if (!failure.empty()) {
    const std::string message = "checkpoint of VM " + vm_ip + " to " + dir + " failed: " + failure +
                                undo + (leave_running ? "; its processes went on running" : "");
    EventLocked("checkpoint-failed", vm_ip, message);
    return Error("server_failed", message);
  }
  checkpoints_[vm_ip] = record;
  PersistCheckpointLocked(vm_ip, record);
  EventLocked("checkpoint", vm_ip,
              "VM " + vm_ip + ": " + Sessions(sessions) + " written to " + where +
                  (leave_running ? "; its processes go on running"
                                 : "; its processes wait at their server's address until "
                                   "`flytctl restore --vm " +
                                       vm_ip + "`"));
  return Ok({{"vm_ip", vm_ip},
             {"dir", dir},
             {"leave_running", leave_running},
             {"sessions", sessions},
             {"servers", servers}});
}

Json ClusterManager::StartAtCheckpointLocked(std::unique_lock<std::mutex>* lock,
                                             const std::string& vm_ip,
                                             const CheckpointRecord& rec) {
  const size_t n = rec.endpoints.size();
  std::vector<int> ports(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const std::string& node = rec.node_ids[i];
    auto it = nodes_.find(node);
    if (it == nodes_.end() || it->second.row.state == "down") {
      return Error("node_unreachable", "cannot restore VM " + vm_ip + ": node " + node +
                                           ", where its checkpoint was taken, is not up");
    }
    Status fit = placement_.CanResize(rec.gpu_uuids[i], rec.sm, rec.memory_bytes);
    if (!fit.ok()) {
      return Error("no_capacity", "cannot restore VM " + vm_ip + " on GPU " + rec.gpu_uuids[i] +
                                      " of node " + node + ": " + fit.message());
    }
    const size_t colon = rec.endpoints[i].rfind(':');
    ports[i] = colon == std::string::npos ? 0 : std::atoi(rec.endpoints[i].c_str() + colon + 1);
  }
  std::vector<std::string> ids;
  std::vector<Json> starts;
  const int64_t now = NowMs();
  for (size_t i = 0; i < n; ++i) {
    AllocState a;
    a.busy = true;
    // The old allocation's id: a client on the node's host waits at the server's shm://
    // address, which the node manager names after it.
    a.row.alloc_id =
        allocs_.count(rec.alloc_ids[i]) ? "a-" + control::RandomHex(6) : rec.alloc_ids[i];
    a.row.vm_ip = vm_ip;
    a.row.node_id = rec.node_ids[i];
    a.row.gpu_uuid = rec.gpu_uuids[i];
    a.row.ordinal = static_cast<int>(i);
    a.row.token = rec.token;
    a.row.state = "starting";
    a.row.sm = rec.sm;
    a.row.memory_bytes = rec.memory_bytes;
    a.row.created_ms = a.row.updated_ms = now;
    placement_.Reserve(a.row.gpu_uuid, a.row.sm, a.row.memory_bytes);
    starts.push_back(Json{{"alloc_id", a.row.alloc_id},
                          {"gpu_uuid", a.row.gpu_uuid},
                          {"sm", a.row.sm},
                          {"memory_bytes", a.row.memory_bytes},
                          {"token", rec.token},
                          {"port", ports[i]}});
    ids.push_back(a.row.alloc_id);
    vm_allocs_[vm_ip].push_back(a.row.alloc_id);
    PersistAllocLocked(a);
    allocs_[a.row.alloc_id] = std::move(a);
  }
  EventLocked("restore-servers", vm_ip,
              "VM " + vm_ip + " has no server: starting " + std::to_string(n) +
                  " again where its checkpoint was taken (" + JoinEndpoints(rec.endpoints) +
                  ") for its waiting processes");
  lock->unlock();
  std::vector<Status> started(n);
  std::vector<Json> answers(n);
  RunEach(n, [&](size_t i) {
    answers[i] = CallNode(rec.node_ids[i], "start-server", starts[i], &started[i]);
  });
  std::string failure;
  for (size_t i = 0; i < n && failure.empty(); ++i) {
    if (!started[i].ok()) {
      failure = "node " + rec.node_ids[i] + " could not start a server at " + rec.endpoints[i] +
                ": " + started[i].message();
    } else if (Str(answers[i], "endpoint") != rec.endpoints[i]) {
      failure = "node " + rec.node_ids[i] + " started the server at " +
                Str(answers[i], "endpoint") + ", not at " + rec.endpoints[i];
    }
  }
  if (!failure.empty()) {
    RunEach(n, [&](size_t i) {
      if (!started[i].ok()) return;
      Status st;
      CallNode(rec.node_ids[i], "stop-server", Json{{"alloc_id", ids[i]}}, &st);
    });
  }
  lock->lock();
  for (size_t i = 0; i < n; ++i) {
    auto it = allocs_.find(ids[i]);
    if (it == allocs_.end()) continue;
    it->second.busy = false;
    if (failure.empty()) {
      it->second.row.state = "running";
      it->second.row.endpoint = Str(answers[i], "endpoint");
      it->second.row.updated_ms = NowMs();
      PersistAllocLocked(it->second);
    }
  }
  if (!failure.empty()) {
    for (const std::string& id : ids) FreeAllocLocked(id);
    changed_.notify_all();
    const std::string message = "restore of VM " + vm_ip + " failed: " + failure;
    EventLocked("restore-failed", vm_ip, message);
    return Error("server_failed", message);
  }
  changed_.notify_all();
  return Json();
}

Json ClusterManager::Restore(const Json& req) {
  const std::string vm_ip = Str(req, "vm_ip");
  std::string dir = Str(req, "dir");
  const std::string node = Str(req, "node_id");
  const std::string gpu = Str(req, "gpu");
  const int64_t wait_ms = WaitMsOf(req, options_.migrate_wait_ms);
  if (vm_ip.empty()) return Error("bad_request", "restore needs vm_ip");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::unique_lock<std::mutex> lock(mu_);
  if (!vms_.count(vm_ip)) return Error("unknown_vm", "unknown VM " + vm_ip);
  if (!WaitNotBusyLocked(&lock, vm_ip)) {
    return Error("internal", "VM " + vm_ip + " stays busy (another change is in flight)");
  }
  if (dir.empty()) {
    auto rec = checkpoints_.find(vm_ip);
    if (rec == checkpoints_.end()) {
      return Error("bad_request", "no checkpoint of VM " + vm_ip +
                                      " waits for a restore (none was taken, or it was "
                                      "restored): give the path (dir, flytctl --from PATH)");
    }
    dir = rec->second.dir;
  }
  if (dir[0] != '/') return Error("bad_request", "restore needs an absolute path (dir)");
  std::vector<AllocState*> members = MembersLocked(vm_ip);
  auto rec = checkpoints_.find(vm_ip);
  const bool recorded = rec != checkpoints_.end() && rec->second.dir == dir;
  if (members.empty()) {
    if (!recorded) {
      return Error("unknown_allocation",
                   "VM " + vm_ip + " has no server to restore into, and no checkpoint in " + dir +
                       " waits for a restore (its record says where to start the servers again: "
                       "a checkpointed process reconnects only to its server's old address)");
    }
    const CheckpointRecord copy = rec->second;
    if (!node.empty() &&
        std::find(copy.node_ids.begin(), copy.node_ids.end(), node) == copy.node_ids.end()) {
      return RestoreElsewhere(&lock, vm_ip, copy, node, gpu, wait_ms);
    }
    Json refused = StartAtCheckpointLocked(&lock, vm_ip, copy);
    if (!refused.is_null()) return refused;
    members = MembersLocked(vm_ip);
  } else if (recorded && !node.empty() &&
             std::find(rec->second.node_ids.begin(), rec->second.node_ids.end(), node) ==
                 rec->second.node_ids.end()) {
    const CheckpointRecord copy = rec->second;
    return RestoreElsewhere(&lock, vm_ip, copy, node, gpu, wait_ms);
  } else if (recorded) {
    for (const AllocState* a : members) {
      const size_t i = static_cast<size_t>(a->row.ordinal);
      if (i < rec->second.endpoints.size() && rec->second.endpoints[i] != a->row.endpoint) {
        return Error("bad_request",
                     "VM " + vm_ip + "'s server " + std::to_string(i) + " is now at " +
                         a->row.endpoint + ", but the processes of the checkpoint in " + dir +
                         " wait at " + rec->second.endpoints[i] +
                         " (they reconnect only there); deallocate the VM, then restore: its "
                         "servers are started again at their old addresses");
      }
    }
  }
  std::vector<ServerCall> calls;
  for (AllocState* a : members) {
    if (!node.empty() && a->row.node_id != node) {
      return Error("bad_request",
                   "VM " + vm_ip + "'s server" + (members.size() > 1 ? "s are" : " is") +
                       " on node " + a->row.node_id + " and the checkpoint in " + dir +
                       " is not the one recorded for it (only the recorded checkpoint, whose "
                       "processes wait, can be restored on another node); restore there, then "
                       "`flytctl migrate --vm " +
                       vm_ip + " --to " + node + "`");
    }
    if (a->row.state != "running") {
      return Error("server_failed", NotRunning("restore", vm_ip, a->row));
    }
    calls.push_back(CallFor(a->row, dir));
  }
  for (AllocState* a : members) a->busy = true;
  lock.unlock();
  const size_t n = calls.size();
  RunEach(n, [&](size_t i) {
    ServerCall& c = calls[i];
    c.answer = CallNodeAlone(c.node_id, "restore",
                             Json{{"alloc_id", c.alloc_id}, {"dir", c.dir}, {"wait_ms", wait_ms}},
                             wait_ms + kAnswerMarginMs, &c.status);
    if (c.status.ok()) {
      std::string p = RestoreProblem(c.answer);
      if (!p.empty()) c.status = Status::Error(p);
    }
  });
  lock.lock();
  std::string failure, where;
  int64_t restored = 0;
  Json servers = Json::array();
  for (const ServerCall& c : calls) {
    restored += Int(c.answer, "restored");
    servers.push_back(Json{{"ordinal", c.ordinal},
                           {"alloc_id", c.alloc_id},
                           {"node_id", c.node_id},
                           {"endpoint", c.endpoint},
                           {"dir", c.dir},
                           {"restored", Int(c.answer, "restored")}});
    where += (where.empty() ? "" : ", ") + c.dir + " on node " + c.node_id + " at " + c.endpoint;
    if (!c.status.ok() && failure.empty()) {
      failure = "the server on node " + c.node_id +
                (n > 1 ? " (GPU " + std::to_string(c.ordinal) + ")" : std::string()) + ": " +
                c.status.message();
    }
    if (auto it = allocs_.find(c.alloc_id); it != allocs_.end()) {
      it->second.busy = false;
      if (c.status.ok()) it->second.checkpointed = false;
    }
  }
  changed_.notify_all();
  if (!failure.empty()) {
    const std::string message = "restore of VM " + vm_ip + " from " + dir + " failed: " + failure +
                                " (" + Sessions(restored) + " restored)";
    EventLocked("restore-failed", vm_ip, message);
    return Error("server_failed", message);
  }
  // Its files are spent (the node manager set them aside): the record goes too.
  if (auto r = checkpoints_.find(vm_ip); r != checkpoints_.end() && r->second.dir == dir) {
    DropCheckpointLocked(vm_ip);
  }
  EventLocked("restore", vm_ip,
              "VM " + vm_ip + ": " + Sessions(restored) + " restored from " + where +
                  "; its processes reconnect there");
  return Ok({{"vm_ip", vm_ip}, {"dir", dir}, {"restored", restored}, {"servers", servers}});
}

Json ClusterManager::LocateServer(const Json& req) {
  const std::string vm_ip = Str(req, "vm_ip");
  const std::string endpoint = Str(req, "endpoint");
  std::lock_guard<std::mutex> lock(mu_);
  if (!vms_.count(vm_ip)) return Error("unknown_vm", "unknown VM " + vm_ip);
  if (auto v = relocated_.find(vm_ip); v != relocated_.end()) {
    if (auto e = v->second.find(endpoint); e != v->second.end()) {
      return Ok({{"endpoint", e->second}, {"relocated", true}});
    }
  }
  for (const AllocState* a : MembersLocked(vm_ip)) {
    if (a->row.endpoint == endpoint) return Ok({{"endpoint", endpoint}, {"relocated", false}});
  }
  // A checkpoint's server that moved on after a restart mid-restore: the VM's server of the
  // same ordinal.
  if (auto rec = checkpoints_.find(vm_ip); rec != checkpoints_.end()) {
    const auto& eps = rec->second.endpoints;
    const auto at = std::find(eps.begin(), eps.end(), endpoint);
    if (at != eps.end()) {
      const int ordinal = static_cast<int>(at - eps.begin());
      for (const AllocState* a : MembersLocked(vm_ip)) {
        if (a->row.ordinal == ordinal && !a->checkpointed && a->row.state == "running") {
          return Ok({{"endpoint", a->row.endpoint}, {"relocated", true}});
        }
      }
      return Ok({{"endpoint", ""}, {"reason", "its checkpoint waits for `flytctl restore`"}});
    }
  }
  return Ok({{"endpoint", ""}, {"reason", "no server of VM " + vm_ip + " was at " + endpoint}});
}

Json ClusterManager::RestoreElsewhere(std::unique_lock<std::mutex>* lock, const std::string& vm_ip,
                                      const CheckpointRecord& rec, const std::string& node,
                                      const std::string& gpu_asked, int64_t wait_ms) {
  const size_t n = rec.endpoints.size();
  const std::string from = JoinEndpoints(DistinctNodes(rec.node_ids));
  auto refuse = [&](const std::string& code, const std::string& message) {  // mu_ held
    EventLocked("restore-failed", vm_ip, message);
    return Error(code, message);
  };
  if (rec.leave_running) {
    return refuse("bad_request", "cannot restore VM " + vm_ip + " on node " + node +
                                     ": its checkpoint in " + rec.dir +
                                     " was taken with --leave-running, so no process waits for it");
  }
  auto nit = nodes_.find(node);
  if (nit == nodes_.end()) return refuse("unknown_node", "unknown node " + node);
  if (nit->second.row.state != "up") {
    return refuse("bad_request", "cannot restore VM " + vm_ip + " on node " + node + ": it is " +
                                     nit->second.row.state + " and takes no new tenants");
  }
  if (const std::string& theirs = nit->second.server_scheme;
      !theirs.empty() && !Scheme(rec.endpoints[0]).empty() && theirs != Scheme(rec.endpoints[0])) {
    return refuse("bad_request",
                  "cannot restore VM " + vm_ip + " on node " + node + ": its servers listen on " +
                      theirs + " and the checkpoint's processes talk " + Scheme(rec.endpoints[0]) +
                      "; sessions move only between servers of the same kind (set "
                      "server_tls alike on node " +
                      from + " and node " + node + ")");
  }
  std::string gpu;
  if (!gpu_asked.empty()) {
    if (std::string why = FindNodeGpu(nit->second.gpus, node, gpu_asked, &gpu); !why.empty())
      return refuse("bad_request", why);
    if (n > 1) {
      return refuse("bad_request", "VM " + vm_ip + " has " + std::to_string(n) +
                                       " GPUs: give a node, not one GPU");
    }
  }
  for (const std::string& src : DistinctNodes(rec.node_ids)) {
    auto s = nodes_.find(src);
    if (s == nodes_.end() || s->second.row.state == "down") {
      return refuse("node_unreachable",
                    "cannot restore VM " + vm_ip + " on node " + node +
                        ": its checkpoint's files " + "are on node " + src +
                        ", which is down, so they cannot be shipped; bring the node back (or "
                        "copy " +
                        rec.dir + " to the same path on a node and restore there)");
    }
  }
  // The VM's old servers (still running, idle, while their processes wait) must be the
  // checkpoint's; they stop once the VM runs on the new ones.
  std::vector<std::string> old_ids;
  for (AllocState* a : MembersLocked(vm_ip)) {
    const size_t i = static_cast<size_t>(a->row.ordinal);
    if (i >= n || rec.endpoints[i] != a->row.endpoint) {
      return refuse("bad_request", "VM " + vm_ip + "'s server " + std::to_string(i) +
                                       " is now at " + a->row.endpoint + ", not at " +
                                       (i < n ? rec.endpoints[i] : "?") +
                                       " where the processes of the checkpoint in " + rec.dir +
                                       " wait; deallocate the VM, then restore");
    }
    old_ids.push_back(a->row.alloc_id);
  }
  const store::VmRequirement& vm = vms_[vm_ip];
  PlacementRequest pr{vm_ip, vm.host_ip, rec.sm, rec.memory_bytes};
  PlacementFilter filter;
  filter.nodes = {node};
  filter.gpu = gpu;
  std::vector<std::string> gpus;
  bool one_node = false;
  Status placed = placement_.PlaceGroup(pr, static_cast<int>(n), &gpus, &one_node, &filter);
  if (!placed.ok()) {
    return refuse("no_capacity", "cannot restore VM " + vm_ip + " on node " + node + ": " +
                                     placed.message() + "; its processes still wait");
  }
  // The new servers: the checkpoint's share and token, in the store as "migrating" until the
  // VM switches to them (a restart meanwhile finishes or undoes it, RecoverMoves).
  struct Target {
    std::string id, gpu, endpoint, src_dir, dir;
    bool started = false;
    Status start, restore;
    Json answer;
  };
  std::vector<Target> t(n);
  std::vector<Json> starts(n);
  const int64_t now = NowMs();
  const std::string transfer = "r-" + control::RandomHex(6);
  // The restore's progress, in the checkpoint's record in the store (mu_ held): a cluster
  // manager that dies meanwhile finds it there and finishes or undoes it (RecoverRestore).
  auto mark = [&](const std::string& stage) {
    auto r = checkpoints_.find(vm_ip);
    if (r == checkpoints_.end()) return;
    CheckpointRecord::Restoring& rs = r->second.restoring;
    rs = CheckpointRecord::Restoring();
    rs.stage = stage;
    rs.node = node;
    rs.transfer = transfer;
    for (const Target& x : t) {
      rs.target_ids.push_back(x.id);
      rs.target_endpoints.push_back(x.endpoint);
      rs.copy_dirs.push_back(x.dir);
    }
    PersistCheckpointLocked(vm_ip, r->second);
  };
  for (size_t i = 0; i < n; ++i) {
    AllocState a;
    a.busy = true;
    a.row.alloc_id = "a-" + control::RandomHex(6);
    a.row.vm_ip = vm_ip;
    a.row.node_id = node;
    a.row.gpu_uuid = gpus[i];
    a.row.ordinal = static_cast<int>(i);
    a.row.token = rec.token;
    a.row.state = "migrating";
    a.row.sm = rec.sm;
    a.row.memory_bytes = rec.memory_bytes;
    a.row.created_ms = a.row.updated_ms = now;
    placement_.Reserve(a.row.gpu_uuid, a.row.sm, a.row.memory_bytes);
    t[i].id = a.row.alloc_id;
    t[i].gpu = gpus[i];
    t[i].src_dir = GpuDir(rec.dir, static_cast<int>(i));
    starts[i] = Json{{"alloc_id", a.row.alloc_id},
                     {"gpu_uuid", a.row.gpu_uuid},
                     {"sm", a.row.sm},
                     {"memory_bytes", a.row.memory_bytes},
                     {"token", rec.token}};
    allocs_[a.row.alloc_id] = std::move(a);
  }
  // The record first, then the targets as "migrating": a restart finds either no target or
  // targets that its record explains.
  mark("chosen");
  for (const Target& x : t) PersistAllocLocked(allocs_[x.id]);
  for (AllocState* a : MembersLocked(vm_ip)) a->busy = true;
  EventLocked("restore-ship", vm_ip,
              "restoring VM " + vm_ip + "'s checkpoint " + rec.dir + " (taken on node " + from +
                  ") on node " + node + ": starting " + std::to_string(n) +
                  " server(s) there and shipping the checkpoint's files");
  lock->unlock();
  CrashPoint("restore-chosen");

  std::string failure;
  int64_t shipped = 0;
  // 1. What is to ship, and whether it may.
  std::vector<Json> lists(n);
  for (size_t i = 0; i < n && failure.empty(); ++i) {
    Status ls;
    lists[i] = CallNodeAlone(rec.node_ids[i], "list-checkpoint", Json{{"dir", t[i].src_dir}},
                             kAnswerMarginMs, &ls);
    if (!ls.ok()) {
      failure = "cannot list " + t[i].src_dir + " on node " + rec.node_ids[i] + ": " + ls.message();
    }
    shipped += Int(lists[i], "bytes");
  }
  if (failure.empty() && shipped > options_.checkpoint_ship_max_bytes) {
    failure = "the checkpoint is " + std::to_string(shipped) +
              " bytes, more than checkpoint_ship_max_bytes (" +
              std::to_string(options_.checkpoint_ship_max_bytes) +
              ") allows to ship; restore it on node " + from +
              " and `flytctl migrate` it, or raise checkpoint_ship_max_bytes";
  }
  // 2. The new servers start.
  if (failure.empty()) {
    RunEach(n, [&](size_t i) {
      Json a = CallNode(node, "start-server", starts[i], &t[i].start);
      t[i].started = t[i].start.ok();
      t[i].endpoint = Str(a, "endpoint");
    });
    for (size_t i = 0; i < n && failure.empty(); ++i) {
      if (!t[i].start.ok()) {
        failure = "the new server on node " + node + " did not start: " + t[i].start.message();
      } else if (Scheme(t[i].endpoint) != Scheme(rec.endpoints[i])) {
        failure = "the new server listens at " + t[i].endpoint + " but the processes waited at " +
                  rec.endpoints[i] + " (set server_tls alike on node " + rec.node_ids[i] +
                  " and node " + node + ")";
      }
    }
    lock->lock();
    for (const Target& x : t) {
      if (auto it = allocs_.find(x.id); it != allocs_.end() && x.started) {
        it->second.row.endpoint = x.endpoint;  // what a recovery stops or switches to
        PersistAllocLocked(it->second);
      }
    }
    mark("started");
    lock->unlock();
    if (failure.empty()) CrashPoint("restore-started");
  }
  // 3. The files go to the target node manager, chunk by chunk over the control connections.
  for (size_t i = 0; i < n && failure.empty(); ++i) {
    for (const Json& f : lists[i].value("files", Json::array())) {
      const std::string file = Str(f, "file");
      int64_t offset = 0;
      for (bool last = false; !last && failure.empty();) {
        Status rs, ws;
        Json chunk = CallNodeAlone(rec.node_ids[i], "read-checkpoint",
                                   Json{{"dir", t[i].src_dir}, {"file", file}, {"offset", offset}},
                                   kAnswerMarginMs, &rs);
        if (!rs.ok()) {
          failure = "reading " + t[i].src_dir + "/" + file + " on node " + rec.node_ids[i] +
                    " failed: " + rs.message();
          break;
        }
        last = Bool(chunk, "eof", true);
        Json w = CallNodeAlone(node, "write-checkpoint",
                               Json{{"transfer", transfer},
                                    {"sub", "gpu" + std::to_string(i)},
                                    {"file", file},
                                    {"offset", offset},
                                    {"data", Str(chunk, "data")},
                                    {"last", last}},
                               kAnswerMarginMs, &ws);
        if (!ws.ok()) {
          failure = "writing " + file + " on node " + node + " failed: " + ws.message();
          break;
        }
        t[i].dir = Str(w, "dir") + "/gpu" + std::to_string(i);
        offset += Int(chunk, "bytes");
      }
    }
  }
  if (failure.empty()) {
    lock->lock();
    mark("shipped");  // where the copies are: a recovery drops them
    lock->unlock();
    CrashPoint("restore-shipped");
  }
  // 4. The waiting processes learn the new addresses (they ask while they wait), and each
  // new server restores its files.
  int64_t restored = 0;
  if (failure.empty()) {
    lock->lock();
    // Recorded before any process may hear of it: a process told the new address does not
    // go back to the old one, so from here a restart finishes the restore.
    mark("told");
    for (size_t i = 0; i < n; ++i) {
      // Processes that waited at an earlier server of this one follow too.
      for (auto& [old, now] : relocated_[vm_ip]) {
        if (now == rec.endpoints[i]) now = t[i].endpoint;
      }
      relocated_[vm_ip][rec.endpoints[i]] = t[i].endpoint;
    }
    lock->unlock();
    CrashPoint("restore-told");
    RunEach(n, [&](size_t i) {
      if (t[i].dir.empty()) return;  // a server without sessions wrote no file
      t[i].answer = CallNodeAlone(
          node, "restore", Json{{"alloc_id", t[i].id}, {"dir", t[i].dir}, {"wait_ms", wait_ms}},
          wait_ms + kAnswerMarginMs, &t[i].restore);
      if (t[i].restore.ok()) {
        std::string p = RestoreProblem(t[i].answer);
        if (!p.empty()) t[i].restore = Status::Error(p);
      }
    });
    for (size_t i = 0; i < n; ++i) {
      restored += Int(t[i].answer, "restored");
      if (!t[i].restore.ok() && failure.empty()) {
        failure = "the new server on node " + node +
                  (n > 1 ? " (GPU " + std::to_string(i) + ")" : std::string()) + ": " +
                  t[i].restore.message();
      }
    }
    if (restored > 0) {
      lock->lock();
      mark("restored");
      lock->unlock();
      CrashPoint("restore-restored");
    }
  }
  Status dropped;
  CallNode(node, "drop-checkpoint-copy", Json{{"transfer", transfer}}, &dropped);
  // Nothing restored: the new servers go, the processes still wait for the checkpoint, which
  // is intact. Something restored: those processes already run there, so the VM switches.
  const bool keep = restored > 0;
  if (!failure.empty() && !keep) {
    RunEach(n, [&](size_t i) {
      if (!t[i].started) return;
      Status st;
      CallNode(node, "stop-server", Json{{"alloc_id", t[i].id}}, &st);
    });
    lock->lock();
    relocated_.erase(vm_ip);
    for (const Target& x : t) DropMoveTargetLocked(x.id);
    if (auto r = checkpoints_.find(vm_ip); r != checkpoints_.end()) {
      r->second.restoring = CheckpointRecord::Restoring();  // the checkpoint waits as before
      PersistCheckpointLocked(vm_ip, r->second);
    }
    for (AllocState* a : MembersLocked(vm_ip)) a->busy = false;
    changed_.notify_all();
    const std::string message = "restore of VM " + vm_ip + " from " + rec.dir + " (node " + from +
                                ") on node " + node + " failed: " + failure +
                                "; nothing changed, its processes still wait for the checkpoint";
    EventLocked("restore-failed", vm_ip, message);
    return Error("server_failed", message);
  }
  if (failure.empty()) {
    // The source's files are spent (their one-time keys were used).
    for (size_t i = 0; i < n; ++i) {
      Status sp;
      CallNode(rec.node_ids[i], "spend-checkpoint", Json{{"dir", t[i].src_dir}}, &sp);
    }
  }
  lock->lock();
  std::vector<std::string>& ids = vm_allocs_[vm_ip];
  ids.clear();
  Json servers = Json::array();
  std::string where;
  for (size_t i = 0; i < n; ++i) {
    auto it = allocs_.find(t[i].id);
    if (it == allocs_.end()) continue;
    MarkRunningLocked(it->second, t[i].endpoint);
    ids.push_back(t[i].id);
    servers.push_back(Json{{"ordinal", static_cast<int>(i)},
                           {"alloc_id", t[i].id},
                           {"node_id", node},
                           {"endpoint", t[i].endpoint},
                           {"dir", t[i].dir},
                           {"from_node", rec.node_ids[i]},
                           {"from_dir", t[i].src_dir},
                           {"restored", Int(t[i].answer, "restored")}});
    where += (where.empty() ? "" : ", ") + t[i].endpoint;
  }
  RetireAllocationsLocked(old_ids);
  DropCheckpointLocked(vm_ip);
  changed_.notify_all();
  if (!failure.empty()) {
    const std::string message = "restore of VM " + vm_ip + " from " + rec.dir + " on node " + node +
                                " failed in part: " + failure + " (" + Sessions(restored) +
                                " restored there; the VM now runs on node " + node + ")";
    EventLocked("restore-failed", vm_ip, message);
    return Error("server_failed", message);
  }
  EventLocked("restore", vm_ip,
              "VM " + vm_ip + ": " + Sessions(restored) + " restored on node " + node + " at " +
                  where + " from checkpoint " + rec.dir + " taken on node " + from + " (" +
                  std::to_string(shipped) +
                  " bytes shipped); its processes were told the new address, new processes "
                  "get " +
                  VmAllocJsonLocked(vm_ip).value("endpoint", ""));
  return Ok({{"vm_ip", vm_ip},
             {"dir", rec.dir},
             {"node_id", node},
             {"from_node", from},
             {"shipped_bytes", shipped},
             {"restored", restored},
             {"servers", servers}});
}

Json ClusterManager::MigrateAuto(const Json& req) {
  const bool dry_run = Bool(req, "dry_run", false);
  const bool automatic = Bool(req, "automatic", false);  // the monitor's: quiet when idle
  std::string vm_pick, source, decision;
  PlacementFilter pick_filter;
  double peak_before = 0, peak_after = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto nothing = [&](const std::string& why) {
      if (!automatic) EventLocked("rebalance", "cluster", "nothing to move: " + why);
      return Ok({{"moved", false}, {"reason", why}});
    };
    const std::map<std::string, NodeLoad> loads = NodeLoadsLocked();
    if (loads.size() < 2) return nothing("fewer than two nodes are up");
    for (const auto& [id, l] : loads) {
      if (source.empty() || l.Load() > peak_before) {
        source = id;
        peak_before = l.Load();
      }
    }
    if (peak_before <= 0) return nothing("no node holds a tenant");
    peak_after = peak_before;
    for (const auto& entry : vm_allocs_) {
      const std::string& vm_ip = entry.first;
      std::vector<AllocState*> members = MembersLocked(vm_ip);
      bool movable = !members.empty();
      size_t movers = 0;
      PlacementFilter f;
      f.avoid_nodes = {source};
      for (const AllocState* a : members) {
        movable = movable && !a->busy && !a->checkpointed && a->row.state == "running" &&
                  !Scheme(a->row.endpoint).empty();
        movers += a->row.node_id == source;
        f.avoid_gpus.insert(a->row.gpu_uuid);
      }
      if (!movable || movers == 0) continue;
      for (const auto& [id, ns] : nodes_) {  // never to a node of the other kind of server
        if (!ns.server_scheme.empty() && ns.server_scheme != Scheme(members[0]->row.endpoint)) {
          f.avoid_nodes.insert(id);
        }
      }
      struct {
        int sm;
        int64_t memory_bytes;
      } share{members[0]->row.sm, members[0]->row.memory_bytes};
      PlacementRequest pr{vm_ip, vms_.count(vm_ip) ? vms_[vm_ip].host_ip : "", share.sm,
                          share.memory_bytes};
      std::vector<std::string> gpus;
      bool one_node = false;
      if (!placement_.PlaceGroup(pr, static_cast<int>(movers), &gpus, &one_node, &f).ok()) continue;
      std::map<std::string, NodeLoad> after = loads;
      after[source].sm_used -= share.sm * static_cast<int64_t>(movers);
      after[source].memory_used -= share.memory_bytes * static_cast<int64_t>(movers);
      std::set<std::string> targets;
      for (const std::string& g : gpus) {
        const std::string& node = placement_.Find(g)->capacity.node_id;
        targets.insert(node);
        after[node].sm_used += share.sm;
        after[node].memory_used += share.memory_bytes;
      }
      double peak = 0;
      for (const auto& [id, l] : after) peak = std::max(peak, l.Load());
      if (peak < peak_after - 1e-9) {
        peak_after = peak;
        vm_pick = vm_ip;
        pick_filter = f;
        pick_filter.nodes = targets;
        decision.clear();
        for (const auto& t : targets) decision += (decision.empty() ? "" : ", ") + t;
      }
    }
    if (vm_pick.empty()) {
      return nothing("node " + source + " is the most loaded (" + Percent(peak_before) +
                     ") and moving none of its VMs elsewhere would lower the peak");
    }
    decision = "VM " + vm_pick + " from node " + source + " (" + Percent(peak_before) +
               ") to node " + decision + ": the most loaded node goes from " +
               Percent(peak_before) + " to a peak of " + Percent(peak_after);
    EventLocked("rebalance", vm_pick, (dry_run ? "would move " : "moving ") + decision);
  }
  Json plan{{"vm_ip", vm_pick},
            {"from", source},
            {"to", std::vector<std::string>(pick_filter.nodes.begin(), pick_filter.nodes.end())},
            {"peak_before", peak_before},
            {"peak_after", peak_after},
            {"decision", decision}};
  if (dry_run) {
    plan["moved"] = false;
    plan["dry_run"] = true;
    return Ok(plan);
  }
  const std::string src = source;
  Json r = MoveVm(
      vm_pick, pick_filter, [&](const store::Allocation& a) { return a.node_id == src; },
      "rebalance", options_.migrate_wait_ms);
  if (!r.value("ok", false)) return r;
  for (auto it = plan.begin(); it != plan.end(); ++it) r[it.key()] = it.value();
  r["moved"] = true;
  return r;
}

}  // namespace flyt::cluster
