// flytctl: the operator's command line for a Flyt cluster.
//
// Owns: the verbs of docs/control_plane.md ("flytctl → cluster manager") as a
// command line, their option parsing and help, and the human rendering of the
// cluster manager's answers (aligned tables, memory in GiB). --json prints the
// raw answer for scripts. Must not decide anything itself: every verb is one
// request to the cluster manager (vm import parses its file here first).
//
// Exit status: 0 done, 1 the request failed (the reason is on stderr), 2 bad
// command line.
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "control/channel.h"
#include "control/config.h"
#include "store/vm_import.h"
#include "transport/transport.h"

namespace flyt {
namespace {

using control::Json;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// ---------------------------------------------------------------------------
// Verbs and their help.

struct VerbHelp {
  const char* name;
  const char* synopsis;  // after "flytctl NAME"
  const char* summary;
};

const VerbHelp kVerbs[] = {
    {"list-vms", "", "VMs with their required resources and current allocation"},
    {"list-nodes", "", "GPU nodes, their GPUs and how much of each is in use"},
    {"list-servers", "", "running flyt-servers (allocations) and their usage"},
    {"list-events", "[--limit N]", "the most recent cluster events (default 50)"},
    {"show", "VM_IP|NODE_ID|ALLOC_ID", "everything known about one VM, node or allocation"},
    {"change-config", "--vm IP [--sm N] [--memory GB]",
     "set a VM's SM count and/or memory (GiB); applied live to a running server"},
    {"inc-resources", "--vm IP [--sm N] [--memory GB]", "add SMs and/or memory (GiB) to a VM"},
    {"dec-resources", "--vm IP [--sm N] [--memory GB]", "take SMs and/or memory (GiB) from a VM"},
    {"drain-node", "NODE_ID [--no-migrate]",
     "place nothing new on a node and move its VMs to other nodes (--no-migrate: they stay)"},
    {"undrain-node", "NODE_ID", "let a drained node take new allocations again"},
    {"vm", "add --vm IP --host IP --sm N --memory GB [--gpus N] | remove IP | import FILE",
     "add, remove or bulk-import VM requirements (FILE: MongoDB export JSON or CSV)"},
    {"allocate", "--vm IP", "start a VM's flyt-server now (as its first client would)"},
    {"deallocate", "--vm IP", "stop a VM's flyt-server and free its share"},
    {"migrate", "--vm IP --to NODE[/GPU] [--wait-ms N]",
     "move a running VM's servers and their processes to another node (all or nothing)"},
    {"checkpoint", "--vm IP --to PATH [--leave-running] [--wait-ms N]",
     "write the GPU state of every process of a VM to PATH on its node(s)"},
    {"restore", "--vm IP [--from PATH] [--node NODE[/GPU]] [--wait-ms N]",
     "restore a VM's checkpoint, where it was taken or on another node; its processes go on"},
    {"migrate-auto", "[--dry-run]",
     "move one VM off the most loaded node to where it lowers the peak load"},
};

// Original Flyt's verb names.
const std::map<std::string, std::string> kAliases = {
    {"list-servernodes", "list-nodes"},
    {"list-virt-servers", "list-servers"},
};

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: flytctl [GLOBAL OPTIONS] VERB [OPTIONS]\n"
               "\n"
               "verbs:\n");
  for (const VerbHelp& v : kVerbs) {
    std::fprintf(out, "  %-15s %s\n", v.name, v.summary);
  }
  std::fprintf(out,
               "  (list-servernodes and list-virt-servers are aliases of list-nodes and\n"
               "   list-servers)\n"
               "\n"
               "global options (before or after the verb):\n"
               "  --cluster-manager ADDR  the cluster manager, HOST:PORT (default:\n"
               "                          $FLYT_CLUSTER_MANAGER, else `cluster_manager` of\n"
               "                          section [flytctl] of the config file,\n"
               "                          else 127.0.0.1:12400)\n"
               "  --config FILE           config file (default $FLYT_CONFIG, else\n"
               "                          /etc/flyt/flyt.toml when it exists)\n"
               "  --secret S              the cluster's shared secret (default $FLYT_SECRET,\n"
               "                          else `secret`, else the contents of `secret_file`)\n"
               "  --secret-file FILE      file holding the secret (default\n"
               "                          <state dir>/cluster.secret)\n"
               "  --timeout-ms N          how long to wait for an answer (default 60000)\n"
               "  --json                  print the cluster manager's answer as JSON\n"
               "  -h, --help              this text; `flytctl VERB --help` for one verb\n"
               "\n"
               "exit status: 0 done, 1 the request failed, 2 bad command line\n");
}

void PrintVerbUsage(FILE* out, const std::string& verb) {
  for (const VerbHelp& v : kVerbs) {
    if (verb == v.name) {
      std::fprintf(out, "usage: flytctl %s %s\n  %s\n", v.name, v.synopsis, v.summary);
      if (verb == "vm") {
        std::fprintf(out,
                     "\n"
                     "  vm add --vm IP --host IP --sm N --memory GB [--gpus N]\n"
                     "      store a VM's requirement: N SMs and GB GiB of GPU memory on\n"
                     "      each of --gpus GPUs (default 1; one flyt-server per GPU, all\n"
                     "      on one node when one has room, else across nodes; all or\n"
                     "      none); a node whose host_ip equals --host is preferred\n"
                     "  vm remove IP\n"
                     "      forget a VM (its allocation, if any, is freed)\n"
                     "  vm import FILE\n"
                     "      import many VMs: a MongoDB export of vm_required_resources\n"
                     "      (JSON array or one document per line) or CSV with a header\n"
                     "      vm_ip,host_ip,compute_units,memory (and optionally gpus)\n");
      } else if (verb == "migrate") {
        std::fprintf(out,
                     "\n"
                     "  New servers with the VM's share and token are started on NODE (or on\n"
                     "  its GPU, by index or uuid), every process of the VM moves there while\n"
                     "  it runs, new processes are told the new address, the old servers stop.\n"
                     "  If anything fails the VM keeps running where it was. A VM with several\n"
                     "  GPUs moves all of its servers that are not on NODE yet, or none.\n"
                     "  --wait-ms: how long each server waits for its processes to park\n"
                     "  (default: the cluster manager's migrate_wait_ms, 30 s).\n");
      } else if (verb == "checkpoint" || verb == "restore") {
        std::fprintf(out,
                     "\n"
                     "  checkpoint writes PATH/gpuN/session-ID.flyt on the node of the VM's\n"
                     "  server N (the folder must not hold a checkpoint yet). Without\n"
                     "  --leave-running every process of the VM is parked and written, and\n"
                     "  waits (up to 10 min) until restore; if one server fails, the processes\n"
                     "  already written resume at once. restore takes the last checkpoint\n"
                     "  (or --from PATH) into the VM's servers where it was taken, started\n"
                     "  again at the same addresses if they are gone. With --node NODE[/GPU]\n"
                     "  on another node, the last checkpoint's files are shipped there (at\n"
                     "  most the cluster manager's checkpoint_ship_max_bytes), new servers\n"
                     "  restore them, the waiting processes learn the new address from\n"
                     "  their client manager, and the VM's old servers stop.\n");
      } else if (verb == "drain-node") {
        std::fprintf(out,
                     "\n"
                     "  Each VM with a server on the node is migrated to other nodes (as\n"
                     "  flytctl migrate does); one that cannot move stays and is listed.\n"
                     "  --no-migrate (or --stop-placements-only) only stops new placements.\n");
      } else if (verb == "show") {
        std::fprintf(out,
                     "\n  An IPv4 address is a VM; anything else is tried as a node id, then\n"
                     "  as an allocation id. --vm IP, --node ID or --alloc ID choose "
                     "explicitly.\n");
      }
      std::fprintf(out, "\nglobal options: see flytctl --help\n");
      return;
    }
  }
  PrintUsage(out);
}

