#include "node/node_manager.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/log.h"
#include "transport/transport.h"

namespace flyt::node {
namespace {

using control::Json;
using Clock = std::chrono::steady_clock;

constexpr int kDialTimeoutMs = 5000;
constexpr int kCallTimeoutMs = 10000;
constexpr int kBackoffFirstMs = 500;
constexpr int kBackoffMaxMs = 10000;
// migrate/checkpoint/restore: the longest wait_ms passed on, and how much longer than
// wait_ms the server may take to answer.
constexpr int64_t kMaxMoveWaitMs = 10 * 60 * 1000;
constexpr int kMoveAnswerMarginMs = 10000;

// Required string field.
Status GetString(const Json& req, const char* key, std::string* out) {
  auto it = req.find(key);
  if (it == req.end() || !it->is_string())
    return Status::Error(std::string("missing or non-string field \"") + key + "\"");
  *out = it->get<std::string>();
  return Status::Ok();
}

// Required non-negative integer field.
Status GetCount(const Json& req, const char* key, int64_t* out) {
  auto it = req.find(key);
  if (it == req.end() || !(it->is_number_integer() || it->is_number_unsigned()) ||
      (it->is_number_integer() && it->get<int64_t>() < 0) ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
    return Status::Error(std::string("missing field \"") + key +
                         "\" or not a non-negative integer");
  *out = it->get<int64_t>();
  return Status::Ok();
}

std::string ExecutableDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The session files (*.flyt) of a checkpoint folder, as full paths.
std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".flyt") == 0)
      out.push_back(dir + "/" + name);
  }
  return out;
}

// Checkpoint shipping: bytes per read-checkpoint answer (base64 keeps it under the 16 MiB
// of a control message).
constexpr int64_t kShipChunk = 4 << 20;

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64(const uint8_t* p, size_t n) {
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t v = static_cast<uint32_t>(p[i]) << 16 |
                       (i + 1 < n ? static_cast<uint32_t>(p[i + 1]) << 8 : 0) |
                       (i + 2 < n ? p[i + 2] : 0);
    out += kBase64[v >> 18 & 63];
    out += kBase64[v >> 12 & 63];
    out += i + 1 < n ? kBase64[v >> 6 & 63] : '=';
    out += i + 2 < n ? kBase64[v & 63] : '=';
  }
  return out;
}

bool Unbase64(const std::string& in, std::vector<uint8_t>* out) {
  if (in.size() % 4 != 0) return false;
  out->clear();
  out->reserve(in.size() / 4 * 3);
  auto value = [](char c) -> int {
    const char* at = std::strchr(kBase64, c);
    return c != '\0' && at != nullptr ? static_cast<int>(at - kBase64) : -1;
  };
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      if (in[i + k] == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = value(in[i + k])) < 0) {
        return false;
      }
    }
    const uint32_t w = static_cast<uint32_t>(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
    out->push_back(static_cast<uint8_t>(w >> 16));
    if (pad < 2) out->push_back(static_cast<uint8_t>(w >> 8));
    if (pad < 1) out->push_back(static_cast<uint8_t>(w));
  }
  return true;
}

// A file name a checkpoint may hold: session-N.flyt, nothing with a path in it.
bool SessionFileName(const std::string& name) {
  return name.size() > 5 && name.size() < 256 && name.find('/') == std::string::npos &&
         name[0] != '.' && name.compare(name.size() - 5, 5, ".flyt") == 0;
}

// A transfer id or a gpuN folder: letters, digits and '-' only.
bool PlainName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
  }
  return true;
}

// A refusal is an answer with ok:false; anything else is a dead channel.
bool IsRefusal(const Json& answer) { return answer.is_object() && answer.contains("ok"); }

