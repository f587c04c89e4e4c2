// VM list import (vm_import.h): MongoDB JSON exports and CSV files, with
// errors that name the file, the line and the field. Must not depend on the
// database (flytctl links this alone).
#include "store/vm_import.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace flyt::store {
namespace {

using Json = nlohmann::json;

class ErrorAt {
 public:
  explicit ErrorAt(const std::string& source) : source_(source) {}
  Status operator()(int line, const std::string& msg) const {
    return Status::Error(source_ + ":" + std::to_string(line) + ": " + msg);
  }
  Status Field(int line, const std::string& field, const std::string& msg) const {
    return (*this)(line, "field " + field + ": " + msg);
  }

 private:
  const std::string& source_;
};

std::string_view TrimSpace(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

std::string Quoted(std::string_view s) {
  constexpr size_t kMax = 60;
  std::string out = "\"";
  out += s.size() > kMax ? std::string(s.substr(0, kMax)) + "..." : std::string(s);
  return out + "\"";
}

// A finite decimal number, the whole string.
bool ParseDouble(std::string_view s, double* out) {
  s = TrimSpace(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  auto res = std::from_chars(s.data(), s.data() + s.size(), *out);
  return res.ec == std::errc() && res.ptr == s.data() + s.size() && std::isfinite(*out);
}

// An integer, or a number with no fractional part ("8", "8.0", "8e0").
bool ParseInteger(std::string_view s, int64_t* out) {
  std::string_view t = TrimSpace(s);
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  auto res = std::from_chars(t.data(), t.data() + t.size(), *out);
  if (!t.empty() && res.ec == std::errc() && res.ptr == t.data() + t.size()) return true;
  double d = 0;
  if (!ParseDouble(s, &d) || d != std::floor(d) || std::fabs(d) > 9.0e18) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

// The text of a number given plainly, as a string, or as MongoDB Extended JSON
// ({"$numberInt":"8"}, {"$numberLong":"8"}, {"$numberDouble":"1.5"},
// {"$numberDecimal":"1.5"}). Returns false with *why set when it is none.
bool NumberText(const Json& v, std::string* text, std::string* why) {
  if (v.is_number()) {
    *text = v.dump();
    return true;
  }
  if (v.is_string()) {
    *text = v.get<std::string>();
    return true;
  }
  if (v.is_object() && v.size() == 1) {
    auto first = v.begin();
    const std::string key = first.key();
    const Json& inner = first.value();
    if (key == "$numberInt" || key == "$numberLong" || key == "$numberDouble" ||
        key == "$numberDecimal") {
      if (inner.is_string() || inner.is_number()) {
        *text = inner.is_string() ? inner.get<std::string>() : inner.dump();
        return true;
      }
      *why = "expected a string inside " + key + ", got " + inner.dump();
      return false;
    }
  }
  *why = "expected a number, got " + v.dump();
  if (why->size() > 120) *why = why->substr(0, 117) + "...";
  return false;
}

// Fields named in the header/document, already extracted as text.
struct RawVm {
  std::string vm_ip, host_ip, compute_units, memory;
  std::string gpus;                     // optional: empty = 1
  std::string memory_field = "memory";  // the name used, for messages
  int vm_ip_line = 0, host_ip_line = 0, compute_units_line = 0, memory_line = 0, gpus_line = 0;
};

Status Convert(const RawVm& raw, const ErrorAt& error, VmRequirement* out) {
  if (TrimSpace(raw.vm_ip).empty()) return error.Field(raw.vm_ip_line, "vm_ip", "is empty");
  if (TrimSpace(raw.host_ip).empty()) {
    return error.Field(raw.host_ip_line, "host_ip", "is empty");
  }
  int64_t units = 0;
  if (!ParseInteger(raw.compute_units, &units)) {
    return error.Field(raw.compute_units_line, "compute_units",
                       "expected a whole number, got " + Quoted(raw.compute_units));
  }
  if (units < 0 || units > INT_MAX) {
    return error.Field(
        raw.compute_units_line, "compute_units",
        "must be between 0 and " + std::to_string(INT_MAX) + ", got " + Quoted(raw.compute_units));
  }
  double memory = 0;
  if (!ParseDouble(raw.memory, &memory)) {
    return error.Field(raw.memory_line, raw.memory_field,
                       "expected a number (GB), got " + Quoted(raw.memory));
  }
  if (memory < 0) {
    return error.Field(raw.memory_line, raw.memory_field,
                       "must be >= 0, got " + Quoted(raw.memory));
  }
  int64_t gpus = 1;
  if (!TrimSpace(raw.gpus).empty()) {
    if (!ParseInteger(raw.gpus, &gpus)) {
      return error.Field(raw.gpus_line, "gpus", "expected a whole number, got " + Quoted(raw.gpus));
    }
    if (gpus < 1 || gpus > INT_MAX) {
      return error.Field(raw.gpus_line, "gpus",
                         "must be at least 1 (GPUs for the VM), got " + Quoted(raw.gpus));
    }
  }
  out->vm_ip = std::string(TrimSpace(raw.vm_ip));
  out->host_ip = std::string(TrimSpace(raw.host_ip));
  out->compute_units = static_cast<int>(units);
  out->memory_gb = memory;
  out->gpus = static_cast<int>(gpus);
  return Status::Ok();
}

// Appends `vm`, refusing a vm_ip seen before.
class Collector {
 public:
  Collector(const ErrorAt& error, std::vector<VmRequirement>* out) : error_(error), out_(out) {}
  Status Add(const RawVm& raw, int line) {
    VmRequirement vm;
    Status s = Convert(raw, error_, &vm);
    if (!s.ok()) return s;
    auto [it, inserted] = seen_.emplace(vm.vm_ip, line);
    if (!inserted) {
      return error_.Field(
          raw.vm_ip_line, "vm_ip",
          Quoted(vm.vm_ip) + " already listed on line " + std::to_string(it->second));
    }
    out_->push_back(std::move(vm));
    return Status::Ok();
  }

 private:
  const ErrorAt& error_;
  std::vector<VmRequirement>* out_;
  std::unordered_map<std::string, int> seen_;
};

// ---- JSON --------------------------------------------------------------------

struct Doc {
  std::string_view text;
  int line;
};

class JsonSplitter {
 public:
  JsonSplitter(std::string_view text, const ErrorAt& error) : text_(text), error_(error) {}

  // A JSON array of documents, or documents one after another (JSON lines).
  Status Split(std::vector<Doc>* docs) {
    SkipSpace();
    const bool array = pos_ < text_.size() && text_[pos_] == '[';
    if (array) {
      ++pos_;
      SkipSpace();
      if (Peek() == ']') {
        ++pos_;
        return Trailing();
      }
    }
    for (;;) {
      SkipSpace();
      if (pos_ >= text_.size()) {
        if (array) return error_(line_, "unexpected end of file: the JSON array is not closed");
        return Status::Ok();
      }
      if (Peek() != '{') {
        return error_(line_, std::string("expected a document ({...}), found '") + Peek() + "'");
      }
      Doc doc;
      Status s = ScanObject(&doc);
      if (!s.ok()) return s;
      docs->push_back(doc);
      if (!array) continue;
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == ']') {
        ++pos_;
        return Trailing();
      }
      if (pos_ >= text_.size()) {
        return error_(line_, "unexpected end of file: the JSON array is not closed");
      }
      return error_(line_,
                    std::string("expected ',' or ']' after a document, found '") + Peek() + "'");
    }
  }

 private:
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void SkipSpace() {
    while (pos_ < text_.size() && std::strchr(" \t\r\n", text_[pos_]) != nullptr) {
      if (text_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }
  Status Trailing() {
    SkipSpace();
    if (pos_ < text_.size()) return error_(line_, "unexpected text after the JSON array");
    return Status::Ok();
  }
  // From '{' to its matching '}', skipping strings.
  Status ScanObject(Doc* doc) {
    const size_t start = pos_;
    const int start_line = line_;
    int depth = 0;
    bool in_string = false;
    for (; pos_ < text_.size(); ++pos_) {
      char c = text_[pos_];
      if (c == '\n') ++line_;
      if (in_string) {
        if (c == '\\') {
          ++pos_;
        } else if (c == '"') {
          in_string = false;
        }
        continue;
      }
      if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) {
          ++pos_;
          doc->text = text_.substr(start, pos_ - start);
          doc->line = start_line;
          return Status::Ok();
        }
      }
    }
    return error_(start_line, "unexpected end of file inside the document that starts here");
  }

  std::string_view text_;
  const ErrorAt& error_;
  size_t pos_ = 0;
  int line_ = 1;
};

int LineOfByte(const Doc& doc, size_t byte) {
  byte = std::min(byte, doc.text.size());
  int line = doc.line;
  for (size_t i = 0; i < byte; ++i) line += doc.text[i] == '\n';
  return line;
}

// The line where `"field"` is written as a key in `doc` (its start line if not found).
int LineOfField(const Doc& doc, const std::string& field) {
  const std::string key = "\"" + field + "\"";
  size_t pos = 0;
  while ((pos = doc.text.find(key, pos)) != std::string_view::npos) {
    size_t after = pos + key.size();
    while (after < doc.text.size() && std::strchr(" \t\r\n", doc.text[after])) ++after;
    if (after < doc.text.size() && doc.text[after] == ':') return LineOfByte(doc, pos);
    pos = after;
  }
  return doc.line;
}

Status ParseDoc(const Doc& doc, const ErrorAt& error, Collector* collector) {
  Json j;
  try {
    j = Json::parse(doc.text);
  } catch (const Json::parse_error& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 1, column 9: <why>"
    std::string why = e.what();
    size_t col = why.find("column ");
    size_t colon = col == std::string::npos ? col : why.find(": ", col);
    if (colon != std::string::npos) why = why.substr(colon + 2);
    return error(LineOfByte(doc, e.byte > 0 ? e.byte - 1 : 0), "invalid JSON: " + why);
  }
  if (!j.is_object()) return error(doc.line, "expected a document ({...})");
  RawVm raw;
  struct Want {
    const char* name;
    std::string* text;
    int* line;
    bool number;
  };
  const bool has_memory = j.contains("memory");
  if (has_memory && j.contains("memory_gb")) {
    return error.Field(LineOfField(doc, "memory_gb"), "memory_gb",
                       "give either memory or memory_gb, not both");
  }
  if (!has_memory && j.contains("memory_gb")) raw.memory_field = "memory_gb";
  const Want wants[] = {
      {"vm_ip", &raw.vm_ip, &raw.vm_ip_line, false},
      {"host_ip", &raw.host_ip, &raw.host_ip_line, false},
      {"compute_units", &raw.compute_units, &raw.compute_units_line, true},
      {raw.memory_field.c_str(), &raw.memory, &raw.memory_line, true},
  };
  for (const Want& w : wants) {
    *w.line = LineOfField(doc, w.name);
    auto it = j.find(w.name);
    if (it == j.end()) return error.Field(doc.line, w.name, "missing from the document");
    if (w.number) {
      std::string why;
      if (!NumberText(*it, w.text, &why)) return error.Field(*w.line, w.name, why);
    } else {
      if (!it->is_string()) {
        return error.Field(*w.line, w.name, "expected a string, got " + it->dump());
      }
      *w.text = it->get<std::string>();
    }
  }
  if (auto it = j.find("gpus"); it != j.end()) {  // optional; absent = 1
    raw.gpus_line = LineOfField(doc, "gpus");
    std::string why;
    if (!NumberText(*it, &raw.gpus, &why)) return error.Field(raw.gpus_line, "gpus", why);
  }
  return collector->Add(raw, doc.line);
}

Status ParseJson(std::string_view text, const ErrorAt& error, std::vector<VmRequirement>* out) {
  std::vector<Doc> docs;
  Status s = JsonSplitter(text, error).Split(&docs);
  if (!s.ok()) return s;
  Collector collector(error, out);
  for (const Doc& doc : docs) {
    s = ParseDoc(doc, error, &collector);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// ---- CSV ---------------------------------------------------------------------

struct Record {
  std::vector<std::string> fields;
  int line = 0;
};

// RFC 4180: comma separated, fields optionally in double quotes ("" = one
// quote, newlines allowed inside quotes); unquoted fields are trimmed.
class CsvReader {
 public:
  CsvReader(std::string_view text, const ErrorAt& error) : text_(text), error_(error) {}
  bool done() const { return pos_ >= text_.size(); }

  Status Next(Record* rec) {
    rec->fields.clear();
    rec->line = line_;
    for (;;) {
      std::string field;
      // Leading blanks before an opening quote are allowed.
      size_t p = pos_;
      while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
      if (p < text_.size() && text_[p] == '"') {
        const int quote_line = line_;
        pos_ = p + 1;
        for (;;) {
          if (pos_ >= text_.size()) {
            return error_(quote_line, "unterminated quoted field (missing closing \")");
          }
          char c = text_[pos_++];
          if (c == '"') {
            if (pos_ < text_.size() && text_[pos_] == '"') {
              field += '"';
              ++pos_;
              continue;
            }
            break;
          }
          if (c == '\n') ++line_;
          field += c;
        }
        while (pos_ < text_.size() &&
               (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) {
          ++pos_;
        }
        if (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != '\n') {
          return error_(line_, "unexpected text after a closing quote (field " +
                                   std::to_string(rec->fields.size() + 1) + ")");
        }
      } else {
        size_t end = text_.find_first_of(",\n", pos_);
        if (end == std::string_view::npos) end = text_.size();
        std::string_view raw = text_.substr(pos_, end - pos_);
        if (raw.find('"') != std::string_view::npos) {
          return error_(line_, "stray \" in unquoted field " +
                                   std::to_string(rec->fields.size() + 1) +
                                   " (quote the whole field and double inner quotes)");
        }
        field = std::string(TrimSpace(raw));
        pos_ = end;
      }
      rec->fields.push_back(std::move(field));
      if (pos_ >= text_.size()) return Status::Ok();
      char sep = text_[pos_++];
      if (sep == '\n') {
        ++line_;
        return Status::Ok();
      }
    }
  }

 private:
  std::string_view text_;
  const ErrorAt& error_;
  size_t pos_ = 0;
  int line_ = 1;
};

bool BlankRecord(const Record& rec) { return rec.fields.size() == 1 && rec.fields[0].empty(); }

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Status ParseCsv(std::string_view text, const ErrorAt& error, std::vector<VmRequirement>* out) {
  CsvReader reader(text, error);
  Record header;
  do {
    Status s = reader.Next(&header);
    if (!s.ok()) return s;
  } while (BlankRecord(header) && !reader.done());
  if (BlankRecord(header)) return error(header.line, "no CSV header row");
  std::unordered_map<std::string, size_t> column;
  for (size_t i = 0; i < header.fields.size(); ++i) {
    std::string name = Lower(header.fields[i]);
    if (name.empty()) continue;
    if (!column.emplace(name, i).second) {
      return error(header.line, "CSV header names column " + name + " twice");
    }
  }
  if (column.count("memory") && column.count("memory_gb")) {
    return error(header.line, "CSV header has both memory and memory_gb; keep one");
  }
  const std::string memory_name = column.count("memory_gb") ? "memory_gb" : "memory";
  for (const std::string& need :
       {std::string("vm_ip"), std::string("host_ip"), std::string("compute_units"), memory_name}) {
    if (!column.count(need)) {
      std::string found;
      for (const std::string& f : header.fields) found += (found.empty() ? "" : ", ") + f;
      return error(header.line,
                   "CSV header lacks column " + need +
                       " (needs vm_ip, host_ip, compute_units, memory; found: " + found + ")");
    }
  }
  Collector collector(error, out);
  while (!reader.done()) {
    Record rec;
    Status s = reader.Next(&rec);
    if (!s.ok()) return s;
    if (BlankRecord(rec)) continue;
    if (rec.fields.size() != header.fields.size()) {
      return error(rec.line, "expected " + std::to_string(header.fields.size()) +
                                 " fields as in the header, found " +
                                 std::to_string(rec.fields.size()));
    }
    RawVm raw;
    raw.vm_ip = rec.fields[column["vm_ip"]];
    raw.host_ip = rec.fields[column["host_ip"]];
    raw.compute_units = rec.fields[column["compute_units"]];
    raw.memory = rec.fields[column[memory_name]];
    raw.memory_field = memory_name;
    if (column.count("gpus")) raw.gpus = rec.fields[column["gpus"]];
    raw.vm_ip_line = raw.host_ip_line = raw.compute_units_line = raw.memory_line = rec.line;
    raw.gpus_line = rec.line;
    s = collector.Add(raw, rec.line);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

Status ParseVmText(const std::string& text, const std::string& source,
                   std::vector<VmRequirement>* out) {
  ErrorAt error(source);
  std::string_view body(text);
  if (body.substr(0, 3) == "\xEF\xBB\xBF") body.remove_prefix(3);  // UTF-8 BOM
  size_t first = body.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) {
    return Status::Error(source +
                         ": empty file (expected a MongoDB JSON export or a CSV file with a "
                         "header row)");
  }
  std::vector<VmRequirement> vms;
  Status s = (body[first] == '[' || body[first] == '{') ? ParseJson(body, error, &vms)
                                                        : ParseCsv(body, error, &vms);
  if (!s.ok()) return s;
  *out = std::move(vms);
  return Status::Ok();
}

Status ParseVmFile(const std::string& path, std::vector<VmRequirement>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Status::Error("cannot read " + path + ": " + std::strerror(errno));
  return ParseVmText(buf.str(), path, out);
}

}  // namespace flyt::store
