// The flyt-servers of this node: one child process per allocation.
//
// Owns: starting a flyt-server for an allocation (command line, environment,
// token in FLYT_TOKEN rather than on the command line, log file
// <run_dir>/<alloc_id>.log, control socket <run_dir>/<alloc_id>.ctl, state file
// <run_dir>/<alloc_id>.json), waiting until its control socket answers `stats`,
// noticing exits (waitpid) without losing them, stopping (SIGTERM to its
// process group, SIGKILL after stop_timeout_ms), forwarding set-share and the
// session moves (migrate, checkpoint, restore), reading
// each server's stats for reports, and adopting servers left running by a
// node manager that died. Must not talk to the cluster manager nor decide what
// happens after an exit: the node manager asks, then calls Restart or Forget.
//
// Thread-safe. A monitor thread reaps exits and probes servers that are starting.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "node/mps_daemon.h"

namespace flyt::node {

struct ServerParams {
  std::string alloc_id;
  std::string gpu_uuid;
  int64_t sm = 0;            // SMs; 0: no --sm-count (the whole GPU)
  int64_t memory_bytes = 0;  // quota; 0: no --memory-quota
  std::string token;         // clients' credential, passed in FLYT_TOKEN
  int port = 0;              // the data-plane TCP port; 0: the kernel picks one
};

// `ServerReport` of docs/control_plane.md.
struct ServerReport {
  std::string alloc_id, gpu_uuid, endpoint;
  std::string state;  // "starting", "running", "exited"
  int64_t pid = 0;
  int64_t sessions = 0, memory_used = 0, memory_quota = 0, sm = 0, calls = 0, idle_ms = 0;
  int64_t bytes_in = 0, bytes_out = 0;  // frame bytes from and to its clients
};
nlohmann::json ToJson(const ServerReport& report);

// A server that ended on its own (not by Stop), or a restart that never became ready.
struct ServerExit {
  std::string alloc_id;
  int exit_status = -1;  // exit code, 128 + signal when killed, -1 when unknown
  std::string reason;    // how it ended and the last lines of its log
};

struct SupervisorOptions {
  std::string server_binary;                 // path of flyt-server
  std::string backend = "cuda";              // --backend
  std::string listen_host = "0.0.0.0";       // --listen tcp://HOST:0
  std::string advertise_host = "127.0.0.1";  // HOST of the endpoints handed out
  std::string run_dir;                       // sockets, logs and state files (created 0700)
  int ready_timeout_ms = 10000;              // start until `stats` answers
  int stop_timeout_ms = 2000;                // SIGTERM until SIGKILL
  int control_timeout_ms = 2000;             // one request on a control socket
  bool pin_gpu = true;                       // CUDA_VISIBLE_DEVICES=<gpu_uuid>
  bool shared_memory = true;                 // also --listen shm://<run_dir>/<id>.shm
  bool movable_memory = false;               // --movable-memory (server/session_movable.cc)
  std::string tls_cert, tls_key;             // set: tls://HOST:0 instead of tcp://HOST:0
  std::string tls_peer_ca;                   // --tls-peer-ca: checks a migration's target
  // Extra environment of one server (MPS variables), asked at every (re)start.
  std::function<EnvList(const ServerParams&)> extra_env;
  // Called from the monitor thread after a server exited on its own
  // (TakeExits then has it). Must not call back into the supervisor.
  std::function<void()> on_exit;
};

// One request on a flyt-server's control socket ("unix:///path" or a path):
// no handshake, same framing as the control plane. Fails when no answer came
// within timeout_ms or the answer says ok:false.
Status ServerControlCall(const std::string& socket, const nlohmann::json& request, int timeout_ms,
                         nlohmann::json* answer);

// Checks that `alloc_id` can name files: 1-64 of [A-Za-z0-9._-], not starting with '.' or '-'.
Status ValidateAllocId(const std::string& alloc_id);

class ServerSupervisor {
 public:
  explicit ServerSupervisor(SupervisorOptions options);
  ~ServerSupervisor();  // stops every server
  ServerSupervisor(const ServerSupervisor&) = delete;
  ServerSupervisor& operator=(const ServerSupervisor&) = delete;

