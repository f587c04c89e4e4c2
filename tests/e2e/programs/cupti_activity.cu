// cupti_activity: CUPTI's activity API as torch.profiler (Kineto) uses it: buffer
// callbacks, kernel/memcpy/memset records, external correlation ids pushed around
// the work, a flush after a synchronize. Through Flyt, `flyt run` preloads Flyt's
// libcupti.so.13 and the records come from the server's CUPTI (the sim's in CI).
// Prints key=value lines the e2e test (and the GPU comparison) checks.
#include <cupti.h>
#include <dlfcn.h>

#include <map>
#include <string>
#include <vector>

#include "e2e_common.h"
#include "e2e_cupti.h"
#include "e2e_driver.h"

namespace {

struct Api {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks;
  decltype(&cuptiActivityEnable) enable;
  decltype(&cuptiActivityDisable) disable;
  decltype(&cuptiActivityFlushAll) flush_all;
  decltype(&cuptiActivityGetNextRecord) next_record;
  decltype(&cuptiActivityPushExternalCorrelationId) push;
  decltype(&cuptiActivityPopExternalCorrelationId) pop;
  decltype(&cuptiGetTimestamp) timestamp;
} g;

struct Seen {
  std::string name;
  uint8_t copy_kind = 0;
  uint64_t bytes = 0, start = 0, end = 0;
  uint32_t value = 0, correlation = 0;
  int grid = 0, block = 0;
};
std::vector<Seen> g_kernels, g_copies, g_memsets;
// Overhead records: CUpti_ActivityOverheadKind -> correlation ids.
std::multimap<int, uint32_t> g_overheads;
std::map<uint32_t, uint64_t> g_external;  // correlation id -> external id (CUSTOM0)
int g_outstanding = 0;                    // buffers given to CUPTI and not yet back

void CUPTIAPI Requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 1 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
  ++g_outstanding;
}

void CUPTIAPI Completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  while (g.next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
    Seen s;
    switch (r->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(r);
        s.name = k->name ? k->name : "";
        s.start = k->start, s.end = k->end, s.correlation = k->correlationId;
        s.grid = k->gridX * k->gridY * k->gridZ, s.block = k->blockX * k->blockY * k->blockZ;
        if (getenv("E2E_CUPTI_DUMP") != nullptr)
          fprintf(stderr, "dump: kernel %s corr %u start %llu\n", s.name.c_str(), s.correlation,
                  (unsigned long long)s.start);
        g_kernels.push_back(s);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(r);
        s.copy_kind = m->copyKind, s.bytes = m->bytes, s.start = m->start, s.end = m->end;
        s.correlation = m->correlationId;
        g_copies.push_back(s);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(r);
        s.bytes = m->bytes, s.value = m->value, s.start = m->start, s.end = m->end;
        s.correlation = m->correlationId;
        g_memsets.push_back(s);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(r);
        if (getenv("E2E_CUPTI_DUMP") != nullptr)
          fprintf(stderr, "dump: runtime cbid %u corr %u\n", a->cbid, a->correlationId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_OVERHEAD: {
        auto* o = reinterpret_cast<CUpti_ActivityOverhead3*>(r);
        if (getenv("E2E_CUPTI_DUMP") != nullptr)
          fprintf(stderr, "dump: overhead %d corr %u object %d start %llu\n", (int)o->overheadKind,
                  o->correlationId, (int)o->objectKind, (unsigned long long)o->start);
        g_overheads.emplace(static_cast<int>(o->overheadKind), uint32_t{o->correlationId});
        free(o->overheadData);
        break;
      }
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        auto* e = reinterpret_cast<CUpti_ActivityExternalCorrelation*>(r);
        if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
          g_external[e->correlationId] = e->externalId;
        break;
      }
      default:
        break;
    }
  }
  free(buffer);
  --g_outstanding;
}

__global__ void cupti_probe_kernel(int* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = 1; }

// `cupti_activity clock`: timestamps come from the app's callback, a clock of
// its own (two ticks per nanosecond of CLOCK_MONOTONIC, as a TSC might run).
uint64_t TwoTicksPerNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 2 * (static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec) + 12345;
}

uint64_t External(const Seen& s) {
  auto it = g_external.find(s.correlation);
  return it == g_external.end() ? 0 : it->second;
}

}  // namespace

