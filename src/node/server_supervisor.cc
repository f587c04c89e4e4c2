#include "node/server_supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "control/channel.h"
#include "node/process.h"
#include "transport/transport.h"

namespace flyt::node {
namespace {

using Json = nlohmann::json;

// Restarts of one allocation are at least this far apart, whatever the
// cluster manager answers: a server that dies at once cannot spin.
constexpr int kMinRestartIntervalMs = 1000;
// Readiness probes must not hold up the monitor for long.
constexpr int kProbeTimeoutMs = 1000;
// Log lines quoted in errors and exit reasons.
constexpr int kStartFailureLines = 15;
constexpr int kExitReasonLines = 5;

int64_t MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t)
      .count();
}

// The TCP (or TLS) port in a stats answer's "listen" list (0 when there is none yet).
int TcpPortOf(const Json& stats) {
  auto it = stats.find("listen");
  if (it == stats.end()) return 0;
  std::vector<std::string> listens;
  if (it->is_string()) listens.push_back(it->get<std::string>());
  if (it->is_array())
    for (const auto& l : *it)
      if (l.is_string()) listens.push_back(l.get<std::string>());
  for (const auto& l : listens) {
    if (l.rfind("unix:", 0) == 0) continue;
    transport::Address a;
    if (transport::ParseAddress(l, &a).ok() &&
        (a.kind == transport::Address::Kind::kTcp || a.kind == transport::Address::Kind::kTls) &&
        a.port > 0)
      return a.port;
  }
  return 0;
}

int64_t IntField(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  return it->get<int64_t>();
}

std::string HostForUrl(const std::string& host) {
  if (host.find(':') != std::string::npos && host.front() != '[') return "[" + host + "]";
  return host;
}

// A process that is not a child: alive unless gone or a zombie (after a node
// manager crash its servers may be reparented to an init that does not reap).
bool ProcessAlive(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

}  // namespace

Json ToJson(const ServerReport& r) {
  return Json{{"alloc_id", r.alloc_id},
              {"gpu_uuid", r.gpu_uuid},
              {"pid", r.pid},
              {"endpoint", r.endpoint},
              {"state", r.state},
              {"sessions", r.sessions},
              {"memory_used", r.memory_used},
              {"memory_quota", r.memory_quota},
              {"sm", r.sm},
              {"calls", r.calls},
              {"bytes_in", r.bytes_in},
              {"bytes_out", r.bytes_out},
              {"idle_ms", r.idle_ms}};
}

Status ServerControlCall(const std::string& socket, const Json& request, int timeout_ms,
                         Json* answer) {
  const std::string address = socket.rfind("unix:", 0) == 0 ? socket : "unix://" + socket;
  std::unique_ptr<control::Channel> channel;
  // No credentials: a server's control socket has no handshake (it is 0600).
  Status st = control::Channel::Dial(address, control::Credentials{}, "", "", timeout_ms, &channel);
  if (!st.ok()) return st;
  *answer = Json();
  const std::string verb = request.value("verb", std::string());
  Json args = request;
  args.erase("verb");
  st = channel->Call(verb, args, answer, timeout_ms);
  channel->Close();
  return st;
}

Status ValidateAllocId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 64 && id[0] != '.' && id[0] != '-';
  for (char c : id)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  if (!ok)
    return Status::Error(
        "bad alloc_id '" + id +
        "': expected 1-64 characters of A-Z a-z 0-9 . _ - not starting with . or -");
  return Status::Ok();
}

ServerSupervisor::ServerSupervisor(SupervisorOptions options) : options_(std::move(options)) {}

ServerSupervisor::~ServerSupervisor() { StopAll(); }

std::string ServerSupervisor::SocketPath(const std::string& id) const {
  return options_.run_dir + "/" + id + ".ctl";
}
std::string ServerSupervisor::ShmPath(const std::string& id) const {
  return options_.run_dir + "/" + id + ".shm";
}
std::string ServerSupervisor::LogPath(const std::string& id) const {
  return options_.run_dir + "/" + id + ".log";
}
std::string ServerSupervisor::StatePath(const std::string& id) const {
  return options_.run_dir + "/" + id + ".json";
}

