// Implementation of server/control_socket.h.
#include "server/control_socket.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include <cctype>
#include <chrono>
#include <cstdio>

#include "common/log.h"
#include "server/tenant_board.h"
#include "server/worker_pool.h"
#include "transport/transport.h"

namespace flyt::server {

using Json = nlohmann::json;

namespace {

// Sessions whose worker has not adopted the last share change yet, and
// whether any has a stream capture in progress.
size_t PendingSwitches(ServerState* state, bool* capturing) {
  BoardLayout& b = state->board->layout();
  const uint64_t generation = b.share_generation.load();
  size_t pending = 0;
  if (capturing != nullptr) *capturing = false;
  for (const WorkerSlot& w : b.slots) {
    if (w.state.load() != static_cast<uint32_t>(WorkerState::kServing)) continue;
    if (w.share_generation.load() != generation) ++pending;
    if (capturing != nullptr && w.capturing.load() > 0) *capturing = true;
  }
  return pending;
}

Json Stats(ServerState* state) {
  Share::Snapshot share = state->share.Get();
  WorkerPool::Counters pool = state->pool->counters();
  const size_t pending = PendingSwitches(state, nullptr);
  int64_t idle_ms = 0;
  if (pool.serving == 0) {  // since the last session ended, or since the start
    int64_t since = pool.last_end_ns;
    if (since == 0) since = state->start_ns;
    idle_ms = (SteadyNowNs() - since) / 1000000;
  }
  Json listen = Json::array();
  for (const auto& l : state->listen) listen.push_back(l);
  Json workers = Json::array();
  for (const auto& w : state->pool->Workers()) {
    workers.push_back({{"pid", static_cast<int64_t>(w.pid)},
                       {"client_pid", w.client_pid},
                       {"session", w.session},
                       {"state", w.state},
                       {"memory_used", w.memory_used},
                       {"calls", w.calls},
                       {"rss_bytes", w.rss_bytes}});
  }
  return control::Ok({{"pid", static_cast<int64_t>(getpid())},
                      {"listen", listen},
                      {"sessions", pool.serving},
                      {"memory_used", share.memory_used},
                      {"memory_quota", share.memory_quota},
                      {"sm", share.sm},
                      {"sm_requested", share.sm_requested},
                      {"sm_total", share.sm_total},
                      {"sm_mechanism", SmMechanismName(share.mechanism)},
                      {"calls", pool.calls},
                      {"bytes_in", pool.bytes_in},
                      {"bytes_out", pool.bytes_out},
                      {"idle_ms", idle_ms},
                      {"switch_pending", pending},
                      {"last_switch_us", state->board->layout().last_switch_us.load()},
                      {"pool_size", pool.size},
                      {"pool_idle", pool.idle},
                      {"pool_starting", pool.starting},
                      {"workers_started", pool.started},
                      {"workers_crashed", pool.crashed},
                      {"images", pool.images},
                      {"image_bytes", pool.image_bytes},
                      {"rss_bytes_main", ResidentBytes(getpid())},
                      {"workers", workers}});
}

Json SetShare(ServerState* state, const Json& request) {
  auto t0 = std::chrono::steady_clock::now();
  Share::Change change;
  if (request.contains("sm")) {
    const Json& v = request["sm"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 20))
      return control::Error("bad_request", "sm must be a whole number of SMs, 0 for the whole GPU");
    change.has_sm = true;
    change.sm = static_cast<int>(v.get<int64_t>());
  }
  if (request.contains("memory_bytes")) {
    const Json& v = request["memory_bytes"];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      return control::Error("bad_request", "memory_bytes must be a byte count, 0 for no quota");
    change.has_memory = true;
    change.memory_bytes = v.get<uint64_t>();
  }
  if (!change.has_sm && !change.has_memory)
    return control::Error("bad_request", "set-share needs sm and/or memory_bytes");
  bool capturing = false;
  PendingSwitches(state, &capturing);
  std::string note;
  bool busy = false;
  Status s = state->share.Apply(change, capturing, &note, &busy);
  if (!s.ok()) return control::Error(busy ? "busy" : "refused", s.message());
  auto pause_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  Share::Snapshot share = state->share.Get();
  // Every worker adopts the change at its client's next call.
  BoardLayout& board = state->board->layout();
  board.sm_requested = share.sm_requested;
  board.share_generation.fetch_add(1, std::memory_order_acq_rel);
  size_t pending = PendingSwitches(state, nullptr);
  Json answer = control::Ok({{"pause_us", static_cast<int64_t>(pause_us)},
                             {"sm", share.sm},
                             {"sm_mechanism", SmMechanismName(share.mechanism)},
                             {"memory_quota", share.memory_quota},
                             {"memory_used", share.memory_used},
                             {"switch_pending", pending}});
  if (!note.empty()) answer["note"] = note;
  FLYT_INFO("control: set-share done in %lld us%s%s", static_cast<long long>(pause_us),
            note.empty() ? "" : ": ", note.c_str());
  return answer;
}

// How long migrate, checkpoint and restore wait for the sessions' reports.
int WaitMs(const Json& request) {
  if (request.contains("wait_ms") && request["wait_ms"].is_number_integer()) {
    int64_t v = request["wait_ms"].get<int64_t>();
    return static_cast<int>(std::clamp<int64_t>(v, 0, 10 * 60 * 1000));
  }
  return 30000;
}

Json ReportsJson(const std::vector<channel::Report>& reports, size_t* ok) {
  Json list = Json::array();
  *ok = 0;
  for (const auto& r : reports) {
    if (r.ok) ++*ok;
    list.push_back({{"session", r.session}, {"ok", r.ok}, {"message", r.message}});
  }
  return list;
}

// migrate / checkpoint: every session with a client moves at its next park
// (its client's next synchronous call), then this answers what happened.
Json Move(ServerState* state, const Json& request, channel::MoveOrder::Mode mode) {
  channel::MoveOrder order;
  order.mode = mode;
  const bool checkpoint = mode == channel::MoveOrder::Mode::kCheckpoint;
  const char* field = checkpoint ? "dir" : "to";
  if (!request.contains(field) || !request[field].is_string() ||
      request[field].get<std::string>().empty())
    return control::Error("bad_request", std::string(checkpoint ? "checkpoint" : "migrate") +
                                             " needs \"" + field + "\"");
  order.where = request[field].get<std::string>();
  if (checkpoint) {
    struct stat st {};
    if (::stat(order.where.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        ::access(order.where.c_str(), W_OK) != 0)
      return control::Error("bad_request", "checkpoint: " + order.where +
                                               " is not a directory this server can write");
    order.leave_running = request.contains("leave_running") &&
                          request["leave_running"].is_boolean() &&
                          request["leave_running"].get<bool>();
  } else {
    transport::Address addr;
    Status st = transport::ParseAddress(order.where, &addr);
    if (!st.ok()) return control::Error("bad_request", "migrate: " + st.message());
    // shm://: a server on this host, which the client (here over shm:// too, most
    // likely) then reaches with shared memory, and its pinned buffers stay shared.
    if (addr.kind != transport::Address::Kind::kTcp &&
        addr.kind != transport::Address::Kind::kUnix &&
        addr.kind != transport::Address::Kind::kTls && addr.kind != transport::Address::Kind::kShm)
      return control::Error(
          "bad_request", "migrate: the target must be a tcp://, tls://, unix:// or shm:// address");
    order.token = request.contains("token") && request["token"].is_string()
                      ? request["token"].get<std::string>()
                      : state->token;
  }
  const uint64_t after = state->pool->LastReport();
  const int asked = state->pool->AskMove(order);
  std::vector<channel::Report> reports = state->pool->WaitReports(
      channel::Report::Kind::kMove, after, static_cast<size_t>(asked), WaitMs(request));
  size_t ok = 0;
  Json sessions = ReportsJson(reports, &ok);
  FLYT_INFO("control: %s to %s: %d session(s) asked, %zu moved, %zu stayed, %zu not parked yet",
            checkpoint ? "checkpoint" : "migrate", order.where.c_str(), asked, ok,
            reports.size() - ok, asked - std::min<size_t>(asked, reports.size()));
  return control::Ok({{"asked", asked},
                      {checkpoint ? "checkpointed" : "moved", ok},
                      {"stayed", reports.size() - ok},
                      {"pending", asked - std::min<size_t>(asked, reports.size())},
                      {"sessions", sessions}});
}

// restore: each *.flyt file of the directory becomes a session that waits
// for its client.
Json Restore(ServerState* state, const Json& request) {
  if (!request.contains("dir") || !request["dir"].is_string())
    return control::Error("bad_request", "restore needs \"dir\"");
  const std::string dir = request["dir"].get<std::string>();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return control::Error("bad_request", "restore: cannot read " + dir);
  std::vector<std::string> files;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".flyt") == 0) files.push_back(name);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  const uint64_t after = state->pool->LastReport();
  int started = 0;
  Json failed = Json::array();
  for (const auto& name : files) {
    const std::string path = dir + "/" + name;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      failed.push_back({{"file", path}, {"message", "cannot open it"}});
      continue;
    }
    channel::Ticket ticket;
    std::random_device rd;
    ticket.session = (static_cast<uint64_t>(rd()) << 32 | rd()) & ((1ull << 62) - 1);
    ticket.secret = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
    ticket.flags = channel::kTicketRestore;
    ticket.share_generation = state->board->layout().share_generation.load();
    Status st = state->pool->ServeRestoreFile(ticket, fd);  // closes fd
    if (st.ok()) {
      ++started;
    } else {
      failed.push_back({{"file", path}, {"message", st.message()}});
    }
  }
  std::vector<channel::Report> reports = state->pool->WaitReports(
      channel::Report::Kind::kRestore, after, static_cast<size_t>(started), WaitMs(request));
  size_t ok = 0;
  Json sessions = ReportsJson(reports, &ok);
  FLYT_INFO("control: restore from %s: %zu file(s), %zu restored", dir.c_str(), files.size(), ok);
  return control::Ok({{"files", files.size()},
                      {"restored", ok},
                      {"failed", failed},
                      {"pending", started - std::min<size_t>(started, reports.size())},
                      {"sessions", sessions}});
}

}  // namespace

