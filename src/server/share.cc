// Implementation of server/share.h.
#include "server/share.h"

#include <algorithm>
#include <cstdlib>

#include "common/log.h"

namespace flyt::server {

uint64_t MulSat(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

namespace {

uint64_t FormatBytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    default:
      return 4;  // 32-bit, and an upper bound per channel for packed/compressed formats
  }
}

}  // namespace

uint64_t ArrayBytes(size_t w, size_t h, size_t d, unsigned channels, CUarray_format f) {
  return MulSat(MulSat(MulSat(w ? w : 1, h ? h : 1), d ? d : 1), MulSat(channels, FormatBytes(f)));
}

const char* SmMechanismName(SmMechanism m) {
  switch (m) {
    case SmMechanism::kGreenContext:
      return "green_context";
    case SmMechanism::kMpsPercentage:
      return "mps_percentage";
    case SmMechanism::kNone:
      break;
  }
  return "none";
}

namespace {

std::string Join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "; " + b;
}

}  // namespace

bool Share::GreenAvailable() const {
  return api_ != nullptr && api_->cuDeviceGetDevResource != nullptr &&
         api_->cuDevSmResourceSplitByCount != nullptr &&
         api_->cuDevResourceGenerateDesc != nullptr && api_->cuGreenCtxCreate != nullptr &&
         api_->cuGreenCtxDestroy != nullptr && api_->cuCtxFromGreenCtx != nullptr;
}

int Share::RealSmCount() const {
  return real_.empty() ? 0 : real_[0].attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT];
}

Status Share::MakeGreen(int sm, std::vector<CUdevResourceDesc>* desc, int* actual) {
  desc->assign(real_.size(), nullptr);
  *actual = 0;
  for (size_t i = 0; i < real_.size(); ++i) {
    CUdevice dev = 0;
    CUresult rc = api_->cuDeviceGet(&dev, static_cast<int>(i));
    CUdevResource all{};
    if (rc == CUDA_SUCCESS) rc = api_->cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (rc != CUDA_SUCCESS)
      return Status::Error("cuDeviceGetDevResource(SM) failed with error " + std::to_string(rc));
    int total = static_cast<int>(all.sm.smCount);
    if (sm >= total) {  // the whole GPU: the primary context needs no partition
      if (i == 0) *actual = total;
      continue;
    }
    CUdevResource part{};
    unsigned groups = 1;
    rc = api_->cuDevSmResourceSplitByCount(&part, &groups, &all, nullptr, 0,
                                           static_cast<unsigned>(sm));
    if (rc != CUDA_SUCCESS || groups == 0) {
      return Status::Error("cuDevSmResourceSplitByCount(" + std::to_string(sm) + " of " +
                           std::to_string(total) + " SMs) failed with error " + std::to_string(rc) +
                           (groups == 0 ? " (no group)" : ""));
    }
    CUdevResourceDesc d = nullptr;
    rc = api_->cuDevResourceGenerateDesc(&d, &part, 1);
    if (rc != CUDA_SUCCESS)
      return Status::Error("cuDevResourceGenerateDesc failed with error " + std::to_string(rc));
    (*desc)[i] = d;
    if (i == 0) *actual = static_cast<int>(part.sm.smCount);
    if (!probe_) continue;
    // Probe: a green context must be creatable from it (MPS may refuse).
    CUgreenCtx probe = nullptr;
    rc = api_->cuGreenCtxCreate(&probe, d, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (rc != CUDA_SUCCESS)
      return Status::Error("cuGreenCtxCreate failed with error " + std::to_string(rc));
    CUresult destroyed = api_->cuGreenCtxDestroy(probe);
    if (destroyed != CUDA_SUCCESS)
      FLYT_WARN("cuGreenCtxDestroy of the probe green context failed with error %d", destroyed);
  }
  return Status::Ok();
}

Status Share::Init(DriverApi* api, const std::vector<ops::DeviceInfo>& devices,
                   const ShareOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  api_ = api;
  green_failed_ = false;
  real_ = devices;
  probe_ = options.probe;
  quota_->store(options.memory_quota);
  const char* mps = std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  mps_ = mps != nullptr && mps[0] != '\0';
  sm_requested_ = options.sm_count;
  exec_.desc.assign(devices.size(), nullptr);
  exec_.sm = 0;
  mechanism_ = mps_ ? SmMechanism::kMpsPercentage : SmMechanism::kNone;
  sm_ = 0;
  if (options.sm_count > 0 && !devices.empty()) {
    bool green = false;
    if (GreenAvailable()) {
      if (!api_->is_sim && probe_) {
        // Green contexts are best made while the primary context is active;
        // this reference stays for the server's life.
        for (size_t i = 0; i < devices.size(); ++i) {
          CUdevice dev = 0;
          CUcontext ctx = nullptr;
          CUresult rc = api_->cuDeviceGet(&dev, static_cast<int>(i));
          if (rc == CUDA_SUCCESS) rc = api_->cuDevicePrimaryCtxRetain(&ctx, dev);
          if (rc != CUDA_SUCCESS)
            FLYT_WARN("cannot retain the primary context of GPU %zu: error %d", i, rc);
        }
      }
      int actual = 0;
      std::vector<CUdevResourceDesc> desc;
      Status s = MakeGreen(options.sm_count, &desc, &actual);
      if (s.ok()) {
        green = true;
        exec_.desc = desc;
        exec_.sm = actual;
        sm_ = actual;
        bool partitioned = std::any_of(desc.begin(), desc.end(), [](auto d) { return d; });
        if (partitioned) mechanism_ = SmMechanism::kGreenContext;
        if (actual != options.sm_count)
          FLYT_INFO("SM share: %d SMs asked, %d granted (green context granularity)",
                    options.sm_count, actual);
      } else {
        green_failed_ = true;
        FLYT_WARN("green contexts unavailable (%s): using the primary context%s",
                  s.message().c_str(),
                  mps_ ? " limited by CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
                       : "; the SM share is reported, not enforced");
      }
    } else if (api_->is_sim) {
      FLYT_INFO(
          "the sim backend has no green contexts (--sim-green-contexts fakes them): the "
          "SM share is only reported");
    } else {
      FLYT_WARN("this driver has no green contexts (needs 12.4+): using the primary context%s",
                mps_ ? " limited by CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
                     : "; the SM share is reported, not enforced");
    }
    if (!green) sm_ = std::min(options.sm_count, RealSmCount());
  }
  PublishInfoLocked();
  if (options.sm_count > 0 || options.memory_quota > 0)
    FLYT_INFO("share: %d of %d SMs (%s), memory quota %llu bytes", sm_ > 0 ? sm_ : RealSmCount(),
              RealSmCount(), SmMechanismName(mechanism_),
              static_cast<unsigned long long>(quota_->load()));
  return Status::Ok();
}

void Share::PublishInfoLocked() {
  view_ = real_;
  uint64_t quota = quota_->load();
  for (auto& d : view_) {
    if (sm_ > 0) d.attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] = sm_;
    if (quota != 0) d.total_mem = quota;
  }
  info_generation_.fetch_add(1, std::memory_order_acq_rel);
}