Status ServerSupervisor::Open() {
  if (options_.run_dir.empty()) return Status::Error("internal error: run_dir is not set");
  Status st = MakeDirectories(options_.run_dir, 0700);
  if (!st.ok())
    return Status::Error(st.message() + ": set run_dir to a folder this user can write");
  if (SocketPath(std::string(64, 'x')).size() >= sizeof(sockaddr_un::sun_path))
    return Status::Error("run_dir '" + options_.run_dir +
                         "' is too long for Unix socket names (at most " +
                         std::to_string(sizeof(sockaddr_un::sun_path) - 70) +
                         " characters): choose a shorter run_dir");
  if (::access(options_.server_binary.c_str(), X_OK) != 0)
    return Status::Error("cannot run flyt-server at '" + options_.server_binary +
                         "': " + std::strerror(errno) + ": set server_binary");
  Adopt();
  monitor_ = std::thread([this] { MonitorLoop(); });
  return Status::Ok();
}

void ServerSupervisor::WriteStateFile(const std::string& id, const Entry& e) {
  Json state{{"alloc_id", id},
             {"gpu_uuid", e.params.gpu_uuid},
             {"sm", e.params.sm},
             {"memory_bytes", e.params.memory_bytes},
             {"token", e.params.token},
             {"port", e.params.port},
             {"pid", e.pid},
             {"memory_at_start", e.memory_at_start}};
  const std::string path = StatePath(id), tmp = path + ".tmp";
  std::string text = state.dump() + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  if (ok) {
    ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ok = ::close(fd) == 0 && ok;
  }
  if (ok) ok = ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    FLYT_WARN("cannot write %s (%s): a restarted node manager will not adopt server %s",
              path.c_str(), std::strerror(errno), id.c_str());
    ::unlink(tmp.c_str());
  }
}

void ServerSupervisor::RemoveFiles(const std::string& id) {
  // The log stays for post-mortems; socket and state file go.
  ::unlink(SocketPath(id).c_str());
  ::unlink(ShmPath(id).c_str());
  ::unlink(StatePath(id).c_str());
  stats_failing_.erase(id);
}

