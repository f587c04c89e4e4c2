// Store: the Flyt schema, its migrations and the typed reads and writes of the
// cluster manager's state. Uses only the SQL abstraction (sql_database.h), so
// every statement here must be valid in both SQLite and PostgreSQL; the one
// dialect difference (the events id column) lives in kMigrations.
#include "store/store.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "common/log.h"
#include "store/sql_database.h"

namespace flyt::store {
namespace {

// ---- migrations ------------------------------------------------------------

// "{{ID}}" in a statement is replaced by the dialect's auto-increment key type.
struct Migration {
  int version;
  const char* what;
  std::vector<const char*> statements;
};

const std::vector<Migration>& Migrations() {
  static const std::vector<Migration> kMigrations = {
      {1,
       "initial schema",
       {
           "CREATE TABLE vm_required_resources ("
           " vm_ip TEXT PRIMARY KEY,"
           " host_ip TEXT NOT NULL,"
           " compute_units INTEGER NOT NULL,"
           " memory DOUBLE PRECISION NOT NULL)",

           "CREATE TABLE nodes ("
           " node_id TEXT PRIMARY KEY,"
           " hostname TEXT NOT NULL,"
           " address TEXT NOT NULL,"
           " host_ip TEXT NOT NULL,"
           " state TEXT NOT NULL,"
           " mps INTEGER NOT NULL,"
           " registered_ms BIGINT NOT NULL,"
           " last_heartbeat_ms BIGINT NOT NULL)",

           "CREATE TABLE gpus ("
           " uuid TEXT PRIMARY KEY,"
           " node_id TEXT NOT NULL,"
           " gpu_index INTEGER NOT NULL,"
           " name TEXT NOT NULL,"
           " sm_count INTEGER NOT NULL,"
           " memory_bytes BIGINT NOT NULL,"
           " driver_version TEXT NOT NULL,"
           " cuda_version TEXT NOT NULL)",

           "CREATE INDEX gpus_by_node ON gpus (node_id)",

           "CREATE TABLE allocations ("
           " alloc_id TEXT PRIMARY KEY,"
           " vm_ip TEXT NOT NULL,"
           " node_id TEXT NOT NULL,"
           " gpu_uuid TEXT NOT NULL,"
           " token TEXT NOT NULL,"
           " endpoint TEXT NOT NULL,"
           " state TEXT NOT NULL,"
           " sm INTEGER NOT NULL,"
           " memory_bytes BIGINT NOT NULL,"
           " created_ms BIGINT NOT NULL,"
           " updated_ms BIGINT NOT NULL,"
           " last_client_ms BIGINT NOT NULL)",

           "CREATE INDEX allocations_by_vm ON allocations (vm_ip)",

           "CREATE TABLE events ("
           " id {{ID}},"
           " time_ms BIGINT NOT NULL,"
           " kind TEXT NOT NULL,"
           " subject TEXT NOT NULL,"
           " detail TEXT NOT NULL)",
       }},
      {2,
       "GPU count per VM, each server's GPU ordinal",
       {
           // A VM may ask for several GPUs (one flyt-server each); existing VMs keep one.
           "ALTER TABLE vm_required_resources ADD COLUMN gpus INTEGER NOT NULL DEFAULT 1",
           // Which of its VM's GPUs an allocation (one server) is: 0 .. gpus-1.
           "ALTER TABLE allocations ADD COLUMN gpu_ordinal INTEGER NOT NULL DEFAULT 0",
       }},
      {3,
       "checkpoints of VMs (flytctl checkpoint), kept until restored",
       {
           "CREATE TABLE checkpoints ("
           " vm_ip TEXT PRIMARY KEY,"
           " dir TEXT NOT NULL,"
           " time_ms BIGINT NOT NULL,"
           " record TEXT NOT NULL)",
       }},
  };
  return kMigrations;
}

std::string ForDialect(std::string sql, const std::string& dialect) {
  size_t pos = sql.find("{{ID}}");
  if (pos != std::string::npos) {
    sql.replace(
        pos, 6,
        dialect == "postgresql" ? "BIGSERIAL PRIMARY KEY" : "INTEGER PRIMARY KEY AUTOINCREMENT");
  }
  return sql;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Rolls back an open transaction unless Commit() was reached.
class Transaction {
 public:
  explicit Transaction(Database* db) : db_(db) {}
  ~Transaction() {
    if (open_) {
      Status s = db_->Rollback();
      if (!s.ok()) FLYT_WARN("store: rollback failed: %s", s.message().c_str());
    }
  }
  Status Begin() {
    Status s = db_->Begin();
    open_ = s.ok();
    return s;
  }
  Status Commit() {
    Status s = db_->Commit();
    if (s.ok()) open_ = false;
    return s;
  }

 private:
  Database* db_;
  bool open_ = false;
};

// ---- reading rows ------------------------------------------------------------

// Reads the columns of one row in order; remembers the first bad value.
class RowReader {
 public:
  RowReader(const SqlRow& row, const char* table) : row_(row), table_(table) {}
  std::string Text() {
    const auto& v = Next();
    return v ? *v : std::string();
  }
  int64_t Int() {
    const auto& v = Next();
    if (!v) return 0;
    int64_t out = 0;
    auto res = std::from_chars(v->data(), v->data() + v->size(), out);
    if (res.ec != std::errc() || res.ptr != v->data() + v->size()) Bad(*v);
    return out;
  }
  double Double() {
    const auto& v = Next();
    if (!v) return 0;
    double out = 0;
    auto res = std::from_chars(v->data(), v->data() + v->size(), out);
    if (res.ec != std::errc() || res.ptr != v->data() + v->size()) Bad(*v);
    return out;
  }
  Status status() const { return status_; }

 private:
  const std::optional<std::string>& Next() {
    static const std::optional<std::string> kNull;
    if (col_ >= row_.size()) {
      if (status_.ok()) status_ = Status::Error(std::string("store: short row in ") + table_);
      ++col_;
      return kNull;
    }
    return row_[col_++];
  }
  void Bad(const std::string& v) {
    if (status_.ok()) {
      status_ = Status::Error(std::string("store: unreadable value \"") + v + "\" in table " +
                              table_ + ", column " + std::to_string(col_));
    }
  }
  const SqlRow& row_;
  const char* table_;
  size_t col_ = 0;
  Status status_;
};

Status CheckVm(const VmRequirement& vm) {
  if (vm.vm_ip.empty()) return Status::Error("store: VM with an empty vm_ip");
  if (vm.host_ip.empty()) return Status::Error("store: VM " + vm.vm_ip + " has an empty host_ip");
  if (vm.compute_units < 0) {
    return Status::Error("store: VM " + vm.vm_ip + " has negative compute_units");
  }
  if (!std::isfinite(vm.memory_gb) || vm.memory_gb < 0) {
    return Status::Error("store: VM " + vm.vm_ip + " has an invalid memory (GB) value");
  }
  if (vm.gpus < 1) {
    return Status::Error("store: VM " + vm.vm_ip + " asks for " + std::to_string(vm.gpus) +
                         " GPUs; it needs at least 1");
  }
  return Status::Ok();
}

constexpr char kVmColumns[] = "vm_ip, host_ip, compute_units, memory, gpus";
constexpr char kNodeColumns[] =
    "node_id, hostname, address, host_ip, state, mps, registered_ms, last_heartbeat_ms";
constexpr char kGpuColumns[] =
    "uuid, node_id, gpu_index, name, sm_count, memory_bytes, driver_version, cuda_version";
constexpr char kAllocationColumns[] =
    "alloc_id, vm_ip, node_id, gpu_uuid, token, endpoint, state, sm, memory_bytes, created_ms, "
    "updated_ms, last_client_ms, gpu_ordinal";

constexpr char kCheckpointColumns[] = "vm_ip, dir, time_ms, record";

// "col = excluded.col" for each column after the first (the key).
std::string UpdateFromExcluded(const std::string& columns) {
  std::string out;
  size_t start = columns.find(',');
  while (start != std::string::npos) {
    size_t end = columns.find(',', start + 1);
    std::string col = columns.substr(start + 1, end == std::string::npos ? end : end - start - 1);
    col.erase(0, col.find_first_not_of(' '));
    if (!out.empty()) out += ", ";
    out += col + " = excluded." + col;
    start = end;
  }
  return out;
}

std::string Upsert(const char* table, const std::string& columns, const char* key, int rows = 1) {
  int n = static_cast<int>(std::count(columns.begin(), columns.end(), ',')) + 1;
  std::string one = "(";
  for (int i = 0; i < n; ++i) one += i ? ", ?" : "?";
  one += ")";
  std::string sql = std::string("INSERT INTO ") + table + " (" + columns + ") VALUES ";
  for (int r = 0; r < rows; ++r) sql += r ? ", " + one : one;
  sql += std::string(" ON CONFLICT (") + key + ") DO UPDATE SET " + UpdateFromExcluded(columns);
  return sql;
}

void AppendVm(const VmRequirement& vm, std::vector<SqlValue>* params) {
  params->emplace_back(vm.vm_ip);
  params->emplace_back(vm.host_ip);
  params->emplace_back(vm.compute_units);
  params->emplace_back(vm.memory_gb);
  params->emplace_back(vm.gpus);
}

VmRequirement ReadVm(RowReader* r) {
  VmRequirement vm;
  vm.vm_ip = r->Text();
  vm.host_ip = r->Text();
  vm.compute_units = static_cast<int>(r->Int());
  vm.memory_gb = r->Double();
  vm.gpus = static_cast<int>(r->Int());
  return vm;
}

constexpr size_t kVmBatch = 500;  // rows per multi-row INSERT (2,500 parameters)

}  // namespace

// ---- Store -----------------------------------------------------------------

Store::Store(std::unique_ptr<Database> db) : db_(std::move(db)) {}
Store::~Store() = default;

Status Store::Open(const std::string& url, std::unique_ptr<Store>* out) {
  std::unique_ptr<Database> db;
  Status s = Database::Open(url, &db);
  if (!s.ok()) return s;
  std::unique_ptr<Store> store(new Store(std::move(db)));
  s = store->Migrate();
  if (!s.ok()) {
    return Status::Error("database " + RedactUrl(url) + ": migration failed: " + s.message());
  }
  FLYT_INFO("database %s (%s) at schema version %d", RedactUrl(url).c_str(),
            store->db_->dialect().c_str(), store->schema_version_);
  *out = std::move(store);
  return Status::Ok();
}

Status Store::Migrate() {
  const std::string dialect = db_->dialect();
  Status s = db_->Exec(
      "CREATE TABLE IF NOT EXISTS schema_migrations ("
      " version INTEGER PRIMARY KEY,"
      " applied_ms BIGINT NOT NULL)");
  if (!s.ok()) return s;
  auto current_version = [this](int* version) {
    std::vector<SqlRow> rows;
    Status st = db_->Query("SELECT MAX(version) FROM schema_migrations", {}, &rows);
    if (!st.ok()) return st;
    *version = 0;
    if (!rows.empty()) {
      RowReader r(rows[0], "schema_migrations");
      *version = static_cast<int>(r.Int());
      if (!r.status().ok()) return r.status();
    }
    return Status::Ok();
  };
  int version = 0;
  s = current_version(&version);
  if (!s.ok()) return s;
  const int latest = Migrations().back().version;
  if (version > latest) {
    return Status::Error("the database is at schema version " + std::to_string(version) +
                         ", newer than this Flyt knows (" + std::to_string(latest) +
                         "); upgrade Flyt");
  }
  for (const Migration& m : Migrations()) {
    if (m.version <= version) continue;
    Transaction txn(db_.get());
    s = txn.Begin();
    if (!s.ok()) return s;
    if (dialect == "postgresql") {
      // Serialises concurrent migrators (SQLite's BEGIN IMMEDIATE already does).
      s = db_->Exec("LOCK TABLE schema_migrations IN EXCLUSIVE MODE");
      if (!s.ok()) return s;
    }
    int now_version = 0;
    s = current_version(&now_version);
    if (!s.ok()) return s;
    if (now_version >= m.version) {  // another process applied it meanwhile
      version = now_version;
      continue;
    }
    for (const char* stmt : m.statements) {
      s = db_->Exec(ForDialect(stmt, dialect));
      if (!s.ok())
        return Status::Error("migration " + std::to_string(m.version) + ": " + s.message());
    }
    s = db_->Exec("INSERT INTO schema_migrations (version, applied_ms) VALUES (?, ?)",
                  {m.version, NowMs()});
    if (!s.ok()) return s;
    s = txn.Commit();
    if (!s.ok()) return s;
    version = m.version;
    FLYT_INFO("database: applied migration %d (%s)", m.version, m.what);
  }
  schema_version_ = version;
  return Status::Ok();
}

int Store::schema_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return schema_version_;
}

std::string Store::dialect() const {
  std::lock_guard<std::mutex> lock(mu_);
  return db_->dialect();
}

// ---- VMs ---------------------------------------------------------------------

Status Store::UpsertVm(const VmRequirement& vm) {
  Status s = CheckVm(vm);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  return UpsertVmBatch({&vm});
}

Status Store::UpsertVmBatch(const std::vector<const VmRequirement*>& batch) {
  std::vector<SqlValue> params;
  params.reserve(batch.size() * 5);
  for (const VmRequirement* vm : batch) AppendVm(*vm, &params);
  return db_->Exec(
      Upsert("vm_required_resources", kVmColumns, "vm_ip", static_cast<int>(batch.size())), params);
}

Status Store::UpsertVms(const std::vector<VmRequirement>& vms) {
  // Later duplicates win; a multi-row upsert must not name one key twice.
  std::vector<const VmRequirement*> unique;
  std::unordered_map<std::string, size_t> where;
  unique.reserve(vms.size());
  for (const VmRequirement& vm : vms) {
    Status s = CheckVm(vm);
    if (!s.ok()) return s;
    auto [it, inserted] = where.emplace(vm.vm_ip, unique.size());
    if (inserted) {
      unique.push_back(&vm);
    } else {
      unique[it->second] = &vm;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  Status s = txn.Begin();
  if (!s.ok()) return s;
  for (size_t i = 0; i < unique.size(); i += kVmBatch) {
    size_t end = std::min(unique.size(), i + kVmBatch);
    s = UpsertVmBatch(std::vector<const VmRequirement*>(unique.begin() + i, unique.begin() + end));
    if (!s.ok()) return s;
  }
  return txn.Commit();
}

Status Store::RemoveVm(const std::string& vm_ip, bool* existed) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  Status s = db_->Exec("DELETE FROM vm_required_resources WHERE vm_ip = ?", {vm_ip}, &n);
  if (s.ok() && existed) *existed = n > 0;
  return s;
}

Status Store::GetVm(const std::string& vm_ip, VmRequirement* out, bool* found) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SqlRow> rows;
  Status s = db_->Query(
      std::string("SELECT ") + kVmColumns + " FROM vm_required_resources WHERE vm_ip = ?", {vm_ip},
      &rows);
  if (!s.ok()) return s;
  *found = !rows.empty();
  if (!*found) return Status::Ok();
  RowReader r(rows[0], "vm_required_resources");
  VmRequirement vm = ReadVm(&r);
  if (!r.status().ok()) return r.status();
  *out = std::move(vm);
  return Status::Ok();
}

Status Store::ListVms(std::vector<VmRequirement>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SqlRow> rows;
  Status s =
      db_->Query(std::string("SELECT ") + kVmColumns + " FROM vm_required_resources", {}, &rows);
  if (!s.ok()) return s;
  std::vector<VmRequirement> vms;
  vms.reserve(rows.size());
  for (const SqlRow& row : rows) {
    RowReader r(row, "vm_required_resources");
    vms.push_back(ReadVm(&r));
    if (!r.status().ok()) return r.status();
  }
  // Sorted here, not in SQL: PostgreSQL's collation may order text differently.
  std::sort(vms.begin(), vms.end(),
            [](const VmRequirement& a, const VmRequirement& b) { return a.vm_ip < b.vm_ip; });
  *out = std::move(vms);
  return Status::Ok();
}

// ---- nodes and GPUs ------------------------------------------------------------

Status Store::UpsertNode(const Node& node) {
  if (node.node_id.empty()) return Status::Error("store: node with an empty node_id");
  std::lock_guard<std::mutex> lock(mu_);
  return db_->Exec(Upsert("nodes", kNodeColumns, "node_id"),
                   {node.node_id, node.hostname, node.address, node.host_ip, node.state,
                    node.mps ? 1 : 0, node.registered_ms, node.last_heartbeat_ms});
}

Status Store::ListNodes(std::vector<Node>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SqlRow> rows;
  Status s = db_->Query(std::string("SELECT ") + kNodeColumns + " FROM nodes", {}, &rows);
  if (!s.ok()) return s;
  std::vector<Node> nodes;
  nodes.reserve(rows.size());
  for (const SqlRow& row : rows) {
    RowReader r(row, "nodes");
    Node n;
    n.node_id = r.Text();
    n.hostname = r.Text();
    n.address = r.Text();
    n.host_ip = r.Text();
    n.state = r.Text();
    n.mps = r.Int() != 0;
    n.registered_ms = r.Int();
    n.last_heartbeat_ms = r.Int();
    if (!r.status().ok()) return r.status();
    nodes.push_back(std::move(n));
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const Node& a, const Node& b) { return a.node_id < b.node_id; });
  *out = std::move(nodes);
  return Status::Ok();
}

