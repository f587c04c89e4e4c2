#include "cluster/cluster_manager.h"

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <functional>

#include "cluster/gpu_group.h"
#include "common/log.h"

namespace flyt::cluster {
namespace {

using control::Error;
using control::Json;
using control::Ok;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr auto kBusyWait = std::chrono::seconds(60);

int64_t GbToBytes(double gb) { return static_cast<int64_t>(std::llround(gb * kGiB)); }

std::string Gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / kGiB);
  return buf;
}

std::string Str(const Json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t Int(const Json& j, const char* name, int64_t fallback = 0) {
  auto it = j.find(name);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : fallback;
}

Json VmJson(const store::VmRequirement& v) {
  return Json{{"vm_ip", v.vm_ip},
              {"host_ip", v.host_ip},
              {"compute_units", v.compute_units},
              {"memory_gb", v.memory_gb},
              {"gpus", v.gpus}};
}

std::string Join(const std::vector<std::string>& parts) { return JoinEndpoints(parts); }

std::string GpuCount(size_t n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }

Json GpuCapacityJson(const store::Gpu& g) {
  return Json{{"uuid", g.uuid},
              {"index", g.index},
              {"name", g.name},
              {"sm_count", g.sm_count},
              {"memory_bytes", g.memory_bytes},
              {"driver_version", g.driver_version},
              {"cuda_version", g.cuda_version}};
}

// Reads a VM requirement from a request; fails with a message naming the field.
Status ParseVm(const Json& j, store::VmRequirement* out) {
  out->vm_ip = Str(j, "vm_ip");
  out->host_ip = Str(j, "host_ip");
  if (out->vm_ip.empty()) return Status::Error("vm_ip is missing");
  auto cu = j.find("compute_units");
  auto mem = j.find("memory_gb");
  if (cu == j.end() || !cu->is_number_integer() || cu->get<int64_t>() <= 0) {
    return Status::Error("compute_units (SMs) of VM " + out->vm_ip + " must be a positive integer");
  }
  if (mem == j.end() || !mem->is_number() || mem->get<double>() <= 0) {
    return Status::Error("memory_gb of VM " + out->vm_ip + " must be a positive number");
  }
  out->compute_units = cu->get<int>();
  out->memory_gb = mem->get<double>();
  out->gpus = 1;
  if (auto g = j.find("gpus"); g != j.end()) {
    if (!g->is_number_integer() || g->get<int64_t>() < 1 || g->get<int64_t>() > INT_MAX) {
      return Status::Error("gpus of VM " + out->vm_ip +
                           " must be a whole number of at least 1, got " + g->dump());
    }
    out->gpus = g->get<int>();
  }
  return Status::Ok();
}

}  // namespace

ClusterManager::ClusterManager(ClusterOptions options, std::unique_ptr<store::Store> store,
                               control::Credentials creds)
    : options_(options),
      store_(std::move(store)),
      creds_(std::move(creds)),
      placement_(options.placement) {}

ClusterManager::~ClusterManager() { Stop(); }

int64_t ClusterManager::NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status ClusterManager::Start() {
  std::vector<store::VmRequirement> vms;
  std::vector<store::Node> nodes;
  std::vector<store::Gpu> gpus;
  std::vector<store::Allocation> allocs;
  Status s = store_->ListVms(&vms);
  if (s.ok()) s = store_->ListNodes(&nodes);
  if (s.ok()) s = store_->ListGpus(&gpus);
  if (s.ok()) s = store_->ListAllocations(&allocs);
  std::vector<store::Checkpoint> checkpoints;
  if (s.ok()) s = store_->ListCheckpoints(&checkpoints);
  if (!s.ok()) return Status::Error("cannot load the cluster state: " + s.message());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& v : vms) vms_[v.vm_ip] = v;
  auto now = Clock::now();
  for (auto& n : nodes) {
    NodeState& ns = nodes_[n.node_id];
    ns.row = n;
    ns.last_seen = now;  // a node that does not come back is down after the usual deadline
    if (n.state == "draining") placement_.SetNodeSchedulable(n.node_id, false);
    if (n.state == "down") placement_.SetNodeSchedulable(n.node_id, false);
  }
  for (auto& g : gpus) {
    auto it = nodes_.find(g.node_id);
    if (it == nodes_.end()) continue;
    it->second.gpus.push_back(g);
    placement_.AddGpu({g.uuid, g.node_id, it->second.row.host_ip, g.sm_count, g.memory_bytes});
  }
  std::vector<std::string> half_moved;  // targets of moves the last run did not finish
  for (auto& a : allocs) {
    if (a.state == "stopping") {
      // A server a finished move replaced (the last run died before it stopped it): gone from
      // the VM; its node reports it at registration and it is stopped then.
      replaced_[a.alloc_id] = a.vm_ip;
      Status d = store_->DeleteAllocation(a.alloc_id);
      if (!d.ok())
        FLYT_ERROR("cannot delete allocation %s: %s", a.alloc_id.c_str(), d.message().c_str());
      continue;
    }
    AllocState& as = allocs_[a.alloc_id];
    as.row = a;
    placement_.Reserve(a.gpu_uuid, a.sm, a.memory_bytes);
    if (a.state == "migrating") {
      as.busy = true;  // not a member of its VM until RecoverMove decides
      half_moved.push_back(a.alloc_id);
      continue;
    }
    vm_allocs_[a.vm_ip].push_back(a.alloc_id);
  }
  for (auto& [vm, ids] : vm_allocs_) {
    std::sort(ids.begin(), ids.end(), [this](const std::string& x, const std::string& y) {
      return allocs_[x].row.ordinal < allocs_[y].row.ordinal;
    });
  }
  LoadCheckpointsLocked(checkpoints);
  // Restores on another node the last run did not finish (their checkpoint's record says
  // how far they got): RecoverRestore finishes or undoes them.
  size_t half_restored = 0;
  for (const auto& [vm_ip, rec] : checkpoints_) {
    if (rec.restoring.stage.empty()) continue;
    ++half_restored;
    for (AllocState* m : MembersLocked(vm_ip)) m->busy = true;
  }
  started_ms_ = NowMs();
  EventLocked("cluster-manager-start", "cluster",
              std::to_string(vms_.size()) + " VMs, " + std::to_string(nodes_.size()) + " nodes, " +
                  std::to_string(allocs_.size()) + " allocations loaded from " + store_->dialect() +
                  (half_moved.empty() ? std::string()
                                      : "; " + std::to_string(half_moved.size()) +
                                            " move(s) were half done: finishing or undoing them "
                                            "once their nodes report") +
                  (half_restored == 0 ? std::string()
                                      : "; " + std::to_string(half_restored) +
                                            " restore(s) on another node were half done: "
                                            "finishing or undoing them once their nodes report"));
  for (const std::string& id : half_moved) {
    // The moved server's VM waits too: nothing else changes it until the move is settled.
    for (AllocState* m : MembersLocked(allocs_[id].row.vm_ip)) m->busy = true;
  }
  monitor_ = std::thread([this] { MonitorLoop(); });
  if (!half_moved.empty() || half_restored > 0) {
    std::lock_guard<std::mutex> bg(bg_mu_);
    background_.emplace_back([this, half_moved] { RecoverMoves(half_moved); });
  }
  return Status::Ok();
}

void ClusterManager::Stop() {
  if (stopping_.exchange(true)) return;
  if (monitor_.joinable()) monitor_.join();
  std::vector<std::thread> bg;
  {
    std::lock_guard<std::mutex> lock(bg_mu_);
    bg.swap(background_);
  }
  for (auto& t : bg) t.join();
}

void ClusterManager::EventLocked(const std::string& kind, const std::string& subject,
                                 const std::string& detail) {
  FLYT_INFO("event %s %s: %s", kind.c_str(), subject.c_str(), detail.c_str());
  ++event_counts_[kind];
  Status s = store_->AddEvent(kind, subject, detail);
  if (!s.ok()) FLYT_ERROR("cannot record event %s: %s", kind.c_str(), s.message().c_str());
}

