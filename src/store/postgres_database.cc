// PostgreSQL backend of the SQL abstraction (sql_database.h).
//
// Owns: loading libpq.so.5 at run time (dlopen; libpq-fe.h gives only the
// prototypes, nothing links libpq), one connection, `?` -> $n rewriting, and
// connection-loss handling: outside a transaction a statement whose connection
// dropped is retried once after one reconnect; inside a transaction the loss is
// reported (the server has rolled the transaction back). Must not know the
// Flyt schema and must not serialise callers itself (Store does).
#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include <libpq-fe.h>

#include "common/log.h"
#include "store/sql_database.h"

namespace flyt::store {
namespace {

// The libpq entry points Flyt uses, resolved with dlsym.
struct Libpq {
  decltype(&::PQconnectdb) connectdb = nullptr;
  decltype(&::PQstatus) status = nullptr;
  decltype(&::PQerrorMessage) error_message = nullptr;
  decltype(&::PQfinish) finish = nullptr;
  decltype(&::PQreset) reset = nullptr;
  decltype(&::PQexecParams) exec_params = nullptr;
  decltype(&::PQresultStatus) result_status = nullptr;
  decltype(&::PQresultErrorMessage) result_error_message = nullptr;
  decltype(&::PQntuples) ntuples = nullptr;
  decltype(&::PQnfields) nfields = nullptr;
  decltype(&::PQgetvalue) getvalue = nullptr;
  decltype(&::PQgetisnull) getisnull = nullptr;
  decltype(&::PQgetlength) getlength = nullptr;
  decltype(&::PQcmdTuples) cmd_tuples = nullptr;
  decltype(&::PQclear) clear = nullptr;
  decltype(&::PQtransactionStatus) transaction_status = nullptr;
  decltype(&::PQsetNoticeProcessor) set_notice_processor = nullptr;
  decltype(&::PQserverVersion) server_version = nullptr;
};

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *fn != nullptr;
}

// Loads `soname` once per process (the handle is never closed).
Status LoadLibpq(const char* soname, std::shared_ptr<const Libpq>* out) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Libpq>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(soname);
  if (it != loaded.end()) {
    *out = it->second;
    return Status::Ok();
  }
  void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return Status::Error(std::string("PostgreSQL support needs ") + soname +
                         " (apt-get install libpq5): " + (err ? err : "dlopen failed"));
  }
  auto pq = std::make_shared<Libpq>();
  std::string missing;
  Resolve(handle, "PQconnectdb", &pq->connectdb, &missing);
  Resolve(handle, "PQstatus", &pq->status, &missing);
  Resolve(handle, "PQerrorMessage", &pq->error_message, &missing);
  Resolve(handle, "PQfinish", &pq->finish, &missing);
  Resolve(handle, "PQreset", &pq->reset, &missing);
  Resolve(handle, "PQexecParams", &pq->exec_params, &missing);
  Resolve(handle, "PQresultStatus", &pq->result_status, &missing);
  Resolve(handle, "PQresultErrorMessage", &pq->result_error_message, &missing);
  Resolve(handle, "PQntuples", &pq->ntuples, &missing);
  Resolve(handle, "PQnfields", &pq->nfields, &missing);
  Resolve(handle, "PQgetvalue", &pq->getvalue, &missing);
  Resolve(handle, "PQgetisnull", &pq->getisnull, &missing);
  Resolve(handle, "PQgetlength", &pq->getlength, &missing);
  Resolve(handle, "PQcmdTuples", &pq->cmd_tuples, &missing);
  Resolve(handle, "PQclear", &pq->clear, &missing);
  Resolve(handle, "PQtransactionStatus", &pq->transaction_status, &missing);
  Resolve(handle, "PQsetNoticeProcessor", &pq->set_notice_processor, &missing);
  Resolve(handle, "PQserverVersion", &pq->server_version, &missing);
  if (!missing.empty()) {
    dlclose(handle);
    return Status::Error(std::string(soname) + " lacks " + missing +
                         "; PostgreSQL support needs libpq.so.5 (apt-get install libpq5)");
  }
  loaded.emplace(soname, pq);
  *out = std::move(pq);
  return Status::Ok();
}