// A string field of an answer, "" when absent or not a string.
std::string StringOf(const Json& answer, const char* key) {
  if (!answer.is_object()) return "";
  auto it = answer.find(key);
  return it != answer.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

void RegisterSettings(control::Settings* s, NodeConfig* c) {
  s->Add("listen", &c->listen, "address for commands from the cluster manager");
  s->Add("advertise_host", &c->advertise_host,
         "host that clients dial for this node's servers (default: first non-loopback IPv4)");
  s->Add("host_ip", &c->host_ip,
         "this host's IP as VMs' host_ip names it, for placement (default: advertise_host)");
  s->Add("node_id", &c->node_id, "this node's name in the cluster (default: host name)");
  s->Add("cluster_manager", &c->cluster_manager, "HOST:PORT of the cluster manager");
  s->Add("secret", &c->secret, "cluster secret (default: $FLYT_SECRET, else secret_file)");
  s->Add("secret_file", &c->secret_file,
         "file holding the cluster secret (default: <state_dir>/cluster.secret)");
  control::AddTlsSettings(s, &c->tls);
  s->Add("heartbeat_ms", &c->heartbeat_ms,
         "interval of heartbeats (the cluster manager's answer to register-node overrides it)");
  s->Add("state_dir", &c->state_dir, "folder for state (default: $FLYT_STATE_DIR or per user)");
  s->Add("run_dir", &c->run_dir,
         "folder for servers' control sockets, logs and state (default: <state_dir>/node)");
  s->Add("server_binary", &c->server_binary,
         "path of flyt-server (default: next to flyt-node-manager)");
  s->Add("server_backend", &c->server_backend, "flyt-server --backend: cuda, or sim for tests");
  s->Add("server_listen_host", &c->server_listen_host,
         "host servers listen on (port chosen by the kernel)");
  s->Add("server_sm_mechanism", &c->server_sm_mechanism,
         "how SM shares are enforced: green (green contexts in the server) or mps "
         "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, needs mps=true)");
  s->Add("server_shared_memory", &c->server_shared_memory,
         "servers also listen on a shm:// socket in run_dir; clients on this host move to it");
  s->Add("server_movable_memory", &c->server_movable_memory,
         "servers run with --movable-memory, so that migrate, drain-node and checkpoint move "
         "tenants on GPUs reliably; legacy CUDA IPC of cuMemAlloc memory is then refused");
  s->Add("server_tls", &c->server_tls,
         "servers listen on tls:// (TLS 1.3 with tls_cert and tls_key) instead of tcp://; "
         "clients then need FLYT_TLS_CA");
  s->Add("inventory", &c->inventory,
         "GPUs: nvml (the real ones), sim:N or sim:FILE.json (simulated, for tests)");
  s->Add("mps", &c->mps, "run flyt-servers under an MPS control daemon");
  s->Add("mps_control", &c->mps_control, "path of nvidia-cuda-mps-control");
  s->Add("mps_pipe_dir", &c->mps_pipe_dir, "MPS pipe folder (default: <run_dir>/mps-pipe)");
  s->Add("mps_log_dir", &c->mps_log_dir, "MPS log folder (default: <run_dir>/mps-log)");
  s->Add("mps_memory_limit", &c->mps_memory_limit,
         "under MPS, also cap each server's device memory with "
         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (off by default: flyt-server enforces the quota "
         "itself, and MPS's cap is fixed at start so set-share could not raise it)");
  s->Add("ready_timeout_ms", &c->ready_timeout_ms,
         "how long a starting flyt-server may take to answer on its control socket");
  s->Add("stop_timeout_ms", &c->stop_timeout_ms, "SIGTERM to SIGKILL delay when stopping a server");
}

Status ResolveDefaults(NodeConfig* c) {
  if (c->node_id.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0')
      return Status::Error(std::string("cannot read the host name (") + std::strerror(errno) +
                           "): set node_id");
    c->node_id = host;
  }
  if (c->advertise_host.empty()) c->advertise_host = control::DefaultHostAddress();
  if (c->host_ip.empty()) c->host_ip = c->advertise_host;
  if (c->state_dir.empty()) c->state_dir = control::DefaultStateDir();
  if (c->secret_file.empty()) c->secret_file = c->state_dir + "/cluster.secret";
  if (c->run_dir.empty()) c->run_dir = c->state_dir + "/node";
  if (c->mps_pipe_dir.empty()) c->mps_pipe_dir = c->run_dir + "/mps-pipe";
  if (c->mps_log_dir.empty()) c->mps_log_dir = c->run_dir + "/mps-log";
  if (c->server_binary.empty()) c->server_binary = ExecutableDir() + "/flyt-server";
  if (c->heartbeat_ms < 50 || c->heartbeat_ms > 3600000)
    return Status::Error("heartbeat_ms must be between 50 and 3600000, not " +
                         std::to_string(c->heartbeat_ms));
  if (c->ready_timeout_ms < 100 || c->ready_timeout_ms > 600000)
    return Status::Error("ready_timeout_ms must be between 100 and 600000, not " +
                         std::to_string(c->ready_timeout_ms));
  if (c->stop_timeout_ms < 0 || c->stop_timeout_ms > 600000)
    return Status::Error("stop_timeout_ms must be between 0 and 600000, not " +
                         std::to_string(c->stop_timeout_ms));
  if (c->server_sm_mechanism != "green" && c->server_sm_mechanism != "mps")
    return Status::Error("server_sm_mechanism must be green or mps, not '" +
                         c->server_sm_mechanism + "'");
  if (c->server_sm_mechanism == "mps" && !c->mps)
    return Status::Error("server_sm_mechanism=mps needs mps=true");
  if (c->server_backend != "cuda" && c->server_backend != "sim")
    return Status::Error("server_backend must be cuda or sim, not '" + c->server_backend + "'");
  if (c->server_listen_host.empty()) return Status::Error("server_listen_host must not be empty");
  if (c->server_tls && (c->tls.cert.empty() || c->tls.key.empty()))
    return Status::Error("server_tls needs tls_cert and tls_key (the servers' certificate)");
  return Status::Ok();
}

NodeManager::NodeManager(NodeConfig config) : config_(std::move(config)) {}

NodeManager::~NodeManager() { Shutdown(); }

Status NodeManager::Start() {
  Status st = control::LoadSecret(config_.secret, config_.secret_file, /*create=*/false, &creds_);
  if (st.ok()) {
    st = control::LoadTls(config_.tls, &creds_);
    if (!st.ok()) return st;
  }
  if (!st.ok())
    return Status::Error("no cluster secret: " + st.message() +
                         " (copy the cluster manager's secret file to " + config_.secret_file +
                         " with mode 0600, or set secret / FLYT_SECRET)");
  if (creds_.secret.empty())
    return Status::Error(
        "the cluster secret is empty: the node manager takes commands only from "
        "an authenticated cluster manager; set secret or secret_file");
  st = LoadInventory(config_.inventory, config_.node_id, &gpus_);
  if (!st.ok()) return st;
  if (gpus_.empty()) FLYT_WARN("no GPU found (inventory=%s)", config_.inventory.c_str());
  for (const auto& g : gpus_)
    FLYT_INFO("GPU %d: %s, %s, %d SMs, %lld MiB", g.index, g.name.c_str(), g.uuid.c_str(),
              g.sm_count, static_cast<long long>(g.memory_bytes >> 20));
  if (IsSimulatedInventory(config_.inventory) && config_.server_backend == "cuda")
    FLYT_WARN(
        "simulated GPUs with server_backend=cuda: servers will not find these GPUs; "
        "use server_backend=sim");
  if (config_.mps) {
    MpsOptions mo;
    mo.control_binary = config_.mps_control;
    mo.pipe_dir = config_.mps_pipe_dir;
    mo.log_dir = config_.mps_log_dir;
    st = mps_.Start(mo);
    if (!st.ok()) return st;
  }
  SupervisorOptions so;
  so.server_binary = config_.server_binary;
  so.backend = config_.server_backend;
  so.listen_host = config_.server_listen_host;
  so.advertise_host = config_.advertise_host;
  so.run_dir = config_.run_dir;
  so.ready_timeout_ms = static_cast<int>(config_.ready_timeout_ms);
  so.stop_timeout_ms = static_cast<int>(config_.stop_timeout_ms);
  so.pin_gpu = !IsSimulatedInventory(config_.inventory);
  so.shared_memory = config_.server_shared_memory;
  so.movable_memory = config_.server_movable_memory;
  if (config_.server_tls) {
    so.tls_cert = config_.tls.cert;
    so.tls_key = config_.tls.key;
    so.tls_peer_ca = config_.tls.ca;  // the CA of every node's certificate
  }
  so.extra_env = [this](const ServerParams& p) { return ServerEnv(p); };
  so.on_exit = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
    cv_.notify_all();
  };
  supervisor_ = std::make_unique<ServerSupervisor>(std::move(so));
  st = supervisor_->Open();
  if (!st.ok()) return st;
  st = control::Listener::Start(
      config_.listen, creds_,
      [this](const control::Peer& peer, const Json& request) { return Handle(peer, request); },
      &listener_);
  if (!st.ok())
    return Status::Error("cannot listen for the cluster manager: " + st.message() +
                         " (set listen, or stop whatever holds the port)");
  listen_address_ = listener_->Describe();
  reporter_ = std::thread([this] { ReportLoop(); });
  return Status::Ok();
}

void NodeManager::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stop_ = true;
    cv_.notify_all();
  }
  // Servers first: a start-server still waiting for readiness then returns at
  // once, and the listener (which waits for its handlers) stops quickly.
  if (supervisor_) supervisor_->StopAll();
  if (listener_) listener_->Stop();
  if (reporter_.joinable()) reporter_.join();
  Status st = mps_.Quit();
  if (!st.ok()) FLYT_ERROR("%s", st.message().c_str());
}

