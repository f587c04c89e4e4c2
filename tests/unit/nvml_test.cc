// Flyt's libnvidia-ml.so.1 (src/nvml/nvml.cc) against a stand-in libcuda.so.1
// (nvml_fake_libcuda.cc) whose snapshots the tests choose: reference counting,
// the snapshot cache, malformed and large snapshots, a lost server, handles,
// and threads. The end-to-end view against flyt-server is tests/e2e (nvml).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "nvml/nvml_types.h"
#include "protocol/ops.h"

extern "C" void nvml_fake_set(int rc, const void* bytes, size_t n);
extern "C" int nvml_fake_calls();
extern "C" void nvml_fake_cuda_call();

namespace {

using flyt::ops::NvmlDevice;
using flyt::ops::NvmlHead;
using flyt::ops::NvmlProcess;

void* Lib() {
  static void* lib = dlopen(FLYT_NVML_LIB, RTLD_NOW | RTLD_LOCAL);
  return lib;
}

template <typename F>
F Fn(const char* name) {
  void* p = dlsym(Lib(), name);
  EXPECT_NE(p, nullptr) << name;
  return reinterpret_cast<F>(p);
}

nvmlReturn_t Init() { return Fn<nvmlReturn_t (*)()>("nvmlInit_v2")(); }
nvmlReturn_t Shutdown() { return Fn<nvmlReturn_t (*)()>("nvmlShutdown")(); }
nvmlReturn_t Count(unsigned* n) {
  return Fn<nvmlReturn_t (*)(unsigned*)>("nvmlDeviceGetCount_v2")(n);
}
nvmlReturn_t Handle(unsigned i, nvmlDevice_t* d) {
  return Fn<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>("nvmlDeviceGetHandleByIndex_v2")(i, d);
}
nvmlReturn_t Memory(nvmlDevice_t d, nvmlMemory_t* m) {
  return Fn<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>("nvmlDeviceGetMemoryInfo")(d, m);
}
nvmlReturn_t Processes(nvmlDevice_t d, unsigned* n, nvmlProcessInfo_t* p) {
  return Fn<nvmlReturn_t (*)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*)>(
      "nvmlDeviceGetComputeRunningProcesses_v3")(d, n, p);
}

struct Snapshot {
  NvmlHead head{};
  std::vector<NvmlDevice> devices;
  std::vector<NvmlProcess> processes;

  explicit Snapshot(int n_devices = 1, int n_processes = 1) {
    head.version = flyt::ops::kNvmlSnapshotVersion;
    head.head_size = sizeof(NvmlHead);
    head.device_size = sizeof(NvmlDevice);
    head.process_size = sizeof(NvmlProcess);
    head.cuda_driver_version = 13000;
    std::strcpy(head.driver_version, "580.1.2");
    for (int i = 0; i < n_devices; ++i) {
      NvmlDevice d{};
      std::snprintf(d.name, sizeof(d.name), "GPU %d", i);
      for (int b = 0; b < 16; ++b) d.uuid[b] = static_cast<uint8_t>(0xa0 + i * 16 + b);
      d.pci_bus = 0x19 + static_cast<uint32_t>(i);
      d.cc_major = 9;
      d.sm_count = 20;
      d.memory_total = 64 << 20;
      d.memory_used = 8 << 20;
      d.memory_free = d.memory_total - d.memory_used;
      devices.push_back(d);
    }
    for (int i = 0; i < n_processes; ++i)
      processes.push_back(NvmlProcess{static_cast<uint32_t>(1000 + i), 0, 1u << 20});
  }
  std::vector<uint8_t> Bytes() {
    head.device_count = static_cast<uint32_t>(devices.size());
    head.process_count = static_cast<uint32_t>(processes.size());
    std::vector<uint8_t> out(sizeof(head));
    std::memcpy(out.data(), &head, sizeof(head));
    auto put = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    for (const auto& d : devices) put(&d, sizeof(d));
    for (const auto& p : processes) put(&p, sizeof(p));
    return out;
  }
  void Serve() {
    std::vector<uint8_t> b = Bytes();
    nvml_fake_set(0, b.data(), b.size());
  }
};

class Nvml : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(Lib(), nullptr) << dlerror();
    setenv("FLYT_NVML_CACHE_MS", "0", 1);
  }
  void TearDown() override {
    while (Shutdown() == NVML_SUCCESS) {
    }
  }
};

