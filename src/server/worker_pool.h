// flyt-server's workers, as its main process sees them.
//
// Each client process is served by a worker process of its own
// (server/worker.h). The pool keeps `size` workers started ahead of time, CUDA
// initialised and the primary context retained, so that a new client is
// handed to one at once instead of waiting for a fresh context; it starts a
// replacement for each worker it hands out. It answers the workers' requests
// (the server's code-image cache), routes a client's callback channel to the
// worker of its session, and reaps workers: a worker that exits or crashes
// has its charges refunded from the tenant's quota and its slot freed, and a
// crash is logged and counted; no other worker notices.
// Owns: worker processes, their channels and their slots in the tenant
// board. Must not execute CUDA calls or read a client's frames.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "server/image_cache.h"
#include "server/tenant_board.h"
#include "server/worker_channel.h"

namespace flyt::server {

// Resident memory of process `pid` (0 if it is gone).
uint64_t ResidentBytes(pid_t pid);

class WorkerPool {
 public:
  // `argv`: how to start a worker (this program and its options; the pool
  // appends --worker). `size`: idle workers kept ready.
  WorkerPool(TenantBoard* board, std::vector<std::string> argv, int size);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts the first `size` workers; waits up to timeout_ms for one to be ready.
  Status Start(int timeout_ms);
  // Hands the client to an idle worker (waiting for one to start if none is
  // idle) and closes this process's copies of its descriptors.
  Status Serve(const channel::Ticket& ticket, transport::DetachedConnection* conn);
  // Hands a client's callback channel to the worker that serves `session`.
  Status RouteCallback(uint64_t session, uint64_t secret, transport::DetachedConnection* conn,
                       channel::Type type = channel::Type::kCallback);
  // True if `session` is served now and `secret` is its secret.
  bool KnowsSession(uint64_t session, uint64_t secret);

  // --- moving sessions (server/session_migrate.cc)
  // Hands a checkpoint file (its descriptor, which this call closes) to an
  // idle worker, which restores the session and waits for its client.
  Status ServeRestoreFile(const channel::Ticket& ticket, int fd);
  // The restored session waiting for the client with `key`: its id and
  // secret (for the client's handshake reply); false when none (yet).
  bool FindResume(const uint64_t key[2], uint64_t* session, uint64_t* secret);
  // Hands the client's connection to that session's worker.
  Status RouteResume(const uint64_t key[2], transport::DetachedConnection* conn);
  // Tells every session that has a client to move at its next park; returns
  // how many were told.
  int AskMove(const channel::MoveOrder& order);
  // Reports of moves and restores, numbered from 1. Waits until `want` of
  // `kind` after number `after` are in (or timeout_ms), returns those.
  uint64_t LastReport();
  std::vector<channel::Report> WaitReports(channel::Report::Kind kind, uint64_t after, size_t want,
                                           int timeout_ms);

  struct WorkerInfo {
    pid_t pid = 0;
    uint32_t client_pid = 0;
    uint64_t session = 0;
    const char* state = "";
    uint64_t memory_used = 0;
    uint64_t calls = 0;
    uint64_t rss_bytes = 0;
  };
  std::vector<WorkerInfo> Workers();
  struct Counters {
    int size = 0;      // idle workers kept ready
    int idle = 0;      // ready now
    int starting = 0;  // started, not ready yet
    int serving = 0;   // serving a client
    uint64_t started = 0;
    uint64_t crashed = 0;   // ended by a signal or a nonzero exit
    uint64_t calls = 0;     // calls of all clients, ended ones too
    uint64_t bytes_in = 0;  // frame bytes from and to all clients, ended ones too
    uint64_t bytes_out = 0;
    int64_t last_end_ns = 0;  // steady clock of the last client's end (0: none)
    uint64_t images = 0;      // code images cached, and their bytes
    uint64_t image_bytes = 0;
  };
  Counters counters();

 private:
  struct Worker {
    int slot = -1;
    pid_t pid = 0;
    int control = -1;
    int requests = -1;
    bool ready = false;
    bool assigned = false;
    bool retired = false;  // an idle worker told to exit (RetireIdle)
    uint64_t session = 0;
    uint64_t secret = 0;
    uint64_t resume_key[2] = {0, 0};  // a restored session waiting for its client
    bool awaiting_resume = false;
  };
  // Picks an idle worker (waiting for one to start) for `ticket` and gives it
  // the session with `send`.
  Status Assign(const channel::Ticket& ticket, const std::function<Status(Worker*)>& send);
  Status SpawnLocked();
  void TopUpLocked();
  void ServeRequests(Worker* w);
  void RetireIdle(Worker* reporter);
  void Reap(Worker* w);

  // VMM shareable descriptors workers exported, by key; each lives as long as
  // the worker that exported it.
  struct Shareable {
    int fd;
    uint64_t secret;
    int slot;
  };
  std::map<uint64_t, Shareable> shareables_;
  // Reports of moves and restores (the last few), numbered from 1.
  std::deque<std::pair<uint64_t, channel::Report>> reports_;
  uint64_t report_seq_ = 0;
  std::condition_variable reports_cv_;

  TenantBoard* board_;
  std::vector<std::string> argv_;
  const int size_;
  ImageCache images_;
  std::mutex mu_;
  std::condition_variable ready_cv_;
  std::map<int, std::unique_ptr<Worker>> workers_;  // by slot
  uint64_t started_ = 0;
  uint64_t crashed_ = 0;
  uint64_t calls_ended_ = 0;
  uint64_t bytes_in_ended_ = 0, bytes_out_ended_ = 0;
  int64_t last_end_ns_ = 0;
  int failed_starts_ = 0;  // in a row; stops topping up after a few
  std::string last_failure_;
  bool stopping_ = false;
};

}  // namespace flyt::server
