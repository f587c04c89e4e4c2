// The server supervisor against a fake flyt-server (tests/unit/node_fake_server.cc)
// whose misbehaviour each test chooses, and against the real flyt-server
// (--backend sim) when that one has a control socket.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "node/process.h"
#include "node/server_supervisor.h"

namespace flyt::node {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

bool Alive(int64_t pid) { return pid > 0 && kill(static_cast<pid_t>(pid), 0) == 0; }
bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

template <typename Pred>
bool WaitUntil(Pred pred, int ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

class NodeSupervisor : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/node_sup_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.server_binary = FLYT_FAKE_SERVER;
    options_.backend = "sim";
    options_.listen_host = "127.0.0.1";
    options_.advertise_host = "10.1.2.3";
    options_.run_dir = dir_ + "/run";
    options_.ready_timeout_ms = 5000;
    options_.stop_timeout_ms = 2000;
    options_.on_exit = [this] { exits_notified_++; };
    unsetenv("FAKE_MODE");
  }
  void TearDown() override {
    unsetenv("FAKE_MODE");
    unsetenv("FLYT_SECRET");
    std::system(("rm -rf " + dir_).c_str());
  }
  std::unique_ptr<ServerSupervisor> Open() {
    auto s = std::make_unique<ServerSupervisor>(options_);
    Status st = s->Open();
    EXPECT_TRUE(st.ok()) << st.message();
    return s;
  }
  static ServerParams Params(const std::string& id) {
    ServerParams p;
    p.alloc_id = id;
    p.gpu_uuid = "GPU-00000000-0000-0000-0000-000000000001";
    p.sm = 32;
    p.memory_bytes = 1LL << 30;
    p.token = "tok-" + id;
    return p;
  }
  Json Stats(ServerSupervisor& s, const std::string& id) {
    Json stats;
    Status st = ServerControlCall(s.SocketPath(id), Json{{"verb", "stats"}}, 2000, &stats);
    EXPECT_TRUE(st.ok()) << st.message();
    return stats;
  }

  std::string dir_;
  SupervisorOptions options_;
  std::atomic<int> exits_notified_{0};
};

TEST_F(NodeSupervisor, StartsAServerAndAnswersItsEndpoint) {
  setenv("FLYT_SECRET", "cluster-secret", 1);
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  Status st = sup->Start(Params("a1"), &started, &code);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(started.endpoint.rfind("tcp://10.1.2.3:", 0), 0u) << started.endpoint;
  EXPECT_NE(started.endpoint, "tcp://10.1.2.3:0");
  EXPECT_TRUE(Alive(started.pid));
  EXPECT_LT(started.ready_ms, 5000);
  EXPECT_TRUE(Exists(sup->SocketPath("a1")));
  EXPECT_TRUE(Exists(sup->LogPath("a1")));
  struct stat sb {};
  ASSERT_EQ(stat(sup->StatePath("a1").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);  // it holds the token

  Json stats = Stats(*sup, "a1");
  EXPECT_EQ(stats["token"], "tok-a1");  // from FLYT_TOKEN...
  std::string argv = stats["argv"];
  EXPECT_EQ(argv.find("tok-a1"), std::string::npos);  // ...never on the command line
  EXPECT_NE(argv.find("--memory-quota 1073741824"), std::string::npos) << argv;
  EXPECT_NE(argv.find("--sm-count 32"), std::string::npos) << argv;
  EXPECT_NE(argv.find("--backend sim"), std::string::npos) << argv;
  EXPECT_NE(argv.find("--listen tcp://127.0.0.1:0"), std::string::npos) << argv;
  EXPECT_EQ(stats["visible"], "GPU-00000000-0000-0000-0000-000000000001");
  EXPECT_EQ(stats["secret_leaked"], false);

  auto reports = sup->Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].alloc_id, "a1");
  EXPECT_EQ(reports[0].state, "running");
  EXPECT_EQ(reports[0].endpoint, started.endpoint);
  EXPECT_EQ(reports[0].pid, started.pid);
  EXPECT_EQ(reports[0].calls, 42);
  EXPECT_EQ(reports[0].memory_used, 4096);
  EXPECT_EQ(reports[0].memory_quota, 1LL << 30);
  EXPECT_EQ(reports[0].sm, 32);
  Json j = ToJson(reports[0]);
  for (const char* key : {"alloc_id", "gpu_uuid", "pid", "endpoint", "state", "sessions",
                          "memory_used", "memory_quota", "sm", "calls", "idle_ms"})
    EXPECT_TRUE(j.contains(key)) << key;

  // The same start again answers the running server; another token is refused.
  ServerSupervisor::Started again;
  ASSERT_TRUE(sup->Start(Params("a1"), &again, &code).ok());
  EXPECT_EQ(again.endpoint, started.endpoint);
  EXPECT_EQ(again.pid, started.pid);
  ServerParams other = Params("a1");
  other.token = "another";
  st = sup->Start(other, &again, &code);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(code, "bad_request");

  ASSERT_TRUE(sup->Stop("a1", &code).ok());
  EXPECT_TRUE(WaitUntil([&] { return !Alive(started.pid); }, 1000));
  EXPECT_FALSE(Exists(sup->SocketPath("a1")));
  EXPECT_FALSE(Exists(sup->StatePath("a1")));
  EXPECT_TRUE(Exists(sup->LogPath("a1")));  // kept for post-mortems
  EXPECT_TRUE(sup->Reports().empty());
  st = sup->Stop("a1", &code);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(code, "unknown_allocation");
  EXPECT_EQ(exits_notified_.load(), 0);  // stops are not exits
}

