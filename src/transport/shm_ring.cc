// The shared-memory SPSC ring: layout, records, waiting, validation.
// See shm_ring.h and docs/shared_memory.md.
#include "transport/shm_ring.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>

namespace flyt::transport {
namespace {

// Header offsets (docs/shared_memory.md). Line 0 is read-mostly; line 1 is
// written by the producer only, line 2 by the consumer only.
constexpr size_t kMagicOff = 0;
constexpr size_t kVersionOff = 4;
constexpr size_t kCapacityOff = 8;
constexpr size_t kHeaderBytesOff = 16;
constexpr size_t kClosedOff = 20;
constexpr size_t kReaderWaitingOff = 24;
constexpr size_t kWriterWaitingOff = 28;
constexpr size_t kHeadOff = 64;
constexpr size_t kHeadSeqOff = 72;
constexpr size_t kTailOff = 128;
constexpr size_t kTailSeqOff = 136;
static_assert(kTailOff - kHeadOff >= 64, "head and tail share a cache line");
static_assert(kTailSeqOff + 4 <= ShmRing::kHeaderBytes);
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

uint32_t* U32(uint8_t* mem, size_t off) { return reinterpret_cast<uint32_t*>(mem + off); }
uint64_t* U64(uint8_t* mem, size_t off) { return reinterpret_cast<uint64_t*>(mem + off); }
std::atomic_ref<uint32_t> A32(uint8_t* mem, size_t off) {
  return std::atomic_ref<uint32_t>(*U32(mem, off));
}
std::atomic_ref<uint64_t> A64(uint8_t* mem, size_t off) {
  return std::atomic_ref<uint64_t>(*U64(mem, off));
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

Status Corrupt(const std::string& what) {
  return Status::Error("shm ring: peer corrupted the ring (" + what + ")");
}

long Futex(uint32_t* word, int op, uint32_t val, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word lives in memory shared between processes.
  return syscall(SYS_futex, word, op, val, timeout, nullptr, 0);
}

Status CheckMemory(void* mem, size_t mem_bytes) {
  if (mem == nullptr) return Status::Error("shm ring: no memory given");
  if (reinterpret_cast<uintptr_t>(mem) % 64 != 0) {
    return Status::Error("shm ring: memory must be 64-byte aligned");
  }
  if (mem_bytes < ShmRing::kHeaderBytes + ShmRing::kMinCapacity) {
    return Status::Error("shm ring: " + std::to_string(mem_bytes) +
                         " bytes of memory is too small for a ring (needs at least " +
                         std::to_string(ShmRing::kHeaderBytes + ShmRing::kMinCapacity) + ")");
  }
  return Status::Ok();
}

}  // namespace

ShmRing::ShmRing(uint8_t* mem, uint64_t capacity, const ShmRingOptions& options)
    : mem_(mem),
      data_(mem + kHeaderBytes),
      capacity_(capacity),
      mask_(capacity - 1),
      options_(options) {
  futex_ok_.store(options.use_futex, std::memory_order_relaxed);
  producer_faults_.left = consumer_faults_.left = capacity;            // one lap
  if (options_.publish_bytes == 0) options_.publish_bytes = SIZE_MAX;  // 0: whole steps
}

Status ShmRing::Create(void* mem, size_t mem_bytes, size_t capacity, const ShmRingOptions& options,
                       std::unique_ptr<ShmRing>* out) {
  Status st = CheckMemory(mem, mem_bytes);
  if (!st.ok()) return st;
  if (!IsPowerOfTwo(capacity) || capacity < kMinCapacity) {
    return Status::Error("shm ring: capacity " + std::to_string(capacity) +
                         " must be a power of two of at least " + std::to_string(kMinCapacity));
  }
  if (capacity > mem_bytes - kHeaderBytes) {
    return Status::Error("shm ring: a ring of " + std::to_string(capacity) + " bytes needs " +
                         std::to_string(BytesFor(capacity)) + " bytes of memory, got " +
                         std::to_string(mem_bytes));
  }
  auto* m = static_cast<uint8_t*>(mem);
  std::memset(m, 0, kHeaderBytes);
  A32(m, kVersionOff).store(kVersion, std::memory_order_relaxed);
  A64(m, kCapacityOff).store(capacity, std::memory_order_relaxed);
  A32(m, kHeaderBytesOff).store(kHeaderBytes, std::memory_order_relaxed);
  A32(m, kMagicOff).store(kMagic, std::memory_order_release);  // last: the ring is ready
  out->reset(new ShmRing(m, capacity, options));
  return Status::Ok();
}

Status ShmRing::Attach(void* mem, size_t mem_bytes, const ShmRingOptions& options,
                       std::unique_ptr<ShmRing>* out) {
  Status st = CheckMemory(mem, mem_bytes);
  if (!st.ok()) return st;
  auto* m = static_cast<uint8_t*>(mem);
  const uint32_t magic = A32(m, kMagicOff).load(std::memory_order_acquire);
  if (magic != kMagic) {
    return Status::Error("shm ring: no ring in this memory (bad magic; was it created?)");
  }
  const uint32_t version = A32(m, kVersionOff).load(std::memory_order_relaxed);
  if (version != kVersion) {
    return Status::Error("shm ring: ring version " + std::to_string(version) +
                         ", this build speaks " + std::to_string(kVersion));
  }
  const uint32_t header_bytes = A32(m, kHeaderBytesOff).load(std::memory_order_relaxed);
  if (header_bytes != kHeaderBytes) {
    return Status::Error("shm ring: header size " + std::to_string(header_bytes) + ", expected " +
                         std::to_string(kHeaderBytes));
  }
  const uint64_t capacity = A64(m, kCapacityOff).load(std::memory_order_relaxed);
  if (!IsPowerOfTwo(capacity) || capacity < kMinCapacity || capacity > mem_bytes - kHeaderBytes) {
    return Status::Error("shm ring: capacity field " + std::to_string(capacity) +
                         " is not a power of two that fits the " + std::to_string(mem_bytes) +
                         " bytes of memory");
  }
  const uint64_t head = A64(m, kHeadOff).load(std::memory_order_acquire);
  const uint64_t tail = A64(m, kTailOff).load(std::memory_order_acquire);
  if (head - tail > capacity) {
    return Corrupt("head " + std::to_string(head) + " and tail " + std::to_string(tail) +
                   " are more than the capacity " + std::to_string(capacity) + " apart");
  }
  std::unique_ptr<ShmRing> ring(new ShmRing(m, capacity, options));
  ring->head_ = ring->seen_head_ = head;
  ring->tail_ = ring->published_tail_ = ring->seen_tail_ = tail;
  ring->producer_faults_.to = head;
  ring->consumer_faults_.to = tail;
  *out = std::move(ring);
  return Status::Ok();
}

bool ShmRing::closed() const { return A32(mem_, kClosedOff).load(std::memory_order_acquire) != 0; }

Status ShmRing::Close() {
  A32(mem_, kClosedOff).store(1, std::memory_order_seq_cst);
  Status result;
  for (size_t off : {kHeadSeqOff, kTailSeqOff}) {
    A32(mem_, off).fetch_add(1, std::memory_order_seq_cst);
    Status st = FutexWake(U32(mem_, off));
    if (!st.ok()) result = st;
  }
  return result;
}

Status ShmRing::FutexWake(uint32_t* word) {
  if (!futex_ok_.load(std::memory_order_relaxed)) return Status::Ok();
  if (Futex(word, FUTEX_WAKE, INT_MAX, nullptr) < 0) {
    if (errno == EFAULT || errno == ENOSYS) {
      futex_ok_.store(false, std::memory_order_relaxed);  // the waiter polls instead
      return Status::Ok();
    }
    return Status::Error(Errno("shm ring: futex wake"));
  }
  return Status::Ok();
}

Status ShmRing::Sleep(uint32_t* word, uint32_t seen, std::chrono::microseconds how_long) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(how_long.count() / 1000000);
  ts.tv_nsec = static_cast<long>(how_long.count() % 1000000) * 1000;
  sleeps_.fetch_add(1, std::memory_order_relaxed);
  if (futex_ok_.load(std::memory_order_relaxed)) {
    if (Futex(word, FUTEX_WAIT, seen, &ts) == 0 || errno == EAGAIN || errno == EINTR ||
        errno == ETIMEDOUT) {
      return Status::Ok();
    }
    if (errno != EFAULT && errno != ENOSYS) return Status::Error(Errno("shm ring: futex wait"));
    futex_ok_.store(false, std::memory_order_relaxed);  // e.g. a sysfs-mapped BAR
  }
  const int rc = clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, nullptr);
  if (rc != 0 && rc != EINTR) {
    return Status::Error(std::string("shm ring: clock_nanosleep: ") + std::strerror(rc));
  }
  return Status::Ok();
}

