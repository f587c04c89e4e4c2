// Memory entry points: device allocations (tracked so that unified copies and
// pointer queries are answered locally), host buffers, and copies of every
// shape. Bulk data is cut into chunks that the server moves while the next
// chunk is on the wire; pinned buffers shared over shm:// are the GPU's to reach,
// and over ucx:// the server's to read and write itself (client/rma.cc). Pinned
// memory mapped for the GPU over a socket is a coherent view of the server's pinned
// memory at the same address (kOpHostMap; client/managed_memory.h keeps it).
// Must not: map plain pinned buffers for the GPU before the app asks (their copies
// are the fast path), or touch a mapped buffer's pages outside managed_memory.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "client/client.h"
#include "client/managed_memory.h"
#include "client/proc_address.h"
#include "common/log.h"

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace {

uint16_t Flags(bool per_thread) { return per_thread ? wire::kFlagPerThread : 0; }
uint64_t StreamRaw(CUstream s) { return Client::WireHandle(s); }

// Several servers: a copy goes to the server of its device memory (else its
// stream's, else the current context's); -1 with one server.
int CopyRoute(uint64_t device, CUstream stream) {
  Client& c = Client::Get();
  if (!c.multi()) return -1;
  int server = c.ServerOfPointer(device);
  if (server >= 0) return server;
  const uint64_t s = reinterpret_cast<uintptr_t>(stream);
  return s > 2 ? Client::TagOf(s) : -1;
}

// A free goes to the server of the memory, found before the range is forgotten.
int FreeRoute(uint64_t p) {
  Client& c = Client::Get();
  return c.multi() ? c.ServerOfPointer(p) : -1;
}

bool IsDevice(uint64_t p, uint64_t n = 1) { return Client::Get().FindDeviceRange(p, n); }

namespace managed = flyt::client::managed;

// A synchronous copy that wrote managed memory: once the stream is done, the
// host's view is fetched again (a completion point), as it sees the copy natively.
CUresult SettleManagedCopy(CUresult rc, CUstream stream, bool pt) {
  if (rc != CUDA_SUCCESS) return rc;
  return pt ? Forward<113, true, true>("cuStreamSynchronize", stream)
            : Forward<113, true, false>("cuStreamSynchronize", stream);
}

// A copy whose host side is managed memory: the server copies between the
// managed allocation and the device, never through the client's pages (which
// the socket could not read while they are not present).
CUresult ManagedDeviceCopy(const char* name, CUdeviceptr dst, CUdeviceptr src, size_t n,
                           CUstream stream, bool async, bool pt) {
  CUresult rc = pt ? Forward<168, false, true>(name, dst, src, n, stream)
                   : Forward<168, false, false>(name, dst, src, n, stream);
  return async ? rc : SettleManagedCopy(rc, stream, pt);
}

// A copy between the device and a pinned buffer the server reads and writes itself
// (ucx://, client/rma.cc): a small request, and the bytes move by the transport's
// one-sided reads and writes of this process's memory. Asynchronous copies return at
// once in both directions (the server writes device-to-host bytes in stream order);
// synchronous ones wait for the server, as the buffer may be reused at once.
CUresult CopyRma(const char* name, bool to_device, CUdeviceptr device, uint64_t key,
                 const void* host, size_t n, CUstream stream, bool async, bool pt) {
  Client& c = Client::Get();
  wire::Writer w;
  w.Put<uint8_t>(to_device ? 1 : 0);
  w.Put<uint64_t>(device);
  w.Put<uint64_t>(key);
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(host));
  w.Put<uint64_t>(n);
  w.Put<uint64_t>(StreamRaw(stream));
  w.Put<uint8_t>(async ? 1 : 0);
  if (!async) return c.Call(name, ops::kOpCopyRma, w, ReplySink{}, Flags(pt));
  // The server reads host-to-device bytes when the request runs: host functions queued
  // before it on the stream must have written them by then.
  if (to_device) c.WaitHostFuncs(stream);
  return c.Post(name, ops::kOpCopyRma, w, Flags(pt));
}

// The server's key for a pinned buffer that holds [p, p+n), when the copy goes one-sided:
// always for a buffer registered already (the server then orders all its bytes), else
// for a copy worth registering it (large, or asynchronous to the host). Never while a
// capture runs (a graph's copies take the byte path, which knows how to capture).
bool RmaKeyFor(const void* p, size_t n, bool to_device, bool async, uint64_t* key) {
  Client& c = Client::Get();
  if (c.AnyCapture()) return false;
  const bool worth = n >= c.rma_min_bytes() || (!to_device && async);
  return c.RmaKey(p, n, worth, key);
}

// A copy between the device and pinned memory shared with the server, when a shared
// buffer holds all of [host, host+n) (false: none does; *rc untouched): the GPU reads or
// writes the client's buffer itself (DMA), nothing crosses the rings. Synchronous copies
// wait for the server, as the buffer may be reused at once; asynchronous ones complete in
// stream order, as natively. The request goes only on the connection the buffer's server
// address was read in (Client::SameConnection): when another thread's park moved the
// session in between, nothing was sent and the buffer is looked up again as it is now.
bool CopyIfShared(const char* name, bool to_device, CUdeviceptr device, const void* host, size_t n,
                  CUstream stream, bool async, bool pt, CUresult* rc) {
  Client& c = Client::Get();
  for (;;) {
    const uint64_t gen = c.ConnectionGeneration();
    Client::HostBuffer b;
    if (!c.FindHostBuffer(host, &b) || b.server_addr == 0 || !b.Covers(host, n)) return false;
    Client::SameConnection same(gen);
    wire::Writer w;
    w.Put<uint8_t>(to_device ? 1 : 0);
    w.Put<uint64_t>(device);
    w.Put<uint64_t>(b.server_addr + (reinterpret_cast<uintptr_t>(host) - b.base));
    w.Put<uint64_t>(n);
    w.Put<uint64_t>(StreamRaw(stream));
    w.Put<uint8_t>(async ? 1 : 0);
    *rc = async ? c.Post(name, ops::kOpCopyShared, w, Flags(pt))
                : c.Call(name, ops::kOpCopyShared, w, ReplySink{}, Flags(pt));
    if (!Client::SameConnection::Stale()) return true;
  }
}

