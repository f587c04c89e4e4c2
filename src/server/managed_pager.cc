#include "server/managed_pager.h"

#include <cuda.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common/log.h"
#include "protocol/codec.h"
#include "protocol/ops.h"
#include "protocol/wire.h"
#include "server/reply_frame.h"

namespace flyt::server {

namespace {

// A copy that faults (the driver could not give a page: the GPU failed, the
// memory went) jumps back here instead of killing the worker.
// volatile: the compiler must not drop the store before memcpy as dead (it
// knows memcpy does not read it; the signal handler does).
thread_local sigjmp_buf* volatile t_copy_guard = nullptr;
struct sigaction g_previous_segv, g_previous_bus;

void GuardHandler(int sig, siginfo_t* info, void* ctx) {
  if (t_copy_guard != nullptr) siglongjmp(*t_copy_guard, 1);
  // Not ours: behave as before this handler existed.
  const struct sigaction& prev = sig == SIGBUS ? g_previous_bus : g_previous_segv;
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, ctx);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);  // the faulting instruction runs again and ends the process
  }
}

void InstallGuardOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = GuardHandler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
    sigaction(SIGBUS, &sa, &g_previous_bus);
  });
}

// memcpy that reports a fault instead of dying of it.
bool GuardedCopy(void* dst, const void* src, size_t n) {
  sigjmp_buf jb;
  if (sigsetjmp(jb, 1) != 0) {
    t_copy_guard = nullptr;
    return false;
  }
  t_copy_guard = &jb;
  std::memcpy(dst, src, n);
  t_copy_guard = nullptr;
  return true;
}

}  // namespace

void ManagedPager::Add(uint64_t base, uint64_t size, uint64_t owner, bool host) {
  if (base == 0 || size == 0) return;
  // Whole pages: the client's view is made of pages, and the driver's managed
  // allocations are at least page-granular.
  constexpr uint64_t kPage = 4096;
  size = (size + kPage - 1) / kPage * kPage;
  std::lock_guard<std::mutex> lock(mu_);
  ranges_[base] = Range{size, owner, nullptr, host};
}

void ManagedPager::Unshare(Range& r) {
  if (r.shared != nullptr) munmap(r.shared, r.size);
  r.shared = nullptr;
}

bool ManagedPager::Remove(uint64_t base) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.find(base);
  if (it == ranges_.end()) return false;
  Unshare(it->second);
  ranges_.erase(it);
  return true;
}

void ManagedPager::RemoveOwnedBy(uint64_t owner) {
  if (owner == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ranges_.begin(); it != ranges_.end();) {
    if (it->second.owner != owner) {
      ++it;
      continue;
    }
    Unshare(it->second);
    it = ranges_.erase(it);
  }
}

void ManagedPager::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [base, r] : ranges_) Unshare(r);
  ranges_.clear();
}

bool ManagedPager::Contains(uint64_t p, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(p, n, nullptr) != nullptr;
}

ManagedPager::Range* ManagedPager::FindLocked(uint64_t p, uint64_t n, uint64_t* off) {
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return nullptr;
  --it;
  uint64_t o = p - it->first;
  if (o >= it->second.size || n > it->second.size - o) return nullptr;
  if (off != nullptr) *off = o;
  return &it->second;
}

void ManagedPager::Attach(std::unique_ptr<transport::Connection> conn, DriverApi* api,
                          CUcontext ctx) {
  InstallGuardOnce();
  Stop();
  std::lock_guard<std::mutex> lock(thread_mu_);
  conn_ = std::move(conn);
  transport::Connection* c = conn_.get();
  thread_ = std::thread([this, c, api, ctx] { Serve(c, api, ctx); });
}

void ManagedPager::Stop() {
  std::lock_guard<std::mutex> lock(thread_mu_);
  if (conn_ != nullptr) conn_->Shutdown();
  if (thread_.joinable()) thread_.join();
  conn_.reset();
}

namespace {
constexpr size_t kPinnedBytes = 8u << 20;  // the client fetches at most this much at once
constexpr int kShareArrivalMs = 2000;      // a shared descriptor follows its request
}  // namespace

