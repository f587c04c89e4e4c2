// Tests of src/store: the same typed suite runs against SQLite (a temp file) and
// PostgreSQL (FLYT_TEST_POSTGRES_URL, set by tests/support/pg_server.py). The
// PostgreSQL tests fail, never skip, when that variable is unset.
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "store/sql_database.h"
#include "store/store.h"

namespace flyt::store {
namespace {

constexpr char kNoPostgres[] =
    "FLYT_TEST_POSTGRES_URL is not set. The PostgreSQL tests need a server: run them through "
    "tests/support/pg_server.py -- store_test --gtest_filter='*Postgres*' (ctest does), or set "
    "FLYT_TEST_POSTGRES_URL=postgresql://... to a scratch database.";

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string PostgresUrl() {
  const char* url = getenv("FLYT_TEST_POSTGRES_URL");
  return url ? url : "";
}

// ---- backends ----------------------------------------------------------------

struct SqliteBackend {
  static constexpr const char* kName = "Sqlite";
  static constexpr const char* kDialect = "sqlite";
  // Fresh, empty database; returns its URL.
  static void Prepare(std::string* dir, std::string* url) {
    char tmpl[] = "/tmp/flyt-store-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    *dir = tmpl;
    *url = "sqlite:" + *dir + "/flyt.db";
  }
};

struct PostgresBackend {
  static constexpr const char* kName = "Postgres";
  static constexpr const char* kDialect = "postgresql";
  static void Prepare(std::string* dir, std::string* url) {
    dir->clear();
    *url = PostgresUrl();
    ASSERT_FALSE(url->empty()) << kNoPostgres;
    std::unique_ptr<Database> db;
    Status s = Database::Open(*url, &db);
    ASSERT_TRUE(s.ok()) << s.message();
    s = db->Exec(
        "DROP TABLE IF EXISTS vm_required_resources, nodes, gpus, allocations, events, "
        "checkpoints, schema_migrations CASCADE");
    ASSERT_TRUE(s.ok()) << s.message();
  }
};

template <typename Backend>
class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Backend::Prepare(&dir_, &url_);
    if (HasFatalFailure()) return;
    Reopen();
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void Reopen() {
    store_.reset();
    Status s = Store::Open(url_, &store_);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  // A second, raw connection to the same database.
  std::unique_ptr<Database> Raw() {
    std::unique_ptr<Database> db;
    Status s = Database::Open(url_, &db);
    EXPECT_TRUE(s.ok()) << s.message();
    return db;
  }
  std::vector<SqlRow> Rows(const std::string& sql) {
    std::vector<SqlRow> rows;
    auto db = Raw();
    if (!db) return rows;
    Status s = db->Query(sql, {}, &rows);
    EXPECT_TRUE(s.ok()) << s.message();
    return rows;
  }
  std::vector<VmRequirement> Vms() {
    std::vector<VmRequirement> vms;
    Status s = store_->ListVms(&vms);
    EXPECT_TRUE(s.ok()) << s.message();
    return vms;
  }

  std::string dir_, url_;
  std::unique_ptr<Store> store_;
};

struct BackendNames {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};
using Backends = ::testing::Types<SqliteBackend, PostgresBackend>;
TYPED_TEST_SUITE(StoreTest, Backends, BackendNames);

#define ASSERT_OK(expr)                                 \
  do {                                                  \
    ::flyt::Status _s = (expr);                         \
    ASSERT_TRUE(_s.ok()) << #expr ": " << _s.message(); \
  } while (0)

VmRequirement Vm(const std::string& ip, int units, double gb,
                 const std::string& host = "10.1.0.1") {
  VmRequirement vm;
  vm.vm_ip = ip;
  vm.host_ip = host;
  vm.compute_units = units;
  vm.memory_gb = gb;
  return vm;
}

// ---- migrations ----------------------------------------------------------------

TYPED_TEST(StoreTest, MigrationsCreateTheSchema) {
  EXPECT_EQ(this->store_->dialect(), TypeParam::kDialect);
  EXPECT_GE(this->store_->schema_version(), 1);
  auto rows = this->Rows("SELECT version, applied_ms FROM schema_migrations ORDER BY version");
  ASSERT_EQ(rows.size(), static_cast<size_t>(this->store_->schema_version()));
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i][0].value(), std::to_string(i + 1));
    EXPECT_GT(std::stoll(rows[i][1].value()), NowMs() - 60'000);
  }
  for (const char* table : {"vm_required_resources", "nodes", "gpus", "allocations", "events"}) {
    auto count = this->Rows(std::string("SELECT COUNT(*) FROM ") + table);
    ASSERT_EQ(count.size(), 1u) << table;
    EXPECT_EQ(count[0][0].value(), "0") << table;
  }
  // The MongoDB collection's column names.
  auto cols = this->Rows("SELECT vm_ip, host_ip, compute_units, memory FROM vm_required_resources");
  EXPECT_TRUE(cols.empty());
}