Status ServerSupervisor::SpawnLocked(const EntryPtr& e) {
  const ServerParams& p = e->params;
  const std::string ctl = SocketPath(p.alloc_id);
  ::unlink(ctl.c_str());  // a stale socket must not look like readiness
  SpawnOptions spawn;
  spawn.argv = {options_.server_binary,
                "--backend",
                options_.backend,
                "--listen",
                Scheme() + HostForUrl(options_.listen_host) + ":" + std::to_string(p.port),
                "--control",
                "unix://" + ctl};
  if (!options_.tls_cert.empty()) {
    for (const std::string& a :
         {std::string("--tls-cert"), options_.tls_cert, std::string("--tls-key"), options_.tls_key})
      spawn.argv.push_back(a);
    // Sessions moved to another node's tls:// server: its certificate is checked against
    // the cluster's CA.
    if (!options_.tls_peer_ca.empty()) {
      spawn.argv.push_back("--tls-peer-ca");
      spawn.argv.push_back(options_.tls_peer_ca);
    }
  }
  if (options_.shared_memory) {
    // Clients on this host learn it in the handshake and move to it.
    spawn.argv.push_back("--listen");
    spawn.argv.push_back("shm://" + ShmPath(p.alloc_id));
  }
  if (options_.movable_memory) spawn.argv.push_back("--movable-memory");
  if (p.memory_bytes > 0) {
    spawn.argv.push_back("--memory-quota");
    spawn.argv.push_back(std::to_string(p.memory_bytes));
  }
  if (p.sm > 0) {
    spawn.argv.push_back("--sm-count");
    spawn.argv.push_back(std::to_string(p.sm));
  }
  EnvList set;
  if (!p.token.empty()) set.emplace_back("FLYT_TOKEN", p.token);  // not visible in ps
  if (options_.pin_gpu) set.emplace_back("CUDA_VISIBLE_DEVICES", p.gpu_uuid);
  if (options_.extra_env)
    for (auto& kv : options_.extra_env(p)) set.push_back(std::move(kv));
  // The node manager's own settings and the cluster secret never reach a server.
  spawn.env = ChildEnvironment(
      {"FLYT_NM_", "FLYT_SECRET", "FLYT_TOKEN", "FLYT_CONFIG", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_"},
      set);
  spawn.output_path = LogPath(p.alloc_id);
  {
    // A header line per start: restarts append to the same log.
    std::string line = "--- flyt-node-manager: starting";
    for (const auto& a : spawn.argv) line += " " + a;
    line += "\n";
    int fd = ::open(spawn.output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
      return Status::Error("cannot open " + spawn.output_path + ": " + std::strerror(errno) +
                           ": check that run_dir is writable");
    bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    if (!written)
      FLYT_WARN("cannot write to %s: %s", spawn.output_path.c_str(), std::strerror(errno));
    ::close(fd);
  }
  pid_t pid = -1;
  Status st = Spawn(spawn, &pid);
  if (!st.ok()) return st;
  e->pid = pid;
  e->child = true;
  e->state = State::kStarting;
  e->generation++;
  e->spawned = Clock::now();
  e->endpoint.clear();
  e->ready_ms = 0;
  e->memory_at_start = p.memory_bytes;
  e->last_probe = "no probe yet";
  WriteStateFile(p.alloc_id, *e);
  FLYT_INFO("server %s: started pid %d on GPU %s (sm %lld, memory %lld)", p.alloc_id.c_str(),
            static_cast<int>(pid), p.gpu_uuid.c_str(), static_cast<long long>(p.sm),
            static_cast<long long>(p.memory_bytes));
  return Status::Ok();
}

Status ServerSupervisor::Start(const ServerParams& params, Started* out, std::string* code) {
  *code = "bad_request";
  Status st = ValidateAllocId(params.alloc_id);
  if (!st.ok()) return st;
  const std::string& id = params.alloc_id;
  std::unique_lock<std::mutex> lock(mu_);
  EntryPtr e;
  for (;;) {
    if (stopping_) {
      *code = "internal";
      return Status::Error("the node manager is shutting down");
    }
    auto it = servers_.find(id);
    if (it == servers_.end()) break;
    e = it->second;
    if (e->state == State::kRunning || e->state == State::kStarting) {
      if (e->params.gpu_uuid != params.gpu_uuid || e->params.token != params.token)
        return Status::Error("allocation " + id + " already has a server (GPU " +
                             e->params.gpu_uuid +
                             ") with another GPU or token: stop-server it first");
      if (e->state == State::kRunning) {
        out->endpoint = e->endpoint;
        out->pid = e->pid;
        out->ready_ms = 0;
        FLYT_INFO("server %s: start-server for a running server: answering its endpoint",
                  id.c_str());
        return Status::Ok();
      }
    }
    if (e->state == State::kExited) break;  // started again with the new parameters
    // Starting, stopping or a failed start being collected: wait for it to settle.
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    e.reset();
  }
  if (!e) {
    e = std::make_shared<Entry>();
    servers_[id] = e;
  }
  e->params = params;
  e->waited = true;
  st = SpawnLocked(e);
  if (!st.ok()) {
    servers_.erase(id);
    RemoveFiles(id);
    *code = "server_failed";
    return Status::Error("cannot start flyt-server for " + id + ": " + st.message());
  }
  const uint64_t generation = e->generation;
  cv_.notify_all();
  cv_.wait(lock, [&] {
    auto it = servers_.find(id);
    return it == servers_.end() || it->second != e || e->generation != generation ||
           (e->state != State::kStarting && e->state != State::kStopping);
  });
  auto it = servers_.find(id);
  if (it == servers_.end() || it->second != e || e->generation != generation) {
    *code = "server_failed";
    return Status::Error("server " + id + " was stopped before it became ready");
  }
  e->waited = false;
  if (e->state == State::kRunning) {
    out->endpoint = e->endpoint;
    out->pid = e->pid;
    out->ready_ms = e->ready_ms;
    return Status::Ok();
  }
  std::string why = e->failure.empty() ? "it ended while starting" : e->failure;
  servers_.erase(id);
  RemoveFiles(id);
  *code = "server_failed";
  return Status::Error("flyt-server for " + id + " did not become ready: " + why);
}

Status ServerSupervisor::Restart(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = servers_.find(id);
  if (it == servers_.end()) return Status::Error("no server " + id + " to restart");
  const EntryPtr& e = it->second;
  if (e->state != State::kExited) return Status::Ok();  // already running again
  e->waited = false;
  e->state = State::kStarting;
  e->pid = -1;  // the monitor spawns it when kMinRestartIntervalMs has passed since the last one
  e->last_probe = "restart pending";
  cv_.notify_all();
  return Status::Ok();
}

void ServerSupervisor::Forget(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = servers_.find(id);
  if (it == servers_.end() || it->second->state != State::kExited) return;
  servers_.erase(it);
  RemoveFiles(id);
  FLYT_INFO("server %s: forgotten", id.c_str());
}

void ServerSupervisor::KillAndReap(pid_t pid, bool child, int timeout_ms) {
  if (pid <= 0) return;
  auto gone = [&]() {
    if (child) {
      bool exited = false;
      int ws = 0;
      Status st = WaitFor(pid, 0, &exited, &ws);
      return exited || !st.ok();  // !ok: ECHILD, already reaped
    }
    return !ProcessAlive(pid);
  };
  if (timeout_ms > 0) {
    if (::kill(-pid, SIGTERM) != 0 && errno != ESRCH) ::kill(pid, SIGTERM);
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!gone()) {
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (gone()) return;
    FLYT_WARN("pid %d did not stop within %d ms of SIGTERM: sending SIGKILL", static_cast<int>(pid),
              timeout_ms);
  }
  if (::kill(-pid, SIGKILL) != 0 && errno != ESRCH) ::kill(pid, SIGKILL);
  if (child) {
    int ws = 0;
    while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    return;
  }
  for (int i = 0; i < 200 && ProcessAlive(pid); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

Status ServerSupervisor::Stop(const std::string& id, std::string* code) {
  std::unique_lock<std::mutex> lock(mu_);
  EntryPtr e;
  for (;;) {
    auto it = servers_.find(id);
    if (it == servers_.end()) {
      *code = "unknown_allocation";
      return Status::Error("no server for allocation " + id + " on this node");
    }
    e = it->second;
    if (e->state != State::kStopping) break;
    cv_.wait_for(lock, std::chrono::milliseconds(50));  // someone else is stopping it
  }
  if (e->state == State::kExited || e->state == State::kFailed || e->pid <= 0) {
    if (e->state != State::kFailed) {  // a failed start is collected by its Start call
      servers_.erase(id);
      RemoveFiles(id);
    }
    cv_.notify_all();
    return Status::Ok();
  }
  e->state = State::kStopping;
  const pid_t pid = e->pid;
  const bool child = e->child;
  cv_.notify_all();
  lock.unlock();
  KillAndReap(pid, child, options_.stop_timeout_ms);
  lock.lock();
  auto it = servers_.find(id);
  if (it != servers_.end() && it->second == e) servers_.erase(it);
  RemoveFiles(id);
  cv_.notify_all();
  FLYT_INFO("server %s: stopped (pid %d)", id.c_str(), static_cast<int>(pid));
  return Status::Ok();
}

Status ServerSupervisor::Forward(const std::string& id, const Json& request, int timeout_ms,
                                 Json* answer, std::string* code) {
  const std::string verb = request.value("verb", std::string());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = servers_.find(id);
    if (it == servers_.end()) {
      *code = "unknown_allocation";
      return Status::Error("no server for allocation " + id + " on this node");
    }
    if (it->second->state != State::kRunning) {
      *code = "server_failed";
      return Status::Error(
          "server " + id + " is " +
          (it->second->state == State::kStarting ? "still starting" : "not running") + ": retry " +
          verb + " once it runs");
    }
  }
  *answer = Json::object();
  Status st = ServerControlCall(SocketPath(id), request, timeout_ms, answer);
  if (!st.ok()) {
    bool refused = answer->is_object() && answer->contains("ok");
    auto c = answer->is_object() ? answer->find("code") : answer->end();
    *code = (c != answer->end() && c->is_string()) ? c->get<std::string>()
            : refused                              ? "bad_request"
                                                   : "server_failed";
    return Status::Error("server " + id + " did not do " + verb + ": " + st.message());
  }
  return Status::Ok();
}

Status ServerSupervisor::SetShare(const std::string& id, int64_t sm, int64_t memory_bytes,
                                  Json* answer, std::string* code) {
  Json request{{"verb", "set-share"}, {"sm", sm}, {"memory_bytes", memory_bytes}};
  Status st = Forward(id, request, options_.control_timeout_ms, answer, code);
  if (!st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = servers_.find(id);
  if (it != servers_.end()) {
    it->second->params.sm = sm;
    it->second->params.memory_bytes = memory_bytes;
    WriteStateFile(id, *it->second);
  }
  return Status::Ok();
}

bool ServerSupervisor::Lookup(const std::string& id, ServerParams* params,
                              int64_t* memory_at_start) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = servers_.find(id);
  if (it == servers_.end()) return false;
  if (params) *params = it->second->params;
  if (memory_at_start) *memory_at_start = it->second->memory_at_start;
  return true;
}

std::vector<ServerReport> ServerSupervisor::Reports() {
  std::vector<ServerReport> reports;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, e] : servers_) {
      if (e->state == State::kStopping || e->state == State::kFailed) continue;
      ServerReport r;
      r.alloc_id = id;
      r.gpu_uuid = e->params.gpu_uuid;
      r.endpoint = e->endpoint;
      r.state = e->state == State::kStarting  ? "starting"
                : e->state == State::kRunning ? "running"
                                              : "exited";
      r.pid = e->pid > 0 ? e->pid : 0;
      r.memory_quota = e->params.memory_bytes;
      r.sm = e->params.sm;
      reports.push_back(std::move(r));
    }
  }
  for (auto& r : reports) {
    if (r.state != "running") continue;
    Json stats;
    Status st = ServerControlCall(SocketPath(r.alloc_id), Json{{"verb", "stats"}},
                                  options_.control_timeout_ms, &stats);
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool first = st.ok() ? (stats_failing_.erase(r.alloc_id), false)
                           : stats_failing_.insert(r.alloc_id).second;
      if (first)  // once per failing streak; the monitor reports an exit if it died
        FLYT_WARN("server %s: no stats: %s", r.alloc_id.c_str(), st.message().c_str());
    }
    if (!st.ok()) continue;
    r.sessions = IntField(stats, "sessions");
    r.memory_used = IntField(stats, "memory_used");
    if (stats.contains("memory_quota")) r.memory_quota = IntField(stats, "memory_quota");
    if (stats.contains("sm")) r.sm = IntField(stats, "sm");
    r.calls = IntField(stats, "calls");
    r.bytes_in = IntField(stats, "bytes_in");
    r.bytes_out = IntField(stats, "bytes_out");
    r.idle_ms = IntField(stats, "idle_ms");
  }
  return reports;
}

