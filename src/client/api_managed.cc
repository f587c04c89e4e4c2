// Managed memory entry points: allocation, prefetch, advice, range
// attributes, __managed__ variables of libraries. The server allocates real
// managed memory; this process's view of it at the same address is kept by
// client/managed_memory.h. Pointer attributes, copies and frees of managed
// memory are in api_memory.cc. With several servers (FLYT_SERVER "A,B,..."),
// managed memory is allocated by the current device's server; advice,
// prefetches and range attributes go to the server of the memory, with device
// ordinals as that server's (a device of another server is refused, as a
// location the memory's GPU cannot reach).
#include <unistd.h>

#include <algorithm>

#include <vector>

#include "client/client.h"
// cuda.h maps these names to their CUDA 12.2 forms; the CUDA 8 forms (a
// CUdevice, not a CUmemLocation) are exported under them here.
#undef cuMemAdvise
#undef cuMemPrefetchAsync
#undef cuMemPrefetchAsync_ptsz
#include "client/managed_memory.h"
#include "common/log.h"

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::ReplySink;
namespace managed = flyt::client::managed;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace {

// An allocation the server gave lands where this process already has
// something at most this many times before the call gives up.
constexpr int kPlacementAttempts = 8;

// Frees memory server `server` allocated at d. With several servers, d may be
// another server's address too (the reason it was not used): the call goes to
// `server` whatever the pointer says.
void FreeOn(CUdeviceptr d, int server) {
  Client& c = Client::Get();
  if (!c.multi()) {
    Forward<152, false, false>("cuMemFree_v2", d);
    return;
  }
  Client::RouteScope scope(server);
  wire::Writer w;
  flyt::marshal::EncodeArg(w, d);
  c.Post("cuMemFree_v2", 152, w, 0);
}

CUresult AllocManaged(CUdeviceptr* p, size_t n, unsigned flags) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  // Kept until the end, so the next one lands elsewhere; with the server that made each.
  std::vector<std::pair<CUdeviceptr, int>> clashing;
  CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
  for (int attempt = 0; attempt < kPlacementAttempts; ++attempt) {
    CUdeviceptr d = 0;
    rc = Forward<263, true, false>("cuMemAllocManaged", &d, n, flags);
    if (rc != CUDA_SUCCESS) break;
    const int server = c.multi() ? Client::LastRoute() : 0;
    // Another server's driver may have handed out the same addresses: device
    // memory of it this process does not hold host addresses for.
    if (c.multi() && c.OverlapsDeviceRange(d, n)) {
      clashing.emplace_back(d, server);
      rc = CUDA_ERROR_OUT_OF_MEMORY;
      continue;
    }
    rc = managed::Map(d, n, true, 0, server);
    if (rc == CUDA_SUCCESS) {
      c.AddDeviceRange(d, n, false);
      *p = d;
      break;
    }
    clashing.emplace_back(d, server);
  }
  for (auto [d, server] : clashing) FreeOn(d, server);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY && !clashing.empty())
    FLYT_ERROR(
        "cuMemAllocManaged: the GPU's addresses for %zu bytes of managed memory are in use by "
        "this process's own memory (%d tries); allocate it earlier in the program or in "
        "smaller pieces",
        n, kPlacementAttempts);
  return rc;
}

