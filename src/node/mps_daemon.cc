#include "node/mps_daemon.h"

#include <chrono>
#include <thread>

#include "common/log.h"
#include "node/process.h"

namespace flyt::node {
namespace {

using Clock = std::chrono::steady_clock;

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

EnvList MpsDaemon::DaemonEnv() const {
  return {{"CUDA_MPS_PIPE_DIRECTORY", options_.pipe_dir},
          {"CUDA_MPS_LOG_DIRECTORY", options_.log_dir}};
}

Status MpsDaemon::Ask(const std::string& command, std::string* output) const {
  SpawnOptions spawn;
  spawn.argv = {options_.control_binary};
  spawn.env = ChildEnvironment({"CUDA_MPS_"}, DaemonEnv());
  int wait_status = 0;
  Status st = RunCommand(spawn, command + "\n", options_.timeout_ms, &wait_status, output);
  if (!st.ok()) return st;
  // With no daemon the client prints "Cannot find MPS control daemon process".
  if (ExitCode(wait_status) != 0 || output->find("Cannot find") != std::string::npos)
    return Status::Error("no MPS control daemon answered '" + command + "' in " +
                         options_.pipe_dir + " (" + DescribeExit(wait_status) + ": " +
                         Trim(*output) + ")");
  return Status::Ok();
}

bool MpsDaemon::Answers() const {
  std::string out;
  return Ask("get_server_list", &out).ok();
}

Status MpsDaemon::Start(const MpsOptions& options) {
  options_ = options;
  if (options_.pipe_dir.empty() || options_.log_dir.empty())
    return Status::Error("internal error: MPS pipe and log folders must be set");
  Status st = MakeDirectories(options_.pipe_dir, 0700);
  if (st.ok()) st = MakeDirectories(options_.log_dir, 0700);
  if (!st.ok()) return Status::Error("MPS: " + st.message());
  if (Answers()) {
    running_ = true;
    started_here_ = false;
    FLYT_INFO("MPS: using the control daemon already running in %s (left running at exit)",
              options_.pipe_dir.c_str());
    return Status::Ok();
  }
  SpawnOptions spawn;
  spawn.argv = {options_.control_binary, "-d"};
  spawn.env = ChildEnvironment({"CUDA_MPS_"}, DaemonEnv());
  spawn.output_path = options_.log_dir + "/control-start.log";
  spawn.new_process_group = true;  // signals to the node manager's group stay with us
  pid_t pid = -1;
  st = Spawn(spawn, &pid);
  if (!st.ok())
    return Status::Error("MPS: " + st.message() +
                         " (is the NVIDIA driver's nvidia-cuda-mps-control installed? set "
                         "mps_control to its path, or run with mps=false)");
  bool exited = false;
  int wait_status = 0;
  st = WaitFor(pid, options_.timeout_ms, &exited, &wait_status);
  if (!st.ok()) return Status::Error("MPS: " + st.message());
  if (!exited || ExitCode(wait_status) != 0)
    return Status::Error("MPS: '" + options_.control_binary + " -d' " +
                         (exited ? DescribeExit(wait_status) : std::string("did not return")) +
                         ": " + TailOfFile(spawn.output_path, 10, 2048) + " (see " +
                         options_.log_dir + "/control.log)");
  auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  for (;;) {
    std::string out;
    st = Ask("get_server_list", &out);
    if (st.ok()) break;
    if (Clock::now() >= deadline)
      return Status::Error("MPS: the control daemon started but does not answer: " + st.message() +
                           " (see " + options_.log_dir + "/control.log)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  running_ = true;
  started_here_ = true;
  FLYT_INFO("MPS: control daemon started (pipes %s, logs %s)", options_.pipe_dir.c_str(),
            options_.log_dir.c_str());
  return Status::Ok();
}

Status MpsDaemon::Quit() {
  if (!running_ || !started_here_) return Status::Ok();
  std::string out;
  Status st = Ask("quit", &out);
  if (!st.ok()) {
    running_ = false;
    return Status::Error("MPS: cannot quit the control daemon: " + st.message());
  }
  // `quit` returns at once; wait (bounded) until the daemon stops answering.
  auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  while (Answers()) {
    if (Clock::now() >= deadline) {
      running_ = false;
      return Status::Error(
          "MPS: the control daemon still answers after 'quit'; stop it with "
          "'echo quit | CUDA_MPS_PIPE_DIRECTORY=" +
          options_.pipe_dir + " nvidia-cuda-mps-control'");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  running_ = false;
  started_here_ = false;
  FLYT_INFO("MPS: control daemon quit");
  return Status::Ok();
}

EnvList MpsDaemon::ServerEnv(int64_t memory_cap_bytes, int active_thread_percentage) const {
  EnvList env = DaemonEnv();
  env.emplace_back("CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING", "1");
  if (memory_cap_bytes > 0)
    env.emplace_back("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", PinnedMemLimit(memory_cap_bytes));
  if (active_thread_percentage > 0)
    env.emplace_back("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", std::to_string(active_thread_percentage));
  return env;
}

int MpsDaemon::ActiveThreadPercentage(int64_t sm, int64_t sm_total) {
  if (sm <= 0 || sm_total <= 0 || sm >= sm_total) return 100;
  int64_t pct = (100 * sm + sm_total - 1) / sm_total;
  return static_cast<int>(pct < 1 ? 1 : pct);
}

std::string MpsDaemon::PinnedMemLimit(int64_t bytes) {
  int64_t mib = (bytes + (1 << 20) - 1) >> 20;
  return "0=" + std::to_string(mib) + "M";
}

}  // namespace flyt::node
