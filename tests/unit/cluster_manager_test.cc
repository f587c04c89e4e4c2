// Tests of src/cluster/cluster_manager: VMs with several GPUs. The cluster manager runs on a
// SQLite file and talks to fake node managers (control listeners on loopback that answer
// start-server, stop-server and set-share and remember what they were asked), so that a
// failure on one node can be injected. The real daemons are tested end to end in
// tests/control.
#include "cluster/cluster_manager.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

namespace flyt::cluster {
namespace {

using control::Json;

constexpr char kSecret[] = "cluster-manager-test-secret";
constexpr int kSms = 132;
constexpr int64_t kGiB = int64_t{1} << 30;

// A node manager that starts nothing: it answers the cluster manager's verbs and records them.
class FakeNode {
 public:
  FakeNode(std::string id, std::string host_ip, int gpus)
      : id_(std::move(id)), host_ip_(std::move(host_ip)), gpus_(gpus) {
    control::Credentials creds;
    creds.secret = kSecret;
    Status s = control::Listener::Start(
        "127.0.0.1:0", creds, [this](const control::Peer&, const Json& req) { return Answer(req); },
        &listener_);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  ~FakeNode() {
    if (listener_) listener_->Stop();
  }

  std::string Uuid(int i) const { return "GPU-" + id_ + "-" + std::to_string(i); }
  Json Registration() const {
    Json gpus = Json::array();
    for (int i = 0; i < gpus_; ++i) {
      gpus.push_back({{"uuid", Uuid(i)},
                      {"index", i},
                      {"name", "Fake H200"},
                      {"sm_count", kSms},
                      {"memory_bytes", 80 * kGiB}});
    }
    return {{"verb", "register-node"}, {"node_id", id_}, {"address", listener_->Describe()},
            {"host_ip", host_ip_},     {"gpus", gpus},   {"servers", Json::array()}};
  }

  // What it was asked, in order: "start a-1 GPU-x", "stop a-1", "set-share a-1 64".
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::set<std::string> running() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_;
  }
  std::vector<Json> starts() {
    std::lock_guard<std::mutex> lock(mu_);
    return starts_;
  }
  std::atomic<bool> fail_start{false};
  int move_failures = 0;  // the next this many migrate/checkpoint calls leave a session
  void FailMoves(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    move_failures = n;
  }
  std::vector<Json> requests(const std::string& verb) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Json> out;
    for (const Json& r : requests_)
      if (r.value("verb", "") == verb) out.push_back(r);
    return out;
  }
  // Answers the checkpoint shipping verbs: each checkpoint folder holds two session files.
  std::atomic<bool> ship{false};
  int set_share_failures = 0;  // the next this many set-share calls fail (under mu_)
  void FailSetShares(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    set_share_failures = n;
  }
  const std::string& id() const { return id_; }

 private:
  Json Answer(const Json& req) {
    const std::string verb = req.value("verb", "");
    const std::string alloc = req.value("alloc_id", "");
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(req);
    if (verb == "start-server") {
      calls_.push_back("start " + alloc + " " + req.value("gpu_uuid", ""));
      starts_.push_back(req);
      if (fail_start) return control::Error("server_failed", "simulated start failure");
      running_.insert(alloc);
      const int port = req.value("port", 0) > 0 ? req.value("port", 0) : next_port_++;
      return control::Ok(
          {{"endpoint", "tcp://" + id_ + ".test:" + std::to_string(port)}, {"pid", 4242}});
    }
    if (verb == "stop-server") {
      calls_.push_back("stop " + alloc);
      running_.erase(alloc);
      return control::Ok();
    }
    if (verb == "set-share") {
      calls_.push_back("set-share " + alloc + " " + std::to_string(req.value("sm", 0)));
      if (set_share_failures > 0) {
        --set_share_failures;
        return control::Error("server_failed", "simulated set-share failure");
      }
      return control::Ok({{"sm", req.value("sm", 0)}, {"pause_us", 7}});
    }
    if (verb == "migrate" || verb == "checkpoint") {
      calls_.push_back(verb + " " + alloc + " " + req.value(verb == "migrate" ? "to" : "dir", ""));
      if (!running_.count(alloc)) return control::Error("unknown_allocation", "no server " + alloc);
      const bool fail = move_failures > 0;
      if (fail) --move_failures;
      const char* done = verb == "migrate" ? "moved" : "checkpointed";
      // Two sessions: one moves; the second moves too unless a failure is asked for.
      return control::Ok({{"asked", 2},
                          {done, fail ? 1 : 2},
                          {"stayed", fail ? 1 : 0},
                          {"pending", 0},
                          {"sessions",
                           {{{"session", 1}, {"ok", true}, {"message", "done"}},
                            {{"session", 2},
                             {"ok", !fail},
                             {"message", fail ? "simulated: cannot move: a graph" : "done"}}}}});
    }
    if (ship && verb == "list-checkpoint") {
      return control::Ok({{"files",
                           {{{"file", "session-1.flyt"}, {"bytes", 6}},
                            {{"file", "session-2.flyt"}, {"bytes", 6}}}},
                          {"bytes", 12}});
    }
    if (ship && verb == "read-checkpoint") {
      return control::Ok({{"data", "QUJDREVG"}, {"bytes", 6}, {"size", 6}, {"eof", true}});
    }
    if (ship && verb == "write-checkpoint") {
      calls_.push_back("write " + req.value("sub", "") + "/" + req.value("file", "") + " " +
                       req.value("data", ""));
      return control::Ok({{"dir", "/run/incoming/" + req.value("transfer", "")}});
    }
    if (ship && (verb == "drop-checkpoint-copy" || verb == "spend-checkpoint")) {
      calls_.push_back(verb + " " + req.value("dir", req.value("transfer", "")));
      return control::Ok({{"spent", 2}});
    }
    if (verb == "restore") {
      calls_.push_back("restore " + alloc + " " + req.value("dir", ""));
      return control::Ok(
          {{"files", 2}, {"restored", 2}, {"failed", Json::array()}, {"pending", 0}});
    }
    return control::Error("bad_request", "fake node: unknown verb " + verb);
  }