TYPED_TEST(StoreTest, ReopenAppliesNothing) {
  int version = this->store_->schema_version();
  auto before = this->Rows("SELECT version, applied_ms FROM schema_migrations ORDER BY version");
  ASSERT_OK(this->store_->UpsertVm(Vm("10.0.0.1", 8, 2)));
  this->Reopen();
  this->Reopen();
  EXPECT_EQ(this->store_->schema_version(), version);
  EXPECT_EQ(this->Rows("SELECT version, applied_ms FROM schema_migrations ORDER BY version"),
            before);
  EXPECT_EQ(this->Vms().size(), 1u);
}

TYPED_TEST(StoreTest, NewerSchemaIsRefused) {
  auto db = this->Raw();
  ASSERT_OK(db->Exec("INSERT INTO schema_migrations (version, applied_ms) VALUES (?, ?)",
                     {999, NowMs()}));
  this->store_.reset();
  std::unique_ptr<Store> store;
  Status s = Store::Open(this->url_, &store);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("newer"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("999"), std::string::npos) << s.message();
}

// A database written by a Flyt before migration 2 (no GPU count, no ordinal) is upgraded in
// place: its VMs get one GPU, its allocations ordinal 0, and both columns are usable.
TYPED_TEST(StoreTest, Migration2AddsGpuCountToAnOldDatabase) {
  this->store_.reset();
  auto db = this->Raw();
  const bool pg = std::string(TypeParam::kDialect) == "postgresql";
  for (const char* t : {"vm_required_resources", "nodes", "gpus", "allocations", "events",
                        "checkpoints", "schema_migrations"})
    ASSERT_OK(db->Exec(std::string("DROP TABLE IF EXISTS ") + t + (pg ? " CASCADE" : "")));
  // Migration 1's tables, as version 1 wrote them (the events table is not needed here).
  ASSERT_OK(
      db->Exec("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_ms BIGINT "
               "NOT NULL)"));
  ASSERT_OK(db->Exec("INSERT INTO schema_migrations (version, applied_ms) VALUES (1, 1)"));
  ASSERT_OK(
      db->Exec("CREATE TABLE vm_required_resources (vm_ip TEXT PRIMARY KEY, host_ip TEXT NOT "
               "NULL, compute_units INTEGER NOT NULL, memory DOUBLE PRECISION NOT NULL)"));
  ASSERT_OK(
      db->Exec("CREATE TABLE allocations (alloc_id TEXT PRIMARY KEY, vm_ip TEXT NOT NULL, node_id "
               "TEXT NOT NULL, gpu_uuid TEXT NOT NULL, token TEXT NOT NULL, endpoint TEXT NOT "
               "NULL, state TEXT NOT NULL, sm INTEGER NOT NULL, memory_bytes BIGINT NOT NULL, "
               "created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL, last_client_ms BIGINT NOT "
               "NULL)"));
  ASSERT_OK(db->Exec("INSERT INTO vm_required_resources VALUES ('10.0.0.9', 'h', 16, 2.5)"));
  ASSERT_OK(
      db->Exec("INSERT INTO allocations VALUES ('a1', '10.0.0.9', 'n1', 'GPU-1', 't', 'tcp://x:1', "
               "'running', 16, 1024, 1, 2, 3)"));
  db.reset();
  std::unique_ptr<Store> store;
  Status s = Store::Open(this->url_, &store);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(store->schema_version(), 3);  // migration 2, then 3 (checkpoints)
  std::vector<VmRequirement> vms;
  ASSERT_OK(store->ListVms(&vms));
  ASSERT_EQ(vms.size(), 1u);
  EXPECT_EQ(vms[0].compute_units, 16);
  EXPECT_EQ(vms[0].gpus, 1);
  std::vector<Allocation> allocs;
  ASSERT_OK(store->ListAllocations(&allocs));
  ASSERT_EQ(allocs.size(), 1u);
  EXPECT_EQ(allocs[0].ordinal, 0);
  EXPECT_EQ(allocs[0].endpoint, "tcp://x:1");
  VmRequirement vm = vms[0];
  vm.gpus = 3;
  ASSERT_OK(store->UpsertVm(vm));
  Allocation a = allocs[0];
  a.alloc_id = "a2";
  a.ordinal = 2;
  ASSERT_OK(store->PutAllocation(a));
  ASSERT_OK(store->ListVms(&vms));
  EXPECT_EQ(vms[0].gpus, 3);
  ASSERT_OK(store->ListAllocations(&allocs));
  ASSERT_EQ(allocs.size(), 2u);
  EXPECT_EQ(allocs[1].ordinal, 2);
}

