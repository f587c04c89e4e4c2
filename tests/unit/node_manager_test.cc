// The node manager end to end on loopback: a fake cluster manager (a real
// control::Listener with the cluster secret) records register-node, heartbeat
// and server-exited; the test plays the cluster manager's commands over a real
// authenticated channel; servers are the fake flyt-server.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "control/channel.h"
#include "control/config.h"
#include "node/node_manager.h"

namespace flyt::node {
namespace {

using control::Json;
using Clock = std::chrono::steady_clock;

constexpr const char* kSecret = "node-manager-test-secret";

bool Alive(int64_t pid) { return pid > 0 && kill(static_cast<pid_t>(pid), 0) == 0; }

class FakeClusterManager {
 public:
  ~FakeClusterManager() { Stop(); }
  Status Start(const std::string& address) {
    control::Credentials creds{kSecret};
    Status st = control::Listener::Start(
        address, creds, [this](const control::Peer& p, const Json& r) { return Handle(p, r); },
        &listener_);
    if (st.ok()) address_ = listener_->Describe();
    return st;
  }
  void Stop() {
    if (listener_) listener_->Stop();
    listener_.reset();
  }
  const std::string& address() const { return address_; }

  template <typename Pred>
  bool WaitFor(Pred pred, int ms) {
    std::unique_lock<std::mutex> lock(mu);
    return cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return pred(); });
  }

  std::mutex mu;
  std::vector<Json> registers, heartbeats, exits;
  std::vector<std::string> peers;   // role/name of each request
  std::deque<std::string> actions;  // answers to server-exited; "free" when empty

 private:
  Json Handle(const control::Peer& peer, const Json& req) {
    std::lock_guard<std::mutex> lock(mu);
    peers.push_back(peer.role + "/" + peer.name);
    const std::string verb = req.value("verb", "");
    Json answer = control::Ok();
    if (verb == "register-node") {
      registers.push_back(req);
      answer = control::Ok({{"heartbeat_ms", 100}});
    } else if (verb == "heartbeat") {
      heartbeats.push_back(req);
    } else if (verb == "server-exited") {
      exits.push_back(req);
      std::string action = "free";
      if (!actions.empty()) {
        action = actions.front();
        actions.pop_front();
      }
      answer = control::Ok({{"action", action}});
    } else {
      answer = control::Error("bad_request", "unknown verb");
    }
    cv_.notify_all();
    return answer;
  }

  std::condition_variable cv_;
  std::unique_ptr<control::Listener> listener_;
  std::string address_;
};

class NodeManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/node_nm_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    unsetenv("FAKE_MODE");
    ASSERT_TRUE(cm_.Start("127.0.0.1:0").ok());
    config_.listen = "127.0.0.1:0";
    config_.advertise_host = "127.0.0.1";
    config_.node_id = "node-t";
    config_.cluster_manager = cm_.address();
    config_.secret = kSecret;
    config_.state_dir = dir_;
    config_.inventory = "sim:2";
    config_.server_binary = FLYT_FAKE_SERVER;
    config_.server_backend = "sim";
    config_.server_listen_host = "127.0.0.1";
    config_.heartbeat_ms = 100;
    config_.ready_timeout_ms = 5000;
  }
  void TearDown() override {
    unsetenv("FAKE_MODE");
    std::system(("rm -rf " + dir_).c_str());
  }
  std::unique_ptr<NodeManager> StartNode() {
    Status st = ResolveDefaults(&config_);
    EXPECT_TRUE(st.ok()) << st.message();
    auto nm = std::make_unique<NodeManager>(config_);
    st = nm->Start();
    EXPECT_TRUE(st.ok()) << st.message();
    return nm;
  }
  std::unique_ptr<control::Channel> DialNode(NodeManager& nm, const std::string& role) {
    std::unique_ptr<control::Channel> ch;
    Status st = control::Channel::Dial(nm.ListenAddress(), control::Credentials{kSecret}, role,
                                       "test", 5000, &ch);
    EXPECT_TRUE(st.ok()) << st.message();
    return ch;
  }
  Json StartArgs(NodeManager& nm, const std::string& id) {
    return Json{{"alloc_id", id},
                {"gpu_uuid", nm.gpus()[0].uuid},
                {"sm", 33},
                {"memory_bytes", 1LL << 30},
                {"token", "tok-" + id}};
  }

  std::string dir_;
  FakeClusterManager cm_;
  NodeConfig config_;
};

