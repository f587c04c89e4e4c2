// share_quota: the tenant's share as a program sees it (flyt-server --memory-quota,
// --sm-count, and set-share on its control socket).
//
//   share_quota quota QUOTA SM
//     cudaMemGetInfo, the device properties and MultiProcessorCount match the share;
//     cudaMalloc until it fails with cudaErrorMemoryAllocation; cudaMallocPitch,
//     cudaMallocArray and cudaMallocAsync are held to the quota too; freeing returns it.
//   share_quota watch SECONDS SM TOTAL
//     holds 8 MiB and a stream made before the change, prints "ready", then launches on
//     that stream and polls cudaMemGetInfo and MultiProcessorCount, printing each change,
//     until it sees SM and TOTAL (a live set-share); then checks that the stream kept its
//     flags and priority and that the new quota holds. (cudaGetDeviceProperties keeps the
//     values cudart read at its start: attributes and cudaMemGetInfo are what follow.)
//
//   share_quota pools QUOTA
//     (flyt-server --movable-memory) a pool's idle memory counts against the quota
//     and is given back when a cudaMalloc needs the room.
//
// Prints key=value lines and "share_quota: PASS". Valid under the sim backend (no kernel
// result is checked).
#include <chrono>
#include <thread>
#include <vector>

#include "e2e_common.h"

namespace {

__global__ void Tick(int* p, int v) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p[0] = v;
}

int SmCount() {
  int v = -1;
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
  return v;
}

void ExpectOom(cudaError_t err, const char* what) {
  EXPECT(err == cudaErrorMemoryAllocation, "%s over the quota returned %d (%s), want %d", what,
         static_cast<int>(err), cudaGetErrorName(err), static_cast<int>(cudaErrorMemoryAllocation));
  cudaError_t last = cudaGetLastError();  // not sticky: the context still works
  EXPECT(last == cudaErrorMemoryAllocation || last == cudaSuccess, "last error %d after %s",
         static_cast<int>(last), what);
  printf("oom.%s=ok\n", what);
}

int Quota(size_t quota, int sm) {
  e2e::Step("context");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));

  e2e::Step("share as seen");
  int mp = SmCount();
  printf("multiprocessors=%d\n", mp);
  EXPECT(mp == sm, "MultiProcessorCount %d, want %d", mp, sm);
  cudaDeviceProp prop;
  memset(&prop, 0, sizeof(prop));
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("prop.multiprocessors=%d\nprop.total_global_mem=%zu\n", prop.multiProcessorCount,
         prop.totalGlobalMem);
  EXPECT(prop.multiProcessorCount == sm, "multiProcessorCount %d", prop.multiProcessorCount);
  EXPECT(prop.totalGlobalMem == quota, "totalGlobalMem %zu, want %zu", prop.totalGlobalMem, quota);
  size_t free0 = 0, total0 = 0;
  CK(cudaMemGetInfo(&free0, &total0));
  printf("mem_free=%zu\nmem_total=%zu\n", free0, total0);
  EXPECT(total0 == quota, "cudaMemGetInfo total %zu, want the quota %zu", total0, quota);
  EXPECT(free0 <= quota && free0 > quota / 2, "cudaMemGetInfo free %zu of %zu", free0, quota);

  e2e::Step("cudaMalloc until out of memory");
  const size_t chunk = quota / 8;
  std::vector<void*> ptrs;
  cudaError_t err = cudaSuccess;
  for (int i = 0; i < 64; ++i) {
    void* p = nullptr;
    err = cudaMalloc(&p, chunk);
    if (err != cudaSuccess) break;
    ptrs.push_back(p);
  }
  printf("oom_after=%zu\n", ptrs.size());
  ExpectOom(err, "cudaMalloc");
  EXPECT(ptrs.size() == free0 / chunk, "%zu allocations of %zu fit, want %zu", ptrs.size(), chunk,
         free0 / chunk);
  size_t free1 = 0, total1 = 0;
  CK(cudaMemGetInfo(&free1, &total1));
  printf("mem_free_full=%zu\n", free1);
  EXPECT(free1 < chunk && total1 == quota, "free %zu after filling the quota", free1);

  e2e::Step("other allocation paths over the quota");
  void* p = nullptr;
  size_t pitch = 0;
  ExpectOom(cudaMallocPitch(&p, &pitch, 4096, chunk / 4096 + 1), "cudaMallocPitch");
  cudaArray_t arr = nullptr;
  cudaChannelFormatDesc fmt = cudaCreateChannelDesc<float>();
  ExpectOom(cudaMallocArray(&arr, &fmt, 1024, chunk / 4096 + 16), "cudaMallocArray");
  ExpectOom(cudaMallocAsync(&p, chunk, nullptr), "cudaMallocAsync");
  CK(cudaStreamSynchronize(nullptr));

  e2e::Step("freeing returns quota");
  CK(cudaFree(ptrs.back()));
  ptrs.pop_back();
  CK(cudaMalloc(&p, chunk));
  ptrs.push_back(p);
  CK(cudaFree(ptrs.back()));
  ptrs.pop_back();
  CK(cudaMallocArray(&arr, &fmt, 1024, chunk / 4096 / 2));
  CK(cudaFreeArray(arr));
  CK(cudaMallocPitch(&p, &pitch, 4096, chunk / 4096 / 2));
  CK(cudaFree(p));
  CK(cudaMallocAsync(&p, chunk / 2, nullptr));
  CK(cudaFreeAsync(p, nullptr));
  CK(cudaStreamSynchronize(nullptr));
  for (void* q : ptrs) CK(cudaFree(q));
  size_t free2 = 0, total2 = 0;
  CK(cudaMemGetInfo(&free2, &total2));
  printf("mem_free_after=%zu\n", free2);
  EXPECT(free2 == free0, "free %zu after freeing everything, %zu at the start", free2, free0);
  return 0;
}