Status Store::ReplaceGpus(const std::string& node_id, const std::vector<Gpu>& gpus) {
  if (node_id.empty()) return Status::Error("store: ReplaceGpus with an empty node_id");
  for (const Gpu& g : gpus) {
    if (g.uuid.empty()) return Status::Error("store: GPU of node " + node_id + " has no uuid");
  }
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  Status s = txn.Begin();
  if (!s.ok()) return s;
  s = db_->Exec("DELETE FROM gpus WHERE node_id = ?", {node_id});
  if (!s.ok()) return s;
  // Upsert by uuid: a GPU that moved from another node is moved here.
  const std::string sql = Upsert("gpus", kGpuColumns, "uuid");
  for (const Gpu& g : gpus) {
    s = db_->Exec(sql, {g.uuid, node_id, g.index, g.name, g.sm_count, g.memory_bytes,
                        g.driver_version, g.cuda_version});
    if (!s.ok()) return s;
  }
  return txn.Commit();
}

Status Store::ListGpus(std::vector<Gpu>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SqlRow> rows;
  Status s = db_->Query(std::string("SELECT ") + kGpuColumns + " FROM gpus", {}, &rows);
  if (!s.ok()) return s;
  std::vector<Gpu> gpus;
  gpus.reserve(rows.size());
  for (const SqlRow& row : rows) {
    RowReader r(row, "gpus");
    Gpu g;
    g.uuid = r.Text();
    g.node_id = r.Text();
    g.index = static_cast<int>(r.Int());
    g.name = r.Text();
    g.sm_count = static_cast<int>(r.Int());
    g.memory_bytes = r.Int();
    g.driver_version = r.Text();
    g.cuda_version = r.Text();
    if (!r.status().ok()) return r.status();
    gpus.push_back(std::move(g));
  }
  std::sort(gpus.begin(), gpus.end(), [](const Gpu& a, const Gpu& b) {
    if (a.node_id != b.node_id) return a.node_id < b.node_id;
    if (a.index != b.index) return a.index < b.index;
    return a.uuid < b.uuid;
  });
  *out = std::move(gpus);
  return Status::Ok();
}