TEST_F(NodeManagerTest, RegistersHeartbeatsAndServesTheClusterManager) {
  auto nm = StartNode();
  ASSERT_TRUE(cm_.WaitFor([&] { return !cm_.registers.empty(); }, 5000));
  {
    std::lock_guard<std::mutex> lock(cm_.mu);
    const Json& reg = cm_.registers[0];
    EXPECT_EQ(reg["node_id"], "node-t");
    EXPECT_EQ(reg["host_ip"], "127.0.0.1");
    EXPECT_EQ(reg["mps"], false);
    std::string port = nm->ListenAddress().substr(nm->ListenAddress().rfind(':') + 1);
    EXPECT_NE(port, "0");
    EXPECT_EQ(reg["address"], "127.0.0.1:" + port);
    ASSERT_EQ(reg["gpus"].size(), 2u);
    EXPECT_EQ(reg["gpus"][0]["sm_count"], 132);
    EXPECT_EQ(reg["servers"].size(), 0u);
    EXPECT_EQ(cm_.peers[0], "node/node-t");
  }
  ASSERT_TRUE(cm_.WaitFor([&] { return cm_.heartbeats.size() >= 2; }, 5000));

  auto ch = DialNode(*nm, "cluster");
  ASSERT_TRUE(ch);
  Json answer;
  Status st = ch->Call("start-server", StartArgs(*nm, "a1"), &answer, 10000);
  ASSERT_TRUE(st.ok()) << st.message();
  std::string endpoint = answer["endpoint"];
  EXPECT_EQ(endpoint.rfind("tcp://127.0.0.1:", 0), 0u) << endpoint;
  int64_t pid = answer["pid"];
  EXPECT_TRUE(Alive(pid));
  EXPECT_TRUE(answer.contains("ready_ms"));

  ASSERT_TRUE(ch->Call("list-servers", Json::object(), &answer, 5000).ok());
  ASSERT_EQ(answer["servers"].size(), 1u);
  EXPECT_EQ(answer["servers"][0]["alloc_id"], "a1");
  EXPECT_EQ(answer["servers"][0]["state"], "running");
  EXPECT_EQ(answer["servers"][0]["endpoint"], endpoint);

  // Heartbeats carry the server's report.
  size_t seen = 0;
  ASSERT_TRUE(cm_.WaitFor(
      [&] {
        for (; seen < cm_.heartbeats.size(); ++seen)
          for (const auto& s : cm_.heartbeats[seen]["servers"])
            if (s["alloc_id"] == "a1" && s["state"] == "running" && s["calls"] == 42) return true;
        return false;
      },
      5000));

  st = ch->Call("set-share", Json{{"alloc_id", "a1"}, {"sm", 66}, {"memory_bytes", 2LL << 30}},
                &answer, 5000);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(answer["pause_us"], 7);

  // Session moves go to the server's control socket with their fields.
  st = ch->Call(
      "migrate",
      Json{{"alloc_id", "a1"}, {"to", "tcp://10.9.9.9:1"}, {"token", "t0k"}, {"wait_ms", 1234}},
      &answer, 5000);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(answer["moved"], 1);
  EXPECT_EQ(answer["to"], "tcp://10.9.9.9:1");
  EXPECT_EQ(answer["token"], "t0k");
  EXPECT_EQ(answer["wait_ms"], 1234);
  st = ch->Call("migrate", Json{{"alloc_id", "a1"}, {"to", "tcp://10.9.9.9:1"}}, &answer, 5000);
  EXPECT_EQ(answer["code"], "bad_request") << "no token";
  const std::string ckpt = dir_ + "/ckpt/gpu0";
  st = ch->Call("checkpoint", Json{{"alloc_id", "a1"}, {"dir", ckpt}}, &answer, 5000);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(answer["checkpointed"], 1);
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/session-1.flyt"));
  st = ch->Call("checkpoint", Json{{"alloc_id", "a1"}, {"dir", ckpt}}, &answer, 5000);
  EXPECT_EQ(answer["code"], "bad_request") << "a folder that holds a checkpoint";
  EXPECT_NE(st.message().find("already holds a checkpoint"), std::string::npos) << st.message();
  st = ch->Call("checkpoint", Json{{"alloc_id", "a1"}, {"dir", "relative"}}, &answer, 5000);
  EXPECT_EQ(answer["code"], "bad_request");
  st = ch->Call("restore", Json{{"alloc_id", "a1"}, {"dir", ckpt}}, &answer, 5000);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(answer["restored"], 1);
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/session-1.flyt.restored")) << "spent files aside";
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/session-1.flyt"));
  st = ch->Call("restore", Json{{"alloc_id", "zz"}, {"dir", ckpt}}, &answer, 5000);
  EXPECT_EQ(answer["code"], "unknown_allocation");

  // Refusals carry codes.
  st = ch->Call("set-share", Json{{"alloc_id", "a1"}, {"sm", 200}, {"memory_bytes", 1}}, &answer,
                5000);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(answer["code"], "bad_request");
  st = ch->Call("set-share", Json{{"alloc_id", "zz"}, {"sm", 1}, {"memory_bytes", 1}}, &answer,
                5000);
  EXPECT_EQ(answer["code"], "unknown_allocation");
  Json bad_gpu = StartArgs(*nm, "a2");
  bad_gpu["gpu_uuid"] = "GPU-nope";
  st = ch->Call("start-server", bad_gpu, &answer, 5000);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(answer["code"], "bad_request");
  EXPECT_NE(st.message().find("GPU-nope is not on node node-t"), std::string::npos) << st.message();
  Json no_token = StartArgs(*nm, "a3");
  no_token.erase("token");
  st = ch->Call("start-server", no_token, &answer, 5000);
  EXPECT_NE(st.message().find("\"token\""), std::string::npos) << st.message();
  st = ch->Call("start-server", Json{{"alloc_id", 5}}, &answer, 5000);
  EXPECT_EQ(answer["code"], "bad_request");
  st = ch->Call("reboot", Json::object(), &answer, 5000);
  EXPECT_NE(st.message().find("unknown verb 'reboot'"), std::string::npos) << st.message();
  st = ch->Call("stop-server", Json{{"alloc_id", "zz"}}, &answer, 5000);
  EXPECT_EQ(answer["code"], "unknown_allocation");

  ASSERT_TRUE(ch->Call("stop-server", Json{{"alloc_id", "a1"}}, &answer, 5000).ok());
  EXPECT_FALSE(Alive(pid));
  ASSERT_TRUE(ch->Call("list-servers", Json::object(), &answer, 5000).ok());
  EXPECT_EQ(answer["servers"].size(), 0u);

  // Other roles are refused.
  auto admin = DialNode(*nm, "admin");
  ASSERT_TRUE(admin);
  st = admin->Call("list-servers", Json::object(), &answer, 5000);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("role \"admin\""), std::string::npos) << st.message();
}