std::vector<ServerExit> ServerSupervisor::TakeExits() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ServerExit> out;
  out.swap(exits_);
  return out;
}

bool ServerSupervisor::CheckExitLocked(const EntryPtr& e, int* wait_status, bool* known) {
  *known = false;
  if (e->pid <= 0) return false;
  if (e->child) {
    int ws = 0;
    pid_t r = ::waitpid(e->pid, &ws, WNOHANG);
    if (r == e->pid) {
      *wait_status = ws;
      *known = true;
      return true;
    }
    return r < 0 && errno == ECHILD;  // reaped elsewhere: gone, status unknown
  }
  return !ProcessAlive(e->pid);
}

void ServerSupervisor::FailStartLocked(const std::string& id, const EntryPtr& e,
                                       const std::string& why, bool* notify) {
  ::unlink(SocketPath(id).c_str());
  if (e->waited) {
    e->state = State::kFailed;
    e->failure = why;
    FLYT_WARN("server %s: start failed: %s", id.c_str(), why.c_str());
  } else {
    e->state = State::kExited;
    exits_.push_back(ServerExit{id, -1, "restart failed: " + why});
    *notify = true;
    FLYT_WARN("server %s: restart failed: %s", id.c_str(), why.c_str());
  }
  cv_.notify_all();
}