TEST_F(NodeSupervisor, PinsNoGpuForSimulatedInventories) {
  options_.pin_gpu = false;
  options_.extra_env = [](const ServerParams& p) {
    return EnvList{
        {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=" + std::to_string(p.memory_bytes >> 20) + "M"}};
  };
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  ASSERT_TRUE(sup->Start(Params("a2"), &started, &code).ok());
  Json stats = Stats(*sup, "a2");
  EXPECT_EQ(stats["visible"], "");
  EXPECT_EQ(stats["mps_mem_limit"], "0=1024M");
}

TEST_F(NodeSupervisor, SetShareIsForwardedAndRemembered) {
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  ASSERT_TRUE(sup->Start(Params("s1"), &started, &code).ok());
  Json answer;
  Status st = sup->SetShare("s1", 64, 2LL << 30, &answer, &code);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(answer["pause_us"], 7);
  ServerParams p;
  int64_t at_start = 0;
  ASSERT_TRUE(sup->Lookup("s1", &p, &at_start));
  EXPECT_EQ(p.sm, 64);
  EXPECT_EQ(p.memory_bytes, 2LL << 30);
  EXPECT_EQ(at_start, 1LL << 30);
  EXPECT_EQ(Stats(*sup, "s1")["sm"], 64);

  st = sup->SetShare("s1", 500, 1, &answer, &code);  // the server refuses
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(code, "bad_request");
  EXPECT_NE(st.message().find("too many SMs"), std::string::npos) << st.message();
  st = sup->SetShare("nope", 1, 1, &answer, &code);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(code, "unknown_allocation");
}

TEST_F(NodeSupervisor, AServerThatCrashesAtStartFailsWithItsLog) {
  setenv("FAKE_MODE", "crash", 1);
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  Status st = sup->Start(Params("c1"), &started, &code);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(code, "server_failed");
  EXPECT_NE(st.message().find("exit status 3"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("crashing on purpose"), std::string::npos) << st.message();
  EXPECT_TRUE(sup->Reports().empty());
  EXPECT_TRUE(sup->TakeExits().empty());  // the caller got the failure
}

TEST_F(NodeSupervisor, AServerThatNeverAnswersIsKilled) {
  setenv("FAKE_MODE", "hang", 1);
  options_.ready_timeout_ms = 400;
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  auto t0 = Clock::now();
  Status st = sup->Start(Params("h1"), &started, &code);
  ASSERT_FALSE(st.ok());
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(code, "server_failed");
  EXPECT_NE(st.message().find("within 400 ms"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("mode 'hang'"), std::string::npos) << st.message();
  // Nothing of it is left running.
  size_t at = st.message().find("fake: pid ");
  ASSERT_NE(at, std::string::npos) << st.message();
  EXPECT_FALSE(Alive(std::atoll(st.message().c_str() + at + 10)));
}

TEST_F(NodeSupervisor, StatsWithoutATcpPortAreNotReady) {
  setenv("FAKE_MODE", "no_port", 1);
  options_.ready_timeout_ms = 400;
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  Status st = sup->Start(Params("p1"), &started, &code);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no TCP port"), std::string::npos) << st.message();
}

TEST_F(NodeSupervisor, ExitsAreReportedAndRestartsKeepTheParameters) {
  setenv("FAKE_MODE", "die_after_ms:300", 1);
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  ASSERT_TRUE(sup->Start(Params("e1"), &started, &code).ok());
  ASSERT_TRUE(WaitUntil([&] { return exits_notified_.load() > 0; }, 3000));
  auto exits = sup->TakeExits();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].alloc_id, "e1");
  EXPECT_EQ(exits[0].exit_status, 5);
  EXPECT_NE(exits[0].reason.find("exit status 5"), std::string::npos) << exits[0].reason;
  EXPECT_NE(exits[0].reason.find("dying on purpose"), std::string::npos) << exits[0].reason;
  auto reports = sup->Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].state, "exited");

  setenv("FAKE_MODE", "ok", 1);
  auto t0 = Clock::now();
  ASSERT_TRUE(sup->Restart("e1").ok());
  EXPECT_EQ(sup->Reports()[0].state, "starting");
  ASSERT_TRUE(WaitUntil([&] { return sup->Reports()[0].state == "running"; }, 5000));
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(500));  // restarts are spaced
  reports = sup->Reports();
  EXPECT_NE(reports[0].pid, started.pid);
  EXPECT_EQ(Stats(*sup, "e1")["token"], "tok-e1");
  sup->Forget("e1");  // only exited servers are forgotten
  EXPECT_EQ(sup->Reports().size(), 1u);
}