  std::string id_, host_ip_;
  int gpus_;
  std::unique_ptr<control::Listener> listener_;
  std::mutex mu_;
  std::vector<std::string> calls_;
  std::set<std::string> running_;
  std::vector<Json> starts_;
  std::vector<Json> requests_;
  int next_port_ = 40000;
};

class ClusterManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/flyt-cluster-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    StartManager();
  }
  void TearDown() override {
    cm_.reset();
    nodes_.clear();
    std::filesystem::remove_all(dir_);
  }
  void StartManager(int64_t max_restarts = 3) {
    cm_.reset();
    std::unique_ptr<store::Store> store;
    Status s = store::Store::Open("sqlite:" + dir_ + "/flyt.db", &store);
    ASSERT_TRUE(s.ok()) << s.message();
    ClusterOptions options;
    // Nodes are declared down after 3 silent heartbeats (12 s, longer than a test); the
    // monitor ticks every heartbeat_ms / 4, which is what Stop() may wait for.
    options.heartbeat_ms = 4000;
    options.idle_grace_ms = 0;
    options.max_server_restarts = max_restarts;
    options.node_call_timeout_ms = 10000;
    control::Credentials creds;
    creds.secret = kSecret;
    cm_ = std::make_unique<ClusterManager>(options, std::move(store), creds);
    s = cm_->Start();
    ASSERT_TRUE(s.ok()) << s.message();
  }
  FakeNode& AddNode(const std::string& id, const std::string& host_ip, int gpus) {
    nodes_[id] = std::make_unique<FakeNode>(id, host_ip, gpus);
    Json answer = cm_->Handle({"node", id, ""}, nodes_[id]->Registration());
    EXPECT_TRUE(answer.value("ok", false)) << answer.dump();
    return *nodes_[id];
  }
  Json Admin(Json req) { return cm_->Handle({"admin", "test", ""}, req); }
  Json AddVm(const std::string& vm, const std::string& host, int sm, double gb, int gpus) {
    Json answer = Admin({{"verb", "vm-add"},
                         {"vm_ip", vm},
                         {"host_ip", host},
                         {"compute_units", sm},
                         {"memory_gb", gb},
                         {"gpus", gpus}});
    EXPECT_TRUE(answer.value("ok", false)) << answer.dump();
    return answer;
  }
  Json Allocate(const std::string& vm) {
    return cm_->Handle({"client", vm, ""}, {{"verb", "request-allocation"}, {"vm_ip", vm}});
  }
  Json Servers() { return Admin({{"verb", "list-servers"}})["servers"]; }
  std::vector<Json> Events(const std::string& kind) {
    std::vector<Json> out;
    const Json answer = Admin({{"verb", "list-events"}, {"limit", 0}});
    for (const Json& e : answer["events"]) {
      if (e.value("kind", "") == kind) out.push_back(e);
    }
    return out;
  }
  // SMs in use per GPU uuid, from list-nodes.
  std::map<std::string, int> SmUsed() {
    std::map<std::string, int> out;
    const Json answer = Admin({{"verb", "list-nodes"}});
    for (const Json& n : answer["nodes"]) {
      for (const Json& g : n["gpus"]) out[g["uuid"]] = g.value("sm_used", 0);
    }
    return out;
  }
  static size_t Count(const std::vector<std::string>& calls, const std::string& prefix) {
    size_t n = 0;
    for (const auto& c : calls) n += c.rfind(prefix, 0) == 0;
    return n;
  }

  std::string dir_;
  std::unique_ptr<ClusterManager> cm_;
  std::map<std::string, std::unique_ptr<FakeNode>> nodes_;
};

TEST_F(ClusterManagerTest, OneGpuVmKeepsTheSingleEndpoint) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 2);
  AddVm("10.1.0.1", "10.0.0.1", 16, 2, 1);
  Json a = Allocate("10.1.0.1");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  EXPECT_EQ(a["endpoint"], "tcp://n1.test:40000");
  EXPECT_EQ(a["gpus"], 1);
  EXPECT_FALSE(a.contains("servers")) << a.dump();
  EXPECT_EQ(a["node_id"], "n1");
  EXPECT_EQ(n1.running().size(), 1u);
  EXPECT_TRUE(Events("place-group").empty());
}

TEST_F(ClusterManagerTest, TwoGpusOnOneNode) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 2);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 2);
  AddVm("10.1.0.2", "10.0.0.2", 16, 2, 2);
  Json a = Allocate("10.1.0.2");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  // The VM's host has room for both: both servers there, one per GPU, one token.
  EXPECT_TRUE(n1.starts().empty());
  std::vector<Json> starts = n2.starts();
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_NE(starts[0]["gpu_uuid"], starts[1]["gpu_uuid"]);
  EXPECT_EQ(starts[0]["token"], starts[1]["token"]);
  EXPECT_EQ(starts[0]["token"], a["token"]);
  for (const Json& s : starts) {
    EXPECT_EQ(s["sm"], 16);
    EXPECT_EQ(s["memory_bytes"], 2 * kGiB);
  }
  EXPECT_EQ(a["gpus"], 2);
  EXPECT_EQ(a["node_id"], "n2");
  EXPECT_EQ(a["placement"], "2 GPUs on node n2");
  ASSERT_EQ(a["servers"].size(), 2u);
  // The endpoint list is in ordinal order.
  EXPECT_EQ(a["endpoint"], a["servers"][0]["endpoint"].get<std::string>() + "," +
                               a["servers"][1]["endpoint"].get<std::string>());
  EXPECT_EQ(a["servers"][0]["ordinal"], 0);
  EXPECT_EQ(a["servers"][1]["ordinal"], 1);
  // Each server runs on the GPU its start-server named (the starts run in parallel).
  for (const Json& server : a["servers"]) {
    bool found = false;
    for (const Json& st : starts) {
      if (st["alloc_id"] == server["alloc_id"]) {
        found = true;
        EXPECT_EQ(st["gpu_uuid"], server["gpu_uuid"]);
      }
    }
    EXPECT_TRUE(found) << server.dump();
  }
  auto events = Events("place-group");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["subject"], "10.1.0.2");
  EXPECT_NE(events[0]["detail"].get<std::string>().find("placed VM 10.1.0.2: 2 GPUs on node n2"),
            std::string::npos)
      << events[0].dump();
  auto used = SmUsed();
  EXPECT_EQ(used[n2.Uuid(0)], 16);
  EXPECT_EQ(used[n2.Uuid(1)], 16);
  EXPECT_EQ(used[n1.Uuid(0)], 0);
  // A second client of the VM gets the same servers.
  Json again = Allocate("10.1.0.2");
  EXPECT_EQ(again["endpoint"], a["endpoint"]);
  EXPECT_EQ(n2.starts().size(), 2u);
}