void ServerSupervisor::HandleExitLocked(const std::string& id, const EntryPtr& e, int wait_status,
                                        bool known, bool* notify) {
  std::string how = known ? DescribeExit(wait_status)
                          : std::string("ended (not a child of this node manager: status unknown)");
  if (e->state == State::kStarting) {
    std::string tail = TailOfFile(LogPath(id), kStartFailureLines, 4096);
    FailStartLocked(id, e,
                    how + " before its control socket answered; log " + LogPath(id) +
                        (tail.empty() ? std::string(" is empty") : ":\n" + tail),
                    notify);
    return;
  }
  e->state = State::kExited;
  ::unlink(SocketPath(id).c_str());
  std::string tail = TailOfFile(LogPath(id), kExitReasonLines, 1024);
  exits_.push_back(ServerExit{id, known ? ExitCode(wait_status) : -1,
                              how + (tail.empty() ? "" : "; last log lines:\n" + tail)});
  *notify = true;
  FLYT_WARN("server %s (pid %d) %s", id.c_str(), static_cast<int>(e->pid), how.c_str());
  cv_.notify_all();
}

Status ServerSupervisor::Probe(const std::string& id, std::string* endpoint) {
  const std::string ctl = SocketPath(id);
  struct stat sb {};
  if (::stat(ctl.c_str(), &sb) != 0) return Status::Error("control socket " + ctl + " not created");
  Json stats;
  Status st = ServerControlCall(ctl, Json{{"verb", "stats"}},
                                std::min(kProbeTimeoutMs, options_.control_timeout_ms), &stats);
  if (!st.ok()) return st;
  int port = TcpPortOf(stats);
  if (port == 0)
    return Status::Error("its stats name no TCP port in \"listen\": " +
                         (stats.contains("listen") ? stats["listen"].dump() : std::string("none")));
  *endpoint = Scheme() + HostForUrl(options_.advertise_host) + ":" + std::to_string(port);
  return Status::Ok();
}