bool ManagedPager::DmaFetch(Dma& d, uint64_t addr, uint32_t len, void* into, const void** out) {
  if (d.stream == nullptr || len > kPinnedBytes) return false;
  void* dst = into != nullptr ? into : d.pinned;
  if (d.api->cuMemcpyDtoHAsync_v2(dst, addr, len, d.stream) != CUDA_SUCCESS ||
      d.api->cuStreamSynchronize(d.stream) != CUDA_SUCCESS)
    return false;
  *out = dst;
  return true;
}

bool ManagedPager::DmaPush(Dma& d, const std::vector<std::pair<uint64_t, uint32_t>>& runs,
                           const uint8_t* bytes, const Range* shared, uint64_t base) {
  if (d.stream == nullptr) return false;
  for (const auto& [addr, len] : runs) {
    const uint8_t* src = shared != nullptr ? shared->shared + (addr - base) : bytes;
    if (d.api->cuMemcpyHtoDAsync_v2(addr, src, len, d.stream) != CUDA_SUCCESS) return false;
    bytes += len;
  }
  return d.api->cuStreamSynchronize(d.stream) == CUDA_SUCCESS;
}

CUresult ManagedPager::ShareLocked(transport::Connection* conn, uint64_t id, uint64_t base,
                                   uint64_t size) {
  int fd = -1;
  if (!conn->SharesMemory() || !conn->TakeSharedFd(id, kShareArrivalMs, &fd).ok())
    return CUDA_ERROR_NOT_SUPPORTED;
  auto it = ranges_.find(base);
  // Only a memfd sealed against shrinking, as large as the allocation: pages
  // the client could take away would crash this process (SIGBUS).
  struct stat sb {};
  const int seals = fcntl(fd, F_GET_SEALS);
  CUresult rc = CUDA_SUCCESS;
  if (it == ranges_.end() || it->second.size != size || it->second.shared != nullptr || seals < 0 ||
      (seals & F_SEAL_SHRINK) == 0 || fstat(fd, &sb) != 0 ||
      static_cast<uint64_t>(sb.st_size) < size) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      it->second.shared = static_cast<uint8_t*>(p);
      FLYT_DEBUG("paging channel: the client's pages of 0x%llx (%llu bytes) are mapped here",
                 static_cast<unsigned long long>(base), static_cast<unsigned long long>(size));
    }
  }
  ::close(fd);
  return rc;
}