TEST_F(ClusterManagerTest, TwoGpusAcrossNodes) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  AddVm("10.1.0.3", "10.0.0.9", 16, 2, 2);
  Json a = Allocate("10.1.0.3");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  EXPECT_EQ(n1.running().size(), 1u);
  EXPECT_EQ(n2.running().size(), 1u);
  const std::string endpoint = a["endpoint"];
  EXPECT_NE(endpoint.find("n1.test"), std::string::npos) << endpoint;
  EXPECT_NE(endpoint.find("n2.test"), std::string::npos) << endpoint;
  EXPECT_EQ(std::count(endpoint.begin(), endpoint.end(), ','), 1) << endpoint;
  auto events = Events("place-group");
  ASSERT_EQ(events.size(), 1u);
  const std::string detail = events[0]["detail"];
  EXPECT_TRUE(detail.find("2 GPUs across nodes n1, n2") != std::string::npos ||
              detail.find("2 GPUs across nodes n2, n1") != std::string::npos)
      << detail;
  // Deallocating stops both servers and frees both shares.
  Json d = Admin({{"verb", "deallocate"}, {"vm_ip", "10.1.0.3"}});
  ASSERT_TRUE(d.value("ok", false)) << d.dump();
  EXPECT_TRUE(n1.running().empty());
  EXPECT_TRUE(n2.running().empty());
  EXPECT_TRUE(Servers().empty());
  for (const auto& [uuid, sm] : SmUsed()) EXPECT_EQ(sm, 0) << uuid;
}

TEST_F(ClusterManagerTest, NoPartialPlacement) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  AddVm("10.1.0.4", "10.0.0.1", kSms, 2, 1);  // fills n1's GPU
  ASSERT_TRUE(Allocate("10.1.0.4").value("ok", false));
  AddVm("10.1.0.5", "10.0.0.2", 64, 2, 2);
  Json a = Allocate("10.1.0.5");
  EXPECT_FALSE(a.value("ok", true)) << a.dump();
  EXPECT_EQ(a["code"], "no_capacity");
  const std::string message = a.value("error", a.value("message", a.dump()));
  EXPECT_NE(message.find("2 GPUs"), std::string::npos) << a.dump();
  EXPECT_NE(message.find("all its GPUs or none"), std::string::npos) << a.dump();
  EXPECT_TRUE(n2.starts().empty()) << "nothing is started for a VM that cannot be placed whole";
  EXPECT_EQ(n1.starts().size(), 1u);
  EXPECT_EQ(Servers().size(), 1u);
  EXPECT_EQ(SmUsed()[n2.Uuid(0)], 0);
  auto refused = Events("allocation-refused");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0]["subject"], "10.1.0.5");
  EXPECT_NE(refused[0]["detail"].get<std::string>().find("only 1 of the 2 GPUs"), std::string::npos)
      << refused[0].dump();
}

TEST_F(ClusterManagerTest, AFailedStartStopsTheOthers) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  n2.fail_start = true;
  AddVm("10.1.0.6", "10.0.0.1", 16, 2, 2);
  Json a = Allocate("10.1.0.6");
  EXPECT_FALSE(a.value("ok", true)) << a.dump();
  EXPECT_EQ(a["code"], "server_failed");
  EXPECT_NE(a.dump().find("simulated start failure"), std::string::npos) << a.dump();
  EXPECT_EQ(Count(n1.calls(), "start "), 1u);
  EXPECT_EQ(Count(n1.calls(), "stop "), 1u) << "the server that started is stopped";
  EXPECT_TRUE(n1.running().empty());
  EXPECT_TRUE(Servers().empty());
  for (const auto& [uuid, sm] : SmUsed()) EXPECT_EQ(sm, 0) << uuid;
  EXPECT_EQ(Events("allocation-failed").size(), 1u);
  // Once the node works again the VM is placed whole.
  n2.fail_start = false;
  Json b = Allocate("10.1.0.6");
  ASSERT_TRUE(b.value("ok", false)) << b.dump();
  EXPECT_EQ(Servers().size(), 2u);
}

