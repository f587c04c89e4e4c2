// flyt-server: serves the CUDA calls of remote client processes on this host's GPU.
//
// One program, two roles. The main process owns the command line, the tenant
// board (server/tenant_board.h), the listeners and the handshake
// (server/acceptor.h), the worker pool (server/worker_pool.h), the control
// socket (server/control_socket.h) and removing the socket files when a
// signal ends the server; it holds no CUDA context and executes no client's
// call. Started with --worker (by the pool), the program is a worker
// (server/worker.h): one client process's CUDA, in a process of its own.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "server/acceptor.h"
#include "server/control_socket.h"
#include "server/session.h"
#include "server/tenant_board.h"
#include "server/worker.h"
#include "server/worker_pool.h"
#include "transport/emulated_transport.h"
#include "transport/shm_transport.h"
#include "transport/tls_server.h"
#include "transport/transport.h"

namespace {

void Usage() {
  std::fprintf(
      stderr,
      "usage: flyt-server [--listen ADDR]... [--backend cuda|sim] [--token TOKEN]\n"
      "                   [--memory-quota BYTES] [--sm-count N] [--control unix:///PATH]\n"
      "                   [--sim-record FILE] [--sim-green-contexts] [--sim-devices N]\n"
      "                   [--sim-no-peer] [--sim-texture-base N] [--emulate SPEC]\n"
      "                   [--shm-backing memfd|file:DIR] [--worker-pool N] [--movable-memory]\n"
      "                   [--tls-cert PEM --tls-key PEM [--tls-ca PEM]] [--tls-peer-ca PEM]\n"
      "  ADDR: tcp://HOST:PORT (default tcp://0.0.0.0:14833; port 0: the kernel picks),\n"
      "        tls://HOST:PORT (TCP with TLS 1.3: needs --tls-cert and --tls-key),\n"
      "        unix:///PATH or shm:///PATH (shared memory for clients on this host, which\n"
      "        also move to it by themselves from tcp/unix; docs/shared_memory.md)\n"
      "  --shm-backing: where shm:// segments live: memfd (default, sealed) or file:DIR\n"
      "        (a file in DIR, unlinked at once; default: $FLYT_SHM_BACKING)\n"
      "  --token: credential clients must present (default: $FLYT_TOKEN, else none)\n"
      "  --memory-quota: device memory all sessions together may allocate on each GPU\n"
      "        (suffix K, M, G, T: binary multiples); 0 (default) = no quota\n"
      "  --sm-count: SMs the tenant's kernels run on (green contexts, or MPS's\n"
      "        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); 0 (default) = the whole GPU\n"
      "  --control: JSON control socket (stats, set-share), created 0600\n"
      "  --backend sim: host memory, records launches, runs no kernel (testing only);\n"
      "        --sim-green-contexts gives it fake green contexts; --sim-devices N (1..16,\n"
      "        default 1) presents N devices, peer-capable unless --sim-no-peer;\n"
      "        --sim-texture-base N: texture object values start at N (the driver's: 1)\n"
      "  --emulate: delay replies as a network would, e.g. rtt=100us,bandwidth=1gbit\n"
      "        (default: $FLYT_EMULATE or $FLYT_EMULATE_FILE; docs/emulator.md)\n"
      "  --worker-pool: workers kept started, CUDA initialised, for the next clients\n"
      "        (default: $FLYT_WORKER_POOL, else 2); each client process is served by a\n"
      "        worker process of its own\n"
      "  --movable-memory: place cuMemAlloc memory so that sessions can always be migrated\n"
      "        or checkpointed (control verbs migrate, checkpoint); CUDA IPC handles of such\n"
      "        memory are refused, and modules load eagerly (CUDA_MODULE_LOADING=EAGER\n"
      "        unless set) (default: $FLYT_MOVABLE_MEMORY=1)\n"
      "  --tls-cert, --tls-key: the server's certificate chain and key for tls:// listeners;\n"
      "        --tls-ca: only clients with a certificate this CA signed are accepted;\n"
      "        --tls-peer-ca: the CA that signed other servers' certificates, checked when a\n"
      "        session migrates to a tls:// server (default: the system's trust store)\n"
      "  logging: FLYT_LOG=error|warn|info|debug|trace, FLYT_LOG_FILE=PATH\n");
}

// Socket files removed when a signal ends the server.
constexpr int kMaxCleanup = 8;
char g_cleanup[kMaxCleanup][108];
int g_cleanup_count = 0;

void AddCleanup(const std::string& path) {
  if (g_cleanup_count >= kMaxCleanup || path.size() >= sizeof(g_cleanup[0])) return;
  std::memcpy(g_cleanup[g_cleanup_count], path.c_str(), path.size() + 1);
  ++g_cleanup_count;
}

void OnTerminate(int sig) {
  for (int i = 0; i < g_cleanup_count; ++i) unlink(g_cleanup[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

bool ParseCount(const std::string& text, int* out) {
  if (text.empty() || text.size() > 7) return false;
  int v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flyt;
  signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> listens;
  std::string control_address;
  std::string token;
  server::ServerOptions options;
  server::WorkerArgs worker;
  bool is_worker = false;
  int pool_size = 2;
  if (const char* t = std::getenv("FLYT_TOKEN")) token = t;
  // Flags only: FLYT_TLS_* are the client library's settings (the CA it trusts), and a
  // server started from the same shell must not take them for its own.
  transport::TlsServerFiles tls_files;
  if (const char* p = std::getenv("FLYT_WORKER_POOL");
      p != nullptr && *p != '\0' && !ParseCount(p, &pool_size)) {
    std::fprintf(stderr, "flyt-server: FLYT_WORKER_POOL '%s' is not a number of workers\n", p);
    return 2;
  }
  Status emulate_st = transport::EmulationFromEnvironment(&options.emulate);
  if (const char* m = std::getenv("FLYT_MOVABLE_MEMORY"); m != nullptr && std::string(m) == "1")
    options.movable_memory = true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flyt-server: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--listen") {
      listens.push_back(value("--listen"));
    } else if (arg == "--backend") {
      options.backend = value("--backend");
    } else if (arg == "--token") {
      token = value("--token");
    } else if (arg == "--sim-record") {
      options.sim.record_path = value("--sim-record");
    } else if (arg == "--sim-green-contexts") {
      options.sim.green_contexts = true;
    } else if (arg == "--sim-devices") {
      std::string v = value("--sim-devices");
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1 || n > 16) {
        std::fprintf(stderr, "flyt-server: --sim-devices '%s' is not a count from 1 to 16\n",
                     v.c_str());
        return 2;
      }
      options.sim.devices = static_cast<int>(n);
    } else if (arg == "--sim-no-peer") {
      options.sim.peer = false;
    } else if (arg == "--sim-texture-base") {
      std::string v = value("--sim-texture-base");
      char* end = nullptr;
      unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1 || n > (1ull << 32)) {
        std::fprintf(stderr, "flyt-server: --sim-texture-base '%s' is not a value from 1\n",
                     v.c_str());
        return 2;
      }
      options.sim.texture_base = n;
    } else if (arg == "--memory-quota") {
      std::string v = value("--memory-quota");
      if (!server::ParseByteCount(v, &options.share.memory_quota)) {
        std::fprintf(stderr, "flyt-server: --memory-quota '%s' is not a byte count\n", v.c_str());
        return 2;
      }
    } else if (arg == "--sm-count") {
      std::string v = value("--sm-count");
      if (!ParseCount(v, &options.share.sm_count)) {
        std::fprintf(stderr, "flyt-server: --sm-count '%s' is not a number of SMs\n", v.c_str());
        return 2;
      }
    } else if (arg == "--movable-memory") {
      options.movable_memory = true;
    } else if (arg == "--worker-pool") {
      std::string v = value("--worker-pool");
      if (!ParseCount(v, &pool_size) || pool_size > 32) {
        std::fprintf(stderr, "flyt-server: --worker-pool '%s' is not a number of workers (0-32)\n",
                     v.c_str());
        return 2;
      }
    } else if (arg == "--emulate") {
      emulate_st = transport::ParseEmulation(value("--emulate"), &options.emulate);
      if (!emulate_st.ok()) emulate_st = Status::Error("--emulate: " + emulate_st.message());
    } else if (arg == "--control") {
      control_address = value("--control");
    } else if (arg == "--tls-cert") {
      tls_files.cert = value("--tls-cert");
    } else if (arg == "--tls-key") {
      tls_files.key = value("--tls-key");
    } else if (arg == "--tls-ca") {
      tls_files.ca = value("--tls-ca");
    } else if (arg == "--tls-peer-ca") {
      options.migrate_tls.ca = value("--tls-peer-ca");
    } else if (arg == "--shm-backing") {
      setenv("FLYT_SHM_BACKING", value("--shm-backing").c_str(), 1);
    } else if (arg == "--worker") {
      std::string v = value("--worker");
      if (!server::ParseWorkerArgs(v, &worker)) {
        std::fprintf(stderr, "flyt-server: --worker '%s': started by flyt-server only\n",
                     v.c_str());
        return 2;
      }
      is_worker = true;
    } else if (arg == "-h" || arg == "--help") {
      Usage();
      return 0;
    } else {
      std::fprintf(stderr, "flyt-server: unknown argument '%s'\n", arg.c_str());
      Usage();
      return 2;
    }
  }
  // Movable memory moves only with code that the target's driver places where
  // the source's did: module code and data loaded when their module is, not
  // on first use (measured on the H200: with lazy loading a PyTorch process's
  // cuBLAS globals land elsewhere on the target). Before the driver starts,
  // in this process and so in the workers it starts; an explicit
  // CUDA_MODULE_LOADING stays as it is.
  if (options.movable_memory && std::getenv("CUDA_MODULE_LOADING") == nullptr)
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  // A session moved to a tls:// server: this server's certificate, where it has one, is
  // its client certificate there.
  options.migrate_tls.cert = tls_files.cert;
  options.migrate_tls.key = tls_files.key;
  if (is_worker) return server::RunWorker(worker, options);
  log::SetProcessTag("flyt-server");
  auto state = std::make_unique<server::ServerState>();
  state->token = token;
  state->movable_memory = options.movable_memory;
  const transport::EmulationSettings& emulate = options.emulate;
  if (listens.empty()) listens.push_back("tcp://0.0.0.0:14833");
  std::string shm_file_dir;
  if (Status backing = transport::ShmBackingFromEnv(&shm_file_dir); !backing.ok()) {
    std::fprintf(stderr, "flyt-server: %s\n", backing.message().c_str());
    return 2;
  }
  if (struct stat sb{};
      !shm_file_dir.empty() && (stat(shm_file_dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))) {
    std::fprintf(stderr, "flyt-server: --shm-backing file:%s: not a folder\n",
                 shm_file_dir.c_str());
    return 2;
  }
  if (!emulate_st.ok()) {
    std::fprintf(stderr, "flyt-server: %s\n", emulate_st.message().c_str());
    return 2;
  }
  if (emulate.enabled()) {
    std::fprintf(stderr, "flyt-server: network emulation on for replies: %s\n",
                 emulate.ToString().c_str());
  }
  Status st;
  if (options.backend == "cuda") {
    st = server::LoadCudaDriver(&state->api);
  } else if (options.backend == "sim") {
    st = server::LoadSimDriver(options.sim, &state->api);
  } else {
    std::fprintf(stderr, "flyt-server: unknown backend '%s' (cuda or sim)\n",
                 options.backend.c_str());
    return 2;
  }
  std::unique_ptr<server::TenantBoard> board;
  if (st.ok()) st = server::DescribeDevices(state.get());
  if (st.ok()) st = server::TenantBoard::Create(&board);
  if (st.ok()) {
    // The main process holds no context: the workers make (and probe) the
    // green contexts of the share.
    state->board = board.get();
    state->share.UseCounters(&board->layout().memory_used, &board->layout().memory_quota,
                             board->layout().memory_used_dev);
    server::ShareOptions share = options.share;
    share.probe = false;
    st = state->share.Init(&state->api, state->devices, share);
    board->layout().sm_requested = state->share.Get().sm_requested;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "flyt-server: %s\n", st.message().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<transport::Listener>> listeners;
  std::vector<bool> listener_tls;
  std::shared_ptr<transport::TlsServerContext> tls;
  for (const auto& text : listens) {
    transport::Address addr;
    st = transport::ParseAddress(text, &addr);
    if (st.ok() && addr.kind == transport::Address::Kind::kTls && !tls)
      st = transport::MakeTlsServerContext(tls_files, &tls);
    std::unique_ptr<transport::Listener> l;
    if (st.ok()) st = transport::Listen(addr, &l);
    if (!st.ok()) {
      std::fprintf(stderr, "flyt-server: %s\n", st.message().c_str());
      return 1;
    }
    if (addr.kind == transport::Address::Kind::kUnix) AddCleanup(addr.path);
    // Clients on this kernel that reach us another way move to shared memory.
    if (addr.kind == transport::Address::Kind::kShm && state->shm_offer.empty() &&
        !emulate.enabled() && !addr.path.empty() && addr.path[0] == '/')
      state->shm_offer = l->Describe();
    state->listen.push_back(l->Describe());
    listeners.push_back(std::move(l));
    listener_tls.push_back(addr.kind == transport::Address::Kind::kTls);
  }
  state->boot_id = transport::KernelBootId();
  state->start_ns = server::SteadyNowNs();
  std::vector<std::string> worker_argv(argv, argv + argc);
  server::WorkerPool pool(board.get(), worker_argv, pool_size);
  state->pool = &pool;
  st = pool.Start(120000);
  if (!st.ok()) {
    std::fprintf(stderr, "flyt-server: %s\n", st.message().c_str());
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnTerminate;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  std::fprintf(stderr, "flyt-server: %s backend, %zu GPU(s), driver %d, listening on",
               options.backend.c_str(), state->devices.size(), state->driver_version);
  for (const auto& l : state->listen) std::fprintf(stderr, " %s", l.c_str());
  std::fprintf(stderr, "%s\n", state->token.empty() ? " (no token required)" : "");
  // Last: a control socket that answers means the server is ready.
  std::unique_ptr<server::ControlSocket> control;
  if (!control_address.empty()) {
    st = server::ControlSocket::Start(control_address, state.get(), &control);
    if (!st.ok()) {
      std::fprintf(stderr, "flyt-server: %s\n", st.message().c_str());
      return 1;
    }
    AddCleanup(control->path());
  }
  server::Share::Snapshot snap = state->share.Get();
  std::fprintf(
      stderr,
      "flyt-server: share %d of %d SMs (%s), memory quota %s, %d worker(s) kept ready%s%s\n",
      snap.sm, snap.sm_total, server::SmMechanismName(snap.mechanism),
      snap.memory_quota ? std::to_string(snap.memory_quota).c_str() : "none", pool_size,
      control ? ", control " : "", control ? control->Describe().c_str() : "");
  std::vector<std::thread> acceptors;
  server::Acceptor acceptor(state.get(), state->pool, emulate);
  for (size_t i = 0; i < listeners.size(); ++i)
    acceptors.emplace_back(
        [&acceptor, listener = listeners[i].get(), t = listener_tls[i] ? tls.get() : nullptr] {
          acceptor.Run(listener, t);
        });
  for (auto& t : acceptors) t.join();
  return 1;
}