  // Creates run_dir, adopts servers a previous node manager left running
  // (their state file names a live process whose control socket answers with
  // that pid; others are cleaned up), starts the monitor thread.
  Status Open();

  struct Started {
    std::string endpoint;  // tcp:// (or tls://) <advertise_host>:<port>
    int64_t pid = 0;
    int64_t ready_ms = 0;  // 0 when it was already running
  };
  // Starts the allocation's server and waits until it is ready. A server
  // already running for alloc_id with the same GPU and token is returned as is.
  // On failure *code is a control-plane error code (bad_request, server_failed).
  Status Start(const ServerParams& params, Started* out, std::string* code);
  // Starts an exited server again with its last parameters without waiting;
  // a failure to become ready is reported as a new exit.
  Status Restart(const std::string& alloc_id);
  // Drops an exited server (its files too). Does nothing to one that runs.
  void Forget(const std::string& alloc_id);
  // Stops the server (SIGTERM, SIGKILL after stop_timeout_ms) and forgets it.
  Status Stop(const std::string& alloc_id, std::string* code);
  // Forwards set-share to the server; remembers the new share for restarts.
  Status SetShare(const std::string& alloc_id, int64_t sm, int64_t memory_bytes,
                  nlohmann::json* answer, std::string* code);
  // Forwards one request (set-share; migrate, checkpoint, restore, which answer after their
  // sessions did, so timeout_ms is the caller's) to a running server's control socket.
  // *answer is the server's answer; on failure *code is its code, or server_failed when
  // none came.
  Status Forward(const std::string& alloc_id, const nlohmann::json& request, int timeout_ms,
                 nlohmann::json* answer, std::string* code);
  // Parameters of a known server, and the quota it was started with.
  bool Lookup(const std::string& alloc_id, ServerParams* params, int64_t* memory_at_start);
  // One report per server, with fresh stats from every running one.
  std::vector<ServerReport> Reports();
  // Exits noticed since the last call.
  std::vector<ServerExit> TakeExits();
  // Stops every server (all at once) and the monitor thread.
  void StopAll();

  std::string SocketPath(const std::string& alloc_id) const;
  std::string LogPath(const std::string& alloc_id) const;
  std::string ShmPath(const std::string& alloc_id) const;
  std::string StatePath(const std::string& alloc_id) const;

 private:
  // "tls://" when the servers get a certificate, else "tcp://".
  std::string Scheme() const { return options_.tls_cert.empty() ? "tcp://" : "tls://"; }
  using Clock = std::chrono::steady_clock;
  enum class State { kStarting, kRunning, kExited, kStopping, kFailed };
  struct Entry {
    ServerParams params;
    State state = State::kStarting;
    pid_t pid = -1;
    bool child = true;    // false: adopted, not our child (no waitpid, status unknown)
    bool waited = false;  // a Start call waits: a failed start goes to it, not to exits
    uint64_t generation = 0;
    Clock::time_point spawned;
    std::string endpoint;
    int64_t ready_ms = 0;
    int64_t memory_at_start = 0;
    std::string failure;     // kFailed: why the start failed
    std::string last_probe;  // kStarting: why the last readiness probe failed
  };
  using EntryPtr = std::shared_ptr<Entry>;

  Status SpawnLocked(const EntryPtr& e);
  bool CheckExitLocked(const EntryPtr& e, int* wait_status, bool* known);
  void HandleExitLocked(const std::string& alloc_id, const EntryPtr& e, int wait_status, bool known,
                        bool* notify);
  void FailStartLocked(const std::string& alloc_id, const EntryPtr& e, const std::string& why,
                       bool* notify);
  void KillAndReap(pid_t pid, bool child, int timeout_ms);
  void RemoveFiles(const std::string& alloc_id);  // with mu_ held (or before the monitor runs)
  void WriteStateFile(const std::string& alloc_id, const Entry& e);
  void Adopt();
  void MonitorLoop();
  Status Probe(const std::string& alloc_id, std::string* endpoint);

  SupervisorOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;  // state changes; also paces the monitor
  std::map<std::string, EntryPtr> servers_;
  std::vector<ServerExit> exits_;
  std::set<std::string> stats_failing_;  // servers whose last stats request failed
  bool stopping_ = false;
  std::thread monitor_;
};

}  // namespace flyt::node