Status ShmRing::Fail(Side* side, Status status) {
  if (!side->broken) {
    side->broken = true;
    side->error = std::move(status);
  }
  Close();  // the peer must stop too; a failed wake changes nothing here
  return side->error;
}

ShmRing::Check ShmRing::LoadTail(uint64_t* free_bytes, Status* error) {
  const uint64_t tail = A64(mem_, kTailOff).load(std::memory_order_acquire);
  // The tail must lie in [seen_tail_, head_] (modulo 2^64) and so within
  // capacity of the head.
  if (tail - seen_tail_ > head_ - seen_tail_ || head_ - tail > capacity_) {
    *error = Fail(&producer_, Corrupt("tail " + std::to_string(tail) + " is outside [" +
                                      std::to_string(seen_tail_) + ", " + std::to_string(head_) +
                                      "], capacity " + std::to_string(capacity_)));
    return Check::kError;
  }
  seen_tail_ = tail;
  *free_bytes = capacity_ - (head_ - tail);
  return *free_bytes > 0 ? Check::kReady : Check::kNotReady;
}

ShmRing::Check ShmRing::LoadHead(uint64_t* available, Status* error) {
  const uint64_t head = A64(mem_, kHeadOff).load(std::memory_order_acquire);
  // The head must lie in [seen_head_, tail_ + capacity_] (modulo 2^64).
  if (head - tail_ > capacity_ || head - tail_ < seen_head_ - tail_) {
    *error = Fail(&consumer_, Corrupt("head " + std::to_string(head) + " is outside [" +
                                      std::to_string(seen_head_) + ", " + std::to_string(tail_) +
                                      " + capacity " + std::to_string(capacity_) + "]"));
    return Check::kError;
  }
  seen_head_ = head;
  *available = head - tail_;
  return *available > 0 ? Check::kReady : Check::kNotReady;
}

