// Implementation of server/worker.h.
#include "server/worker.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "server/reply_frame.h"
#include "server/session.h"
#include "server/session_snapshot.h"
#include "server/tenant_board.h"
#include "server/worker_channel.h"
#include "transport/tls_server.h"

namespace flyt::server {
namespace {

// Takes the descriptors of a detached connection and continues it here,
// behind the same emulated network as the main process, if any.
Status Continue(transport::DetachedConnection* d, const ServerOptions& options,
                std::unique_ptr<transport::Connection>* out) {
  Status st = d->kind == transport::DetachedConnection::Kind::kTls
                  ? transport::ReattachTls(std::move(*d), out)
                  : transport::Reattach(std::move(*d), out);
  if (st.ok() && options.emulate.enabled())
    *out = transport::WrapEmulated(std::move(*out), options.emulate);
  return st;
}

// Before any client: the primary context of GPU 0, retained and current, with
// the driver's default limits (the client sets its own, as on a local GPU).
// This is what makes a client's first call fast.
void Prewarm(ServerState* state) {
  DriverApi& a = state->api;
  if (state->devices.empty()) return;
  CUcontext ctx = nullptr;
  CUresult rc = a.cuDevicePrimaryCtxRetain(&ctx, 0);
  if (rc != CUDA_SUCCESS) {
    FLYT_WARN("worker: cannot retain the primary context of GPU 0 (error %d)", rc);
    return;
  }
  rc = a.cuCtxSetCurrent(ctx);
  if (rc != CUDA_SUCCESS) FLYT_WARN("worker: cuCtxSetCurrent of GPU 0 failed (error %d)", rc);
}

Status Boot(const WorkerArgs& args, const ServerOptions& options, ServerState* state,
            std::unique_ptr<TenantBoard>* board) {
  Status st = TenantBoard::Map(args.board, board);
  if (!st.ok()) return st;
  state->board = board->get();
  state->movable_memory = options.movable_memory;
  state->sim_backend = options.backend == "sim";
  state->migrate_tls = options.migrate_tls;
  state->slot = &(*board)->layout().slots[args.slot];
  st = options.backend == "sim" ? LoadSimDriver(options.sim, &state->api)
                                : LoadCudaDriver(&state->api);
  if (st.ok()) st = DescribeDevices(state);
  if (st.ok() && options.backend != "sim") st = CaptureDeviceOutput(state);
  if (!st.ok()) return st;
  BoardLayout& b = state->board->layout();
  state->share.UseCounters(&b.memory_used, &b.memory_quota, b.memory_used_dev);
  state->share_seen = b.share_generation.load();
  ShareOptions share;
  share.memory_quota = b.memory_quota.load();
  share.sm_count = b.sm_requested.load();
  st = state->share.Init(&state->api, state->devices, share);
  state->slot->share_generation = state->share_seen;
  if (st.ok()) Prewarm(state);
  return st;
}

// How long a restored session waits for its client (ops::kOpResume): a
// checkpointed client asks again until its server is back; a client moved live
// heard where to go on once the restore was confirmed and comes at once, so a
// live move's session that no client claims (the client exited while parked)
// is let go sooner.
constexpr int kResumeWaitMs = 10 * 60 * 1000;
constexpr int kLiveResumeWaitMs = 2 * 60 * 1000;

// A session moved here: restores it from the snapshot (a file, or the moving
// server's connection, which is then answered), then waits for the client
// to resume. False when there is nothing to serve (the state is released).
bool RestoreSession(Session* session, const channel::Ticket& ticket, const WorkerArgs& args,
                    const ServerOptions& options, MainLink* link, int fd,
                    std::unique_ptr<transport::Connection> from) {
  const auto id = static_cast<unsigned long long>(ticket.session);
  uint64_t key[2] = {0, 0};
  Status st;
  const int64_t t0 = SteadyNowNs();
  if (fd >= 0) {
    SnapshotReader in(fd);
    st = session->Restore(in, key);
    ::close(fd);
  } else {
    SnapshotReader in(from.get());
    st = session->Restore(in, key);
    wire::Writer out;
    out.PutString(st.ok() ? "" : st.message());
    wire::FrameHeader req{};
    req.op = ops::kOpRestoreSession;
    if (!SendReply(from.get(), req, st.ok() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, out.data(),
                   out.size()) &&
        st.ok())
      st = Status::Error("the moving server left before the restore was confirmed");
  }
  channel::Report report;
  report.kind = channel::Report::Kind::kRestore;
  report.ok = st.ok();
  report.session = ticket.session;
  report.message = st.ok() ? "restored" : st.message();
  link->Report(report);
  if (!st.ok()) {
    FLYT_ERROR("session %llu: restore failed: %s", id, st.message().c_str());
    session->ReleaseEverything();
    return false;
  }
  FLYT_INFO("session %llu: restored in %.1f ms; waiting for its client", id,
            static_cast<double>(SteadyNowNs() - t0) / 1e6);
  link->OfferResume(key);
  const int wait_ms = from == nullptr ? kResumeWaitMs : kLiveResumeWaitMs;
  for (;;) {
    channel::Message m;
    st = channel::Receive(args.control, &m, wait_ms);
    if (!st.ok()) break;
    transport::DetachedConnection d;
    std::unique_ptr<transport::Connection> conn;
    if (m.type == channel::Type::kResume && channel::ParseConnection(&m, nullptr, &d).ok() &&
        Continue(&d, options, &conn).ok()) {
      FLYT_INFO("session %llu: client pid %u resumed from %s", id, ticket.client_pid,
                conn->Peer().c_str());
      session->Resume(std::move(conn));
      return true;
    }
    channel::CloseFds(&m);
  }
  FLYT_WARN("session %llu: its client did not resume (%s); releasing it", id, st.message().c_str());
  session->ReleaseEverything();
  return false;
}

}  // namespace

bool ParseWorkerArgs(const std::string& text, WorkerArgs* out) {
  int v[4];
  char tail = 0;
  if (std::sscanf(text.c_str(), "%d,%d,%d,%d%c", &v[0], &v[1], &v[2], &v[3], &tail) != 4)
    return false;
  if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || v[3] >= kMaxWorkers) return false;
  *out = WorkerArgs{v[0], v[1], v[2], v[3]};
  return true;
}