std::string NodeManager::ListenAddress() const { return listen_address_; }

std::string NodeManager::AdvertisedAddress() const {
  transport::Address a;
  int port = 12401;
  if (transport::ParseAddress(listen_address_.empty() ? config_.listen : listen_address_, &a).ok())
    port = a.port;
  std::string host = config_.advertise_host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return host + ":" + std::to_string(port);
}

const GpuInfo* NodeManager::FindGpu(const std::string& uuid) const {
  for (const auto& g : gpus_)
    if (g.uuid == uuid) return &g;
  return nullptr;
}

EnvList NodeManager::ServerEnv(const ServerParams& p) const {
  if (!config_.mps) return {};
  int pct = 0;
  if (config_.server_sm_mechanism == "mps") {
    const GpuInfo* g = FindGpu(p.gpu_uuid);
    pct = MpsDaemon::ActiveThreadPercentage(p.sm, g ? g->sm_count : 0);
  }
  return mps_.ServerEnv(config_.mps_memory_limit ? p.memory_bytes : 0, pct);
}

Json NodeManager::Handle(const control::Peer& peer, const Json& request) {
  if (peer.role != "cluster")
    return control::Error("bad_request",
                          "flyt-node-manager takes commands only from the cluster manager (role "
                          "\"cluster\"); this connection authenticated as role \"" +
                              peer.role + "\" (name \"" + peer.name + "\")");
  try {
    std::string verb;
    if (!request.is_object() || !GetString(request, "verb", &verb).ok())
      return control::Error("bad_request", "a request needs a \"verb\"");
    if (verb == "start-server") return StartServer(request);
    if (verb == "stop-server") return StopServer(request);
    if (verb == "set-share") return SetShare(request);
    if (verb == "list-servers") return ListServers();
    if (verb == "migrate" || verb == "checkpoint" || verb == "restore")
      return MoveSessions(verb, request);
    if (verb == "list-checkpoint" || verb == "read-checkpoint" || verb == "write-checkpoint" ||
        verb == "drop-checkpoint-copy" || verb == "spend-checkpoint")
      return CheckpointFilesVerb(verb, request);
    return control::Error("bad_request", "unknown verb '" + verb +
                                             "': the node manager answers start-server, "
                                             "stop-server, set-share, list-servers, migrate, "
                                             "checkpoint, restore, list-checkpoint, "
                                             "read-checkpoint, write-checkpoint, "
                                             "drop-checkpoint-copy, spend-checkpoint");
  } catch (const Json::exception& e) {
    return control::Error("bad_request", std::string("malformed request: ") + e.what());
  }
}

