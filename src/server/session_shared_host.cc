// Session handlers for pinned host memory shared with the client (shm://) and
// pinned host memory the GPU maps over socket transports.
//
// Owns: the session's shared host regions. The client creates a sealed memfd
// for each cuMemHostAlloc and shares it through the transport; the server maps
// it (at the client's address when that range is free here, so that the
// client's pointer is also the device pointer) and registers it with the
// driver, so copies to and from it are DMA and kernels reach it directly.
// Over a socket (kOpHostMap) the server keeps pinned, mapped memory of its own
// at the client's address instead, and names it to the paging channel
// (server/managed_pager.h), which keeps the client's pages of it coherent with
// it as it does managed memory's; kernels read and write the server's pages.
// Copies name the region by its server address and are checked against the
// session's own regions only: a client can never make the server touch memory
// it did not share. Regions are unregistered and unmapped when the client
// frees them and when the session ends, however it ends.
// Must not touch: the transport's descriptor passing (transport/), device
// memory bookkeeping, other sessions' regions.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;
using wire::Writer;

namespace {

// The client shares its descriptor just before the request that uses it.
constexpr int kShareArrivalMs = 5000;
// One shared region may not exceed this (a hostile size must not map the world).
constexpr uint64_t kMaxSharedBytes = uint64_t{1} << 40;
constexpr uint64_t kPage = 4096;

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

// Maps the client's memfd, at the client's own address when that range is free.
void* MapShared(int fd, uint64_t bytes, uint64_t client_addr) {
  if (client_addr != 0 && client_addr % kPage == 0) {
    void* want = reinterpret_cast<void*>(client_addr);
    void* p = mmap(want, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (p == want) return p;
    if (p != MAP_FAILED) munmap(p, bytes);  // an old kernel took it as a hint only
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Pins [p, p+bytes) for the GPU, portable and mapped whatever the app's flags ask (as
// cuMemHostAlloc memory is on a UVA system), and says where the GPU sees it (0: the driver
// did not say). On failure the range is unmapped.
CUresult RegisterForGpu(DriverApi& a, void* p, uint64_t bytes, CUdeviceptr* device) {
  CUresult rc =
      a.cuMemHostRegister_v2(p, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (rc != CUDA_SUCCESS) {
    munmap(p, bytes);
    return rc;
  }
  *device = 0;
  if (a.cuMemHostGetDevicePointer_v2 == nullptr ||
      a.cuMemHostGetDevicePointer_v2(device, p, 0) != CUDA_SUCCESS)
    *device = 0;
  return CUDA_SUCCESS;
}

}  // namespace

// Request: u64 descriptor id, u64 bytes, u32 flags, u64 client address.
// Reply: u64 server address, u64 device pointer (0 when the GPU cannot map it).
bool Session::ShareHost(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t id = 0, bytes = 0, client_addr = 0;
  uint32_t flags = 0;
  if (!in.Get(&id) || !in.Get(&bytes) || !in.Get(&flags) || !in.Get(&client_addr) ||
      in.remaining() != 0)
    return false;
  if (!conn_->SharesMemory()) {
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  int fd = -1;
  Status st = conn_->TakeSharedFd(id, kShareArrivalMs, &fd);
  if (!st.ok()) {
    FLYT_WARN("session %llu: %s", static_cast<unsigned long long>(id_), st.message().c_str());
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  // Only a memfd sealed against shrinking: a client that could truncate the
  // memory under the server's mapping would crash the server (SIGBUS).
  struct stat sb {};
  const int seals = fcntl(fd, F_GET_SEALS);
  if (bytes == 0 || bytes > kMaxSharedBytes || seals < 0 || (seals & F_SEAL_SHRINK) == 0 ||
      fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < bytes) {
    FLYT_WARN(
        "session %llu: refused shared host memory of %llu bytes (not a memfd sealed "
        "against shrinking, or smaller than announced)",
        static_cast<unsigned long long>(id_), static_cast<unsigned long long>(bytes));
    ::close(fd);
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  void* p = MapShared(fd, bytes, client_addr);
  ::close(fd);  // the mapping keeps the memory
  if (p == nullptr) {
    *rc = CUDA_ERROR_OUT_OF_MEMORY;
    return true;
  }
  if (primary_ == nullptr || a.cuMemHostRegister_v2 == nullptr) {
    munmap(p, bytes);
    *rc = primary_ == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  CUdeviceptr device = 0;
  *rc = RegisterForGpu(a, p, bytes, &device);
  if (*rc != CUDA_SUCCESS) return true;
  const auto addr = reinterpret_cast<uint64_t>(p);
  shared_host_[addr] = bytes;
  if (flags & (ops::kHostShareStaging | ops::kHostShareMovable)) left_host_.insert(addr);
  FLYT_DEBUG("session %llu: shared %llu bytes of pinned memory (%s address)",
             static_cast<unsigned long long>(id_), static_cast<unsigned long long>(bytes),
             addr == client_addr ? "the client's" : "another");
  out.Put<uint64_t>(addr);
  out.Put<uint64_t>(device);
  return true;
}

// Request: u64 client address, u64 bytes, u32 flags. Reply: u64 device pointer.
bool Session::MapHost(Reader& in, Writer& out, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t addr = 0, bytes = 0;
  uint32_t flags = 0;
  if (!in.Get(&addr) || !in.Get(&bytes) || !in.Get(&flags) || in.remaining() != 0) return false;
  (void)flags;  // every region is portable and mapped, as natively under UVA
  if (addr == 0 || addr % kPage != 0 || bytes == 0 || bytes % kPage != 0 ||
      bytes > kMaxSharedBytes || addr + bytes < addr ||
      mapped_host_bytes_ + bytes > kMaxSharedBytes) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (primary_ == nullptr || a.cuMemHostRegister_v2 == nullptr ||
      a.cuMemHostGetDevicePointer_v2 == nullptr) {
    *rc = primary_ == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  // Never over anything this process has there (the driver's reservations included).
  void* want = reinterpret_cast<void*>(addr);
  void* p = mmap(want, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != want) {
    if (p != MAP_FAILED) munmap(p, bytes);  // an old kernel took it as a hint only
    *rc = CUDA_ERROR_ALREADY_MAPPED;
    return true;
  }
  CUdeviceptr device = 0;
  *rc = RegisterForGpu(a, p, bytes, &device);
  if (*rc != CUDA_SUCCESS) return true;
  if (device != addr) {
    // The client's pointer must be the GPU's (unified addressing, every 64-bit Linux GPU).
    FLYT_WARN(
        "session %llu: the GPU maps pinned host memory at 0x%llx, not at its host address "
        "0x%llx; mapped host memory is not served without unified addressing",
        static_cast<unsigned long long>(id_), static_cast<unsigned long long>(device),
        static_cast<unsigned long long>(addr));
    a.cuMemHostUnregister(p);
    munmap(p, bytes);
    *rc = CUDA_ERROR_NOT_SUPPORTED;
    return true;
  }
  shared_host_[addr] = bytes;
  mapped_host_bytes_ += bytes;
  pager_.Add(addr, bytes, 0, /*host=*/true);
  FLYT_DEBUG("session %llu: %llu bytes of pinned host memory mapped for the GPU at 0x%llx",
             static_cast<unsigned long long>(id_), static_cast<unsigned long long>(bytes),
             static_cast<unsigned long long>(addr));
  out.Put<uint64_t>(device);
  return true;
}

CUresult Session::UnshareHostRegion(uint64_t addr, uint64_t bytes) {
  // Mapped over a socket: the paging channel lets go of it first (waits for a copy
  // in progress); shm:// regions are not the pager's, so this forgets nothing.
  if (pager_.Remove(addr)) mapped_host_bytes_ -= std::min(mapped_host_bytes_, bytes);
  DriverApi& a = state_->api;
  void* p = reinterpret_cast<void*>(addr);
  CUresult rc = a.cuMemHostUnregister != nullptr ? a.cuMemHostUnregister(p) : CUDA_SUCCESS;
  if (munmap(p, bytes) != 0)
    FLYT_WARN("session %llu: munmap of a shared region failed: %s",
              static_cast<unsigned long long>(id_), std::strerror(errno));
  return rc;
}

// Request: u64 server address. The GPU may still be using the memory: the
// session's work drains first, as cuMemFreeHost waits for the device.
bool Session::UnshareHost(Reader& in, CUresult* rc) {
  uint64_t addr = 0;
  if (!in.Get(&addr) || in.remaining() != 0) return false;
  auto it = shared_host_.find(addr);
  if (it == shared_host_.end()) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  *rc = SynchronizeSession();
  CUresult unregistered = UnshareHostRegion(it->first, it->second);
  if (*rc == CUDA_SUCCESS) *rc = unregistered;
  left_host_.erase(it->first);
  shared_host_.erase(it);
  return true;
}

bool Session::InSharedHost(uint64_t addr, uint64_t n) const {
  auto it = shared_host_.upper_bound(addr);
  if (it == shared_host_.begin()) return false;
  --it;
  return addr - it->first <= it->second && n <= it->second - (addr - it->first);
}

// Request: u8 to_device, u64 device, u64 server address, u64 bytes, u64 stream, u8 async.
bool Session::CopyShared(Reader& in, bool per_thread, CUresult* rc) {
  DriverApi& a = state_->api;
  uint8_t to_device = 0, async = 0;
  uint64_t device = 0, host = 0, n = 0, stream = 0;
  if (!in.Get(&to_device) || !in.Get(&device) || !in.Get(&host) || !in.Get(&n) ||
      !in.Get(&stream) || !in.Get(&async) || in.remaining() != 0)
    return false;
  if (!InSharedHost(host, n)) {
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  CUstream s = RealStream(stream == 0 && per_thread ? 2 : stream);
  void* h = reinterpret_cast<void*>(host);
  if (to_device) {
    if (async) {
      *rc = a.cuMemcpyHtoDAsync_v2(device, h, n, s);
    } else {
      auto copy = per_thread && a.cuMemcpyHtoD_v2_pt ? a.cuMemcpyHtoD_v2_pt : a.cuMemcpyHtoD_v2;
      *rc = copy(device, h, n);
    }
  } else if (async) {
    *rc = a.cuMemcpyDtoHAsync_v2(h, device, n, s);
  } else {
    auto copy = per_thread && a.cuMemcpyDtoH_v2_pt ? a.cuMemcpyDtoH_v2_pt : a.cuMemcpyDtoH_v2;
    *rc = copy(h, device, n);
  }
  return true;
}

void Session::ReleaseSharedHost() {
  if (shared_host_.empty()) return;
  if (exec_ != nullptr || primary_ != nullptr)
    state_->api.cuCtxSetCurrent(exec_ ? exec_ : primary_);
  SynchronizeSession();  // the GPU may still be copying to or from them
  for (const auto& [addr, bytes] : shared_host_) UnshareHostRegion(addr, bytes);
  FLYT_DEBUG("session %llu: released %zu shared host regions", static_cast<unsigned long long>(id_),
             shared_host_.size());
  shared_host_.clear();
  left_host_.clear();
}

}  // namespace flyt::server