void ClusterManager::PersistAllocLocked(const AllocState& a) {
  Status s = store_->PutAllocation(a.row);
  if (!s.ok()) {
    FLYT_ERROR("cannot store allocation %s: %s", a.row.alloc_id.c_str(), s.message().c_str());
  }
}

void ClusterManager::MarkRunningLocked(AllocState& a, const std::string& endpoint) {
  a.row.endpoint = endpoint;
  a.row.state = "running";
  a.row.updated_ms = NowMs();
  a.busy = false;
  PersistAllocLocked(a);
}

void ClusterManager::FreeAllocLocked(const std::string& alloc_id) {
  auto it = allocs_.find(alloc_id);
  if (it == allocs_.end()) return;
  const store::Allocation& row = it->second.row;
  placement_.Release(row.gpu_uuid, row.sm, row.memory_bytes);
  if (auto v = vm_allocs_.find(row.vm_ip); v != vm_allocs_.end()) {
    v->second.erase(std::remove(v->second.begin(), v->second.end(), alloc_id), v->second.end());
    if (v->second.empty()) vm_allocs_.erase(v);
  }
  Status s = store_->DeleteAllocation(alloc_id);
  if (!s.ok()) FLYT_ERROR("cannot delete allocation %s: %s", alloc_id.c_str(), s.message().c_str());
  allocs_.erase(it);
  changed_.notify_all();
}

void ClusterManager::FreeVmLocked(const std::string& vm_ip, const std::string& except) {
  auto it = vm_allocs_.find(vm_ip);
  if (it == vm_allocs_.end()) return;
  const std::vector<std::string> ids = it->second;  // a copy: FreeAllocLocked edits the list
  for (const std::string& id : ids) {
    auto a = allocs_.find(id);
    if (a == allocs_.end()) continue;
    if (id != except) {
      const std::string& node_id = a->second.row.node_id;
      auto n = nodes_.find(node_id);
      if (n != nodes_.end() && n->second.row.state != "down") StopServerAsync(node_id, id);
    }
    FreeAllocLocked(id);
  }
}

std::vector<ClusterManager::AllocState*> ClusterManager::MembersLocked(const std::string& vm_ip) {
  std::vector<AllocState*> out;
  auto it = vm_allocs_.find(vm_ip);
  if (it == vm_allocs_.end()) return out;
  for (const std::string& id : it->second) {
    auto a = allocs_.find(id);
    if (a != allocs_.end()) out.push_back(&a->second);
  }
  return out;
}

bool ClusterManager::AnyBusyLocked(const std::string& vm_ip) {
  for (const AllocState* a : MembersLocked(vm_ip)) {
    if (a->busy) return true;
  }
  return false;
}

Json ClusterManager::VmAllocJsonLocked(const std::string& vm_ip) {
  std::vector<AllocState*> members = MembersLocked(vm_ip);
  if (members.empty()) return Json();
  if (members.size() == 1) {
    Json j = AllocJsonLocked(*members[0]);
    j["gpus"] = 1;
    return j;
  }
  std::vector<std::string> ids, nodes, gpus, endpoints;
  Json servers = Json::array();
  std::string state = "running";
  int64_t sessions = 0, memory_used = 0, calls = 0, last_client_ms = 0, restarts = 0;
  for (const AllocState* a : members) {
    Json sj = AllocJsonLocked(*a);
    ids.push_back(a->row.alloc_id);
    nodes.push_back(a->row.node_id);
    gpus.push_back(a->row.gpu_uuid);
    endpoints.push_back(a->row.endpoint);
    if (a->row.state != "running" && state == "running") state = a->row.state;
    sessions = std::max(sessions, Int(sj, "sessions"));  // a client process uses each server
    memory_used += Int(sj, "memory_used");
    calls += Int(sj, "calls");
    last_client_ms = std::max(last_client_ms, a->row.last_client_ms);
    restarts += a->restarts;
    servers.push_back(std::move(sj));
  }
  const store::Allocation& first = members[0]->row;
  return Json{{"alloc_id", Join(ids)},
              {"vm_ip", vm_ip},
              {"gpus", members.size()},
              {"node_id", Join(DistinctNodes(nodes))},
              {"gpu_uuid", Join(gpus)},
              {"placement", DescribeGpuNodes(nodes)},
              {"sm", first.sm},
              {"memory_bytes", first.memory_bytes},
              {"endpoint", JoinEndpoints(endpoints)},
              {"state", state},
              {"created_ms", first.created_ms},
              {"last_client_ms", last_client_ms},
              {"restarts", restarts},
              {"sessions", sessions},
              {"memory_used", memory_used},
              {"calls", calls},
              {"servers", servers}};
}

Json ClusterManager::AllocJsonLocked(const AllocState& a) const {
  const store::Allocation& r = a.row;
  Json j{{"alloc_id", r.alloc_id},
         {"vm_ip", r.vm_ip},
         {"node_id", r.node_id},
         {"gpu_uuid", r.gpu_uuid},
         {"ordinal", r.ordinal},
         {"sm", r.sm},
         {"memory_bytes", r.memory_bytes},
         {"endpoint", r.endpoint},
         {"state", r.state},
         {"created_ms", r.created_ms},
         {"last_client_ms", r.last_client_ms},
         {"restarts", a.restarts}};
  for (const char* k : {"sessions", "memory_used", "calls", "bytes_in", "bytes_out", "idle_ms",
                        "pid", "sm_mechanism"}) {
    if (a.report.contains(k)) j[k] = a.report[k];
  }
  if (!j.contains("sessions")) j["sessions"] = 0;
  if (!j.contains("memory_used")) j["memory_used"] = 0;
  return j;
}

Json ClusterManager::NodeJsonLocked(const NodeState& n) const {
  Json gpus = Json::array();
  for (const auto& g : n.gpus) {
    Json gj = GpuCapacityJson(g);
    if (const GpuUsage* u = placement_.Find(g.uuid)) {
      gj["sm_used"] = u->sm_used;
      gj["memory_used"] = u->memory_used;
      gj["allocations"] = u->allocations;
    }
    gpus.push_back(gj);
  }
  return Json{{"node_id", n.row.node_id},
              {"hostname", n.row.hostname},
              {"address", n.row.address},
              {"host_ip", n.row.host_ip},
              {"state", n.row.state},
              {"mps", n.row.mps},
              {"registered_ms", n.row.registered_ms},
              {"last_heartbeat_ms", n.row.last_heartbeat_ms},
              {"gpus", gpus}};
}

// ---------------------------------------------------------------- dispatch

Json ClusterManager::Handle(const control::Peer& peer, const Json& req) {
  const auto start = Clock::now();
  Json reply = HandleVerb(peer, req);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string verb = req["verb"].get<std::string>();
  const bool ok = !reply.is_object() || !reply.contains("ok") || reply["ok"] != false;
  const std::string outcome = ok ? "ok" : reply.value("code", std::string("error"));
  std::lock_guard<std::mutex> lock(mu_);
  ++request_counts_[{verb, outcome}];
  if (verb == "request-allocation" || verb == "allocate") allocation_seconds_.Observe(seconds);
  return reply;
}

