// The tenant's share of the GPU, common to every session of one flyt-server.
//
// Owns: the memory quota and its accounting (each device allocation a session
// makes is charged here, to the device it is on, before the driver sees it and
// refunded when it is freed or its session ends; the quota holds for each GPU
// of the server apart, as the SM count does), the SM count clients see, the mechanism that
// enforces it (a green context descriptor from which each session makes its
// own green context; MPS's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set at server
// start; or nothing), and live changes (set-share): a change publishes a new
// generation that sessions adopt at their next call. Must not know about the
// wire, sessions' handles or the control socket.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "protocol/ops.h"
#include "server/driver_api.h"
#include "server/tenant_board.h"

namespace flyt::server {

struct ShareOptions {
  uint64_t memory_quota = 0;  // bytes per GPU; 0 = no quota
  int sm_count = 0;           // 0 = the whole GPU
  // Make a green context from each new descriptor to see that the driver
  // accepts it. flyt-server's main process, which holds no CUDA context,
  // leaves this to the workers.
  bool probe = true;
};

// a * b, or UINT64_MAX when it overflows (sizes from clients are hostile).
uint64_t MulSat(uint64_t a, uint64_t b);

// Bytes a CUDA array of these dimensions takes, as the quota charges it (and
// the sim allocates it); saturates instead of overflowing. 0 dimensions count as 1.
uint64_t ArrayBytes(size_t w, size_t h, size_t d, unsigned channels, CUarray_format f);

enum class SmMechanism { kNone, kGreenContext, kMpsPercentage };
const char* SmMechanismName(SmMechanism m);

// What sessions execute under: per device ordinal, the descriptor their green
// context is made from, or null for the primary context (the whole GPU, or
// what MPS leaves to this process).
struct ExecConfig {
  uint64_t generation = 0;
  std::vector<CUdevResourceDesc> desc;
  int sm = 0;  // SMs of those green contexts (0: primary context)
};

class Share {
 public:
  // `devices` is the real inventory (DescribeDevices, which calls this with
  // no share; flyt-server's main calls it again with its options before any
  // session). With sm_count > 0 and a driver that has green contexts, makes and
  // probes the descriptor; when they are unavailable or refused, logs why and
  // falls back.
  Status Init(DriverApi* api, const std::vector<ops::DeviceInfo>& devices,
              const ShareOptions& options);

  // Keeps the memory accounting in `used` and `quota` instead (the tenant
  // board, shared by all of a server's processes); call before Init.
  // `used_dev` (kBoardDevices counters) is the same per device.
  void UseCounters(std::atomic<uint64_t>* used, std::atomic<uint64_t>* quota,
                   std::atomic<uint64_t>* used_dev) {
    used_ = used;
    quota_ = quota;
    used_dev_ = used_dev;
  }
  // The quota may have changed elsewhere: recompute what clients see.
  void Republish();

  // --- memory
  // Charges `bytes` on `device` against the quota; false (nothing charged)
  // when that device's use would go over it.
  bool Charge(int device, uint64_t bytes);
  void Refund(int device, uint64_t bytes);
  uint64_t memory_used() const { return used_->load(); }  // all devices
  uint64_t memory_used(int device) const { return used_dev_[BoardDevice(device)].load(); }
  uint64_t memory_quota() const { return quota_->load(); }
  // cuMemGetInfo as the tenant sees it on `device`: free = min(free, quota -
  // used there), total = quota.
  void ClampMemInfo(int device, size_t* free_bytes, size_t* total_bytes) const;

  // --- what clients see
  // The inventory with the share applied (SM count, memory); *generation
  // changes whenever it does.
  std::vector<ops::DeviceInfo> Devices(uint64_t* generation) const;
  uint64_t info_generation() const { return info_generation_.load(std::memory_order_acquire); }

  // --- execution
  ExecConfig Exec() const;
  uint64_t exec_generation() const { return exec_generation_.load(std::memory_order_acquire); }
  // A session took `us` microseconds to move to a new execution config.
  void NoteSwitch(uint64_t us);

  struct Snapshot {
    int sm = 0;            // SM count clients see (after rounding)
    int sm_requested = 0;  // what was asked (0: whole GPU)
    int sm_total = 0;      // the device's own count
    SmMechanism mechanism = SmMechanism::kNone;
    uint64_t memory_quota = 0;
    uint64_t memory_used = 0;
    uint64_t last_switch_us = 0;
  };
  Snapshot Get() const;

  // A live change; absent fields stay. Refuses an SM change while a capture is
  // in progress (`capturing`), or where the mechanism cannot change live.
  // *note receives remarks for the operator (quota below use, rounding, ...).
  struct Change {
    bool has_sm = false;
    int sm = 0;
    bool has_memory = false;
    uint64_t memory_bytes = 0;
  };
  // *busy (if given) is set when the refusal is only for now (a capture).
  Status Apply(const Change& change, bool capturing, std::string* note, bool* busy = nullptr);

 private:
  bool GreenAvailable() const;
  // Splits each device's SMs to hold `sm` and probes a green context on it.
  Status MakeGreen(int sm, std::vector<CUdevResourceDesc>* desc, int* actual);
  int RealSmCount() const;
  void PublishInfoLocked();

  DriverApi* api_ = nullptr;
  std::atomic<uint64_t> own_used_{0};
  std::atomic<uint64_t> own_quota_{0};
  std::atomic<uint64_t>* used_ = &own_used_;
  std::atomic<uint64_t>* quota_ = &own_quota_;
  std::atomic<uint64_t> own_used_dev_[kBoardDevices] = {};
  std::atomic<uint64_t>* used_dev_ = own_used_dev_;
  bool probe_ = true;
  std::atomic<uint64_t> info_generation_{1};
  std::atomic<uint64_t> exec_generation_{1};
  std::atomic<uint64_t> last_switch_us_{0};
  mutable std::mutex mu_;  // everything below
  std::vector<ops::DeviceInfo> real_;
  std::vector<ops::DeviceInfo> view_;
  bool mps_ = false;           // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE was set at start
  bool green_failed_ = false;  // green contexts were tried and refused
  int sm_requested_ = 0;
  int sm_ = 0;  // effective (0: whole GPU)
  SmMechanism mechanism_ = SmMechanism::kNone;
  ExecConfig exec_;
};

}  // namespace flyt::server