// ---- allocations -------------------------------------------------------------

Status Store::PutAllocation(const Allocation& a) {
  if (a.alloc_id.empty()) return Status::Error("store: allocation with an empty alloc_id");
  std::lock_guard<std::mutex> lock(mu_);
  return db_->Exec(Upsert("allocations", kAllocationColumns, "alloc_id"),
                   {a.alloc_id, a.vm_ip, a.node_id, a.gpu_uuid, a.token, a.endpoint, a.state, a.sm,
                    a.memory_bytes, a.created_ms, a.updated_ms, a.last_client_ms, a.ordinal});
}

Status Store::DeleteAllocation(const std::string& alloc_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return db_->Exec("DELETE FROM allocations WHERE alloc_id = ?", {alloc_id});
}

Status Store::PutCheckpoint(const Checkpoint& c) {
  if (c.vm_ip.empty()) return Status::Error("store: checkpoint with an empty vm_ip");
  std::lock_guard<std::mutex> lock(mu_);
  return db_->Exec(Upsert("checkpoints", kCheckpointColumns, "vm_ip"),
                   {c.vm_ip, c.dir, c.time_ms, c.record});
}

Status Store::DeleteCheckpoint(const std::string& vm_ip) {
  std::lock_guard<std::mutex> lock(mu_);
  return db_->Exec("DELETE FROM checkpoints WHERE vm_ip = ?", {vm_ip});
}