Json ClusterManager::HandleVerb(const control::Peer& peer, const Json& req) {
  const std::string verb = req["verb"].get<std::string>();
  const std::string& role = peer.role;
  auto need = [&](std::initializer_list<const char*> roles) {
    for (const char* r : roles) {
      if (role == r) return true;
    }
    return false;
  };
  if (verb == "register-node" || verb == "heartbeat" || verb == "server-exited") {
    if (!need({"node"})) return Error("bad_request", verb + " is for node managers");
    if (Str(req, "node_id") != peer.name) {
      return Error("bad_request", "node_id must be the name the node manager authenticated with");
    }
    if (verb == "register-node") return RegisterNode(peer, req);
    if (verb == "heartbeat") return Heartbeat(peer, req);
    return ServerExited(peer, req);
  }
  if (verb == "request-allocation") {
    if (!need({"client", "admin"})) return Error("bad_request", verb + " is for client managers");
    return RequestAllocation(Str(req, "vm_ip"));
  }
  if (verb == "locate-server") {
    if (!need({"client", "admin"})) return Error("bad_request", verb + " is for client managers");
    if (role == "client" && Str(req, "vm_ip") != peer.name) {
      return Error("bad_request", "a client manager locates the servers of its own VM only");
    }
    return LocateServer(req);
  }
  if (!need({"admin"})) return Error("bad_request", "'" + verb + "' needs the admin role");
  if (verb == "allocate") {
    Json a = RequestAllocation(Str(req, "vm_ip"));
    a.erase("token");  // the tenant's credential goes to its client manager only
    return a;
  }
  if (verb == "deallocate") return Deallocate(Str(req, "vm_ip"), "operator");
  if (verb == "change-config") return ChangeConfig(req, 0);
  if (verb == "inc-resources") return ChangeConfig(req, +1);
  if (verb == "dec-resources") return ChangeConfig(req, -1);
  if (verb == "list-vms") return ListVms();
  if (verb == "list-nodes" || verb == "list-servernodes") return ListNodes();
  if (verb == "list-servers" || verb == "list-virt-servers") return ListServers();
  if (verb == "list-events") return ListEvents(req);
  if (verb == "show") return Show(req);
  if (verb == "drain-node") return DrainNode(req, true);
  if (verb == "undrain-node") return DrainNode(req, false);
  if (verb == "vm-add") return VmAdd(req);
  if (verb == "vm-remove") return VmRemove(req);
  if (verb == "vm-import") return VmImport(req);
  if (verb == "migrate") return Migrate(req);
  if (verb == "checkpoint") return Checkpoint(req);
  if (verb == "restore") return Restore(req);
  if (verb == "migrate-auto") return MigrateAuto(req);
  return Error("bad_request", "unknown verb '" + verb + "'");
}

// ---------------------------------------------------------------- metrics

std::string ClusterManager::MetricsText() {
  std::lock_guard<std::mutex> lock(mu_);
  cluster::MetricsText m;
  m.Family("flyt_node_up", "gauge", "1 while the node manager reports, 0 when it is down");
  for (const auto& [id, n] : nodes_)
    m.Sample("flyt_node_up", {{"node", id}, {"hostname", n.row.hostname}},
             n.row.state == "down" ? 0 : 1);
  m.Family("flyt_node_draining", "gauge", "1 while the node takes no new tenants");
  for (const auto& [id, n] : nodes_)
    m.Sample("flyt_node_draining", {{"node", id}}, n.row.state == "draining" ? 1 : 0);
  struct GpuFamily {
    const char* name;
    const char* help;
  };
  const GpuFamily gpu_families[] = {
      {"flyt_gpu_sms", "SMs of the GPU"},
      {"flyt_gpu_memory_bytes", "device memory of the GPU"},
      {"flyt_gpu_sms_promised", "SMs promised to the GPU's tenants"},
      {"flyt_gpu_memory_promised_bytes", "device memory promised to the GPU's tenants"},
      {"flyt_gpu_tenants", "tenants placed on the GPU"},
  };
  for (size_t f = 0; f < std::size(gpu_families); ++f) {
    m.Family(gpu_families[f].name, "gauge", gpu_families[f].help);
    for (const auto& [id, n] : nodes_) {
      for (const auto& g : n.gpus) {
        const GpuUsage* u = placement_.Find(g.uuid);
        const double values[] = {static_cast<double>(g.sm_count),
                                 static_cast<double>(g.memory_bytes),
                                 u ? static_cast<double>(u->sm_used) : 0.0,
                                 u ? static_cast<double>(u->memory_used) : 0.0,
                                 u ? static_cast<double>(u->allocations) : 0.0};
        m.Sample(
            gpu_families[f].name,
            {{"node", id}, {"gpu", g.uuid}, {"index", std::to_string(g.index)}, {"name", g.name}},
            values[f]);
      }
    }
  }
  struct TenantFamily {
    const char* name;
    const char* type;
    const char* help;
  };
  const TenantFamily tenant_families[] = {
      {"flyt_tenant_sms", "gauge", "SMs of the tenant's share"},
      {"flyt_tenant_memory_limit_bytes", "gauge", "device memory of the tenant's share"},
      {"flyt_tenant_memory_used_bytes", "gauge", "device memory the tenant's programs hold"},
      {"flyt_tenant_sessions", "gauge", "client processes connected to the tenant's server"},
      {"flyt_tenant_calls_total", "counter", "CUDA calls the tenant's server answered"},
      {"flyt_tenant_received_bytes_total", "counter",
       "bytes the tenant's server received from its clients (frames, headers included)"},
      {"flyt_tenant_sent_bytes_total", "counter", "bytes the tenant's server sent to its clients"},
      {"flyt_tenant_server_restarts_total", "counter", "restarts of the tenant's server"},
      {"flyt_tenant_idle_seconds", "gauge", "time since the tenant's last client left"},
  };
  auto report_number = [](const Json& r, const char* key) {
    return r.contains(key) && r[key].is_number() ? r[key].get<double>() : 0.0;
  };
  for (size_t f = 0; f < std::size(tenant_families); ++f) {
    m.Family(tenant_families[f].name, tenant_families[f].type, tenant_families[f].help);
    for (const auto& [id, a] : allocs_) {
      const double values[] = {static_cast<double>(a.row.sm),
                               static_cast<double>(a.row.memory_bytes),
                               report_number(a.report, "memory_used"),
                               report_number(a.report, "sessions"),
                               report_number(a.report, "calls"),
                               report_number(a.report, "bytes_in"),
                               report_number(a.report, "bytes_out"),
                               static_cast<double>(a.restarts),
                               report_number(a.report, "idle_ms") / 1000.0};
      m.Sample(tenant_families[f].name,
               {{"vm", a.row.vm_ip},
                {"node", a.row.node_id},
                {"gpu", a.row.gpu_uuid},
                {"state", a.row.state}},
               values[f]);
    }
  }
  m.Family("flyt_vms", "gauge", "VMs with required resources registered");
  m.Sample("flyt_vms", {}, static_cast<double>(vms_.size()));
  m.Family("flyt_events_total", "counter",
           "events since the cluster manager started, by kind (placements, refusals, failures)");
  for (const auto& [kind, n] : event_counts_)
    m.Sample("flyt_events_total", {{"kind", kind}}, static_cast<double>(n));
  m.Family("flyt_requests_total", "counter", "requests answered, by verb and outcome");
  for (const auto& [key, n] : request_counts_)
    m.Sample("flyt_requests_total", {{"verb", key.first}, {"outcome", key.second}},
             static_cast<double>(n));
  m.Family("flyt_allocation_request_seconds", "histogram",
           "time to answer an allocation request (placement and server start included)");
  allocation_seconds_.Write(&m, "flyt_allocation_request_seconds", {});
  m.Family("flyt_migration_seconds", "histogram",
           "time a VM's move took, from the plan to its old servers stopped (moves done)");
  migration_seconds_.Write(&m, "flyt_migration_seconds", {});
  return m.text();
}

std::string ClusterManager::DashboardJson() {
  Json out{{"nodes", ListNodes()["nodes"]},
           {"vms", ListVms()["vms"]},
           {"servers", ListServers()["servers"]},
           {"generated_ms", NowMs()}};
  Json events = ListEvents(Json{{"limit", 30}});
  out["events"] = events.contains("events") ? events["events"] : Json::array();
  return out.dump();
}

// ---------------------------------------------------------------- node managers