Json NodeManager::StartServer(const Json& req) {
  ServerParams p;
  Status st = GetString(req, "alloc_id", &p.alloc_id);
  if (st.ok()) st = GetString(req, "gpu_uuid", &p.gpu_uuid);
  if (st.ok()) st = GetCount(req, "sm", &p.sm);
  if (st.ok()) st = GetCount(req, "memory_bytes", &p.memory_bytes);
  if (st.ok()) st = GetString(req, "token", &p.token);
  if (st.ok() && req.contains("port")) {
    // The data-plane port a restored checkpoint's clients wait at (0: any).
    int64_t port = 0;
    st = GetCount(req, "port", &port);
    if (st.ok() && port > 65535)
      st = Status::Error("port " + std::to_string(port) + " is not a port");
    p.port = static_cast<int>(port);
  }
  if (!st.ok()) return control::Error("bad_request", "start-server: " + st.message());
  const GpuInfo* gpu = FindGpu(p.gpu_uuid);
  if (gpu == nullptr) {
    std::string known;
    for (const auto& g : gpus_) known += (known.empty() ? "" : ", ") + g.uuid;
    return control::Error("bad_request", "start-server: GPU " + p.gpu_uuid + " is not on node " +
                                             config_.node_id +
                                             " (it has: " + (known.empty() ? "none" : known) + ")");
  }
  if (p.sm > gpu->sm_count || p.memory_bytes > gpu->memory_bytes)
    return control::Error("bad_request", "start-server: " + std::to_string(p.sm) + " SMs and " +
                                             std::to_string(p.memory_bytes) + " bytes exceed GPU " +
                                             gpu->uuid + " (" + std::to_string(gpu->sm_count) +
                                             " SMs, " + std::to_string(gpu->memory_bytes) +
                                             " bytes)");
  ServerSupervisor::Started started;
  std::string code;
  st = supervisor_->Start(p, &started, &code);
  if (!st.ok()) return control::Error(code, st.message());
  return control::Ok(
      Json{{"endpoint", started.endpoint}, {"pid", started.pid}, {"ready_ms", started.ready_ms}});
}

