// MPS control daemon handling against a fake nvidia-cuda-mps-control (a shell
// script that keeps its "daemon" as a file in the pipe folder), and the
// environment given to servers under MPS.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "node/mps_daemon.h"

namespace flyt::node {
namespace {

constexpr const char* kFakeControl = R"(#!/bin/sh
# Fake nvidia-cuda-mps-control: the "daemon" is the file $PIPE/running.
P="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then
  [ -n "$FAKE_MPS_FAIL" ] && { echo "fake: cannot start" >&2; exit 1; }
  echo "$CUDA_MPS_LOG_DIRECTORY" > "$P/running"; echo "-d" >> "$P/calls"; exit 0
fi
read cmd
echo "$cmd" >> "$P/calls"
[ -f "$P/running" ] || { echo "Cannot find MPS control daemon process"; exit 1; }
[ "$cmd" = quit ] && rm -f "$P/running"
exit 0
)";

class NodeMps : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/node_mps_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    control_ = dir_ + "/fake-mps-control";
    std::ofstream(control_) << kFakeControl;
    ASSERT_EQ(chmod(control_.c_str(), 0755), 0);
    options_.control_binary = control_;
    options_.pipe_dir = dir_ + "/pipe";
    options_.log_dir = dir_ + "/log";
    options_.timeout_ms = 3000;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string Calls() {
    std::ifstream in(options_.pipe_dir + "/calls");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  bool Running() { return access((options_.pipe_dir + "/running").c_str(), F_OK) == 0; }

  std::string dir_, control_;
  MpsOptions options_;
};

TEST_F(NodeMps, StartsTheDaemonAndQuitsIt) {
  MpsDaemon mps;
  Status st = mps.Start(options_);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(mps.running());
  EXPECT_TRUE(mps.started_here());
  EXPECT_TRUE(Running());
  // The daemon got the log folder, and the folders were created.
  std::ifstream running(options_.pipe_dir + "/running");
  std::string log_dir;
  std::getline(running, log_dir);
  EXPECT_EQ(log_dir, options_.log_dir);
  ASSERT_TRUE(mps.Quit().ok());
  EXPECT_FALSE(Running());
  EXPECT_FALSE(mps.running());
  EXPECT_NE(Calls().find("quit"), std::string::npos) << Calls();
}

TEST_F(NodeMps, UsesADaemonAlreadyRunningAndLeavesItRunning) {
  ASSERT_EQ(system(("mkdir -p " + options_.pipe_dir + " && touch " + options_.pipe_dir + "/running")
                       .c_str()),
            0);
  MpsDaemon mps;
  ASSERT_TRUE(mps.Start(options_).ok());
  EXPECT_TRUE(mps.running());
  EXPECT_FALSE(mps.started_here());
  ASSERT_TRUE(mps.Quit().ok());
  EXPECT_TRUE(Running());
  EXPECT_EQ(Calls().find("-d"), std::string::npos) << Calls();
  EXPECT_EQ(Calls().find("quit"), std::string::npos) << Calls();
}

TEST_F(NodeMps, FailuresSayWhatHappened) {
  MpsDaemon mps;
  options_.control_binary = dir_ + "/missing-control";
  Status st = mps.Start(options_);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("mps_control"), std::string::npos) << st.message();

  options_.control_binary = control_;
  setenv("FAKE_MPS_FAIL", "1", 1);
  st = mps.Start(options_);
  unsetenv("FAKE_MPS_FAIL");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exit status 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fake: cannot start"), std::string::npos) << st.message();
}

TEST_F(NodeMps, AskWithoutADaemonFails) {
  MpsDaemon mps;
  ASSERT_TRUE(mps.Start(options_).ok());
  ASSERT_TRUE(mps.Quit().ok());
  std::string out;
  Status st = mps.Ask("get_server_list", &out);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no MPS control daemon"), std::string::npos) << st.message();
}

TEST(NodeMpsEnv, ServerEnvironment) {
  MpsDaemon mps;  // not started: only the folders matter here
  EnvList env = mps.ServerEnv(2LL << 30, 25);
  auto get = [&](const std::string& name) {
    for (const auto& kv : env)
      if (kv.first == name) return kv.second;
    return std::string("<unset>");
  };
  EXPECT_EQ(get("CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING"), "1");
  EXPECT_EQ(get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=2048M");
  EXPECT_EQ(get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
  env = mps.ServerEnv(0, 0);
  EXPECT_EQ(get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "<unset>");
  EXPECT_EQ(get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "<unset>");
  EXPECT_NE(get("CUDA_MPS_PIPE_DIRECTORY"), "<unset>");
}

TEST(NodeMpsEnv, Figures) {
  EXPECT_EQ(MpsDaemon::ActiveThreadPercentage(33, 132), 25);
  EXPECT_EQ(MpsDaemon::ActiveThreadPercentage(32, 132), 25);  // ceil(24.2)
  EXPECT_EQ(MpsDaemon::ActiveThreadPercentage(1, 132), 1);
  EXPECT_EQ(MpsDaemon::ActiveThreadPercentage(132, 132), 100);
  EXPECT_EQ(MpsDaemon::ActiveThreadPercentage(0, 132), 100);
  EXPECT_EQ(MpsDaemon::ActiveThreadPercentage(8, 0), 100);
  EXPECT_EQ(MpsDaemon::PinnedMemLimit(1LL << 30), "0=1024M");
  EXPECT_EQ(MpsDaemon::PinnedMemLimit(1), "0=1M");  // rounded up
}

}  // namespace
}  // namespace flyt::node
