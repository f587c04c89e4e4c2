// Implementation of server/worker_pool.h.
#include "server/worker_pool.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "common/log.h"
#include "server/session.h"
#include "server/worker.h"

namespace flyt::server {
namespace {

constexpr int kMaxFailedStarts = 3;

}  // namespace

uint64_t ResidentBytes(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/statm", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

namespace {

const char* StateName(uint32_t s) {
  switch (static_cast<WorkerState>(s)) {
    case WorkerState::kStarting:
      return "starting";
    case WorkerState::kIdle:
      return "idle";
    case WorkerState::kServing:
      return "serving";
    case WorkerState::kEnding:
      return "ending";
    case WorkerState::kFree:
      break;
  }
  return "free";
}

void Subtract(std::atomic<uint64_t>* v, uint64_t n) {
  uint64_t cur = v->load();
  while (!v->compare_exchange_weak(cur, cur > n ? cur - n : 0)) {
  }
}

}  // namespace

WorkerPool::WorkerPool(TenantBoard* board, std::vector<std::string> argv, int size)
    : board_(board), argv_(std::move(argv)), size_(size < 0 ? 0 : size) {}

WorkerPool::~WorkerPool() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  for (auto& [slot, w] : workers_) ::shutdown(w->control, SHUT_RDWR);  // they exit
}

Status WorkerPool::Start(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  TopUpLocked();
  if (size_ == 0) return Status::Ok();
  bool ready = ready_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    for (auto& [slot, w] : workers_)
      if (w->ready) return true;
    return failed_starts_ >= kMaxFailedStarts;
  });
  if (failed_starts_ >= kMaxFailedStarts)
    return Status::Error("workers fail to start (" + last_failure_ + "); see the log above");
  if (!ready) FLYT_WARN("no worker is ready after %d ms; clients will wait for one", timeout_ms);
  return Status::Ok();
}

Status WorkerPool::SpawnLocked() {
  int slot = -1;
  for (int i = 0; i < kMaxWorkers && slot < 0; ++i)
    if (workers_.count(i) == 0 && (*board_)->slots[i].state.load() == 0) slot = i;
  if (slot < 0)
    return Status::Error("all " + std::to_string(kMaxWorkers) + " worker slots are in use");
  int control[2], requests[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, control) != 0)
    return Status::Error(std::string("socketpair: ") + std::strerror(errno));
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, requests) != 0) {
    Status st = Status::Error(std::string("socketpair: ") + std::strerror(errno));
    close(control[0]);
    close(control[1]);
    return st;
  }
  WorkerArgs args{control[1], requests[1], board_->fd(), slot};
  std::vector<std::string> text = argv_;
  text.push_back("--worker");
  text.push_back(FormatWorkerArgs(args));
  std::vector<char*> cargv;
  for (auto& t : text) cargv.push_back(t.data());
  cargv.push_back(nullptr);
  WorkerSlot& s = (*board_)->slots[slot];
  s.state = static_cast<uint32_t>(WorkerState::kStarting);
  // Workers start with the same address-space layout (no ASLR), so that a
  // session moved to another worker, here or on another server, finds the
  // device addresses its client holds free there (server/session_migrate.cc).
  // FLYT_WORKER_ASLR=1 keeps ASLR, and moves may then fail.
  const char* aslr = std::getenv("FLYT_WORKER_ASLR");
  const bool stable_layout = aslr == nullptr || std::strcmp(aslr, "1") != 0;
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    if (stable_layout) personality(ADDR_NO_RANDOMIZE);
    fcntl(args.control, F_SETFD, 0);
    fcntl(args.requests, F_SETFD, 0);
    fcntl(args.board, F_SETFD, 0);
    execv("/proc/self/exe", cargv.data());
    _exit(127);
  }
  close(control[1]);
  close(requests[1]);
  if (pid < 0) {
    Status st = Status::Error(std::string("fork: ") + std::strerror(errno));
    s.state = 0;
    close(control[0]);
    close(requests[0]);
    return st;
  }
  s.pid = pid;
  auto w = std::make_unique<Worker>();
  w->slot = slot;
  w->pid = pid;
  w->control = control[0];
  w->requests = requests[0];
  Worker* raw = w.get();
  workers_[slot] = std::move(w);
  ++started_;
  std::thread([this, raw] { ServeRequests(raw); }).detach();
  return Status::Ok();
}