void Share::Republish() {
  std::lock_guard<std::mutex> lock(mu_);
  PublishInfoLocked();
}

namespace {
// Subtracts down to 0 at most; returns what it took.
uint64_t SubtractSat(std::atomic<uint64_t>* v, uint64_t bytes) {
  uint64_t used = v->load();
  while (!v->compare_exchange_weak(used, used > bytes ? used - bytes : 0)) {
  }
  return used > bytes ? bytes : used;
}
}  // namespace

bool Share::Charge(int device, uint64_t bytes) {
  if (bytes == 0) return true;
  std::atomic<uint64_t>& dev = used_dev_[BoardDevice(device)];
  uint64_t used = dev.load();
  for (;;) {
    uint64_t quota = quota_->load();
    if (quota != 0 && (used > quota || bytes > quota - used)) return false;
    if (dev.compare_exchange_weak(used, used + bytes)) break;
  }
  used_->fetch_add(bytes);
  return true;
}

void Share::Refund(int device, uint64_t bytes) {
  // The total loses what the device's count lost (never more than was charged there).
  SubtractSat(used_, SubtractSat(&used_dev_[BoardDevice(device)], bytes));
}

void Share::ClampMemInfo(int device, size_t* free_bytes, size_t* total_bytes) const {
  uint64_t quota = quota_->load();
  if (quota == 0) return;
  uint64_t used = memory_used(device);
  uint64_t left = used < quota ? quota - used : 0;
  if (free_bytes != nullptr && *free_bytes > left) *free_bytes = left;
  if (total_bytes != nullptr) *total_bytes = quota;
}

