#include "client/managed_memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/client.h"
#include "common/log.h"
#include "protocol/codec.h"
#include "protocol/ops.h"
#include "protocol/wire.h"

namespace flyt::client::managed {

namespace {

constexpr uint64_t kGranule = 64 * 1024;
constexpr uint32_t kMaxReadAhead = 32;       // granules (2 MiB) per fault
constexpr uint64_t kBulkChunk = 8ull << 20;  // bytes per fetch or push request
constexpr uint32_t kStaleTag = 0xffffffffu;  // fetched while device work ran
constexpr int kMaxRanges = 16384;            // live managed ranges (handler table)

enum GranuleState : uint8_t { kAbsent = 0, kClean = 1, kDirty = 2 };

struct Range {
  uint64_t base = 0, size = 0;
  uint64_t owner = 0;
  uint8_t* alias = nullptr;  // the private read-write mapping of the same pages
  int fd = -1;               // the memfd, sealed (until offered to an shm:// server)
  bool shared = false;       // the server maps the pages itself (shm://)
  bool host = false;         // pinned host memory mapped for the GPU (MapHost)
  int server = 0;            // the server of FLYT_SERVER that holds it (its paging channel)
  int slot = -1;             // in the handler's table
  // Zero on both sides while no device work ran since the allocation.
  bool fresh = false;
  uint32_t fresh_epoch = 0;
  std::vector<uint8_t> state;
  std::vector<uint32_t> tag;  // epoch a clean copy is valid for (kStaleTag: until the next point)
  std::vector<uint32_t> resident, dirty;  // granule indices (may hold stale entries)
  std::unordered_map<uint32_t, std::unique_ptr<uint8_t[]>> twins;  // absent: zero twin
  uint32_t last_fault = UINT32_MAX, last_count = 0, streak = 1;
  uint64_t granules() const { return (size + kGranule - 1) / kGranule; }
  uint64_t GranuleLen(uint64_t g) const { return std::min(kGranule, size - g * kGranule); }
};

// --- the handler's lock-free view: which addresses are managed.
std::atomic<uint64_t> g_lo[kMaxRanges];
std::atomic<uint64_t> g_hi[kMaxRanges];
std::atomic<int> g_slots_used{0};
std::atomic<bool> g_any{false};
std::atomic<pid_t> g_owner_pid{0};

bool HandlerOwns(uint64_t a) {
  int n = g_slots_used.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    uint64_t lo = g_lo[i].load(std::memory_order_acquire);
    if (lo != 0 && a >= lo && a < g_hi[i].load(std::memory_order_acquire)) return true;
  }
  return false;
}

// --- requests from the handler to the pager thread.
struct FaultRequest {
  uint64_t addr = 0;
  bool write = false;             // the faulting access was a write (when the CPU says)
  std::atomic<uint32_t> done{0};  // 1 served, 2 not ours (or cannot be served)
  FaultRequest* next = nullptr;
};
std::atomic<FaultRequest*> g_requests{nullptr};
std::atomic<uint32_t> g_request_seq{0};

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, nullptr, nullptr, 0);
}

struct sigaction g_previous {};
std::atomic<bool> g_handler_installed{false};

void Chain(int sig, siginfo_t* info, void* ctx) {
  const struct sigaction& prev = g_previous;
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, ctx);
    return;
  }
  if (prev.sa_handler == SIG_IGN || prev.sa_handler == SIG_DFL) {
    // The default action: the faulting instruction runs again and ends the
    // process as it would have without Flyt.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    g_handler_installed.store(false);
    return;
  }
  prev.sa_handler(sig);
}

void OnSegv(int sig, siginfo_t* info, void* ctx) {
  const int saved_errno = errno;
  auto addr = reinterpret_cast<uint64_t>(info->si_addr);
  bool ours = info->si_code > 0 && g_owner_pid.load() == static_cast<pid_t>(syscall(SYS_getpid)) &&
              HandlerOwns(addr);
  if (ours) {
    FaultRequest req;
    req.addr = addr;
#if defined(__x86_64__)
    // Page-fault error code: bit 1 set for a write. A write to an absent
    // granule is then granted with the fetch, without a second fault.
    req.write = (static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#endif
    FaultRequest* head = g_requests.load(std::memory_order_relaxed);
    do {
      req.next = head;
    } while (!g_requests.compare_exchange_weak(head, &req, std::memory_order_release,
                                               std::memory_order_relaxed));
    g_request_seq.fetch_add(1, std::memory_order_release);
    Futex(&g_request_seq, FUTEX_WAKE_PRIVATE, 1);
    while (req.done.load(std::memory_order_acquire) == 0) Futex(&req.done, FUTEX_WAIT_PRIVATE, 0);
    ours = req.done.load() == 1;
  }
  errno = saved_errno;
  if (!ours) Chain(sig, info, ctx);
}

// Puts OnSegv first again if the application replaced it (it then becomes
// the handler OnSegv chains to).
void EnsureHandler() {
  struct sigaction cur {};
  sigaction(SIGSEGV, nullptr, &cur);
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == OnSegv) return;
  struct sigaction sa {};
  sa.sa_sigaction = OnSegv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  struct sigaction prev {};
  if (sigaction(SIGSEGV, &sa, &prev) == 0) {
    g_previous = prev;
    g_handler_installed.store(true);
  }
}

