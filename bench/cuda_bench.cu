// cuda_bench: CUDA runtime-API micro-benchmarks, run natively and through Flyt.
//
// Usage: cuda_bench [--quick F] [--device N] [--bw-mib M] GROUP...
//   GROUP: launch | memcpy | bw | bwasync | malloc | query | init | idle | all
//   --quick F   scales iteration counts and time budgets by F (0 < F <= 1; default 1)
//   idle only:  --hold S (seconds, default 30) --release-file PATH (exit once PATH exists)
//
// Prints one machine-readable line per figure on stdout:
//   RESULT <name> <value> <unit>
// plus `INFO ...` lines. Every CUDA call is checked; on error the program prints
// `ERROR ...` to stderr and exits with status 2. Each loop is bounded both by an
// iteration count and by a time budget, so one invocation of `all` stays under ~60 s
// even when every CUDA call costs 50 us.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

namespace {

#define CHECK(call)                                                                           \
  do {                                                                                        \
    cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "ERROR %s:%d %s: %s (%d): %s\n", __FILE__, __LINE__, #call,        \
                   cudaGetErrorName(err_), static_cast<int>(err_), cudaGetErrorString(err_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

struct Options {
  double quick = 1.0;
  int device = 0;
  size_t bw_bytes = size_t{256} << 20;
  double hold_s = 30.0;
  std::string release_file;
};
Options g_opt;

// Iteration cap and time budget, both scaled by --quick.
long Iters(long n) { return std::max<long>(1, static_cast<long>(n * g_opt.quick)); }
double Budget(double s) { return s * g_opt.quick; }

void Result(const char* name, double value, const char* unit) {
  std::printf("RESULT %s %.6g %s\n", name, value, unit);
  std::fflush(stdout);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

__global__ void EmptyKernel() {}

__global__ void StoreKernel(unsigned* out, unsigned value) { *out = value; }

void Launch(cudaStream_t s) {
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&EmptyKernel), dim3(1), dim3(1), nullptr, 0,
                         s));
}

// Checks that kernels really run (the sim backend of flyt-server does not run them).
void VerifyKernelExecution() {
  unsigned* d = nullptr;
  CHECK(cudaMalloc(&d, sizeof(unsigned)));
  CHECK(cudaMemset(d, 0, sizeof(unsigned)));
  const unsigned kMagic = 0x5eed1234u;
  StoreKernel<<<1, 1>>>(d, kMagic);
  CHECK(cudaGetLastError());
  unsigned h = 0;
  CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  if (h != kMagic) std::fprintf(stderr, "WARN kernel did not run (read 0x%x)\n", h);
  Result("kernel_verified", h == kMagic ? 1 : 0, "bool");
}

void BenchLaunch() {
  cudaStream_t s = 0;  // legacy default stream, as most applications use
  for (int i = 0; i < 1000; ++i) Launch(s);
  CHECK(cudaStreamSynchronize(s));

  // Async throughput: many launches, then one synchronize.
  const long n_max = Iters(100000);
  const double budget = Budget(5.0);
  long n = 0;
  auto t0 = Clock::now();
  while (n < n_max) {
    for (int i = 0; i < 1000 && n < n_max; ++i, ++n) Launch(s);
    if (SecondsSince(t0) > budget) break;
  }
  auto t_issue = Clock::now();
  CHECK(cudaStreamSynchronize(s));
  auto t_end = Clock::now();
  Result("launch_async_us", Micros(t0, t_end) / n, "us");
  Result("launch_issue_us", Micros(t0, t_issue) / n, "us");
  Result("launch_async_count", static_cast<double>(n), "launches");

  // Launch + synchronize latency.
  for (int i = 0; i < 100; ++i) {
    Launch(s);
    CHECK(cudaStreamSynchronize(s));
  }
  std::vector<double> lat;
  const long m_max = Iters(20000);
  const double budget2 = Budget(3.0);
  lat.reserve(m_max);
  auto tb = Clock::now();
  for (long i = 0; i < m_max; ++i) {
    auto a = Clock::now();
    Launch(s);
    CHECK(cudaStreamSynchronize(s));
    auto b = Clock::now();
    lat.push_back(Micros(a, b));
    if (Micros(tb, b) > budget2 * 1e6) break;
  }
  Result("launch_sync_us", Median(lat), "us");
  Result("launch_sync_p99_us", Percentile(lat, 0.99), "us");
  Result("launch_sync_min_us", *std::min_element(lat.begin(), lat.end()), "us");
  VerifyKernelExecution();
}

void BenchMemcpySmall() {
  unsigned* d = nullptr;
  CHECK(cudaMalloc(&d, sizeof(unsigned)));
  auto* h = static_cast<unsigned*>(std::malloc(sizeof(unsigned)));
  *h = 0;
  for (int i = 0; i < 100; ++i) {
    CHECK(cudaMemcpy(d, h, sizeof(unsigned), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(h, d, sizeof(unsigned), cudaMemcpyDeviceToHost));
  }
  const long n_max = Iters(20000);
  const double budget = Budget(3.0);
  std::vector<double> lat;
  lat.reserve(n_max);

  unsigned last = 0;
  auto tb = Clock::now();
  for (long i = 0; i < n_max; ++i) {
    *h = last = static_cast<unsigned>(i) * 2654435761u + 1;
    auto a = Clock::now();
    CHECK(cudaMemcpy(d, h, sizeof(unsigned), cudaMemcpyHostToDevice));
    auto b = Clock::now();
    lat.push_back(Micros(a, b));
    if (Micros(tb, b) > budget * 1e6) break;
  }
  Result("memcpy_h2d_4b_us", Median(lat), "us");

  lat.clear();
  bool ok = true;
  tb = Clock::now();
  for (long i = 0; i < n_max; ++i) {
    *h = 0;
    auto a = Clock::now();
    CHECK(cudaMemcpy(h, d, sizeof(unsigned), cudaMemcpyDeviceToHost));
    auto b = Clock::now();
    ok = ok && *h == last;
    lat.push_back(Micros(a, b));
    if (Micros(tb, b) > budget * 1e6) break;
  }
  Result("memcpy_d2h_4b_us", Median(lat), "us");
  if (!ok) std::fprintf(stderr, "WARN 4-byte D2H read back a wrong value\n");
  Result("memcpy_4b_verified", ok ? 1 : 0, "bool");
  std::free(h);
  CHECK(cudaFree(d));
}

void FillPattern(unsigned char* p, size_t n) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(i);
}

// Times one synchronous copy, including a device synchronize so that the data has
// really arrived (a pageable H2D cudaMemcpy may return before its last DMA finishes).
double TimedCopy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  auto a = Clock::now();
  CHECK(cudaMemcpy(dst, src, n, kind));
  CHECK(cudaDeviceSynchronize());
  return std::chrono::duration<double>(Clock::now() - a).count();
}