std::vector<ops::DeviceInfo> Share::Devices(uint64_t* generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (generation != nullptr) *generation = info_generation_.load();
  return view_;
}

ExecConfig Share::Exec() const {
  std::lock_guard<std::mutex> lock(mu_);
  ExecConfig c = exec_;
  c.generation = exec_generation_.load();
  return c;
}

void Share::NoteSwitch(uint64_t us) { last_switch_us_ = us; }

Share::Snapshot Share::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.sm = sm_ > 0 ? sm_ : RealSmCount();
  s.sm_requested = sm_requested_;
  s.sm_total = RealSmCount();
  s.mechanism = mechanism_;
  s.memory_quota = quota_->load();
  s.memory_used = used_->load();
  s.last_switch_us = last_switch_us_.load();
  return s;
}

Status Share::Apply(const Change& change, bool capturing, std::string* note, bool* busy) {
  std::lock_guard<std::mutex> lock(mu_);
  note->clear();
  if (busy != nullptr) *busy = false;
  if (change.has_sm && change.sm < 0) return Status::Error("sm must be 0 (whole GPU) or more");
  bool sm_change = change.has_sm && change.sm != sm_requested_;
  ExecConfig next = exec_;
  int next_sm = sm_;
  SmMechanism next_mechanism = mechanism_;
  bool partitioned_now =
      std::any_of(exec_.desc.begin(), exec_.desc.end(), [](auto d) { return d != nullptr; });
  bool green = GreenAvailable() && !green_failed_;
  if (sm_change) {
    if (capturing && (green || partitioned_now)) {
      if (busy != nullptr) *busy = true;
      return Status::Error(
          "a session has a stream capture in progress: the SM share cannot change now (it "
          "would move the session's streams); retry when the capture has ended");
    }
    if (change.sm == 0) {
      next.desc.assign(real_.size(), nullptr);
      next.sm = 0;
      next_sm = 0;
      next_mechanism = mps_ ? SmMechanism::kMpsPercentage : SmMechanism::kNone;
    } else if (green) {
      int actual = 0;
      std::vector<CUdevResourceDesc> desc;
      Status s = MakeGreen(change.sm, &desc, &actual);
      if (!s.ok())
        return Status::Error("cannot make a green context of " + std::to_string(change.sm) +
                             " SMs: " + s.message());
      bool partitioned = std::any_of(desc.begin(), desc.end(), [](auto d) { return d; });
      next.desc = desc;
      next.sm = partitioned ? actual : 0;
      next_sm = actual;
      next_mechanism = partitioned ? SmMechanism::kGreenContext
                                   : (mps_ ? SmMechanism::kMpsPercentage : SmMechanism::kNone);
      if (actual != change.sm)
        *note = Join(*note, std::to_string(change.sm) + " SMs asked, " + std::to_string(actual) +
                                " granted (green context granularity)");
    } else if (mps_) {
      return Status::Error(
          "the SM share is enforced by MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), which is fixed "
          "when flyt-server starts: restart the server with the new share");
    } else {
      next_sm = std::min(change.sm, RealSmCount());
      if (!api_->is_sim)
        *note = Join(*note,
                     "no green contexts here: the SM count is reported to clients, not "
                     "enforced");
    }
  }
  bool switch_exec = next.desc != exec_.desc;
  bool info_changed = false;
  if (change.has_memory && change.memory_bytes != quota_->load()) {
    quota_->store(change.memory_bytes);
    info_changed = true;
  }
  if (sm_change) {
    sm_requested_ = change.sm;
    if (next_sm != sm_) info_changed = true;
    sm_ = next_sm;
    mechanism_ = next_mechanism;
  }
  if (switch_exec) {
    exec_ = next;
    exec_generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (info_changed) PublishInfoLocked();
  uint64_t quota = quota_->load(), used = used_->load();
  if (quota != 0 && used > quota)
    *note =
        Join(*note, "memory quota " + std::to_string(quota) + " is below current use " +
                        std::to_string(used) + ": new allocations fail until usage drops below it");
  FLYT_INFO("share changed: %d SMs (%s), memory quota %llu bytes%s%s",
            sm_ > 0 ? sm_ : RealSmCount(), SmMechanismName(mechanism_),
            static_cast<unsigned long long>(quota), note->empty() ? "" : "; ", note->c_str());
  return Status::Ok();
}

}  // namespace flyt::server