CUresult CopyHtoD(const char* name, CUdeviceptr dst, const void* src, size_t n, CUstream stream,
                  bool async, bool pt) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int route = CopyRoute(dst, stream);
  Client::RouteScope scope(route);
  // Pinned buffers shared or registered with server 0 serve only its copies.
  const bool fast = !c.multi() || c.RouteNow() == 0;
  if (managed::Overlaps(reinterpret_cast<uintptr_t>(src), n))
    return ManagedDeviceCopy(name, dst, reinterpret_cast<uintptr_t>(src), n, stream, async, pt);
  if (!async && managed::Overlaps(dst, n)) {  // the host reads the managed bytes next
    CUresult rc = CopyHtoD(name, dst, src, n, stream, true, pt);
    return SettleManagedCopy(rc, stream, pt);
  }
  if (CUresult rc; fast && CopyIfShared(name, true, dst, src, n, stream, async, pt, &rc)) return rc;
  if (uint64_t key = 0; fast && RmaKeyFor(src, n, true, async, &key))
    return CopyRma(name, true, dst, key, src, n, stream, async, pt);
  // A destination we know is valid: the copy can be fire-and-forget, its
  // bytes are on the wire when we return. Otherwise wait for the verdict.
  bool known = c.FindDeviceRange(dst, n);
  const auto* bytes = static_cast<const uint8_t*>(src);
  if (async) c.WaitHostFuncs(stream);
  for (size_t off = 0; off < n; off += wire::kCopyChunk) {
    size_t len = std::min<size_t>(wire::kCopyChunk, n - off);
    wire::Writer w;
    w.Put<uint64_t>(dst + off);
    w.Put<uint64_t>(StreamRaw(stream));
    w.Put<uint8_t>(async ? 1 : 0);
    w.Put<uint64_t>(reinterpret_cast<uintptr_t>(bytes + off));  // re-read if captured in a graph
    CUresult rc;
    if (known || off + len < n) {
      rc = c.Post(name, ops::kOpCopyToDevice, w, Flags(pt), bytes + off, len);
    } else {
      // Unknown destination: send the bytes in the request and wait for the verdict.
      w.PutBytes(bytes + off, len);
      rc = c.Call(name, ops::kOpCopyToDevice, w, ReplySink{}, Flags(pt));
    }
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

CUresult CopyDtoH(const char* name, void* dst, CUdeviceptr src, size_t n, CUstream stream,
                  bool async, bool pt) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int route = CopyRoute(src, stream);
  Client::RouteScope scope(route);
  const bool fast = !c.multi() || c.RouteNow() == 0;
  if (managed::Overlaps(reinterpret_cast<uintptr_t>(dst), n))
    return ManagedDeviceCopy(name, reinterpret_cast<uintptr_t>(dst), src, n, stream, async, pt);
  if (CUresult rc; fast && CopyIfShared(name, false, src, dst, n, stream, async, pt, &rc))
    return rc;
  if (uint64_t key = 0; fast && RmaKeyFor(dst, n, false, async, &key))
    return CopyRma(name, false, src, key, dst, n, stream, async, pt);
  // Over shm://: the GPU writes into a staging area this process shares with the
  // server, and the chunks are copied out here as they land (client/staged_copy.cc).
  if (CUresult rc; fast && c.StagedDownload(name, dst, src, n, stream, async, pt, &rc)) {
    if (rc == CUDA_SUCCESS && async) c.NoteStreamDrained(stream, pt);
    return rc;
  }
  auto* out = static_cast<uint8_t*>(dst);
  for (size_t off = 0; off < n; off += wire::kMaxPayload) {
    size_t len = std::min<size_t>(wire::kMaxPayload, n - off);
    wire::Writer w;
    w.Put<uint64_t>(src + off);
    w.Put<uint64_t>(len);
    w.Put<uint64_t>(StreamRaw(stream));
    w.Put<uint8_t>(async ? 1 : 0);
    w.Put<uint64_t>(reinterpret_cast<uintptr_t>(out + off));  // written when a graph runs
    CUresult rc =
        c.Call(name, ops::kOpCopyFromDevice, w, ReplySink{nullptr, out + off, len}, Flags(pt));
    if (rc != CUDA_SUCCESS) return rc;
  }
  // The bytes came back, so the stream had finished: an app's following
  // cuStreamSynchronize (PyTorch's .item()) needs no second round trip.
  if (async && !c.AnyCapture()) c.NoteStreamDrained(stream, pt);
  return CUDA_SUCCESS;
}

CUresult CopyUnified(const char* name, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream,
                     bool async, bool pt) {
  bool dd = IsDevice(dst, n), sd = IsDevice(src, n);
  if (dd && sd) {
    // Managed memory counts as device memory here (its allocation is the GPU's).
    if (managed::Overlaps(dst, n)) return ManagedDeviceCopy(name, dst, src, n, stream, async, pt);
    return pt ? Forward<168, false, true>(name, dst, src, n, stream)
              : Forward<168, false, false>(name, dst, src, n, stream);
  }
  if (dd) return CopyHtoD(name, dst, reinterpret_cast<const void*>(src), n, stream, async, pt);
  if (sd) return CopyDtoH(name, reinterpret_cast<void*>(dst), src, n, stream, async, pt);
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  // Host to host: ordered after earlier work like the driver does.
  CUresult rc = Forward<100, true, false>("cuCtxSynchronize");
  if (rc != CUDA_SUCCESS) return rc;
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

// Resolves CU_MEMORYTYPE_UNIFIED to host or device.
CUmemorytype Side(CUmemorytype t, uint64_t device, const void* host) {
  if (t != CU_MEMORYTYPE_UNIFIED) return t;
  uint64_t p = device != 0 ? device : reinterpret_cast<uintptr_t>(host);
  return IsDevice(p) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
}

uint8_t* HostRow(const CUDA_MEMCPY3D& d, bool src, size_t y, size_t z) {
  const void* base = src ? d.srcHost : d.dstHost;
  if (base == nullptr) base = reinterpret_cast<const void*>(src ? d.srcDevice : d.dstDevice);
  size_t x0 = src ? d.srcXInBytes : d.dstXInBytes, y0 = src ? d.srcY : d.dstY,
         z0 = src ? d.srcZ : d.dstZ, pitch = src ? d.srcPitch : d.dstPitch,
         height = src ? d.srcHeight : d.dstHeight;
  return static_cast<uint8_t*>(const_cast<void*>(base)) + ((z0 + z) * height + y0 + y) * pitch + x0;
}

CUresult Copy3D(const char* name, CUDA_MEMCPY3D d, CUstream stream, bool async, bool pt) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  d.srcMemoryType = Side(d.srcMemoryType, d.srcDevice, d.srcHost);
  d.dstMemoryType = Side(d.dstMemoryType, d.dstDevice, d.dstHost);
  bool src_host = d.srcMemoryType == CU_MEMORYTYPE_HOST;
  bool dst_host = d.dstMemoryType == CU_MEMORYTYPE_HOST;
  size_t w = d.WidthInBytes, h = d.Height, depth = d.Depth;
  if (w == 0 || h == 0 || depth == 0) return CUDA_SUCCESS;
  if ((src_host && d.srcPitch < w && h * depth > 1) ||
      (dst_host && d.dstPitch < w && h * depth > 1))
    return CUDA_ERROR_INVALID_VALUE;
  if (src_host && dst_host) {
    CUresult rc = Forward<100, true, false>("cuCtxSynchronize");
    if (rc != CUDA_SUCCESS) return rc;
    for (size_t z = 0; z < depth; ++z)
      for (size_t y = 0; y < h; ++y)
        std::memmove(HostRow(d, false, y, z), HostRow(d, true, y, z), w);
    return CUDA_SUCCESS;
  }
  if (w > wire::kMaxPayload) return CUDA_ERROR_NOT_SUPPORTED;
  // Several servers: the copy goes to the server of its device memory or arrays
  // (their handles without the server's tag); between two servers' device
  // memory it goes server to server, piece by piece; with an array of one of
  // them it is refused.
  int route = -1;
  if (c.multi()) {
    flyt::client::ArgRoute where;
    int server_of[2] = {-1, -1};  // dst, src
    auto side = [&](CUmemorytype t, uint64_t device, CUarray* array, int* server) {
      if (t == CU_MEMORYTYPE_DEVICE) {
        *server = c.ServerOfPointer(device);
        flyt::client::RouteArg(&where, *server);
      } else if (t == CU_MEMORYTYPE_ARRAY && *array != nullptr) {
        flyt::client::RouteArg(&where, Client::TagOf(reinterpret_cast<uintptr_t>(*array)));
        *array = reinterpret_cast<CUarray>(Client::Untag(reinterpret_cast<uintptr_t>(*array)));
      }
    };
    side(d.srcMemoryType, d.srcDevice, &d.srcArray, &server_of[1]);
    side(d.dstMemoryType, d.dstDevice, &d.dstArray, &server_of[0]);
    if (where.server == -2) {
      if (d.srcMemoryType == CU_MEMORYTYPE_DEVICE && d.dstMemoryType == CU_MEMORYTYPE_DEVICE)
        return flyt::client::Copy3DAcrossServers(name, d, server_of[0], server_of[1], stream, async,
                                                 pt);
      return flyt::client::RefuseAcrossServers(name);
    }
    route = where.server;
    if (route < 0) route = CopyRoute(0, stream);
  }
  Client::RouteScope scope(route);
  size_t rows_per_chunk = std::max<size_t>(1, wire::kMaxPayload / w);
  std::vector<uint8_t> dense;
  for (size_t z = 0; z < depth; ++z) {
    for (size_t y = 0; y < h; y += rows_per_chunk) {
      size_t rows = std::min(rows_per_chunk, h - y);
      // One chunk covers the whole copy when it fits, else rows of one slice.
      bool whole = w * h * depth <= wire::kMaxPayload;
      size_t chunk_depth = whole ? depth : 1;
      if (whole) rows = h;
      CUDA_MEMCPY3D part = d;
      part.Height = rows;
      part.Depth = chunk_depth;
      part.srcY += y;
      part.dstY += y;
      part.srcZ += z;
      part.dstZ += z;
      if (src_host) part.srcHost = nullptr;
      if (dst_host) part.dstHost = nullptr;
      size_t dense_len = w * rows * chunk_depth;
      wire::Writer req;
      req.Put(part);
      req.Put<uint64_t>(StreamRaw(stream));
      req.Put<uint8_t>(async ? 1 : 0);
      req.Put<uint8_t>(src_host ? 1 : 0);
      req.Put<uint8_t>(dst_host ? 1 : 0);
      if (src_host) {
        uint8_t* out = req.Grow(dense_len);
        for (size_t zz = 0; zz < chunk_depth; ++zz)
          for (size_t yy = 0; yy < rows; ++yy)
            std::memcpy(out + (zz * rows + yy) * w, HostRow(d, true, y + yy, z + zz), w);
      }
      CUresult rc;
      if (dst_host) {
        rc = c.Call(name, ops::kOpCopy3D, req, ReplySink{&dense}, Flags(pt));
        if (rc == CUDA_SUCCESS) {
          if (dense.size() != dense_len) return CUDA_ERROR_UNKNOWN;
          for (size_t zz = 0; zz < chunk_depth; ++zz)
            for (size_t yy = 0; yy < rows; ++yy)
              std::memcpy(HostRow(d, false, y + yy, z + zz), dense.data() + (zz * rows + yy) * w,
                          w);
        }
      } else if (async) {
        rc = c.Post(name, ops::kOpCopy3D, req, Flags(pt));
      } else {
        rc = c.Call(name, ops::kOpCopy3D, req, ReplySink{}, Flags(pt));
      }
      if (rc != CUDA_SUCCESS) return rc;
      if (whole) return CUDA_SUCCESS;
    }
  }
  return CUDA_SUCCESS;
}