Json NodeManager::StopServer(const Json& req) {
  std::string id, code;
  Status st = GetString(req, "alloc_id", &id);
  if (!st.ok()) return control::Error("bad_request", "stop-server: " + st.message());
  st = supervisor_->Stop(id, &code);
  if (!st.ok()) return control::Error(code, st.message());
  return control::Ok();
}

Json NodeManager::SetShare(const Json& req) {
  std::string id, code;
  int64_t sm = 0, memory = 0;
  Status st = GetString(req, "alloc_id", &id);
  if (st.ok()) st = GetCount(req, "sm", &sm);
  if (st.ok()) st = GetCount(req, "memory_bytes", &memory);
  if (!st.ok()) return control::Error("bad_request", "set-share: " + st.message());
  ServerParams p;
  int64_t memory_at_start = 0;
  if (!supervisor_->Lookup(id, &p, &memory_at_start))
    return control::Error("unknown_allocation",
                          "no server for allocation " + id + " on node " + config_.node_id);
  const GpuInfo* gpu = FindGpu(p.gpu_uuid);
  if (gpu != nullptr && (sm > gpu->sm_count || memory > gpu->memory_bytes))
    return control::Error("bad_request", "set-share: " + std::to_string(sm) + " SMs and " +
                                             std::to_string(memory) + " bytes exceed GPU " +
                                             gpu->uuid);
  if (config_.mps && config_.mps_memory_limit && memory > memory_at_start)
    return control::Error(
        "over_quota",
        "set-share: server " + id + " runs under MPS with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT " +
            MpsDaemon::PinnedMemLimit(memory_at_start) +
            ", fixed when it started; a larger quota needs a new server (stop-server, "
            "start-server) or mps_memory_limit=false on this node");
  Json answer;
  st = supervisor_->SetShare(id, sm, memory, &answer, &code);
  if (!st.ok()) return control::Error(code, st.message());
  Json fields = Json::object();
  for (auto it = answer.begin(); it != answer.end(); ++it)
    if (it.key() != "ok" && it.key() != "id") fields[it.key()] = it.value();
  if (!fields.contains("pause_us")) fields["pause_us"] = 0;
  return control::Ok(fields);
}