// ---------------------------------------------------------------------------
// Command-line parsing.

struct Options {
  std::string cluster_manager;
  std::string config;
  std::string secret;
  bool secret_set = false;
  std::string secret_file;
  bool secret_file_set = false;
  int timeout_ms = 60000;
  bool timeout_set = false;  // --timeout-ms given: moves otherwise wait longer
  bool json = false;
  bool help = false;
};

// A usage error: message for stderr.
struct UsageError {
  std::string message;
};

// Options of one verb: --name VALUE pairs and positional arguments.
struct VerbArgs {
  std::map<std::string, std::string> values;
  std::vector<std::string> positional;
  bool Has(const std::string& name) const { return values.count(name) != 0; }
  std::string Get(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::string() : it->second;
  }
};

// Splits argv into the global options (anywhere on the line), the verb and
// the verb's own arguments. `--name=value` is accepted for every option.
bool SplitArgs(int argc, char** argv, Options* opts, std::vector<std::string>* rest,
               std::string* error) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      size_t eq = a.find('=');
      args.push_back(a.substr(0, eq));
      args.push_back(a.substr(eq + 1));
    } else {
      args.push_back(a);
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* target) {
      if (i + 1 >= args.size()) {
        *error = a + " needs a value";
        return false;
      }
      *target = args[++i];
      return true;
    };
    if (a == "--cluster-manager") {
      if (!value(&opts->cluster_manager)) return false;
    } else if (a == "--config") {
      if (!value(&opts->config)) return false;
    } else if (a == "--secret") {
      if (!value(&opts->secret)) return false;
      opts->secret_set = true;
    } else if (a == "--secret-file") {
      if (!value(&opts->secret_file)) return false;
      opts->secret_file_set = true;
    } else if (a == "--timeout-ms") {
      std::string v;
      if (!value(&v)) return false;
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n <= 0 || n > 3600000) {
        *error = "--timeout-ms needs a number of milliseconds, got '" + v + "'";
        return false;
      }
      opts->timeout_ms = static_cast<int>(n);
      opts->timeout_set = true;
    } else if (a == "--json") {
      opts->json = true;
    } else if (a == "-h" || a == "--help") {
      opts->help = true;
    } else {
      rest->push_back(a);
    }
  }
  return true;
}

// Parses a verb's arguments: `known` lists the options that take a value.
bool ParseVerbArgs(const std::vector<std::string>& args, size_t first,
                   const std::set<std::string>& known, size_t max_positional, VerbArgs* out,
                   std::string* error) {
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() > 1 && a[0] == '-') {
      if (known.count(a) == 0) {
        *error = "unknown option '" + a + "'";
        return false;
      }
      if (i + 1 >= args.size()) {
        *error = a + " needs a value";
        return false;
      }
      out->values[a] = args[++i];
    } else {
      out->positional.push_back(a);
    }
  }
  if (out->positional.size() > max_positional) {
    *error = "unexpected argument '" + out->positional[max_positional] + "'";
    return false;
  }
  return true;
}

// Takes the flags (options without a value) named in `flags` out of args; true if any of
// them was there.
bool TakeFlag(std::vector<std::string>* args, std::initializer_list<const char*> flags) {
  bool found = false;
  for (auto it = args->begin(); it != args->end();) {
    bool match = false;
    for (const char* f : flags) match = match || *it == f;
    if (match) {
      found = true;
      it = args->erase(it);
    } else {
      ++it;
    }
  }
  return found;
}

bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0) return false;
  *out = n;
  return true;
}

bool ParseNumber(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  double d = std::strtod(text.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(d)) return false;
  *out = d;
  return true;
}

// A JSON number: an integer when `d` is whole, else a double.
Json NumberJson(double d) {
  if (d == std::floor(d) && std::fabs(d) < 9e15) return Json(static_cast<int64_t>(d));
  return Json(d);
}

bool LooksLikeIpv4(const std::string& s) {
  int parts = 0;
  size_t i = 0;
  while (i <= s.size()) {
    size_t dot = s.find('.', i);
    std::string part = s.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
    int64_t n = 0;
    if (part.empty() || part.size() > 3 || !ParseInt(part, &n) || n < 0 || n > 255) return false;
    ++parts;
    if (dot == std::string::npos) break;
    i = dot + 1;
  }
  return parts == 4;
}

// ---------------------------------------------------------------------------
// Reading answers. Fields may be missing or null; the manager's numbers may
// be integers or doubles.

bool Present(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && !j.at(key).is_null();
}

std::string Str(const Json& j, const char* key, const std::string& fallback = "-") {
  if (!Present(j, key)) return fallback;
  const Json& v = j.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  return v.dump();
}

bool Num(const Json& j, const char* key, double* out) {
  if (!Present(j, key)) return false;
  const Json& v = j.at(key);
  if (v.is_number()) {
    *out = v.get<double>();
    return true;
  }
  if (v.is_string()) return ParseNumber(v.get<std::string>(), out);
  return false;
}

std::string FormatNumber(double d) {
  char buf[64];
  if (d == std::floor(d) && std::fabs(d) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(d));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f", d);
    std::string s = buf;
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  return buf;
}

std::string Int(const Json& j, const char* key) {
  double d = 0;
  return Num(j, key, &d) ? FormatNumber(d) : "-";
}

