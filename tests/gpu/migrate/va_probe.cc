// Probes how the CUDA driver places device virtual addresses in a process
// without ASLR (as flyt-server's workers run), to decide how a migrated
// session's addresses can be made free on its target. Native only: built and
// run on the GPU machine (tests/gpu/migrate/va_probe.sh), never by CI.
//
//   va_probe parent           allocates, prints addresses and the host
//                             mappings that hold them, then runs the children
//   va_probe child MODE ADDR  MODE: fresh | perturbed | placeholder
#include <cuda.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {

void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* s = nullptr;
    cuGetErrorString(r, &s);
    std::printf("  %s failed: %d %s\n", what, static_cast<int>(r), s ? s : "?");
  }
}

// The /proc/self/maps line that holds `addr`, or "(not mapped)".
std::string MappingOf(uint64_t addr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uint64_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64, &lo, &hi) == 2 && addr >= lo &&
        addr < hi) {
      char size[32];
      std::snprintf(size, sizeof(size), " [%" PRIu64 " MiB]", (hi - lo) >> 20);
      return line + size;
    }
  }
  return "(not mapped)";
}

void Context() {
  Check(cuInit(0), "cuInit");
  CUcontext ctx = nullptr;
  Check(cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

void TryReserve(uint64_t hint, size_t size, const char* label) {
  CUdeviceptr got = 0;
  CUresult r = cuMemAddressReserve(&got, size, 0, hint, 0);
  std::printf("  reserve %s hint 0x%" PRIx64 " size %zu MiB -> rc %d got 0x%llx %s\n", label, hint,
              size >> 20, static_cast<int>(r), static_cast<unsigned long long>(got),
              got == hint ? "(HONOURED)" : "(moved)");
  if (r == CUDA_SUCCESS) {
    std::printf("    now mapped as: %s\n", MappingOf(got).c_str());
    cuMemAddressFree(got, size);
  }
}

int Child(const char* mode, uint64_t x) {
  std::printf("child %s, target 0x%" PRIx64 "\n", mode, x);
  const size_t hole = 256ull << 20;
  if (std::strcmp(mode, "perturbed") == 0) {
    void* p = mmap(nullptr, 1ull << 30, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::printf("  host mmap 1 GiB at %p before cuInit\n", p);
  }
  void* ph = nullptr;
  if (std::strcmp(mode, "placeholder") == 0) {
    ph = mmap(reinterpret_cast<void*>(x), hole, PROT_NONE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    std::printf("  placeholder at %p (%s)\n", ph, ph == MAP_FAILED ? std::strerror(errno) : "ok");
  }
  std::printf("  before cuInit: %s\n", MappingOf(x).c_str());
  Context();
  std::printf("  after context: %s\n", MappingOf(x).c_str());
  CUdeviceptr a = 0;
  Check(cuMemAlloc(&a, 2 << 20), "cuMemAlloc");
  std::printf("  cuMemAlloc(2 MiB) = 0x%llx %s\n", static_cast<unsigned long long>(a),
              MappingOf(a).c_str());
  if (ph != nullptr && ph != MAP_FAILED) munmap(ph, hole);
  TryReserve(x, 2 << 20, "at parent's first allocation");
  TryReserve(x + (64 << 20), 2 << 20, "64 MiB above it");
  return 0;
}

int Parent(const char* self) {
  Context();
  CUdeviceptr a = 0, b = 0, c = 0;
  Check(cuMemAlloc(&a, 2 << 20), "cuMemAlloc a");
  Check(cuMemAlloc(&b, 64 << 20), "cuMemAlloc b");
  Check(cuMemAlloc(&c, 1ull << 30), "cuMemAlloc c");
  std::printf("parent: a=0x%llx %s\n", static_cast<unsigned long long>(a), MappingOf(a).c_str());
  std::printf("parent: b=0x%llx %s\n", static_cast<unsigned long long>(b), MappingOf(b).c_str());
  std::printf("parent: c=0x%llx %s\n", static_cast<unsigned long long>(c), MappingOf(c).c_str());
  size_t stack = 0;
  cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE);
  Check(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 64 << 10), "cuCtxSetLimit");
  CUdeviceptr d = 0;
  Check(cuMemAlloc(&d, 2 << 20), "cuMemAlloc d");
  std::printf("parent: after stack %zu -> 64 KiB, d=0x%llx\n", stack,
              static_cast<unsigned long long>(d));
  TryReserve(0x600000000000ull, 2ull << 30, "far below (0x6000...)");
  TryReserve(0x100000000000ull, 2ull << 30, "low (0x1000...)");
  TryReserve(a + (512ull << 20), 2 << 20, "512 MiB above a");
  TryReserve(a - (512ull << 20), 2 << 20, "512 MiB below a");
  std::printf("parent maps with 'PROT_NONE'-like large regions:\n");
  {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      uint64_t lo = 0, hi = 0;
      if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64, &lo, &hi) == 2 &&
          hi - lo >= (1ull << 30))
        std::printf("  %s [%" PRIu64 " GiB]\n", line.c_str(), (hi - lo) >> 30);
    }
  }
  std::fflush(stdout);
  for (const char* mode : {"fresh", "perturbed", "placeholder"}) {
    char arg[32];
    std::snprintf(arg, sizeof(arg), "%llx", static_cast<unsigned long long>(a));
    pid_t pid = fork();
    if (pid == 0) {
      execl(self, self, "child", mode, arg, static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // As flyt-server's workers: no address randomization (re-exec once).
  if (std::getenv("VA_PROBE_NORAND") == nullptr) {
    setenv("VA_PROBE_NORAND", "1", 1);
    personality(ADDR_NO_RANDOMIZE);
    execv("/proc/self/exe", argv);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc >= 4 && std::strcmp(argv[1], "child") == 0)
    return Child(argv[2], std::strtoull(argv[3], nullptr, 16));
  return Parent("/proc/self/exe");
}