void BenchBandwidthKind(bool pinned) {
  const size_t n = g_opt.bw_bytes;
  const char* kind = pinned ? "pinned" : "pageable";
  unsigned char* src = nullptr;
  unsigned char* dst = nullptr;
  if (pinned) {
    CHECK(cudaMallocHost(&src, n));
    CHECK(cudaMallocHost(&dst, n));
  } else {
    src = static_cast<unsigned char*>(std::malloc(n));
    dst = static_cast<unsigned char*>(std::malloc(n));
    if (!src || !dst) {
      std::fprintf(stderr, "ERROR malloc(%zu) failed\n", n);
      std::exit(2);
    }
  }
  FillPattern(src, n);
  std::memset(dst, 0, n);  // touch every page before timing
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, n));

  // Warm-up round trip, verified.
  TimedCopy(dev, src, n, cudaMemcpyHostToDevice);
  TimedCopy(dst, dev, n, cudaMemcpyDeviceToHost);
  bool ok = std::memcmp(src, dst, n) == 0;
  if (!ok) std::fprintf(stderr, "WARN %s 256 MiB round trip corrupted data\n", kind);
  std::string name = std::string("bw_") + kind + "_verified";
  Result(name.c_str(), ok ? 1 : 0, "bool");

  const int reps_max = std::max(2, static_cast<int>(5 * g_opt.quick));
  const double budget = std::max(Budget(6.0), 0.5);
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<double> gbps;
    auto t0 = Clock::now();
    for (int r = 0; r < reps_max; ++r) {
      double s = dir == 0 ? TimedCopy(dev, src, n, cudaMemcpyHostToDevice)
                          : TimedCopy(dst, dev, n, cudaMemcpyDeviceToHost);
      gbps.push_back(static_cast<double>(n) / s / 1e9);
      if (r >= 1 && SecondsSince(t0) > budget) break;
    }
    std::string base = std::string(dir == 0 ? "h2d_" : "d2h_") + kind;
    Result((base + "_gbps").c_str(), *std::max_element(gbps.begin(), gbps.end()), "GB/s");
    Result((base + "_median_gbps").c_str(), Median(gbps), "GB/s");
  }
  CHECK(cudaFree(dev));
  if (pinned) {
    CHECK(cudaFreeHost(src));
    CHECK(cudaFreeHost(dst));
  } else {
    std::free(src);
    std::free(dst);
  }
}