TEST_F(Nvml, UninitializedUntilInitAndAfterTheLastShutdown) {
  unsigned n = 0;
  EXPECT_EQ(Count(&n), NVML_ERROR_UNINITIALIZED);
  EXPECT_EQ(Shutdown(), NVML_ERROR_UNINITIALIZED);
  Snapshot(2).Serve();
  ASSERT_EQ(Init(), NVML_SUCCESS);
  ASSERT_EQ(Fn<nvmlReturn_t (*)(unsigned)>("nvmlInitWithFlags")(0), NVML_SUCCESS);
  ASSERT_EQ(Count(&n), NVML_SUCCESS);
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(Shutdown(), NVML_SUCCESS);
  EXPECT_EQ(Count(&n), NVML_SUCCESS);  // one reference left
  EXPECT_EQ(Shutdown(), NVML_SUCCESS);
  EXPECT_EQ(Count(&n), NVML_ERROR_UNINITIALIZED);
}

TEST_F(Nvml, InitFailsCleanlyWhenTheServerCannotBeReached) {
  nvml_fake_set(100, nullptr, 0);
  EXPECT_EQ(Init(), NVML_ERROR_DRIVER_NOT_LOADED);
  unsigned n = 0;
  EXPECT_EQ(Count(&n), NVML_ERROR_UNINITIALIZED);
  EXPECT_EQ(Shutdown(), NVML_ERROR_UNINITIALIZED);
}

TEST_F(Nvml, MalformedSnapshotsAreRefused) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> bad;
  {
    Snapshot s;
    s.head.version = flyt::ops::kNvmlSnapshotVersion + 1;
    bad.push_back({"version", s.Bytes()});
  }
  {
    Snapshot s;
    s.head.device_size = 100;
    bad.push_back({"device size", s.Bytes()});
  }
  {
    Snapshot s;
    auto b = s.Bytes();
    b.pop_back();
    bad.push_back({"truncated", b});
  }
  {
    Snapshot s;
    auto b = s.Bytes();
    b.push_back(0);
    bad.push_back({"trailing byte", b});
  }
  {
    Snapshot s;
    auto b = s.Bytes();
    uint32_t huge = 1u << 30;
    std::memcpy(b.data() + offsetof(NvmlHead, process_count), &huge, 4);
    bad.push_back({"process count", b});
  }
  {
    Snapshot s;
    auto b = s.Bytes();
    uint32_t many = flyt::ops::kMaxNvmlDevices + 1;
    std::memcpy(b.data() + offsetof(NvmlHead, device_count), &many, 4);
    bad.push_back({"device count", b});
  }
  bad.push_back({"short", std::vector<uint8_t>(10, 0)});
  bad.push_back({"empty", {}});
  for (auto& [what, bytes] : bad) {
    nvml_fake_set(0, bytes.data(), bytes.size());
    EXPECT_EQ(Init(), NVML_ERROR_UNKNOWN) << what;
    unsigned n = 0;
    EXPECT_EQ(Count(&n), NVML_ERROR_UNINITIALIZED) << what;
  }
}

TEST_F(Nvml, ALargeProcessListIsFetchedWithMoreRoom) {
  Snapshot s(1, 3000);  // 48 KiB: more than the first buffer
  s.Serve();
  ASSERT_EQ(Init(), NVML_SUCCESS);
  nvmlDevice_t dev = nullptr;
  ASSERT_EQ(Handle(0, &dev), NVML_SUCCESS);
  unsigned n = 0;
  ASSERT_EQ(Processes(dev, &n, nullptr), NVML_ERROR_INSUFFICIENT_SIZE);
  ASSERT_EQ(n, 3000u);
  std::vector<nvmlProcessInfo_t> p(n);
  unsigned room = 10;
  EXPECT_EQ(Processes(dev, &room, p.data()), NVML_ERROR_INSUFFICIENT_SIZE);
  EXPECT_EQ(room, 3000u);
  ASSERT_EQ(Processes(dev, &n, p.data()), NVML_SUCCESS);
  EXPECT_EQ(p[2999].pid, 3999u);
  EXPECT_EQ(p[2999].usedGpuMemory, 1u << 20);
  EXPECT_EQ(p[2999].gpuInstanceId, 0xffffffffu);
  // The 16-byte records of the oldest ABI.
  std::vector<nvmlProcessInfo_v1_t> v1(n);
  unsigned n1 = n;
  ASSERT_EQ(Fn<nvmlReturn_t (*)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v1_t*)>(
                "nvmlDeviceGetComputeRunningProcesses")(dev, &n1, v1.data()),
            NVML_SUCCESS);
  EXPECT_EQ(v1[2999].pid, 3999u);
  EXPECT_EQ(v1[2999].usedGpuMemory, 1u << 20);
}