// --- the state, under g_mu (never held while taking the client's connection lock).
class Manager {
 public:
  std::mutex mu;
  std::map<uint64_t, std::unique_ptr<Range>> ranges;  // by base
  std::atomic<uint32_t> epoch{1};  // device work sent (wraps; compared for equality)
  uint32_t idle_epoch = 0;         // the epoch at which everything was last known done
  uint32_t reconciled_epoch = 0;   // the epoch of the last completion point
  size_t stale = 0;                // clean copies tagged kStaleTag
  std::atomic<size_t> dirty_count{0};
  // The bytes of mapped host buffers on pages they share with other data of the app
  // (cudaHostRegister of memory that does not start or end on a page): never protected
  // (the app's other data, malloc's own among it, lives there), compared and copied
  // whole at each coherence point instead. By address.
  struct Edge {
    uint64_t len = 0;
    uint64_t owner = 0;           // the server's base of the buffer's pages (UnmapHost)
    std::vector<uint8_t> synced;  // the bytes as last pushed or fetched
  };
  std::map<uint64_t, Edge> edges;
  std::atomic<size_t> edge_count{0};
  std::vector<std::pair<uint64_t, uint64_t>> prefetches;  // to fetch at the next completion
  // The paging channel to each server of FLYT_SERVER that holds managed memory
  // (a server's pager knows only its own session's ranges).
  struct Channel {
    std::unique_ptr<transport::Connection> conn;
    bool failed = false;
  };
  std::vector<Channel> channels;  // by server
  bool pager_started = false;
  uint64_t next_call = 1;

  Range* FindLocked(uint64_t p) {
    auto it = ranges.upper_bound(p);
    if (it == ranges.begin()) return nullptr;
    --it;
    Range* r = it->second.get();
    return p - r->base < r->size ? r : nullptr;
  }
  // Server `server`'s paging channel, dialled at first use (null when it failed).
  transport::Connection* ChannelLocked(int server);
  // The thread that serves faults; started with the first range.
  void EnsurePagerLocked();
  // One request on server `server`'s paging channel; a successful reply's payload
  // goes to `into` (exactly `into_len` bytes) or nowhere (none expected).
  bool ExchangeLocked(int server, uint16_t op, const wire::Writer& req, void* into, size_t into_len,
                      CUresult* rc);
  bool FetchLocked(Range* r, uint64_t g, uint64_t count);
  // Over shm://, hands a new range's memfd to the server, so that its pages
  // are copied to and from directly (r->shared when it took it).
  void ShareLocked(Range* r);
  bool PushLocked(int server, std::vector<std::pair<uint64_t, uint32_t>>& runs,
                  std::vector<uint8_t>& bytes, bool shared);
  void CollectDiffLocked(Range* r, uint32_t g, std::vector<std::pair<uint64_t, uint32_t>>* runs,
                         std::vector<uint8_t>* bytes);
  void FlushLocked(bool drop_changed);
  // Edges: the host's changes to the GPU; with `fetch`, then the GPU's bytes back.
  void SyncEdgesLocked(bool fetch);
  uint32_t FetchTag() {
    uint32_t e = epoch.load();
    return idle_epoch == e ? e : kStaleTag;
  }
  void Protect(Range* r, uint64_t g0, uint64_t count, int prot) {
    uint64_t len = std::min(count * kGranule, r->size - g0 * kGranule);
    uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    len = (len + page - 1) / page * page;
    if (mprotect(reinterpret_cast<void*>(r->base + g0 * kGranule), len, prot) != 0)
      FLYT_ERROR("managed memory: mprotect failed (%s)", std::strerror(errno));
  }
  int HandleFault(uint64_t addr, bool write);
  // Lets the host write granule g (clean): a twin first, unless it is known zero.
  void GrantWriteLocked(Range* r, uint32_t g);
  void ServeFaults();
  void Drop(Range* r);
};

Manager& M() {
  static Manager* m = new Manager;  // never destroyed: faults may come until exit
  return *m;
}