Json NodeManager::MoveSessions(const std::string& verb, const Json& req) {
  std::string id, code;
  Status st = GetString(req, "alloc_id", &id);
  if (!st.ok()) return control::Error("bad_request", verb + ": " + st.message());
  int64_t wait_ms = 30000;
  if (req.contains("wait_ms")) {
    st = GetCount(req, "wait_ms", &wait_ms);
    if (!st.ok()) return control::Error("bad_request", verb + ": " + st.message());
    wait_ms = std::min<int64_t>(wait_ms, kMaxMoveWaitMs);
  }
  Json forward{{"verb", verb}, {"wait_ms", wait_ms}};
  if (verb == "migrate") {
    std::string to, token;
    st = GetString(req, "to", &to);
    if (st.ok()) st = GetString(req, "token", &token);
    if (!st.ok()) return control::Error("bad_request", "migrate: " + st.message());
    forward["to"] = to;
    forward["token"] = token;
  } else {
    std::string dir;
    st = GetString(req, "dir", &dir);
    if (!st.ok() || dir.empty() || dir[0] != '/')
      return control::Error("bad_request",
                            verb + ": \"dir\" must be an absolute path on node " + config_.node_id);
    forward["dir"] = dir;
    if (verb == "checkpoint") {
      // The node's side of the path: made here (0700), the server only writes into it.
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec)
        return control::Error("bad_request", "checkpoint: cannot make " + dir + " on node " +
                                                 config_.node_id + ": " + ec.message());
      std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::replace, ec);
      // A restore takes every file of the folder: never mix two checkpoints.
      if (!CheckpointFiles(dir).empty())
        return control::Error("bad_request", "checkpoint: " + dir + " on node " + config_.node_id +
                                                 " already holds a checkpoint; give another path");
      auto lr = req.find("leave_running");
      forward["leave_running"] = lr != req.end() && lr->is_boolean() && lr->get<bool>();
    }
  }
  Json answer;
  // The server answers once its sessions did (or wait_ms passed).
  st = supervisor_->Forward(id, forward, static_cast<int>(wait_ms) + kMoveAnswerMarginMs, &answer,
                            &code);
  if (!st.ok()) return control::Error(code, st.message());
  if (verb == "restore" && answer.value("restored", -1) == answer.value("files", -2)) {
    // A file restored once is spent (its one-time key is used): renamed so that a second
    // restore of the folder does not take it again.
    std::set<std::string> failed;
    for (const auto& f : answer.value("failed", Json::array()))
      if (f.is_object()) failed.insert(f.value("file", ""));
    for (const std::string& file : CheckpointFiles(forward["dir"].get<std::string>())) {
      if (failed.count(file)) continue;
      std::error_code ec;
      std::filesystem::rename(file, file + ".restored", ec);
    }
  }
  Json fields = Json::object();
  for (auto it = answer.begin(); it != answer.end(); ++it)
    if (it.key() != "ok" && it.key() != "id") fields[it.key()] = it.value();
  FLYT_INFO("%s of server %s: %s", verb.c_str(), id.c_str(), fields.dump().c_str());
  return control::Ok(fields);
}

