// Backend-independent parts of the SQL abstraction: parameter text forms, URL
// dispatch, placeholder rewriting and password redaction. Must not call any
// driver (sqlite_database.cc and postgres_database.cc own those).
#include "store/sql_database.h"

#include <charconv>

namespace flyt::store {

std::string SqlValue::ToText() const {
  switch (type_) {
    case Type::kNull:
      return std::string();
    case Type::kInt:
      return std::to_string(int_);
    case Type::kDouble: {
      // Shortest form that reads back to the same double, whatever the locale.
      char buf[40];
      auto res = std::to_chars(buf, buf + sizeof(buf), double_);
      return std::string(buf, res.ptr);
    }
    case Type::kText:
      return text_;
  }
  return std::string();
}

namespace {

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

Status Database::Open(const std::string& url, std::unique_ptr<Database>* out) {
  if (StartsWith(url, "sqlite:")) {
    std::string path = url.substr(7);
    // "sqlite:///abs/path" (URL style) means "/abs/path".
    if (StartsWith(path, "//")) path = path.substr(2);
    if (path.empty()) return Status::Error("database URL \"" + url + "\" names no file");
    return OpenSqliteDatabase(path, out);
  }
  if (StartsWith(url, "postgresql://") || StartsWith(url, "postgres://")) {
    return OpenPostgresDatabase(url, out);
  }
  return Status::Error("unknown database URL \"" + RedactUrl(url) +
                       "\": expected sqlite:PATH, sqlite::memory: or postgresql://...");
}

std::string ToDollarPlaceholders(const std::string& sql) {
  std::string out;
  out.reserve(sql.size() + 16);
  int next = 1;
  size_t i = 0;
  const size_t n = sql.size();
  while (i < n) {
    char c = sql[i];
    if (c == '\'' || c == '"') {
      // Literal or quoted identifier; a doubled quote is an escaped quote.
      size_t j = i + 1;
      while (j < n) {
        if (sql[j] == c) {
          if (j + 1 < n && sql[j + 1] == c) {
            j += 2;
            continue;
          }
          break;
        }
        ++j;
      }
      size_t end = j < n ? j + 1 : n;
      out.append(sql, i, end - i);
      i = end;
    } else if (c == '-' && i + 1 < n && sql[i + 1] == '-') {
      size_t j = sql.find('\n', i);
      size_t end = j == std::string::npos ? n : j;
      out.append(sql, i, end - i);
      i = end;
    } else if (c == '/' && i + 1 < n && sql[i + 1] == '*') {
      size_t j = sql.find("*/", i + 2);
      size_t end = j == std::string::npos ? n : j + 2;
      out.append(sql, i, end - i);
      i = end;
    } else if (c == '?') {
      out += '$';
      out += std::to_string(next++);
      ++i;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::string RedactUrl(const std::string& url) {
  std::string s = url;
  // scheme://user:password@host...
  size_t scheme = s.find("://");
  if (scheme != std::string::npos) {
    size_t start = scheme + 3;
    size_t authority_end = s.find_first_of("/?#", start);
    if (authority_end == std::string::npos) authority_end = s.size();
    size_t at = s.rfind('@', authority_end);
    if (at != std::string::npos && at > start) {
      size_t colon = s.find(':', start);
      if (colon != std::string::npos && colon < at) {
        s.replace(colon + 1, at - colon - 1, "***");
      }
    }
  }
  // ?password=... or keyword form password=...
  size_t pos = 0;
  while ((pos = s.find("password=", pos)) != std::string::npos) {
    size_t value = pos + 9;
    size_t end = s.find_first_of("& \t", value);
    if (end == std::string::npos) end = s.size();
    s.replace(value, end - value, "***");
    pos = value + 3;
  }
  return s;
}

}  // namespace flyt::store