int Watch(int seconds, int want_sm, size_t want_total) {
  e2e::Step("context");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  CK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  int* held = nullptr;
  CK(cudaMalloc(&held, 8 << 20));
  size_t free0 = 0, total0 = 0;
  CK(cudaMemGetInfo(&free0, &total0));
  int sm0 = SmCount();
  printf("start sm=%d total=%zu\n", sm0, total0);
  printf("ready\n");

  e2e::Step("watching for a share change");
  int last_sm = sm0;
  size_t last_total = total0;
  bool seen = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (int i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
    // A stream made before the change must keep working after it.
    Tick<<<4, 32, 0, stream>>>(held, i);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(stream));
    size_t f = 0, t = 0;
    CK(cudaMemGetInfo(&f, &t));
    int sm = SmCount();
    if (sm != last_sm || t != last_total) {
      printf("change sm=%d total=%zu\n", sm, t);
      last_sm = sm;
      last_total = t;
    }
    if (sm == want_sm && t == want_total) {
      seen = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT(seen, "no change to %d SMs and %zu bytes within %d s (last: %d SMs, %zu bytes)", want_sm,
         want_total, seconds, last_sm, last_total);
  printf("observed sm=%d total=%zu\n", last_sm, last_total);

  e2e::Step("after the change");
  Tick<<<4, 32, 0, stream>>>(held, -1);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(stream));
  int priority = 0;
  unsigned flags = 0;
  CK(cudaStreamGetPriority(stream, &priority));
  CK(cudaStreamGetFlags(stream, &flags));
  EXPECT(priority == greatest, "stream priority %d, want %d", priority, greatest);
  EXPECT(flags == cudaStreamNonBlocking, "stream flags %u", flags);
  // cudaGetDeviceProperties is not checked here: cudart reads the properties once,
  // when it initialises, and answers from that copy afterwards.
  void* big = nullptr;
  ExpectOom(cudaMalloc(&big, want_total), "cudaMalloc");
  CK(cudaFree(held));
  CK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace

// A pool that keeps its memory (release threshold: all of it), under --movable-memory
// where the server serves the pool: its idle memory counts against the quota as a
// local GPU's pool holds it (cudaMemGetInfo shows it taken), and a cudaMalloc that
// needs the room gets it, the pool giving its idle memory back.
void Pools(size_t quota) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool;
  CK(cudaMemPoolCreate(&pool, &props));
  uint64_t keep = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const size_t half = quota / 2;
  void* p = nullptr;
  CK(cudaMallocFromPoolAsync(&p, half, pool, s));
  CK(cudaFreeAsync(p, s));
  CK(cudaStreamSynchronize(s));
  uint64_t reserved = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  EXPECT(reserved >= half, "the pool keeps %llu bytes after the free, want at least %zu",
         static_cast<unsigned long long>(reserved), half);
  size_t free_bytes = 0, total = 0;
  CK(cudaMemGetInfo(&free_bytes, &total));
  EXPECT(total == quota && free_bytes == quota - reserved,
         "cudaMemGetInfo with %llu bytes idle in a pool: free %zu of %zu, want %llu of %zu",
         static_cast<unsigned long long>(reserved), free_bytes, total,
         static_cast<unsigned long long>(quota - reserved), quota);
  printf("pool_idle_counted=1\n");
  // More than the quota leaves beside the pool's idle memory.
  const size_t big = quota - quota / 8;
  void* q = nullptr;
  CK(cudaMalloc(&q, big));
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  printf("pool_reserved_after_malloc=%llu\n", static_cast<unsigned long long>(reserved));
  CK(cudaFree(q));
  // The pool's memory again, then the pool gone: the quota is whole again.
  CK(cudaMallocFromPoolAsync(&p, half, pool, s));
  CK(cudaFreeAsync(p, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemPoolDestroy(pool));
  CK(cudaStreamDestroy(s));
  CK(cudaMemGetInfo(&free_bytes, &total));
  printf("free_after_pool=%zu\n", free_bytes);
}

int main(int argc, char** argv) {
  e2e::Init("share_quota");
  if (argc == 4 && strcmp(argv[1], "quota") == 0) {
    Quota(strtoull(argv[2], nullptr, 10), atoi(argv[3]));
  } else if (argc == 3 && strcmp(argv[1], "pools") == 0) {
    Pools(strtoull(argv[2], nullptr, 10));
  } else if (argc == 5 && strcmp(argv[1], "watch") == 0) {
    Watch(atoi(argv[2]), atoi(argv[3]), strtoull(argv[4], nullptr, 10));
  } else {
    e2e::Fail(__FILE__, __LINE__,
              "usage: share_quota quota QUOTA SM | pools QUOTA | watch SECONDS SM TOTAL");
  }
  e2e::Pass();
  return 0;
}