transport::Connection* Manager::ChannelLocked(int server) {
  Client& c = Client::Get();
  if (server < 0 || server >= c.server_count()) return nullptr;
  if (channels.size() < static_cast<size_t>(c.server_count())) channels.resize(c.server_count());
  Channel& ch = channels[server];
  if (ch.conn == nullptr && !ch.failed &&
      c.Link(server).DialSideChannel(ops::kOpAttachPagingChannel, "paging", &ch.conn) !=
          CUDA_SUCCESS)
    ch.failed = true;
  return ch.failed ? nullptr : ch.conn.get();
}

void Manager::EnsurePagerLocked() {
  if (pager_started) return;
  pager_started = true;
  std::thread([this] { ServeFaults(); }).detach();
}

bool Manager::ExchangeLocked(int server, uint16_t op, const wire::Writer& req, void* into,
                             size_t into_len, CUresult* rc) {
  transport::Connection* conn = ChannelLocked(server);
  if (conn == nullptr) return false;
  wire::FrameHeader h{wire::kMagic,
                      op,
                      wire::kFlagWantReply,
                      next_call++,
                      static_cast<uint32_t>(req.size()),
                      0,
                      0,
                      0};
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t*>(req.data()), req.size()}};
  wire::FrameHeader rep{};
  Status st = conn->Send(iov, 2);
  if (st.ok()) st = conn->Receive(&rep, sizeof(rep));
  bool ok = st.ok() && rep.magic == wire::kMagic && rep.call_id == h.call_id &&
            (rep.payload_len == 0 || (rep.status == CUDA_SUCCESS && rep.payload_len == into_len));
  if (ok && rep.payload_len != 0) ok = conn->Receive(into, into_len).ok();
  if (!ok) {
    FLYT_ERROR(
        "managed memory: the paging channel to flyt-server failed (%s); pages of managed "
        "memory can no longer be fetched or written back. Restart the application.",
        st.ok() ? "malformed reply" : st.message().c_str());
    conn->Shutdown();
    channels[server].conn.reset();
    channels[server].failed = true;
    return false;
  }
  *rc = static_cast<CUresult>(rep.status);
  return true;
}

// Fetches granules [g, g+count) of r into the alias; they become clean copies.
bool Manager::FetchLocked(Range* r, uint64_t g, uint64_t count) {
  const uint64_t begin = g * kGranule;
  const uint64_t end = std::min(r->size, (g + count) * kGranule);
  for (uint64_t off = begin; off < end; off += kBulkChunk) {
    uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(kBulkChunk, end - off));
    CUresult rc = CUDA_SUCCESS;
    // New memory is zero on the GPU too, and its pages here were never written
    // (a fresh range has dropped nothing yet).
    if (!r->fresh) {
      const bool shared = r->shared;
      wire::Writer w;
      w.Put<uint64_t>(r->base + off);
      w.Put<uint32_t>(len);
      w.Put<uint8_t>(shared ? 1 : 0);
      // Straight into the pages (the app cannot see them until they are done);
      // over shm:// the server writes them itself.
      if (!ExchangeLocked(r->server, ops::kOpManagedFetch, w, shared ? nullptr : r->alias + off,
                          shared ? 0 : len, &rc))
        return false;
      if (rc != CUDA_SUCCESS) {
        FLYT_ERROR("managed memory: the server could not read %u bytes at 0x%llx (error %d)", len,
                   static_cast<unsigned long long>(r->base + off), rc);
        return false;
      }
    }
  }
  const uint32_t tag = r->fresh ? r->fresh_epoch : FetchTag();
  for (uint64_t i = g; i * kGranule < end; ++i) {
    r->state[i] = kClean;
    r->tag[i] = tag;
    if (tag == kStaleTag) ++stale;
    r->resident.push_back(static_cast<uint32_t>(i));
  }
  Protect(r, g, (end - begin + kGranule - 1) / kGranule, PROT_READ);
  return true;
}

// Granules are compared with their twins in blocks of this many bytes first.
constexpr uint64_t kBlock = 64;