std::string FormatWorkerArgs(const WorkerArgs& a) {
  return std::to_string(a.control) + "," + std::to_string(a.requests) + "," +
         std::to_string(a.board) + "," + std::to_string(a.slot);
}

Status MainLink::Ready() {
  std::lock_guard<std::mutex> lock(mu_);
  return channel::Send(fd_, channel::Type::kReady, nullptr, 0);
}

std::shared_ptr<const ImageBytes> MainLink::FindImage(uint64_t h0, uint64_t h1) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t key[2] = {h0, h1};
  channel::Message m;
  Status st = channel::Send(fd_, channel::Type::kImageFind, key, sizeof(key));
  if (st.ok()) st = channel::Receive(fd_, &m);
  std::shared_ptr<const ImageBytes> image;
  uint8_t found = 0;
  uint64_t size = 0;
  if (st.ok() && m.type == channel::Type::kImage && m.payload.size() == 9) {
    found = m.payload[0];
    std::memcpy(&size, m.payload.data() + 1, 8);
    if (found && m.fds.size() == 1) st = ImageBytes::Map(m.fds[0], size, &image);
  } else if (st.ok()) {
    st = Status::Error("unexpected answer");
  }
  channel::CloseFds(&m);
  if (!st.ok()) FLYT_WARN("worker: code image cache: %s", st.message().c_str());
  return image;
}