void BenchBandwidth() {
  BenchBandwidthKind(false);
  BenchBandwidthKind(true);
}

// Asynchronous copies of pinned memory, as frameworks issue them (PyTorch's
// non_blocking copies): how long the call takes to return, the bandwidth of a copy
// followed by a stream synchronize, and how much of a copy overlaps host work done
// between the call and the synchronize (100 %: the copy was hidden entirely).
void BenchBandwidthAsync() {
  const size_t n = g_opt.bw_bytes;
  unsigned char* host = nullptr;
  CHECK(cudaMallocHost(&host, n));
  FillPattern(host, n);
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, n));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Warm-up round trip, verified.
  CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s));
  CHECK(cudaStreamSynchronize(s));  // the buffer is reused next
  std::vector<unsigned char> want(host, host + n);
  std::memset(host, 0, n);
  CHECK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  bool ok = std::memcmp(host, want.data(), n) == 0;
  if (!ok) std::fprintf(stderr, "WARN async pinned round trip corrupted data\n");
  Result("bwasync_verified", ok ? 1 : 0, "bool");
  const int reps = std::max(2, static_cast<int>(5 * g_opt.quick));
  for (int dir = 0; dir < 2; ++dir) {
    const char* base = dir == 0 ? "h2d_pinned_async" : "d2h_pinned_async";
    std::vector<double> call_us, gbps, hidden;
    for (int r = 0; r < reps; ++r) {
      auto a = Clock::now();
      if (dir == 0) {
        CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s));
      } else {
        CHECK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, s));
      }
      auto b = Clock::now();
      CHECK(cudaStreamSynchronize(s));
      auto c = Clock::now();
      call_us.push_back(Micros(a, b));
      const double copy_s = std::chrono::duration<double>(c - a).count();
      gbps.push_back(static_cast<double>(n) / copy_s / 1e9);
      // The same copy with as much host work as the copy took between call and sync.
      auto d = Clock::now();
      if (dir == 0) {
        CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s));
      } else {
        CHECK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, s));
      }
      const auto w = Clock::now();  // host work as long as the copy, once the call returned
      while (std::chrono::duration<double>(Clock::now() - w).count() < copy_s) {
      }
      CHECK(cudaStreamSynchronize(s));
      const double both_s = std::chrono::duration<double>(Clock::now() - d).count();
      // both = copy + work - overlap, work = copy: overlap = 2 copy - both (a call that
      // returns only once the copy is done hides nothing).
      hidden.push_back(std::clamp((2 * copy_s - both_s) / copy_s, 0.0, 1.0) * 100);
    }
    Result((std::string(base) + "_call_us").c_str(), Median(call_us), "us");
    Result((std::string(base) + "_gbps").c_str(), *std::max_element(gbps.begin(), gbps.end()),
           "GB/s");
    Result((std::string(base) + "_hidden_pct").c_str(), Median(hidden), "%");
  }
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(dev));
  CHECK(cudaFreeHost(host));
}

void BenchMalloc() {
  const size_t n = size_t{1} << 20;
  for (int i = 0; i < 10; ++i) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, n));
    CHECK(cudaFree(p));
  }
  const long n_max = Iters(5000);
  const double budget = Budget(2.0);
  std::vector<double> lat;
  lat.reserve(n_max);
  auto tb = Clock::now();
  for (long i = 0; i < n_max; ++i) {
    void* p = nullptr;
    auto a = Clock::now();
    CHECK(cudaMalloc(&p, n));
    CHECK(cudaFree(p));
    auto b = Clock::now();
    lat.push_back(Micros(a, b));
    if (Micros(tb, b) > budget * 1e6) break;
  }
  Result("malloc_free_1m_us", Median(lat), "us");
}