Status Store::ListCheckpoints(std::vector<Checkpoint>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SqlRow> rows;
  Status s = db_->Query(
      std::string("SELECT ") + kCheckpointColumns + " FROM checkpoints ORDER BY vm_ip", {}, &rows);
  if (!s.ok()) return s;
  std::vector<Checkpoint> list;
  for (const SqlRow& row : rows) {
    RowReader r(row, "checkpoints");
    Checkpoint c;
    c.vm_ip = r.Text();
    c.dir = r.Text();
    c.time_ms = r.Int();
    c.record = r.Text();
    if (!r.status().ok()) return r.status();
    list.push_back(std::move(c));
  }
  *out = std::move(list);
  return Status::Ok();
}

Status Store::ListAllocations(std::vector<Allocation>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SqlRow> rows;
  Status s =
      db_->Query(std::string("SELECT ") + kAllocationColumns + " FROM allocations", {}, &rows);
  if (!s.ok()) return s;
  std::vector<Allocation> allocs;
  allocs.reserve(rows.size());
  for (const SqlRow& row : rows) {
    RowReader r(row, "allocations");
    Allocation a;
    a.alloc_id = r.Text();
    a.vm_ip = r.Text();
    a.node_id = r.Text();
    a.gpu_uuid = r.Text();
    a.token = r.Text();
    a.endpoint = r.Text();
    a.state = r.Text();
    a.sm = static_cast<int>(r.Int());
    a.memory_bytes = r.Int();
    a.created_ms = r.Int();
    a.updated_ms = r.Int();
    a.last_client_ms = r.Int();
    a.ordinal = static_cast<int>(r.Int());
    if (!r.status().ok()) return r.status();
    allocs.push_back(std::move(a));
  }
  std::sort(allocs.begin(), allocs.end(),
            [](const Allocation& a, const Allocation& b) { return a.alloc_id < b.alloc_id; });
  *out = std::move(allocs);
  return Status::Ok();
}