// Appends to *runs (at addr + offset) the exact byte runs where now[0, len) differs from
// old (null: zero), and their bytes to *bytes when given. Exact to the byte: a byte the
// host did not change is never sent, so the device's write to it survives (natively the
// host's write to one byte leaves its neighbours alone). Equal blocks are skipped with
// memcmp, so an untouched stretch costs what a compare costs.
void DiffRuns(const uint8_t* now, const uint8_t* old, uint64_t len, uint64_t addr,
              std::vector<std::pair<uint64_t, uint32_t>>* runs, std::vector<uint8_t>* bytes) {
  static const uint8_t kZero[kBlock] = {};
  uint64_t run_start = UINT64_MAX;
  auto close = [&](uint64_t at) {
    if (run_start == UINT64_MAX) return;
    runs->emplace_back(addr + run_start, static_cast<uint32_t>(at - run_start));
    if (bytes != nullptr) bytes->insert(bytes->end(), now + run_start, now + at);
    run_start = UINT64_MAX;
  };
  for (uint64_t at = 0; at < len; at += kBlock) {
    const uint64_t n = std::min(kBlock, len - at);
    const uint8_t* o = old != nullptr ? old + at : kZero;
    if (std::memcmp(now + at, o, n) == 0) {
      close(at);
      continue;
    }
    for (uint64_t i = 0; i < n; ++i) {
      if (now[at + i] != o[i]) {
        if (run_start == UINT64_MAX) run_start = at + i;
      } else {
        close(at + i);
      }
    }
  }
  close(len);
}

// Appends the bytes of dirty granule g that differ from its twin.
void Manager::CollectDiffLocked(Range* r, uint32_t g,
                                std::vector<std::pair<uint64_t, uint32_t>>* runs,
                                std::vector<uint8_t>* bytes) {
  const uint64_t off = static_cast<uint64_t>(g) * kGranule, len = r->GranuleLen(g);
  auto it = r->twins.find(g);
  const uint8_t* twin = it != r->twins.end() ? it->second.get() : nullptr;
  DiffRuns(r->alias + off, twin, len, r->base + off, runs, r->shared ? nullptr : bytes);
  r->twins.erase(g);
}

void Manager::ShareLocked(Range* r) {
  uint64_t id = 0;
  transport::Connection* conn = ChannelLocked(r->server);
  if (conn == nullptr || !conn->SharesMemory() || !conn->ShareFd(r->fd, &id).ok()) return;
  wire::Writer w;
  w.Put<uint64_t>(id);
  w.Put<uint64_t>(r->base);
  w.Put<uint64_t>(r->size);
  CUresult rc = CUDA_SUCCESS;
  r->shared =
      ExchangeLocked(r->server, ops::kOpManagedShare, w, nullptr, 0, &rc) && rc == CUDA_SUCCESS;
}

// Sends the runs of one range (shared: the server reads them from the pages).
bool Manager::PushLocked(int server, std::vector<std::pair<uint64_t, uint32_t>>& runs,
                         std::vector<uint8_t>& bytes, bool shared) {
  if (runs.empty()) return true;
  wire::Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(runs.size()));
  w.Put<uint8_t>(shared ? 1 : 0);
  for (auto& [addr, len] : runs) {
    w.Put<uint64_t>(addr);
    w.Put<uint32_t>(len);
  }
  if (!shared) w.PutBytes(bytes.data(), bytes.size());
  runs.clear();
  bytes.clear();
  CUresult rc = CUDA_SUCCESS;
  if (!ExchangeLocked(server, ops::kOpManagedPush, w, nullptr, 0, &rc)) return false;
  if (rc != CUDA_SUCCESS)
    FLYT_ERROR("managed memory: the server could not write back host changes (error %d)", rc);
  return rc == CUDA_SUCCESS;
}

// Sends every host change to the GPU. The granules are write-protected first,
// so a thread writing meanwhile waits in the handler and its write lands
// after (as a new change). With `drop_changed`, copies the device may have
// changed go as well (a completion point).
void Manager::FlushLocked(bool drop_changed) {
  std::vector<std::pair<uint64_t, uint32_t>> runs;
  std::vector<uint8_t> bytes;
  const uint32_t e = epoch.load();
  for (auto& [base, rp] : ranges) {
    Range* r = rp.get();
    if (!r->dirty.empty()) {
      std::sort(r->dirty.begin(), r->dirty.end());
      r->dirty.erase(std::unique(r->dirty.begin(), r->dirty.end()), r->dirty.end());
      for (size_t i = 0; i < r->dirty.size();) {  // write-protect runs of granules
        size_t j = i + 1;
        while (j < r->dirty.size() && r->dirty[j] == r->dirty[j - 1] + 1) ++j;
        Protect(r, r->dirty[i], r->dirty[j - 1] - r->dirty[i] + 1, PROT_READ);
        i = j;
      }
      const bool shared = r->shared;
      for (uint32_t g : r->dirty) {
        if (r->state[g] != kDirty) continue;
        CollectDiffLocked(r, g, &runs, &bytes);
        r->state[g] = kClean;  // its tag stays the fetch's: other bytes may be stale
        dirty_count.fetch_sub(1);
        if (bytes.size() >= kBulkChunk || runs.size() >= 65536)
          PushLocked(r->server, runs, bytes, shared);
      }
      PushLocked(r->server, runs, bytes, shared);  // one range per push
      r->dirty.clear();
    }
    if (!drop_changed) continue;
    if (r->fresh && r->fresh_epoch != e) r->fresh = false;  // device work may have written it
    std::vector<uint32_t> keep;
    std::sort(r->resident.begin(), r->resident.end());
    r->resident.erase(std::unique(r->resident.begin(), r->resident.end()), r->resident.end());
    size_t i = 0;
    while (i < r->resident.size()) {
      uint32_t g = r->resident[i];
      if (r->state[g] == kAbsent) {
        ++i;
        continue;
      }
      if (r->tag[g] == e) {
        keep.push_back(g);
        ++i;
        continue;
      }
      // A run of granules to drop.
      size_t j = i;
      while (j < r->resident.size() && r->resident[j] == g + (j - i) &&
             r->state[r->resident[j]] != kAbsent && r->tag[r->resident[j]] != e)
        ++j;
      Protect(r, g, j - i, PROT_NONE);
      for (size_t k = i; k < j; ++k) r->state[r->resident[k]] = kAbsent;
      i = j;
    }
    r->resident.swap(keep);
  }
  if (drop_changed) stale = 0;
}