void ServerSupervisor::MonitorLoop() {
  struct Item {
    std::string id;
    EntryPtr e;
    uint64_t generation;
    pid_t pid;
    bool child;
  };
  for (;;) {
    std::vector<Item> probes, timeouts;
    bool notify = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stopping_; });
      if (stopping_) return;
      for (auto& [id, e] : servers_) {
        if (e->state == State::kStarting && e->pid <= 0) {  // a pending restart
          if (MsSince(e->spawned) < kMinRestartIntervalMs) continue;
          Status st = SpawnLocked(e);
          if (!st.ok()) FailStartLocked(id, e, st.message(), &notify);
          continue;
        }
        if (e->state != State::kStarting && e->state != State::kRunning) continue;
        int ws = 0;
        bool known = false;
        if (CheckExitLocked(e, &ws, &known)) {
          HandleExitLocked(id, e, ws, known, &notify);
          continue;
        }
        if (e->state != State::kStarting) continue;
        Item item{id, e, e->generation, e->pid, e->child};
        if (MsSince(e->spawned) > options_.ready_timeout_ms) {
          e->state = State::kStopping;
          timeouts.push_back(std::move(item));
        } else {
          probes.push_back(std::move(item));
        }
      }
    }
    for (auto& p : probes) {
      std::string endpoint;
      Status st = Probe(p.id, &endpoint);
      std::lock_guard<std::mutex> lock(mu_);
      if (p.e->state != State::kStarting || p.e->generation != p.generation) continue;
      if (!st.ok()) {
        p.e->last_probe = st.message();
        continue;
      }
      p.e->state = State::kRunning;
      p.e->endpoint = endpoint;
      p.e->ready_ms = MsSince(p.e->spawned);
      FLYT_INFO("server %s: ready at %s after %lld ms", p.id.c_str(), endpoint.c_str(),
                static_cast<long long>(p.e->ready_ms));
      cv_.notify_all();
    }
    for (auto& t : timeouts) {
      KillAndReap(t.pid, t.child, 0);
      std::lock_guard<std::mutex> lock(mu_);
      if (t.e->generation != t.generation || t.e->state != State::kStopping) continue;
      std::string tail = TailOfFile(LogPath(t.id), kStartFailureLines, 4096);
      FailStartLocked(t.id, t.e,
                      "no answer on its control socket within " +
                          std::to_string(options_.ready_timeout_ms) +
                          " ms (last probe: " + t.e->last_probe + "); killed it; log " +
                          LogPath(t.id) + (tail.empty() ? std::string(" is empty") : ":\n" + tail),
                      &notify);
    }
    if (notify && options_.on_exit) options_.on_exit();
  }
}