TEST_F(ClusterManagerTest, ResizeAppliesToEachGpu) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 2);
  AddVm("10.1.0.7", "10.0.0.1", 16, 2, 2);
  ASSERT_TRUE(Allocate("10.1.0.7").value("ok", false));
  Json r = Admin({{"verb", "change-config"}, {"vm_ip", "10.1.0.7"}, {"sm", 32}, {"memory_gb", 4}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["applied"], "live");
  EXPECT_EQ(r["gpus"], 2);
  EXPECT_EQ(Count(n1.calls(), "set-share "), 2u);
  for (const Json& s : Servers()) {
    EXPECT_EQ(s["sm"], 32);
    EXPECT_EQ(s["memory_bytes"], 4 * kGiB);
  }
  auto used = SmUsed();
  EXPECT_EQ(used[n1.Uuid(0)], 32);
  EXPECT_EQ(used[n1.Uuid(1)], 32);
  // Growth that one GPU cannot take is refused for all, before any server is touched.
  AddVm("10.1.0.8", "10.0.0.1", 90, 1, 1);
  ASSERT_TRUE(Allocate("10.1.0.8").value("ok", false));
  Json refused = Admin({{"verb", "change-config"}, {"vm_ip", "10.1.0.7"}, {"sm", 64}});
  EXPECT_EQ(refused["code"], "no_capacity") << refused.dump();
  EXPECT_NE(refused.dump().find("resized together"), std::string::npos) << refused.dump();
  EXPECT_EQ(Count(n1.calls(), "set-share "), 2u);
  // A failure on one GPU sets the other back: the VM's GPUs keep one share.
  n1.FailSetShares(1);
  Json failed = Admin({{"verb", "change-config"}, {"vm_ip", "10.1.0.7"}, {"sm", 8}});
  EXPECT_EQ(failed["code"], "server_failed") << failed.dump();
  EXPECT_NE(failed.dump().find("set back"), std::string::npos) << failed.dump();
  std::vector<std::string> calls = n1.calls();
  ASSERT_EQ(Count(calls, "set-share "), 5u);  // 2 + 2 tries + 1 undo
  EXPECT_EQ(calls.back().substr(calls.back().size() - 3), " 32") << calls.back();
  for (const Json& s : Servers()) {
    if (s["vm_ip"] == "10.1.0.7") {
      EXPECT_EQ(s["sm"], 32) << s.dump();
    }
  }
  EXPECT_EQ(SmUsed()[n1.Uuid(0)] + SmUsed()[n1.Uuid(1)], 32 + 32 + 90);
}

TEST_F(ClusterManagerTest, ARestartedManagerKnowsTheGroupInOrder) {
  AddNode("n1", "10.0.0.1", 1);
  AddNode("n2", "10.0.0.2", 1);
  AddVm("10.1.0.9", "10.0.0.2", 16, 2, 2);
  Json a = Allocate("10.1.0.9");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  StartManager();
  for (const auto& [id, n] : nodes_) {
    Json reg = n->Registration();
    Json servers = Json::array();
    for (const std::string& alloc : n->running()) {
      servers.push_back({{"alloc_id", alloc}, {"state", "running"}});
    }
    reg["servers"] = servers;
    ASSERT_TRUE(cm_->Handle({"node", id, ""}, reg).value("ok", false));
  }
  Json again = Allocate("10.1.0.9");
  ASSERT_TRUE(again.value("ok", false)) << again.dump();
  EXPECT_EQ(again["endpoint"], a["endpoint"]);
  EXPECT_EQ(again["token"], a["token"]);
  Json vm = Admin({{"verb", "show"}, {"id", "10.1.0.9"}});
  EXPECT_EQ(vm["vm"]["gpus"], 2);
  EXPECT_EQ(vm["vm"]["allocation"]["servers"].size(), 2u);
}

TEST_F(ClusterManagerTest, AServerThatFailsForGoodFreesTheWholeVm) {
  StartManager(/*max_restarts=*/0);
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  AddVm("10.1.0.10", "10.0.0.1", 16, 2, 2);
  Json a = Allocate("10.1.0.10");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  const std::string on_n2 = *n2.running().begin();
  Json exited = cm_->Handle(
      {"node", "n2", ""},
      {{"verb", "server-exited"}, {"node_id", "n2"}, {"alloc_id", on_n2}, {"reason", "killed"}});
  EXPECT_EQ(exited["action"], "free") << exited.dump();
  EXPECT_TRUE(Servers().empty());
  // The sibling on n1 is stopped in the background.
  for (int i = 0; i < 200 && !n1.running().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(n1.running().empty());
  auto failed = Events("server-failed");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0]["detail"].get<std::string>().find("other 1 server(s) are stopped too"),
            std::string::npos)
      << failed[0].dump();
}

TEST_F(ClusterManagerTest, GpuCountIsValidated) {
  Json bad = Admin({{"verb", "vm-add"},
                    {"vm_ip", "10.1.0.11"},
                    {"host_ip", "h"},
                    {"compute_units", 8},
                    {"memory_gb", 1},
                    {"gpus", 0}});
  EXPECT_EQ(bad["code"], "bad_request") << bad.dump();
  EXPECT_NE(bad.dump().find("gpus"), std::string::npos) << bad.dump();
  Json old = Admin({{"verb", "vm-add"},
                    {"vm_ip", "10.1.0.12"},
                    {"host_ip", "h"},
                    {"compute_units", 8},
                    {"memory_gb", 1}});
  ASSERT_TRUE(old.value("ok", false)) << old.dump();
  EXPECT_EQ(old["vm"]["gpus"], 1) << "no gpus field: one GPU";
}

// ---------------------------------------------------------------- moves (issue 16)