// Bytes as GiB: "4", "1.5", "0.01", "12.3"; trailing zeros dropped.
std::string GiBText(double bytes) {
  double g = bytes / kGiB;
  char buf[64];
  std::snprintf(buf, sizeof(buf), g >= 10 ? "%.1f" : "%.2f", g);
  std::string s = buf;
  while (s.find('.') != std::string::npos && (s.back() == '0' || s.back() == '.')) {
    const bool dot = s.back() == '.';
    s.pop_back();
    if (dot) break;
  }
  return s;
}

std::string Bytes(const Json& j, const char* key) {
  double d = 0;
  return Num(j, key, &d) ? GiBText(d) : "-";
}

// "used/total" with either side possibly unknown.
std::string UsedOf(const std::string& used, const std::string& total) {
  if (used == "-" && total == "-") return "-";
  return used + "/" + total;
}

std::string Duration(double ms) {
  char buf[64];
  if (ms < 0) return "-";
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%.0fms", ms);
  } else if (ms < 120000) {
    std::snprintf(buf, sizeof(buf), "%.1fs", ms / 1000);
  } else if (ms < 2 * 3600000.0) {
    std::snprintf(buf, sizeof(buf), "%.0fm", ms / 60000);
  } else if (ms < 2 * 86400000.0) {
    std::snprintf(buf, sizeof(buf), "%.1fh", ms / 3600000);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1fd", ms / 86400000);
  }
  return buf;
}

int64_t NowEpochMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A wall-clock time in milliseconds since the epoch, as local time.
std::string LocalTime(double epoch_ms) {
  time_t secs = static_cast<time_t>(epoch_ms / 1000);
  tm t{};
  localtime_r(&secs, &t);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &t);
  return buf;
}

// "3.2s ago" for a wall-clock time in ms (values too small to be epoch times
// are taken as ages already).
std::string Ago(const Json& j, const char* key) {
  double t = 0;
  if (!Num(j, key, &t)) return "-";
  if (t <= 0) return "never";
  double age = t > 1e11 ? static_cast<double>(NowEpochMs()) - t : t;
  if (age < 0) age = 0;
  return Duration(age) + " ago";
}

// ---------------------------------------------------------------------------
// Tables.

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  // Columns whose cells are right-aligned (numbers).
  void RightAlign(std::initializer_list<size_t> cols) {
    for (size_t c : cols) right_.insert(c);
  }
  void Add(std::vector<std::string> row) {
    row.resize(header_.size(), "");
    rows_.push_back(std::move(row));
  }
  bool empty() const { return rows_.empty(); }
  void Print(FILE* out) const {
    std::vector<size_t> width(header_.size(), 0);
    for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    PrintRow(out, header_, width);
    for (const auto& row : rows_) PrintRow(out, row, width);
  }

 private:
  void PrintRow(FILE* out, const std::vector<std::string>& row,
                const std::vector<size_t>& width) const {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool last = c + 1 == row.size();
      const std::string& cell = row[c];
      size_t pad = width[c] - cell.size();
      if (right_.count(c) != 0) {
        line.append(pad, ' ');
        line += cell;
      } else {
        line += cell;
        if (!last) line.append(pad, ' ');
      }
      if (!last) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  }

  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::set<size_t> right_;
};

const Json& Array(const Json& answer, const char* key) {
  static const Json kEmpty = Json::array();
  if (Present(answer, key) && answer.at(key).is_array()) return answer.at(key);
  return kEmpty;
}

void PrintVms(const Json& answer) {
  const Json& vms = Array(answer, "vms");
  if (vms.empty()) {
    std::printf("no VMs (add one with `flytctl vm add` or `flytctl vm import`)\n");
    return;
  }
  Table t({"VM IP", "HOST IP", "GPUS", "SMS", "MEMORY(GiB)", "ALLOCATION", "NODE", "GPU", "STATE",
           "SESSIONS", "MEM USED(GiB)"});
  t.RightAlign({2, 3, 4, 9, 10});
  for (const Json& vm : vms) {
    std::vector<std::string> row = {Str(vm, "vm_ip"), Str(vm, "host_ip"),
                                    Present(vm, "gpus") ? Int(vm, "gpus") : "1",
                                    Int(vm, "compute_units"), Int(vm, "memory_gb")};
    if (Present(vm, "allocation") && vm.at("allocation").is_object()) {
      const Json& a = vm.at("allocation");
      row.insert(row.end(), {Str(a, "alloc_id"), Str(a, "node_id"), Str(a, "gpu_uuid"),
                             Str(a, "state"), Int(a, "sessions"), Bytes(a, "memory_used")});
    } else {
      row.insert(row.end(), {"-", "-", "-", "unallocated", "-", "-"});
    }
    t.Add(std::move(row));
  }
  t.Print(stdout);
}

void PrintNodes(const Json& answer) {
  const Json& nodes = Array(answer, "nodes");
  if (nodes.empty()) {
    std::printf("no nodes (start flyt-node-manager on the GPU hosts)\n");
    return;
  }
  Table t({"NODE", "STATE", "HOSTNAME", "ADDRESS", "HOST IP", "MPS", "HEARTBEAT", "GPU", "NAME",
           "UUID", "SMS USED", "MEM USED(GiB)"});
  for (const Json& n : nodes) {
    std::vector<std::string> node = {
        Str(n, "node_id"), Str(n, "state"), Str(n, "hostname"),         Str(n, "address"),
        Str(n, "host_ip"), Str(n, "mps"),   Ago(n, "last_heartbeat_ms")};
    const Json& gpus = Array(n, "gpus");
    if (gpus.empty()) {
      node.insert(node.end(), {"-", "(no GPUs)", "", "", ""});
      t.Add(node);
      continue;
    }
    bool first = true;
    for (const Json& g : gpus) {
      std::vector<std::string> row =
          first ? node : std::vector<std::string>(node.size(), std::string());
      row.insert(row.end(), {Int(g, "index"), Str(g, "name"), Str(g, "uuid"),
                             UsedOf(Int(g, "sm_used"), Int(g, "sm_count")),
                             UsedOf(Bytes(g, "memory_used"), Bytes(g, "memory_bytes"))});
      t.Add(std::move(row));
      first = false;
    }
  }
  t.Print(stdout);
}

