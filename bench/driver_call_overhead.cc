// driver_call_overhead: the CPU cost of one cheap driver call (cuCtxGetCurrent, answered
// inside libcuda) through a given libcuda.so.1, to price the wrappers that report driver
// calls to CUPTI's driver domain (src/client/gen_driver_trace.py): without a subscriber,
// with a subscriber to another driver call, and with one to this call.
//
// Owns: nothing but its own measurement; needs no server and no GPU.
// Build: g++ -std=c++17 -O2 -I/usr/local/cuda/include bench/driver_call_overhead.cc -ldl
// Usage: driver_call_overhead LIBCUDA [LIBCUPTI none|other|this] [CALLS]
//   (with LIBCUPTI, put LIBCUDA's directory on LD_LIBRARY_PATH: Flyt's libcupti opens
//   libcuda.so.1 by name). Prints the best of 7 rounds in ns per call.
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

void CUPTIAPI Ignore(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

template <typename F>
F Resolve(void* lib, const char* name) {
  auto f = reinterpret_cast<F>(dlsym(lib, name));
  if (f == nullptr) {
    std::fprintf(stderr, "driver_call_overhead: %s not found\n", name);
    std::exit(1);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s LIBCUDA [LIBCUPTI none|other|this] [CALLS]\n", argv[0]);
    return 2;
  }
  void* cuda = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (cuda == nullptr) {
    std::fprintf(stderr, "driver_call_overhead: %s\n", dlerror());
    return 1;
  }
  auto get = Resolve<CUresult (*)(CUcontext*)>(cuda, "cuCtxGetCurrent");
  std::string mode = "none";
  if (argc >= 4) {
    mode = argv[3];
    void* cupti = dlopen(argv[2], RTLD_NOW);
    if (cupti == nullptr) {
      std::fprintf(stderr, "driver_call_overhead: %s\n", dlerror());
      return 1;
    }
    auto subscribe = Resolve<decltype(&cuptiSubscribe)>(cupti, "cuptiSubscribe");
    auto enable = Resolve<decltype(&cuptiEnableCallback)>(cupti, "cuptiEnableCallback");
    CUpti_SubscriberHandle sub = nullptr;
    CUpti_CallbackId cbid =
        mode == "this" ? CUPTI_DRIVER_TRACE_CBID_cuCtxGetCurrent : CUPTI_DRIVER_TRACE_CBID_cuInit;
    if (subscribe(&sub, Ignore, nullptr) != CUPTI_SUCCESS ||
        (mode != "none" && enable(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, cbid) != CUPTI_SUCCESS)) {
      std::fprintf(stderr, "driver_call_overhead: subscribing failed\n");
      return 1;
    }
  }
  const long calls = argc >= 5 ? std::atol(argv[4]) : (mode == "none" ? 30000000 : 2000000);
  double best = 1e9;
  for (int round = 0; round < 7; ++round) {
    CUcontext ctx = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) {
      if (get(&ctx) != CUDA_SUCCESS) return 1;
      asm volatile("" ::: "memory");
    }
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / calls;
    if (ns < best) best = ns;
  }
  std::printf("cuCtxGetCurrent, subscriber %s: %.2f ns/call (best of 7 x %ld)\n", mode.c_str(),
              best, calls);
  return 0;
}