TEST_F(ClusterManagerTest, MigrateMovesTheVmAndHandsOutTheNewEndpoint) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  AddVm("10.1.0.20", "10.0.0.1", 16, 2, 1);
  Json a = Allocate("10.1.0.20");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  const std::string old_alloc = a["alloc_id"];
  Json m = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.20"}, {"node_id", "n2"}});
  ASSERT_TRUE(m.value("ok", false)) << m.dump();
  EXPECT_EQ(m["sessions"], 2);
  // The target got the VM's share and token; the source was told to move there.
  std::vector<Json> starts = n2.starts();
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0]["token"], a["token"]);
  EXPECT_EQ(starts[0]["sm"], 16);
  EXPECT_EQ(starts[0]["memory_bytes"], 2 * kGiB);
  std::vector<Json> moves = n1.requests("migrate");
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0]["alloc_id"], old_alloc);
  EXPECT_EQ(moves[0]["to"], "tcp://n2.test:40000");
  EXPECT_EQ(moves[0]["token"], a["token"]);
  // The old server is stopped, its share freed; new processes get the new endpoint.
  EXPECT_TRUE(n1.running().empty());
  EXPECT_EQ(n2.running().size(), 1u);
  EXPECT_EQ(SmUsed()[n1.Uuid(0)], 0);
  EXPECT_EQ(SmUsed()[n2.Uuid(0)], 16);
  Json again = Allocate("10.1.0.20");
  EXPECT_EQ(again["endpoint"], "tcp://n2.test:40000") << again.dump();
  EXPECT_EQ(again["token"], a["token"]);
  EXPECT_EQ(again["node_id"], "n2");
  EXPECT_EQ(Servers().size(), 1u);
  EXPECT_EQ(Events("migrate-asked").size(), 1u);
  const std::string metrics = cm_->MetricsText();
  EXPECT_NE(metrics.find("flyt_migration_seconds_count 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("flyt_events_total{kind=\"migrate-done\"} 1"), std::string::npos);
  auto done = Events("migrate-done");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_NE(done[0]["detail"].get<std::string>().find("node n1 -> node n2"), std::string::npos)
      << done[0].dump();
  // The store has the new placement: a restarted manager knows it.
  StartManager();
  Json vm = Admin({{"verb", "show"}, {"id", "10.1.0.20"}});
  EXPECT_EQ(vm["vm"]["allocation"]["node_id"], "n2") << vm.dump();
}

TEST_F(ClusterManagerTest, AMigrationWhoseTargetCannotStartLeavesTheVm) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  n2.fail_start = true;
  AddVm("10.1.0.21", "10.0.0.1", 16, 2, 1);
  Json a = Allocate("10.1.0.21");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  Json m = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.21"}, {"node_id", "n2"}});
  EXPECT_EQ(m["code"], "server_failed") << m.dump();
  EXPECT_NE(m.dump().find("did not start"), std::string::npos) << m.dump();
  EXPECT_NE(m.dump().find("runs where it was"), std::string::npos) << m.dump();
  EXPECT_TRUE(n1.requests("migrate").empty()) << "no session is asked to move";
  EXPECT_EQ(n1.running().size(), 1u);
  EXPECT_EQ(SmUsed()[n2.Uuid(0)], 0);
  EXPECT_EQ(Allocate("10.1.0.21")["endpoint"], a["endpoint"]);
  EXPECT_EQ(Events("migrate-failed").size(), 1u);
  // Unknown node, a node without room, a VM already there.
  EXPECT_EQ(Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.21"}, {"node_id", "n9"}})["code"],
            "unknown_node");
  Json here = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.21"}, {"node_id", "n1"}});
  EXPECT_EQ(here["code"], "bad_request") << here.dump();
  AddVm("10.1.0.22", "10.0.0.2", kSms, 1, 1);
  n2.fail_start = false;
  ASSERT_TRUE(Allocate("10.1.0.22").value("ok", false));
  Json full = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.21"}, {"node_id", "n2"}});
  EXPECT_EQ(full["code"], "no_capacity") << full.dump();
  EXPECT_EQ(n2.starts().size(), 2u) << "nothing started for a move that cannot fit";
}

TEST_F(ClusterManagerTest, ASessionThatStaysUndoesTheMove) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  AddVm("10.1.0.23", "10.0.0.1", 16, 2, 1);
  Json a = Allocate("10.1.0.23");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  n1.FailMoves(1);
  Json m = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.23"}, {"node_id", "n2"}});
  EXPECT_EQ(m["code"], "server_failed") << m.dump();
  EXPECT_NE(m.dump().find("cannot move: a graph"), std::string::npos) << m.dump();
  EXPECT_NE(m.dump().find("went back"), std::string::npos) << m.dump();
  // The session that had moved was sent back to the source, then the target stopped.
  std::vector<Json> back = n2.requests("migrate");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0]["to"], a["endpoint"]);
  EXPECT_TRUE(n2.running().empty());
  EXPECT_EQ(n1.running().size(), 1u);
  EXPECT_EQ(SmUsed()[n2.Uuid(0)], 0);
  EXPECT_EQ(Servers().size(), 1u);
  EXPECT_EQ(Allocate("10.1.0.23")["endpoint"], a["endpoint"]);
}

TEST_F(ClusterManagerTest, AVmWithSeveralGpusMovesWholeOrNotAtAll) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 2);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 2);
  AddVm("10.1.0.24", "10.0.0.1", 16, 2, 2);
  Json a = Allocate("10.1.0.24");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  ASSERT_EQ(a["node_id"], "n1");
  // One of the two servers leaves a session behind: neither moves.
  n1.FailMoves(1);
  Json m = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.24"}, {"node_id", "n2"}});
  EXPECT_EQ(m["code"], "server_failed") << m.dump();
  EXPECT_EQ(n2.starts().size(), 2u);
  EXPECT_EQ(n2.requests("migrate").size(), 2u) << "both targets send their sessions back";
  EXPECT_TRUE(n2.running().empty());
  EXPECT_EQ(Allocate("10.1.0.24")["endpoint"], a["endpoint"]);
  // Then the whole VM moves: both servers, ordinals kept.
  Json ok = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.24"}, {"node_id", "n2"}});
  ASSERT_TRUE(ok.value("ok", false)) << ok.dump();
  EXPECT_EQ(ok["moved"].size(), 2u);
  Json b = Allocate("10.1.0.24");
  EXPECT_EQ(b["node_id"], "n2") << b.dump();
  EXPECT_EQ(b["placement"], "2 GPUs on node n2");
  ASSERT_EQ(b["servers"].size(), 2u);
  EXPECT_EQ(b["servers"][0]["ordinal"], 0);
  EXPECT_EQ(b["servers"][1]["ordinal"], 1);
  EXPECT_TRUE(n1.running().empty());
  for (const auto& [uuid, sm] : SmUsed())
    EXPECT_EQ(sm, uuid.find("-n2-") != std::string::npos ? 16 : 0) << uuid;
  // One GPU of a VM with several: refused.
  Json one = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.24"}, {"node_id", "n1"}, {"gpu", "0"}});
  EXPECT_EQ(one["code"], "bad_request") << one.dump();
}