void PrintServers(const Json& answer) {
  const Json& servers = Array(answer, "servers");
  if (servers.empty()) {
    std::printf("no flyt-servers running\n");
    return;
  }
  Table t({"ALLOCATION", "VM IP", "NODE", "GPU", "SMS", "MEMORY(GiB)", "USED(GiB)", "ENDPOINT",
           "STATE", "SESSIONS", "CALLS", "IDLE"});
  t.RightAlign({4, 5, 6, 9, 10, 11});
  for (const Json& s : servers) {
    double idle = 0;
    std::string idle_text = "-";
    if (Num(s, "idle_ms", &idle)) {
      double sessions = 0;
      idle_text = (Num(s, "sessions", &sessions) && sessions > 0) ? "busy" : Duration(idle);
    }
    t.Add({Str(s, "alloc_id"), Str(s, "vm_ip"), Str(s, "node_id"), Str(s, "gpu_uuid"), Int(s, "sm"),
           Bytes(s, "memory_bytes"), Bytes(s, "memory_used"), Str(s, "endpoint"), Str(s, "state"),
           Int(s, "sessions"), Int(s, "calls"), idle_text});
  }
  t.Print(stdout);
}

std::string DetailText(const Json& e) {
  if (!Present(e, "detail")) return "";
  const Json& d = e.at("detail");
  if (d.is_string()) return d.get<std::string>();
  if (d.is_object()) {
    std::string out;
    for (auto it = d.begin(); it != d.end(); ++it) {
      if (!out.empty()) out += " ";
      out += it.key() + "=" +
             (it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
    }
    return out;
  }
  return d.dump();
}

void PrintEvents(const Json& answer) {
  const Json& events = Array(answer, "events");
  if (events.empty()) {
    std::printf("no events\n");
    return;
  }
  Table t({"ID", "TIME", "KIND", "SUBJECT", "DETAIL"});
  t.RightAlign({0});
  for (const Json& e : events) {
    double ms = 0;
    t.Add({Int(e, "id"), Num(e, "time_ms", &ms) ? LocalTime(ms) : "-", Str(e, "kind"),
           Str(e, "subject"), DetailText(e)});
  }
  t.Print(stdout);
}

bool IsByteField(const std::string& key) {
  return key.size() > 6 && (key.compare(key.size() - 6, 6, "_bytes") == 0 || key == "memory_used" ||
                            key == "memory_quota");
}

// Any answer as an indented outline; byte counts get their GiB beside them.
void PrintTree(const Json& j, int indent) {
  std::string pad(static_cast<size_t>(indent), ' ');
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& key = it.key();
      if (indent == 0 && (key == "id" || key == "ok")) continue;
      const Json& v = it.value();
      if (v.is_object() || (v.is_array() && !v.empty())) {
        std::printf("%s%s:\n", pad.c_str(), key.c_str());
        PrintTree(v, indent + 2);
      } else if (v.is_array()) {
        std::printf("%s%s: (none)\n", pad.c_str(), key.c_str());
      } else {
        std::string text = v.is_string() ? v.get<std::string>() : v.dump();
        if (v.is_number() && IsByteField(key)) {
          text += " (" + GiBText(v.get<double>()) + " GiB)";
        } else if (v.is_number() && key.size() > 3 && key.compare(key.size() - 3, 3, "_ms") == 0 &&
                   v.get<double>() > 1e11) {
          text += " (" + LocalTime(v.get<double>()) + ")";
        }
        std::printf("%s%s: %s\n", pad.c_str(), key.c_str(), text.c_str());
      }
    }
  } else if (j.is_array()) {
    for (const Json& item : j) {
      if (item.is_object()) {
        std::printf("%s-\n", pad.c_str());
        PrintTree(item, indent + 2);
      } else {
        std::printf("%s- %s\n", pad.c_str(),
                    item.is_string() ? item.get<std::string>().c_str() : item.dump().c_str());
      }
    }
  } else {
    std::printf("%s%s\n", pad.c_str(), j.dump().c_str());
  }
}

// ---------------------------------------------------------------------------
// Talking to the cluster manager.

class Session {
 public:
  explicit Session(const Options& opts) : opts_(opts) {}

  // Resolves the address and secret from flags, environment and config file
  // (at the first request, so that command-line mistakes are reported first).
  bool Configure(std::string* error) {
    std::string cm = "127.0.0.1:12400";
    std::string secret;
    std::string secret_file = control::DefaultStateDir() + "/cluster.secret";
    control::Settings settings("flytctl", "flytctl", "CTL");
    settings.Add("cluster_manager", &cm, "the cluster manager's HOST:PORT");
    settings.Add("secret", &secret, "the cluster's shared secret");
    settings.Add("secret_file", &secret_file, "file holding the shared secret");
    control::TlsFiles tls;
    control::AddTlsSettings(&settings, &tls);
    // Only the config file and the environment are read through Settings:
    // the command line is flytctl's own.
    std::vector<std::string> args = {"flytctl"};
    if (!opts_.config.empty()) args.insert(args.end(), {"--config", opts_.config});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    bool help = false;
    Status st = settings.Load(static_cast<int>(args.size()), argv.data(), &help);
    if (!st.ok()) {
      *error = "configuration: " + st.message();
      return false;
    }
    if (!opts_.cluster_manager.empty()) {
      address_ = opts_.cluster_manager;
    } else if (const char* env = std::getenv("FLYT_CLUSTER_MANAGER"); env && env[0] != '\0') {
      address_ = env;
    } else {
      address_ = cm;
    }
    if (opts_.secret_set) {
      secret = opts_.secret;
    } else if (const char* ctl = std::getenv("FLYT_CTL_SECRET"); ctl == nullptr || !ctl[0]) {
      if (const char* env = std::getenv("FLYT_SECRET"); env && env[0] != '\0') secret = env;
    }
    if (opts_.secret_file_set) secret_file = opts_.secret_file;
    secret_file_ = secret_file;
    if (secret.empty() && opts_.secret_set) {
      *error = "--secret is empty";
      return false;
    }
    st = control::LoadSecret(secret, secret_file, /*create=*/false, &creds_);
    if (!st.ok()) {
      *error = st.message() + " (or give --secret, or set FLYT_SECRET)";
      return false;
    }
    st = control::LoadTls(tls, &creds_);
    if (!st.ok()) {
      *error = st.message();
      return false;
    }
    return true;
  }

  const std::string& address() const { return address_; }

  // Sends one request. On failure prints the reason to stderr and returns
  // false; *answer receives the manager's answer whenever one arrived.
  // `quiet`: print nothing when the manager answered with a failure.
  bool Call(const std::string& verb, const Json& args, Json* answer, bool quiet = false) {
    if (!Connect()) return false;
    *answer = Json();
    Status st = channel_->Call(verb, args, answer, opts_.timeout_ms);
    last_answer_ = *answer;
    if (!st.ok()) {
      if (answer->is_object() && answer->contains("ok")) {
        if (quiet) return false;
        std::fprintf(stderr, "flytctl: %s\n", st.message().c_str());
      } else {
        std::fprintf(stderr, "flytctl: no answer from the cluster manager at %s to %s: %s\n",
                     address_.c_str(), verb.c_str(), st.message().c_str());
      }
      return false;
    }
    return true;
  }