Status ShmRing::Wake(uint32_t* seq_word, uint32_t* waiting_flag) {
  // The index was stored seq_cst: either the waiter's re-check (after it set the flag and
  // read the sequence word) sees it, or this load sees the flag. Only then does the word
  // change and a wake go out; a waiter that read the word before the change finds it
  // changed at FUTEX_WAIT, or is woken.
  if (std::atomic_ref<uint32_t>(*waiting_flag).load(std::memory_order_seq_cst) != 0) {
    std::atomic_ref<uint32_t>(*seq_word).fetch_add(1, std::memory_order_seq_cst);
    return FutexWake(seq_word);
  }
  return Status::Ok();
}

Status ShmRing::PublishHead() {
  A64(mem_, kHeadOff).store(head_, std::memory_order_seq_cst);
  return Wake(U32(mem_, kHeadSeqOff), U32(mem_, kReaderWaitingOff));
}

Status ShmRing::PublishTail() {
  A64(mem_, kTailOff).store(tail_, std::memory_order_seq_cst);
  published_tail_ = tail_;
  return Wake(U32(mem_, kTailSeqOff), U32(mem_, kWriterWaitingOff));
}

Status ShmRing::PublishConsumed() {
  if (consumer_.broken) return consumer_.error;
  if (published_tail_ == tail_) return Status::Ok();
  Status st = PublishTail();
  return st.ok() ? st : Fail(&consumer_, st);
}

