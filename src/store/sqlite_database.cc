// SQLite backend of the SQL abstraction (sql_database.h).
//
// Owns: one sqlite3 connection (SQLite is linked in statically: GPU hosts may
// lack libsqlite3), its pragmas (WAL journal, busy timeout) and a small cache of
// prepared statements. Must not know the Flyt schema and must not serialise
// callers itself (Store does).
#include <sys/stat.h>

#include <charconv>
#include <unordered_map>

#include <sqlite3.h>

#include "common/log.h"
#include "store/sql_database.h"

namespace flyt::store {
namespace {

constexpr int kBusyTimeoutMs = 5000;
constexpr size_t kMaxCachedStatements = 64;

std::string Abbrev(const std::string& sql) {
  constexpr size_t kMax = 100;
  return sql.size() <= kMax ? sql : sql.substr(0, kMax) + "...";
}

class SqliteDatabase final : public Database {
 public:
  explicit SqliteDatabase(sqlite3* db) : db_(db) {}
  ~SqliteDatabase() override {
    ClearCache();
    sqlite3_close_v2(db_);
  }

  std::string dialect() const override { return "sqlite"; }

  Status Begin() override { return Simple("BEGIN IMMEDIATE"); }
  Status Commit() override { return Simple("COMMIT"); }
  Status Rollback() override {
    if (sqlite3_get_autocommit(db_)) return Status::Ok();  // nothing open
    return Simple("ROLLBACK");
  }

 private:
  Status Error(const std::string& what, const std::string& sql) const {
    return Status::Error("sqlite: " + what + ": " + sqlite3_errmsg(db_) + " (in: " + Abbrev(sql) +
                         ")");
  }

  Status Simple(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : sqlite3_errmsg(db_);
      sqlite3_free(err);
      return Status::Error(std::string("sqlite: ") + sql + ": " + msg);
    }
    return Status::Ok();
  }

  void ClearCache() {
    for (auto& [sql, stmt] : cache_) sqlite3_finalize(stmt);
    cache_.clear();
  }

