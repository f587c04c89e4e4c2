// shm_latency: the latency of small synchronous driver calls through a given libcuda.so.1:
// device-to-host copies of 4 B, 4 KiB and 64 KiB into pageable memory (cuMemcpyDtoH), a 4-byte
// host-to-device copy, an empty kernel launch + cuStreamSynchronize, cuStreamQuery and
// cuCtxSynchronize with nothing pending (one bare round trip through Flyt), and the per-launch
// cost of many asynchronous launches, back to back and paced by host work (launch_paced: a
// decoder's launch every 15 us, which is what the client's message batching is tuned for). Several
// libraries run in one invocation, each in a child process of its own, so the real driver and
// Flyt's client library are compared in the same run.
//
// Owns: nothing but its own measurement. Driver API only (dlopen'd), the kernel is PTX text
// (JIT-compiled by the driver; flyt-server --backend sim reads its .entry), so it needs neither
// nvcc nor cudart.
// Build: bench/build.sh OUTDIR, or
//   g++ -std=c++17 -O2 -I/usr/local/cuda/include bench/shm_latency.cc -ldl -o shm_latency
// Usage: shm_latency [--seconds S] [--iters N] [--only a,b] LABEL=LIBCUDA [LABEL=LIBCUDA ...]
//   e.g. shm_latency native=/usr/lib/x86_64-linux-gnu/libcuda.so.1 flyt=BUILD/lib/libcuda.so.1
//   (the Flyt child finds its server through FLYT_SERVER as usual; the real driver ignores it).
// Prints one "RESULT label test median_us p10_us p99_us min_us samples" line per test and
// library, then a table with each library's median against the first one's (ratio and
// difference).
#include <cuda.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

// An empty kernel; PTX ISA 7.0 for sm_80 JIT-compiles on every driver of CUDA 11 and later.
const char kPtx[] =
    ".version 7.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    ".visible .entry flyt_empty()\n"
    "{\n"
    "  ret;\n"
    "}\n";

using Clock = std::chrono::steady_clock;

struct Options {
  double seconds = 2.0;  // per test
  long iters = 20000;    // per test, at most
  std::vector<std::string> only;
};

struct Api {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxSynchronize)();
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamQuery)(CUstream);
};

template <typename F>
bool Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) std::fprintf(stderr, "shm_latency: %s not found\n", name);
  return *out != nullptr;
}

bool Load(const char* path, Api* a) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "shm_latency: %s\n", dlerror());
    return false;
  }
  return Resolve(lib, "cuInit", &a->Init) && Resolve(lib, "cuDeviceGet", &a->DeviceGet) &&
         Resolve(lib, "cuDevicePrimaryCtxRetain", &a->PrimaryCtxRetain) &&
         Resolve(lib, "cuCtxSetCurrent", &a->CtxSetCurrent) &&
         Resolve(lib, "cuCtxSynchronize", &a->CtxSynchronize) &&
         Resolve(lib, "cuMemAlloc_v2", &a->MemAlloc) && Resolve(lib, "cuMemFree_v2", &a->MemFree) &&
         Resolve(lib, "cuMemsetD32_v2", &a->MemsetD32) &&
         Resolve(lib, "cuMemcpyDtoH_v2", &a->MemcpyDtoH) &&
         Resolve(lib, "cuMemcpyHtoD_v2", &a->MemcpyHtoD) &&
         Resolve(lib, "cuModuleLoadData", &a->ModuleLoadData) &&
         Resolve(lib, "cuModuleGetFunction", &a->ModuleGetFunction) &&
         Resolve(lib, "cuLaunchKernel", &a->LaunchKernel) &&
         Resolve(lib, "cuStreamSynchronize", &a->StreamSynchronize) &&
         Resolve(lib, "cuStreamQuery", &a->StreamQuery);
}