Json ClusterManager::CallNode(const std::string& node_id, const std::string& verb, const Json& args,
                              Status* status) {
  std::string address;
  std::shared_ptr<std::mutex> call_mu;
  std::shared_ptr<std::unique_ptr<control::Channel>> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) {
      *status = Status::Error("unknown node " + node_id);
      return Json();
    }
    address = it->second.row.address;
    call_mu = it->second.call_mu;
    channel = it->second.channel;
  }
  std::lock_guard<std::mutex> call_lock(*call_mu);
  Json answer;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!*channel) {
      Status s = control::Channel::Dial(address, creds_, "cluster", "cluster-manager", 5000,
                                        channel.get());
      if (!s.ok()) {
        *status = Status::Error("node " + node_id + " unreachable: " + s.message());
        return Json();
      }
    }
    Status s =
        (*channel)->Call(verb, args, &answer, static_cast<int>(options_.node_call_timeout_ms));
    if (s.ok() || answer.contains("ok")) {  // an answer, good or bad: the channel is fine
      *status = s;
      return answer;
    }
    channel->reset();  // broken stream: dial once more
    *status = Status::Error("node " + node_id + ": " + s.message());
  }
  return answer;
}

void ClusterManager::ForgetChannelLocked(NodeState* n) {
  // A call may be in flight on the old channel (it holds its own references):
  // later calls dial afresh instead of touching it.
  n->channel = std::make_shared<std::unique_ptr<control::Channel>>();
  n->call_mu = std::make_shared<std::mutex>();
}

void ClusterManager::StopServerAsync(const std::string& node_id, const std::string& alloc_id) {
  std::lock_guard<std::mutex> lock(bg_mu_);
  if (stopping_.load()) return;
  background_.emplace_back([this, node_id, alloc_id] {
    Status s;
    CallNode(node_id, "stop-server", Json{{"alloc_id", alloc_id}}, &s);
    if (!s.ok())
      FLYT_WARN("stop-server %s on %s: %s", alloc_id.c_str(), node_id.c_str(), s.message().c_str());
  });
}

Json ClusterManager::RegisterNode(const control::Peer&, const Json& req) {
  store::Node row;
  row.node_id = Str(req, "node_id");
  row.hostname = Str(req, "hostname");
  row.address = Str(req, "address");
  row.host_ip = Str(req, "host_ip");
  if (row.host_ip.empty()) row.host_ip = row.address.substr(0, row.address.rfind(':'));
  row.mps = req.value("mps", false);
  if (row.address.empty()) return Error("bad_request", "register-node needs the node's address");
  std::vector<store::Gpu> gpus;
  for (const auto& g : req.value("gpus", Json::array())) {
    store::Gpu gpu;
    gpu.uuid = Str(g, "uuid");
    gpu.node_id = row.node_id;
    gpu.index = static_cast<int>(Int(g, "index"));
    gpu.name = Str(g, "name");
    gpu.sm_count = static_cast<int>(Int(g, "sm_count"));
    gpu.memory_bytes = Int(g, "memory_bytes");
    gpu.driver_version = Str(g, "driver_version");
    gpu.cuda_version = Str(g, "cuda_version");
    if (gpu.uuid.empty() || gpu.sm_count <= 0 || gpu.memory_bytes <= 0) {
      return Error("bad_request", "GPU entry without uuid, sm_count or memory_bytes");
    }
    gpus.push_back(gpu);
  }
  std::lock_guard<std::mutex> lock(mu_);
  NodeState& ns = nodes_[row.node_id];
  bool known = !ns.row.node_id.empty();
  std::string previous = ns.row.state;
  row.registered_ms = known && ns.row.registered_ms ? ns.row.registered_ms : NowMs();
  row.last_heartbeat_ms = NowMs();
  row.state = previous == "draining" ? "draining" : "up";
  if (ns.row.address != row.address) ForgetChannelLocked(&ns);
  ns.row = row;
  ns.gpus = gpus;
  ns.last_seen = Clock::now();
  const std::string scheme = Str(req, "server_scheme");
  ns.server_scheme = scheme == "tls" || scheme == "tcp" ? scheme + "://" : "";
  Status s = store_->UpsertNode(row);
  if (s.ok()) s = store_->ReplaceGpus(row.node_id, gpus);
  if (!s.ok()) return Error("internal", "cannot store node " + row.node_id + ": " + s.message());
  for (const auto& g : gpus) {
    placement_.AddGpu({g.uuid, g.node_id, row.host_ip, g.sm_count, g.memory_bytes});
  }
  placement_.SetNodeSchedulable(row.node_id, row.state == "up");
  EventLocked(known ? "node-reregistered" : "node-registered", row.node_id,
              std::to_string(gpus.size()) + " GPU(s) at " + row.address +
                  (previous == "down" ? " (was down)" : "") + ", reports " +
                  std::to_string(req.value("servers", Json::array()).size()) + " server(s)");
  ApplyReportsLocked(row.node_id, req.value("servers", Json::array()), /*adopt=*/true);
  return Ok({{"heartbeat_ms", options_.heartbeat_ms}});
}

Json ClusterManager::Heartbeat(const control::Peer&, const Json& req) {
  std::string node_id = Str(req, "node_id");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.row.address.empty()) {
    return Error("unknown_node", "node " + node_id + " is not registered; send register-node");
  }
  NodeState& ns = it->second;
  ns.last_seen = Clock::now();
  ns.row.last_heartbeat_ms = NowMs();
  if (ns.row.state == "down") {
    // It missed its deadline but is alive: it must register again so that its servers
    // are reconciled.
    return Error("unknown_node", "node " + node_id + " was declared down; register again");
  }
  ApplyReportsLocked(node_id, req.value("servers", Json::array()), /*adopt=*/false);
  return Ok();
}

void ClusterManager::ApplyReportsLocked(const std::string& node_id, const Json& servers,
                                        bool adopt) {
  std::map<std::string, const Json*> reported;
  for (const auto& r : servers) reported[Str(r, "alloc_id")] = &r;
  for (const auto& [alloc_id, report] : reported) {
    auto it = allocs_.find(alloc_id);
    if (it == allocs_.end() || it->second.row.node_id != node_id) {
      if (auto r = replaced_.find(alloc_id); r != replaced_.end()) {
        EventLocked("replaced-server-stopped", r->second,
                    "the cluster manager restarted while server " + alloc_id + " of VM " +
                        r->second + " on node " + node_id +
                        " was to stop (a move had replaced it, or the VM was deallocated): "
                        "stopping it now");
        replaced_.erase(r);
      } else {
        EventLocked("orphan-server-stopped", alloc_id,
                    "node " + node_id + " runs a server the cluster does not know; stopping it");
      }
      StopServerAsync(node_id, alloc_id);
      continue;
    }
    AllocState& a = it->second;
    a.report = *report;
    std::string state = Str(*report, "state");
    std::string endpoint = Str(*report, "endpoint");
    bool dirty = false;
    if (Int(*report, "sessions") > 0) {
      a.row.last_client_ms = NowMs();
      dirty = a.row.state != "running";  // do not write every heartbeat
    }
    if (!a.busy && state == "running" &&
        (a.row.state != "running" || (!endpoint.empty() && endpoint != a.row.endpoint))) {
      if (a.row.state != "running") {
        EventLocked(adopt ? "server-adopted" : "server-running", alloc_id,
                    "VM " + a.row.vm_ip + " on node " + node_id + " at " + endpoint);
      }
      a.row.state = "running";
      if (!endpoint.empty()) a.row.endpoint = endpoint;
      dirty = true;
    }
    if (dirty) {
      a.row.updated_ms = NowMs();
      PersistAllocLocked(a);
    }
  }
  if (!adopt) return;
  // A re-registering node that lacks a server we placed there lost it (host restart).
  std::vector<std::string> lost;
  for (auto& [id, a] : allocs_) {
    if (a.row.node_id == node_id && !a.busy && !reported.count(id)) lost.push_back(id);
  }
  for (const auto& id : lost) {
    auto it = allocs_.find(id);
    if (it == allocs_.end()) continue;  // freed with a lost sibling
    const std::string vm_ip = it->second.row.vm_ip;
    const size_t others = MembersLocked(vm_ip).size() - 1;
    EventLocked("server-lost", id,
                "node " + node_id + " came back without the server of VM " + vm_ip +
                    "; share freed (the next client allocates again)" +
                    (others ? "; the VM's other " + std::to_string(others) +
                                  " server(s) are stopped too (a VM runs with all its GPUs or none)"
                            : ""));
    FreeVmLocked(vm_ip, id);
  }
}