// libpq messages end in newlines and may span lines: make them one line.
std::string Trim(const std::string& in) {
  std::string s;
  for (char c : in) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    if (c == ' ' && (s.empty() || s.back() == ' ')) continue;
    s += c;
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string Abbrev(const std::string& sql) {
  constexpr size_t kMax = 100;
  return sql.size() <= kMax ? sql : sql.substr(0, kMax) + "...";
}

void OnNotice(void*, const char* message) {
  FLYT_DEBUG("postgresql: %s", Trim(message ? message : "").c_str());
}

class PostgresDatabase final : public Database {
 public:
  PostgresDatabase(std::shared_ptr<const Libpq> pq, PGconn* conn)
      : pq_(std::move(pq)), conn_(conn) {
    pq_->set_notice_processor(conn_, OnNotice, nullptr);
  }
  ~PostgresDatabase() override { pq_->finish(conn_); }

  std::string dialect() const override { return "postgresql"; }

  Status Begin() override {
    if (in_txn_) return Status::Error("postgresql: transaction already open");
    Status s = Run("BEGIN", {}, nullptr, nullptr);
    if (s.ok()) in_txn_ = true;
    return s;
  }
  Status Commit() override {
    if (!in_txn_) return Status::Error("postgresql: COMMIT without a transaction");
    Status s = Run("COMMIT", {}, nullptr, nullptr);
    in_txn_ = false;
    return s;
  }
  Status Rollback() override {
    bool was_open = in_txn_;
    in_txn_ = false;
    if (pq_->status(conn_) != CONNECTION_OK) return Status::Ok();  // the server dropped it
    if (!was_open && pq_->transaction_status(conn_) == PQTRANS_IDLE) return Status::Ok();
    return Run("ROLLBACK", {}, nullptr, nullptr);
  }

 private:
  Status Reconnect() {
    pq_->reset(conn_);
    if (pq_->status(conn_) != CONNECTION_OK) {
      return Status::Error("PostgreSQL connection lost and reconnecting failed: " +
                           Trim(pq_->error_message(conn_)));
    }
    pq_->set_notice_processor(conn_, OnNotice, nullptr);
    FLYT_WARN("postgresql: reconnected after a lost connection");
    return Status::Ok();
  }

  Status Run(const std::string& sql, const std::vector<SqlValue>& params, std::vector<SqlRow>* rows,
             int64_t* rows_affected) override {
    const std::string pg_sql = ToDollarPlaceholders(sql);
    std::vector<std::string> texts(params.size());
    std::vector<const char*> values(params.size(), nullptr);
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].type() == SqlValue::Type::kNull) continue;
      texts[i] = params[i].ToText();
      values[i] = texts[i].c_str();
    }
    bool reconnected = false;  // at most one reconnect per call
    for (;;) {
      if (pq_->status(conn_) != CONNECTION_OK) {
        if (in_txn_) {
          in_txn_ = false;
          return Status::Error("PostgreSQL connection lost inside a transaction (rolled back)");
        }
        if (reconnected) return Status::Error("PostgreSQL connection lost");
        reconnected = true;
        Status s = Reconnect();
        if (!s.ok()) return s;
      }
      PGresult* res = pq_->exec_params(conn_, pg_sql.c_str(), static_cast<int>(params.size()),
                                       nullptr, values.data(), nullptr, nullptr, 0);
      ExecStatusType st = res ? pq_->result_status(res) : PGRES_FATAL_ERROR;
      if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        if (rows) Collect(res, rows);
        if (rows_affected) {
          const char* n = pq_->cmd_tuples(res);
          *rows_affected = (n && *n) ? std::strtoll(n, nullptr, 10) : 0;
        }
        pq_->clear(res);
        return Status::Ok();
      }
      std::string msg = Trim(res ? pq_->result_error_message(res) : pq_->error_message(conn_));
      if (msg.empty()) msg = Trim(pq_->error_message(conn_));
      if (res) pq_->clear(res);
      if (pq_->status(conn_) != CONNECTION_OK) {
        if (in_txn_) {
          in_txn_ = false;
          return Status::Error(
              "PostgreSQL connection lost inside a transaction (the server rolled it back): " +
              msg);
        }
        if (!reconnected) {
          FLYT_WARN("postgresql: connection lost (%s); reconnecting once", msg.c_str());
          continue;
        }
        return Status::Error("PostgreSQL connection lost: " + msg);
      }
      return Status::Error("postgresql: " + msg + " (in: " + Abbrev(sql) + ")");
    }
  }

  void Collect(PGresult* res, std::vector<SqlRow>* rows) {
    int n = pq_->ntuples(res);
    int cols = pq_->nfields(res);
    rows->reserve(rows->size() + n);
    for (int r = 0; r < n; ++r) {
      SqlRow row;
      row.reserve(cols);
      for (int c = 0; c < cols; ++c) {
        if (pq_->getisnull(res, r, c)) {
          row.emplace_back(std::nullopt);
        } else {
          row.emplace_back(std::string(pq_->getvalue(res, r, c), pq_->getlength(res, r, c)));
        }
      }
      rows->push_back(std::move(row));
    }
  }

  std::shared_ptr<const Libpq> pq_;
  PGconn* conn_;
  bool in_txn_ = false;
};

}  // namespace

Status OpenPostgresDatabase(const std::string& conninfo, std::unique_ptr<Database>* out,
                            const char* libpq_soname) {
  std::shared_ptr<const Libpq> pq;
  Status s = LoadLibpq(libpq_soname, &pq);
  if (!s.ok()) return s;
  PGconn* conn = pq->connectdb(conninfo.c_str());
  if (conn == nullptr) return Status::Error("postgresql: out of memory creating a connection");
  if (pq->status(conn) != CONNECTION_OK) {
    std::string msg = Trim(pq->error_message(conn));
    pq->finish(conn);
    return Status::Error("cannot connect to PostgreSQL at " + RedactUrl(conninfo) + ": " + msg);
  }
  FLYT_DEBUG("connected to PostgreSQL %d at %s", pq->server_version(conn),
             RedactUrl(conninfo).c_str());
  *out = std::make_unique<PostgresDatabase>(std::move(pq), conn);
  return Status::Ok();
}

}  // namespace flyt::store