#define CHECK(call)                                                              \
  do {                                                                           \
    CUresult rc_ = (call);                                                       \
    if (rc_ != CUDA_SUCCESS) {                                                   \
      std::fprintf(stderr, "shm_latency: %s failed with %d\n", #call, int(rc_)); \
      std::_Exit(1);                                                             \
    }                                                                            \
  } while (0)

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

bool Wanted(const Options& o, const char* test) {
  return o.only.empty() || std::find(o.only.begin(), o.only.end(), test) != o.only.end();
}

// Times `op` one call at a time after a warm-up; writes a RESULT line to `out`.
template <typename Op>
void Measure(const Options& o, FILE* out, const char* label, const char* test, Op op) {
  if (!Wanted(o, test)) return;
  for (int i = 0; i < 200; ++i) op();
  std::vector<double> lat;
  lat.reserve(static_cast<size_t>(o.iters));
  const auto start = Clock::now();
  for (long i = 0; i < o.iters; ++i) {
    const auto a = Clock::now();
    op();
    const auto b = Clock::now();
    lat.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    if (std::chrono::duration<double>(b - start).count() > o.seconds) break;
  }
  std::fprintf(out, "RESULT %s %s %.3f %.3f %.3f %.3f %zu\n", label, test, Percentile(lat, 0.5),
               Percentile(lat, 0.1), Percentile(lat, 0.99), Percentile(lat, 0.0), lat.size());
  std::fflush(out);
}

// One library, in this (child) process.
int RunOne(const Options& o, const char* label, const char* path, FILE* out) {
  Api a{};
  if (!Load(path, &a)) return 1;
  CHECK(a.Init(0));
  CUdevice dev = 0;
  CHECK(a.DeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CHECK(a.PrimaryCtxRetain(&ctx, dev));
  CHECK(a.CtxSetCurrent(ctx));
  CUmodule mod = nullptr;
  CHECK(a.ModuleLoadData(&mod, kPtx));
  CUfunction fn = nullptr;
  CHECK(a.ModuleGetFunction(&fn, mod, "flyt_empty"));
  constexpr size_t kBig = 64 << 10;
  CUdeviceptr d = 0;
  CHECK(a.MemAlloc(&d, kBig));
  CHECK(a.MemsetD32(d, 0x5eed1234u, kBig / 4));
  std::vector<unsigned> host(kBig / 4, 0);
  CHECK(a.MemcpyDtoH(host.data(), d, kBig));
  if (host.front() != 0x5eed1234u || host.back() != 0x5eed1234u)
    std::fprintf(stderr, "shm_latency: %s: WARN device-to-host copy read back a wrong value\n",
                 label);

  Measure(o, out, label, "d2h_4b", [&] { CHECK(a.MemcpyDtoH(host.data(), d, 4)); });
  Measure(o, out, label, "d2h_4k", [&] { CHECK(a.MemcpyDtoH(host.data(), d, 4096)); });
  Measure(o, out, label, "d2h_64k", [&] { CHECK(a.MemcpyDtoH(host.data(), d, kBig)); });
  Measure(o, out, label, "h2d_4b", [&] { CHECK(a.MemcpyHtoD(d, host.data(), 4)); });
  CHECK(a.CtxSynchronize());
  Measure(o, out, label, "launch_sync", [&] {
    CHECK(a.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
    CHECK(a.StreamSynchronize(nullptr));
  });
  Measure(o, out, label, "stream_query", [&] { CHECK(a.StreamQuery(nullptr)); });
  Measure(o, out, label, "ctx_sync", [&] { CHECK(a.CtxSynchronize()); });
  if (Wanted(o, "launch_async")) {
    // Per-launch cost of a burst: 1000 launches, then one synchronize, repeated.
    std::vector<double> per;
    const auto start = Clock::now();
    for (int round = 0; round < 1000; ++round) {
      const auto t0 = Clock::now();
      for (int i = 0; i < 1000; ++i)
        CHECK(a.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
      CHECK(a.StreamSynchronize(nullptr));
      const auto t1 = Clock::now();
      if (round > 0)
        per.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 1000);
      if (std::chrono::duration<double>(t1 - start).count() > o.seconds) break;
    }
    std::fprintf(out, "RESULT %s launch_async %.3f %.3f %.3f %.3f %zu\n", label,
                 Percentile(per, 0.5), Percentile(per, 0.1), Percentile(per, 0.99),
                 Percentile(per, 0.0), per.size());
    std::fflush(out);
  }
  if (Wanted(o, "launch_paced")) {
    // A decoder's pattern: a launch after every 15 us of host work, a 4-byte device-to-host
    // copy after every 100 launches; the cost per launch above the host work, per round of 100.
    constexpr double kWorkUs = 15.0;
    std::vector<double> per;
    const auto start = Clock::now();
    for (int round = 0; round < 100000; ++round) {
      const auto t0 = Clock::now();
      for (int i = 0; i < 100; ++i) {
        CHECK(a.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
        const auto w = Clock::now();
        while (std::chrono::duration<double, std::micro>(Clock::now() - w).count() < kWorkUs) {
        }
      }
      CHECK(a.MemcpyDtoH(host.data(), d, 4));
      const auto t1 = Clock::now();
      if (round > 0)
        per.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 100 - kWorkUs);
      if (std::chrono::duration<double>(t1 - start).count() > o.seconds) break;
    }
    std::fprintf(out, "RESULT %s launch_paced %.3f %.3f %.3f %.3f %zu\n", label,
                 Percentile(per, 0.5), Percentile(per, 0.1), Percentile(per, 0.99),
                 Percentile(per, 0.0), per.size());
    std::fflush(out);
  }
  CHECK(a.MemFree(d));
  return 0;
}

struct Row {
  double median = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::vector<std::pair<std::string, std::string>> libs;  // label, path
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--seconds" && i + 1 < argc) {
      o.seconds = std::atof(argv[++i]);
    } else if (arg == "--iters" && i + 1 < argc) {
      o.iters = std::atol(argv[++i]);
    } else if (arg == "--only" && i + 1 < argc) {
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        if (comma > at) o.only.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (!arg.empty() && arg[0] != '-') {
      size_t eq = arg.find('=');
      if (eq == std::string::npos) {
        libs.emplace_back("lib" + std::to_string(libs.size()), arg);
      } else {
        libs.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
      }
    } else {
      libs.clear();
      break;
    }
  }
  if (libs.empty() || o.iters <= 0 || o.seconds <= 0) {
    std::fprintf(stderr,
                 "usage: %s [--seconds S] [--iters N] [--only test,...] LABEL=LIBCUDA ...\n"
                 "tests: d2h_4b d2h_4k d2h_64k h2d_4b launch_sync stream_query ctx_sync "
                 "launch_async launch_paced\n",
                 argv[0]);
    return 2;
  }
  // Each library in a child of its own: two driver libraries never share a process.
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, Row>> results;  // test -> label -> row
  int status_all = 0;
  for (const auto& [label, path] : libs) {
    int fds[2];
    if (pipe(fds) != 0) return 1;
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      close(fds[0]);
      FILE* out = fdopen(fds[1], "w");
      std::_Exit(out != nullptr ? RunOne(o, label.c_str(), path.c_str(), out) : 1);
    }
    close(fds[1]);
    FILE* in = fdopen(fds[0], "r");
    char line[512];
    while (in != nullptr && std::fgets(line, sizeof(line), in) != nullptr) {
      std::fputs(line, stdout);
      char lab[128], test[64];
      double med = 0;
      if (std::sscanf(line, "RESULT %127s %63s %lf", lab, test, &med) == 3) {
        if (results.find(test) == results.end()) order.push_back(test);
        results[test][lab].median = med;
      }
    }
    if (in != nullptr) std::fclose(in);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "shm_latency: %s (%s) failed\n", label.c_str(), path.c_str());
      status_all = 1;
    }
  }
  // The table: medians in microseconds; against the first library.
  const std::string& base = libs.front().first;
  std::printf("\n| test (median, us) |");
  for (const auto& l : libs) std::printf(" %s |", l.first.c_str());
  for (size_t i = 1; i < libs.size(); ++i)
    std::printf(" %s/%s | %s-%s |", libs[i].first.c_str(), base.c_str(), libs[i].first.c_str(),
                base.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < libs.size() + 2 * (libs.size() - 1); ++i) std::printf("---:|");
  std::printf("\n");
  for (const std::string& test : order) {
    auto& row = results[test];
    std::printf("| %s |", test.c_str());
    for (const auto& l : libs) {
      auto it = row.find(l.first);
      if (it == row.end()) {
        std::printf(" n/a |");
      } else {
        std::printf(" %.2f |", it->second.median);
      }
    }
    for (size_t i = 1; i < libs.size(); ++i) {
      auto b = row.find(base), x = row.find(libs[i].first);
      if (b == row.end() || x == row.end() || b->second.median <= 0) {
        std::printf(" n/a | n/a |");
      } else {
        std::printf(" %.2fx | %+.2f |", x->second.median / b->second.median,
                    x->second.median - b->second.median);
      }
    }
    std::printf("\n");
  }
  return status_all;
}