TYPED_TEST(StoreTest, DataSurvivesReopen) {
  ASSERT_OK(this->store_->UpsertVm(Vm("10.0.0.7", 32, 12.25)));
  Node node;
  node.node_id = "n1";
  node.hostname = "gpu1";
  node.address = "10.1.0.1:12401";
  node.host_ip = "10.1.0.1";
  node.state = "ready";
  node.mps = true;
  node.registered_ms = 5;
  node.last_heartbeat_ms = 6;
  ASSERT_OK(this->store_->UpsertNode(node));
  Gpu gpu;
  gpu.uuid = "GPU-1";
  gpu.name = "H200";
  gpu.sm_count = 132;
  gpu.memory_bytes = int64_t{141} << 30;
  ASSERT_OK(this->store_->ReplaceGpus("n1", {gpu}));
  Allocation a;
  a.alloc_id = "a1";
  a.vm_ip = "10.0.0.7";
  a.node_id = "n1";
  a.gpu_uuid = "GPU-1";
  a.state = "running";
  ASSERT_OK(this->store_->PutAllocation(a));
  ASSERT_OK(this->store_->AddEvent("k", "s", "d"));

  this->Reopen();
  std::vector<Node> nodes;
  std::vector<Gpu> gpus;
  std::vector<Allocation> allocs;
  std::vector<Event> events;
  ASSERT_OK(this->store_->ListNodes(&nodes));
  ASSERT_OK(this->store_->ListGpus(&gpus));
  ASSERT_OK(this->store_->ListAllocations(&allocs));
  ASSERT_OK(this->store_->ListEvents(0, 0, &events));
  auto vms = this->Vms();
  ASSERT_EQ(vms.size(), 1u);
  EXPECT_EQ(vms[0].memory_gb, 12.25);
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_TRUE(nodes[0].mps);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].memory_bytes, int64_t{141} << 30);
  ASSERT_EQ(allocs.size(), 1u);
  EXPECT_EQ(allocs[0].state, "running");
  ASSERT_EQ(events.size(), 1u);
  // New events continue after the old ones.
  ASSERT_OK(this->store_->AddEvent("k", "s", "d2"));
  ASSERT_OK(this->store_->ListEvents(0, 0, &events));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_GT(events[1].id, events[0].id);
}

// ---- VMs -------------------------------------------------------------------------

TYPED_TEST(StoreTest, VmUpsertGetRemove) {
  Store& store = *this->store_;
  VmRequirement got;
  bool found = true;
  ASSERT_OK(store.GetVm("10.0.0.1", &got, &found));
  EXPECT_FALSE(found);

  ASSERT_OK(store.UpsertVm(Vm("10.0.0.1", 8, 1.5, "192.168.0.9")));
  ASSERT_OK(store.GetVm("10.0.0.1", &got, &found));
  ASSERT_TRUE(found);
  EXPECT_EQ(got.vm_ip, "10.0.0.1");
  EXPECT_EQ(got.host_ip, "192.168.0.9");
  EXPECT_EQ(got.compute_units, 8);
  EXPECT_EQ(got.memory_gb, 1.5);

  // Update in place; doubles round-trip exactly.
  ASSERT_OK(store.UpsertVm(Vm("10.0.0.1", 16, 0.1, "192.168.0.10")));
  ASSERT_OK(store.GetVm("10.0.0.1", &got, &found));
  ASSERT_TRUE(found);
  EXPECT_EQ(got.compute_units, 16);
  EXPECT_EQ(got.memory_gb, 0.1);
  EXPECT_EQ(got.host_ip, "192.168.0.10");
  EXPECT_EQ(this->Vms().size(), 1u);

  bool existed = false;
  ASSERT_OK(store.RemoveVm("10.0.0.1", &existed));
  EXPECT_TRUE(existed);
  ASSERT_OK(store.RemoveVm("10.0.0.1", &existed));
  EXPECT_FALSE(existed);
  ASSERT_OK(store.RemoveVm("10.0.0.1", nullptr));
  ASSERT_OK(store.GetVm("10.0.0.1", &got, &found));
  EXPECT_FALSE(found);
}