  // The answer of the last request (null before any).
  const Json& last_answer() const { return last_answer_; }

  // The code of a failed answer ("unknown_vm", ...), empty when none.
  static std::string Code(const Json& answer) { return Str(answer, "code", ""); }

 private:
  bool Connect() {
    if (channel_) return true;
    if (!configured_) {
      std::string error;
      if (!Configure(&error)) {
        std::fprintf(stderr, "flytctl: %s\n", error.c_str());
        return false;
      }
      configured_ = true;
    }
    std::string name = UserAtHost();
    const int dial_timeout = std::min(opts_.timeout_ms, 10000);
    Status st = control::Channel::Dial(address_, creds_, "admin", name, dial_timeout, &channel_);
    if (st.ok()) return true;
    channel_.reset();
    std::string reason = st.message();
    const std::string prefix = "cannot connect to " + address_ + ": ";
    if (reason.rfind(prefix, 0) == 0) reason = reason.substr(prefix.size());
    if (Reachable()) {
      std::fprintf(stderr,
                   "flytctl: the cluster manager at %s refused this client: %s\n"
                   "  (wrong secret? flytctl's comes from --secret, FLYT_SECRET, the config file "
                   "or %s)\n",
                   address_.c_str(), reason.c_str(), secret_file_.c_str());
    } else {
      std::fprintf(stderr,
                   "flytctl: cannot reach the cluster manager at %s: %s; is "
                   "flyt-cluster-manager running? (set --cluster-manager or "
                   "FLYT_CLUSTER_MANAGER)\n",
                   address_.c_str(), reason.c_str());
    }
    return false;
  }

  // Whether a plain connection to the address succeeds (tells an
  // authentication failure from an unreachable manager).
  bool Reachable() const {
    transport::Address addr;
    if (!transport::ParseAddress(address_, &addr).ok()) return false;
    transport::Liveness live;
    live.connect_timeout_ms = 3000;
    live.refused_retry_ms = 0;
    live.dead_peer_timeout_ms = 3000;
    std::unique_ptr<transport::Connection> conn;
    if (!transport::Dial(addr, live, &conn).ok()) return false;
    conn->Shutdown();
    return true;
  }

  static std::string UserAtHost() {
    std::string user;
    if (passwd* pw = getpwuid(geteuid()); pw != nullptr && pw->pw_name != nullptr) {
      user = pw->pw_name;
    } else if (const char* u = std::getenv("USER"); u != nullptr) {
      user = u;
    } else {
      user = std::to_string(geteuid());
    }
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
    return user + "@" + host;
  }

  const Options& opts_;
  bool configured_ = false;
  std::string address_;
  std::string secret_file_;
  control::Credentials creds_;
  std::unique_ptr<control::Channel> channel_;
  Json last_answer_;
};

void PrintJson(const Json& answer) { std::printf("%s\n", answer.dump(2).c_str()); }

// ---------------------------------------------------------------------------
// The verbs. Each returns the exit status.

struct Context {
  const Options& opts;
  Session& session;
  std::vector<std::string> args;  // args[0] is the verb
};

// Sends `verb`; prints the answer as JSON (--json) or with `render`.
template <typename Render>
int Simple(Context& ctx, const std::string& verb, const Json& request, Render render) {
  Json answer;
  bool ok = ctx.session.Call(verb, request, &answer);
  if (ctx.opts.json && !answer.is_null()) PrintJson(answer);
  if (!ok) return kExitFailed;
  if (!ctx.opts.json) render(answer);
  return kExitOk;
}

int Usage(const std::string& verb, const std::string& message) {
  std::fprintf(stderr, "flytctl %s: %s\n", verb.c_str(), message.c_str());
  PrintVerbUsage(stderr, verb);
  return kExitUsage;
}

int RunList(Context& ctx, const std::string& verb) {
  VerbArgs va;
  std::string error;
  std::set<std::string> known;
  if (verb == "list-events") known = {"--limit"};
  if (!ParseVerbArgs(ctx.args, 1, known, 0, &va, &error)) return Usage(verb, error);
  Json request = Json::object();
  if (verb == "list-events") {
    int64_t limit = 50;
    if (va.Has("--limit") && (!ParseInt(va.Get("--limit"), &limit) || limit <= 0)) {
      return Usage(verb, "--limit needs a positive number, got '" + va.Get("--limit") + "'");
    }
    request["limit"] = limit;
  }
  return Simple(ctx, verb, request, [&](const Json& answer) {
    if (verb == "list-vms") PrintVms(answer);
    if (verb == "list-nodes") PrintNodes(answer);
    if (verb == "list-servers") PrintServers(answer);
    if (verb == "list-events") PrintEvents(answer);
  });
}

int RunShow(Context& ctx) {
  VerbArgs va;
  std::string error;
  if (!ParseVerbArgs(ctx.args, 1, {"--vm", "--node", "--alloc"}, 1, &va, &error)) {
    return Usage("show", error);
  }
  std::vector<std::pair<std::string, std::string>> tries;  // (field, value)
  if (va.Has("--vm")) tries.push_back({"vm_ip", va.Get("--vm")});
  if (va.Has("--node")) tries.push_back({"node_id", va.Get("--node")});
  if (va.Has("--alloc")) tries.push_back({"alloc_id", va.Get("--alloc")});
  if (!va.positional.empty()) {
    const std::string& what = va.positional[0];
    if (LooksLikeIpv4(what)) {
      tries.push_back({"vm_ip", what});
    } else {
      tries.push_back({"node_id", what});
      tries.push_back({"alloc_id", what});
    }
  }
  if (tries.empty()) return Usage("show", "say what to show: a VM IP, a node id or an alloc id");
  if (tries.size() > 2 || (tries.size() == 2 && va.positional.empty())) {
    return Usage("show", "show one thing at a time");
  }
  Json answer;
  for (size_t i = 0; i < tries.size(); ++i) {
    Json request = {{tries[i].first, tries[i].second}};
    const bool last = i + 1 == tries.size();
    if (!last) {
      // A node id that is not one may be an allocation id: ask quietly first.
      Json probe;
      if (!ctx.session.Call("show", request, &probe, /*quiet=*/true)) {
        if (Session::Code(probe).rfind("unknown_", 0) == 0) continue;
        if (probe.is_object() && probe.contains("ok")) {
          std::fprintf(stderr, "flytctl: %s\n", Str(probe, "error", "show failed").c_str());
        }
        if (ctx.opts.json && !probe.is_null()) PrintJson(probe);
        return kExitFailed;
      }
      answer = probe;
    } else {
      if (!ctx.session.Call("show", request, &answer)) {
        if (ctx.opts.json && !answer.is_null()) PrintJson(answer);
        return kExitFailed;
      }
    }
    break;
  }
  if (ctx.opts.json) {
    PrintJson(answer);
  } else {
    PrintTree(answer, 0);
  }
  return kExitOk;
}

