// Pageable device-to-host copies over shm:// (ops::kOpCopyFromDeviceStaged).
//
// Owns: this process's staging area (a sealed memfd shared with the server like a
// cuMemHostAlloc buffer, so the server has it mapped and registered with the driver,
// never shown to the app) and the client half of the chunk pipeline: the GPU writes
// chunk i into slot i % slots, the server announces it, and it is copied out here into
// the app's memory (by ParallelCopy: a single core's memcpy would bound the copy) and
// acked so that the slot can be written again. Natively the driver does the same with
// its own pinned buffers; the bytes never cross the rings.
// The area is made at the first device-to-host copy of a connection and belongs to
// that connection: after a move to another server (a new generation) it is made again.
// Must not touch: the app's pinned buffers (api_memory.cc), the connection's framing
// beyond the notices and acks of this one call (client.cc).
// Environment (read once): FLYT_SHM_STAGED=off (use the rings), FLYT_SHM_STAGED_CHUNK_KIB
// (default 4096), FLYT_SHM_STAGED_SLOTS (default 4), FLYT_SHM_COPY_THREADS (threads that
// copy each chunk out, the caller included; default 2, or 1 where this process may run on
// fewer than 4 CPUs).
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "client/client.h"
#include "client/parallel_copy.h"
#include "common/log.h"

namespace flyt::client {
namespace {

struct StagedConfig {
  bool enabled = true;
  size_t chunk = 4u << 20;
  unsigned slots = 4;
  unsigned threads = 2;
};

long EnvLong(const char* name, long fallback, long lo, long hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi) {
    FLYT_WARN("%s=%s is not a number in [%ld, %ld]; using %ld", name, v, lo, hi, fallback);
    return fallback;
  }
  return x;
}

const StagedConfig& Config() {
  static const StagedConfig config = [] {
    StagedConfig c;
    const char* mode = std::getenv("FLYT_SHM_STAGED");
    c.enabled = mode == nullptr || std::strcmp(mode, "off") != 0;
    // Whole pages, so that each slot starts page-aligned in the registered area.
    c.chunk = static_cast<size_t>(EnvLong("FLYT_SHM_STAGED_CHUNK_KIB", 4096, 4, 256 << 10)) << 10;
    c.slots = static_cast<unsigned>(EnvLong("FLYT_SHM_STAGED_SLOTS", 4, 1, ops::kMaxStagedSlots));
    // A helper thread pays only where a core is free for it: on a machine of two or three
    // CPUs the server's thread and the app's own take them.
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    const int ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    c.threads = static_cast<unsigned>(EnvLong("FLYT_SHM_COPY_THREADS", ncpu >= 4 ? 2 : 1, 1, 8));
    return c;
  }();
  return config;
}

}  // namespace

bool Client::StagedDownload(const char* name, void* dst, CUdeviceptr src, size_t n, CUstream stream,
                            bool async, bool per_thread, CUresult* rc) {
  const StagedConfig& cfg = Config();
  if (!cfg.enabled || (server_features_.load() & ops::kServerFeatureStagedDownload) == 0 ||
      AnyCapture())
    return false;
  std::lock_guard<std::mutex> stage_lock(stage_mu_);
  const uint64_t gen = conn_gen_.load();
  if (stage_.gen != gen) {
    // First use on this connection (or the session moved: the area was the old
    // server's, which no longer writes it).
    if (stage_.base != nullptr) munmap(stage_.base, stage_.chunk * stage_.slots);
    stage_ = StageArea{};
    stage_.gen = gen;
    if (SharesMemory()) {
      HostBuffer b;
      CUresult made =
          AllocSharedHost(cfg.chunk * cfg.slots, ops::kHostShareStaging, &b, "flyt-staging");
      if (made == CUDA_SUCCESS) {
        stage_.base = reinterpret_cast<uint8_t*>(b.base);
        stage_.chunk = cfg.chunk;
        stage_.slots = cfg.slots;
        stage_.server_addr = b.server_addr;
        FLYT_INFO("device-to-host copies: staging area of %u x %zu KiB shared with the server",
                  cfg.slots, cfg.chunk >> 10);
      } else {
        FLYT_INFO(
            "device-to-host copies take the rings: the server did not share a staging area "
            "(error %d)",
            made);
      }
    }
  }
  if (stage_.base == nullptr) return false;
  const size_t chunk = stage_.chunk;
  const uint64_t chunks = (n + chunk - 1) / chunk;
  wire::Writer w;
  w.Put<uint64_t>(src);
  w.Put<uint64_t>(n);
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(stream));
  w.Put<uint8_t>(async ? 1 : 0);
  w.Put<uint64_t>(stage_.server_addr);
  w.Put<uint64_t>(chunk);
  w.Put<uint32_t>(stage_.slots);
  auto* out = static_cast<uint8_t*>(dst);
  const std::function<void(uint64_t)> take = [&](uint64_t i) {
    const size_t off = static_cast<size_t>(i) * chunk;
    ParallelCopy(out + off, stage_.base + (i % stage_.slots) * chunk, std::min(chunk, n - off),
                 cfg.threads);
  };
  ReplySink sink;
  if (chunks > 1) {
    sink.staged = &take;
    sink.staged_chunks = chunks;
  }
  const uint16_t flags = per_thread ? static_cast<uint16_t>(wire::kFlagPerThread) : 0;
  {
    // The area is this connection's: another thread's park may have moved the session
    // since; then the copy takes the caller's other path.
    SameConnection same(gen);
    *rc = Call(name, ops::kOpCopyFromDeviceStaged, w, sink, flags);
    if (SameConnection::Stale()) return false;
  }
  // One chunk: it is in slot 0 once the reply came (stage_mu_ keeps the slot ours).
  if (*rc == CUDA_SUCCESS && chunks == 1) take(0);
  return true;
}

}  // namespace flyt::client