TYPED_TEST(StoreTest, VmValidation) {
  Store& store = *this->store_;
  EXPECT_FALSE(store.UpsertVm(Vm("", 1, 1)).ok());
  EXPECT_FALSE(store.UpsertVm(Vm("10.0.0.1", 1, 1, "")).ok());
  EXPECT_FALSE(store.UpsertVm(Vm("10.0.0.1", -1, 1)).ok());
  EXPECT_FALSE(store.UpsertVm(Vm("10.0.0.1", 1, -0.5)).ok());
  VmRequirement no_gpu = Vm("10.0.0.1", 1, 1);
  no_gpu.gpus = 0;
  Status zero = store.UpsertVm(no_gpu);
  EXPECT_FALSE(zero.ok());
  EXPECT_NE(zero.message().find("at least 1"), std::string::npos) << zero.message();
  // Nothing of a batch is written when one entry is invalid.
  EXPECT_FALSE(store.UpsertVms({Vm("10.0.0.2", 1, 1), Vm("10.0.0.3", -4, 1)}).ok());
  EXPECT_TRUE(this->Vms().empty());
}

TYPED_TEST(StoreTest, ListVmsIsSortedAndKeepsText) {
  Store& store = *this->store_;
  // Quotes, '?' and newlines must pass through untouched.
  ASSERT_OK(store.UpsertVm(Vm("b'?x", 1, 1, "h\"?\n")));
  ASSERT_OK(store.UpsertVm(Vm("10.0.0.10", 2, 2)));
  ASSERT_OK(store.UpsertVm(Vm("10.0.0.2", 3, 3)));
  auto vms = this->Vms();
  ASSERT_EQ(vms.size(), 3u);
  EXPECT_EQ(vms[0].vm_ip, "10.0.0.10");
  EXPECT_EQ(vms[1].vm_ip, "10.0.0.2");
  EXPECT_EQ(vms[2].vm_ip, "b'?x");
  EXPECT_EQ(vms[2].host_ip, "h\"?\n");
}

TYPED_TEST(StoreTest, UpsertVmsBulk20k) {
  constexpr int kVms = 20000;
  std::vector<VmRequirement> vms;
  for (int i = 0; i < kVms; ++i) {
    vms.push_back(Vm("10." + std::to_string(i / 65536) + "." + std::to_string(i / 256 % 256) + "." +
                         std::to_string(i % 256),
                     i % 132, i * 0.25, "192.168.0." + std::to_string(i % 8)));
  }
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK(this->store_->UpsertVms(vms));
  auto t1 = std::chrono::steady_clock::now();
  for (auto& vm : vms) vm.compute_units += 1;
  ASSERT_OK(this->store_->UpsertVms(vms));
  auto t2 = std::chrono::steady_clock::now();
  auto got = this->Vms();
  auto t3 = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
  };
  std::printf("[ timing   ] %s: UpsertVms(20k) insert %lld ms, update %lld ms, ListVms %lld ms\n",
              TypeParam::kName, static_cast<long long>(ms(t0, t1)),
              static_cast<long long>(ms(t1, t2)), static_cast<long long>(ms(t2, t3)));
  ASSERT_EQ(got.size(), static_cast<size_t>(kVms));
  VmRequirement one;
  bool found = false;
  ASSERT_OK(this->store_->GetVm("10.0.1.44", &one, &found));
  ASSERT_TRUE(found);
  EXPECT_EQ(one.compute_units, 300 % 132 + 1);
  EXPECT_EQ(one.memory_gb, 75.0);
  EXPECT_EQ(one.host_ip, "192.168.0.4");
}

TYPED_TEST(StoreTest, UpsertVmsLaterDuplicateWins) {
  ASSERT_OK(this->store_->UpsertVms({Vm("a", 1, 1), Vm("b", 2, 2), Vm("a", 3, 3)}));
  auto vms = this->Vms();
  ASSERT_EQ(vms.size(), 2u);
  EXPECT_EQ(vms[0].vm_ip, "a");
  EXPECT_EQ(vms[0].compute_units, 3);
  ASSERT_OK(this->store_->UpsertVms({}));
  EXPECT_EQ(this->Vms().size(), 2u);
}

// ---- nodes and GPUs ----------------------------------------------------------------

TYPED_TEST(StoreTest, Nodes) {
  Store& store = *this->store_;
  Node n;
  n.node_id = "node-b";
  n.hostname = "gpu-b";
  n.address = "10.1.0.2:12401";
  n.host_ip = "10.1.0.2";
  n.state = "ready";
  n.registered_ms = 1000;
  n.last_heartbeat_ms = 2000;
  ASSERT_OK(store.UpsertNode(n));
  Node a = n;
  a.node_id = "node-a";
  a.mps = true;
  ASSERT_OK(store.UpsertNode(a));
  n.state = "draining";
  n.last_heartbeat_ms = int64_t{1} << 42;
  ASSERT_OK(store.UpsertNode(n));
  EXPECT_FALSE(store.UpsertNode(Node()).ok());

  std::vector<Node> nodes;
  ASSERT_OK(store.ListNodes(&nodes));
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node_id, "node-a");
  EXPECT_TRUE(nodes[0].mps);
  EXPECT_EQ(nodes[1].node_id, "node-b");
  EXPECT_FALSE(nodes[1].mps);
  EXPECT_EQ(nodes[1].state, "draining");
  EXPECT_EQ(nodes[1].hostname, "gpu-b");
  EXPECT_EQ(nodes[1].address, "10.1.0.2:12401");
  EXPECT_EQ(nodes[1].host_ip, "10.1.0.2");
  EXPECT_EQ(nodes[1].registered_ms, 1000);
  EXPECT_EQ(nodes[1].last_heartbeat_ms, int64_t{1} << 42);
}