CUDA_MEMCPY3D From2D(const CUDA_MEMCPY2D* p) {
  CUDA_MEMCPY3D d{};
  d.srcXInBytes = p->srcXInBytes;
  d.srcY = p->srcY;
  d.srcMemoryType = p->srcMemoryType;
  d.srcHost = p->srcHost;
  d.srcDevice = p->srcDevice;
  d.srcArray = p->srcArray;
  d.srcPitch = p->srcPitch;
  d.srcHeight = p->srcY + p->Height;
  d.dstXInBytes = p->dstXInBytes;
  d.dstY = p->dstY;
  d.dstMemoryType = p->dstMemoryType;
  d.dstHost = p->dstHost;
  d.dstDevice = p->dstDevice;
  d.dstArray = p->dstArray;
  d.dstPitch = p->dstPitch;
  d.dstHeight = p->dstY + p->Height;
  d.WidthInBytes = p->WidthInBytes;
  d.Height = p->Height;
  d.Depth = 1;
  return d;
}

}  // namespace

// --- device memory

FLYT_API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  CUresult rc = Forward<150, true, false>("cuMemAlloc_v2", p, n);
  Client& c = Client::Get();
  if (rc == CUDA_SUCCESS && p != nullptr && c.multi()) {
    // Several servers place memory apart (kOpPlaceMemory); one that could not
    // (an older server) may give out another server's addresses: refused.
    const int server = Client::LastRoute();
    if (c.CollidesAcrossServers(*p, n, server)) {
      FLYT_ERROR(
          "cuMemAlloc: server %d gave out device addresses another server of this process "
          "uses (0x%llx, %zu bytes); refused (CUDA_ERROR_OUT_OF_MEMORY): run the same "
          "flyt-server version on every server",
          server, static_cast<unsigned long long>(*p), n);
      Client::RouteScope scope(server);
      Forward<152, true, false>("cuMemFree_v2", *p);
      *p = 0;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  if (rc == CUDA_SUCCESS && p != nullptr) c.AddDeviceRange(*p, n, true);
  return rc;
}

FLYT_API CUresult cuMemAllocPitch_v2(CUdeviceptr* p, size_t* pitch, size_t w, size_t h,
                                     unsigned int elem) {
  CUresult rc = Forward<151, true, false>("cuMemAllocPitch_v2", p, pitch, w, h, elem);
  if (rc == CUDA_SUCCESS && p != nullptr && pitch != nullptr)
    Client::Get().AddDeviceRange(*p, *pitch * h, true);
  return rc;
}

// Stream-ordered allocations: tracked like cuMemAlloc's, and with the pool each came from
// (cuMemAllocAsync: the device's current pool then, which the client follows through
// cuDeviceSetMemPool and cuMemPoolDestroy; null for the device's default pool, asked for
// when a pointer query needs it), which pointer queries answer
// (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE; such memory is neither legacy-IPC nor GPUDirect
// RDMA capable).
namespace {
struct PoolPlace {
  CUmemoryPool pool = nullptr;  // null: the default pool of `device`
  int device = 0;
};
std::mutex& PoolMutex() {
  static std::mutex mu;
  return mu;
}
std::map<uint64_t, PoolPlace>& PoolOf() {
  static auto* map = new std::map<uint64_t, PoolPlace>;
  return *map;
}
// The pool each device's cuMemAllocAsync takes from where the app set one (under PoolMutex).
std::map<int, CUmemoryPool>& CurrentPools() {
  static auto* map = new std::map<int, CUmemoryPool>;
  return *map;
}
void NotePoolAlloc(uint64_t base, CUmemoryPool pool) {
  PoolPlace place{pool, 0};
  CUdevice dev = 0;
  if (cuCtxGetDevice(&dev) == CUDA_SUCCESS) place.device = dev;
  std::lock_guard<std::mutex> lock(PoolMutex());
  if (pool == nullptr) {  // the device's current pool
    auto cur = CurrentPools().find(place.device);
    if (cur != CurrentPools().end()) place.pool = cur->second;
  }
  PoolOf()[base] = place;
}
void ForgetPoolAlloc(uint64_t base) {
  std::lock_guard<std::mutex> lock(PoolMutex());
  PoolOf().erase(base);
}
// True when the allocation at `base` came from a pool; *pool is that pool.
bool PoolAlloc(uint64_t base, CUmemoryPool* pool) {
  PoolPlace place;
  {
    std::lock_guard<std::mutex> lock(PoolMutex());
    auto it = PoolOf().find(base);
    if (it == PoolOf().end()) return false;
    place = it->second;
  }
  *pool = place.pool;
  if (*pool == nullptr && cuDeviceGetDefaultMemPool(pool, place.device) != CUDA_SUCCESS)
    *pool = nullptr;
  return true;
}
}  // namespace

FLYT_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  CUresult rc = Forward<236, true, false>("cuDeviceSetMemPool", dev, pool);
  if (rc == CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(PoolMutex());
    CurrentPools()[dev] = pool;
  }
  return rc;
}
FLYT_API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  {  // a device whose current pool it was takes from its default pool again, as natively
    std::lock_guard<std::mutex> lock(PoolMutex());
    for (auto it = CurrentPools().begin(); it != CurrentPools().end();)
      it = it->second == pool ? CurrentPools().erase(it) : std::next(it);
  }
  return Forward<238, false, false>("cuMemPoolDestroy", pool);
}

FLYT_API CUresult cuMemFree_v2(CUdeviceptr p) {
  if (p == 0) return CUDA_SUCCESS;
  // Memory opened over IPC: the driver refuses to free it (cuIpcCloseMemHandle does).
  if (flyt::client::IsIpcMapping(p)) return CUDA_ERROR_INVALID_VALUE;
  managed::Unmap(p);  // managed memory: its host view goes first
  ForgetPoolAlloc(p);
  Client::RouteScope scope(FreeRoute(p));
  if (Client::Get().RemoveDeviceRange(p)) return Forward<152, false, false>("cuMemFree_v2", p);
  return Forward<152, true, false>("cuMemFree_v2", p);  // unknown: let the server judge now
}