Json ClusterManager::ServerExited(const control::Peer&, const Json& req) {
  std::string node_id = Str(req, "node_id");
  std::string alloc_id = Str(req, "alloc_id");
  std::string reason = Str(req, "reason");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.find(alloc_id);
  if (it == allocs_.end() || it->second.row.node_id != node_id) {
    return Ok({{"action", "free"}});
  }
  AllocState& a = it->second;
  if (a.busy && a.row.state == "stopping") return Ok({{"action", "free"}});
  bool vm_wants = vms_.count(a.row.vm_ip) > 0;
  if (vm_wants && a.restarts < options_.max_server_restarts) {
    ++a.restarts;
    a.row.state = "restarting";
    a.row.updated_ms = NowMs();
    PersistAllocLocked(a);
    EventLocked("server-restart", alloc_id,
                "server of VM " + a.row.vm_ip + " on node " + node_id + " exited (" + reason +
                    "); restart " + std::to_string(a.restarts) + " of " +
                    std::to_string(options_.max_server_restarts));
    return Ok({{"action", "restart"}});
  }
  const std::string vm_ip = a.row.vm_ip;
  const size_t others = MembersLocked(vm_ip).size() - 1;
  EventLocked("server-failed", alloc_id,
              "server of VM " + vm_ip + " on node " + node_id + " exited (" + reason + "); " +
                  (vm_wants ? "restart limit reached" : "VM removed") + ", share freed" +
                  (others ? "; the VM's other " + std::to_string(others) +
                                " server(s) are stopped too (a VM runs with all its GPUs or none)"
                          : ""));
  FreeVmLocked(vm_ip, alloc_id);
  return Ok({{"action", "free"}});
}

// ---------------------------------------------------------------- allocations

Json ClusterManager::RequestAllocation(const std::string& vm_ip) {
  if (vm_ip.empty()) return Error("bad_request", "vm_ip is missing");
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = Clock::now() + kBusyWait;
  for (;;) {
    auto vit = vms_.find(vm_ip);
    if (vit == vms_.end()) {
      return Error("unknown_vm", "VM " + vm_ip +
                                     " has no required resources in the cluster; add it with "
                                     "`flytctl vm add --vm " +
                                     vm_ip + " --host HOST_IP --sm N --memory GB`");
    }
    std::vector<AllocState*> members = MembersLocked(vm_ip);
    if (members.empty()) break;
    const AllocState* waiting = nullptr;
    const AllocState* down = nullptr;
    for (const AllocState* a : members) {
      if (!waiting && (a->busy || a->row.state == "restarting")) waiting = a;
      if (!down && a->row.state != "running") down = a;
    }
    if (waiting) {
      const std::string state = waiting->row.state;
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
        return Error("server_failed",
                     "the server of VM " + vm_ip + " is still " + state + "; try again");
      }
      continue;
    }
    if (!down) {
      Json j = VmAllocJsonLocked(vm_ip);
      j["token"] = members[0]->row.token;
      return Ok(j);
    }
    // A node is down (or a server failed): place the VM anew, all its GPUs together.
    EventLocked("reallocate", down->row.alloc_id,
                "VM " + vm_ip + "'s server on node " + down->row.node_id + " is " +
                    down->row.state + "; placing the VM again" +
                    (members.size() > 1 ? " (all " + GpuCount(members.size()) +
                                              "; the servers still running are stopped)"
                                        : ""));
    FreeVmLocked(vm_ip, "");
    break;
  }
  const store::VmRequirement vm = vms_[vm_ip];
  const size_t count = static_cast<size_t>(std::max(1, vm.gpus));
  PlacementRequest pr{vm.vm_ip, vm.host_ip, vm.compute_units, GbToBytes(vm.memory_gb)};
  std::vector<std::string> gpus;
  bool one_node = false;
  Status s = placement_.PlaceGroup(pr, static_cast<int>(count), &gpus, &one_node);
  if (!s.ok()) {
    if (count == 1) {
      EventLocked("allocation-refused", vm_ip, s.message());
      return Error("no_capacity", "not enough capacity for VM " + vm_ip + ": " + s.message());
    }
    const std::string why = "VM " + vm_ip + " needs " + GpuCount(count) + " with " +
                            std::to_string(pr.sm) + " SMs and " + Gib(pr.memory_bytes) +
                            " each: " + s.message() +
                            "; nothing was started (a VM gets all its GPUs or none)";
    EventLocked("allocation-refused", vm_ip, why);
    return Error("no_capacity", "not enough capacity: " + why +
                                    ". Free or add GPUs, or lower the VM's GPU count or share "
                                    "(flytctl vm add --vm " +
                                    vm_ip + " ... --gpus N)");
  }
  // One allocation (one flyt-server) per GPU, ordinal i = the i-th pick, one token for all.
  const std::string token = control::RandomHex(24);
  const int64_t now = NowMs();
  std::vector<std::string> ids, node_ids;
  std::vector<Json> starts;
  for (size_t i = 0; i < count; ++i) {
    const GpuUsage* usage = placement_.Find(gpus[i]);
    AllocState a;
    a.busy = true;
    a.row.alloc_id = "a-" + control::RandomHex(6);
    a.row.vm_ip = vm_ip;
    a.row.node_id = usage->capacity.node_id;
    a.row.gpu_uuid = gpus[i];
    a.row.ordinal = static_cast<int>(i);
    a.row.token = token;
    a.row.state = "starting";
    a.row.sm = vm.compute_units;
    a.row.memory_bytes = pr.memory_bytes;
    a.row.created_ms = a.row.updated_ms = now;
    placement_.Reserve(gpus[i], a.row.sm, a.row.memory_bytes);
    ids.push_back(a.row.alloc_id);
    node_ids.push_back(a.row.node_id);
    starts.push_back(Json{{"alloc_id", a.row.alloc_id},
                          {"gpu_uuid", gpus[i]},
                          {"sm", a.row.sm},
                          {"memory_bytes", a.row.memory_bytes},
                          {"token", token}});
    allocs_[a.row.alloc_id] = a;
    vm_allocs_[vm_ip].push_back(a.row.alloc_id);
    PersistAllocLocked(a);
    EventLocked(
        "allocate", a.row.alloc_id,
        "VM " + vm_ip + ": " + std::to_string(a.row.sm) + " SMs, " + Gib(a.row.memory_bytes) +
            " on GPU " + gpus[i] + " of node " + a.row.node_id +
            (count > 1 ? " (GPU " + std::to_string(i) + " of " + std::to_string(count) + ")" : ""));
  }
  if (count > 1) {
    EventLocked("place-group", vm_ip,
                "placed VM " + vm_ip + ": " + DescribeGpuNodes(node_ids) + " (" +
                    std::to_string(pr.sm) + " SMs and " + Gib(pr.memory_bytes) + " each)");
  }
  lock.unlock();
  auto t0 = Clock::now();
  std::vector<Status> started(count);
  std::vector<Json> answers(count);
  RunEach(count, [&](size_t i) {
    answers[i] = CallNode(node_ids[i], "start-server", starts[i], &started[i]);
  });
  lock.lock();
  bool vanished = false;
  size_t failed = count;
  for (size_t i = 0; i < count; ++i) {
    vanished = vanished || !allocs_.count(ids[i]);
    if (failed == count && !started[i].ok()) failed = i;
  }
  if (vanished || failed < count) {
    for (size_t i = 0; i < count; ++i) {
      if (!started[i].ok()) {
        EventLocked("server-start-failed", ids[i],
                    "node " + node_ids[i] + ": " + started[i].message());
      }
    }
    // All or nothing: the servers that did start are stopped before the shares are freed.
    std::vector<size_t> stop;
    for (size_t i = 0; i < count; ++i) {
      if (started[i].ok()) stop.push_back(i);
    }
    if (!stop.empty()) {
      lock.unlock();
      RunEach(stop.size(), [&](size_t k) {
        Status st;
        CallNode(node_ids[stop[k]], "stop-server", Json{{"alloc_id", ids[stop[k]]}}, &st);
        if (!st.ok()) {
          FLYT_WARN("stop-server %s on %s: %s", ids[stop[k]].c_str(), node_ids[stop[k]].c_str(),
                    st.message().c_str());
        }
      });
      lock.lock();
    }
    for (const std::string& id : ids) {
      if (auto it = allocs_.find(id); it != allocs_.end()) it->second.busy = false;
      FreeAllocLocked(id);
    }
    changed_.notify_all();
    if (failed == count) return Error("server_failed", "VM " + vm_ip + " was removed meanwhile");
    if (count == 1) {
      return Error("server_failed", "could not start a server for VM " + vm_ip + " on node " +
                                        node_ids[0] + ": " + started[0].message());
    }
    const std::string why = "could not start the server for GPU " + std::to_string(failed) +
                            " of VM " + vm_ip + " on node " + node_ids[failed] + ": " +
                            started[failed].message() + "; its other " + std::to_string(count - 1) +
                            " server(s) were stopped and nothing stays allocated (a VM gets all "
                            "its GPUs or none)";
    EventLocked("allocation-failed", vm_ip, why);
    return Error("server_failed", why);
  }
  int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  for (size_t i = 0; i < count; ++i) {
    AllocState& cur = allocs_[ids[i]];
    if (answers[i].contains("pid")) cur.report["pid"] = answers[i]["pid"];
    MarkRunningLocked(cur, Str(answers[i], "endpoint"));
    EventLocked("server-started", ids[i],
                "VM " + vm_ip + " at " + cur.row.endpoint + " after " + std::to_string(ms) + " ms" +
                    (count > 1 ? " (GPU " + std::to_string(i) + ")" : ""));
  }
  changed_.notify_all();
  Json j = VmAllocJsonLocked(vm_ip);
  j["token"] = token;
  j["start_ms"] = ms;
  return Ok(j);
}