bool ShmRing::TailDue() const {
  return tail_ - published_tail_ >= std::min<uint64_t>(options_.publish_bytes, capacity_ / 4);
}

template <typename Ready>
Status ShmRing::Wait(uint32_t* seq_word, uint32_t* waiting_flag, int timeout_ms, const char* what,
                     Ready ready) {
  using Clock = std::chrono::steady_clock;
  Status error;
  // Most waits are over at once (the peer is ahead): no clock read for them.
  if (const Check c = ready(&error); c != Check::kNotReady) {
    return c == Check::kReady ? Status::Ok() : error;
  }
  const auto start = Clock::now();
  const auto spin_end = start + std::chrono::microseconds(std::max(0, options_.spin_us));
  const bool forever = timeout_ms <= 0;
  const auto deadline = start + std::chrono::milliseconds(std::max(0, timeout_ms));
  // Phase 1: busy-poll. The peer's index is checked at every turn; `closed` and the clock
  // every 16th (a clock read costs as much as several checks, and it would delay noticing
  // the peer's update).
  for (uint32_t turn = 0;; ++turn) {
    const Check c = ready(&error);
    if (c == Check::kReady) return Status::Ok();
    if (c == Check::kError) return error;
    if ((turn & 15) == 0) {
      if (closed()) return Status::Error(std::string("shm ring: closed while waiting for ") + what);
      if (turn > 0 && Clock::now() >= spin_end) break;
    }
    CpuRelax();
  }
  // Phase 2: sleep. The flag is set before the sequence word is read and the
  // ring re-checked; the peer bumps the word after publishing and then reads
  // the flag (all seq_cst), so either we see its update or it sees our flag,
  // and a wake between our check and FUTEX_WAIT makes the wait return at once.
  std::atomic_ref<uint32_t> flag(*waiting_flag);
  std::atomic_ref<uint32_t> seq(*seq_word);
  flag.store(1, std::memory_order_seq_cst);
  Status result;
  for (;;) {
    const uint32_t seen = seq.load(std::memory_order_seq_cst);
    const Check c = ready(&error);
    if (c == Check::kReady) break;
    if (c == Check::kError) {
      result = error;
      break;
    }
    if (closed()) {
      result = Status::Error(std::string("shm ring: closed while waiting for ") + what);
      break;
    }
    auto sleep = std::chrono::microseconds(std::max(1, options_.max_sleep_us));
    if (!forever) {
      const auto now = Clock::now();
      if (now >= deadline) {
        result = Status::Error("shm ring: timed out after " + std::to_string(timeout_ms) +
                               " ms waiting for " + what + " (is the peer alive?)");
        break;
      }
      sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::microseconds>(
                                  deadline - now + std::chrono::microseconds(1)));
    }
    result = Sleep(seq_word, seen, sleep);
    if (!result.ok()) break;
  }
  flag.store(0, std::memory_order_seq_cst);
  return result;
}