Json NodeManager::CheckpointFilesVerb(const std::string& verb, const Json& req) {
  namespace fs = std::filesystem;
  const std::string incoming = config_.run_dir + "/incoming";
  std::string dir, file, transfer, sub;
  if (verb == "list-checkpoint" || verb == "read-checkpoint" || verb == "spend-checkpoint") {
    Status st = GetString(req, "dir", &dir);
    if (!st.ok() || dir.empty() || dir[0] != '/' || dir.find("/../") != std::string::npos)
      return control::Error("bad_request",
                            verb + ": \"dir\" must be an absolute path on node " + config_.node_id);
  }
  if (verb == "list-checkpoint") {
    Json files = Json::array();
    int64_t total = 0;
    std::vector<std::string> paths = CheckpointFiles(dir);
    std::sort(paths.begin(), paths.end());
    for (const std::string& path : paths) {
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      if (ec) continue;
      files.push_back(Json{{"file", path.substr(path.rfind('/') + 1)}, {"bytes", size}});
      total += static_cast<int64_t>(size);
    }
    return control::Ok(Json{{"files", files}, {"bytes", total}});
  }
  if (verb == "spend-checkpoint") {
    // Restored elsewhere: their one-time keys are spent, as after a restore here.
    int64_t n = 0;
    for (const std::string& path : CheckpointFiles(dir)) {
      std::error_code ec;
      fs::rename(path, path + ".restored", ec);
      n += !ec;
    }
    return control::Ok(Json{{"spent", n}});
  }
  if (verb == "read-checkpoint") {
    int64_t offset = 0;
    Status st = GetString(req, "file", &file);
    if (st.ok()) st = GetCount(req, "offset", &offset);
    if (!st.ok() || !SessionFileName(file))
      return control::Error("bad_request",
                            "read-checkpoint: needs a session file name (*.flyt) "
                            "and an offset");
    const std::string path = dir + "/" + file;
    std::ifstream in(path, std::ios::binary);
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (!in || ec)
      return control::Error("bad_request",
                            "read-checkpoint: cannot read " + path + " on node " + config_.node_id);
    std::vector<uint8_t> buf(static_cast<size_t>(
        std::max<int64_t>(0, std::min<int64_t>(kShipChunk, static_cast<int64_t>(size) - offset))));
    in.seekg(offset);
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    if (!in && !buf.empty())
      return control::Error("internal", "read-checkpoint: reading " + path + " failed");
    return control::Ok(
        Json{{"data", Base64(buf.data(), buf.size())},
             {"bytes", buf.size()},
             {"size", size},
             {"eof", offset + static_cast<int64_t>(buf.size()) >= static_cast<int64_t>(size)}});
  }
  Status st = GetString(req, "transfer", &transfer);
  if (!st.ok() || !PlainName(transfer))
    return control::Error("bad_request", verb + ": needs a transfer id (letters, digits, '-')");
  const std::string root = incoming + "/" + transfer;
  if (verb == "drop-checkpoint-copy") {
    std::error_code ec;
    fs::remove_all(root, ec);
    return control::Ok();
  }
  // write-checkpoint {transfer, sub, file, offset, data, last}
  int64_t offset = 0;
  std::string data;
  st = GetString(req, "sub", &sub);
  if (st.ok()) st = GetString(req, "file", &file);
  if (st.ok()) st = GetCount(req, "offset", &offset);
  if (st.ok()) st = GetString(req, "data", &data);
  if (!st.ok() || !PlainName(sub) || !SessionFileName(file))
    return control::Error(
        "bad_request",
        "write-checkpoint: " + (st.ok() ? std::string("bad folder or file name") : st.message()));
  std::vector<uint8_t> bytes;
  if (!Unbase64(data, &bytes))
    return control::Error("bad_request", "write-checkpoint: \"data\" is not base64");
  const std::string folder = root + "/" + sub;
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec)
    return control::Error("internal", "write-checkpoint: cannot make " + folder + " on node " +
                                          config_.node_id + ": " + ec.message());
  fs::permissions(root, fs::perms::owner_all, fs::perm_options::replace, ec);
  const std::string partial = folder + "/" + file + ".partial";
  {
    std::fstream out(partial, std::ios::binary | std::ios::in | std::ios::out |
                                  (offset == 0 ? std::ios::trunc : std::ios::openmode{}));
    if (!out)
      return control::Error(
          "internal", "write-checkpoint: cannot write " + partial + " on node " + config_.node_id);
    out.seekp(offset);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out)
      return control::Error("internal", "write-checkpoint: writing " + partial + " on node " +
                                            config_.node_id + " failed (disk full?)");
  }
  auto last = req.find("last");
  if (last != req.end() && last->is_boolean() && last->get<bool>()) {
    fs::rename(partial, folder + "/" + file, ec);
    if (ec) return control::Error("internal", "write-checkpoint: " + ec.message());
  }
  return control::Ok(Json{{"dir", root}});
}

Json NodeManager::ListServers() {
  Json list = Json::array();
  for (const auto& r : supervisor_->Reports()) list.push_back(ToJson(r));
  return control::Ok(Json{{"servers", list}});
}

Json NodeManager::RegisterRequest() {
  Json gpus = Json::array();
  for (const auto& g : gpus_) gpus.push_back(ToJson(g));
  Json servers = Json::array();
  for (const auto& r : supervisor_->Reports()) servers.push_back(ToJson(r));
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  // "tls" or "tcp": the kind of server it starts (sessions move only between alike).
  return Json{{"node_id", config_.node_id},
              {"hostname", host},
              {"address", AdvertisedAddress()},
              {"host_ip", config_.host_ip},
              {"mps", config_.mps},
              {"server_scheme", config_.server_tls ? "tls" : "tcp"},
              {"gpus", gpus},
              {"servers", servers}};
}

void NodeManager::Sleep(int64_t ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stop_ || wake_; });
  wake_ = false;
}

