// The server's side of managed memory: the session's managed allocations and
// the paging channel through which the client's host view of them is filled
// and written back.
//
// Owns: the table of the session's managed ranges (cuMemAllocManaged, and
// __managed__ variables of loaded libraries) and one thread that serves the
// client's pager (ops::kOpManagedFetch / kOpManagedPush). Pages are read and
// written by this process's CPU: the memory is real managed memory, so the
// driver migrates what the GPU holds and keeps it coherent, without a CUDA
// call (which could wait behind the session's streams, or be refused inside a
// host function). A request outside the table, a hostile length or a page
// the driver cannot give gets an error, never a crash.
// Must not: call the driver, touch the session's handles, or run on the
// session's thread (a page fault in a host function must be served while
// that thread waits for the stream).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "transport/transport.h"

namespace flyt::server {

class ManagedPager {
 public:
  ManagedPager() = default;
  ~ManagedPager() { Stop(); }
  ManagedPager(const ManagedPager&) = delete;
  ManagedPager& operator=(const ManagedPager&) = delete;

  // A managed range the driver gave the session; `owner` is the library a
  // __managed__ variable belongs to (0: an allocation).
  void Add(uint64_t base, uint64_t size, uint64_t owner = 0);
  // Before the driver frees `base` (or unloads `owner`'s library): waits for
  // a copy in progress, then forgets it. Unknown values are ignored.
  void Remove(uint64_t base);
  void RemoveOwnedBy(uint64_t owner);
  void Clear();  // a context reset took them all
  bool Contains(uint64_t p, uint64_t n);

  // Serves the client's paging channel on a thread of its own; a second
  // channel replaces the first.
  void Attach(std::unique_ptr<transport::Connection> conn);
  // Closes the channel and waits for the thread (before the session frees memory).
  void Stop();

 private:
  struct Range {
    uint64_t size = 0;
    uint64_t owner = 0;
  };
  void Serve(transport::Connection* conn);
  bool ContainsLocked(uint64_t p, uint64_t n) const;

  std::mutex mu_;  // the table; held during each copy, so a free waits for it
  std::map<uint64_t, Range> ranges_;
  std::mutex thread_mu_;  // the channel and its thread
  std::unique_ptr<transport::Connection> conn_;
  std::thread thread_;
};

}  // namespace flyt::server
