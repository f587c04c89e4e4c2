// The tenant's state that all processes of one flyt-server share.
//
// flyt-server serves each client process from a worker process of its own
// (server/worker_pool.h); what belongs to the tenant as a whole lives here, in
// one shared-memory page set that the main process creates and every worker
// maps: the memory charged against the quota (all workers together, in all
// and per device: the quota holds per GPU), the quota, the SM share's generation, and one slot per
// worker with what stats and NVML report about it (client pid, device, memory, calls). Owns: the
// layout and its creation and mapping. Lock-free: every field is an atomic, written by one side and
// read by the other. Must not know about CUDA, sessions or the wire.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "common/status.h"

namespace flyt::server {

// Workers at once (serving and idle); MPS allows 48 clients per device.
constexpr int kMaxWorkers = 256;
// Devices of one server whose memory is accounted apart (a larger ordinal
// counts as the last one).
constexpr int kBoardDevices = 16;
inline int BoardDevice(int device) {
  return device < 0 ? 0 : (device >= kBoardDevices ? kBoardDevices - 1 : device);
}

enum class WorkerState : uint32_t {
  kFree = 0,      // slot unused
  kStarting = 1,  // process started, CUDA initialising
  kIdle = 2,      // ready in the pool
  kServing = 3,   // serving one client process
  kEnding = 4,    // its client left; releasing and exiting
};

struct WorkerSlot {
  std::atomic<uint32_t> state{0};  // WorkerState
  std::atomic<int32_t> pid{0};
  std::atomic<uint32_t> client_pid{0};
  std::atomic<int32_t> device{-1};  // device of its context, -1: none yet
  std::atomic<uint64_t> session{0};
  std::atomic<uint64_t> charged{0};                       // bytes this worker charged to the quota
  std::atomic<uint64_t> charged_dev[kBoardDevices] = {};  // the same, per device
  std::atomic<uint64_t> calls{0};
  // Frame bytes over its client's connection (headers included): received
  // from the client, sent to it.
  std::atomic<uint64_t> bytes_in{0}, bytes_out{0};
  std::atomic<uint32_t> capturing{0};         // stream captures in progress
  std::atomic<uint64_t> share_generation{0};  // last share change it adopted
};

struct BoardLayout {
  static constexpr uint32_t kMagic = 0x42594c46;  // "FLYB"
  static constexpr uint32_t kVersion = 2;
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  std::atomic<uint64_t> memory_used{0};
  std::atomic<uint64_t> memory_quota{0};                      // per device (each GPU of the server)
  std::atomic<uint64_t> memory_used_dev[kBoardDevices] = {};  // memory_used per device
  // Bumped by the main process after each live share change; workers adopt
  // sm_requested (and the quota above) at their next call.
  std::atomic<uint64_t> share_generation{1};
  std::atomic<int32_t> sm_requested{0};
  std::atomic<uint64_t> last_switch_us{0};
  WorkerSlot slots[kMaxWorkers];
};

class TenantBoard {
 public:
  // Main process: a new, zeroed board in a sealed memfd.
  static Status Create(std::unique_ptr<TenantBoard>* out);
  // Worker: maps the board the main process passed as `fd` (takes it).
  static Status Map(int fd, std::unique_ptr<TenantBoard>* out);
  ~TenantBoard();

  BoardLayout* operator->() const { return layout_; }
  BoardLayout& layout() const { return *layout_; }
  int fd() const { return fd_; }  // -1 in a worker

 private:
  TenantBoard(BoardLayout* layout, int fd) : layout_(layout), fd_(fd) {}
  BoardLayout* layout_;
  int fd_;
};

}  // namespace flyt::server