int RunResize(Context& ctx, const std::string& verb) {
  VerbArgs va;
  std::string error;
  if (!ParseVerbArgs(ctx.args, 1, {"--vm", "--sm", "--memory"}, 0, &va, &error)) {
    return Usage(verb, error);
  }
  if (!va.Has("--vm")) return Usage(verb, "--vm IP is required");
  if (!va.Has("--sm") && !va.Has("--memory")) return Usage(verb, "give --sm and/or --memory");
  Json request = {{"vm_ip", va.Get("--vm")}};
  if (va.Has("--sm")) {
    int64_t sm = 0;
    if (!ParseInt(va.Get("--sm"), &sm) || sm < 0 || (verb != "change-config" && sm == 0)) {
      return Usage(verb, "--sm needs a whole number of SMs, got '" + va.Get("--sm") + "'");
    }
    request["sm"] = sm;
  }
  if (va.Has("--memory")) {
    double gb = 0;
    if (!ParseNumber(va.Get("--memory"), &gb) || gb < 0) {
      return Usage(verb, "--memory needs a size in GiB, got '" + va.Get("--memory") + "'");
    }
    request["memory_gb"] = NumberJson(gb);
  }
  return Simple(ctx, verb, request, [&](const Json& a) {
    std::string applied = Str(a, "applied", "");
    std::printf("VM %s: %s SMs, %s GiB", Str(a, "vm_ip", va.Get("--vm")).c_str(),
                Int(a, "sm").c_str(), Bytes(a, "memory_bytes").c_str());
    if (applied == "live") {
      std::printf(" (applied live to the running server, paused %s us)\n",
                  Int(a, "pause_us").c_str());
    } else if (applied == "stored") {
      std::printf(" (stored; no server is running, the next allocation gets it)\n");
    } else {
      std::printf("%s\n", applied.empty() ? "" : (" (" + applied + ")").c_str());
    }
  });
}

int RunDrain(Context& ctx) {
  VerbArgs va;
  std::string error;
  const std::string verb = ctx.args[0];
  const bool no_migrate =
      verb == "drain-node" && TakeFlag(&ctx.args, {"--no-migrate", "--stop-placements-only"});
  if (!ParseVerbArgs(ctx.args, 1, {"--node"}, 1, &va, &error)) return Usage(verb, error);
  std::string node =
      va.Has("--node") ? va.Get("--node") : (va.positional.empty() ? "" : va.positional[0]);
  if (node.empty()) return Usage(verb, "NODE_ID is required");
  Json request = {{"node_id", node}};
  if (verb == "drain-node") request["migrate"] = !no_migrate;
  bool some_failed = false;
  int rc = Simple(ctx, verb, request, [&](const Json& a) {
    if (verb == "drain-node") {
      const bool moving = a.value("migrate", false);
      std::printf("node %s: %s (nothing new is placed there; %s)\n", node.c_str(),
                  Str(a, "state", "draining").c_str(),
                  moving ? "its VMs were moved to other nodes" : "running servers stay");
      for (const Json& m : Array(a, "moved")) {
        std::printf("  moved VM %s, now at %s\n", Str(m, "vm_ip").c_str(),
                    Str(m, "endpoint").c_str());
      }
      for (const Json& f : Array(a, "failed")) {
        std::printf("  VM %s stays: %s\n", Str(f, "vm_ip").c_str(), Str(f, "error").c_str());
      }
    } else {
      std::printf("node %s: %s (takes new allocations)\n", node.c_str(),
                  Str(a, "state", "up").c_str());
    }
    Json rest = a;
    for (const char* k : {"id", "ok", "node_id", "state", "moved", "failed", "migrate"}) {
      rest.erase(k);
    }
    if (!rest.empty()) PrintTree(rest, 2);
  });
  // With --json, `failed` is in the answer; either way a VM that could not move is a failure.
  if (rc == kExitOk && ctx.session.last_answer().is_object()) {
    some_failed = !Array(ctx.session.last_answer(), "failed").empty();
  }
  return rc == kExitOk && some_failed ? kExitFailed : rc;
}

// --wait-ms N into request["wait_ms"]; false (after a usage message) when malformed.
bool WaitMs(const std::string& verb, const VerbArgs& va, Json* request, int* rc) {
  if (!va.Has("--wait-ms")) return true;
  int64_t ms = 0;
  if (!ParseInt(va.Get("--wait-ms"), &ms) || ms <= 0) {
    *rc = Usage(verb, "--wait-ms needs a positive number of milliseconds, got '" +
                          va.Get("--wait-ms") + "'");
    return false;
  }
  (*request)["wait_ms"] = ms;
  return true;
}

void PrintMoved(const Json& a) {
  const Json& alloc = a.contains("allocation") ? a.at("allocation") : Json::object();
  std::printf("VM %s moved (%s process session(s)); new processes get %s\n",
              Str(a, "vm_ip").c_str(), Int(a, "sessions").c_str(), Str(alloc, "endpoint").c_str());
  for (const Json& m : Array(a, "moved")) {
    std::printf("  GPU %s: node %s (%s) -> node %s, GPU %s at %s\n", Int(m, "ordinal").c_str(),
                Str(m, "from_node").c_str(), Str(m, "from_endpoint").c_str(),
                Str(m, "node_id").c_str(), Str(m, "gpu_uuid").c_str(), Str(m, "endpoint").c_str());
  }
}

int RunMigrate(Context& ctx) {
  VerbArgs va;
  std::string error;
  if (!ParseVerbArgs(ctx.args, 1, {"--vm", "--to", "--wait-ms"}, 0, &va, &error)) {
    return Usage("migrate", error);
  }
  if (!va.Has("--vm")) return Usage("migrate", "--vm IP is required");
  if (!va.Has("--to") || va.Get("--to").empty()) return Usage("migrate", "--to NODE is required");
  const std::string to = va.Get("--to");
  Json request = {{"vm_ip", va.Get("--vm")}};
  const size_t slash = to.find('/');
  request["node_id"] = to.substr(0, slash);
  if (slash != std::string::npos) {
    if (slash + 1 >= to.size()) return Usage("migrate", "--to NODE/GPU needs a GPU after '/'");
    request["gpu"] = to.substr(slash + 1);
  }
  int rc = kExitOk;
  if (!WaitMs("migrate", va, &request, &rc)) return rc;
  return Simple(ctx, "migrate", request, PrintMoved);
}