Json ClusterManager::Deallocate(const std::string& vm_ip, const std::string& why) {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = Clock::now() + kBusyWait;
  for (;;) {
    if (!vm_allocs_.count(vm_ip)) {
      if (!vms_.count(vm_ip)) return Error("unknown_vm", "unknown VM " + vm_ip);
      return Error("unknown_allocation", "VM " + vm_ip + " has no allocation");
    }
    if (!AnyBusyLocked(vm_ip)) break;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return Error("internal", "VM " + vm_ip + "'s allocation stays busy");
    }
  }
  struct StopCall {
    std::string alloc_id, node_id;
    bool node_up = false;
    Status status;
  };
  std::vector<StopCall> stops;
  for (AllocState* a : MembersLocked(vm_ip)) {
    a->busy = true;
    a->row.state = "stopping";
    StopCall c;
    c.alloc_id = a->row.alloc_id;
    c.node_id = a->row.node_id;
    c.node_up = nodes_.count(c.node_id) && nodes_[c.node_id].row.state != "down";
    stops.push_back(std::move(c));
  }
  lock.unlock();
  RunEach(stops.size(), [&](size_t i) {
    if (stops[i].node_up) {
      CallNode(stops[i].node_id, "stop-server", Json{{"alloc_id", stops[i].alloc_id}},
               &stops[i].status);
    }
  });
  lock.lock();
  std::vector<std::string> ids;
  for (size_t i = 0; i < stops.size(); ++i) {
    const StopCall& c = stops[i];
    const Status& s = c.status;
    if (!s.ok()) FLYT_WARN("stop-server %s: %s", c.alloc_id.c_str(), s.message().c_str());
    EventLocked(why == "idle" ? "auto-deallocate" : "deallocate", c.alloc_id,
                "VM " + vm_ip + " on node " + c.node_id + " (" + why + ")" +
                    (stops.size() > 1 ? " (GPU " + std::to_string(i) + " of " +
                                            std::to_string(stops.size()) + ")"
                                      : "") +
                    (s.ok() ? "" : "; stopping it failed: " + s.message()));
    FreeAllocLocked(c.alloc_id);
    ids.push_back(c.alloc_id);
  }
  Json out{{"vm_ip", vm_ip}, {"alloc_id", Join(ids)}, {"gpus", ids.size()}};
  if (ids.size() > 1) out["alloc_ids"] = ids;
  return Ok(out);
}

Json ClusterManager::ChangeConfig(const Json& req, int direction) {
  std::string vm_ip = Str(req, "vm_ip");
  bool has_sm = req.contains("sm") && req["sm"].is_number();
  bool has_mem = req.contains("memory_gb") && req["memory_gb"].is_number();
  if (!has_sm && !has_mem) return Error("bad_request", "give --sm and/or --memory");
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = Clock::now() + kBusyWait;
  while (AnyBusyLocked(vm_ip)) {
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return Error("internal", "VM " + vm_ip + "'s allocation stays busy");
    }
  }
  auto vit = vms_.find(vm_ip);
  if (vit == vms_.end()) return Error("unknown_vm", "unknown VM " + vm_ip);
  store::VmRequirement vm = vit->second;
  int64_t old_sm = vm.compute_units;
  double old_gb = vm.memory_gb;
  // The share is per GPU: each of the VM's servers has it, and each is resized.
  std::vector<AllocState*> members = MembersLocked(vm_ip);
  if (!members.empty()) {
    old_sm = members[0]->row.sm;
    old_gb = static_cast<double>(members[0]->row.memory_bytes) / kGiB;
  }
  int64_t new_sm = old_sm;
  double new_gb = old_gb;
  if (has_sm) {
    int64_t v = req["sm"].get<int64_t>();
    new_sm = direction == 0 ? v : old_sm + direction * v;
  }
  if (has_mem) {
    double v = req["memory_gb"].get<double>();
    new_gb = direction == 0 ? v : old_gb + direction * v;
  }
  if (new_sm <= 0 || new_gb <= 0) {
    return Error("bad_request", "VM " + vm_ip + " would have " + std::to_string(new_sm) +
                                    " SMs and " + std::to_string(new_gb) +
                                    " GB; both must stay positive");
  }
  int64_t new_bytes = GbToBytes(new_gb);
  Json result{{"vm_ip", vm_ip}, {"sm", new_sm}, {"memory_bytes", new_bytes}, {"pause_us", 0}};
  std::string detail;
  bool all_running = !members.empty();
  for (const AllocState* a : members) all_running = all_running && a->row.state == "running";
  if (all_running) {
    const size_t n = members.size();
    for (size_t i = 0; i < n; ++i) {
      const AllocState* a = members[i];
      Status fit = placement_.CanResize(a->row.gpu_uuid, static_cast<int>(new_sm - a->row.sm),
                                        new_bytes - a->row.memory_bytes);
      if (!fit.ok()) {
        std::string why = fit.message();
        if (n > 1) {
          why += " (GPU " + std::to_string(i) + " of " + std::to_string(n) +
                 "; a VM's GPUs are resized together, so none was)";
        }
        EventLocked("change-config-refused", vm_ip, why);
        return Error("no_capacity", "cannot resize VM " + vm_ip + ": " + why);
      }
    }
    struct Resize {
      std::string alloc_id, node_id;
      int old_sm = 0;
      int64_t old_bytes = 0;
      Status status, undo;
      Json answer;
      bool undone = false;
    };
    std::vector<Resize> calls(n);
    for (size_t i = 0; i < n; ++i) {
      members[i]->busy = true;
      calls[i].alloc_id = members[i]->row.alloc_id;
      calls[i].node_id = members[i]->row.node_id;
      calls[i].old_sm = members[i]->row.sm;
      calls[i].old_bytes = members[i]->row.memory_bytes;
    }
    lock.unlock();
    RunEach(n, [&](size_t i) {
      calls[i].answer = CallNode(
          calls[i].node_id, "set-share",
          Json{{"alloc_id", calls[i].alloc_id}, {"sm", new_sm}, {"memory_bytes", new_bytes}},
          &calls[i].status);
    });
    size_t failed = n;
    for (size_t i = 0; i < n && failed == n; ++i) {
      if (!calls[i].status.ok()) failed = i;
    }
    if (failed < n && n > 1) {
      // Set the GPUs that did change back, so that the VM's GPUs keep one share.
      RunEach(n, [&](size_t i) {
        if (!calls[i].status.ok()) return;
        CallNode(calls[i].node_id, "set-share",
                 Json{{"alloc_id", calls[i].alloc_id},
                      {"sm", calls[i].old_sm},
                      {"memory_bytes", calls[i].old_bytes}},
                 &calls[i].undo);
        calls[i].undone = calls[i].undo.ok();
      });
    }
    lock.lock();
    std::vector<AllocState*> now;
    for (const Resize& c : calls) {
      auto it = allocs_.find(c.alloc_id);
      if (it != allocs_.end()) {
        it->second.busy = false;
        now.push_back(&it->second);
      }
    }
    changed_.notify_all();
    if (now.size() != n) return Error("unknown_allocation", "allocation vanished meanwhile");
    // Account what each server really has now.
    int64_t pause_us = 0;
    for (size_t i = 0; i < n; ++i) {
      const Resize& c = calls[i];
      if (!c.status.ok() || c.undone) continue;
      AllocState* a = now[i];
      int64_t applied_sm = Int(c.answer, "sm", new_sm);
      placement_.Release(a->row.gpu_uuid, a->row.sm, a->row.memory_bytes);
      placement_.Reserve(a->row.gpu_uuid, static_cast<int>(applied_sm), new_bytes);
      a->row.sm = static_cast<int>(applied_sm);
      a->row.memory_bytes = new_bytes;
      a->row.updated_ms = NowMs();
      PersistAllocLocked(*a);
      pause_us = std::max(pause_us, Int(c.answer, "pause_us"));
      if (i == 0) result["sm"] = applied_sm;
    }
    if (failed < n) {
      std::string why = calls[failed].status.message();
      if (n > 1) {
        why = "GPU " + std::to_string(failed) + " of " + std::to_string(n) + " (node " +
              calls[failed].node_id + "): " + why + "; the others were set back";
        for (const Resize& c : calls) {
          if (c.status.ok() && !c.undone) {
            why +=
                " except " + c.alloc_id + " (" + c.undo.message() + "), which keeps the new share";
          }
        }
      }
      EventLocked("change-config-failed", vm_ip, why);
      return Error("server_failed", "resizing VM " + vm_ip + " failed: " + why);
    }
    result["pause_us"] = pause_us;
    result["applied"] = "live";
    result["gpus"] = n;
    detail = " live" + (n > 1 ? " on " + GpuCount(n) : std::string()) + ", pause " +
             std::to_string(pause_us) + " µs";
  } else {
    result["applied"] = "stored";
    detail = members.empty() ? " stored (no running server)"
                             : " stored (its servers are not all running; the next allocation "
                               "gets it)";
  }
  vm.compute_units = static_cast<int>(new_sm);
  vm.memory_gb = new_gb;
  Status s = store_->UpsertVm(vm);
  if (!s.ok()) return Error("internal", "cannot store VM " + vm_ip + ": " + s.message());
  vms_[vm_ip] = vm;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "SMs %" PRId64 " -> %" PRId64 ", memory %.1f -> %.1f GB", old_sm,
                result["sm"].get<int64_t>(), old_gb, new_gb);
  EventLocked(direction == 0  ? "change-config"
              : direction > 0 ? "inc-resources"
                              : "dec-resources",
              vm_ip, buf + detail);
  return Ok(result);
}