std::shared_ptr<const ImageBytes> MainLink::PutImage(uint64_t h0, uint64_t h1, const uint8_t* bytes,
                                                     size_t size) {
  Status st;
  int fd = ImageToMemfd(bytes, size, &st);
  std::shared_ptr<const ImageBytes> image;
  if (fd >= 0) {
    uint64_t msg[3] = {h0, h1, size};
    {
      std::lock_guard<std::mutex> lock(mu_);
      st = channel::Send(fd_, channel::Type::kImagePut, msg, sizeof(msg), {fd});
    }
    if (st.ok()) st = ImageBytes::Map(fd, size, &image);
    close(fd);
  }
  if (!st.ok()) {
    FLYT_WARN("worker: code image not shared with the server's other workers: %s",
              st.message().c_str());
    image = ImageBytes::Copy(bytes, size);
  }
  return image;
}

Status MainLink::PutShareable(int fd, uint64_t* key, uint64_t* secret) {
  std::lock_guard<std::mutex> lock(mu_);
  channel::Message m;
  Status st = channel::Send(fd_, channel::Type::kShareablePut, nullptr, 0, {fd});
  if (st.ok()) st = channel::Receive(fd_, &m);
  if (st.ok() && (m.type != channel::Type::kShareableKey || m.payload.size() != 16))
    st = Status::Error("unexpected answer to a shareable handle");
  if (st.ok()) {
    std::memcpy(key, m.payload.data(), 8);
    std::memcpy(secret, m.payload.data() + 8, 8);
  }
  channel::CloseFds(&m);
  return st;
}

int MainLink::GetShareable(uint64_t key, uint64_t secret) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t req[2] = {key, secret};
  channel::Message m;
  Status st = channel::Send(fd_, channel::Type::kShareableGet, req, sizeof(req));
  if (st.ok()) st = channel::Receive(fd_, &m);
  int fd = -1;
  if (st.ok() && m.type == channel::Type::kShareable && m.payload.size() == 1 && m.payload[0] &&
      m.fds.size() == 1) {
    fd = m.fds[0];
    m.fds.clear();
  }
  channel::CloseFds(&m);
  return fd;
}

void MainLink::ReportSticky() {
  std::lock_guard<std::mutex> lock(mu_);
  Status st = channel::Send(fd_, channel::Type::kSticky, nullptr, 0);
  if (!st.ok()) FLYT_WARN("worker: %s", st.message().c_str());
}

void MainLink::OfferResume(const uint64_t key[2]) {
  std::lock_guard<std::mutex> lock(mu_);
  Status st = channel::Send(fd_, channel::Type::kResumeKey, key, 16);
  if (!st.ok()) FLYT_WARN("worker: %s", st.message().c_str());
}

void MainLink::Report(const channel::Report& report) {
  std::vector<uint8_t> p = channel::EncodeReport(report);
  std::lock_guard<std::mutex> lock(mu_);
  Status st = channel::Send(fd_, channel::Type::kReport, p.data(), p.size());
  if (!st.ok()) FLYT_WARN("worker: %s", st.message().c_str());
}

namespace {

// A worker that dies of a fault writes where (its stack, as offsets in the
// binary: `addr2line -e flyt-server OFFSET` on an unstripped build names them)
// before it ends, so that a crash the main process reports can be traced.
void CrashReport(int sig, siginfo_t* info, void*) {
  char line[160];
  int n = std::snprintf(line, sizeof line,
                        "flyt-server worker %d: fatal signal %d at address %p; stack:\n",
                        static_cast<int>(getpid()), sig, info != nullptr ? info->si_addr : nullptr);
  if (n > 0 && write(STDERR_FILENO, line, static_cast<size_t>(n)) < 0) n = 0;
  void* frames[48];
  int depth = backtrace(frames, 48);
  backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallCrashReport() {
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  struct sigaction sa {};
  sa.sa_sigaction = CrashReport;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) sigaction(sig, &sa, nullptr);
}

}  // namespace

