// flyt-node-manager: one per GPU host (docs/control_plane.md).
//
// Owns: the node manager's settings and their derived defaults, the verbs it
// answers for the cluster manager (start-server, stop-server, set-share,
// list-servers, migrate/checkpoint/restore forwarded to one server's control
// socket, and the file side of shipping a checkpoint to another node: reading
// this node's checkpoint files, writing a shipped copy under <run_dir>/incoming;
// peers of any other role are refused), and its side of the
// conversation with the cluster manager: register-node (GPUs and the servers
// running now, so that a restarted cluster manager adopts them), a heartbeat
// with ServerReports every heartbeat_ms, server-exited for each server that
// ended on its own and obeying the answer (restart or free), reconnecting with
// backoff whenever the cluster manager is away. Must not manage processes
// itself (ServerSupervisor, MpsDaemon do) nor read GPUs (gpu_inventory).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "control/channel.h"
#include "control/config.h"
#include "node/gpu_inventory.h"
#include "node/mps_daemon.h"
#include "node/server_supervisor.h"

namespace flyt::node {

// Settings of section [node_manager] / FLYT_NM_* / --flags. Empty strings are
// filled by ResolveDefaults.
struct NodeConfig {
  std::string listen = "0.0.0.0:12401";
  std::string advertise_host;  // default: first non-loopback IPv4 of the host, else 127.0.0.1
  std::string host_ip;         // default: advertise_host
  std::string node_id;         // default: the host name
  std::string cluster_manager = "127.0.0.1:12400";
  control::TlsFiles tls;    // tls_ca, tls_cert, tls_key: mutual TLS to the cluster manager
  std::string secret;       // default: $FLYT_SECRET
  std::string secret_file;  // default: <state_dir>/cluster.secret
  int64_t heartbeat_ms = 1000;
  std::string state_dir;      // default: control::DefaultStateDir()
  std::string run_dir;        // default: <state_dir>/node
  std::string server_binary;  // default: flyt-server next to this executable
  std::string server_backend = "cuda";
  std::string server_listen_host = "0.0.0.0";
  std::string server_sm_mechanism = "green";  // "green" or "mps" (see mps_daemon.h)
  bool server_shared_memory = true;           // servers also listen on shm:// (same-host clients)
  bool server_movable_memory = false;         // servers with --movable-memory (moves on GPUs)
  bool server_tls = false;         // servers listen on tls:// with tls_cert/tls_key (not tcp://)
  std::string inventory = "nvml";  // "nvml", "sim:N", "sim:FILE.json"
  bool mps = false;
  std::string mps_control = "nvidia-cuda-mps-control";
  std::string mps_pipe_dir;  // default: <run_dir>/mps-pipe
  std::string mps_log_dir;   // default: <run_dir>/mps-log
  bool mps_memory_limit = false;
  int64_t ready_timeout_ms = 10000;
  int64_t stop_timeout_ms = 2000;
};

// Registers every NodeConfig field with `settings` (section "node_manager",
// env prefix "NM"); the targets stay owned by `config`.
void RegisterSettings(control::Settings* settings, NodeConfig* config);
// Fills the derived defaults and checks the values.
Status ResolveDefaults(NodeConfig* config);

class NodeManager {
 public:
  explicit NodeManager(NodeConfig config);
  ~NodeManager();  // Shutdown()
  NodeManager(const NodeManager&) = delete;
  NodeManager& operator=(const NodeManager&) = delete;

  // Reads the GPUs, starts MPS (mps=true), adopts servers left by a previous
  // node manager, listens for the cluster manager, starts reporting.
  Status Start();
  // Stops reporting and listening, stops every server, quits MPS. Idempotent.
  void Shutdown();

  // Answers one request from a peer (the Listener's handler; public for tests).
  control::Json Handle(const control::Peer& peer, const control::Json& request);

  // The bound listen address ("tcp://0.0.0.0:12401") once started.
  std::string ListenAddress() const;
  // "advertise_host:port": what register-node reports as address.
  std::string AdvertisedAddress() const;
  const std::vector<GpuInfo>& gpus() const { return gpus_; }
  const NodeConfig& config() const { return config_; }
  // Whether register-node has been answered on the current connection.
  bool registered() const { return registered_.load(); }

 private:
  control::Json StartServer(const control::Json& request);
  control::Json StopServer(const control::Json& request);
  control::Json SetShare(const control::Json& request);
  // migrate, checkpoint, restore: forwarded to the allocation's server.
  control::Json MoveSessions(const std::string& verb, const control::Json& request);
  control::Json ListServers();
  // Shipping a checkpoint to another node (restore there): the source lists and reads its
  // session files, the target writes them under <run_dir>/incoming/<transfer>/gpuN and
  // drops that copy afterwards; spend-checkpoint marks the source's files restored.
  control::Json CheckpointFilesVerb(const std::string& verb, const control::Json& request);
  const GpuInfo* FindGpu(const std::string& uuid) const;
  EnvList ServerEnv(const ServerParams& params) const;

  control::Json RegisterRequest();
  void ReportLoop();
  // Waits up to ms or until woken (stop, a server exit).
  void Sleep(int64_t ms);

  NodeConfig config_;
  control::Credentials creds_;
  std::vector<GpuInfo> gpus_;
  MpsDaemon mps_;
  std::unique_ptr<ServerSupervisor> supervisor_;
  std::unique_ptr<control::Listener> listener_;
  std::string listen_address_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;
  bool shut_down_ = false;
  std::atomic<bool> registered_{false};
  std::thread reporter_;
};

}  // namespace flyt::node
