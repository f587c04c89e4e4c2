// Child processes: spawning, waiting, running commands, environments, log tails.
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "node/process.h"

namespace flyt::node {
namespace {

std::string TempPath(const char* stem) {
  return std::string("/tmp/") + stem + "_" + std::to_string(getpid());
}

TEST(NodeProcess, RunCommandFeedsStdinAndCollectsOutput) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "read line; echo \"got $line\"; echo oops >&2; exit 3"};
  o.env = ChildEnvironment({}, {});
  int ws = 0;
  std::string out;
  Status st = RunCommand(o, "hello\n", 5000, &ws, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(ExitCode(ws), 3);
  EXPECT_EQ(DescribeExit(ws), "exit status 3");
  EXPECT_NE(out.find("got hello"), std::string::npos) << out;
  EXPECT_NE(out.find("oops"), std::string::npos) << out;
}

TEST(NodeProcess, RunCommandKillsWhatOverstays) {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "10"};
  int ws = 0;
  std::string out;
  auto t0 = std::chrono::steady_clock::now();
  Status st = RunCommand(o, "", 200, &ws, &out);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("did not finish within 200 ms"), std::string::npos) << st.message();
  EXPECT_LT(ms, 3000);
}

TEST(NodeProcess, RunCommandDoesNotWaitForDaemonsLeftBehind) {
  SpawnOptions o;
  // The grandchild keeps stdout open; collection ends when the direct child exits.
  o.argv = {"/bin/sh", "-c", "echo forked; (sleep 3 &) ; exit 0"};
  int ws = 0;
  std::string out;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(RunCommand(o, "", 5000, &ws, &out).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500));
  EXPECT_NE(out.find("forked"), std::string::npos);
}

TEST(NodeProcess, MissingProgramIsAnError) {
  SpawnOptions o;
  o.argv = {"/nonexistent/program"};
  pid_t pid = -1;
  Status st = Spawn(o, &pid);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/nonexistent/program"), std::string::npos) << st.message();
}

TEST(NodeProcess, ChildGetsAnEmptySignalMaskAndItsOwnGroup) {
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  SpawnOptions o;
  o.argv = {"/bin/sleep", "10"};
  o.output_path = TempPath("node_process_log");
  pid_t pid = -1;
  Status st = Spawn(o, &pid);
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(getpgid(pid), pid);
  ASSERT_EQ(kill(-pid, SIGTERM), 0);
  bool exited = false;
  int ws = 0;
  ASSERT_TRUE(WaitFor(pid, 5000, &exited, &ws).ok());
  ASSERT_TRUE(exited);
  EXPECT_TRUE(WIFSIGNALED(ws));
  EXPECT_EQ(ExitCode(ws), 128 + SIGTERM);
  EXPECT_NE(DescribeExit(ws).find("killed by signal 15"), std::string::npos);
  std::remove(o.output_path.c_str());
}

TEST(NodeProcess, OutputGoesToTheLogFile) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo to-stdout; echo to-stderr >&2"};
  o.output_path = TempPath("node_process_out");
  std::remove(o.output_path.c_str());
  pid_t pid = -1;
  ASSERT_TRUE(Spawn(o, &pid).ok());
  bool exited = false;
  int ws = 0;
  ASSERT_TRUE(WaitFor(pid, 5000, &exited, &ws).ok());
  ASSERT_TRUE(exited);
  EXPECT_EQ(TailOfFile(o.output_path, 10, 1000), "to-stdout\nto-stderr");
  std::remove(o.output_path.c_str());
}

TEST(NodeProcess, ChildEnvironmentDropsAndSets) {
  setenv("NODE_TEST_DROP_ME", "1", 1);
  setenv("NODE_TEST_KEEP", "1", 1);
  setenv("NODE_TEST_REPLACED", "old", 1);
  auto env = ChildEnvironment({"NODE_TEST_DROP"}, {{"NODE_TEST_REPLACED", "new"}});
  auto has = [&](const std::string& e) {
    for (const auto& x : env)
      if (x == e) return true;
    return false;
  };
  EXPECT_TRUE(has("NODE_TEST_KEEP=1"));
  EXPECT_FALSE(has("NODE_TEST_DROP_ME=1"));
  EXPECT_TRUE(has("NODE_TEST_REPLACED=new"));
  EXPECT_FALSE(has("NODE_TEST_REPLACED=old"));
}

TEST(NodeProcess, TailOfFileKeepsTheLastLines) {
  std::string path = TempPath("node_process_tail");
  std::ofstream(path) << "one\ntwo\nthree\nfour\n";
  EXPECT_EQ(TailOfFile(path, 2, 1000), "three\nfour");
  EXPECT_EQ(TailOfFile(path, 10, 1000), "one\ntwo\nthree\nfour");
  EXPECT_EQ(TailOfFile(path, 10, 7), "e\nfour");  // byte cap
  EXPECT_EQ(TailOfFile("/nonexistent", 10, 1000), "");
  std::remove(path.c_str());
}

TEST(NodeProcess, ValidUtf8ReplacesBadBytes) {
  EXPECT_EQ(ValidUtf8("plain\ttext\n"), "plain\ttext\n");
  EXPECT_EQ(ValidUtf8("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(ValidUtf8("bad\xff\xc3"), "bad??");
  EXPECT_EQ(ValidUtf8(std::string("nul\0x", 5)), "nul?x");
}

TEST(NodeProcess, MakeDirectoriesCreatesParents) {
  std::string base = TempPath("node_process_dirs");
  ASSERT_TRUE(MakeDirectories(base + "/a/b", 0700).ok());
  EXPECT_TRUE(MakeDirectories(base + "/a/b", 0700).ok());  // idempotent
  std::ofstream(base + "/file") << "x";
  EXPECT_FALSE(MakeDirectories(base + "/file", 0700).ok());
  std::remove((base + "/file").c_str());
  rmdir((base + "/a/b").c_str());
  rmdir((base + "/a").c_str());
  rmdir(base.c_str());
}

}  // namespace
}  // namespace flyt::node