// Stream-ordered allocations: tracked like cuMemAlloc's, with their pools (above).
#define FLYT_ASYNC_ALLOC(name, pt)                               \
  FLYT_API CUresult name(CUdeviceptr* p, size_t n, CUstream s) { \
    CUresult rc = Forward<240, true, pt>(#name, p, n, s);        \
    if (rc == CUDA_SUCCESS && p != nullptr) {                    \
      Client::Get().AddDeviceRange(*p, n, true);                 \
      NotePoolAlloc(*p, nullptr);                                \
    }                                                            \
    return rc;                                                   \
  }
FLYT_ASYNC_ALLOC(cuMemAllocAsync, false)
FLYT_ASYNC_ALLOC(cuMemAllocAsync_ptsz, true)
#define FLYT_POOL_ALLOC(name, pt)                                                   \
  FLYT_API CUresult name(CUdeviceptr* p, size_t n, CUmemoryPool pool, CUstream s) { \
    CUresult rc = Forward<241, true, pt>(#name, p, n, pool, s);                     \
    if (rc == CUDA_SUCCESS && p != nullptr) {                                       \
      Client::Get().AddDeviceRange(*p, n, true);                                    \
      NotePoolAlloc(*p, pool);                                                      \
    }                                                                               \
    return rc;                                                                      \
  }
FLYT_POOL_ALLOC(cuMemAllocFromPoolAsync, false)
FLYT_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz, true)
FLYT_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  if (flyt::client::IsIpcMapping(p)) return CUDA_ERROR_INVALID_VALUE;
  ForgetPoolAlloc(p);
  Client::RouteScope scope(FreeRoute(p));
  if (Client::Get().RemoveDeviceRange(p)) return Forward<242, false, false>("cuMemFreeAsync", p, s);
  return Forward<242, true, false>("cuMemFreeAsync", p, s);
}
FLYT_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  if (flyt::client::IsIpcMapping(p)) return CUDA_ERROR_INVALID_VALUE;
  Client::RouteScope scope(FreeRoute(p));
  if (Client::Get().RemoveDeviceRange(p))
    return Forward<242, false, true>("cuMemFreeAsync_ptsz", p, s);
  return Forward<242, true, true>("cuMemFreeAsync_ptsz", p, s);
}

FLYT_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  uint64_t b = 0, s = 0;
  if (Client::Get().FindDeviceRange(p, 0, &b, &s)) {
    if (base) *base = b;
    if (size) *size = s;
    return CUDA_SUCCESS;
  }
  return Forward<154, true, false>("cuMemGetAddressRange_v2", base, size, p);
}

namespace {
// After cuModuleGetGlobal / cuLibraryGetGlobal: a __managed__ variable's host
// side is mapped (the server said so in the reply), other globals are device
// memory to copies and pointer queries.
CUresult KnowGlobal(CUresult rc, CUdeviceptr d, size_t local, uint64_t image, CUdeviceptr* p,
                    size_t* size) {
  if (rc != CUDA_SUCCESS) return rc;
  if (Client::LastReplyInfo() & wire::kReplyManaged) {
    rc = flyt::client::MapManagedGlobal(d, image);
    if (rc != CUDA_SUCCESS) return rc;
  } else {
    Client::Get().AddDeviceRange(d, local, false);
  }
  if (size) *size = local;
  if (p) *p = d;
  return CUDA_SUCCESS;
}
}  // namespace

FLYT_API CUresult cuModuleGetGlobal_v2(CUdeviceptr* p, size_t* size, CUmodule m, const char* name) {
  size_t local = 0;
  CUdeviceptr d = 0;
  CUresult rc = Forward<201, true, false>("cuModuleGetGlobal_v2", &d, &local, m, name);
  return KnowGlobal(rc, d, local, reinterpret_cast<uintptr_t>(m), p, size);
}

FLYT_API CUresult cuLibraryGetGlobal(CUdeviceptr* p, size_t* size, CUlibrary l, const char* name) {
  size_t local = 0;
  CUdeviceptr d = 0;
  // Several servers: the global of the current context's device, in the
  // library's copy on that device's server.
  if (Client::Get().multi()) {
    const uint64_t there =
        flyt::client::LibraryOnServer(reinterpret_cast<uintptr_t>(l), Client::Get().RouteNow());
    if (there == 0) return CUDA_ERROR_INVALID_HANDLE;
    l = reinterpret_cast<CUlibrary>(there);
  }
  CUresult rc = Forward<202, true, false>("cuLibraryGetGlobal", &d, &local, l, name);
  return KnowGlobal(rc, d, local, reinterpret_cast<uintptr_t>(l), p, size);
}

// --- host memory. Over shm:// a pinned buffer is a sealed memfd shared with
// the server, which registers it with the driver: copies to and from it are
// DMA and kernels reach it (zero copy). Over ucx:// it is page-aligned client
// memory that the server reads and writes itself once registered (client/rma.cc).
// Otherwise (another network transport, or a server that refuses) it is
// page-aligned client memory that copies treat like any host buffer. cuMemHostRegister of the app's
// own memory is bookkeeping only: the server cannot map another process's private pages, so copies
// from it take the pageable path.
//
// Memory the GPU maps, over any transport but as shm:// pinned buffers: a buffer allocated with
// CU_MEMHOSTALLOC_DEVICEMAP, registered with CU_MEMHOSTREGISTER_DEVICEMAP, or whose device pointer
// the app asks for (cuMemHostGetDevicePointer). The server holds pinned, mapped memory at the
// same address (so the host pointer is the device pointer, as under UVA natively), and this
// process's pages there become a coherent view of it, kept like managed memory's
// (managed_memory.h): the host's writes reach the GPU before device work, the GPU's are seen
// once the work is known complete. Plain pinned buffers are not mapped until asked: their copies
// stay the fast paths above (docs/compatibility.md says why).

namespace {

size_t PageRound(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return ((n ? n : 1) + page - 1) / page * page;
}

}  // namespace

namespace {
// Shared pinned buffers whose memfd is kept for a move (one descriptor each): at most
// this many, so that an app with thousands of pinned buffers keeps descriptors to spare
// (a buffer beyond them keeps its session from moving, as every one did before).
constexpr int kMaxKeptShareFds = 512;
std::atomic<int> g_kept_share_fds{0};
}  // namespace

void flyt::client::ForgetShareFd(Client::HostBuffer* b) {
  if (b->share_fd < 0) return;
  close(b->share_fd);
  b->share_fd = -1;
  g_kept_share_fds.fetch_sub(1);
}

// A buffer shared with the server; CUDA_ERROR_NOT_SUPPORTED means "use private memory".
CUresult flyt::client::AllocSharedHost(size_t bytes, unsigned flags, Client::HostBuffer* b,
                                       const char* name) {
  Client& c = Client::Get();
  if (!c.SharesMemory()) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return CUDA_ERROR_NOT_SUPPORTED;
  void* p = MAP_FAILED;
  uint64_t id = 0;
  CUresult rc = CUDA_ERROR_NOT_SUPPORTED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
      (p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) != MAP_FAILED &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    rc = c.ShareFd(fd, &id);
  // The mapping (and the server's copy of the descriptor) keep the memory; an app's
  // buffer keeps its descriptor too while there are few, for the next server of a move.
  int kept = -1;
  // Not a buffer the app maps for its kernels (CU_MEMHOSTALLOC_DEVICEMAP): after a move to
  // a server reached over a socket, a kept buffer is this process's own memory.
  const bool movable =
      rc == CUDA_SUCCESS && (flags & (ops::kHostShareStaging | CU_MEMHOSTALLOC_DEVICEMAP)) == 0;
  if (movable && g_kept_share_fds.fetch_add(1) < kMaxKeptShareFds) {
    kept = fd;
  } else {
    if (movable) g_kept_share_fds.fetch_sub(1);
    close(fd);
  }
  if (rc != CUDA_SUCCESS) {
    if (p != MAP_FAILED) munmap(p, bytes);
    return rc == CUDA_ERROR_OPERATING_SYSTEM ? CUDA_ERROR_NOT_SUPPORTED : rc;
  }
  b->share_fd = kept;
  wire::Writer w;
  w.Put<uint64_t>(id);
  w.Put<uint64_t>(bytes);
  w.Put<uint32_t>(kept >= 0 ? flags | ops::kHostShareMovable : flags);
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(p));
  std::vector<uint8_t> reply;
  rc = c.Call("cuMemHostAlloc", ops::kOpHostShare, w, ReplySink{&reply});
  wire::Reader r(reply.data(), reply.size());
  if (rc == CUDA_SUCCESS && (!r.Get(&b->server_addr) || !r.Get(&b->device_ptr)))
    rc = CUDA_ERROR_UNKNOWN;
  if (rc != CUDA_SUCCESS) {
    ForgetShareFd(b);
    munmap(p, bytes);
    return rc;
  }
  b->base = reinterpret_cast<uintptr_t>(p);
  b->size = bytes;
  b->flags = flags;
  b->owned = true;
  return CUDA_SUCCESS;
}