bool IsHostLocation(CUmemLocationType t) {
  return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
         t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

CUmemLocation FromDevice(CUdevice dev) {
  CUmemLocation l{};
  l.type = dev == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
  l.id = dev == CU_DEVICE_CPU ? 0 : dev;
  return l;
}

// With several servers: the server of the managed memory at p (else the one the
// call goes to), and a device location as that server's ordinal. A device of
// another server is refused: its GPU cannot reach the memory.
CUresult LocationOnServer(const char* name, CUdeviceptr p, CUmemLocation* loc) {
  Client& c = Client::Get();
  if (!c.multi() || loc->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_SUCCESS;
  int server = c.ServerOfPointer(p);
  if (server < 0) server = c.RouteNow();  // not device memory: that server's driver refuses it
  if (loc->id >= 0 && loc->id < c.device_count() && c.DeviceServer(loc->id) != server)
    return flyt::client::RefuseAcrossServers(name);
  loc->id = c.DeviceLocal(loc->id);
  return CUDA_SUCCESS;
}

CUresult Advise(const char* name, CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult rc = LocationOnServer(name, p, &loc); rc != CUDA_SUCCESS) return rc;
  return Forward<265, true, false>(name, p, n, advice, loc);
}

CUresult Prefetch(const char* name, CUdeviceptr p, size_t n, CUmemLocation loc, unsigned flags,
                  CUstream s, bool pt) {
  if (!Client::Get().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  // The driver refuses anything but managed memory, at the call.
  if (n == 0 || !managed::Find(p, n, nullptr, nullptr) || managed::IsHost(p))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = LocationOnServer(name, p, &loc); rc != CUDA_SUCCESS) return rc;
  CUresult rc = pt ? Forward<266, false, true>(name, p, n, loc, flags, s)
                   : Forward<266, false, false>(name, p, n, loc, flags, s);
  // To the host: the pages come over in bulk once the stream is known done.
  if (rc == CUDA_SUCCESS && IsHostLocation(loc.type)) managed::NotePrefetchToHost(p, n);
  return rc;
}

CUresult AskRangeAttribute(void* data, size_t size, CUmem_range_attribute attr, CUdeviceptr p,
                           size_t count) {
  wire::Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(attr));
  w.Put<uint64_t>(p);
  w.Put<uint64_t>(count);
  w.Put<uint64_t>(size);
  return Client::Get().Call("cuMemRangeGetAttribute", ops::kOpMemRangeAttribute, w,
                            ReplySink{nullptr, data, size});
}

// A device ordinal the server of `server` answered, as this process numbers it
// (CU_DEVICE_CPU and CU_DEVICE_INVALID stay).
int GlobalOrdinal(int server, int local) {
  if (local < 0) return local;
  int g = Client::Get().GlobalDevice(server, local);
  return g < 0 ? CU_DEVICE_INVALID : g;
}

CUresult RangeAttribute(void* data, size_t size, CUmem_range_attribute attr, CUdeviceptr p,
                        size_t count) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (data == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  // Several servers: the memory's server answers, in its own ordinals.
  const int server = c.multi() ? managed::ServerOf(p) : 0;
  Client::RouteScope scope(c.multi() ? std::max(server, 0) : -1);
  CUresult rc = AskRangeAttribute(data, size, attr, p, count);
  if (rc != CUDA_SUCCESS || server <= 0 || size % sizeof(int) != 0) return rc;
  auto* v = static_cast<int*>(data);
  switch (attr) {
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION:
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
    case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY:  // one per device, CU_DEVICE_INVALID after
      for (size_t i = 0; i < size / sizeof(int); ++i) v[i] = GlobalOrdinal(server, v[i]);
      break;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID:
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID: {
      // An ordinal only when the location is a device: its type says.
      int type = 0;
      rc = AskRangeAttribute(&type, sizeof(type),
                             attr == CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID
                                 ? CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE
                                 : CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE,
                             p, count);
      if (rc == CUDA_SUCCESS && type == CU_MEM_LOCATION_TYPE_DEVICE)
        v[0] = GlobalOrdinal(server, v[0]);
      break;
    }
    default:
      break;
  }
  return rc;
}

}  // namespace

FLYT_API CUresult cuMemAllocManaged(CUdeviceptr* p, size_t n, unsigned int flags) {
  return AllocManaged(p, n, flags);
}