TEST_F(Nvml, OwnCudaCallsEndTheCacheAtOnce) {
  // A process that allocates and then lists processes must see the new state
  // at once, however long the cache lasts for others' changes.
  setenv("FLYT_NVML_CACHE_MS", "60000", 1);
  Snapshot s;
  s.Serve();
  ASSERT_EQ(Init(), NVML_SUCCESS);
  nvmlDevice_t dev = nullptr;
  ASSERT_EQ(Handle(0, &dev), NVML_SUCCESS);
  nvmlMemory_t m{};
  ASSERT_EQ(Memory(dev, &m), NVML_SUCCESS);
  int calls = nvml_fake_calls();
  ASSERT_EQ(Memory(dev, &m), NVML_SUCCESS);
  EXPECT_EQ(nvml_fake_calls(), calls) << "no CUDA call in between: cached";
  nvml_fake_cuda_call();
  s.devices[0].memory_used = 16 << 20;
  s.devices[0].memory_free = 48 << 20;
  s.Serve();
  ASSERT_EQ(Memory(dev, &m), NVML_SUCCESS);
  EXPECT_EQ(nvml_fake_calls(), calls + 1) << "a CUDA call in between: fetched again";
  EXPECT_EQ(m.used, 16u << 20);
  ASSERT_EQ(Memory(dev, &m), NVML_SUCCESS);
  EXPECT_EQ(nvml_fake_calls(), calls + 1) << "the fetch itself does not count";
  ASSERT_EQ(Shutdown(), NVML_SUCCESS);
  unsetenv("FLYT_NVML_CACHE_MS");
}

TEST_F(Nvml, DynamicValuesAreCachedForFlytNvmlCacheMs) {
  setenv("FLYT_NVML_CACHE_MS", "60000", 1);
  Snapshot s;
  s.Serve();
  ASSERT_EQ(Init(), NVML_SUCCESS);
  nvmlDevice_t dev = nullptr;
  ASSERT_EQ(Handle(0, &dev), NVML_SUCCESS);
  int calls = nvml_fake_calls();
  nvmlMemory_t m{};
  for (int i = 0; i < 10; ++i) ASSERT_EQ(Memory(dev, &m), NVML_SUCCESS);
  EXPECT_EQ(nvml_fake_calls(), calls);  // answered from the init's snapshot
  ASSERT_EQ(Shutdown(), NVML_SUCCESS);

  setenv("FLYT_NVML_CACHE_MS", "0", 1);
  ASSERT_EQ(Init(), NVML_SUCCESS);
  calls = nvml_fake_calls();
  s.devices[0].memory_used = 16 << 20;
  s.devices[0].memory_free = 48 << 20;
  std::strcpy(s.devices[0].name, "renamed");  // identities stay those init read
  s.Serve();
  ASSERT_EQ(Memory(dev, &m), NVML_SUCCESS);
  EXPECT_EQ(m.used, 16u << 20);
  EXPECT_EQ(m.free, 48u << 20);
  EXPECT_EQ(m.total, 64u << 20);
  ASSERT_EQ(Memory(dev, &m), NVML_SUCCESS);
  EXPECT_EQ(nvml_fake_calls(), calls + 2);
  char name[96] = {};
  ASSERT_EQ(Fn<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>("nvmlDeviceGetName")(dev, name,
                                                                                     sizeof(name)),
            NVML_SUCCESS);
  EXPECT_STREQ(name, "GPU 0");
}

TEST_F(Nvml, ALostServerIsGpuIsLostAndNamesStayAnswered) {
  Snapshot s;
  s.Serve();
  ASSERT_EQ(Init(), NVML_SUCCESS);
  nvmlDevice_t dev = nullptr;
  ASSERT_EQ(Handle(0, &dev), NVML_SUCCESS);
  nvml_fake_set(46, nullptr, 0);  // CUDA_ERROR_DEVICE_UNAVAILABLE: the connection broke
  nvmlMemory_t m{};
  EXPECT_EQ(Memory(dev, &m), NVML_ERROR_GPU_IS_LOST);
  nvmlUtilization_t u{};
  EXPECT_EQ(Fn<nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*)>("nvmlDeviceGetUtilizationRates")(
                dev, &u),
            NVML_ERROR_GPU_IS_LOST);
  char uuid[96] = {};
  EXPECT_EQ(Fn<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>("nvmlDeviceGetUUID")(dev, uuid,
                                                                                     sizeof(uuid)),
            NVML_SUCCESS);
  EXPECT_STREQ(uuid, "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");
  s.Serve();  // back
  EXPECT_EQ(Memory(dev, &m), NVML_SUCCESS);
}