TEST_F(NodeSupervisor, ForgetDropsAnExitedServer) {
  setenv("FAKE_MODE", "die_after_ms:100", 1);
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  ASSERT_TRUE(sup->Start(Params("f1"), &started, &code).ok());
  ASSERT_TRUE(WaitUntil([&] { return exits_notified_.load() > 0; }, 3000));
  sup->Forget("f1");
  EXPECT_TRUE(sup->Reports().empty());
  EXPECT_FALSE(Exists(sup->StatePath("f1")));
}

TEST_F(NodeSupervisor, AFailedRestartIsReportedAsAnExit) {
  setenv("FAKE_MODE", "die_after_ms:100", 1);
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  ASSERT_TRUE(sup->Start(Params("r1"), &started, &code).ok());
  ASSERT_TRUE(WaitUntil([&] { return exits_notified_.load() == 1; }, 3000));
  sup->TakeExits();
  setenv("FAKE_MODE", "crash", 1);
  ASSERT_TRUE(sup->Restart("r1").ok());
  ASSERT_TRUE(WaitUntil([&] { return exits_notified_.load() == 2; }, 5000));
  auto exits = sup->TakeExits();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_NE(exits[0].reason.find("restart failed"), std::string::npos) << exits[0].reason;
  EXPECT_NE(exits[0].reason.find("crashing on purpose"), std::string::npos) << exits[0].reason;
}

TEST_F(NodeSupervisor, StopEscalatesToSigkill) {
  setenv("FAKE_MODE", "ignore_term", 1);
  options_.stop_timeout_ms = 300;
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  ASSERT_TRUE(sup->Start(Params("k1"), &started, &code).ok());
  auto t0 = Clock::now();
  ASSERT_TRUE(sup->Stop("k1", &code).ok());
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(300));
  EXPECT_FALSE(Alive(started.pid));
}

TEST_F(NodeSupervisor, StopAllStopsEveryServer) {
  auto sup = Open();
  std::vector<int64_t> pids;
  for (const char* id : {"m1", "m2", "m3"}) {
    ServerSupervisor::Started started;
    std::string code;
    ASSERT_TRUE(sup->Start(Params(id), &started, &code).ok());
    pids.push_back(started.pid);
  }
  sup->StopAll();
  for (auto pid : pids) EXPECT_FALSE(Alive(pid));
  ServerSupervisor::Started started;
  std::string code;
  EXPECT_FALSE(sup->Start(Params("m4"), &started, &code).ok());
}

TEST_F(NodeSupervisor, ANewSupervisorAdoptsRunningServers) {
  auto first = Open();
  ServerSupervisor::Started started;
  std::string code;
  ASSERT_TRUE(first->Start(Params("ad1"), &started, &code).ok());
  // A second supervisor on the same run_dir stands for a restarted node manager.
  auto second = Open();
  auto reports = second->Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].state, "running");
  EXPECT_EQ(reports[0].pid, started.pid);
  EXPECT_EQ(reports[0].endpoint, started.endpoint);
  ServerParams p;
  ASSERT_TRUE(second->Lookup("ad1", &p, nullptr));
  EXPECT_EQ(p.token, "tok-ad1");
  // Stopping an adopted server works without waitpid.
  ASSERT_TRUE(second->Stop("ad1", &code).ok());
  EXPECT_TRUE(WaitUntil([&] { return !Alive(started.pid); }, 2000));
  // The first one (its parent) notices the exit.
  EXPECT_TRUE(WaitUntil([&] { return exits_notified_.load() > 0; }, 2000));
}