// ---------------------------------------------------------------- operator views

Json ClusterManager::ListVms() {
  std::lock_guard<std::mutex> lock(mu_);
  Json vms = Json::array();
  for (const auto& [ip, v] : vms_) {
    Json j = VmJson(v);
    if (vm_allocs_.count(ip)) j["allocation"] = VmAllocJsonLocked(ip);
    if (auto c = checkpoints_.find(ip); c != checkpoints_.end())
      j["checkpoint"] = CheckpointJson(c->second);
    vms.push_back(j);
  }
  return Ok({{"vms", vms}});
}

Json ClusterManager::ListNodes() {
  std::lock_guard<std::mutex> lock(mu_);
  Json nodes = Json::array();
  for (const auto& [id, n] : nodes_) nodes.push_back(NodeJsonLocked(n));
  return Ok({{"nodes", nodes}});
}

Json ClusterManager::ListServers() {
  std::lock_guard<std::mutex> lock(mu_);
  Json servers = Json::array();
  for (const auto& [id, a] : allocs_) servers.push_back(AllocJsonLocked(a));
  return Ok({{"servers", servers}});
}

Json ClusterManager::ListEvents(const Json& req) {
  int64_t limit = Int(req, "limit", 50);
  std::vector<store::Event> events;
  Status s = store_->ListEvents(Int(req, "after_id", 0), 0, &events);
  if (!s.ok()) return Error("internal", "cannot read events: " + s.message());
  size_t first = limit > 0 && events.size() > static_cast<size_t>(limit)
                     ? events.size() - static_cast<size_t>(limit)
                     : 0;
  Json out = Json::array();
  for (size_t i = first; i < events.size(); ++i) {
    const auto& e = events[i];
    out.push_back(Json{{"id", e.id},
                       {"time_ms", e.time_ms},
                       {"kind", e.kind},
                       {"subject", e.subject},
                       {"detail", e.detail}});
  }
  return Ok({{"events", out}});
}

Json ClusterManager::Show(const Json& req) {
  std::string key = Str(req, "id");
  for (const char* k : {"vm_ip", "node_id", "alloc_id"}) {
    if (key.empty()) key = Str(req, k);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto v = vms_.find(key); v != vms_.end()) {
    Json j = VmJson(v->second);
    if (vm_allocs_.count(key)) j["allocation"] = VmAllocJsonLocked(key);
    if (auto c = checkpoints_.find(key); c != checkpoints_.end())
      j["checkpoint"] = CheckpointJson(c->second);
    return Ok({{"kind", "vm"}, {"vm", j}});
  }
  if (auto n = nodes_.find(key); n != nodes_.end()) {
    Json servers = Json::array();
    for (const auto& [id, a] : allocs_) {
      if (a.row.node_id == key) servers.push_back(AllocJsonLocked(a));
    }
    Json j = NodeJsonLocked(n->second);
    j["servers"] = servers;
    return Ok({{"kind", "node"}, {"node", j}});
  }
  if (auto a = allocs_.find(key); a != allocs_.end()) {
    return Ok({{"kind", "allocation"}, {"allocation", AllocJsonLocked(a->second)}});
  }
  return Error("unknown_vm", "no VM, node or allocation is called '" + key + "'");
}