TEST_F(Nvml, HandlesByUuidAndBusIdAndBadHandles) {
  Snapshot s(2);
  s.devices[1].pci_domain = 1;
  s.Serve();
  ASSERT_EQ(Init(), NVML_SUCCESS);
  nvmlDevice_t d0 = nullptr, d1 = nullptr, got = nullptr;
  ASSERT_EQ(Handle(0, &d0), NVML_SUCCESS);
  ASSERT_EQ(Handle(1, &d1), NVML_SUCCESS);
  EXPECT_EQ(Handle(2, &got), NVML_ERROR_INVALID_ARGUMENT);
  auto by_uuid = Fn<nvmlReturn_t (*)(const char*, nvmlDevice_t*)>("nvmlDeviceGetHandleByUUID");
  ASSERT_EQ(by_uuid("GPU-B0B1B2B3-B4B5-B6B7-B8B9-BABBBCBDBEBF", &got), NVML_SUCCESS);
  EXPECT_EQ(got, d1);
  EXPECT_EQ(by_uuid("GPU-b0b1b2b3", &got), NVML_ERROR_NOT_FOUND);
  auto by_bus =
      Fn<nvmlReturn_t (*)(const char*, nvmlDevice_t*)>("nvmlDeviceGetHandleByPciBusId_v2");
  for (const char* id : {"00000000:19:00.0", "0000:19:00.0", "19:00.0", "0:19:0"}) {
    got = nullptr;
    EXPECT_EQ(by_bus(id, &got), NVML_SUCCESS) << id;
    EXPECT_EQ(got, d0) << id;
  }
  ASSERT_EQ(by_bus("00000001:1A:00.0", &got), NVML_SUCCESS);
  EXPECT_EQ(got, d1);
  for (const char* id : {"", "x", "19", "1:2:3:4", "0000:19:00.0.0", "0000:19:00.12"})
    EXPECT_NE(by_bus(id, &got), NVML_SUCCESS) << id;
  nvmlPciInfo_t pci{};
  ASSERT_EQ(Fn<nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*)>("nvmlDeviceGetPciInfo_v3")(d1, &pci),
            NVML_SUCCESS);
  EXPECT_STREQ(pci.busId, "00000001:1A:00.0");
  EXPECT_STREQ(pci.busIdLegacy, "0001:1A:00.0");
  nvmlMemory_t m{};
  EXPECT_EQ(Memory(nullptr, &m), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(Memory(reinterpret_cast<nvmlDevice_t>(&m), &m), NVML_ERROR_INVALID_ARGUMENT);
  // Not a device the snapshot has, though a valid slot of the library.
  EXPECT_EQ(Memory(reinterpret_cast<nvmlDevice_t>(
                       reinterpret_cast<char*>(d1) +
                       (reinterpret_cast<char*>(d1) - reinterpret_cast<char*>(d0))),
                   &m),
            NVML_ERROR_INVALID_ARGUMENT);
  nvmlMemory_v2_t m2{};
  m2.version = 1;
  EXPECT_EQ(
      Fn<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*)>("nvmlDeviceGetMemoryInfo_v2")(d0, &m2),
      NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
}

TEST_F(Nvml, UnsupportedEntryPointsAnswerNotSupported) {
  Snapshot().Serve();
  ASSERT_EQ(Init(), NVML_SUCCESS);
  for (const char* name : {"nvmlDeviceGetBAR1MemoryInfo", "nvmlDeviceGetEccMode",
                           "nvmlDeviceGetMigMode", "nvmlDeviceGetNvLinkRemoteDeviceType",
                           "nvmlEventSetCreate", "nvmlDeviceSetPowerManagementLimit"}) {
    auto fn = Fn<nvmlReturn_t (*)(void*, void*, void*)>(name);
    if (fn == nullptr) continue;
    uint64_t scratch[16] = {};
    EXPECT_EQ(fn(scratch, scratch, scratch), NVML_ERROR_NOT_SUPPORTED) << name;
  }
  auto error_string = Fn<const char* (*)(nvmlReturn_t)>("nvmlErrorString");
  EXPECT_STREQ(error_string(NVML_ERROR_GPU_IS_LOST), "GPU is lost");
  EXPECT_STREQ(error_string(12345), "Unknown Error");
}

TEST_F(Nvml, ThreadsInitQueryAndShutDownTogether) {
  setenv("FLYT_NVML_CACHE_MS", "1", 1);
  Snapshot(1, 4).Serve();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (Init() != NVML_SUCCESS) {
          ++failures;
          continue;
        }
        nvmlDevice_t dev = nullptr;
        nvmlMemory_t m{};
        unsigned n = 8;
        nvmlProcessInfo_t p[8];
        if (Handle(0, &dev) != NVML_SUCCESS || Memory(dev, &m) != NVML_SUCCESS ||
            Processes(dev, &n, p) != NVML_SUCCESS || n != 4 || m.total != 64u << 20)
          ++failures;
        if (Shutdown() != NVML_SUCCESS) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  unsigned n = 0;
  EXPECT_EQ(Count(&n), NVML_ERROR_UNINITIALIZED);  // every init was balanced
}

}  // namespace