int main(int argc, char** argv) {
  const bool own_clock = argc > 1 && std::string(argv[1]) == "clock";
  e2e::Init("cupti_activity");
  CK(cudaFree(nullptr));
  printf("under_flyt=%d\n", e2e::UnderFlyt() ? 1 : 0);
  e2e::Step("dlopen libcupti");
  void* lib = e2e::OpenCupti();
  e2e::ResolveCupti(lib, "cuptiActivityRegisterCallbacks", &g.register_callbacks);
  e2e::ResolveCupti(lib, "cuptiActivityEnable", &g.enable);
  e2e::ResolveCupti(lib, "cuptiActivityDisable", &g.disable);
  e2e::ResolveCupti(lib, "cuptiActivityFlushAll", &g.flush_all);
  e2e::ResolveCupti(lib, "cuptiActivityGetNextRecord", &g.next_record);
  e2e::ResolveCupti(lib, "cuptiActivityPushExternalCorrelationId", &g.push);
  e2e::ResolveCupti(lib, "cuptiActivityPopExternalCorrelationId", &g.pop);
  e2e::ResolveCupti(lib, "cuptiGetTimestamp", &g.timestamp);

  e2e::Step("enable");
  CUPTI(g.register_callbacks(Requested, Completed));
  if (own_clock) {
    decltype(&cuptiActivityRegisterTimestampCallback) register_clock;
    e2e::ResolveCupti(lib, "cuptiActivityRegisterTimestampCallback", &register_clock);
    CUPTI(register_clock(TwoTicksPerNs));
  }
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                               CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
                               CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_OVERHEAD})
    CUPTI(g.enable(k));

  const size_t kCopy = 1 << 20, kSet = 64 << 10;
  int* dev = nullptr;
  CK(cudaMalloc(&dev, kCopy));
  std::vector<char> host(kCopy, 7);
  uint64_t t0 = 0, t1 = 0;
  CUPTI(g.timestamp(&t0));
  if (own_clock) t0 = TwoTicksPerNs();
  usleep(20000);  // the clocks' rates are compared over some time
  e2e::Step("work");
  CUPTI(g.push(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 4242));
  cupti_probe_kernel<<<3, 64>>>(dev);
  CK(cudaGetLastError());
  CUPTI(g.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, nullptr));
  CUPTI(g.push(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 4343));
  CK(cudaMemcpy(dev, host.data(), kCopy, cudaMemcpyHostToDevice));
  CK(cudaMemset(dev, 0x5a, kSet));
  CK(cudaMemcpy(host.data(), dev, kCopy, cudaMemcpyDeviceToHost));
  uint64_t popped = 0;
  CUPTI(g.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &popped));
  printf("popped=%llu\n", (unsigned long long)popped);
  CK(cudaDeviceSynchronize());
  usleep(20000);
  CUPTI(g.timestamp(&t1));
  if (own_clock) t1 = TwoTicksPerNs();
  e2e::Step("flush");
  // CUPTI asks for a buffer as soon as it records; Kineto flushes only when it
  // has given one out.
  printf("buffers.held_before_flush=%d\n", g_outstanding > 0 ? 1 : 0);
  // Kineto disables its kinds before it flushes: what was recorded still comes.
  CUPTI(g.disable(CUPTI_ACTIVITY_KIND_MEMSET));
  CUPTI(g.flush_all(0));

  int kernels = 0, in_window = 1;
  for (const Seen& k : g_kernels) {
    if (k.name.find("cupti_probe_kernel") == std::string::npos) continue;
    ++kernels;
    printf("kernel.grid=%d\nkernel.block=%d\nkernel.external=%llu\n", k.grid, k.block,
           (unsigned long long)External(k));
    in_window &= t0 <= k.start && k.start <= k.end && k.end <= t1;
  }
  printf("kernel.count=%d\n", kernels);
  // The kernel's first launch loads it (lazy loading, the driver's default): an
  // overhead of that launch, as torch.profiler counts in its operator's device time.
  int lazy_load_linked = 0;
  for (const Seen& k : g_kernels) {
    if (k.name.find("cupti_probe_kernel") == std::string::npos) continue;
    auto range = g_overheads.equal_range(CUPTI_ACTIVITY_OVERHEAD_LAZY_FUNCTION_LOADING);
    for (auto it = range.first; it != range.second; ++it)
      lazy_load_linked |= it->second == k.correlation;
  }
  printf("overhead.lazy_loading_of_kernel=%d\n", lazy_load_linked);
  printf("overhead.buffer_request=%d\n",
         g_overheads.count(CUPTI_ACTIVITY_OVERHEAD_ACTIVITY_BUFFER_REQUEST) > 0 ? 1 : 0);
  int htod = 0, dtoh = 0;
  for (const Seen& c : g_copies) {
    bool mine = c.bytes == kCopy && External(c) == 4343;
    htod += mine && c.copy_kind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    dtoh += mine && c.copy_kind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
    in_window &= t0 <= c.start && c.start <= c.end && c.end <= t1;
  }
  printf("memcpy.htod=%d\nmemcpy.dtoh=%d\n", htod, dtoh);
  int sets = 0;
  for (const Seen& m : g_memsets) {
    sets += m.bytes == kSet && m.value == 0x5a && External(m) == 4343;
    in_window &= t0 <= m.start && m.start <= m.end && m.end <= t1;
  }
  printf("memset.count=%d\ntimestamps.in_window=%d\n", sets, in_window);

  e2e::Step("disabled");
  CUPTI(g.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  size_t before = g_kernels.size();
  cupti_probe_kernel<<<1, 32>>>(dev);
  CK(cudaDeviceSynchronize());
  CUPTI(g.flush_all(0));
  printf("disabled.new_kernels=%zu\n", g_kernels.size() - before);
  CUptiResult empty = g.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, nullptr);
  printf("pop_empty=%d\n", (int)empty);
  CK(cudaFree(dev));
  e2e::Pass();
  return 0;
}