namespace {

// Unregisters and unmaps the server's pinned memory at `base` (kOpHostMap's); the session's
// work on it drains first.
CUresult UnmapOnServer(const char* name, uint64_t base) {
  wire::Writer w;
  w.Put<uint64_t>(base);
  return Client::Get().Call(name, ops::kOpHostUnshare, w, ReplySink{});
}

// The server places pinned memory the GPU maps at [base, base+bytes) (the same address
// there), and this process's bytes [p, p+n) there become the coherent view of it. `adopt`:
// they are the app's and keep their values; otherwise they are a reservation of ours.
// CUDA_ERROR_ALREADY_MAPPED: the server has something at those addresses.
CUresult MapForDevice(const char* name, uint64_t base, uint64_t bytes, unsigned flags, uint64_t p,
                      uint64_t n, bool adopt) {
  Client& c = Client::Get();
  wire::Writer w;
  w.Put<uint64_t>(base);
  w.Put<uint64_t>(bytes);
  w.Put<uint32_t>(flags);
  std::vector<uint8_t> reply;
  CUresult rc = c.Call(name, ops::kOpHostMap, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS) return rc;
  uint64_t device = 0;
  wire::Reader r(reply.data(), reply.size());
  if (!r.Get(&device) || device != base) rc = CUDA_ERROR_UNKNOWN;
  if (rc == CUDA_SUCCESS) rc = managed::MapHost(p, n, base, adopt);
  if (rc != CUDA_SUCCESS) {
    CUresult freed = UnmapOnServer(name, base);
    if (freed != CUDA_SUCCESS)
      FLYT_WARN("%s: the server's pinned memory at 0x%llx could not be freed (error %d)", name,
                static_cast<unsigned long long>(base), freed);
  }
  return rc;
}

// The server's address for new mapped memory clashes with its own this many times at most.
constexpr int kMapAttempts = 8;

// A new buffer the GPU maps (cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP over a socket).
CUresult AllocMapped(size_t bytes, unsigned flags, Client::HostBuffer* b) {
  std::vector<void*> clashing;  // kept until the end, so the next one lands elsewhere
  CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
  for (int attempt = 0; attempt < kMapAttempts; ++attempt) {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      rc = CUDA_ERROR_OUT_OF_MEMORY;
      break;
    }
    const auto at = reinterpret_cast<uintptr_t>(p);
    rc = MapForDevice("cuMemHostAlloc", at, bytes, flags, at, bytes, false);
    if (rc == CUDA_SUCCESS) {
      *b = Client::HostBuffer{reinterpret_cast<uintptr_t>(p), bytes, flags, true, 0, 0};
      b->device_ptr = b->base;
      b->coherent = true;
      break;
    }
    clashing.push_back(p);
    if (rc != CUDA_ERROR_ALREADY_MAPPED) break;
  }
  for (void* p : clashing) munmap(p, bytes);
  if (rc == CUDA_ERROR_ALREADY_MAPPED) {
    FLYT_ERROR(
        "cuMemHostAlloc: flyt-server has memory of its own at every address tried for %zu bytes "
        "of mapped pinned memory (%d tries)",
        bytes, kMapAttempts);
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  }
  return rc;
}

// Maps a pinned or registered buffer for the GPU where it is (its pages, whole): the
// app's pointer becomes the device pointer. Serialised, so that two threads asking for
// one buffer's device pointer map it once.
std::mutex g_map_mu;
CUresult MapExisting(const char* name, Client::HostBuffer* b) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(g_map_mu);
  Client::HostBuffer now;
  if (c.FindHostBuffer(reinterpret_cast<void*>(b->base), &now) && now.base == b->base &&
      now.device_ptr != 0) {
    *b = now;  // another thread mapped it meanwhile
    return CUDA_SUCCESS;
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t first = b->base & ~(page - 1);
  const uint64_t end = (b->base + b->size + page - 1) & ~(page - 1);
  // Read and written one-sided by the server so far (ucx://): its key goes first, its pages
  // are about to be replaced.
  CUresult rc = c.RmaForget(*b);
  if (rc != CUDA_SUCCESS) return rc;
  rc = MapForDevice(name, first, end - first, b->flags, b->base, b->size, true);
  if (rc == CUDA_ERROR_ALREADY_MAPPED) {
    FLYT_WARN(
        "%s: flyt-server has memory of its own at this buffer's addresses (0x%llx, %llu bytes); "
        "it cannot be mapped for the GPU. Allocate it with cudaHostAlloc(cudaHostAllocMapped) "
        "instead",
        name, static_cast<unsigned long long>(first), static_cast<unsigned long long>(end - first));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (rc != CUDA_SUCCESS) return rc;
  Client::HostBuffer old;
  c.RemoveHostBuffer(reinterpret_cast<void*>(b->base), &old);
  b->device_ptr = b->base;
  b->coherent = true;
  b->rma_key = b->rma_handle = b->rma_gen = 0;
  c.AddHostBuffer(*b);
  return CUDA_SUCCESS;
}

// A shared pinned buffer whose device pointer the app asks for: the server no longer
// lets a move leave it behind, and its kept memfd goes. Serialised with MapExisting, so
// that two threads asking at once close the descriptor once.
CUresult KeepMapped(Client::HostBuffer* b) {
  Client& c = Client::Get();
  std::lock_guard<std::mutex> lock(g_map_mu);
  Client::HostBuffer now;
  if (!c.FindHostBuffer(reinterpret_cast<void*>(b->base), &now) || now.base != b->base ||
      now.share_fd < 0) {
    b->share_fd = -1;  // another thread did it meanwhile
    return CUDA_SUCCESS;
  }
  wire::Writer w;
  w.Put<uint8_t>(ops::kDriverMiscHostKeepMapped);
  w.Put<uint64_t>(now.server_addr);
  Client::RouteScope scope(c.multi() ? 0 : -1);  // shared buffers are server 0's
  CUresult rc = c.Call("cuMemHostGetDevicePointer", ops::kOpDriverMisc, w, ReplySink{});
  if (rc != CUDA_SUCCESS) return rc;
  flyt::client::ForgetShareFd(&now);
  c.AddHostBuffer(now);
  *b = now;
  return CUDA_SUCCESS;
}

// A mapped buffer goes: the server frees its memory (after the session's work on it);
// `restore` keeps the bytes at the address as ordinary memory (the app's own buffer).
CUresult UnmapMapped(const char* name, const Client::HostBuffer& b, bool restore) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t base = b.base & ~(page - 1);  // the server's pages of it start there
  CUresult rc = CUDA_SUCCESS;
  if (restore) {
    // The device's writes must be in the bytes the app keeps.
    rc = Forward<100, true, false>("cuCtxSynchronize");
    managed::UnmapHost(base, true);
  }
  CUresult freed = UnmapOnServer(name, base);
  if (!restore) managed::UnmapHost(base, false);
  return rc != CUDA_SUCCESS ? rc : freed;
}

}  // namespace