void ServerSupervisor::Adopt() {
  DIR* dir = ::opendir(options_.run_dir.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> ids;
  while (dirent* d = ::readdir(dir)) {
    std::string name = d->d_name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0)
      ids.push_back(name.substr(0, name.size() - 5));
  }
  ::closedir(dir);
  for (const auto& id : ids) {
    if (!ValidateAllocId(id).ok()) continue;
    std::ifstream in(StatePath(id));
    std::stringstream text;
    text << in.rdbuf();
    Json s = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    auto e = std::make_shared<Entry>();
    pid_t pid = 0;
    try {
      if (s.is_discarded() || !s.is_object()) throw std::runtime_error("not a JSON object");
      e->params.alloc_id = id;
      e->params.gpu_uuid = s.at("gpu_uuid").get<std::string>();
      e->params.sm = s.at("sm").get<int64_t>();
      e->params.memory_bytes = s.at("memory_bytes").get<int64_t>();
      e->params.token = s.at("token").get<std::string>();
      e->params.port = s.value("port", 0);
      e->memory_at_start = s.value("memory_at_start", e->params.memory_bytes);
      pid = s.at("pid").get<pid_t>();
    } catch (const std::exception& ex) {
      FLYT_WARN("ignoring state file %s: %s", StatePath(id).c_str(), ex.what());
      RemoveFiles(id);
      continue;
    }
    std::string endpoint;
    Json stats;
    Status st = ProcessAlive(pid) ? ServerControlCall(SocketPath(id), Json{{"verb", "stats"}},
                                                      options_.control_timeout_ms, &stats)
                                  : Status::Error("process " + std::to_string(pid) + " is gone");
    if (st.ok() && IntField(stats, "pid") != pid)
      st = Status::Error("its control socket answers for another pid");
    if (st.ok()) st = Probe(id, &endpoint);
    if (st.ok()) {
      e->pid = pid;
      e->child = false;
      e->state = State::kRunning;
      e->endpoint = endpoint;
      e->spawned = Clock::now();
      servers_[id] = e;
      FLYT_INFO("server %s: adopted pid %d at %s (left by a previous node manager)", id.c_str(),
                static_cast<int>(pid), endpoint.c_str());
      continue;
    }
    // Ours but unresponsive (its command line names its control socket): end it.
    std::ifstream cmdline("/proc/" + std::to_string(pid) + "/cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    if (ProcessAlive(pid) && args.find(SocketPath(id)) != std::string::npos) {
      FLYT_WARN(
          "server %s: pid %d left by a previous node manager does not answer (%s): "
          "killing it",
          id.c_str(), static_cast<int>(pid), st.message().c_str());
      KillAndReap(pid, false, options_.stop_timeout_ms);
    } else {
      FLYT_INFO("server %s: not adopted: %s", id.c_str(), st.message().c_str());
    }
    RemoveFiles(id);
  }
}

void ServerSupervisor::StopAll() {
  std::vector<std::pair<std::string, EntryPtr>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, e] : servers_) {
      if (e->state == State::kStopping) continue;  // its stopper finishes it
      if (e->pid > 0 && (e->state == State::kStarting || e->state == State::kRunning))
        live.emplace_back(id, e);
      e->state = State::kStopping;
    }
    cv_.notify_all();
  }
  if (monitor_.joinable()) monitor_.join();
  for (auto& [id, e] : live)
    if (::kill(-e->pid, SIGTERM) != 0 && errno != ESRCH) ::kill(e->pid, SIGTERM);
  auto deadline = Clock::now() + std::chrono::milliseconds(options_.stop_timeout_ms);
  for (auto& [id, e] : live) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    KillAndReap(e->pid, e->child, left > 1 ? left : 1);
    FLYT_INFO("server %s: stopped (pid %d)", id.c_str(), static_cast<int>(e->pid));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : servers_) RemoveFiles(id);
  servers_.clear();
  cv_.notify_all();
}

}  // namespace flyt::node