Json ClusterManager::DrainNode(const Json& req, bool drain) {
  std::string node_id = Str(req, "node_id");
  // drain-node moves the node's VMs to other nodes unless told not to (migrate: false).
  const bool migrate =
      drain && !(req.contains("migrate") && req["migrate"].is_boolean() && !req["migrate"]);
  std::vector<std::string> vms;  // VMs with a server on the node
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) return Error("unknown_node", "unknown node " + node_id);
    NodeState& n = it->second;
    if (n.row.state != "down") n.row.state = drain ? "draining" : "up";
    placement_.SetNodeSchedulable(node_id, !drain && n.row.state == "up");
    Status s = store_->UpsertNode(n.row);
    if (!s.ok()) return Error("internal", "cannot store node " + node_id + ": " + s.message());
    int running = 0;
    for (const auto& [id, a] : allocs_) {
      if (a.row.node_id != node_id || a.row.state == "migrating") continue;
      ++running;
      if (std::find(vms.begin(), vms.end(), a.row.vm_ip) == vms.end()) vms.push_back(a.row.vm_ip);
    }
    if (!migrate || vms.empty() || n.row.state == "down") {
      EventLocked(
          drain ? "drain-node" : "undrain-node", node_id,
          drain ? "no new allocations; " + std::to_string(running) +
                      " running allocation(s) stay until they end" +
                      (migrate && n.row.state == "down" ? " (the node is down: nothing moves)" : "")
                : "takes new allocations again");
      return Ok({{"node_id", node_id},
                 {"state", n.row.state},
                 {"allocations", running},
                 {"migrate", false}});
    }
    EventLocked(
        "drain-node", node_id,
        "no new allocations; moving its " + std::to_string(vms.size()) + " VM(s) to other nodes");
  }
  Json moved = Json::array(), failed = Json::array();
  for (const std::string& vm : vms) {
    PlacementFilter filter;
    filter.avoid_nodes = {node_id};
    Json r = MoveVm(
        vm, filter, [&](const store::Allocation& a) { return a.node_id == node_id; },
        "drain-node " + node_id, options_.migrate_wait_ms);
    if (r.value("ok", false)) {
      moved.push_back(Json{{"vm_ip", vm}, {"endpoint", r["allocation"].value("endpoint", "")}});
    } else if (r.value("code", "") != "bad_request" ||
               r.value("error", "").find("nothing to move") == std::string::npos) {
      failed.push_back(Json{{"vm_ip", vm}, {"error", r.value("error", "")}});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  int running = 0;
  for (const auto& [id, a] : allocs_) running += a.row.node_id == node_id;
  std::string failures;
  for (const Json& f : failed)
    failures += (failures.empty() ? "" : ", ") + f["vm_ip"].get<std::string>();
  EventLocked(
      "drain-node-done", node_id,
      std::to_string(moved.size()) + " VM(s) moved to other nodes" +
          (failed.empty() ? std::string()
                          : ", " + std::to_string(failed.size()) + " could not move and stay (" +
                                failures + "; see their migrate-failed events)") +
          "; " + std::to_string(running) + " allocation(s) left on the node");
  return Ok({{"node_id", node_id},
             {"state", nodes_[node_id].row.state},
             {"allocations", running},
             {"migrate", true},
             {"moved", moved},
             {"failed", failed}});
}

Json ClusterManager::VmAdd(const Json& req) {
  store::VmRequirement vm;
  Status s = ParseVm(req, &vm);
  if (!s.ok()) return Error("bad_request", s.message());
  std::lock_guard<std::mutex> lock(mu_);
  bool existed = vms_.count(vm.vm_ip) > 0;
  s = store_->UpsertVm(vm);
  if (!s.ok()) return Error("internal", "cannot store VM " + vm.vm_ip + ": " + s.message());
  vms_[vm.vm_ip] = vm;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%d SMs, %.1f GB%s", vm.compute_units, vm.memory_gb,
                vm.gpus > 1 ? (" on each of " + std::to_string(vm.gpus) + " GPUs").c_str() : "");
  EventLocked(existed ? "vm-update" : "vm-add", vm.vm_ip,
              "host " + vm.host_ip + ", " + buf + " (applies at its next allocation)");
  return Ok({{"vm", VmJson(vm)}});
}

Json ClusterManager::VmRemove(const Json& req) {
  std::string vm_ip = Str(req, "vm_ip");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!vms_.count(vm_ip)) return Error("unknown_vm", "unknown VM " + vm_ip);
  }
  bool had_alloc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    had_alloc = vm_allocs_.count(vm_ip) > 0;
  }
  if (had_alloc) Deallocate(vm_ip, "VM removed");
  std::lock_guard<std::mutex> lock(mu_);
  Status s = store_->RemoveVm(vm_ip, nullptr);
  if (!s.ok()) return Error("internal", "cannot remove VM " + vm_ip + ": " + s.message());
  vms_.erase(vm_ip);
  DropCheckpointLocked(vm_ip);
  EventLocked("vm-remove", vm_ip, had_alloc ? "its allocation was stopped" : "");
  return Ok({{"vm_ip", vm_ip}});
}

Json ClusterManager::VmImport(const Json& req) {
  std::vector<store::VmRequirement> vms;
  for (const auto& j : req.value("vms", Json::array())) {
    store::VmRequirement vm;
    Status s = ParseVm(j, &vm);
    if (!s.ok())
      return Error("bad_request", "entry " + std::to_string(vms.size() + 1) + ": " + s.message());
    vms.push_back(vm);
  }
  std::lock_guard<std::mutex> lock(mu_);
  Status s = store_->UpsertVms(vms);
  if (!s.ok()) return Error("internal", "cannot import VMs: " + s.message());
  int added = 0;
  for (const auto& v : vms) {
    added += vms_.count(v.vm_ip) == 0;
    vms_[v.vm_ip] = v;
  }
  EventLocked("vm-import", "cluster",
              std::to_string(vms.size()) + " VM(s), " + std::to_string(added) + " new");
  return Ok({{"imported", vms.size()}, {"new", added}});
}

// ---------------------------------------------------------------- monitor

void ClusterManager::MonitorLoop() {
  const auto tick = std::chrono::milliseconds(std::max<int64_t>(20, options_.heartbeat_ms / 4));
  while (!stopping_.load()) {
    std::this_thread::sleep_for(tick);
    std::vector<std::string> idle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto now = Clock::now();
      auto deadline =
          std::chrono::milliseconds(options_.heartbeat_ms * options_.node_dead_after_heartbeats);
      for (auto& [id, n] : nodes_) {
        if (n.row.state == "down" || now - n.last_seen <= deadline) continue;
        int64_t silent =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_seen).count();
        n.row.state = "down";
        placement_.SetNodeSchedulable(id, false);
        ForgetChannelLocked(&n);
        Status s = store_->UpsertNode(n.row);
        if (!s.ok()) FLYT_ERROR("cannot store node %s: %s", id.c_str(), s.message().c_str());
        int lost = 0;
        for (auto& [aid, a] : allocs_) {
          if (a.row.node_id != id || a.busy) continue;
          a.row.state = "node_down";
          a.row.updated_ms = NowMs();
          PersistAllocLocked(a);
          ++lost;
        }
        EventLocked("node-down", id,
                    "no heartbeat for " + std::to_string(silent) + " ms; " + std::to_string(lost) +
                        " allocation(s) affected");
      }
      if (options_.idle_grace_ms > 0) {
        // A VM is idle when every one of its servers is: the VM is freed whole.
        for (const auto& entry : vm_allocs_) {
          const std::string& vm_ip = entry.first;
          std::vector<AllocState*> members = MembersLocked(vm_ip);
          bool all_idle = !members.empty();
          for (const AllocState* a : members) {
            all_idle = all_idle && !a->busy && !a->checkpointed && a->row.state == "running" &&
                       a->report.contains("idle_ms") && Int(a->report, "sessions") == 0 &&
                       Int(a->report, "idle_ms") >= options_.idle_grace_ms;
          }
          if (!all_idle) continue;
          idle.push_back(vm_ip);
          // Until the next report, so that it is not picked twice.
          for (AllocState* a : members) a->report["idle_ms"] = 0;
        }
      }
    }
    for (const auto& vm : idle) {
      std::lock_guard<std::mutex> lock(bg_mu_);
      if (stopping_.load()) break;
      background_.emplace_back([this, vm] { Deallocate(vm, "idle"); });
    }
    // Rebalance now and then (rebalance_interval_ms), one run at a time.
    if (options_.rebalance_interval_ms > 0 &&
        Clock::now() - last_rebalance_ >=
            std::chrono::milliseconds(options_.rebalance_interval_ms) &&
        !rebalancing_.exchange(true)) {
      last_rebalance_ = Clock::now();
      std::lock_guard<std::mutex> lock(bg_mu_);
      if (!stopping_.load()) {
        background_.emplace_back([this] {
          MigrateAuto(Json{{"automatic", true}});
          rebalancing_ = false;
        });
      } else {
        rebalancing_ = false;
      }
    }
    // Reap finished background threads now and then.
    std::lock_guard<std::mutex> lock(bg_mu_);
    if (background_.size() > 64) {
      for (auto& t : background_) t.join();
      background_.clear();
    }
  }
}

}  // namespace flyt::cluster