void WorkerPool::TopUpLocked() {
  if (stopping_) return;
  int spare = 0;
  for (auto& [slot, w] : workers_)
    if (!w->assigned && !w->retired) ++spare;
  while (spare < size_ && failed_starts_ < kMaxFailedStarts) {
    Status st = SpawnLocked();
    if (!st.ok()) {
      FLYT_ERROR("cannot start a worker: %s", st.message().c_str());
      return;
    }
    ++spare;
  }
}

void WorkerPool::ServeRequests(Worker* w) {
  for (;;) {
    channel::Message m;
    if (!channel::Receive(w->requests, &m).ok()) break;
    if (m.type == channel::Type::kReady) {
      std::lock_guard<std::mutex> lock(mu_);
      w->ready = true;
      failed_starts_ = 0;
      if (!w->assigned) (*board_)->slots[w->slot].state = static_cast<uint32_t>(WorkerState::kIdle);
      ready_cv_.notify_all();
    } else if (m.type == channel::Type::kImageFind && m.payload.size() == 16) {
      uint64_t key[2];
      std::memcpy(key, m.payload.data(), sizeof(key));
      uint64_t size = 0;
      int fd = images_.Find(key[0], key[1], &size);
      uint8_t answer[9] = {static_cast<uint8_t>(fd >= 0)};
      std::memcpy(answer + 1, &size, 8);
      std::vector<int> fds;
      if (fd >= 0) fds.push_back(fd);
      Status st = channel::Send(w->requests, channel::Type::kImage, answer, sizeof(answer), fds);
      if (fd >= 0) close(fd);
      if (!st.ok()) break;
    } else if (m.type == channel::Type::kImagePut && m.payload.size() == 24 && m.fds.size() == 1) {
      uint64_t v[3];
      std::memcpy(v, m.payload.data(), sizeof(v));
      images_.Insert(v[0], v[1], m.fds[0], v[2]);  // takes the descriptor
      m.fds.clear();
    } else if (m.type == channel::Type::kSticky) {
      RetireIdle(w);
    } else if (m.type == channel::Type::kResumeKey && m.payload.size() == 16) {
      std::lock_guard<std::mutex> lock(mu_);
      std::memcpy(w->resume_key, m.payload.data(), 16);
      w->awaiting_resume = true;
    } else if (m.type == channel::Type::kReport) {
      channel::Report r;
      if (channel::DecodeReport(m.payload, &r)) {
        std::lock_guard<std::mutex> lock(mu_);
        reports_.emplace_back(++report_seq_, r);
        while (reports_.size() > 1024) reports_.pop_front();
        reports_cv_.notify_all();
      }
    } else if (m.type == channel::Type::kShareablePut && m.fds.size() == 1) {
      std::random_device rd;
      uint64_t answer[2];
      {
        std::lock_guard<std::mutex> lock(mu_);
        do {
          answer[0] = (static_cast<uint64_t>(rd()) << 32) ^ rd();
        } while (answer[0] == 0 || shareables_.count(answer[0]) != 0);
        answer[1] = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
        shareables_[answer[0]] = Shareable{m.fds[0], answer[1], w->slot};
      }
      m.fds.clear();
      if (!channel::Send(w->requests, channel::Type::kShareableKey, answer, sizeof(answer)).ok())
        break;
    } else if (m.type == channel::Type::kShareableGet && m.payload.size() == 16) {
      uint64_t req[2];
      std::memcpy(req, m.payload.data(), sizeof(req));
      int fd = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = shareables_.find(req[0]);
        if (it != shareables_.end() && it->second.secret == req[1])
          fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 3);
      }
      uint8_t found = fd >= 0;
      std::vector<int> fds;
      if (fd >= 0) fds.push_back(fd);
      Status st = channel::Send(w->requests, channel::Type::kShareable, &found, 1, fds);
      if (fd >= 0) close(fd);
      if (!st.ok()) break;
    } else {
      FLYT_WARN("worker %d sent an unexpected message (type %u); ignored", static_cast<int>(w->pid),
                static_cast<unsigned>(m.type));
    }
    channel::CloseFds(&m);
  }
  Reap(w);
}

// Under MPS a fatal fault reaches every client of the GPU's MPS server, which
// then takes no new client until all of them have exited: idle workers would
// hold it back for good. So after any client's sticky error the idle workers
// go, and the pool starts new ones (under MPS they start once it has
// recovered; without MPS at once).
void WorkerPool::RetireIdle(Worker* reporter) {
  std::lock_guard<std::mutex> lock(mu_);
  int retired = 0;
  for (auto& [slot, w] : workers_) {
    if (w->assigned || w.get() == reporter || w->retired) continue;
    w->retired = true;
    ::shutdown(w->control, SHUT_RDWR);  // the idle worker sees its control channel end
    ++retired;
  }
  if (retired > 0)
    FLYT_INFO(
        "session %llu hit a sticky error: %d idle worker(s) replaced (MPS recovers only "
        "once every client of the GPU has exited)",
        static_cast<unsigned long long>(reporter->session), retired);
}