void BenchQuery() {
  cudaDeviceProp ref{};
  CHECK(cudaGetDeviceProperties(&ref, g_opt.device));
  {
    const long n_max = Iters(20000);
    const double budget = Budget(2.0);
    bool ok = true;
    long n = 0;
    auto t0 = Clock::now();
    while (n < n_max) {
      for (int i = 0; i < 64 && n < n_max; ++i, ++n) {
        cudaDeviceProp p{};
        CHECK(cudaGetDeviceProperties(&p, g_opt.device));
        ok = ok && p.multiProcessorCount == ref.multiProcessorCount &&
             std::strcmp(p.name, ref.name) == 0;
      }
      if (SecondsSince(t0) > budget) break;
    }
    Result("get_device_properties_us", Micros(t0, Clock::now()) / n, "us");
    if (!ok) std::fprintf(stderr, "WARN cudaGetDeviceProperties answers changed\n");
  }
  {
    const cudaDeviceAttr attrs[8] = {cudaDevAttrMultiProcessorCount,
                                     cudaDevAttrMaxThreadsPerBlock,
                                     cudaDevAttrComputeCapabilityMajor,
                                     cudaDevAttrComputeCapabilityMinor,
                                     cudaDevAttrWarpSize,
                                     cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                     cudaDevAttrL2CacheSize,
                                     cudaDevAttrConcurrentManagedAccess};
    int expect[8];
    for (int k = 0; k < 8; ++k) CHECK(cudaDeviceGetAttribute(&expect[k], attrs[k], g_opt.device));
    const long n_max = Iters(1000000);
    const double budget = Budget(3.0);
    long n = 0;
    long bad = 0;
    auto t0 = Clock::now();
    while (n < n_max) {
      for (int i = 0; i < 1024 && n < n_max; ++i, ++n) {
        int v = 0;
        CHECK(cudaDeviceGetAttribute(&v, attrs[n & 7], g_opt.device));
        bad += v != expect[n & 7];
      }
      if (SecondsSince(t0) > budget) break;
    }
    Result("device_get_attribute_us", Micros(t0, Clock::now()) / n, "us");
    if (bad) std::fprintf(stderr, "WARN cudaDeviceGetAttribute answers changed (%ld)\n", bad);
  }
}

bool FileExists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

// An idle session: context, one loaded module, one finished kernel; then waits.
void Idle() {
  Launch(0);
  CHECK(cudaStreamSynchronize(0));
  std::printf("READY\n");
  std::fflush(stdout);
  auto t0 = Clock::now();
  while (SecondsSince(t0) < g_opt.hold_s) {
    if (!g_opt.release_file.empty() && FileExists(g_opt.release_file)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

long PeakRssKb() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::strtol(line + 6, nullptr, 10);
  }
  std::fclose(f);
  return kb;
}

int Usage() {
  std::fprintf(stderr,
               "usage: cuda_bench [--quick F] [--device N] [--bw-mib M] [--hold S]\n"
               "                  [--release-file PATH] GROUP...\n"
               "  GROUP: launch memcpy bw bwasync malloc query init idle all\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto t_start = Clock::now();
  std::vector<std::string> groups;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      g_opt.quick = std::atof(next());
      if (!(g_opt.quick > 0 && g_opt.quick <= 1)) return Usage();
    } else if (a == "--device") {
      g_opt.device = std::atoi(next());
    } else if (a == "--bw-mib") {
      g_opt.bw_bytes = static_cast<size_t>(std::atol(next())) << 20;
      if (g_opt.bw_bytes == 0) return Usage();
    } else if (a == "--hold") {
      g_opt.hold_s = std::atof(next());
    } else if (a == "--release-file") {
      g_opt.release_file = next();
    } else if (a == "-h" || a == "--help") {
      return Usage();
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return Usage();
    } else {
      groups.push_back(a);
    }
  }
  if (groups.empty()) groups.push_back("all");
  static const char* const kKnown[] = {"launch", "memcpy", "bw",   "bwasync", "malloc",
                                       "query",  "init",   "idle", "all"};
  for (const auto& g : groups) {
    if (std::none_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return g == k; })) {
      std::fprintf(stderr, "unknown group %s\n", g.c_str());
      return Usage();
    }
  }

  CHECK(cudaSetDevice(g_opt.device));
  CHECK(cudaFree(nullptr));  // forces context creation
  double init_ms = Micros(t_start, Clock::now()) / 1e3;

  int driver = 0, runtime = 0;
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, g_opt.device));
  std::printf("INFO device %d \"%s\" sm_%d%d sms %d driver %d runtime %d quick %g\n", g_opt.device,
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, driver, runtime,
              g_opt.quick);
  std::fflush(stdout);

  for (const auto& g : groups) {
    bool all = g == "all";
    if (g == "init" || all) {
      Result("init_ms", init_ms, "ms");
      auto a = Clock::now();
      Launch(0);
      CHECK(cudaStreamSynchronize(0));
      Result("first_launch_sync_ms", Micros(a, Clock::now()) / 1e3, "ms");
    }
    if (g == "launch" || all) BenchLaunch();
    if (g == "memcpy" || all) BenchMemcpySmall();
    if (g == "bw" || all) BenchBandwidth();
    if (g == "bwasync" || all) BenchBandwidthAsync();
    if (g == "malloc" || all) BenchMalloc();
    if (g == "query" || all) BenchQuery();
    if (g == "idle") Idle();
  }
  CHECK(cudaDeviceSynchronize());
  Result("peak_rss_kb", static_cast<double>(PeakRssKb()), "kB");
  Result("wall_s", SecondsSince(t_start), "s");
  return 0;
}