void ManagedPager::Serve(transport::Connection* conn, DriverApi* api, CUcontext ctx) {
  std::vector<uint8_t> payload, data;
  Dma dma;
  dma.api = api;
  if (ctx != nullptr && api->cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
      api->cuStreamCreate(&dma.stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS &&
      api->cuMemHostAlloc(&dma.pinned, kPinnedBytes, 0) != CUDA_SUCCESS) {
    api->cuStreamDestroy_v2(dma.stream);
    dma.stream = nullptr;
  }
  if (dma.stream == nullptr)
    FLYT_INFO("paging channel: no DMA path; managed pages move through this process's CPU");
  struct Release {
    Dma& d;
    ~Release() {
      if (d.stream != nullptr) d.api->cuStreamDestroy_v2(d.stream);
      if (d.pinned != nullptr) d.api->cuMemFreeHost(d.pinned);
    }
  } release{dma};
  // However the loop ends, the client sees the channel close (a malformed
  // request gets no answer).
  struct Hangup {
    transport::Connection* c;
    ~Hangup() { c->Shutdown(); }
  } hangup{conn};
  auto malformed = [](const char* what) {
    FLYT_WARN("paging channel: malformed %s; closing", what);
  };
  for (;;) {
    wire::FrameHeader h{};
    if (!conn->Receive(&h, sizeof(h)).ok()) return;
    if (h.magic != wire::kMagic || (h.flags & wire::kFlagReply) ||
        h.payload_len > wire::kMaxPayload) {
      FLYT_WARN("paging channel: malformed frame (op %u, %u bytes); closing", h.op, h.payload_len);
      return;
    }
    payload.resize(h.payload_len);
    if (!conn->Receive(payload.data(), payload.size()).ok()) return;
    wire::Reader in(payload.data(), payload.size());
    CUresult rc = CUDA_SUCCESS;
    const void* reply = nullptr;
    size_t reply_len = 0;
    if (h.op == ops::kOpManagedFetch) {
      uint64_t addr = 0, off = 0;
      uint32_t len = 0;
      uint8_t shared = 0;
      if (!in.Get(&addr) || !in.Get(&len) || !in.Get(&shared) || in.remaining() != 0 ||
          len > wire::kMaxPayload) {
        malformed("fetch");
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      Range* r = FindLocked(addr, len, &off);
      if (r == nullptr || (shared && r->shared == nullptr)) {
        rc = CUDA_ERROR_INVALID_VALUE;
      } else {
        void* into = shared ? r->shared + off : nullptr;
        // Pinned host memory is this process's own: the CPU reads it (what the GPU
        // wrote is there once its work is done).
        if (!r->host && DmaFetch(dma, addr, len, into, &reply)) {
          reply_len = len;
        } else {
          if (!shared) data.resize(len);
          void* dst = shared ? into : data.data();
          if (GuardedCopy(dst, reinterpret_cast<const void*>(addr), len)) {
            reply = dst;
            reply_len = len;
          } else {
            rc = CUDA_ERROR_ILLEGAL_ADDRESS;
          }
        }
        if (shared) reply_len = 0;  // the bytes are in the client's pages already
      }
    } else if (h.op == ops::kOpManagedPush) {
      uint32_t n = 0;
      uint8_t shared = 0;
      if (!in.Get(&n) || !in.Get(&shared) || n > in.remaining() / 12) {
        malformed("push");
        return;
      }
      std::vector<std::pair<uint64_t, uint32_t>> runs(n);
      uint64_t total = 0;
      for (auto& [addr, len] : runs) {
        in.Get(&addr);
        in.Get(&len);
        total += len;
      }
      const uint64_t carried = shared ? 0 : total;
      const uint8_t* bytes = in.remaining() == carried ? in.Skip(carried) : nullptr;
      if (!in.ok() || (bytes == nullptr && carried != 0) || (!shared && bytes == nullptr)) {
        malformed("push");
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      // All runs of a shared push lie in one allocation: the client pushes per range.
      Range* shared_range = nullptr;
      uint64_t shared_base = 0;
      bool all_host = true;  // pinned host memory of this process only: the CPU writes it
      for (auto& [addr, len] : runs) {
        uint64_t off = 0;
        Range* r = FindLocked(addr, len, &off);
        if (r == nullptr ||
            (shared && (r->shared == nullptr || (shared_range != nullptr && r != shared_range)))) {
          rc = CUDA_ERROR_INVALID_VALUE;
          break;
        }
        all_host = all_host && r->host;
        if (shared) shared_range = r, shared_base = addr - off;
      }
      if (rc == CUDA_SUCCESS &&
          (all_host || !DmaPush(dma, runs, bytes, shared_range, shared_base))) {
        for (size_t i = 0; rc == CUDA_SUCCESS && i < runs.size(); ++i) {
          const uint8_t* src =
              shared ? shared_range->shared + (runs[i].first - shared_base) : bytes;
          if (!GuardedCopy(reinterpret_cast<void*>(runs[i].first), src, runs[i].second))
            rc = CUDA_ERROR_ILLEGAL_ADDRESS;
          if (!shared) bytes += runs[i].second;
        }
      }
    } else if (h.op == ops::kOpManagedShare) {
      uint64_t id = 0, base = 0, size = 0;
      if (!in.Get(&id) || !in.Get(&base) || !in.Get(&size) || in.remaining() != 0) {
        malformed("share");
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      rc = ShareLocked(conn, id, base, size);
    } else {
      FLYT_WARN("paging channel: unexpected op %u; closing", h.op);
      return;
    }
    if (!SendReply(conn, h, rc, reply, reply_len)) return;
  }
}

}  // namespace flyt::server