Gpu MakeGpu(const std::string& uuid, int index) {
  Gpu g;
  g.uuid = uuid;
  g.node_id = "ignored";
  g.name = "NVIDIA H200";
  g.driver_version = "580.65";
  g.cuda_version = "13.0";
  g.index = index;
  g.sm_count = 132;
  g.memory_bytes = int64_t{150} << 30;
  return g;
}

TYPED_TEST(StoreTest, ReplaceGpus) {
  Store& store = *this->store_;
  ASSERT_OK(store.ReplaceGpus("n1", {MakeGpu("GPU-b", 1), MakeGpu("GPU-a", 0)}));
  ASSERT_OK(store.ReplaceGpus("n2", {MakeGpu("GPU-c", 0)}));
  std::vector<Gpu> gpus;
  ASSERT_OK(store.ListGpus(&gpus));
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].uuid, "GPU-a");
  EXPECT_EQ(gpus[0].node_id, "n1");
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[1].uuid, "GPU-b");
  EXPECT_EQ(gpus[2].uuid, "GPU-c");
  EXPECT_EQ(gpus[2].node_id, "n2");
  EXPECT_EQ(gpus[2].name, "NVIDIA H200");
  EXPECT_EQ(gpus[2].driver_version, "580.65");
  EXPECT_EQ(gpus[2].cuda_version, "13.0");
  EXPECT_EQ(gpus[2].sm_count, 132);
  EXPECT_EQ(gpus[2].memory_bytes, int64_t{150} << 30);

  // n1 now has one GPU, and GPU-c moved from n2 to n1.
  ASSERT_OK(store.ReplaceGpus("n1", {MakeGpu("GPU-a", 0), MakeGpu("GPU-c", 1)}));
  ASSERT_OK(store.ListGpus(&gpus));
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].uuid, "GPU-a");
  EXPECT_EQ(gpus[1].uuid, "GPU-c");
  EXPECT_EQ(gpus[1].node_id, "n1");

  ASSERT_OK(store.ReplaceGpus("n1", {}));
  ASSERT_OK(store.ListGpus(&gpus));
  EXPECT_TRUE(gpus.empty());
  EXPECT_FALSE(store.ReplaceGpus("n1", {MakeGpu("", 0)}).ok());
}

// ---- allocations -----------------------------------------------------------------

TYPED_TEST(StoreTest, Allocations) {
  Store& store = *this->store_;
  Allocation a;
  a.alloc_id = "alloc-2";
  a.vm_ip = "10.0.0.1";
  a.node_id = "n1";
  a.gpu_uuid = "GPU-a";
  a.token = "secret-token";
  a.endpoint = "tcp://10.1.0.1:40000";
  a.state = "starting";
  a.sm = 32;
  a.memory_bytes = int64_t{20} << 30;
  a.created_ms = 100;
  a.updated_ms = 100;
  a.last_client_ms = 0;
  ASSERT_OK(store.PutAllocation(a));
  Allocation b = a;
  b.alloc_id = "alloc-1";
  ASSERT_OK(store.PutAllocation(b));
  a.state = "running";
  a.sm = 64;
  a.updated_ms = 200;
  a.last_client_ms = 150;
  ASSERT_OK(store.PutAllocation(a));
  EXPECT_FALSE(store.PutAllocation(Allocation()).ok());

  std::vector<Allocation> allocs;
  ASSERT_OK(store.ListAllocations(&allocs));
  ASSERT_EQ(allocs.size(), 2u);
  EXPECT_EQ(allocs[0].alloc_id, "alloc-1");
  EXPECT_EQ(allocs[0].state, "starting");
  const Allocation& got = allocs[1];
  EXPECT_EQ(got.alloc_id, "alloc-2");
  EXPECT_EQ(got.vm_ip, "10.0.0.1");
  EXPECT_EQ(got.node_id, "n1");
  EXPECT_EQ(got.gpu_uuid, "GPU-a");
  EXPECT_EQ(got.token, "secret-token");
  EXPECT_EQ(got.endpoint, "tcp://10.1.0.1:40000");
  EXPECT_EQ(got.state, "running");
  EXPECT_EQ(got.sm, 64);
  EXPECT_EQ(got.memory_bytes, int64_t{20} << 30);
  EXPECT_EQ(got.created_ms, 100);
  EXPECT_EQ(got.updated_ms, 200);
  EXPECT_EQ(got.last_client_ms, 150);

  ASSERT_OK(store.DeleteAllocation("alloc-2"));
  ASSERT_OK(store.DeleteAllocation("no-such-alloc"));
  ASSERT_OK(store.ListAllocations(&allocs));
  ASSERT_EQ(allocs.size(), 1u);
  EXPECT_EQ(allocs[0].alloc_id, "alloc-1");
}