int RunCheckpoint(Context& ctx) {
  VerbArgs va;
  std::string error;
  const bool leave_running = TakeFlag(&ctx.args, {"--leave-running"});
  if (!ParseVerbArgs(ctx.args, 1, {"--vm", "--to", "--wait-ms"}, 0, &va, &error)) {
    return Usage("checkpoint", error);
  }
  if (!va.Has("--vm")) return Usage("checkpoint", "--vm IP is required");
  if (!va.Has("--to") || va.Get("--to").empty() || va.Get("--to")[0] != '/') {
    return Usage("checkpoint", "--to PATH is required: an absolute folder on the VM's node(s)");
  }
  Json request = {
      {"vm_ip", va.Get("--vm")}, {"dir", va.Get("--to")}, {"leave_running", leave_running}};
  int rc = kExitOk;
  if (!WaitMs("checkpoint", va, &request, &rc)) return rc;
  return Simple(ctx, "checkpoint", request, [&](const Json& a) {
    std::printf("VM %s: %s process session(s) written to %s%s\n", Str(a, "vm_ip").c_str(),
                Int(a, "sessions").c_str(), Str(a, "dir").c_str(),
                leave_running ? " (they go on running)"
                              : "; they wait until `flytctl restore --vm` brings them back");
    for (const Json& s : Array(a, "servers")) {
      std::printf("  GPU %s: %s on node %s (%s), %s session(s)\n", Int(s, "ordinal").c_str(),
                  Str(s, "dir").c_str(), Str(s, "node_id").c_str(), Str(s, "endpoint").c_str(),
                  Int(s, "sessions").c_str());
    }
  });
}

int RunRestore(Context& ctx) {
  VerbArgs va;
  std::string error;
  if (!ParseVerbArgs(ctx.args, 1, {"--vm", "--from", "--node", "--wait-ms"}, 0, &va, &error)) {
    return Usage("restore", error);
  }
  if (!va.Has("--vm")) return Usage("restore", "--vm IP is required");
  Json request = {{"vm_ip", va.Get("--vm")}};
  if (va.Has("--from")) request["dir"] = va.Get("--from");
  if (va.Has("--node")) {
    const std::string to = va.Get("--node");
    const size_t slash = to.find('/');
    if (to.empty() || slash == 0) return Usage("restore", "--node NODE[/GPU] needs a node");
    if (slash != std::string::npos && slash + 1 >= to.size())
      return Usage("restore", "--node NODE/GPU needs a GPU after '/'");
    request["node_id"] = to.substr(0, slash);
    if (slash != std::string::npos) request["gpu"] = to.substr(slash + 1);
  }
  int rc = kExitOk;
  if (!WaitMs("restore", va, &request, &rc)) return rc;
  return Simple(ctx, "restore", request, [&](const Json& a) {
    std::printf("VM %s: %s process session(s) restored from %s%s; they go on\n",
                Str(a, "vm_ip").c_str(), Int(a, "restored").c_str(), Str(a, "dir").c_str(),
                a.contains("from_node")
                    ? (" (node " + Str(a, "from_node") + ", " + Int(a, "shipped_bytes") +
                       " bytes shipped to node " + Str(a, "node_id") + ")")
                          .c_str()
                    : "");
    for (const Json& s : Array(a, "servers")) {
      std::printf("  GPU %s: node %s at %s, %s restored\n", Int(s, "ordinal").c_str(),
                  Str(s, "node_id").c_str(), Str(s, "endpoint").c_str(),
                  Int(s, "restored").c_str());
    }
  });
}

int RunMigrateAuto(Context& ctx) {
  VerbArgs va;
  std::string error;
  const bool dry_run = TakeFlag(&ctx.args, {"--dry-run"});
  if (!ParseVerbArgs(ctx.args, 1, {}, 0, &va, &error)) return Usage("migrate-auto", error);
  return Simple(ctx, "migrate-auto", {{"dry_run", dry_run}}, [&](const Json& a) {
    if (a.value("moved", false)) {
      std::printf("rebalanced: %s\n", Str(a, "decision").c_str());
      PrintMoved(a);
    } else if (a.value("dry_run", false)) {
      std::printf("would move %s\n", Str(a, "decision").c_str());
    } else {
      std::printf("nothing to move: %s\n", Str(a, "reason").c_str());
    }
  });
}

int RunAllocate(Context& ctx, const std::string& verb) {
  VerbArgs va;
  std::string error;
  if (!ParseVerbArgs(ctx.args, 1, {"--vm"}, 1, &va, &error)) return Usage(verb, error);
  std::string vm =
      va.Has("--vm") ? va.Get("--vm") : (va.positional.empty() ? "" : va.positional[0]);
  if (vm.empty()) return Usage(verb, "--vm IP is required");
  return Simple(ctx, verb, {{"vm_ip", vm}}, [&](const Json& a) {
    if (verb == "deallocate") {
      std::printf("VM %s: deallocated (its flyt-server is stopped)\n", vm.c_str());
      return;
    }
    std::printf("VM %s: allocation %s", vm.c_str(), Str(a, "alloc_id").c_str());
    if (Present(a, "servers") && a.at("servers").is_array()) {  // several GPUs
      std::printf(" (%s)\n", Str(a, "placement").c_str());
      for (const Json& s : a.at("servers")) {
        std::printf("  GPU %s: %s on node %s, GPU %s\n", Int(s, "ordinal").c_str(),
                    Str(s, "endpoint").c_str(), Str(s, "node_id").c_str(),
                    Str(s, "gpu_uuid").c_str());
      }
      std::printf("  endpoints %s, %s SMs, %s GiB on each GPU\n", Str(a, "endpoint").c_str(),
                  Int(a, "sm").c_str(), Bytes(a, "memory_bytes").c_str());
    } else {
      if (Present(a, "node_id")) std::printf(" on node %s", Str(a, "node_id").c_str());
      if (Present(a, "gpu_uuid")) std::printf(" GPU %s", Str(a, "gpu_uuid").c_str());
      std::printf("\n  endpoint %s, %s SMs, %s GiB\n", Str(a, "endpoint").c_str(),
                  Int(a, "sm").c_str(), Bytes(a, "memory_bytes").c_str());
    }
    if (Present(a, "token")) {
      std::printf("  standalone use: flyt run --server %s --token %s -- APP\n",
                  Str(a, "endpoint").c_str(), Str(a, "token").c_str());
    }
  });
}