FLYT_API CUresult cuMemHostAlloc(void** pp, size_t n, unsigned int flags) {
  if (pp == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  const size_t bytes = PageRound(n);
  Client::HostBuffer b;
  CUresult rc = flyt::client::AllocSharedHost(bytes, flags, &b);
  // Over a socket, mapped for the GPU: a coherent view of the server's pinned memory.
  if (rc == CUDA_ERROR_NOT_SUPPORTED && (flags & CU_MEMHOSTALLOC_DEVICEMAP) != 0) {
    rc = AllocMapped(bytes, flags, &b);
    if (rc == CUDA_ERROR_NOT_SUPPORTED)
      FLYT_WARN(
          "cuMemHostAlloc: flyt-server cannot map pinned memory for the GPU; this buffer is "
          "not mapped (cuMemHostGetDevicePointer will refuse it)");
  }
  if (rc == CUDA_ERROR_NOT_SUPPORTED) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    b = Client::HostBuffer{reinterpret_cast<uintptr_t>(p), bytes, flags, true, 0, 0};
  } else if (rc != CUDA_SUCCESS) {
    return rc;
  }
  // Where the server could not map the buffer at the client's address, its
  // device pointer differs: known as device memory, copies with it stay on the GPU.
  if (b.device_ptr != 0 && b.device_ptr != b.base && !b.coherent)
    c.AddDeviceRange(b.device_ptr, b.size, true);
  c.AddHostBuffer(b);
  *pp = reinterpret_cast<void*>(b.base);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuMemAllocHost_v2(void** pp, size_t n) { return cuMemHostAlloc(pp, n, 0); }

FLYT_API CUresult cuMemFreeHost(void* p) {
  Client& c = Client::Get();
  Client::HostBuffer b;
  if (!c.FindHostBuffer(p, &b) || b.base != reinterpret_cast<uintptr_t>(p) || !b.owned)
    return CUDA_ERROR_INVALID_VALUE;
  c.RemoveHostBuffer(p, &b);
  if (b.coherent) return UnmapMapped("cuMemFreeHost", b, false);
  if (b.device_ptr != 0 && b.device_ptr != b.base) c.RemoveDeviceRange(b.device_ptr);
  // Read and written by the server (ucx://): it drains its work on it and drops its key.
  CUresult rc = c.RmaForget(b);
  if (b.server_addr != 0) {
    // The server drains the GPU's work on it, then unregisters and unmaps.
    wire::Writer w;
    w.Put<uint64_t>(b.server_addr);
    rc = c.Call("cuMemFreeHost", ops::kOpHostUnshare, w, ReplySink{});
  }
  flyt::client::ForgetShareFd(&b);
  munmap(p, b.size);
  return rc;
}

FLYT_API CUresult cuMemHostRegister_v2(void* p, size_t n, unsigned int flags) {
  if (p == nullptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  if (c.FindHostBuffer(p, nullptr)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  Client::HostBuffer b{reinterpret_cast<uintptr_t>(p), n, flags, false, 0, 0};
  if ((flags & CU_MEMHOSTREGISTER_DEVICEMAP) != 0) {
    // Mapped for the GPU: its pages become a coherent view of the server's pinned memory.
    if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (managed::Overlaps(b.base, n)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    c.AddHostBuffer(b);
    CUresult rc = MapExisting("cuMemHostRegister", &b);
    if (rc != CUDA_SUCCESS) c.RemoveHostBuffer(p, nullptr);
    return rc;
  }
  c.AddHostBuffer(b);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuMemHostUnregister(void* p) {
  Client& c = Client::Get();
  Client::HostBuffer b;
  if (!c.FindHostBuffer(p, &b) || b.base != reinterpret_cast<uintptr_t>(p) || b.owned)
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  c.RemoveHostBuffer(p, &b);
  if (b.coherent) return UnmapMapped("cuMemHostUnregister", b, true);
  return c.RmaForget(b);  // read and written by the server (ucx://): its key goes first
}

FLYT_API CUresult cuMemHostGetFlags(unsigned int* flags, void* p) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client::HostBuffer b;
  if (!Client::Get().FindHostBuffer(p, &b)) return CUDA_ERROR_INVALID_VALUE;
  *flags = b.flags;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* out, void* p, unsigned int flags) {
  if (out == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Client::HostBuffer b;
  // Memory the driver never pinned has no device address natively either.
  if (!Client::Get().FindHostBuffer(p, &b)) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t off = reinterpret_cast<uintptr_t>(p) - b.base;
  // A pinned buffer shared over shm that a move could leave behind: its device pointer
  // goes to a kernel now, so the server keeps it (the session refuses a move).
  if (b.share_fd >= 0) {
    CUresult kept = KeepMapped(&b);
    if (kept != CUDA_SUCCESS) return kept;
  }
  if (b.device_ptr != 0) {
    *out = b.device_ptr + off;
    return CUDA_SUCCESS;
  }
  // Not mapped yet (pinned memory allocated without CU_MEMHOSTALLOC_DEVICEMAP, as XLA's,
  // or registered without CU_MEMHOSTREGISTER_DEVICEMAP): mapped now, where it is.
  CUresult rc = MapExisting("cuMemHostGetDevicePointer", &b);
  if (rc == CUDA_SUCCESS) {
    *out = b.device_ptr + off;
    return CUDA_SUCCESS;
  }
  static std::atomic<bool> logged{false};
  if (rc == CUDA_ERROR_NOT_SUPPORTED && !logged.exchange(true))
    FLYT_WARN(
        "cuMemHostGetDevicePointer: this buffer cannot be mapped for the GPU; copy the data "
        "with cudaMemcpy instead");
  return rc;
}

// --- pointer attributes (answered from the tables)

namespace {
CUresult PointerAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr, bool lenient) {
  Client& c = Client::Get();
  uint64_t base = 0, size = 0;
  Client::HostBuffer hb;
  bool dev = c.FindDeviceRange(ptr, 0, &base, &size);
  // In a mapped range (cuMemMap), the driver names the whole reservation.
  uint64_t rbase = 0, rsize = 0;
  if (dev && c.FindReservation(ptr, &rbase, &rsize)) {
    base = rbase;
    size = rsize;
  }
  const bool is_managed = dev && managed::Find(ptr, 1, nullptr, nullptr);
  bool host = !dev && c.FindHostBuffer(reinterpret_cast<void*>(ptr), &hb);
  if (host) {
    base = hb.base;
    size = hb.size;
  }
  CUcontext ctx = nullptr;
  int ordinal = 0;  // the device of the allocation's context (several GPUs per server)
  if ((dev || host) && c.device_count() > 0) {
    CUcontext cur = flyt::client::CurrentContext();
    ctx = cur;
    CUcontext owner = nullptr;
    if (dev && c.DeviceRangeOwner(base, &owner, &ordinal) && owner != nullptr) ctx = owner;
    // A VMM mapping: the GPU of its physical memory.
    if (dev && rbase != 0) flyt::client::VmmMappedDevice(ptr, &ordinal);
  }
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      if (!dev && !host && !lenient) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<CUcontext*>(data) = ctx;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      if (!dev && !host && !lenient) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<unsigned*>(data) = dev ? static_cast<unsigned>(CU_MEMORYTYPE_DEVICE)
                                          : (host ? static_cast<unsigned>(CU_MEMORYTYPE_HOST) : 0u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      if (!dev && !host) return lenient ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
      // A shared pinned buffer: the GPU's mapping of it (the same address
      // when the server could map it there).
      *static_cast<CUdeviceptr*>(data) =
          host && hb.device_ptr != 0 ? hb.device_ptr + (ptr - hb.base) : ptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      // Managed memory is the host's at the same address.
      if (!host && !is_managed) return lenient ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: {
      // cuMemAlloc's memory is (GPUDirect RDMA where the device supports it); pool,
      // managed, VMM-mapped and host memory are not, as the driver answers.
      if (!dev && !host && !lenient) return CUDA_ERROR_INVALID_VALUE;
      CUmemoryPool pool = nullptr;
      int plain = dev && !is_managed && rbase == 0 && !PoolAlloc(base, &pool);
      if (plain && attr == CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE &&
          cuDeviceGetAttribute(&plain, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0) !=
              CUDA_SUCCESS)
        plain = 0;
      *static_cast<int*>(data) = plain != 0;
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      // The GPU reads and writes all of it (a VMM range set read-only is not told apart).
      if (!dev && !host) return lenient ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
      *static_cast<unsigned*>(data) = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      // Managed memory: managed and synchronous memops, as the driver says.
      *static_cast<int*>(data) = attr == CU_POINTER_ATTRIBUTE_MAPPED
                                     ? (dev || host)
                                     : (is_managed && (attr == CU_POINTER_ATTRIBUTE_IS_MANAGED ||
                                                       attr == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS));
      // As cuPointerSetAttribute left it (client/api_driver_misc.cc).
      if (attr == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS && dev && flyt::client::SyncMemops(base))
        *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      if (!dev && !host && !lenient) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<int*>(data) = dev ? ordinal : (host ? 0 : -2);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      if (!dev && !host && !lenient) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<CUdeviceptr*>(data) = base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      if (!dev && !host && !lenient) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<size_t*>(data) = size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      *static_cast<unsigned long long*>(data) = 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: {
      CUmemoryPool pool = nullptr;
      *static_cast<CUmemoryPool*>(data) = dev && PoolAlloc(base, &pool) ? pool : nullptr;
      return CUDA_SUCCESS;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
}  // namespace

FLYT_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return PointerAttribute(data, attr, ptr, false);
}

FLYT_API CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data,
                                         CUdeviceptr ptr) {
  if (attrs == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i) {
    if (data[i] == nullptr) continue;
    CUresult rc = PointerAttribute(data[i], attrs[i], ptr, true);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

// --- copies

#define FLYT_COPY_PAIR(legacy, pt, params, call_legacy, call_pt) \
  FLYT_API CUresult legacy params { return call_legacy; }        \
  FLYT_API CUresult pt params { return call_pt; }

FLYT_COPY_PAIR(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, (CUdeviceptr dst, const void* src, size_t n),
               CopyHtoD("cuMemcpyHtoD", dst, src, n, nullptr, false, false),
               CopyHtoD("cuMemcpyHtoD_ptds", dst, src, n, nullptr, false, true))
FLYT_COPY_PAIR(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz,
               (CUdeviceptr dst, const void* src, size_t n, CUstream s),
               CopyHtoD("cuMemcpyHtoDAsync", dst, src, n, s, true, false),
               CopyHtoD("cuMemcpyHtoDAsync_ptsz", dst, src, n, s, true, true))
FLYT_COPY_PAIR(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, (void* dst, CUdeviceptr src, size_t n),
               CopyDtoH("cuMemcpyDtoH", dst, src, n, nullptr, false, false),
               CopyDtoH("cuMemcpyDtoH_ptds", dst, src, n, nullptr, false, true))
FLYT_COPY_PAIR(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz,
               (void* dst, CUdeviceptr src, size_t n, CUstream s),
               CopyDtoH("cuMemcpyDtoHAsync", dst, src, n, s, true, false),
               CopyDtoH("cuMemcpyDtoHAsync_ptsz", dst, src, n, s, true, true))
FLYT_COPY_PAIR(cuMemcpy, cuMemcpy_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n),
               CopyUnified("cuMemcpy", dst, src, n, nullptr, false, false),
               CopyUnified("cuMemcpy_ptds", dst, src, n, nullptr, false, true))
FLYT_COPY_PAIR(cuMemcpyAsync, cuMemcpyAsync_ptsz,
               (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
               CopyUnified("cuMemcpyAsync", dst, src, n, s, true, false),
               CopyUnified("cuMemcpyAsync_ptsz", dst, src, n, s, true, true))
FLYT_COPY_PAIR(cuMemcpy2D_v2, cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D* p),
               p ? Copy3D("cuMemcpy2D", From2D(p), nullptr, false, false)
                 : CUDA_ERROR_INVALID_VALUE,
               p ? Copy3D("cuMemcpy2D_ptds", From2D(p), nullptr, false, true)
                 : CUDA_ERROR_INVALID_VALUE)
FLYT_COPY_PAIR(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D* p),
               p ? Copy3D("cuMemcpy2DUnaligned", From2D(p), nullptr, false, false)
                 : CUDA_ERROR_INVALID_VALUE,
               p ? Copy3D("cuMemcpy2DUnaligned_ptds", From2D(p), nullptr, false, true)
                 : CUDA_ERROR_INVALID_VALUE)
FLYT_COPY_PAIR(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D* p, CUstream s),
               p ? Copy3D("cuMemcpy2DAsync", From2D(p), s, true, false) : CUDA_ERROR_INVALID_VALUE,
               p ? Copy3D("cuMemcpy2DAsync_ptsz", From2D(p), s, true, true)
                 : CUDA_ERROR_INVALID_VALUE)
FLYT_COPY_PAIR(cuMemcpy3D_v2, cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D* p),
               p ? Copy3D("cuMemcpy3D", *p, nullptr, false, false) : CUDA_ERROR_INVALID_VALUE,
               p ? Copy3D("cuMemcpy3D_ptds", *p, nullptr, false, true) : CUDA_ERROR_INVALID_VALUE)
FLYT_COPY_PAIR(cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D* p, CUstream s),
               p ? Copy3D("cuMemcpy3DAsync", *p, s, true, false) : CUDA_ERROR_INVALID_VALUE,
               p ? Copy3D("cuMemcpy3DAsync_ptsz", *p, s, true, true) : CUDA_ERROR_INVALID_VALUE)

// --- memory pool attributes (the value's size depends on the attribute)

namespace {
bool PoolAttrIsInt(CUmemPool_attribute attr) {
  return attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}
CUresult PoolAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value, bool set) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t v = 0;
  if (set)
    v = PoolAttrIsInt(attr) ? static_cast<uint64_t>(*static_cast<int*>(value))
                            : *static_cast<cuuint64_t*>(value);
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(pool));
  w.Put<int32_t>(attr);
  w.Put<uint8_t>(set ? 1 : 0);
  // Several servers: the pool's server.
  Client::RouteScope scope(c.multi() ? Client::TagOf(reinterpret_cast<uintptr_t>(pool)) : -1);
  w.Put<uint64_t>(v);
  std::vector<uint8_t> reply;
  CUresult rc = c.Call(set ? "cuMemPoolSetAttribute" : "cuMemPoolGetAttribute",
                       ops::kOpMemPoolAttribute, w, ReplySink{&reply});
  wire::Reader r(reply.data(), reply.size());
  if (rc == CUDA_SUCCESS && !set) {
    if (!r.Get(&v)) return CUDA_ERROR_UNKNOWN;
    if (PoolAttrIsInt(attr)) {
      *static_cast<int*>(value) = static_cast<int>(v);
    } else {
      *static_cast<cuuint64_t*>(value) = v;
    }
  }
  return rc;
}
}  // namespace