void Manager::SyncEdgesLocked(bool fetch) {
  std::vector<std::pair<uint64_t, uint32_t>> runs;
  std::vector<uint8_t> bytes;
  for (auto& [addr, e] : edges) {
    const auto* now = reinterpret_cast<const uint8_t*>(addr);
    DiffRuns(now, e.synced.data(), e.len, addr, &runs, &bytes);
    std::memcpy(e.synced.data(), now, e.len);
  }
  if (!PushLocked(0, runs, bytes, false) || !fetch) return;  // host ranges: server 0's
  for (auto& [addr, e] : edges) {
    wire::Writer w;
    w.Put<uint64_t>(addr);
    w.Put<uint32_t>(static_cast<uint32_t>(e.len));
    w.Put<uint8_t>(0);
    CUresult rc = CUDA_SUCCESS;
    if (!ExchangeLocked(0, ops::kOpManagedFetch, w, e.synced.data(), e.len, &rc)) return;
    if (rc != CUDA_SUCCESS) {
      FLYT_ERROR("mapped host memory: the server could not read %llu bytes at 0x%llx (error %d)",
                 static_cast<unsigned long long>(e.len), static_cast<unsigned long long>(addr), rc);
      continue;
    }
    std::memcpy(reinterpret_cast<void*>(addr), e.synced.data(), e.len);
  }
}

void Manager::GrantWriteLocked(Range* r, uint32_t g) {
  if (!(r->fresh && r->fresh_epoch == epoch.load())) {
    auto twin = std::make_unique<uint8_t[]>(r->GranuleLen(g));
    std::memcpy(twin.get(), r->alias + static_cast<uint64_t>(g) * kGranule, r->GranuleLen(g));
    r->twins[g] = std::move(twin);
  }
  r->state[g] = kDirty;
  r->dirty.push_back(g);
  dirty_count.fetch_add(1);
}

// 1: served (the instruction runs again), 2: not a managed address or it cannot be served.
int Manager::HandleFault(uint64_t addr, bool write) {
  std::lock_guard<std::mutex> lock(mu);
  Range* r = FindLocked(addr);
  if (r == nullptr) return 2;
  const uint32_t g = static_cast<uint32_t>((addr - r->base) / kGranule);
  switch (r->state[g]) {
    case kAbsent: {
      // Sequential touches fetch more at a time (up to 8 MiB).
      r->streak = g == r->last_fault + r->last_count ? std::min(r->streak * 2, kMaxReadAhead) : 1;
      r->last_fault = g;
      uint32_t count = 1;
      while (count < r->streak && g + count < r->granules() && r->state[g + count] == kAbsent)
        ++count;
      r->last_count = count;
      if (!FetchLocked(r, g, count)) return 2;
      if (!write) return 1;
      // A write: the run fetched for it is the host's to write (new memory
      // being initialised, most often), with one mprotect.
      for (uint32_t i = 0; i < count; ++i) GrantWriteLocked(r, g + i);
      Protect(r, g, count, PROT_READ | PROT_WRITE);
      return 1;
    }
    case kClean:  // a write
      GrantWriteLocked(r, g);
      Protect(r, g, 1, PROT_READ | PROT_WRITE);
      return 1;
    default:
      return 1;  // another thread's fault made it writable meanwhile
  }
}