// ---- events ------------------------------------------------------------------

Status Store::AddEvent(const std::string& kind, const std::string& subject,
                       const std::string& detail) {
  std::lock_guard<std::mutex> lock(mu_);
  return db_->Exec("INSERT INTO events (time_ms, kind, subject, detail) VALUES (?, ?, ?, ?)",
                   {NowMs(), kind, subject, detail});
}

Status Store::ListEvents(int64_t after_id, int limit, std::vector<Event>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string sql =
      "SELECT id, time_ms, kind, subject, detail FROM events WHERE id > ? ORDER BY id";
  std::vector<SqlValue> params = {after_id};
  if (limit > 0) {
    sql += " LIMIT ?";
    params.emplace_back(limit);
  }
  std::vector<SqlRow> rows;
  Status s = db_->Query(sql, params, &rows);
  if (!s.ok()) return s;
  std::vector<Event> events;
  events.reserve(rows.size());
  for (const SqlRow& row : rows) {
    RowReader r(row, "events");
    Event e;
    e.id = r.Int();
    e.time_ms = r.Int();
    e.kind = r.Text();
    e.subject = r.Text();
    e.detail = r.Text();
    if (!r.status().ok()) return r.status();
    events.push_back(std::move(e));
  }
  *out = std::move(events);
  return Status::Ok();
}

}  // namespace flyt::store