TEST_F(ClusterManagerTest, DrainNodeMovesItsVmsUnlessToldNot) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 2);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 2);
  AddVm("10.1.0.25", "10.0.0.1", 16, 2, 1);
  AddVm("10.1.0.26", "10.0.0.1", 16, 2, 1);
  ASSERT_TRUE(Allocate("10.1.0.25").value("ok", false));
  ASSERT_TRUE(Allocate("10.1.0.26").value("ok", false));
  ASSERT_EQ(n1.running().size(), 2u);
  Json keep = Admin({{"verb", "drain-node"}, {"node_id", "n1"}, {"migrate", false}});
  ASSERT_TRUE(keep.value("ok", false)) << keep.dump();
  EXPECT_EQ(n1.running().size(), 2u);
  EXPECT_TRUE(n2.starts().empty());
  Json d = Admin({{"verb", "drain-node"}, {"node_id", "n1"}});
  ASSERT_TRUE(d.value("ok", false)) << d.dump();
  EXPECT_EQ(d["moved"].size(), 2u) << d.dump();
  EXPECT_TRUE(d["failed"].empty()) << d.dump();
  EXPECT_EQ(d["allocations"], 0);
  EXPECT_TRUE(n1.running().empty());
  EXPECT_EQ(n2.running().size(), 2u);
  EXPECT_EQ(Events("migrate-done").size(), 2u);
  EXPECT_EQ(Events("drain-node-done").size(), 1u);
}

TEST_F(ClusterManagerTest, MigrateAutoMovesAVmOffTheMostLoadedNode) {
  AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  // Three VMs on n1 (their host): 64 + 32 + 8 of its 132 SMs; n2 is empty.
  AddVm("10.1.0.27", "10.0.0.1", 64, 2, 1);
  AddVm("10.1.0.28", "10.0.0.1", 32, 2, 1);
  AddVm("10.1.0.30", "10.0.0.1", 8, 2, 1);
  for (const char* vm : {"10.1.0.27", "10.1.0.28", "10.1.0.30"}) {
    ASSERT_TRUE(Allocate(vm).value("ok", false));
  }
  ASSERT_TRUE(n2.running().empty());
  Json dry = Admin({{"verb", "migrate-auto"}, {"dry_run", true}});
  ASSERT_TRUE(dry.value("ok", false)) << dry.dump();
  EXPECT_EQ(dry["from"], "n1");
  EXPECT_FALSE(dry["moved"].get<bool>());
  EXPECT_TRUE(n2.running().empty());
  Json r = Admin({{"verb", "migrate-auto"}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_TRUE(r["moved"].get<bool>()) << r.dump();
  // Moving the 64-SM VM leaves a peak of 64 SMs (n2); the others would leave 72 or 96 on n1.
  EXPECT_EQ(r["vm_ip"], "10.1.0.27") << r.dump();
  EXPECT_EQ(n2.running().size(), 1u);
  // Nothing more lowers the peak.
  Json again = Admin({{"verb", "migrate-auto"}});
  ASSERT_TRUE(again.value("ok", false)) << again.dump();
  EXPECT_FALSE(again["moved"].get<bool>()) << again.dump();
  EXPECT_EQ(Events("rebalance").size(), 3u);
}

TEST_F(ClusterManagerTest, CheckpointAndRestoreEveryServerOfTheVm) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 2);
  AddVm("10.1.0.29", "10.0.0.1", 16, 2, 2);
  ASSERT_TRUE(Allocate("10.1.0.29").value("ok", false));
  Json bad = Admin({{"verb", "checkpoint"}, {"vm_ip", "10.1.0.29"}, {"dir", "relative"}});
  EXPECT_EQ(bad["code"], "bad_request") << bad.dump();
  Json none = Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.29"}});
  EXPECT_EQ(none["code"], "bad_request") << "no checkpoint recorded yet: " << none.dump();
  Json c = Admin({{"verb", "checkpoint"}, {"vm_ip", "10.1.0.29"}, {"dir", "/ckpt/x/"}});
  ASSERT_TRUE(c.value("ok", false)) << c.dump();
  EXPECT_EQ(c["sessions"], 4);
  std::vector<Json> asked = n1.requests("checkpoint");
  ASSERT_EQ(asked.size(), 2u);
  std::set<std::string> dirs;
  for (const Json& r : asked) {
    dirs.insert(r["dir"]);
    EXPECT_FALSE(r["leave_running"].get<bool>());
  }
  EXPECT_EQ(dirs, (std::set<std::string>{"/ckpt/x/gpu0", "/ckpt/x/gpu1"}));
  EXPECT_EQ(Events("checkpoint").size(), 1u);
  Json shown = Admin({{"verb", "show"}, {"id", "10.1.0.29"}})["vm"];
  EXPECT_EQ(shown["checkpoint"]["dir"], "/ckpt/x") << shown.dump();
  EXPECT_EQ(shown["checkpoint"]["node_id"], "n1");
  EXPECT_EQ(shown.dump().find(Allocate("10.1.0.29")["token"].get<std::string>()), std::string::npos)
      << "no token in show";
  // Parked processes: a second checkpoint and a move wait for the restore.
  EXPECT_EQ(Admin({{"verb", "checkpoint"}, {"vm_ip", "10.1.0.29"}, {"dir", "/ckpt/y"}})["code"],
            "bad_request");
  AddNode("n2", "10.0.0.2", 2);
  EXPECT_EQ(Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.29"}, {"node_id", "n2"}})["code"],
            "bad_request");
  // A restore on another node whose files cannot be shipped (this fake node lists none)
  // fails with the reason and changes nothing; where it was taken it works.
  Json elsewhere = Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.29"}, {"node_id", "n2"}});
  EXPECT_EQ(elsewhere["code"], "server_failed");
  EXPECT_NE(elsewhere.dump().find("nothing changed"), std::string::npos) << elsewhere.dump();
  EXPECT_EQ(Events("restore-failed").size(), 1u);
  Json still = Admin({{"verb", "show"}, {"id", "10.1.0.29"}})["vm"];
  EXPECT_EQ(still["checkpoint"]["dir"], "/ckpt/x") << still.dump();
  Json r = Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.29"}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["restored"], 4);
  EXPECT_EQ(r["dir"], "/ckpt/x");
  EXPECT_EQ(n1.requests("restore").size(), 2u);
  EXPECT_EQ(Events("restore").size(), 1u);
  EXPECT_FALSE(Admin({{"verb", "show"}, {"id", "10.1.0.29"}})["vm"].contains("checkpoint"));
  // A checkpoint that leaves a session behind resumes the written ones at once.
  n1.FailMoves(1);
  Json f = Admin({{"verb", "checkpoint"}, {"vm_ip", "10.1.0.29"}, {"dir", "/ckpt/z"}});
  EXPECT_EQ(f["code"], "server_failed") << f.dump();
  EXPECT_NE(f.dump().find("resumed in place"), std::string::npos) << f.dump();
  EXPECT_EQ(n1.requests("restore").size(), 4u);
  EXPECT_EQ(Events("checkpoint-failed").size(), 1u);
  // Not parked: the VM moves again.
  Json m = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.29"}, {"node_id", "n2"}});
  EXPECT_TRUE(m.value("ok", false)) << m.dump();
}