TEST_F(NodeManagerTest, ExitedServersAreRestartedOrFreedAsTheClusterManagerSays) {
  {
    std::lock_guard<std::mutex> lock(cm_.mu);
    cm_.actions = {"restart", "free"};
  }
  setenv("FAKE_MODE", "die_after_ms:300", 1);
  auto nm = StartNode();
  auto ch = DialNode(*nm, "cluster");
  ASSERT_TRUE(ch);
  Json answer;
  ASSERT_TRUE(ch->Call("start-server", StartArgs(*nm, "e1"), &answer, 10000).ok());
  // First exit: restarted with the same parameters; it dies again; second exit: freed.
  ASSERT_TRUE(cm_.WaitFor([&] { return cm_.exits.size() >= 2; }, 10000));
  {
    std::lock_guard<std::mutex> lock(cm_.mu);
    for (const auto& e : cm_.exits) {
      EXPECT_EQ(e["node_id"], "node-t");
      EXPECT_EQ(e["alloc_id"], "e1");
      EXPECT_EQ(e["exit_status"], 5);
      EXPECT_NE(e["reason"].get<std::string>().find("exit status 5"), std::string::npos);
    }
  }
  auto deadline = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    ASSERT_TRUE(ch->Call("list-servers", Json::object(), &answer, 5000).ok());
    if (answer["servers"].empty() || Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(answer["servers"].empty()) << answer.dump();
}

TEST_F(NodeManagerTest, ReRegistersWithItsServersWhenTheClusterManagerRestarts) {
  auto nm = StartNode();
  ASSERT_TRUE(cm_.WaitFor([&] { return !cm_.registers.empty(); }, 5000));
  auto ch = DialNode(*nm, "cluster");
  ASSERT_TRUE(ch);
  Json answer;
  ASSERT_TRUE(ch->Call("start-server", StartArgs(*nm, "r1"), &answer, 10000).ok());
  std::string endpoint = answer["endpoint"];
  const std::string address = cm_.address();
  cm_.Stop();
  FakeClusterManager second;
  ASSERT_TRUE(second.Start(address).ok());
  ASSERT_TRUE(second.WaitFor([&] { return !second.registers.empty(); }, 15000));
  std::lock_guard<std::mutex> lock(second.mu);
  const Json& servers = second.registers[0]["servers"];
  ASSERT_EQ(servers.size(), 1u);
  EXPECT_EQ(servers[0]["alloc_id"], "r1");
  EXPECT_EQ(servers[0]["state"], "running");
  EXPECT_EQ(servers[0]["endpoint"], endpoint);
}

TEST_F(NodeManagerTest, ShutdownStopsTheServers) {
  auto nm = StartNode();
  auto ch = DialNode(*nm, "cluster");
  ASSERT_TRUE(ch);
  Json answer;
  ASSERT_TRUE(ch->Call("start-server", StartArgs(*nm, "s1"), &answer, 10000).ok());
  int64_t pid = answer["pid"];
  nm->Shutdown();
  EXPECT_FALSE(Alive(pid));
  nm->Shutdown();  // idempotent
}

TEST_F(NodeManagerTest, TheClusterSecretIsRequired) {
  config_.secret = "";
  unsetenv("FLYT_SECRET");
  config_.secret_file = dir_ + "/missing.secret";
  ASSERT_TRUE(ResolveDefaults(&config_).ok());
  NodeManager nm(config_);
  Status st = nm.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing.secret"), std::string::npos) << st.message();
}

TEST_F(NodeManagerTest, HandlerRefusesPeersThatAreNotTheClusterManager) {
  NodeManager nm(config_);  // not started: the role check comes first
  control::Peer peer;
  peer.role = "node";
  peer.name = "other";
  Json answer = nm.Handle(peer, Json{{"verb", "list-servers"}});
  EXPECT_EQ(answer["ok"], false);
  EXPECT_EQ(answer["code"], "bad_request");
}

TEST_F(NodeManagerTest, ShipsCheckpointFilesPieceByPiece) {
  ASSERT_TRUE(ResolveDefaults(&config_).ok());
  NodeManager nm(config_);  // the file verbs need no server
  control::Peer peer;
  peer.role = "cluster";
  peer.name = "cluster-manager";
  // A session file of three pieces (4 MiB each) with every byte value in it.
  const std::string src = dir_ + "/ckpt/gpu0";
  ASSERT_EQ(std::system(("mkdir -p " + src).c_str()), 0);
  std::string bytes(9 * 1024 * 1024 + 7, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 7919) >> 3);
  {
    std::ofstream f(src + "/session-3.flyt", std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  Json list = nm.Handle(peer, Json{{"verb", "list-checkpoint"}, {"dir", src}});
  ASSERT_TRUE(list.value("ok", false)) << list.dump();
  EXPECT_EQ(list["bytes"], bytes.size());
  ASSERT_EQ(list["files"].size(), 1u);
  EXPECT_EQ(list["files"][0]["file"], "session-3.flyt");
  int64_t offset = 0;
  int pieces = 0;
  std::string copy_dir;
  for (bool last = false; !last; ++pieces) {
    Json piece = nm.Handle(peer, Json{{"verb", "read-checkpoint"},
                                      {"dir", src},
                                      {"file", "session-3.flyt"},
                                      {"offset", offset}});
    ASSERT_TRUE(piece.value("ok", false)) << piece.dump().substr(0, 300);
    last = piece["eof"].get<bool>();
    Json w = nm.Handle(peer, Json{{"verb", "write-checkpoint"},
                                  {"transfer", "r-1"},
                                  {"sub", "gpu0"},
                                  {"file", "session-3.flyt"},
                                  {"offset", offset},
                                  {"data", piece["data"]},
                                  {"last", last}});
    ASSERT_TRUE(w.value("ok", false)) << w.dump();
    copy_dir = w["dir"];
    offset += piece["bytes"].get<int64_t>();
  }
  EXPECT_EQ(pieces, 3);
  EXPECT_EQ(copy_dir, config_.run_dir + "/incoming/r-1");
  std::ifstream in(copy_dir + "/gpu0/session-3.flyt", std::ios::binary);
  std::string shipped((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(shipped == bytes) << "the copy differs (" << shipped.size() << " bytes)";
  // Names with a path in them, and data that is not base64, are refused.
  for (const Json& bad : {Json{{"transfer", "../x"}, {"sub", "gpu0"}, {"file", "a.flyt"}},
                          Json{{"transfer", "r-2"}, {"sub", "../gpu0"}, {"file", "a.flyt"}},
                          Json{{"transfer", "r-2"}, {"sub", "gpu0"}, {"file", "../a.flyt"}},
                          Json{{"transfer", "r-2"}, {"sub", "gpu0"}, {"file", "a.txt"}}}) {
    Json req = bad;
    req["verb"] = "write-checkpoint";
    req["offset"] = 0;
    req["data"] = "AAAA";
    Json a = nm.Handle(peer, req);
    EXPECT_EQ(a["code"], "bad_request") << req.dump() << " -> " << a.dump();
  }
  Json garbage = nm.Handle(peer, Json{{"verb", "write-checkpoint"},
                                      {"transfer", "r-2"},
                                      {"sub", "gpu0"},
                                      {"file", "a.flyt"},
                                      {"offset", 0},
                                      {"data", "not*base64"}});
  EXPECT_EQ(garbage["code"], "bad_request") << garbage.dump();
  Json outside = nm.Handle(
      peer, Json{{"verb", "read-checkpoint"}, {"dir", src}, {"file", "../x.flyt"}, {"offset", 0}});
  EXPECT_EQ(outside["code"], "bad_request") << outside.dump();
  // The copy goes; the source is marked spent.
  EXPECT_TRUE(nm.Handle(peer, Json{{"verb", "drop-checkpoint-copy"}, {"transfer", "r-1"}})
                  .value("ok", false));
  EXPECT_FALSE(std::ifstream(copy_dir + "/gpu0/session-3.flyt").good());
  Json spent = nm.Handle(peer, Json{{"verb", "spend-checkpoint"}, {"dir", src}});
  EXPECT_EQ(spent["spent"], 1) << spent.dump();
  EXPECT_TRUE(std::ifstream(src + "/session-3.flyt.restored").good());
}

constexpr const char* kFakeMpsControl = R"(#!/bin/sh
P="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then touch "$P/running"; exit 0; fi
read cmd
[ -f "$P/running" ] || { echo "Cannot find MPS control daemon process"; exit 1; }
[ "$cmd" = quit ] && rm -f "$P/running"
exit 0
)";

TEST_F(NodeManagerTest, MpsSharesGoIntoTheServersEnvironment) {
  std::string control = dir_ + "/fake-mps-control";
  std::ofstream(control) << kFakeMpsControl;
  ASSERT_EQ(chmod(control.c_str(), 0755), 0);
  config_.mps = true;
  config_.mps_control = control;
  config_.server_sm_mechanism = "mps";
  config_.mps_memory_limit = true;  // off by default; asked for here
  auto nm = StartNode();
  EXPECT_EQ(access((config_.mps_pipe_dir + "/running").c_str(), F_OK), 0);
  auto ch = DialNode(*nm, "cluster");
  ASSERT_TRUE(ch);
  Json answer;
  ASSERT_TRUE(ch->Call("start-server", StartArgs(*nm, "m1"), &answer, 10000).ok());
  Json stats;
  ASSERT_TRUE(
      ServerControlCall(config_.run_dir + "/m1.ctl", Json{{"verb", "stats"}}, 2000, &stats).ok());
  EXPECT_EQ(stats["mps_percentage"], "25");  // ceil(100 * 33 / 132)
  EXPECT_EQ(stats["mps_mem_limit"], "0=1024M");
  EXPECT_EQ(stats["mps_pipe"], config_.mps_pipe_dir);
  // The MPS memory cap is fixed at start: a larger quota is refused, a smaller one applied.
  Status st =
      ch->Call("set-share", Json{{"alloc_id", "m1"}, {"sm", 33}, {"memory_bytes", 2LL << 30}},
               &answer, 5000);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(answer["code"], "over_quota");
  st = ch->Call("set-share", Json{{"alloc_id", "m1"}, {"sm", 33}, {"memory_bytes", 1LL << 29}},
                &answer, 5000);
  EXPECT_TRUE(st.ok()) << st.message();
  nm->Shutdown();
  EXPECT_NE(access((config_.mps_pipe_dir + "/running").c_str(), F_OK), 0);  // quit was sent
}

TEST(NodeSettings, DefaultsDeriveFromStateDirAndHost) {
  NodeConfig c;
  c.state_dir = "/srv/flyt";
  ASSERT_TRUE(ResolveDefaults(&c).ok());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(c.node_id, host);
  EXPECT_FALSE(c.advertise_host.empty());
  EXPECT_EQ(c.host_ip, c.advertise_host);
  EXPECT_EQ(c.secret_file, "/srv/flyt/cluster.secret");
  EXPECT_EQ(c.run_dir, "/srv/flyt/node");
  EXPECT_EQ(c.mps_pipe_dir, "/srv/flyt/node/mps-pipe");
  EXPECT_EQ(c.mps_log_dir, "/srv/flyt/node/mps-log");
  EXPECT_EQ(c.server_binary.substr(c.server_binary.rfind('/')), "/flyt-server");
  EXPECT_EQ(c.listen, "0.0.0.0:12401");
  EXPECT_EQ(c.cluster_manager, "127.0.0.1:12400");
}

TEST(NodeSettings, BadValuesAreRefused) {
  NodeConfig c;
  c.server_sm_mechanism = "magic";
  EXPECT_FALSE(ResolveDefaults(&c).ok());
  c = NodeConfig();
  c.server_sm_mechanism = "mps";  // without mps=true
  Status st = ResolveDefaults(&c);
  EXPECT_NE(st.message().find("mps=true"), std::string::npos) << st.message();
  c = NodeConfig();
  c.heartbeat_ms = 0;
  EXPECT_FALSE(ResolveDefaults(&c).ok());
  c = NodeConfig();
  c.server_backend = "opencl";
  EXPECT_FALSE(ResolveDefaults(&c).ok());
}

TEST(NodeSettings, FlagsAndEnvironmentReachTheConfig) {
  setenv("FLYT_NM_INVENTORY", "sim:3", 1);
  NodeConfig c;
  control::Settings s("flyt-node-manager", "node_manager", "NM");
  RegisterSettings(&s, &c);
  const char* argv[] = {"flyt-node-manager", "--heartbeat-ms", "250",
                        "--mps=true",        "--node-id",      "n7"};
  bool help = false;
  Status st = s.Load(6, const_cast<char**>(argv), &help);
  unsetenv("FLYT_NM_INVENTORY");
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(c.heartbeat_ms, 250);
  EXPECT_TRUE(c.mps);
  EXPECT_EQ(c.node_id, "n7");
  EXPECT_EQ(c.inventory, "sim:3");
  EXPECT_NE(s.Usage().find("--server-sm-mechanism"), std::string::npos);
}

}  // namespace
}  // namespace flyt::node