void Manager::ServeFaults() {
  for (;;) {
    uint32_t seq = g_request_seq.load(std::memory_order_acquire);
    FaultRequest* list = g_requests.exchange(nullptr, std::memory_order_acquire);
    if (list == nullptr) {
      Futex(&g_request_seq, FUTEX_WAIT_PRIVATE, seq);
      continue;
    }
    while (list != nullptr) {
      FaultRequest* next = list->next;
      int result = HandleFault(list->addr, list->write);
      if (result == 2)
        FLYT_ERROR("managed memory: the page at 0x%llx could not be served",
                   static_cast<unsigned long long>(list->addr));
      list->done.store(static_cast<uint32_t>(result), std::memory_order_release);
      Futex(&list->done, FUTEX_WAKE_PRIVATE, 1);
      list = next;
    }
  }
}

void Manager::Drop(Range* r) {
  if (r->base != 0) munmap(reinterpret_cast<void*>(r->base), r->size);
  munmap(r->alias, r->size);
  if (r->fd >= 0) close(r->fd);
  if (r->slot >= 0) g_lo[r->slot].store(0, std::memory_order_release);
  for (uint32_t g : r->dirty)
    if (r->state[g] == kDirty) dirty_count.fetch_sub(1);
}

}  // namespace

namespace {

// How a new range comes to be (Map, MapHost).
enum class Origin {
  kNew,      // at free addresses (managed memory)
  kReplace,  // over this process's own reservation of the addresses (a new host range)
  kAdopt,    // over the app's pages, whose bytes it keeps (a host range of app memory)
};

CUresult MapRange(uint64_t base, uint64_t size, bool fresh, uint64_t owner, bool host,
                  Origin origin, int server) {
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (size == 0 || base % page != 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t len = (size + page - 1) / page * page;
  if (Range* r = m.FindLocked(base); r != nullptr)  // a library's variable asked for again
    return !host && !r->host && r->base == base && r->size == len && r->server == server
               ? CUDA_SUCCESS
               : CUDA_ERROR_INVALID_VALUE;
  if (host && m.FindLocked(base + len - 1) != nullptr) return CUDA_ERROR_INVALID_VALUE;
  int fd =
      memfd_create(host ? "flyt-mapped-host" : "flyt-managed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void* view = MAP_FAILED;
  void* alias = MAP_FAILED;
  // Sealed at its size: an shm:// server maps it, and must never see it shrink.
  if (ftruncate(fd, static_cast<off_t>(len)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    alias = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (alias != MAP_FAILED) {
    // The app's bytes move into the view's pages before the view takes their place
    // (a write by another thread in between is lost, as when memory is registered
    // while a thread writes it).
    if (origin == Origin::kAdopt) std::memcpy(alias, reinterpret_cast<void*>(base), len);
    const int prot = origin == Origin::kAdopt ? PROT_READ | PROT_WRITE : PROT_NONE;
    const int fixed = origin == Origin::kNew ? MAP_FIXED_NOREPLACE : MAP_FIXED;
    view =
        mmap(reinterpret_cast<void*>(base), len, prot, MAP_SHARED | MAP_NORESERVE | fixed, fd, 0);
    if (view != MAP_FAILED && view != reinterpret_cast<void*>(base)) {
      munmap(view, len);  // a kernel without MAP_FIXED_NOREPLACE placed it elsewhere
      view = MAP_FAILED;
    }
  }
  if (view == MAP_FAILED || alias == MAP_FAILED) {
    if (alias != MAP_FAILED) munmap(alias, len);
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // A forked child gets neither: its accesses fault as a child's do natively.
  madvise(view, len, MADV_DONTFORK);
  madvise(alias, len, MADV_DONTFORK);
  int slot = -1;
  int used = g_slots_used.load();
  for (int i = 0; i < used && slot < 0; ++i)
    if (g_lo[i].load() == 0) slot = i;
  if (slot < 0 && used < kMaxRanges) slot = used;
  if (slot < 0) {
    munmap(view, len);
    munmap(alias, len);
    close(fd);
    FLYT_ERROR("managed memory: more than %d managed allocations at once", kMaxRanges);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto r = std::make_unique<Range>();
  r->base = base;
  r->size = len;
  r->owner = owner;
  r->alias = static_cast<uint8_t*>(alias);
  r->fd = fd;
  r->slot = slot;
  r->host = host;  // its owner: the server's base of the buffer's pages
  r->server = server;
  r->fresh = fresh;
  r->fresh_epoch = m.epoch.load();
  r->state.assign(r->granules(), kAbsent);
  r->tag.assign(r->granules(), 0);
  if (origin == Origin::kAdopt) {
    // Every granule written by the host, against a zero twin (the server's pages
    // are new): the next device work sends the bytes that are not zero.
    for (uint32_t g = 0; g < r->granules(); ++g) {
      r->state[g] = kDirty;
      r->dirty.push_back(g);
      r->resident.push_back(g);
    }
    m.dirty_count.fetch_add(r->granules());
  }
  g_hi[slot].store(base + len, std::memory_order_release);
  g_lo[slot].store(base, std::memory_order_release);
  if (slot == used) g_slots_used.store(used + 1, std::memory_order_release);
  // Over shm:// the server maps the pages now; either way the descriptor goes
  // (a process may hold thousands of allocations).
  Range* added = r.get();
  m.ranges[base] = std::move(r);
  m.ShareLocked(added);
  close(added->fd);
  added->fd = -1;
  g_owner_pid.store(getpid());
  m.EnsurePagerLocked();
  EnsureHandler();
  g_any.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Map(uint64_t base, uint64_t size, bool fresh, uint64_t owner, int server) {
  return MapRange(base, size, fresh, owner, false, Origin::kNew, server);
}

CUresult MapHost(uint64_t p, uint64_t n, uint64_t server_base, bool adopt) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (!adopt) return MapRange(p, n, true, server_base, true, Origin::kReplace, 0);
  // The whole pages of [p, p+n) become a view; the bytes on pages the buffer shares
  // with other data are edges.
  const uint64_t first = (p + page - 1) & ~(page - 1), end = (p + n) & ~(page - 1);
  if (first < end) {
    CUresult rc = MapRange(first, end - first, false, server_base, true, Origin::kAdopt, 0);
    if (rc != CUDA_SUCCESS) return rc;
  }
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  auto add_edge = [&](uint64_t at, uint64_t len) {
    if (len == 0) return;
    Manager::Edge e;
    e.len = len;
    e.owner = server_base;
    e.synced.assign(len, 0);  // the server's pages are new: the app's bytes go at the next point
    m.edges[at] = std::move(e);
    m.edge_count.fetch_add(1);
  };
  if (first >= end) {  // no whole page: one edge, or two around a page boundary
    const uint64_t split = std::min(first, p + n);
    add_edge(p, split - p);
    add_edge(split, p + n - split);
  } else {
    add_edge(p, first - p);
    add_edge(end, p + n - end);
  }
  g_owner_pid.store(getpid());
  m.EnsurePagerLocked();
  g_any.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

bool Unmap(uint64_t base) {
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.ranges.find(base);
  if (it == m.ranges.end() || it->second->host) return false;
  m.Drop(it->second.get());
  m.ranges.erase(it);
  return true;
}

bool UnmapHost(uint64_t server_base, bool restore) {
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  bool found = false;
  for (auto e = m.edges.begin(); e != m.edges.end();) {
    if (e->second.owner != server_base) {
      ++e;
      continue;
    }
    e = m.edges.erase(e);  // its bytes are the app's memory already
    m.edge_count.fetch_sub(1);
    found = true;
  }
  auto it = m.ranges.begin();
  while (it != m.ranges.end() && !(it->second->host && it->second->owner == server_base)) ++it;
  if (it == m.ranges.end()) return found;
  const uint64_t base = it->first;
  Range* r = it->second.get();
  if (restore) {
    // Every granule's bytes in the alias (absent ones fetched), then ordinary
    // memory with those bytes takes the view's place at the same address.
    bool complete = true;
    for (uint64_t g = 0; g < r->granules() && complete;) {
      if (r->state[g] != kAbsent) {
        ++g;
        continue;
      }
      uint64_t j = g;
      while (j < r->granules() && r->state[j] == kAbsent) ++j;
      complete = m.FetchLocked(r, g, j - g);
      g = j;
    }
    if (!complete)
      FLYT_ERROR(
          "mapped host memory at 0x%llx: its bytes could not all be fetched from the server; "
          "the ones that could not read as zero",
          static_cast<unsigned long long>(base));
    // Ordinary memory takes the view's place (MAP_FIXED replaces it at once), then
    // gets the bytes. Not mremap: UCX's memory hooks (ucx://) may not pass its
    // new address on.
    void* plain = mmap(reinterpret_cast<void*>(base), r->size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (plain == reinterpret_cast<void*>(base)) {
      std::memcpy(plain, r->alias, r->size);
    } else {
      // Keep the view readable and writable: the bytes stay, only the tracking goes.
      FLYT_ERROR("mapped host memory at 0x%llx: no ordinary memory to put back (%s)",
                 static_cast<unsigned long long>(base), std::strerror(errno));
      mprotect(reinterpret_cast<void*>(base), r->size, PROT_READ | PROT_WRITE);
    }
    r->base = 0;  // nothing of the view left to unmap at the address
  }
  m.Drop(r);
  m.ranges.erase(it);
  return true;
}

bool IsHost(uint64_t p) {
  if (!Any()) return false;
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  Range* r = m.FindLocked(p);
  if (r != nullptr) return r->host;
  auto e = m.edges.upper_bound(p);
  return e != m.edges.begin() && p - std::prev(e)->first < std::prev(e)->second.len;
}

void UnmapOwnedBy(uint64_t owner) {
  if (owner == 0) return;
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  for (auto it = m.ranges.begin(); it != m.ranges.end();) {
    if (it->second->owner != owner || it->second->host) {
      ++it;
      continue;
    }
    m.Drop(it->second.get());
    it = m.ranges.erase(it);
  }
}

bool OwnsAny(uint64_t owner) {
  if (!Any() || owner == 0) return false;
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  for (const auto& [base, r] : m.ranges)
    if (r->owner == owner && !r->host) return true;
  return false;
}

void UnmapAll() {
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  for (auto& [base, r] : m.ranges) m.Drop(r.get());
  m.ranges.clear();
  m.prefetches.clear();
}

bool Find(uint64_t p, uint64_t n, uint64_t* base, uint64_t* size) {
  if (!Any()) return false;
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  Range* r = m.FindLocked(p);
  if (r == nullptr || n > r->size - (p - r->base)) return false;
  if (base) *base = r->base;
  if (size) *size = r->size;
  return true;
}

int ServerOf(uint64_t p) {
  if (!Any()) return -1;
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  Range* r = m.FindLocked(p);
  return r == nullptr || r->host ? -1 : r->server;
}

bool Overlaps(uint64_t p, uint64_t n) {
  if (!Any() || n == 0) return false;
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  auto e = m.edges.lower_bound(p + n);
  if (e != m.edges.begin() && std::prev(e)->first + std::prev(e)->second.len > p) return true;
  auto it = m.ranges.lower_bound(p + n);
  if (it == m.ranges.begin()) return false;
  --it;
  return it->second->base + it->second->size > p;
}

bool Any() { return g_any.load(std::memory_order_relaxed); }

uint64_t Epoch() { return M().epoch.load(); }

void AfterForkInChild() {
  if (!g_any.load()) return;
  g_any.store(false);
  // A parent thread may have held the lock at fork(); nothing here takes it again.
  Manager& m = M();
  for (Manager::Channel& ch : m.channels) {
    if (ch.conn != nullptr) ch.conn->AbandonAfterFork();
    (void)ch.conn.release();  // the socket is the parent's too: never shut it down
    ch.failed = true;
  }
}

void BeforeDeviceWork() {
  Manager& m = M();
  if (m.dirty_count.load() != 0 || m.edge_count.load() != 0) {
    std::lock_guard<std::mutex> lock(m.mu);
    m.FlushLocked(false);
    m.SyncEdgesLocked(false);
  }
  m.epoch.fetch_add(1);
}

void FlushHostWrites() {
  Manager& m = M();
  if (m.dirty_count.load() == 0 && m.edge_count.load() == 0) return;
  std::lock_guard<std::mutex> lock(m.mu);
  m.FlushLocked(false);
  m.SyncEdgesLocked(false);
}

void AfterCompletion(bool all_idle) {
  Manager& m = M();
  // An app (Python's faulthandler, a JVM, a test harness) may have installed
  // its own SIGSEGV handler since: the host is about to read device results.
  EnsureHandler();
  std::lock_guard<std::mutex> lock(m.mu);
  const uint32_t e = m.epoch.load();
  if (all_idle) m.idle_epoch = e;
  if (e != m.reconciled_epoch || m.stale != 0) {
    m.FlushLocked(true);
    m.SyncEdgesLocked(true);
    m.reconciled_epoch = e;
  }
  if (m.prefetches.empty()) return;
  std::vector<std::pair<uint64_t, uint64_t>> todo;
  todo.swap(m.prefetches);
  for (auto& [p, n] : todo) {
    Range* r = m.FindLocked(p);
    if (r == nullptr) continue;
    uint64_t g = (p - r->base) / kGranule;
    uint64_t end = std::min(r->granules(), (p - r->base + n + kGranule - 1) / kGranule);
    while (g < end) {  // runs of absent granules, fetched in bulk
      if (r->state[g] != kAbsent) {
        ++g;
        continue;
      }
      uint64_t j = g;
      while (j < end && r->state[j] == kAbsent) ++j;
      if (!m.FetchLocked(r, g, j - g)) return;
      g = j;
    }
  }
}

void NotePrefetchToHost(uint64_t p, uint64_t n) {
  Manager& m = M();
  std::lock_guard<std::mutex> lock(m.mu);
  m.prefetches.emplace_back(p, n);
}

}  // namespace flyt::client::managed