Json HandleControlRequest(ServerState* state, const Json& request) {
  if (!request.is_object() || !request.contains("verb") || !request["verb"].is_string())
    return control::Error("bad_request", "a request is a JSON object with a \"verb\"");
  const std::string verb = request["verb"].get<std::string>();
  if (verb == "stats") return Stats(state);
  if (verb == "set-share") return SetShare(state, request);
  if (verb == "migrate") return Move(state, request, channel::MoveOrder::Mode::kMigrate);
  if (verb == "checkpoint") return Move(state, request, channel::MoveOrder::Mode::kCheckpoint);
  if (verb == "restore") return Restore(state, request);
  return control::Error("bad_request", "unknown verb '" + verb +
                                           "': flyt-server answers stats, set-share, migrate, "
                                           "checkpoint and restore");
}

bool ParseByteCount(const std::string& text, uint64_t* out) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (__builtin_mul_overflow(v, 10, &v) ||
        __builtin_add_overflow(v, static_cast<uint64_t>(text[i] - '0'), &v))
      return false;
    ++i;
  }
  if (i == 0) return false;
  int shift = 0;
  if (i < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[i]))) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        return false;
    }
    ++i;
    if (i < text.size() && (text[i] == 'i' || text[i] == 'I')) ++i;
    if (i < text.size() && (text[i] == 'B' || text[i] == 'b')) ++i;
  }
  if (i != text.size()) return false;
  if (shift > 0 && (v >> (64 - shift)) != 0) return false;
  *out = v << shift;
  return true;
}