void WorkerPool::Reap(Worker* w) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(w->pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  std::lock_guard<std::mutex> lock(mu_);
  WorkerSlot& s = (*board_)->slots[w->slot];
  const uint64_t charged = s.charged.exchange(0);
  Subtract(&(*board_)->memory_used, charged);
  for (int d = 0; d < kBoardDevices; ++d)
    Subtract(&(*board_)->memory_used_dev[d], s.charged_dev[d].exchange(0));
  calls_ended_ += s.calls.exchange(0);
  bytes_in_ended_ += s.bytes_in.exchange(0);
  bytes_out_ended_ += s.bytes_out.exchange(0);
  const bool crashed =
      r == w->pid && (WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0));
  std::string how = !WIFSIGNALED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                         : std::string("signal ") + strsignal(WTERMSIG(status));
  if (!w->ready && !w->retired) {
    ++failed_starts_;
    last_failure_ = "worker " + std::to_string(w->pid) + " ended before it was ready, " + how;
    FLYT_ERROR("%s", last_failure_.c_str());
  } else if (crashed) {
    ++crashed_;
    FLYT_WARN(
        "worker %d (session %llu, client pid %u) ended with %s; %llu bytes it held "
        "returned to the quota; the server and its other clients go on",
        static_cast<int>(w->pid), static_cast<unsigned long long>(w->session), s.client_pid.load(),
        how.c_str(), static_cast<unsigned long long>(charged));
  } else if (w->assigned || w->retired) {
    FLYT_INFO("worker %d (session %llu) ended", static_cast<int>(w->pid),
              static_cast<unsigned long long>(w->session));
  }
  if (w->assigned) last_end_ns_ = SteadyNowNs();
  s.pid = 0;
  s.client_pid = 0;
  s.device = -1;
  s.session = 0;
  s.capturing = 0;
  s.share_generation = 0;
  s.state = 0;
  for (auto it = shareables_.begin(); it != shareables_.end();) {
    if (it->second.slot == w->slot) {
      close(it->second.fd);
      it = shareables_.erase(it);
    } else {
      ++it;
    }
  }
  close(w->control);
  close(w->requests);
  workers_.erase(w->slot);  // destroys *w
  TopUpLocked();
  ready_cv_.notify_all();
}

Status WorkerPool::Assign(const channel::Ticket& ticket,
                          const std::function<Status(Worker*)>& send) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Status st;
  for (int attempt = 0; attempt < 3; ++attempt) {
    Worker* w = nullptr;
    for (;;) {
      for (auto& [slot, cand] : workers_)
        if (cand->ready && !cand->assigned && !cand->retired) w = cand.get();
      if (w != nullptr) break;
      bool starting = false;
      for (auto& [slot, cand] : workers_)
        if (!cand->ready && !cand->assigned && !cand->retired) starting = true;
      if (!starting) {
        if (failed_starts_ >= kMaxFailedStarts) failed_starts_ = kMaxFailedStarts - 1;  // once more
        st = SpawnLocked();
        if (!st.ok()) return st;
      }
      if (ready_cv_.wait_until(lock, deadline) == std::cv_status::timeout)
        return Status::Error("no worker became ready within 60 s" +
                             (last_failure_.empty() ? "" : " (" + last_failure_ + ")"));
      if (failed_starts_ >= kMaxFailedStarts)
        return Status::Error("workers fail to start: " + last_failure_);
    }
    w->assigned = true;
    w->session = ticket.session;
    w->secret = ticket.secret;
    (*board_)->slots[w->slot].session = ticket.session;
    st = send(w);
    TopUpLocked();
    if (st.ok()) return st;
    FLYT_WARN("worker %d could not take a client (%s); trying another", static_cast<int>(w->pid),
              st.message().c_str());
  }
  return st;
}

Status WorkerPool::Serve(const channel::Ticket& ticket, transport::DetachedConnection* conn) {
  return Assign(ticket, [&](Worker* w) {
    Status st = channel::SendConnection(w->control, channel::Type::kServe, &ticket, conn);
    if (st.ok()) transport::CloseDetached(conn);  // the worker has its own copies now
    return st;
  });
}