TEST_F(ClusterManagerTest, RestoreOnAnotherNodeShipsEveryServersFiles) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 2);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 2);
  n1.ship = true;
  n2.ship = true;
  AddVm("10.1.0.31", "10.0.0.1", 16, 2, 2);
  Json a = Allocate("10.1.0.31");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  const std::string old0 = a["servers"][0]["endpoint"], old1 = a["servers"][1]["endpoint"];
  ASSERT_TRUE(Admin({{"verb", "checkpoint"}, {"vm_ip", "10.1.0.31"}, {"dir", "/ckpt/m"}})
                  .value("ok", false));
  // One GPU of two, a node that is not there: refused, nothing changes.
  Json one = Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.31"}, {"node_id", "n2"}, {"gpu", "0"}});
  EXPECT_EQ(one["code"], "bad_request") << one.dump();
  EXPECT_EQ(Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.31"}, {"node_id", "n9"}})["code"],
            "unknown_node");
  EXPECT_TRUE(n2.starts().empty());
  // While it waits, its processes are told to wait (no new address yet).
  Json wait = cm_->Handle({"client", "10.1.0.31", ""},
                          {{"verb", "locate-server"}, {"vm_ip", "10.1.0.31"}, {"endpoint", old0}});
  EXPECT_TRUE(wait.value("ok", false)) << wait.dump();
  EXPECT_EQ(wait["endpoint"], old0) << "the checkpointed server still runs there";
  Json r = Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.31"}, {"node_id", "n2"}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  EXPECT_EQ(r["restored"], 4);
  EXPECT_EQ(r["shipped_bytes"], 24);
  EXPECT_EQ(r["from_node"], "n1");
  // Both servers' files went to n2, each into its own gpuN folder; each new server restored
  // its own; the old servers stopped and the source was marked spent.
  EXPECT_EQ(Count(n2.calls(), "write gpu0/session-"), 2u);
  EXPECT_EQ(Count(n2.calls(), "write gpu1/session-"), 2u);
  EXPECT_EQ(Count(n2.calls(), "write gpu0/session-1.flyt QUJDREVG"), 1u);
  std::set<std::string> dirs;
  for (const Json& q : n2.requests("restore")) dirs.insert(q["dir"]);
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_NE(dirs.begin()->find("/run/incoming/r-"), std::string::npos) << *dirs.begin();
  EXPECT_EQ(Count(n2.calls(), "drop-checkpoint-copy r-"), 1u);
  EXPECT_EQ(Count(n1.calls(), "spend-checkpoint /ckpt/m/gpu"), 2u);
  for (int i = 0; i < 50 && !n1.running().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(n1.running().empty()) << "the old servers stop";
  Json servers = Servers();
  ASSERT_EQ(servers.size(), 2u) << servers.dump();
  for (const Json& srv : servers) EXPECT_EQ(srv["node_id"], "n2") << srv.dump();
  EXPECT_FALSE(Admin({{"verb", "show"}, {"id", "10.1.0.31"}})["vm"].contains("checkpoint"));
  // The waiting processes are told their server's new address, ordinal by ordinal.
  Json b = Allocate("10.1.0.31");
  for (const auto& [old, ordinal] : {std::pair{old0, 0}, std::pair{old1, 1}}) {
    Json where =
        cm_->Handle({"client", "10.1.0.31", ""},
                    {{"verb", "locate-server"}, {"vm_ip", "10.1.0.31"}, {"endpoint", old}});
    EXPECT_EQ(where["endpoint"], b["servers"][ordinal]["endpoint"]) << where.dump();
    EXPECT_EQ(where["relocated"], true);
  }
  // A client manager asks for its own VM only.
  Json other = cm_->Handle({"client", "10.1.0.99", ""},
                           {{"verb", "locate-server"}, {"vm_ip", "10.1.0.31"}, {"endpoint", old0}});
  EXPECT_EQ(other["code"], "bad_request") << other.dump();
  EXPECT_EQ(Events("restore-ship").size(), 1u);
  EXPECT_EQ(Events("restore").size(), 1u);
  std::map<std::string, int> used = SmUsed();
  EXPECT_EQ(used["GPU-n1-0"] + used["GPU-n1-1"], 0);
  EXPECT_EQ(used["GPU-n2-0"] + used["GPU-n2-1"], 32);
}