Status ControlSocket::Start(const std::string& address, ServerState* state,
                            std::unique_ptr<ControlSocket>* out) {
  transport::Address addr;
  Status s = transport::ParseAddress(address, &addr);
  if (!s.ok()) return Status::Error("--control: " + s.message());
  if (addr.kind != transport::Address::Kind::kUnix)
    return Status::Error(
        "--control must be unix:///PATH: the control socket has no "
        "authentication, only the file's permissions");
  auto c = std::unique_ptr<ControlSocket>(new ControlSocket());
  c->path_ = addr.path;
  ::unlink(addr.path.c_str());  // a stale file of a dead server
  // Born 0600: no moment where another user could connect.
  mode_t old_mask = ::umask(0177);
  s = control::Listener::Start(
      address, control::Credentials{},
      [state](const control::Peer&, const Json& request) {
        return HandleControlRequest(state, request);
      },
      &c->listener_);
  ::umask(old_mask);
  if (!s.ok()) return Status::Error("control socket: " + s.message());
  if (::chmod(addr.path.c_str(), 0600) != 0)
    return Status::Error("control socket: cannot make " + addr.path + " 0600");
  *out = std::move(c);
  return Status::Ok();
}

ControlSocket::~ControlSocket() {
  if (listener_ != nullptr) listener_->Stop();
  if (!path_.empty()) ::unlink(path_.c_str());
}

std::string ControlSocket::Describe() const {
  return listener_ != nullptr ? listener_->Describe() : "unix://" + path_;
}

}  // namespace flyt::server
