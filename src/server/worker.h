// A flyt-server worker: the process that serves one client process.
//
// As on a local GPU, each client process has CUDA contexts of its own: a
// sticky error, device printf, cudaDeviceReset and limits stay with it. The
// main process (server/worker_pool.h) starts each worker ahead of time with
// `--worker`; the worker initialises CUDA and retains the primary context
// before any client comes, tells the main process it is ready, and then
// serves the one client it is handed (server/session.h) directly over the
// client's own connection. When that client leaves or dies, the worker
// releases everything and exits, which returns all its GPU memory.
// Owns: the worker's start, its link to the main process (MainLink: code
// images, callback channels, the end of the main process) and its exit.
// Must not touch another worker's state; what is the tenant's (quota, share,
// process list) it reads and charges through the tenant board.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "server/driver_api.h"
#include "server/image_cache.h"
#include "server/share.h"
#include "server/worker_channel.h"
#include "transport/emulated_transport.h"
#include "transport/tls_server.h"

namespace flyt::server {

// What flyt-server's command line says, for the main process and its workers.
struct ServerOptions {
  std::string backend = "cuda";
  SimOptions sim;
  ShareOptions share;
  transport::EmulationSettings emulate;
  // cuMemAlloc memory placed so that another server can take it over
  // (server/session_movable.cc); legacy CUDA IPC of it is refused.
  bool movable_memory = false;
  // A live migration to a tls:// server: the CA its certificate must be signed by
  // (--tls-peer-ca; empty: the system's trust store) and this server's certificate.
  transport::TlsDialFiles migrate_tls;
};

// The descriptors a worker inherits: "--worker CTL,REQ,BOARD,SLOT".
struct WorkerArgs {
  int control = -1;   // main -> worker
  int requests = -1;  // worker -> main, and the answers
  int board = -1;     // the tenant board's memfd
  int slot = -1;      // this worker's slot in the board
};
bool ParseWorkerArgs(const std::string& text, WorkerArgs* out);
std::string FormatWorkerArgs(const WorkerArgs& args);

// Runs a worker to its end; returns the process's exit status.
int RunWorker(const WorkerArgs& args, const ServerOptions& options);

// The worker's side of the request channel; one request at a time.
class MainLink {
 public:
  explicit MainLink(int fd) : fd_(fd) {}
  Status Ready();
  // The image the main process has under this hash, or null.
  std::shared_ptr<const ImageBytes> FindImage(uint64_t h0, uint64_t h1);
  // Gives a client's image to the main process for the server's other
  // workers; returns this worker's view of it.
  std::shared_ptr<const ImageBytes> PutImage(uint64_t h0, uint64_t h1, const uint8_t* bytes,
                                             size_t size);
  // Keeps a VMM shareable descriptor (cuMemExportToShareableHandle) in the
  // main process for the server's other workers while this worker lives;
  // the caller keeps its own descriptor.
  Status PutShareable(int fd, uint64_t* key, uint64_t* secret);
  // A new descriptor for what another worker put under key and secret, or -1.
  int GetShareable(uint64_t key, uint64_t secret);
  // Tells the main process that this worker's client hit a sticky error.
  void ReportSticky();
  // A restored session waits for the client that holds `key` (ops::kOpResume).
  void OfferResume(const uint64_t key[2]);
  // How a move or a restore ended, for the control socket.
  void Report(const channel::Report& report);

 private:
  std::mutex mu_;
  int fd_;
};

}  // namespace flyt::server