TEST_F(ClusterManagerTest, SessionsMoveOnlyBetweenServersOfOneKind) {
  AddNode("n1", "10.0.0.1", 1);
  FakeNode& n2 = AddNode("n2", "10.0.0.2", 1);
  Json tls = n2.Registration();
  tls["server_scheme"] = "tls";  // a node with server_tls
  ASSERT_TRUE(cm_->Handle({"node", "n2", ""}, tls).value("ok", false));
  AddVm("10.1.0.32", "10.0.0.1", 64, 2, 1);
  ASSERT_TRUE(Allocate("10.1.0.32").value("ok", false));
  Json m = Admin({{"verb", "migrate"}, {"vm_ip", "10.1.0.32"}, {"node_id", "n2"}});
  EXPECT_EQ(m["code"], "bad_request") << m.dump();
  EXPECT_NE(m.dump().find("same kind"), std::string::npos) << m.dump();
  EXPECT_TRUE(n2.starts().empty()) << "nothing is started on a node of the other kind";
  // migrate-auto does not pick it either, although it would lower the peak.
  Json a = Admin({{"verb", "migrate-auto"}});
  EXPECT_EQ(a["moved"], false) << a.dump();
  EXPECT_TRUE(n2.starts().empty());
}

TEST_F(ClusterManagerTest, RestoreStartsLostServersAgainAtTheirAddresses) {
  FakeNode& n1 = AddNode("n1", "10.0.0.1", 1);
  AddVm("10.1.0.31", "10.0.0.1", 16, 2, 1);
  Json a = Allocate("10.1.0.31");
  ASSERT_TRUE(a.value("ok", false)) << a.dump();
  ASSERT_TRUE(
      Admin({{"verb", "checkpoint"}, {"vm_ip", "10.1.0.31"}, {"dir", "/c"}}).value("ok", false));
  // The server goes (the node restarted, or the operator freed the GPU meanwhile).
  ASSERT_TRUE(Admin({{"verb", "deallocate"}, {"vm_ip", "10.1.0.31"}}).value("ok", false));
  ASSERT_TRUE(n1.running().empty());
  // The record outlives a restart of the cluster manager (table checkpoints).
  StartManager();
  ASSERT_TRUE(cm_->Handle({"node", "n1", ""}, n1.Registration()).value("ok", false));
  Json r = Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.31"}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  std::vector<Json> starts = n1.starts();
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[1]["port"], 40000) << "the port the waiting processes dial";
  EXPECT_EQ(starts[1]["token"], a["token"]);
  EXPECT_EQ(starts[1]["gpu_uuid"], n1.Uuid(0));
  EXPECT_EQ(starts[1]["alloc_id"], a["alloc_id"]) << "its shm:// address is named after it";
  std::vector<Json> restores = n1.requests("restore");
  ASSERT_EQ(restores.size(), 1u);
  EXPECT_EQ(restores[0]["alloc_id"], starts[1]["alloc_id"]);
  EXPECT_EQ(restores[0]["dir"], "/c/gpu0");
  Json again = Allocate("10.1.0.31");
  EXPECT_EQ(again["endpoint"], a["endpoint"]);
  EXPECT_EQ(again["token"], a["token"]);
  EXPECT_EQ(Events("restore-servers").size(), 1u);
  // Restored: the record is spent.
  EXPECT_EQ(Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.31"}})["code"], "bad_request");
  // A new server elsewhere (another address, another token) cannot take a checkpoint.
  ASSERT_TRUE(
      Admin({{"verb", "checkpoint"}, {"vm_ip", "10.1.0.31"}, {"dir", "/d"}}).value("ok", false));
  ASSERT_TRUE(Admin({{"verb", "deallocate"}, {"vm_ip", "10.1.0.31"}}).value("ok", false));
  Json fresh = Allocate("10.1.0.31");
  ASSERT_TRUE(fresh.value("ok", false)) << fresh.dump();
  Json refused = Admin({{"verb", "restore"}, {"vm_ip", "10.1.0.31"}});
  EXPECT_EQ(refused["code"], "bad_request") << refused.dump();
  EXPECT_NE(refused.dump().find("is now at"), std::string::npos) << refused.dump();
}

// A restart mid-restore on another node: rolled back until the waiting processes may have
// been told the new addresses, finished from then on while the target servers run.
TEST(RestoreRecovery, GoesOnOnlyOnceTheProcessesMayHaveBeenTold) {
  for (const char* stage : {"chosen", "started", "shipped"}) {
    EXPECT_FALSE(RestoreRecoveryGoesOn(stage, true)) << stage;
    EXPECT_FALSE(RestoreRecoveryGoesOn(stage, false)) << stage;
  }
  for (const char* stage : {"told", "restored"}) {
    EXPECT_TRUE(RestoreRecoveryGoesOn(stage, true)) << stage;
    EXPECT_FALSE(RestoreRecoveryGoesOn(stage, false)) << stage << ": a target server is gone";
  }
  EXPECT_FALSE(RestoreRecoveryGoesOn("", true));
  EXPECT_FALSE(RestoreRecoveryGoesOn("unknown", true));
}

}  // namespace
}  // namespace flyt::cluster
