// The MPS control daemon of this host, when the node manager runs with mps=true.
//
// Owns: starting `nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY and
// CUDA_MPS_LOG_DIRECTORY set to the node manager's own folders (or using a
// daemon that already answers there), the environment that puts one
// flyt-server under it with its memory cap and SM share, and sending `quit` to
// the daemon it started. A daemon it found running is left running. Must not
// know about allocations beyond the figures passed in, nor start flyt-servers.
//
// Environment given to each flyt-server under MPS:
//   CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY   the daemon's folders;
//   CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING=1
//       always: it only opts the process in to non-uniform SM partitioning, so
//       that the server may give its context a fixed SM count with
//       cuCtxCreate_v3 + CU_EXEC_AFFINITY_TYPE_SM_COUNT; it limits nothing itself;
//   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M   when a memory cap is asked:
//       device 0 is the allocation's GPU (CUDA_VISIBLE_DEVICES names only it).
//       The cap is fixed for the life of the process;
//   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=ceil(100*sm/sm_total)   only when the
//       SM share is enforced by MPS itself (server_sm_mechanism=mps); with
//       green contexts (the default) the server splits SMs itself and a
//       percentage would only cap it further. Fixed for the life of the process.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace flyt::node {

struct MpsOptions {
  std::string control_binary = "nvidia-cuda-mps-control";
  std::string pipe_dir;
  std::string log_dir;
  int timeout_ms = 10000;  // for each command sent to the daemon, and for its start
};

using EnvList = std::vector<std::pair<std::string, std::string>>;

class MpsDaemon {
 public:
  // Starts the control daemon unless one already answers in options.pipe_dir.
  Status Start(const MpsOptions& options);
  // Sends `quit` when this process started the daemon; otherwise does nothing.
  Status Quit();

  bool running() const { return running_; }
  bool started_here() const { return started_here_; }

  // The environment of one flyt-server under this daemon. memory_cap_bytes 0:
  // no MPS memory cap; active_thread_percentage 0: no MPS SM cap.
  EnvList ServerEnv(int64_t memory_cap_bytes, int active_thread_percentage) const;

  // ceil(100 * sm / sm_total), within 1..100 (100 when either is not positive).
  static int ActiveThreadPercentage(int64_t sm, int64_t sm_total);
  // The value of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for a cap of `bytes` on device 0.
  static std::string PinnedMemLimit(int64_t bytes);

  // Sends one command to the control daemon ("get_server_list", "quit").
  // Fails when no daemon answers in the pipe folder.
  Status Ask(const std::string& command, std::string* output) const;

 private:
  EnvList DaemonEnv() const;
  bool Answers() const;

  MpsOptions options_;
  bool running_ = false;
  bool started_here_ = false;
};

}  // namespace flyt::node