FLYT_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return PoolAttribute(pool, attr, value, true);
}
FLYT_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return PoolAttribute(pool, attr, value, false);
}

// The CUDA 13 pool calls by memory location. A device location is the per-device pool
// (cuDeviceGetDefaultMemPool / GetMemPool / SetMemPool, served above). Host and NUMA
// locations would be pinned memory of the GPU host, and managed pools managed memory,
// neither of which this process could touch: refused as not supported yet.
namespace {
bool DevicePinned(const CUmemLocation* loc, CUmemAllocationType type) {
  return loc->type == CU_MEM_LOCATION_TYPE_DEVICE && type == CU_MEM_ALLOCATION_TYPE_PINNED;
}
}  // namespace
FLYT_API CUresult cuMemGetDefaultMemPool(CUmemoryPool* pool, CUmemLocation* loc,
                                         CUmemAllocationType type) {
  if (pool == nullptr || loc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!DevicePinned(loc, type))
    return static_cast<CUresult>(
        flyt::client::ReportUnsupported("cuMemGetDefaultMemPool for a host, NUMA or managed pool"));
  return cuDeviceGetDefaultMemPool(pool, loc->id);
}
FLYT_API CUresult cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* loc,
                                  CUmemAllocationType type) {
  if (pool == nullptr || loc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!DevicePinned(loc, type))
    return static_cast<CUresult>(
        flyt::client::ReportUnsupported("cuMemGetMemPool for a host, NUMA or managed pool"));
  return cuDeviceGetMemPool(pool, loc->id);
}
FLYT_API CUresult cuMemSetMemPool(CUmemLocation* loc, CUmemAllocationType type, CUmemoryPool pool) {
  if (loc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!DevicePinned(loc, type))
    return static_cast<CUresult>(
        flyt::client::ReportUnsupported("cuMemSetMemPool for a host, NUMA or managed pool"));
  return cuDeviceSetMemPool(loc->id, pool);
}