// ---- events ------------------------------------------------------------------------

TYPED_TEST(StoreTest, Checkpoints) {
  Store& store = *this->store_;
  std::vector<Checkpoint> list;
  ASSERT_OK(store.ListCheckpoints(&list));
  EXPECT_TRUE(list.empty());
  ASSERT_OK(store.PutCheckpoint({"10.1.0.2", "/ckpt/b", "{\"token\":\"t\"}", 7}));
  ASSERT_OK(store.PutCheckpoint({"10.1.0.1", "/ckpt/a", "{}", 5}));
  ASSERT_OK(store.PutCheckpoint({"10.1.0.2", "/ckpt/c", "{\"token\":\"u\"}", 9}));  // replaces
  ASSERT_OK(store.ListCheckpoints(&list));
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].vm_ip, "10.1.0.1");
  EXPECT_EQ(list[1].dir, "/ckpt/c");
  EXPECT_EQ(list[1].record, "{\"token\":\"u\"}");
  EXPECT_EQ(list[1].time_ms, 9);
  ASSERT_OK(store.DeleteCheckpoint("10.1.0.1"));
  ASSERT_OK(store.DeleteCheckpoint("10.1.0.9"));  // unknown: fine
  ASSERT_OK(store.ListCheckpoints(&list));
  ASSERT_EQ(list.size(), 1u);
  EXPECT_FALSE(store.PutCheckpoint({"", "/x", "{}", 1}).ok());
}

TYPED_TEST(StoreTest, EventsAscendWithAfterAndLimit) {
  Store& store = *this->store_;
  int64_t before = NowMs();
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK(store.AddEvent("kind" + std::to_string(i % 3), "subj" + std::to_string(i),
                             "detail with 'quotes' and ? #" + std::to_string(i)));
  }
  int64_t after = NowMs();
  std::vector<Event> all;
  ASSERT_OK(store.ListEvents(0, 0, &all));
  ASSERT_EQ(all.size(), 10u);
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) {
      EXPECT_GT(all[i].id, all[i - 1].id);
    }
    EXPECT_EQ(all[i].subject, "subj" + std::to_string(i));
    EXPECT_EQ(all[i].kind, "kind" + std::to_string(i % 3));
    EXPECT_EQ(all[i].detail, "detail with 'quotes' and ? #" + std::to_string(i));
    EXPECT_GE(all[i].time_ms, before);
    EXPECT_LE(all[i].time_ms, after);
  }
  std::vector<Event> page;
  ASSERT_OK(store.ListEvents(0, 3, &page));
  ASSERT_EQ(page.size(), 3u);
  EXPECT_EQ(page[2].id, all[2].id);
  ASSERT_OK(store.ListEvents(page.back().id, 4, &page));
  ASSERT_EQ(page.size(), 4u);
  EXPECT_EQ(page[0].id, all[3].id);
  ASSERT_OK(store.ListEvents(all[7].id, -1, &page));
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(page[1].id, all[9].id);
  ASSERT_OK(store.ListEvents(all[9].id, 0, &page));
  EXPECT_TRUE(page.empty());
}

