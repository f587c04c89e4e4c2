// A tiny SQL abstraction over the two databases the cluster manager supports.
//
// Owns: one connection to SQLite (linked in statically) or PostgreSQL (libpq,
// loaded with dlopen at run time so binaries do not need it unless a
// postgresql:// URL is used), positional `?` placeholders (rewritten to $1.. for
// PostgreSQL), transactions, and turning every driver error into a Status.
// Must not know the Flyt schema (store.cc owns that) and must not throw.
//
// A Database is not thread-safe: callers serialise access (Store holds a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace flyt::store {

// One bound parameter: NULL, an integer, a double or text.
class SqlValue {
 public:
  enum class Type { kNull, kInt, kDouble, kText };

  SqlValue() = default;
  SqlValue(std::nullopt_t) {}                               // NOLINT(google-explicit-constructor)
  SqlValue(int v) : type_(Type::kInt), int_(v) {}           // NOLINT
  SqlValue(long v) : type_(Type::kInt), int_(v) {}          // NOLINT
  SqlValue(long long v) : type_(Type::kInt), int_(v) {}     // NOLINT
  SqlValue(double v) : type_(Type::kDouble), double_(v) {}  // NOLINT
  SqlValue(std::string v) : type_(Type::kText), text_(std::move(v)) {}  // NOLINT
  SqlValue(const char* v) : type_(Type::kText), text_(v) {}             // NOLINT

  Type type() const { return type_; }
  int64_t int_value() const { return int_; }
  double double_value() const { return double_; }
  const std::string& text_value() const { return text_; }
  // The value as PostgreSQL's text input format reads it (doubles round-trip).
  std::string ToText() const;

 private:
  Type type_ = Type::kNull;
  int64_t int_ = 0;
  double double_ = 0;
  std::string text_;
};

// One result row: a column is std::nullopt when SQL NULL, else its text form
// (integers in decimal, doubles with enough digits to round-trip).
using SqlRow = std::vector<std::optional<std::string>>;

class Database {
 public:
  virtual ~Database() = default;
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Opens `url`: "sqlite:PATH" ("sqlite:///abs/path" also accepted),
  // "sqlite::memory:", or "postgresql://..." / "postgres://..." (a libpq URI).
  static Status Open(const std::string& url, std::unique_ptr<Database>* out);

  // "sqlite" or "postgresql".
  virtual std::string dialect() const = 0;

  // Runs one statement that returns no rows. *rows_affected (when given)
  // receives the number of rows inserted/updated/deleted.
  Status Exec(const std::string& sql, const std::vector<SqlValue>& params = {},
              int64_t* rows_affected = nullptr) {
    return Run(sql, params, nullptr, rows_affected);
  }
  // Runs one statement; *rows receives its rows (what was there is dropped).
  Status Query(const std::string& sql, const std::vector<SqlValue>& params,
               std::vector<SqlRow>* rows) {
    rows->clear();
    return Run(sql, params, rows, nullptr);
  }

  // Transactions do not nest. After a failed statement inside a transaction
  // call Rollback(); Rollback() without an open transaction is a no-op.
  virtual Status Begin() = 0;
  virtual Status Commit() = 0;
  virtual Status Rollback() = 0;

 protected:
  Database() = default;
  // One statement: rows (when not null) receives what it returns,
  // *rows_affected (when not null) how many rows it changed.
  virtual Status Run(const std::string& sql, const std::vector<SqlValue>& params,
                     std::vector<SqlRow>* rows, int64_t* rows_affected) = 0;
};

// SQLite file (created when missing; its folder must exist) or ":memory:".
// WAL journal, 5 s busy timeout.
Status OpenSqliteDatabase(const std::string& path, std::unique_ptr<Database>* out);

// PostgreSQL through libpq loaded from `libpq_soname` (tests pass a missing
// name to check the error). `conninfo` is a libpq URI or keyword string.
inline constexpr const char* kLibpqSoname = "libpq.so.5";
Status OpenPostgresDatabase(const std::string& conninfo, std::unique_ptr<Database>* out,
                            const char* libpq_soname = kLibpqSoname);

// Rewrites `?` placeholders outside string literals, quoted identifiers and
// comments to $1, $2, ... (PostgreSQL's form). Exposed for tests.
std::string ToDollarPlaceholders(const std::string& sql);

// `url` with any password replaced by "***", for logs and error messages.
std::string RedactUrl(const std::string& url);

}  // namespace flyt::store