Status WorkerPool::ServeRestoreFile(const channel::Ticket& ticket, int fd) {
  Status st = Assign(ticket, [&](Worker* w) {
    return channel::Send(w->control, channel::Type::kRestoreFile, &ticket, sizeof(ticket), {fd});
  });
  close(fd);
  return st;
}

bool WorkerPool::FindResume(const uint64_t key[2], uint64_t* session, uint64_t* secret) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [slot, w] : workers_) {
    if (!w->awaiting_resume || w->resume_key[0] != key[0] || w->resume_key[1] != key[1]) continue;
    *session = w->session;
    *secret = w->secret;
    return true;
  }
  return false;
}

Status WorkerPool::RouteResume(const uint64_t key[2], transport::DetachedConnection* conn) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [slot, w] : workers_) {
    if (!w->awaiting_resume || w->resume_key[0] != key[0] || w->resume_key[1] != key[1]) continue;
    Status st = channel::SendConnection(w->control, channel::Type::kResume, nullptr, conn);
    if (st.ok()) {
      transport::CloseDetached(conn);
      w->awaiting_resume = false;  // a key is good for one resume
    }
    return st;
  }
  return Status::Error("no session waits for this key");
}

int WorkerPool::AskMove(const channel::MoveOrder& order) {
  std::vector<uint8_t> payload = channel::EncodeMoveOrder(order);
  std::lock_guard<std::mutex> lock(mu_);
  int asked = 0;
  for (auto& [slot, w] : workers_) {
    if (!w->assigned || w->awaiting_resume || w->retired) continue;
    if (channel::Send(w->control, channel::Type::kMove, payload.data(), payload.size()).ok())
      ++asked;
  }
  return asked;
}

uint64_t WorkerPool::LastReport() {
  std::lock_guard<std::mutex> lock(mu_);
  return report_seq_;
}

std::vector<channel::Report> WorkerPool::WaitReports(channel::Report::Kind kind, uint64_t after,
                                                     size_t want, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<channel::Report> got;
  auto collect = [&] {
    got.clear();
    for (auto& [seq, r] : reports_)
      if (seq > after && r.kind == kind) got.push_back(r);
    return got.size() >= want;
  };
  reports_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), collect);
  collect();
  return got;
}

bool WorkerPool::KnowsSession(uint64_t session, uint64_t secret) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [slot, w] : workers_)
    if (w->assigned && w->session == session) return secret != 0 && w->secret == secret;
  return false;
}

Status WorkerPool::RouteCallback(uint64_t session, uint64_t secret,
                                 transport::DetachedConnection* conn, channel::Type type) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [slot, w] : workers_) {
    if (!w->assigned || w->session != session) continue;
    if (secret == 0 || w->secret != secret) break;
    Status st = channel::SendConnection(w->control, type, nullptr, conn);
    if (st.ok()) transport::CloseDetached(conn);
    return st;
  }
  return Status::Error("unknown session or wrong secret");
}

std::vector<WorkerPool::WorkerInfo> WorkerPool::Workers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerInfo> out;
  for (auto& [slot, w] : workers_) {
    const WorkerSlot& s = (*board_)->slots[slot];
    WorkerInfo i;
    i.pid = w->pid;
    i.client_pid = s.client_pid.load();
    i.session = w->assigned ? w->session : 0;
    i.state = StateName(s.state.load());
    i.memory_used = s.charged.load();
    i.calls = s.calls.load();
    i.rss_bytes = ResidentBytes(w->pid);
    out.push_back(i);
  }
  return out;
}

WorkerPool::Counters WorkerPool::counters() {
  std::lock_guard<std::mutex> lock(mu_);
  Counters c;
  c.size = size_;
  for (auto& [slot, w] : workers_) {
    if (w->assigned) {
      ++c.serving;
    } else if (w->ready) {
      ++c.idle;
    } else {
      ++c.starting;
    }
    c.calls += (*board_)->slots[slot].calls.load();
    c.bytes_in += (*board_)->slots[slot].bytes_in.load();
    c.bytes_out += (*board_)->slots[slot].bytes_out.load();
  }
  c.started = started_;
  c.crashed = crashed_;
  c.calls += calls_ended_;
  c.bytes_in += bytes_in_ended_;
  c.bytes_out += bytes_out_ended_;
  c.last_end_ns = last_end_ns_;
  c.images = images_.count();
  c.image_bytes = images_.bytes();
  return c;
}

}  // namespace flyt::server
