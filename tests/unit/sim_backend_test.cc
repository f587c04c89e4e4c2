// Tests for server/sim_backend: the sticky fault that a launch of a kernel
// named *flyt_sim_fault* leaves in its process, CUDA IPC of memory and events
// between processes, with the driver's answers to misuse, context events
// (cuCtxRecordEvent / cuCtxWaitEvent), memory pools, texture and surface
// objects, and the dynamic shared memory opt-in at launch.
//
// Each case runs the sim in processes of its own (fork): a fault is sticky for
// the whole process, and IPC needs two. A child reports its gtest failures on
// its own stdout and through its exit status.
//
// Owns: nothing but these tests.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "server/driver_api.h"

namespace flyt::server {
namespace {

// A kernel that faults, one that does not, and a device global.
constexpr char kPtx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry flyt_sim_fault_here(.param .u64 p) { ret; }\n"
    ".visible .entry harmless(.param .u64 p) { ret; }\n";

// Runs `body` in a child process; a failure there fails the test here.
void InChild(const std::function<void()>& body) {
  fflush(stdout);
  pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork: " << strerror(errno);
  if (pid == 0) {
    body();
    fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child process failed (status 0x" << std::hex << status << "; its failures are above)";
}

class SimBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(LoadSimDriver(SimOptions{}, &api_).ok());
    ASSERT_EQ(api_.cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }

  // The kernel of the PTX above whose name is `name`.
  CUfunction Kernel(CUlibrary lib, const std::string& name) {
    unsigned n = 0;
    EXPECT_EQ(api_.cuLibraryGetKernelCount(&n, lib), CUDA_SUCCESS);
    std::vector<CUkernel> ks(n);
    EXPECT_EQ(api_.cuLibraryEnumerateKernels(ks.data(), n, lib), CUDA_SUCCESS);
    for (CUkernel k : ks) {
      const char* got = nullptr;
      if (api_.cuKernelGetName(&got, k) == CUDA_SUCCESS && name == got)
        return reinterpret_cast<CUfunction>(k);
    }
    ADD_FAILURE() << "no kernel " << name;
    return nullptr;
  }

  CUresult Launch(CUfunction f, CUstream s = nullptr, unsigned shared = 0) {
    CUlaunchConfig cfg{};
    cfg.sharedMemBytes = shared;
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    alignas(8) uint64_t arg = 0;
    size_t size = sizeof(arg);
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &arg, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    return api_.cuLaunchKernelEx(&cfg, f, nullptr, extra);
  }

  DriverApi api_;
  CUcontext ctx_ = nullptr;
};

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
  return v;
}

// ---------------------------------------------------------------------------
// Dynamic shared memory: above 48 KiB a launch needs the handle's opt-in, as with
// the driver (a kernel's copy on another server has its own).

TEST_F(SimBackend, DynamicSharedMemoryAbove48KiBNeedsTheOptIn) {
  InChild([&] {
    CUlibrary lib = nullptr, copy = nullptr;
    ASSERT_EQ(api_.cuLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0),
              CUDA_SUCCESS);
    ASSERT_EQ(api_.cuLibraryLoadData(&copy, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0),
              CUDA_SUCCESS);
    CUfunction f = Kernel(lib, "harmless"), other = Kernel(copy, "harmless");
    EXPECT_EQ(Launch(f, nullptr, 48 << 10), CUDA_SUCCESS);
    EXPECT_EQ(Launch(f, nullptr, 64 << 10), CUDA_ERROR_INVALID_VALUE);
    ASSERT_EQ(api_.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 << 10,
                                        reinterpret_cast<CUkernel>(f), 0),
              CUDA_SUCCESS);
    EXPECT_EQ(Launch(f, nullptr, 64 << 10), CUDA_SUCCESS);
    EXPECT_EQ(Launch(f, nullptr, (64 << 10) + 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(Launch(other, nullptr, 64 << 10), CUDA_ERROR_INVALID_VALUE);  // not its opt-in
  });
}

// ---------------------------------------------------------------------------
// Sticky fault

TEST_F(SimBackend, FaultKernelBreaksTheProcessForGood) {
  InChild([&] {
    CUdeviceptr d = 0, d2 = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&d, 4096), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuMemAlloc_v2(&d2, 4096), CUDA_SUCCESS);
    CUstream s = nullptr;
    ASSERT_EQ(api_.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    CUevent e = nullptr;
    ASSERT_EQ(api_.cuEventCreate(&e, 0), CUDA_SUCCESS);
    CUlibrary lib = nullptr;
    ASSERT_EQ(api_.cuLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0),
              CUDA_SUCCESS);
    CUfunction harmless = Kernel(lib, "harmless");
    CUfunction faulty = Kernel(lib, "flyt_sim_fault_here");
    ASSERT_EQ(Launch(harmless), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);

    EXPECT_EQ(Launch(faulty, s), CUDA_SUCCESS);  // the launch itself succeeds
    constexpr CUresult kSticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    EXPECT_EQ(api_.cuCtxSynchronize(), kSticky);
    EXPECT_EQ(api_.cuCtxSynchronize(), kSticky);  // and stays
    EXPECT_EQ(api_.cuStreamSynchronize(s), kSticky);
    EXPECT_EQ(api_.cuStreamSynchronize(nullptr), kSticky);
    EXPECT_EQ(api_.cuStreamQuery(s), kSticky);
    EXPECT_EQ(api_.cuEventRecord(e, s), kSticky);
    EXPECT_EQ(api_.cuEventSynchronize(e), kSticky);
    EXPECT_EQ(api_.cuEventQuery(e), kSticky);
    EXPECT_EQ(api_.cuStreamWaitEvent(s, e, 0), kSticky);
    CUevent e2 = nullptr;
    EXPECT_EQ(api_.cuEventCreate(&e2, 0), kSticky);
    CUstream s2 = nullptr;
    EXPECT_EQ(api_.cuStreamCreate(&s2, 0), kSticky);
    CUdeviceptr more = 0;
    EXPECT_EQ(api_.cuMemAlloc_v2(&more, 4096), kSticky);
    EXPECT_EQ(api_.cuMemAllocAsync(&more, 4096, s), kSticky);
    EXPECT_EQ(api_.cuMemFree_v2(d2), kSticky);
    uint8_t buf[16] = {};
    EXPECT_EQ(api_.cuMemcpyHtoD_v2(d, buf, sizeof(buf)), kSticky);
    EXPECT_EQ(api_.cuMemcpyDtoH_v2(buf, d, sizeof(buf)), kSticky);
    EXPECT_EQ(api_.cuMemcpyDtoD_v2(d + 64, d, 16), kSticky);
    EXPECT_EQ(api_.cuMemcpyHtoDAsync_v2(d, buf, sizeof(buf), s), kSticky);
    EXPECT_EQ(api_.cuMemsetD8_v2(d, 1, 16), kSticky);
    EXPECT_EQ(api_.cuMemsetD32Async(d, 1, 4, s), kSticky);
    size_t free_b = 0, total = 0;
    EXPECT_EQ(api_.cuMemGetInfo_v2(&free_b, &total), kSticky);
    void* host = nullptr;
    EXPECT_EQ(api_.cuMemHostAlloc(&host, 4096, 0), kSticky);
    CUmodule mod = nullptr;
    EXPECT_EQ(api_.cuModuleLoadData(&mod, kPtx), kSticky);
    EXPECT_EQ(Launch(harmless), kSticky);
    CUipcMemHandle h{};
    EXPECT_EQ(api_.cuIpcGetMemHandle(&h, d), kSticky);

    // Device queries, contexts and library loads keep working, as natively.
    int v = 0;
    EXPECT_EQ(api_.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0),
              CUDA_SUCCESS);
    EXPECT_GT(v, 0);
    char name[64];
    EXPECT_EQ(api_.cuDeviceGetName(name, sizeof(name), 0), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuDriverGetVersion(&v), CUDA_SUCCESS);
    size_t bytes = 0;
    EXPECT_EQ(api_.cuDeviceTotalMem_v2(&bytes, 0), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    CUlibrary lib2 = nullptr;
    EXPECT_EQ(api_.cuLibraryLoadData(&lib2, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0),
              CUDA_SUCCESS);
  });
  // The fault was the child's: this process's sim is unaffected.
  EXPECT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);
  CUdeviceptr d = 0;
  EXPECT_EQ(api_.cuMemAlloc_v2(&d, 4096), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(d), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------
// IPC memory

TEST_F(SimBackend, IpcMemoryIsSharedWithAnotherProcess) {
  const size_t n = (1 << 20) + 100;
  CUdeviceptr d = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&d, n), CUDA_SUCCESS);
  std::vector<uint8_t> first = Pattern(n / 2, 1), second = Pattern(n, 2), got(n);
  ASSERT_EQ(api_.cuMemcpyHtoD_v2(d, first.data(), first.size()), CUDA_SUCCESS);

  CUipcMemHandle h{}, again{}, interior{};
  ASSERT_EQ(api_.cuIpcGetMemHandle(&h, d), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuIpcGetMemHandle(&again, d), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(&h, &again, sizeof(h)), 0) << "one allocation, one handle";
  EXPECT_EQ(api_.cuIpcGetMemHandle(&interior, d + 4096), CUDA_SUCCESS);
  // Exporting kept the bytes (written and never written alike).
  ASSERT_EQ(api_.cuMemcpyDtoH_v2(got.data(), d, n), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(got.data(), first.data(), first.size()), 0);
  EXPECT_EQ(std::count(got.begin() + first.size(), got.end(), 0),
            static_cast<long>(n - first.size()));

  InChild([&] {
    CUdeviceptr p = 0, p2 = 0;
    ASSERT_EQ(api_.cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuIpcOpenMemHandle_v2(&p2, interior, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_SUCCESS);
    EXPECT_EQ(p2, p) << "an open of the same allocation returns the same mapping";
    CUdeviceptr base = 0;
    size_t size = 0;
    EXPECT_EQ(api_.cuMemGetAddressRange_v2(&base, &size, p + 100), CUDA_SUCCESS);
    EXPECT_EQ(base, p);
    EXPECT_EQ(size, n);
    std::vector<uint8_t> seen(n);
    ASSERT_EQ(api_.cuMemcpyDtoH_v2(seen.data(), p, n), CUDA_SUCCESS);
    EXPECT_EQ(std::memcmp(seen.data(), first.data(), first.size()), 0);
    ASSERT_EQ(api_.cuMemcpyHtoD_v2(p, second.data(), n), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemcpyHtoD_v2(p + n - 8, second.data(), 16), CUDA_ERROR_INVALID_VALUE);
    CUipcMemHandle reexport{};
    EXPECT_EQ(api_.cuIpcGetMemHandle(&reexport, p), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(api_.cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(api_.cuIpcCloseMemHandle(p), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuIpcCloseMemHandle(p), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(api_.cuMemcpyDtoH_v2(seen.data(), p, 16), CUDA_ERROR_INVALID_VALUE);
  });
  ASSERT_EQ(api_.cuMemcpyDtoH_v2(got.data(), d, n), CUDA_SUCCESS);
  EXPECT_EQ(got, second) << "the child's bytes, seen by the exporter";

  // A handle of freed memory names nothing any more.
  ASSERT_EQ(api_.cuMemFree_v2(d), CUDA_SUCCESS);
  InChild([&] {
    CUdeviceptr p = 0;
    EXPECT_EQ(api_.cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_ERROR_INVALID_HANDLE);
  });
}

TEST_F(SimBackend, IpcMemoryMisuse) {
  CUdeviceptr d = 0, pooled = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&d, 4096), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemAllocAsync(&pooled, 4096, nullptr), CUDA_SUCCESS);
  CUipcMemHandle h{};
  EXPECT_EQ(api_.cuIpcGetMemHandle(nullptr, d), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuIpcGetMemHandle(&h, 0x1234), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuIpcGetMemHandle(&h, pooled), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(api_.cuIpcGetMemHandle(&h, d), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  EXPECT_EQ(api_.cuIpcOpenMemHandle_v2(&p, h, 0), CUDA_ERROR_INVALID_VALUE);  // flags first
  EXPECT_EQ(api_.cuIpcOpenMemHandle_v2(nullptr, h, 1), CUDA_ERROR_INVALID_VALUE);
  CUipcMemHandle bogus{};
  EXPECT_EQ(api_.cuIpcOpenMemHandle_v2(&p, bogus, 1), CUDA_ERROR_INVALID_VALUE);
  std::memset(&bogus, 0xab, sizeof(bogus));
  EXPECT_EQ(api_.cuIpcOpenMemHandle_v2(&p, bogus, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuIpcCloseMemHandle(d), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuIpcCloseMemHandle(0x1234), CUDA_ERROR_INVALID_VALUE);
  {
    // A made-up handle that names another file of this process exactly (the
    // sim's layout: u32 magic, kind, pid; i32 fd; u64 dev, ino, size) is no export.
    char name[] = "/tmp/flyt-sim-ipc-XXXXXX";
    int other = mkstemp(name);
    ASSERT_GE(other, 0);
    unlink(name);
    ASSERT_EQ(ftruncate(other, 4096), 0);
    struct stat st {};
    ASSERT_EQ(fstat(other, &st), 0);
    CUipcMemHandle forged = h;
    int32_t fd = other;
    uint64_t dev = st.st_dev, ino = st.st_ino;
    std::memcpy(forged.reserved + 12, &fd, sizeof(fd));
    std::memcpy(forged.reserved + 16, &dev, sizeof(dev));
    std::memcpy(forged.reserved + 24, &ino, sizeof(ino));
    EXPECT_EQ(api_.cuIpcOpenMemHandle_v2(&p, forged, 1), CUDA_ERROR_INVALID_HANDLE);
    close(other);
  }
  // The sim opens its own process's handles (one sim process may serve
  // several clients; the session refuses a client its own handles).
  ASSERT_EQ(api_.cuIpcOpenMemHandle_v2(&p, h, 1), CUDA_SUCCESS);
  EXPECT_NE(p, d);
  uint32_t v = 0x01020304, back = 0;
  ASSERT_EQ(api_.cuMemcpyHtoD_v2(p, &v, sizeof(v)), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuMemcpyDtoH_v2(&back, d, sizeof(back)), CUDA_SUCCESS);
  EXPECT_EQ(back, v) << "two mappings of one allocation";
  EXPECT_EQ(api_.cuIpcCloseMemHandle(p), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(d), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFreeAsync(pooled, nullptr), CUDA_SUCCESS);
}

TEST_F(SimBackend, IpcHandleOfAnExitedProcessIsRefused) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  InChild([&] {
    CUdeviceptr d = 0;
    ASSERT_EQ(api_.cuMemAlloc_v2(&d, 4096), CUDA_SUCCESS);
    CUipcMemHandle h{};
    ASSERT_EQ(api_.cuIpcGetMemHandle(&h, d), CUDA_SUCCESS);
    ASSERT_EQ(write(fds[1], &h, sizeof(h)), static_cast<ssize_t>(sizeof(h)));
  });
  CUipcMemHandle h{};
  ASSERT_EQ(read(fds[0], &h, sizeof(h)), static_cast<ssize_t>(sizeof(h)));
  close(fds[0]);
  close(fds[1]);
  CUdeviceptr p = 0;
  EXPECT_EQ(api_.cuIpcOpenMemHandle_v2(&p, h, 1), CUDA_ERROR_INVALID_HANDLE);
}

// ---------------------------------------------------------------------------
// IPC events

void ReadByte(void* fd) {
  char c = 0;
  if (read(*static_cast<int*>(fd), &c, 1) != 1) std::abort();
}

TEST_F(SimBackend, IpcEventSharesCompletionAcrossProcesses) {
  CUevent e = nullptr, plain = nullptr;
  EXPECT_EQ(api_.cuEventCreate(&e, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuEventCreate(&e, 0x8), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(api_.cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventCreate(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CUipcEventHandle h{};
  EXPECT_EQ(api_.cuIpcGetEventHandle(&h, plain), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(api_.cuIpcGetEventHandle(nullptr, e), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(api_.cuIpcGetEventHandle(&h, e), CUDA_SUCCESS);
  CUevent bogus_event = nullptr;
  CUipcEventHandle bogus{};
  EXPECT_EQ(api_.cuIpcOpenEventHandle(&bogus_event, bogus), CUDA_ERROR_MAP_FAILED);

  // The event is recorded behind a host function that waits for the child.
  int release[2];
  ASSERT_EQ(pipe(release), 0);
  CUstream s = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuLaunchHostFunc(s, ReadByte, &release[0]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuEventRecord(e, s), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventQuery(e), CUDA_ERROR_NOT_READY);

  InChild([&] {
    CUevent mine = nullptr;
    ASSERT_EQ(api_.cuIpcOpenEventHandle(&mine, h), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuEventQuery(mine), CUDA_ERROR_NOT_READY) << "the exporter's pending record";
    ASSERT_EQ(write(release[1], "x", 1), 1);  // lets the exporter's stream go on
    EXPECT_EQ(api_.cuEventSynchronize(mine), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuEventQuery(mine), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuEventRecord(mine, nullptr), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuEventQuery(mine), CUDA_SUCCESS);
    float ms = 0;
    EXPECT_EQ(api_.cuEventElapsedTime_v2(&ms, mine, mine), CUDA_ERROR_INVALID_HANDLE);
    CUipcEventHandle reexport{};
    EXPECT_EQ(api_.cuIpcGetEventHandle(&reexport, mine), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(api_.cuEventDestroy_v2(mine), CUDA_SUCCESS);
  });
  EXPECT_EQ(api_.cuEventSynchronize(e), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventQuery(e), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamSynchronize(s), CUDA_SUCCESS);
  close(release[0]);
  close(release[1]);
  EXPECT_EQ(api_.cuEventDestroy_v2(e), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventDestroy_v2(plain), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------
// Context events

void WaitByte(void* fd) { ReadByte(fd); }
void SetFlag(void* flag) { *static_cast<std::atomic<int>*>(flag) = 1; }
void CopyFlag(void* pair) {
  auto* p = static_cast<std::pair<std::atomic<int>*, std::atomic<int>*>*>(pair);
  p->second->store(p->first->load());
}

TEST_F(SimBackend, ContextEventsFollowTheContextsStreams) {
  int release[2];
  ASSERT_EQ(pipe(release), 0);
  CUstream s1 = nullptr, s2 = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUevent e = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  // Recorded behind a host function on s1 that waits for the pipe.
  std::atomic<int> flag{0}, seen{-1}, seen_later{-1};
  ASSERT_EQ(api_.cuLaunchHostFunc(s1, WaitByte, &release[0]), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuLaunchHostFunc(s1, SetFlag, &flag), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxRecordEvent(ctx_, e), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventQuery(e), CUDA_ERROR_NOT_READY);
  // s2, and a stream made after the wait, run their later work after it.
  ASSERT_EQ(api_.cuCtxWaitEvent(ctx_, e), CUDA_SUCCESS);
  CUstream later = nullptr;
  ASSERT_EQ(api_.cuStreamCreate(&later, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  std::pair<std::atomic<int>*, std::atomic<int>*> to_seen{&flag, &seen},
      to_later{&flag, &seen_later};
  ASSERT_EQ(api_.cuLaunchHostFunc(s2, CopyFlag, &to_seen), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuLaunchHostFunc(later, CopyFlag, &to_later), CUDA_SUCCESS);
  ASSERT_EQ(write(release[1], "x", 1), 1);
  EXPECT_EQ(api_.cuEventSynchronize(e), CUDA_SUCCESS);
  EXPECT_EQ(flag.load(), 1);
  EXPECT_EQ(api_.cuStreamSynchronize(s2), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuStreamSynchronize(later), CUDA_SUCCESS);
  EXPECT_EQ(seen.load(), 1) << "s2's host function ran before the awaited work";
  EXPECT_EQ(seen_later.load(), 1) << "a later stream's host function ran before it";
  // Nothing pending: done at once.
  ASSERT_EQ(api_.cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxRecordEvent(ctx_, e), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuEventQuery(e), CUDA_SUCCESS);

  // An event of another context is recorded for its own context only; a wait may use it.
  CUcontext other = nullptr;
  ASSERT_EQ(api_.cuCtxCreate_v4(&other, nullptr, 0, 0), CUDA_SUCCESS);
  CUevent theirs = nullptr;
  ASSERT_EQ(api_.cuEventCreate(&theirs, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxRecordEvent(ctx_, theirs), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(api_.cuCtxRecordEvent(other, theirs), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxWaitEvent(ctx_, theirs), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxRecordEvent(ctx_, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(api_.cuCtxWaitEvent(ctx_, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(api_.cuEventDestroy_v2(theirs), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuCtxDestroy_v2(other), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);

  close(release[0]);
  close(release[1]);
  EXPECT_EQ(api_.cuEventDestroy_v2(e), CUDA_SUCCESS);
  for (CUstream s : {s1, s2, later}) EXPECT_EQ(api_.cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------
// Texture and surface objects

// ---------------------------------------------------------------------------
// Memory pools: properties checked, attributes kept, the device's current pool

TEST_F(SimBackend, MemoryPoolsKeepAttributesAndTheCurrentPool) {
  InChild([&] {
    CUmemoryPool def = nullptr, cur = nullptr, pool = nullptr;
    ASSERT_EQ(api_.cuDeviceGetDefaultMemPool(&def, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDeviceGetMemPool(&cur, 0), CUDA_SUCCESS);
    EXPECT_EQ(cur, def);
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    EXPECT_EQ(api_.cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_DEVICE);
    props.location.id = 0;
    ASSERT_EQ(api_.cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    EXPECT_NE(pool, def);
    cuuint64_t v = 12345;
    EXPECT_EQ(api_.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v),
              CUDA_SUCCESS);
    v = 0;
    EXPECT_EQ(api_.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v),
              CUDA_SUCCESS);
    EXPECT_EQ(v, 12345u);
    int flag = 0;
    EXPECT_EQ(api_.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag),
              CUDA_SUCCESS);
    flag = 7;
    EXPECT_EQ(api_.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag),
              CUDA_SUCCESS);
    EXPECT_EQ(flag, 0);
    v = 5;  // a high-water mark is only reset to 0
    EXPECT_EQ(api_.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v),
              CUDA_ERROR_INVALID_VALUE);
    ASSERT_EQ(api_.cuDeviceSetMemPool(0, pool), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDeviceGetMemPool(&cur, 0), CUDA_SUCCESS);
    EXPECT_EQ(cur, pool);
    CUdeviceptr p = 0;
    EXPECT_EQ(api_.cuMemAllocFromPoolAsync(&p, 4096, pool, nullptr), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemFreeAsync(p, nullptr), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE);  // never the default
    EXPECT_EQ(api_.cuMemPoolDestroy(pool), CUDA_SUCCESS);
    ASSERT_EQ(api_.cuDeviceGetMemPool(&cur, 0), CUDA_SUCCESS);
    EXPECT_EQ(cur, def);  // the destroyed pool was current: the default is again
    EXPECT_EQ(api_.cuMemAllocFromPoolAsync(&p, 4096, pool, nullptr), CUDA_ERROR_INVALID_VALUE);
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // for export: made
    ASSERT_EQ(api_.cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuMemPoolDestroy(pool), CUDA_SUCCESS);
  });
}

TEST_F(SimBackend, TextureObjectsKeepTheirDescriptors) {
  size_t width = 0;
  EXPECT_EQ(api_.cuDeviceGetTexture1DLinearMaxWidth(&width, CU_AD_FORMAT_FLOAT, 4, 0),
            CUDA_SUCCESS);
  EXPECT_GT(width, 0u);
  EXPECT_EQ(api_.cuDeviceGetTexture1DLinearMaxWidth(nullptr, CU_AD_FORMAT_FLOAT, 4, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuDeviceGetTexture1DLinearMaxWidth(&width, CU_AD_FORMAT_FLOAT, 3, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuDeviceGetTexture1DLinearMaxWidth(&width, CU_AD_FORMAT_FLOAT, 1, 5),
            CUDA_ERROR_INVALID_DEVICE);

  CUDA_ARRAY3D_DESCRIPTOR ad{};
  ad.Width = 16;
  ad.Height = 8;
  ad.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  ad.NumChannels = 4;
  CUarray plain = nullptr, ldst = nullptr;
  ASSERT_EQ(api_.cuArray3DCreate_v2(&plain, &ad), CUDA_SUCCESS);
  ad.Flags = CUDA_ARRAY3D_SURFACE_LDST;
  ASSERT_EQ(api_.cuArray3DCreate_v2(&ldst, &ad), CUDA_SUCCESS);

  CUDA_RESOURCE_DESC rd{};
  rd.resType = CU_RESOURCE_TYPE_ARRAY;
  rd.res.array.hArray = plain;
  CUDA_TEXTURE_DESC td{};
  td.addressMode[0] = CU_TR_ADDRESS_MODE_MIRROR;
  td.filterMode = CU_TR_FILTER_MODE_LINEAR;
  td.flags = CU_TRSF_NORMALIZED_COORDINATES;
  td.maxAnisotropy = 4;
  CUDA_RESOURCE_VIEW_DESC vd{};
  vd.format = CU_RES_VIEW_FORMAT_UINT_4X8;
  vd.width = 16;
  vd.height = 8;
  CUtexObject with_view = 0, without = 0;
  ASSERT_EQ(api_.cuTexObjectCreate(&with_view, &rd, &td, &vd), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuTexObjectCreate(&without, &rd, &td, nullptr), CUDA_SUCCESS);
  EXPECT_NE(with_view, 0u);
  EXPECT_NE(with_view, without);
  CUDA_RESOURCE_DESC got_rd{};
  ASSERT_EQ(api_.cuTexObjectGetResourceDesc(&got_rd, with_view), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(&got_rd, &rd, sizeof(rd)), 0);
  CUDA_TEXTURE_DESC got_td{};
  ASSERT_EQ(api_.cuTexObjectGetTextureDesc(&got_td, with_view), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(&got_td, &td, sizeof(td)), 0);
  CUDA_RESOURCE_VIEW_DESC got_vd{};
  ASSERT_EQ(api_.cuTexObjectGetResourceViewDesc(&got_vd, with_view), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(&got_vd, &vd, sizeof(vd)), 0);
  EXPECT_EQ(api_.cuTexObjectGetResourceViewDesc(&got_vd, without), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuTexObjectGetResourceDesc(nullptr, with_view), CUDA_ERROR_INVALID_VALUE);

  // Surfaces: only of an array made for load/store.
  CUsurfObject surf = 0;
  EXPECT_EQ(api_.cuSurfObjectCreate(&surf, &rd), CUDA_ERROR_INVALID_VALUE);
  rd.res.array.hArray = ldst;
  ASSERT_EQ(api_.cuSurfObjectCreate(&surf, &rd), CUDA_SUCCESS);
  ASSERT_EQ(api_.cuSurfObjectGetResourceDesc(&got_rd, surf), CUDA_SUCCESS);
  EXPECT_EQ(got_rd.res.array.hArray, ldst);
  // A texture is no surface, and the other way round.
  EXPECT_EQ(api_.cuSurfObjectGetResourceDesc(&got_rd, with_view), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuTexObjectGetResourceDesc(&got_rd, surf), CUDA_ERROR_INVALID_VALUE);

  // Resources the sim refuses as the driver does: no array, memory it never
  // gave, misaligned memory, flags.
  CUDA_RESOURCE_DESC bad{};
  CUtexObject t = 0;
  bad.resType = CU_RESOURCE_TYPE_ARRAY;
  bad.res.array.hArray = reinterpret_cast<CUarray>(&bad);
  EXPECT_EQ(api_.cuTexObjectCreate(&t, &bad, &td, nullptr), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr d = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&d, 1 << 16), CUDA_SUCCESS);
  bad = CUDA_RESOURCE_DESC{};
  bad.resType = CU_RESOURCE_TYPE_LINEAR;
  bad.res.linear.devPtr = d;
  bad.res.linear.format = CU_AD_FORMAT_FLOAT;
  bad.res.linear.numChannels = 1;
  bad.res.linear.sizeInBytes = 1 << 16;
  ASSERT_EQ(api_.cuTexObjectCreate(&t, &bad, &td, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuTexObjectDestroy(t), CUDA_SUCCESS);
  bad.res.linear.sizeInBytes = (1 << 16) + 4;
  EXPECT_EQ(api_.cuTexObjectCreate(&t, &bad, &td, nullptr), CUDA_ERROR_INVALID_VALUE);
  bad.res.linear.sizeInBytes = 1024;
  bad.res.linear.devPtr = d + 256;
  EXPECT_EQ(api_.cuTexObjectCreate(&t, &bad, &td, nullptr), CUDA_ERROR_INVALID_VALUE);
  bad.res.linear.devPtr = d;
  bad.flags = 1;
  EXPECT_EQ(api_.cuTexObjectCreate(&t, &bad, &td, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuTexObjectCreate(&t, nullptr, &td, nullptr), CUDA_ERROR_INVALID_VALUE);

  // Destroyed objects are gone; destroying 0 does nothing.
  EXPECT_EQ(api_.cuSurfObjectDestroy(surf), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuSurfObjectDestroy(surf), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuTexObjectDestroy(with_view), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuTexObjectGetResourceDesc(&got_rd, with_view), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuTexObjectDestroy(without), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuTexObjectDestroy(0), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(d), CUDA_SUCCESS);
  // A destroyed array backs nothing new.
  EXPECT_EQ(api_.cuArrayDestroy(plain), CUDA_SUCCESS);
  rd.res.array.hArray = plain;
  EXPECT_EQ(api_.cuTexObjectCreate(&t, &rd, &td, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuArrayDestroy(ldst), CUDA_SUCCESS);
}

// Texture object values are the smallest free, as the driver's in a fresh process
// (1, 2, 3, ...): a restore makes the source's values again in order and counts on it.
TEST_F(SimBackend, TextureObjectValuesAreTheSmallestFree) {
  CUdeviceptr d = 0;
  ASSERT_EQ(api_.cuMemAlloc_v2(&d, 1 << 16), CUDA_SUCCESS);
  CUDA_RESOURCE_DESC rd{};
  rd.resType = CU_RESOURCE_TYPE_LINEAR;
  rd.res.linear.devPtr = d;
  rd.res.linear.format = CU_AD_FORMAT_FLOAT;
  rd.res.linear.numChannels = 1;
  rd.res.linear.sizeInBytes = 1 << 16;
  CUDA_TEXTURE_DESC td{};
  CUtexObject t[4] = {};
  for (CUtexObject& o : t) ASSERT_EQ(api_.cuTexObjectCreate(&o, &rd, &td, nullptr), CUDA_SUCCESS);
  EXPECT_NE(t[0], 0u);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(t[i], t[i - 1] + 1);
  // A hole is filled first, then the values go on after the largest.
  ASSERT_EQ(api_.cuTexObjectDestroy(t[1]), CUDA_SUCCESS);
  CUtexObject again = 0, next = 0;
  ASSERT_EQ(api_.cuTexObjectCreate(&again, &rd, &td, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(again, t[1]);
  ASSERT_EQ(api_.cuTexObjectCreate(&next, &rd, &td, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(next, t[3] + 1);
  for (CUtexObject o : {t[0], again, t[2], t[3], next})
    EXPECT_EQ(api_.cuTexObjectDestroy(o), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemFree_v2(d), CUDA_SUCCESS);
}

}  // namespace
}  // namespace flyt::server