int RunWorker(const WorkerArgs& args, const ServerOptions& options) {
  InstallCrashReport();
  static char tag[48];
  std::snprintf(tag, sizeof(tag), "flyt-server worker %d", static_cast<int>(getpid()));
  log::SetProcessTag(tag);
  auto state = std::make_unique<ServerState>();
  std::unique_ptr<TenantBoard> board;
  Status st = Boot(args, options, state.get(), &board);
  if (!st.ok()) {
    FLYT_ERROR("worker cannot start: %s", st.message().c_str());
    return 1;
  }
  MainLink link(args.requests);
  state->link = &link;
  st = link.Ready();
  // Idle in the pool until the main process hands over a client (or a
  // session to restore: from a server that moves it here, or from a file).
  channel::Message m;
  if (st.ok()) st = channel::Receive(args.control, &m);
  if (!st.ok()) return 0;  // the main process is gone: nothing to serve
  channel::Ticket ticket;
  transport::DetachedConnection detached;
  std::unique_ptr<transport::Connection> conn;
  int restore_fd = -1;
  if (m.type == channel::Type::kServe) {
    st = channel::ParseConnection(&m, &ticket, &detached);
    if (st.ok()) st = Continue(&detached, options, &conn);
  } else if (m.type == channel::Type::kRestoreFile && m.payload.size() == sizeof(ticket) &&
             m.fds.size() == 1) {
    std::memcpy(&ticket, m.payload.data(), sizeof(ticket));
    restore_fd = m.fds[0];
    m.fds.clear();
  } else {
    st = Status::Error("expected a client to serve");
  }
  if (!st.ok()) {
    channel::CloseFds(&m);
    FLYT_ERROR("worker: cannot take over the client's connection: %s", st.message().c_str());
    return 1;
  }
  const bool restoring = restore_fd >= 0 || (ticket.flags & channel::kTicketRestore) != 0;
  state->slot->session = ticket.session;
  state->slot->client_pid = ticket.client_pid;
  state->slot->state = static_cast<uint32_t>(WorkerState::kServing);
  if (!restoring)
    FLYT_INFO("session %llu: client pid %u from %s",
              static_cast<unsigned long long>(ticket.session), ticket.client_pid,
              conn->Peer().c_str());
  {
    Session session(state.get(), restoring ? nullptr : std::move(conn), ticket);
    if (restoring &&
        !RestoreSession(&session, ticket, args, options, &link, restore_fd, std::move(conn)))
      _exit(0);
    // The control channel now brings the client's callback channel; its end
    // means the main process is gone, which ends the session too.
    std::thread control([&] {
      for (;;) {
        channel::Message c;
        if (!channel::Receive(args.control, &c).ok()) break;
        transport::DetachedConnection d;
        std::unique_ptr<transport::Connection> cb;
        bool side = c.type == channel::Type::kCallback || c.type == channel::Type::kPaging;
        if (side && channel::ParseConnection(&c, nullptr, &d).ok() &&
            Continue(&d, options, &cb).ok()) {
          if (c.type == channel::Type::kPaging) {
            session.AttachPagingChannel(std::move(cb));
          } else {
            session.AttachCallbackChannel(std::move(cb));
          }
        }
        channel::MoveOrder order;
        if (c.type == channel::Type::kMove && channel::DecodeMoveOrder(c.payload, &order))
          session.RequestMove(order);
        channel::CloseFds(&c);
      }
      if (state->slot->state.load() == static_cast<uint32_t>(WorkerState::kServing))
        session.Abort();
    });
    session.Run();
    state->slot->state = static_cast<uint32_t>(WorkerState::kEnding);
    ::shutdown(args.control, SHUT_RDWR);
    control.join();
  }
  std::fflush(stdout);
  std::fflush(stderr);
  // The process's exit returns its contexts and memory to the driver; what
  // the session charged to the quota it refunded already.
  _exit(0);
}

}  // namespace flyt::server
