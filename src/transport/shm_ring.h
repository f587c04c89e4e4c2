// A lock-free single-producer/single-consumer byte ring in shared memory.
//
// Owns: the ring's layout inside caller-provided memory (a 256-byte header,
// then a power-of-two data area), length-prefixed records streamed through it
// (a record may be far larger than the ring), and the waiting protocol (busy
// poll, then futex sleep on sequence words in the header, woken only when the
// peer says it sleeps). Treats the header as hostile: every index the peer
// writes is validated before use; a bad one is the error "peer corrupted the
// ring", never an out-of-bounds access.
// Must not touch: the memory's lifetime (see shm_segment.h), frames or CUDA.
// One ring carries bytes in one direction; a connection uses two. Layout and
// protocol: docs/shared_memory.md.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"

namespace flyt::transport {

struct ShmRingOptions {
  // Busy-poll this long before sleeping on the futex.
  int spin_us = 20;
  // Longest single futex sleep; the waiter then re-checks the ring. Bounds the
  // latency when the peer cannot wake us (a peer in another VM: futexes do not
  // cross kernels), so lower it (e.g. 200) for rings in an ivshmem BAR.
  int max_sleep_us = 100000;
  // Sleep on futexes. Without them (or where the kernel refuses a futex on
  // this memory, e.g. a PCI BAR mapped from sysfs: EFAULT, noticed at the
  // first use) a waiter sleeps max_sleep_us at a time and re-polls.
  bool use_futex = true;
  // A record header announcing more than this is treated as corruption.
  uint64_t max_message_bytes = uint64_t{1} << 30;
  // Each side publishes its index after at most this many bytes, so that a
  // large record is copied in by the producer and out by the consumer at the
  // same time instead of in turns of a whole ring.
  size_t publish_bytes = size_t{256} << 10;
};

class ShmRing {
 public:
  static constexpr uint32_t kMagic = 0x52594c46;  // "FLYR" in little-endian memory
  static constexpr uint32_t kVersion = 1;
  static constexpr size_t kHeaderBytes = 256;
  static constexpr size_t kMinCapacity = 64;
  static constexpr size_t kRecordHeaderBytes = 8;  // little-endian uint64 length
  // Bytes of memory a ring of `capacity` data bytes needs.
  static constexpr size_t BytesFor(size_t capacity) { return kHeaderBytes + capacity; }

  // Formats a new, empty ring at `mem` (64-byte aligned, at least
  // BytesFor(capacity) bytes); `capacity` is a power of two >= kMinCapacity.
  static Status Create(void* mem, size_t mem_bytes, size_t capacity, const ShmRingOptions& options,
                       std::unique_ptr<ShmRing>* out);
  // Attaches to a ring another process (or thread) created; validates magic,
  // version, capacity and the indices. Attach before traffic starts.
  static Status Attach(void* mem, size_t mem_bytes, const ShmRingOptions& options,
                       std::unique_ptr<ShmRing>* out);

  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;
  ~ShmRing() = default;

  // --- producer side (one thread at a time)
  // Writes one record holding the vector's bytes; blocks while the ring is
  // full. `timeout_ms` bounds each wait without progress by the consumer
  // (0 = wait forever). A failure after part of the record was published
  // closes the ring (the stream can no longer be parsed).
  Status Write(const iovec* iov, int count, int timeout_ms);
  Status Write(const void* data, size_t n, int timeout_ms);

  // --- consumer side (one thread at a time)
  // Waits for the next record and returns its length; its bytes then come
  // through ReadBody (all of them before the next BeginRead).
  Status BeginRead(uint64_t* length, int timeout_ms);
  // Copies the next `n` bytes of the current record (n <= what is left).
  // A failure here closes the ring.
  Status ReadBody(void* dst, size_t n, int timeout_ms);
  // BeginRead + ReadBody into `out`.
  Status Read(std::vector<uint8_t>* out, int timeout_ms);
  // The consumer hands back the space of what it read lazily: before it waits, once
  // min(publish_bytes, capacity / 4) bytes are due, or here. Call it before another
  // process attaches to continue this side (the tail in shared memory is where it starts).
  Status PublishConsumed();

  // Marks the ring closed in the shared header and wakes both sides: later
  // writes fail, and a reader fails once it has drained what is there. Safe
  // from any thread, and either process.
  Status Close();
  bool closed() const;

  size_t capacity() const { return capacity_; }
  // How long a wait busy-polls before it sleeps (ShmRingOptions::spin_us), from now on.
  // Call it from the thread that uses this side (it is not synchronised with a wait).
  void SetSpinUs(int spin_us) { options_.spin_us = spin_us < 0 ? 0 : spin_us; }
  // Futex sleeps this object has taken (for tests and metrics).
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }

 private:
  ShmRing(uint8_t* mem, uint64_t capacity, const ShmRingOptions& options);
  enum class Check { kReady, kNotReady, kError };
  template <typename Ready>
  Status Wait(uint32_t* seq_word, uint32_t* waiting_flag, int timeout_ms, const char* what,
              Ready ready);
  // The producer's and the consumer's state are separate: each side is used by
  // one thread, and the two may be different threads of one process.
  struct Side {
    bool broken = false;
    Status error;  // the first fatal error; repeated by every later call
  };
  Status Fail(Side* side, Status status);  // closes the ring, remembers status
  Check LoadHead(uint64_t* available, Status* error);
  Check LoadTail(uint64_t* free_bytes, Status* error);
  Status PublishHead();
  Status PublishTail();
  bool TailDue() const;  // enough consumed bytes are unpublished to publish them now
  Status Wake(uint32_t* seq_word, uint32_t* waiting_flag);
  Status FutexWake(uint32_t* word);
  // One sleep of at most `how_long` while *word == seen (futex, or a plain
  // sleep where futexes are unusable).
  Status Sleep(uint32_t* word, uint32_t seen, std::chrono::microseconds how_long);
  // Maps the data pages ahead of `pos` into this process during the first lap
  // (madvise MADV_POPULATE_*), so that no page fault lands inside a call.
  struct PrefaultState {
    uint64_t to = 0;    // stream position up to which pages were asked for
    uint64_t left = 0;  // bytes of the first lap not asked for yet; 0: done or refused
  };
  void Prefault(PrefaultState* state, uint64_t pos, bool write);
  void CopyIn(uint64_t pos, const uint8_t* src, size_t n);
  void CopyOut(uint64_t pos, uint8_t* dst, size_t n);

  uint8_t* mem_;
  uint8_t* data_;
  uint64_t capacity_;  // local copy: never re-read from the shared header
  uint64_t mask_;
  ShmRingOptions options_;
  // Producer state: the head this side published; the last tail it saw.
  Side producer_;
  uint64_t head_ = 0;
  uint64_t seen_tail_ = 0;
  PrefaultState producer_faults_;
  // Consumer state: bytes consumed, the tail last published, the last head
  // seen, and what is left of the current record.
  Side consumer_;
  uint64_t tail_ = 0;
  uint64_t published_tail_ = 0;
  uint64_t seen_head_ = 0;
  uint64_t remaining_ = 0;
  bool in_record_ = false;
  PrefaultState consumer_faults_;
  std::atomic<uint64_t> sleeps_{0};
  std::atomic<bool> futex_ok_{true};
};

}  // namespace flyt::transport