int RunVm(Context& ctx) {
  if (ctx.args.size() < 2) return Usage("vm", "say add, remove or import");
  const std::string sub = ctx.args[1];
  VerbArgs va;
  std::string error;
  if (sub == "add") {
    if (!ParseVerbArgs(ctx.args, 2, {"--vm", "--host", "--sm", "--memory", "--gpus"}, 0, &va,
                       &error)) {
      return Usage("vm", error);
    }
    for (const char* o : {"--vm", "--host", "--sm", "--memory"}) {
      if (!va.Has(o)) return Usage("vm", std::string("vm add needs ") + o);
    }
    int64_t sm = 0;
    double gb = 0;
    if (!ParseInt(va.Get("--sm"), &sm) || sm <= 0) {
      return Usage("vm", "--sm needs a positive whole number, got '" + va.Get("--sm") + "'");
    }
    if (!ParseNumber(va.Get("--memory"), &gb) || gb <= 0) {
      return Usage("vm", "--memory needs a size in GiB, got '" + va.Get("--memory") + "'");
    }
    int64_t gpus = 1;
    if (va.Has("--gpus") && (!ParseInt(va.Get("--gpus"), &gpus) || gpus < 1 || gpus > INT_MAX)) {
      return Usage(
          "vm", "--gpus needs a whole number of GPUs, at least 1, got '" + va.Get("--gpus") + "'");
    }
    Json request = {{"vm_ip", va.Get("--vm")},
                    {"host_ip", va.Get("--host")},
                    {"compute_units", sm},
                    {"memory_gb", NumberJson(gb)},
                    {"gpus", gpus}};
    return Simple(ctx, "vm-add", request, [&](const Json&) {
      std::printf("VM %s added: host %s, %lld SMs, %s GiB", va.Get("--vm").c_str(),
                  va.Get("--host").c_str(), static_cast<long long>(sm), FormatNumber(gb).c_str());
      if (gpus > 1) std::printf(" on each of %lld GPUs", static_cast<long long>(gpus));
      std::printf("\n");
    });
  }
  if (sub == "remove") {
    if (!ParseVerbArgs(ctx.args, 2, {"--vm"}, 1, &va, &error)) return Usage("vm", error);
    std::string vm =
        va.Has("--vm") ? va.Get("--vm") : (va.positional.empty() ? "" : va.positional[0]);
    if (vm.empty()) return Usage("vm", "vm remove needs the VM's IP");
    return Simple(ctx, "vm-remove", {{"vm_ip", vm}},
                  [&](const Json&) { std::printf("VM %s removed\n", vm.c_str()); });
  }
  if (sub == "import") {
    if (!ParseVerbArgs(ctx.args, 2, {}, 1, &va, &error)) return Usage("vm", error);
    if (va.positional.empty()) return Usage("vm", "vm import needs a FILE");
    const std::string path = va.positional[0];
    std::vector<store::VmRequirement> vms;
    Status st = store::ParseVmFile(path, &vms);
    if (!st.ok()) {
      std::fprintf(stderr, "flytctl: %s\n", st.message().c_str());
      return kExitFailed;
    }
    Json list = Json::array();
    for (const store::VmRequirement& vm : vms) {
      list.push_back({{"vm_ip", vm.vm_ip},
                      {"host_ip", vm.host_ip},
                      {"compute_units", vm.compute_units},
                      {"memory_gb", NumberJson(static_cast<double>(vm.memory_gb))},
                      {"gpus", vm.gpus}});
    }
    if (list.empty()) {
      std::fprintf(stderr, "flytctl: %s holds no VMs\n", path.c_str());
      return kExitFailed;
    }
    return Simple(ctx, "vm-import", {{"vms", list}}, [&](const Json& a) {
      std::printf("imported %zu VM%s from %s\n", list.size(), list.size() == 1 ? "" : "s",
                  path.c_str());
      Json rest = a;
      rest.erase("id");
      rest.erase("ok");
      if (!rest.empty()) PrintTree(rest, 2);
    });
  }
  return Usage("vm", "unknown vm command '" + sub + "' (add, remove or import)");
}

int Main(int argc, char** argv) {
  Options opts;
  std::vector<std::string> rest;
  std::string error;
  if (!SplitArgs(argc, argv, &opts, &rest, &error)) {
    std::fprintf(stderr, "flytctl: %s\n", error.c_str());
    PrintUsage(stderr);
    return kExitUsage;
  }
  if (rest.empty()) {
    if (opts.help) {
      PrintUsage(stdout);
      return kExitOk;
    }
    PrintUsage(stderr);
    return kExitUsage;
  }
  std::string verb = rest[0];
  if (auto it = kAliases.find(verb); it != kAliases.end()) verb = it->second;
  rest[0] = verb;
  bool known = false;
  for (const VerbHelp& v : kVerbs) known = known || verb == v.name;
  if (!known) {
    std::fprintf(stderr, "flytctl: unknown verb '%s'\n", verb.c_str());
    PrintUsage(stderr);
    return kExitUsage;
  }
  if (opts.help) {
    PrintVerbUsage(stdout, verb);
    return kExitOk;
  }
  // Moves take as long as their processes need to park (up to wait_ms per step), a drain
  // one move per VM: unless told otherwise, wait up to 15 minutes for the answer.
  if (!opts.timeout_set && (verb == "migrate" || verb == "checkpoint" || verb == "restore" ||
                            verb == "migrate-auto" || verb == "drain-node")) {
    opts.timeout_ms = 15 * 60 * 1000;
  }
  Session session(opts);
  Context ctx{opts, session, rest};
  if (verb == "list-vms" || verb == "list-nodes" || verb == "list-servers" ||
      verb == "list-events") {
    return RunList(ctx, verb);
  }
  if (verb == "show") return RunShow(ctx);
  if (verb == "change-config" || verb == "inc-resources" || verb == "dec-resources") {
    return RunResize(ctx, verb);
  }
  if (verb == "drain-node" || verb == "undrain-node") return RunDrain(ctx);
  if (verb == "allocate" || verb == "deallocate") return RunAllocate(ctx, verb);
  if (verb == "vm") return RunVm(ctx);
  if (verb == "migrate") return RunMigrate(ctx);
  if (verb == "checkpoint") return RunCheckpoint(ctx);
  if (verb == "restore") return RunRestore(ctx);
  if (verb == "migrate-auto") return RunMigrateAuto(ctx);
  return Usage(verb, "not implemented");
}

}  // namespace
}  // namespace flyt

int main(int argc, char** argv) { return flyt::Main(argc, argv); }