FLYT_API CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc,
                                        unsigned int flags, CUstream s) {
  return Prefetch("cuMemPrefetchAsync_v2", p, n, loc, flags, s, false);
}
FLYT_API CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t n, CUmemLocation loc,
                                             unsigned int flags, CUstream s) {
  return Prefetch("cuMemPrefetchAsync_v2_ptsz", p, n, loc, flags, s, true);
}
// The CUdevice forms (CUDA 8 ABI): CU_DEVICE_CPU names the host.
FLYT_API CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice dev, CUstream s) {
  return Prefetch("cuMemPrefetchAsync", p, n, FromDevice(dev), 0, s, false);
}
FLYT_API CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t n, CUdevice dev, CUstream s) {
  return Prefetch("cuMemPrefetchAsync_ptsz", p, n, FromDevice(dev), 0, s, true);
}
FLYT_API CUresult cuMemAdvise(CUdeviceptr p, size_t n, CUmem_advise advice, CUdevice dev) {
  return Advise("cuMemAdvise", p, n, advice, FromDevice(dev));
}
FLYT_API CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc) {
  return Advise("cuMemAdvise_v2", p, n, advice, loc);
}

FLYT_API CUresult cuMemRangeGetAttribute(void* data, size_t size, CUmem_range_attribute attr,
                                         CUdeviceptr p, size_t count) {
  return RangeAttribute(data, size, attr, p, count);
}

FLYT_API CUresult cuMemRangeGetAttributes(void** data, size_t* sizes, CUmem_range_attribute* attrs,
                                          size_t n, CUdeviceptr p, size_t count) {
  if (data == nullptr || sizes == nullptr || attrs == nullptr || n == 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; ++i) {
    CUresult rc = RangeAttribute(data[i], sizes[i], attrs[i], p, count);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

namespace flyt::client {

CUresult MapManagedGlobal(CUdeviceptr p, uint64_t image) {
  // The host view of the variable's block (the server's pager knows the same
  // pages). Not fresh: the driver wrote the variables' initial values. With
  // several servers, the server that answered for the variable holds it.
  Client& c = Client::Get();
  const int server = c.multi() ? Client::LastRoute() : 0;
  Client::RouteScope scope(c.multi() ? server : -1);
  CUdeviceptr block = 0;
  size_t block_size = 0;
  CUresult rc = Forward<154, true, false>("cuMemGetAddressRange_v2", &block, &block_size, p);
  // A module's variables may share pages: the pages of this one that no
  // earlier variable brought in are mapped, in runs.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t first = block & ~(page - 1), end = (block + block_size + page - 1) & ~(page - 1);
  for (uint64_t at = first; rc == CUDA_SUCCESS && at < end;) {
    if (managed::Find(at, 1, nullptr, nullptr)) {
      // Another server's range there: its variable of the same library, most
      // likely, at the same address in that server's process.
      if (managed::ServerOf(at) != server) rc = CUDA_ERROR_INVALID_VALUE;
      at += page;
      continue;
    }
    uint64_t run_end = at + page;
    while (run_end < end && !managed::Find(run_end, 1, nullptr, nullptr)) run_end += page;
    rc = managed::Map(at, run_end - at, false, image, server);
    at = run_end;
  }
  if (rc != CUDA_SUCCESS) {
    FLYT_ERROR(
        "a __managed__ variable at 0x%llx: its address is in use by this process's own "
        "memory%s; its host side cannot be mapped",
        static_cast<unsigned long long>(p),
        c.multi() ? " or by another server's copy of it (a library's __managed__ variables are "
                    "served on one server of FLYT_SERVER only)"
                  : "");
    return rc;
  }
  c.AddDeviceRange(block, block_size, false);
  return CUDA_SUCCESS;
}

}  // namespace flyt::client

// A library's __managed__ variable: the runtime hands the address to host code.
FLYT_API CUresult cuLibraryGetManaged(CUdeviceptr* p, size_t* bytes, CUlibrary lib,
                                      const char* name) {
  CUdeviceptr d = 0;
  size_t size = 0;
  CUresult rc = Forward<203, true, false>("cuLibraryGetManaged", &d, &size, lib, name);
  if (rc != CUDA_SUCCESS) return rc;
  if (Client::LastReplyInfo() & wire::kReplyManaged) {
    rc = flyt::client::MapManagedGlobal(d, reinterpret_cast<uintptr_t>(lib));
    if (rc != CUDA_SUCCESS) return rc;
  }
  if (p != nullptr) *p = d;
  if (bytes != nullptr) *bytes = size;
  return CUDA_SUCCESS;
}