TYPED_TEST(StoreTest, ConcurrentCallers) {
  constexpr int kThreads = 4, kEach = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        std::string id = std::to_string(t) + "-" + std::to_string(i);
        if (!this->store_->AddEvent("concurrent", id, "").ok()) ++failures;
        if (!this->store_->UpsertVm(Vm("vm-" + id, i, t)).ok()) ++failures;
        std::vector<VmRequirement> vms;
        if (!this->store_->ListVms(&vms).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<Event> events;
  ASSERT_OK(this->store_->ListEvents(0, 0, &events));
  EXPECT_EQ(events.size(), static_cast<size_t>(kThreads * kEach));
  EXPECT_EQ(this->Vms().size(), static_cast<size_t>(kThreads * kEach));
}

// ---- the SQL layer on its own ----------------------------------------------------

TEST(SqlDatabase, DollarPlaceholders) {
  EXPECT_EQ(ToDollarPlaceholders("SELECT a FROM t WHERE b = ? AND c > ?"),
            "SELECT a FROM t WHERE b = $1 AND c > $2");
  EXPECT_EQ(ToDollarPlaceholders("SELECT '?', 'it''s ?', \"col?\", ? -- why?\n, ? /* ? */ ?"),
            "SELECT '?', 'it''s ?', \"col?\", $1 -- why?\n, $2 /* ? */ $3");
  EXPECT_EQ(ToDollarPlaceholders("no placeholders"), "no placeholders");
}

TEST(SqlDatabase, RedactUrl) {
  EXPECT_EQ(RedactUrl("postgresql://flyt:hunter2@db.example:5432/flyt"),
            "postgresql://flyt:***@db.example:5432/flyt");
  EXPECT_EQ(RedactUrl("postgresql://db/flyt?user=u&password=hunter2&sslmode=require"),
            "postgresql://db/flyt?user=u&password=***&sslmode=require");
  EXPECT_EQ(RedactUrl("postgresql://flyt@db/flyt"), "postgresql://flyt@db/flyt");
  EXPECT_EQ(RedactUrl("sqlite:/var/lib/flyt/flyt.db"), "sqlite:/var/lib/flyt/flyt.db");
}

TEST(SqlDatabase, MissingLibpqGivesClearError) {
  std::unique_ptr<Database> db;
  Status s = OpenPostgresDatabase("postgresql://127.0.0.1/flyt", &db, "libflyt-no-such-libpq.so.5");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("PostgreSQL support needs"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("apt-get install libpq5"), std::string::npos) << s.message();
  EXPECT_EQ(db, nullptr);
}

TEST(SqlDatabase, UnreachablePgServerIsClear) {
  std::unique_ptr<Store> store;
  Status s = Store::Open("postgresql://flyt:hunter2@127.0.0.1:1/flyt?connect_timeout=2", &store);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot connect to PostgreSQL at postgresql://flyt:***@127.0.0.1:1"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("hunter2"), std::string::npos) << s.message();
}

TEST(SqlDatabase, BadUrls) {
  std::unique_ptr<Store> store;
  Status s = Store::Open("mysql://db/flyt", &store);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("expected sqlite:PATH"), std::string::npos) << s.message();
  s = Store::Open("sqlite:/nonexistent-flyt-dir/sub/flyt.db", &store);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-flyt-dir/sub does not exist"), std::string::npos)
      << s.message();
  EXPECT_FALSE(Store::Open("sqlite:", &store).ok());
}

TEST(SqlDatabase, SqliteMemoryAndWal) {
  std::unique_ptr<Store> store;
  ASSERT_OK(Store::Open("sqlite::memory:", &store));
  EXPECT_EQ(store->dialect(), "sqlite");
  ASSERT_OK(store->UpsertVm(Vm("10.0.0.1", 1, 1)));

  char tmpl[] = "/tmp/flyt-store-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  // URL form with three slashes names an absolute path.
  ASSERT_OK(Store::Open("sqlite://" + dir + "/wal.db", &store));
  std::unique_ptr<Database> db;
  ASSERT_OK(Database::Open("sqlite:" + dir + "/wal.db", &db));
  std::vector<SqlRow> rows;
  ASSERT_OK(db->Query("PRAGMA journal_mode", {}, &rows));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][0].value(), "wal");
  db.reset();
  store.reset();
  std::filesystem::remove_all(dir);
}

TEST(SqlDatabase, SqliteValuesAndTransactions) {
  std::unique_ptr<Database> db;
  ASSERT_OK(Database::Open("sqlite::memory:", &db));
  EXPECT_EQ(db->dialect(), "sqlite");
  ASSERT_OK(db->Exec("CREATE TABLE t (a INTEGER, b DOUBLE PRECISION, c TEXT)"));
  ASSERT_OK(db->Exec("INSERT INTO t VALUES (?, ?, ?)", {int64_t{1} << 40, 0.1, std::nullopt}));
  ASSERT_OK(db->Begin());
  ASSERT_OK(db->Exec("INSERT INTO t VALUES (?, ?, ?)", {2, 2.5, "x"}));
  ASSERT_OK(db->Rollback());
  ASSERT_OK(db->Rollback());  // no transaction: a no-op
  std::vector<SqlRow> rows;
  ASSERT_OK(db->Query("SELECT a, b, c FROM t", {}, &rows));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][0].value(), std::to_string(int64_t{1} << 40));
  EXPECT_EQ(std::stod(rows[0][1].value()), 0.1);
  EXPECT_FALSE(rows[0][2].has_value());
  int64_t changed = 0;
  ASSERT_OK(db->Exec("UPDATE t SET c = ?", {"y"}, &changed));
  EXPECT_EQ(changed, 1);
  Status s = db->Exec("SELECT nope FROM t");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no such column"), std::string::npos) << s.message();
  EXPECT_FALSE(db->Exec("INSERT INTO t VALUES (?, ?, ?)", {1}).ok());  // wrong parameter count
}