void ShmRing::Prefault(PrefaultState* state, uint64_t pos, bool write) {
  // Pages of the data area are faulted into this process once, the first time the stream
  // reaches them; a fault (about a microsecond) inside a small call's round trip shows as
  // its tail latency. So during the first lap each side maps the next kPrefaultBytes
  // ahead of its index in one madvise. Where that is refused (kernels before 5.14, memory
  // that is not ordinary pages, e.g. a PCI BAR) pages fault in on first use as before.
  constexpr uint64_t kPrefaultBytes = uint64_t{256} << 10;
  const uint64_t ahead = state->to - pos;  // modulo 2^64, as the indices
  const bool behind = ahead >= (uint64_t{1} << 63);
  if (state->left == 0 || (!behind && ahead > kPrefaultBytes / 2)) return;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t from = behind ? pos : state->to;
  uint64_t len = std::min(kPrefaultBytes, state->left);
  state->to = from + len;
  state->left -= len;
  while (len > 0) {
    const uint64_t off = from & mask_;
    const uint64_t n = std::min<uint64_t>(len, capacity_ - off);
    // Whole pages inside the data area only.
    const auto begin = reinterpret_cast<uintptr_t>(data_ + off);
    const uintptr_t first = (begin + page - 1) / page * page;
    const uintptr_t last = (begin + n) / page * page;
    if (last > first && madvise(reinterpret_cast<void*>(first), last - first,
                                write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0) {
      state->left = 0;  // refused here: leave it to the page faults
      return;
    }
    from += n;
    len -= n;
  }
}

void ShmRing::CopyIn(uint64_t pos, const uint8_t* src, size_t n) {
  const uint64_t off = pos & mask_;
  const size_t first = static_cast<size_t>(std::min<uint64_t>(n, capacity_ - off));
  std::memcpy(data_ + off, src, first);
  if (n > first) std::memcpy(data_, src + first, n - first);
}

void ShmRing::CopyOut(uint64_t pos, uint8_t* dst, size_t n) {
  const uint64_t off = pos & mask_;
  const size_t first = static_cast<size_t>(std::min<uint64_t>(n, capacity_ - off));
  std::memcpy(dst, data_ + off, first);
  if (n > first) std::memcpy(dst + first, data_, n - first);
}

Status ShmRing::Write(const void* data, size_t n, int timeout_ms) {
  iovec iov{const_cast<void*>(data), n};
  return Write(&iov, 1, timeout_ms);
}

Status ShmRing::Write(const iovec* iov, int count, int timeout_ms) {
  if (producer_.broken) return producer_.error;
  if (count < 0 || (count > 0 && iov == nullptr)) {
    return Status::Error("shm ring: bad iovec");
  }
  uint64_t total = 0;
  for (int i = 0; i < count; ++i) {
    if (iov[i].iov_len > 0 && iov[i].iov_base == nullptr) {
      return Status::Error("shm ring: bad iovec");
    }
    total += iov[i].iov_len;
  }
  if (total > options_.max_message_bytes) {
    return Status::Error("shm ring: message of " + std::to_string(total) +
                         " bytes exceeds the limit of " +
                         std::to_string(options_.max_message_bytes));
  }
  uint8_t header[kRecordHeaderBytes];
  for (size_t i = 0; i < kRecordHeaderBytes; ++i)
    header[i] = static_cast<uint8_t>(total >> (8 * i));
  if (producer_faults_.left != 0) Prefault(&producer_faults_, head_, true);

  // A cursor over the header, then the vector.
  int index = -1;
  size_t offset = 0;
  uint64_t left = kRecordHeaderBytes + total;
  bool started = false;
  while (left > 0) {
    if (closed()) {
      Status st = Status::Error("shm ring: closed");
      return started ? Fail(&producer_, st) : st;
    }
    // The space the last tail seen leaves is still free: while it holds this step, the
    // consumer's tail (a cache line it writes) is not read at all.
    uint64_t free_bytes = capacity_ - (head_ - seen_tail_);
    const uint64_t step = std::min<uint64_t>(left, options_.publish_bytes);
    if (free_bytes < step) {
      Status st = Wait(U32(mem_, kTailSeqOff), U32(mem_, kWriterWaitingOff), timeout_ms, "space",
                       [&](Status* e) { return LoadTail(&free_bytes, e); });
      if (!st.ok()) return (started || producer_.broken) ? Fail(&producer_, st) : st;
    }
    uint64_t chunk = std::min<uint64_t>(free_bytes, step);
    left -= chunk;
    while (chunk > 0) {
      const uint8_t* src;
      size_t avail;
      if (index < 0) {
        src = header + offset;
        avail = kRecordHeaderBytes - offset;
      } else {
        src = static_cast<const uint8_t*>(iov[index].iov_base) + offset;
        avail = iov[index].iov_len - offset;
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(avail, chunk));
      CopyIn(head_, src, n);
      head_ += n;
      chunk -= n;
      offset += n;
      if (offset == (index < 0 ? kRecordHeaderBytes : iov[index].iov_len)) {
        ++index;
        offset = 0;
      }
    }
    Status st = PublishHead();
    started = true;
    if (!st.ok()) return Fail(&producer_, st);
  }
  return Status::Ok();
}

Status ShmRing::BeginRead(uint64_t* length, int timeout_ms) {
  if (consumer_.broken) return consumer_.error;
  if (in_record_) {
    return Status::Error("shm ring: BeginRead before the previous record was fully read");
  }
  // What the last records took goes back to the producer now, before this side may wait
  // (the producer may be waiting for that space).
  if (published_tail_ != tail_) {
    Status st = PublishTail();
    if (!st.ok()) return Fail(&consumer_, st);
  }
  uint64_t available = 0;
  Status st = Wait(U32(mem_, kHeadSeqOff), U32(mem_, kReaderWaitingOff), timeout_ms, "a message",
                   [&](Status* e) {
                     Check c = LoadHead(&available, e);
                     if (c == Check::kReady && available < kRecordHeaderBytes) {
                       return Check::kNotReady;
                     }
                     return c;
                   });
  if (!st.ok()) return consumer_.broken ? consumer_.error : st;
  if (consumer_faults_.left != 0) Prefault(&consumer_faults_, tail_, false);
  uint8_t header[kRecordHeaderBytes];
  CopyOut(tail_, header, kRecordHeaderBytes);
  tail_ += kRecordHeaderBytes;
  uint64_t len = 0;
  for (size_t i = 0; i < kRecordHeaderBytes; ++i) len |= uint64_t{header[i]} << (8 * i);
  if (len > options_.max_message_bytes) {
    return Fail(&consumer_,
                Corrupt("record length " + std::to_string(len) + " exceeds the limit of " +
                        std::to_string(options_.max_message_bytes)));
  }
  remaining_ = len;
  in_record_ = len > 0;
  *length = len;
  return Status::Ok();
}

Status ShmRing::ReadBody(void* dst, size_t n, int timeout_ms) {
  if (consumer_.broken) return consumer_.error;
  if (n > remaining_) {
    return Status::Error("shm ring: reading " + std::to_string(n) + " bytes but only " +
                         std::to_string(remaining_) + " are left in the record");
  }
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    uint64_t available = 0;
    Status st;
    if (seen_head_ != tail_) {
      available = seen_head_ - tail_;  // published before: no need to look again
    } else {
      // The producer may be waiting for the space this side took: give it back first.
      if (published_tail_ != tail_) {
        st = PublishTail();
        if (!st.ok()) return Fail(&consumer_, st);
      }
      st = Wait(U32(mem_, kHeadSeqOff), U32(mem_, kReaderWaitingOff), timeout_ms,
                "the rest of a message", [&](Status* e) { return LoadHead(&available, e); });
      if (!st.ok()) return Fail(&consumer_, st);
    }
    const size_t c =
        static_cast<size_t>(std::min<uint64_t>({available, n, options_.publish_bytes}));
    CopyOut(tail_, out, c);
    tail_ += c;
    out += c;
    n -= c;
    remaining_ -= c;
    // Small reads leave the tail to the next wait (or the next record), so that the line
    // the producer reads is written once per round trip rather than once per read.
    if (TailDue()) {
      st = PublishTail();
      if (!st.ok()) return Fail(&consumer_, st);
    }
  }
  if (remaining_ == 0) in_record_ = false;
  return Status::Ok();
}

Status ShmRing::Read(std::vector<uint8_t>* out, int timeout_ms) {
  uint64_t len = 0;
  Status st = BeginRead(&len, timeout_ms);
  if (!st.ok()) return st;
  out->resize(static_cast<size_t>(len));
  return ReadBody(out->data(), out->size(), timeout_ms);
}

}  // namespace flyt::transport
