// The server's side of managed memory: the session's managed allocations and
// the paging channel through which the client's host view of them is filled
// and written back.
//
// Owns: the table of the session's managed ranges (cuMemAllocManaged, and
// __managed__ variables of loaded libraries, and pinned host memory the GPU
// maps for a client over a socket: kOpHostMap, whose pages are this process's
// own and are always copied by the CPU) and one thread that serves the
// client's pager (ops::kOpManagedFetch / kOpManagedPush). Pages move by DMA
// on a non-blocking stream of the pager's own (it never waits behind the
// session's streams, so a fault inside a host function is served while that
// stream waits), through a pinned buffer; the pages stay where the driver has
// them. Without a context, or when the driver refuses (a sticky error), this
// process's CPU reads and writes the managed memory instead, which the driver
// keeps coherent by migrating pages. A request outside the table, a hostile
// length or a page the driver cannot give gets an error, never a crash.
// Must not: touch the session's handles or streams, or run on the session's
// thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "server/driver_api.h"
#include "transport/transport.h"

namespace flyt::server {

class ManagedPager {
 public:
  ManagedPager() = default;
  ~ManagedPager() {
    Stop();
    Clear();
  }
  ManagedPager(const ManagedPager&) = delete;
  ManagedPager& operator=(const ManagedPager&) = delete;

  // A managed range the driver gave the session; `owner` is the library a
  // __managed__ variable belongs to (0: an allocation).
  // `host`: pinned host memory of this process mapped for the GPU (kOpHostMap).
  void Add(uint64_t base, uint64_t size, uint64_t owner = 0, bool host = false);
  // Before the driver frees `base` (or unloads `owner`'s library): waits for
  // a copy in progress, then forgets it. Unknown values are ignored (false).
  bool Remove(uint64_t base);
  void RemoveOwnedBy(uint64_t owner);
  void Clear();  // a context reset took them all
  bool Contains(uint64_t p, uint64_t n);
  bool Any() {
    std::lock_guard<std::mutex> lock(mu_);
    return !ranges_.empty();
  }

  // Serves the client's paging channel on a thread of its own; a second
  // channel replaces the first. `ctx` (the session's primary context; null
  // if none yet) is made current on that thread for its copies.
  void Attach(std::unique_ptr<transport::Connection> conn, DriverApi* api, CUcontext ctx);
  // Closes the channel and waits for the thread (before the session frees memory).
  void Stop();

 private:
  struct Range {
    uint64_t size = 0;
    uint64_t owner = 0;
    uint8_t* shared = nullptr;  // the client's pages of it (shm://), mapped here
    bool host = false;          // pinned host memory of this process (kOpHostMap)
  };
  // The range that holds all of [p, p+n); *off its offset there.
  Range* FindLocked(uint64_t p, uint64_t n, uint64_t* off);
  static void Unshare(Range& r);
  CUresult ShareLocked(transport::Connection* conn, uint64_t id, uint64_t base, uint64_t size);
  void Serve(transport::Connection* conn, DriverApi* api, CUcontext ctx);
  // The pager thread's DMA path (null stream: none, copy with the CPU).
  struct Dma {
    DriverApi* api = nullptr;
    CUstream stream = nullptr;
    void* pinned = nullptr;  // kPinnedBytes
  };
  // Into `into` when given (pageable: the client's shared pages), else the pinned buffer.
  bool DmaFetch(Dma& d, uint64_t addr, uint32_t len, void* into, const void** out);
  // From `bytes` back to back, or (shared) from each run's place in `r`'s shared pages.
  bool DmaPush(Dma& d, const std::vector<std::pair<uint64_t, uint32_t>>& runs, const uint8_t* bytes,
               const Range* shared, uint64_t base);

  std::mutex mu_;  // the table; held during each copy, so a free waits for it
  std::map<uint64_t, Range> ranges_;
  std::mutex thread_mu_;  // the channel and its thread
  std::unique_ptr<transport::Connection> conn_;
  std::thread thread_;
};

}  // namespace flyt::server