void NodeManager::ReportLoop() {
  std::unique_ptr<control::Channel> channel;
  std::vector<ServerExit> pending;  // exits the cluster manager has not answered yet
  int64_t heartbeat_ms = config_.heartbeat_ms;
  int backoff_ms = kBackoffFirstMs;
  int failures = 0;
  auto next_heartbeat = Clock::now();
  auto stopping = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  };
  auto drop = [&](const std::string& why) {
    FLYT_WARN("cluster manager %s: %s; reconnecting", config_.cluster_manager.c_str(), why.c_str());
    if (channel) channel->Close();
    channel.reset();
    registered_ = false;
  };
  while (!stopping()) {
    if (!channel) {
      Json answer;
      Status st = control::Channel::Dial(config_.cluster_manager, creds_, "node", config_.node_id,
                                         kDialTimeoutMs, &channel);
      if (st.ok()) st = channel->Call("register-node", RegisterRequest(), &answer, kCallTimeoutMs);
      if (!st.ok()) {
        channel.reset();
        if (failures++ == 0)
          FLYT_WARN(
              "cannot register with the cluster manager at %s: %s (retrying every %d s at "
              "most)",
              config_.cluster_manager.c_str(), st.message().c_str(), kBackoffMaxMs / 1000);
        else
          FLYT_DEBUG("register-node: %s", st.message().c_str());
        Sleep(backoff_ms);
        backoff_ms = std::min(backoff_ms * 2, kBackoffMaxMs);
        continue;
      }
      auto hb = answer.find("heartbeat_ms");
      if (hb != answer.end() && hb->is_number_integer() && hb->get<int64_t>() >= 50)
        heartbeat_ms = hb->get<int64_t>();
      FLYT_INFO("registered with the cluster manager at %s as %s (%zu GPU(s), heartbeat %lld ms)",
                config_.cluster_manager.c_str(), config_.node_id.c_str(), gpus_.size(),
                static_cast<long long>(heartbeat_ms));
      registered_ = true;
      failures = 0;
      backoff_ms = kBackoffFirstMs;
      next_heartbeat = Clock::now() + std::chrono::milliseconds(heartbeat_ms);
    }
    for (auto& e : supervisor_->TakeExits()) pending.push_back(std::move(e));
    while (channel && !pending.empty()) {
      const ServerExit& e = pending.front();
      Json answer;
      Status st = channel->Call("server-exited",
                                Json{{"node_id", config_.node_id},
                                     {"alloc_id", e.alloc_id},
                                     {"exit_status", e.exit_status},
                                     {"reason", e.reason}},
                                &answer, kCallTimeoutMs);
      if (!st.ok() && !IsRefusal(answer)) {
        drop("server-exited: " + st.message());
        break;
      }
      if (!st.ok() && StringOf(answer, "code") == "unknown_node") {
        drop("it no longer knows this node");
        break;
      }
      std::string action = st.ok() ? StringOf(answer, "action") : "free";
      if (!st.ok())
        FLYT_WARN("server-exited for %s refused (%s): forgetting the server", e.alloc_id.c_str(),
                  st.message().c_str());
      if (action == "restart") {
        FLYT_INFO("server %s: restarting as the cluster manager asks", e.alloc_id.c_str());
        Status rs = supervisor_->Restart(e.alloc_id);
        if (!rs.ok()) FLYT_WARN("server %s: %s", e.alloc_id.c_str(), rs.message().c_str());
      } else {
        if (action != "free")
          FLYT_WARN("server-exited for %s: unknown action '%s': freeing", e.alloc_id.c_str(),
                    action.c_str());
        supervisor_->Forget(e.alloc_id);
      }
      pending.erase(pending.begin());
    }
    if (!channel) continue;
    if (Clock::now() >= next_heartbeat) {
      Json servers = Json::array();
      for (const auto& r : supervisor_->Reports()) servers.push_back(ToJson(r));
      Json answer;
      Status st =
          channel->Call("heartbeat", Json{{"node_id", config_.node_id}, {"servers", servers}},
                        &answer, kCallTimeoutMs);
      if (!st.ok()) {
        drop("heartbeat: " + st.message());
        continue;
      }
      next_heartbeat = Clock::now() + std::chrono::milliseconds(heartbeat_ms);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_heartbeat - Clock::now())
                    .count();
    if (left > 0) Sleep(left);
  }
  if (channel) channel->Close();
  registered_ = false;
}

}  // namespace flyt::node