  Status Prepare(const std::string& sql, sqlite3_stmt** out) {
    auto it = cache_.find(sql);
    if (it != cache_.end()) {
      *out = it->second;
      return Status::Ok();
    }
    sqlite3_stmt* stmt = nullptr;
    const char* tail = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), static_cast<int>(sql.size()), &stmt, &tail) !=
        SQLITE_OK) {
      return Error("prepare", sql);
    }
    if (stmt == nullptr) return Status::Error("sqlite: empty statement");
    for (const char* p = tail; p && *p; ++p) {
      if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r' && *p != ';') {
        sqlite3_finalize(stmt);
        return Status::Error("sqlite: more than one statement in: " + Abbrev(sql));
      }
    }
    if (cache_.size() >= kMaxCachedStatements) ClearCache();
    cache_.emplace(sql, stmt);
    *out = stmt;
    return Status::Ok();
  }

  Status Bind(sqlite3_stmt* stmt, const std::vector<SqlValue>& params, const std::string& sql) {
    int expected = sqlite3_bind_parameter_count(stmt);
    if (expected != static_cast<int>(params.size())) {
      return Status::Error("sqlite: statement wants " + std::to_string(expected) +
                           " parameters, got " + std::to_string(params.size()) +
                           " (in: " + Abbrev(sql) + ")");
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const SqlValue& v = params[i];
      int idx = static_cast<int>(i) + 1;
      int rc = SQLITE_OK;
      switch (v.type()) {
        case SqlValue::Type::kNull:
          rc = sqlite3_bind_null(stmt, idx);
          break;
        case SqlValue::Type::kInt:
          rc = sqlite3_bind_int64(stmt, idx, v.int_value());
          break;
        case SqlValue::Type::kDouble:
          rc = sqlite3_bind_double(stmt, idx, v.double_value());
          break;
        case SqlValue::Type::kText:
          rc = sqlite3_bind_text(stmt, idx, v.text_value().data(),
                                 static_cast<int>(v.text_value().size()), SQLITE_TRANSIENT);
          break;
      }
      if (rc != SQLITE_OK) return Error("bind", sql);
    }
    return Status::Ok();
  }

  static std::optional<std::string> Column(sqlite3_stmt* stmt, int i) {
    switch (sqlite3_column_type(stmt, i)) {
      case SQLITE_NULL:
        return std::nullopt;
      case SQLITE_INTEGER:
        return std::to_string(static_cast<int64_t>(sqlite3_column_int64(stmt, i)));
      case SQLITE_FLOAT: {
        char buf[40];
        auto res = std::to_chars(buf, buf + sizeof(buf), sqlite3_column_double(stmt, i));
        return std::string(buf, res.ptr);
      }
      default: {
        const void* data = sqlite3_column_blob(stmt, i);
        int len = sqlite3_column_bytes(stmt, i);
        return data ? std::string(static_cast<const char*>(data), len) : std::string();
      }
    }
  }

  Status Run(const std::string& sql, const std::vector<SqlValue>& params, std::vector<SqlRow>* rows,
             int64_t* rows_affected) override {
    sqlite3_stmt* stmt = nullptr;
    Status s = Prepare(sql, &stmt);
    if (!s.ok()) return s;
    struct Reset {
      sqlite3_stmt* stmt;
      ~Reset() {
        sqlite3_reset(stmt);
        sqlite3_clear_bindings(stmt);
      }
    } reset{stmt};
    s = Bind(stmt, params, sql);
    if (!s.ok()) return s;
    int columns = sqlite3_column_count(stmt);
    for (;;) {
      int rc = sqlite3_step(stmt);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return Error("step", sql);
      if (rows == nullptr) continue;
      SqlRow row;
      row.reserve(columns);
      for (int i = 0; i < columns; ++i) row.push_back(Column(stmt, i));
      rows->push_back(std::move(row));
    }
    if (rows_affected) *rows_affected = sqlite3_changes64(db_);
    return Status::Ok();
  }

  sqlite3* db_;
  std::unordered_map<std::string, sqlite3_stmt*> cache_;
};

std::string ParentDir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Status OpenSqliteDatabase(const std::string& path, std::unique_ptr<Database>* out) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    std::string hint;
    struct stat st;
    if (path != ":memory:" && stat(ParentDir(path).c_str(), &st) != 0) {
      hint = " (folder " + ParentDir(path) + " does not exist; create it first)";
    }
    return Status::Error("cannot open SQLite database " + path + ": " + msg + hint);
  }
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  auto sqlite = std::make_unique<SqliteDatabase>(db);
  std::vector<SqlRow> rows;
  Status s = sqlite->Query("PRAGMA journal_mode=WAL", {}, &rows);
  if (!s.ok()) return Status::Error("cannot use SQLite database " + path + ": " + s.message());
  std::string mode = !rows.empty() && !rows[0].empty() && rows[0][0] ? *rows[0][0] : "?";
  if (mode != "wal" && mode != "memory") {
    FLYT_WARN("SQLite database %s: journal mode is %s, not wal", path.c_str(), mode.c_str());
  }
  // WAL + synchronous=NORMAL: a commit survives a crash of this process and
  // costs no disk flush (the last commits can be lost only on power loss).
  // (bench/control_scale.cc: the allocate path had 0.8-12 ms p99 with FULL.)
  s = sqlite->Exec("PRAGMA synchronous=NORMAL", {});
  if (!s.ok()) return Status::Error("cannot use SQLite database " + path + ": " + s.message());
  FLYT_DEBUG("opened SQLite database %s (SQLite %s, journal %s)", path.c_str(),
             sqlite3_libversion(), mode.c_str());
  *out = std::move(sqlite);
  return Status::Ok();
}

}  // namespace flyt::store