// --- batched copies (CUDA 12.8+): each copy of the batch goes as cuMemcpyAsync would
// (the batch as a whole in stream order; the driver promises no order inside it). A
// source read "during the API call" is read before the call returns: pageable bytes
// travel with the request anyway; a pinned host source the GPU reads in stream order
// is waited for.
namespace {
CUresult MemcpyBatch(const char* name, CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                     size_t count, CUmemcpyAttributes* attrs, size_t* idxs, size_t num_attrs,
                     size_t* fail_idx, CUstream s, bool pt) {
  if (fail_idx != nullptr) *fail_idx = SIZE_MAX;
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      idxs == nullptr || num_attrs == 0 || num_attrs > count || idxs[0] != 0 ||
      s == CU_STREAM_LEGACY || (s == nullptr && !pt))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t k = 0; k < num_attrs; ++k) {
    const auto order = attrs[k].srcAccessOrder;
    if ((k > 0 && idxs[k] <= idxs[k - 1]) || idxs[k] >= count ||
        order < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM || order > CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
      return CUDA_ERROR_INVALID_VALUE;
  }
  bool wait = false;
  size_t k = 0;
  for (size_t i = 0; i < count; ++i) {
    while (k + 1 < num_attrs && idxs[k + 1] <= i) ++k;
    if (sizes[i] == 0) continue;
    CUresult rc = CopyUnified(name, dsts[i], srcs[i], sizes[i], s, true, pt);
    if (rc != CUDA_SUCCESS) {
      if (fail_idx != nullptr) *fail_idx = i;
      return rc;
    }
    Client::HostBuffer hb;
    wait = wait || (attrs[k].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
                    !IsDevice(srcs[i], sizes[i]) &&
                    Client::Get().FindHostBuffer(reinterpret_cast<void*>(srcs[i]), &hb));
  }
  if (!wait) return CUDA_SUCCESS;
  return pt ? cuStreamSynchronize_ptsz(s) : cuStreamSynchronize(s);
}
}  // namespace

// The CUDA 13 ABI (cuda.h maps cuMemcpyBatchAsync to _v2) and the CUDA 12.8 one, whose
// failIdx names the copy that failed (SIZE_MAX: none, or the batch's arguments).
FLYT_API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                        size_t count, CUmemcpyAttributes* attrs, size_t* idxs,
                                        size_t num_attrs, CUstream s) {
  return MemcpyBatch("cuMemcpyBatchAsync", dsts, srcs, sizes, count, attrs, idxs, num_attrs,
                     nullptr, s, false);
}
FLYT_API CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                             size_t count, CUmemcpyAttributes* attrs, size_t* idxs,
                                             size_t num_attrs, CUstream s) {
  return MemcpyBatch("cuMemcpyBatchAsync_ptsz", dsts, srcs, sizes, count, attrs, idxs, num_attrs,
                     nullptr, s, true);
}
#undef cuMemcpyBatchAsync
FLYT_API CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                     size_t count, CUmemcpyAttributes* attrs, size_t* idxs,
                                     size_t num_attrs, size_t* fail_idx, CUstream s) {
  return MemcpyBatch("cuMemcpyBatchAsync", dsts, srcs, sizes, count, attrs, idxs, num_attrs,
                     fail_idx, s, false);
}
FLYT_API CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                          size_t count, CUmemcpyAttributes* attrs, size_t* idxs,
                                          size_t num_attrs, size_t* fail_idx, CUstream s) {
  return MemcpyBatch("cuMemcpyBatchAsync_ptsz", dsts, srcs, sizes, count, attrs, idxs, num_attrs,
                     fail_idx, s, true);
}

// --- memsets. On a UVA system every pinned buffer is the GPU's to write natively, and
// libraries do memset one through its host address (XLA's autotuner zeroes a scalar in
// pinned memory it never asked a device pointer for). A destination in pinned memory the
// GPU has no mapping of yet is mapped first, as cuMemHostGetDevicePointer would map it;
// anything else goes to the server's driver as before.
// Also the pointers a kernel is launched with (client/api_code.cc): a buffer the server
// cannot map where it is is not tried again.
void flyt::client::MapPinnedIfUnmapped(const char* name, uint64_t p) {
  Client& c = Client::Get();
  if (!c.MaybeUnmappedPinned(p)) return;
  Client::HostBuffer b;
  if (!c.FindHostBuffer(reinterpret_cast<void*>(p), &b) || b.device_ptr != 0) return;
  static std::mutex mu;
  static auto* refused = new std::set<uintptr_t>;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (refused->count(b.base) != 0) return;
  }
  if (MapExisting(name, &b) == CUDA_ERROR_NOT_SUPPORTED) {
    std::lock_guard<std::mutex> lock(mu);
    refused->insert(b.base);
  }
  // Other failures: the driver's answer to the call says so.
}

#define FLYT_MEMSET(name, op, pt, params, ...)         \
  FLYT_API CUresult name params {                      \
    flyt::client::MapPinnedIfUnmapped(#name, dst);     \
    return Forward<op, false, pt>(#name, __VA_ARGS__); \
  }
#define FLYT_MEMSET_PAIR(name, pt_name, op, params, ...) \
  FLYT_MEMSET(name, op, false, params, __VA_ARGS__)      \
  FLYT_MEMSET(pt_name, op, true, params, __VA_ARGS__)
FLYT_MEMSET_PAIR(cuMemsetD8_v2, cuMemsetD8_v2_ptds, 155,
                 (CUdeviceptr dst, unsigned char v, size_t n), dst, v, n)
FLYT_MEMSET_PAIR(cuMemsetD16_v2, cuMemsetD16_v2_ptds, 156,
                 (CUdeviceptr dst, unsigned short v, size_t n), dst, v, n)
FLYT_MEMSET_PAIR(cuMemsetD32_v2, cuMemsetD32_v2_ptds, 157,
                 (CUdeviceptr dst, unsigned int v, size_t n), dst, v, n)
FLYT_MEMSET_PAIR(cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds, 158,
                 (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h), dst, pitch,
                 v, w, h)
FLYT_MEMSET_PAIR(cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds, 159,
                 (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h), dst, pitch,
                 v, w, h)
FLYT_MEMSET_PAIR(cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds, 160,
                 (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h), dst, pitch, v,
                 w, h)
FLYT_MEMSET_PAIR(cuMemsetD8Async, cuMemsetD8Async_ptsz, 161,
                 (CUdeviceptr dst, unsigned char v, size_t n, CUstream s), dst, v, n, s)
FLYT_MEMSET_PAIR(cuMemsetD16Async, cuMemsetD16Async_ptsz, 162,
                 (CUdeviceptr dst, unsigned short v, size_t n, CUstream s), dst, v, n, s)
FLYT_MEMSET_PAIR(cuMemsetD32Async, cuMemsetD32Async_ptsz, 163,
                 (CUdeviceptr dst, unsigned int v, size_t n, CUstream s), dst, v, n, s)
FLYT_MEMSET_PAIR(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz, 164,
                 (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s),
                 dst, pitch, v, w, h, s)
FLYT_MEMSET_PAIR(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz, 165,
                 (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s),
                 dst, pitch, v, w, h, s)
FLYT_MEMSET_PAIR(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz, 166,
                 (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s),
                 dst, pitch, v, w, h, s)