TEST_F(NodeSupervisor, StaleStateFilesAreCleanedUp) {
  ASSERT_EQ(system(("mkdir -p " + options_.run_dir).c_str()), 0);
  FILE* f = fopen((options_.run_dir + "/old.json").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fprintf(f, R"({"gpu_uuid":"g","sm":1,"memory_bytes":1,"token":"t","pid":999999999})");
  fclose(f);
  auto sup = Open();
  EXPECT_TRUE(sup->Reports().empty());
  EXPECT_FALSE(Exists(options_.run_dir + "/old.json"));
}

TEST_F(NodeSupervisor, BadAllocIdsAreRefused) {
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  for (const char* id : {"", "../x", ".hidden", "a b", "-flag"}) {
    Status st = sup->Start(Params(id), &started, &code);
    EXPECT_FALSE(st.ok()) << id;
    EXPECT_EQ(code, "bad_request");
  }
}

TEST_F(NodeSupervisor, OpenChecksTheServerBinary) {
  options_.server_binary = dir_ + "/no-such-server";
  ServerSupervisor sup(options_);
  Status st = sup.Open();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("server_binary"), std::string::npos) << st.message();
}

// The real flyt-server with the sim backend, once it has --control.
TEST_F(NodeSupervisor, RealFlytServerWithSimBackend) {
  SpawnOptions help;
  help.argv = {FLYT_REAL_SERVER, "--help"};
  int ws = 0;
  std::string usage;
  ASSERT_TRUE(RunCommand(help, "", 5000, &ws, &usage).ok());
  if (usage.find("--control") == std::string::npos) GTEST_SKIP() << "flyt-server has no --control";
  options_.server_binary = FLYT_REAL_SERVER;
  options_.pin_gpu = false;
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  ServerParams p = Params("real1");
  p.sm = 0;  // the whole (simulated) GPU
  Status st = sup->Start(p, &started, &code);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(started.endpoint.rfind("tcp://10.1.2.3:", 0), 0u) << started.endpoint;
  auto reports = sup->Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].state, "running");
  EXPECT_EQ(reports[0].sessions, 0);
  EXPECT_EQ(reports[0].memory_quota, 1LL << 30);
  Json stats = Stats(*sup, "real1");
  EXPECT_EQ(stats["pid"], started.pid);
  Json answer;
  st = sup->SetShare("real1", 0, 2LL << 30, &answer, &code);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(answer.contains("pause_us")) << answer.dump();
  EXPECT_EQ(sup->Reports()[0].memory_quota, 2LL << 30);
  ASSERT_TRUE(sup->Stop("real1", &code).ok());
  EXPECT_FALSE(Alive(started.pid));
  EXPECT_FALSE(Exists(sup->SocketPath("real1")));
}

TEST_F(NodeSupervisor, ServerTlsListensOnTlsAndHandsOutTlsEndpoints) {
  const std::string cmd = "cd " + dir_ +
                          " && openssl req -x509 -newkey ec -pkeyopt "
                          "ec_paramgen_curve:prime256v1 -nodes -keyout node.key -out node.pem "
                          "-days 1 -subj /CN=node >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a certificate";
  options_.server_binary = FLYT_REAL_SERVER;
  options_.pin_gpu = false;
  options_.tls_cert = dir_ + "/node.pem";
  options_.tls_key = dir_ + "/node.key";
  auto sup = Open();
  ServerSupervisor::Started started;
  std::string code;
  ServerParams p = Params("tls1");
  p.sm = 0;
  Status st = sup->Start(p, &started, &code);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(started.endpoint.rfind("tls://10.1.2.3:", 0), 0u) << started.endpoint;
  const std::string listen = Stats(*sup, "tls1")["listen"].dump();
  EXPECT_NE(listen.find("tls://127.0.0.1:"), std::string::npos) << listen;
  EXPECT_EQ(listen.find("tcp://"), std::string::npos) << listen;
  ASSERT_TRUE(sup->Stop("tls1", &code).ok());
}

}  // namespace
}  // namespace flyt::node