// ---- PostgreSQL only -------------------------------------------------------------

class PostgresDatabaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = PostgresUrl();
    ASSERT_FALSE(url_.empty()) << kNoPostgres;
  }
  std::unique_ptr<Database> Open() {
    std::unique_ptr<Database> db;
    Status s = Database::Open(url_, &db);
    EXPECT_TRUE(s.ok()) << s.message();
    return db;
  }
  static std::string Pid(Database* db) {
    std::vector<SqlRow> rows;
    Status s = db->Query("SELECT pg_backend_pid()", {}, &rows);
    EXPECT_TRUE(s.ok()) << s.message();
    return rows.empty() ? "" : rows[0][0].value_or("");
  }
  // Terminates `pid`'s backend from another connection and waits until it is gone.
  void Kill(const std::string& pid) {
    auto admin = Open();
    ASSERT_NE(admin, nullptr);
    ASSERT_OK(admin->Exec("SELECT pg_terminate_backend(?)", {std::stoll(pid)}));
    for (int i = 0; i < 200; ++i) {
      std::vector<SqlRow> rows;
      ASSERT_OK(admin->Query("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = ?",
                             {std::stoll(pid)}, &rows));
      if (rows[0][0].value() == "0") return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "backend " << pid << " did not go away";
  }
  std::string url_;
};

TEST_F(PostgresDatabaseTest, ValuesAndDialect) {
  auto db = Open();
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(db->dialect(), "postgresql");
  std::vector<SqlRow> rows;
  ASSERT_OK(db->Query("SELECT ?::bigint, ?::double precision, ?::text, '?'",
                      {int64_t{1} << 40, 0.1, std::nullopt}, &rows));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][0].value(), std::to_string(int64_t{1} << 40));
  EXPECT_EQ(std::stod(rows[0][1].value()), 0.1);
  EXPECT_FALSE(rows[0][2].has_value());
  EXPECT_EQ(rows[0][3].value(), "?");
  Status s = db->Exec("SELECT nope FROM no_such_table");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no_such_table"), std::string::npos) << s.message();
  ASSERT_OK(db->Rollback());  // no transaction: a no-op
}

TEST_F(PostgresDatabaseTest, ReconnectsOnceAfterTheConnectionDrops) {
  auto db = Open();
  ASSERT_NE(db, nullptr);
  std::string pid = Pid(db.get());
  Kill(pid);
  if (HasFatalFailure()) return;
  std::vector<SqlRow> rows;
  ASSERT_OK(db->Query("SELECT 1", {}, &rows));  // reconnected transparently
  EXPECT_NE(Pid(db.get()), pid);
}

TEST_F(PostgresDatabaseTest, LossInsideATransactionIsReported) {
  auto db = Open();
  ASSERT_NE(db, nullptr);
  ASSERT_OK(db->Exec("CREATE TEMPORARY TABLE loss (x INTEGER)"));
  ASSERT_OK(db->Begin());
  ASSERT_OK(db->Exec("INSERT INTO loss VALUES (?)", {1}));
  Kill(Pid(db.get()));
  if (HasFatalFailure()) return;
  Status s = db->Exec("INSERT INTO loss VALUES (?)", {2});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("connection lost inside a transaction"), std::string::npos)
      << s.message();
  ASSERT_OK(db->Rollback());
  std::vector<SqlRow> rows;
  ASSERT_OK(db->Query("SELECT 1", {}, &rows));  // usable again
}

TEST_F(PostgresDatabaseTest, StoreSurvivesServerSideDisconnect) {
  auto admin = Open();
  ASSERT_NE(admin, nullptr);
  ASSERT_OK(
      admin->Exec("DROP TABLE IF EXISTS vm_required_resources, nodes, gpus, allocations, events, "
                  "checkpoints, schema_migrations CASCADE"));
  std::unique_ptr<Store> store;
  ASSERT_OK(Store::Open(url_, &store));
  ASSERT_OK(store->UpsertVm(Vm("10.0.0.1", 1, 1)));
  // Kill every other backend of this database (the store's among them).
  ASSERT_OK(
      admin->Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE datname = current_database() AND pid <> pg_backend_pid()"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_OK(store->UpsertVm(Vm("10.0.0.2", 2, 2)));
  std::vector<VmRequirement> vms;
  ASSERT_OK(store->ListVms(&vms));
  EXPECT_EQ(vms.size(), 2u);
}

}  // namespace
}  // namespace flyt::store
