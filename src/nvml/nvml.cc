// Flyt's libnvidia-ml.so.1: NVML answered from the tenant's view (docs/nvml.md).
//
// Owns: the NVML entry points PyTorch, pynvml and monitoring tools call, their
// init/shutdown reference count, and a short-lived cache of the server's
// snapshot (ops::kOpNvmlSnapshot). It reaches flyt-server only through Flyt's
// libcuda.so.1 (its exported flyt_nvml_snapshot, which uses the process's own
// connection and makes no CUDA context); with NVIDIA's libcuda.so.1 instead,
// nvmlInit fails with NVML_ERROR_LIBRARY_NOT_FOUND. Names, UUIDs and PCI ids
// are read once at nvmlInit; memory, utilization, telemetry and processes are
// fetched again when the cached copy is older than FLYT_NVML_CACHE_MS
// (default 50 ms; 0: every query). Entry points it does not answer return
// NVML_ERROR_NOT_SUPPORTED (nvml_unsupported.inc).
// Lives inside other people's processes: no stdout, no exit(), no global
// constructors that can fail, no hang beyond Flyt's timeout (FLYT_TIMEOUT_MS).
#include <dlfcn.h>
#include <strings.h>
#include <time.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/gpu_uuid.h"
#include "common/log.h"
#include "nvml/nvml_types.h"
#include "protocol/ops.h"

#define FLYT_NVML_API extern "C" __attribute__((visibility("default")))

// A device handle points into this array (zero-initialised: no constructor).
struct nvmlDevice_st {
  unsigned char unused;
};

namespace {

using flyt::ops::NvmlDevice;
using flyt::ops::NvmlHead;
using flyt::ops::NvmlProcess;

// flyt_nvml_snapshot in Flyt's libcuda.so.1 (src/client/api_nvml.cc); returns a CUresult.
using SnapshotFn = int (*)(void* buf, size_t cap, size_t* len);
// flyt_client_stats: the calls this process made through Flyt (optional).
using StatsFn = int (*)(uint64_t* out, int n);
constexpr int kCudaErrorInvalidValue = 1;

nvmlDevice_st g_handles[flyt::ops::kMaxNvmlDevices];

struct State {
  std::mutex mu;  // everything below
  int refs = 0;   // nvmlInit calls not yet balanced by nvmlShutdown
  SnapshotFn snapshot = nullptr;
  StatsFn stats = nullptr;
  uint64_t cache_ns = 50ull * 1000000;
  uint64_t fetched_ns = 0;
  uint64_t calls_at_fetch = 0;  // ProcessCalls() after the last fetch
  bool lost = false;            // the last fetch failed (said once in the log)
  NvmlHead head{};
  std::vector<NvmlDevice> devices;
  std::vector<NvmlProcess> processes;
};

State& S() {
  static State* state = new State();  // never destroyed: atexit order is unknown
  return *state;
}

// CUDA calls this process has made (0 without flyt_client_stats). A cached
// answer is only reused while it is unchanged: right after its own cudaMalloc a
// process must see its memory and itself in the process list, as with NVIDIA's
// NVML; other processes' changes may show up to FLYT_NVML_CACHE_MS late.
uint64_t ProcessCalls(const State& s) {
  if (s.stats == nullptr) return 0;
  uint64_t v[2] = {0, 0};
  if (s.stats(v, 2) != 2) return 0;
  return v[0] + v[1];
}

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Fetches and checks a snapshot; on success replaces the cached one. `at_init`:
// names, UUIDs and the device count are taken from it.
nvmlReturn_t FetchLocked(State& s, bool at_init) {
  std::vector<uint8_t> buf(16 << 10);
  size_t len = 0;
  int rc = s.snapshot(buf.data(), buf.size(), &len);
  if (rc == kCudaErrorInvalidValue && len > buf.size() && len <= (4u << 20)) {
    buf.resize(len);
    rc = s.snapshot(buf.data(), buf.size(), &len);
  }
  if (rc != 0) {
    if (at_init) {
      FLYT_WARN(
          "nvmlInit: flyt-server cannot be reached (CUDA error %d; the client log says why): "
          "NVML answers NVML_ERROR_DRIVER_NOT_LOADED",
          rc);
      return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (!s.lost)
      FLYT_WARN(
          "NVML: lost flyt-server (CUDA error %d): queries of memory, utilization and "
          "processes answer NVML_ERROR_GPU_IS_LOST",
          rc);
    s.lost = true;
    return NVML_ERROR_GPU_IS_LOST;
  }
  NvmlHead head{};
  bool ok = len >= sizeof(head) && len <= buf.size();
  if (ok) std::memcpy(&head, buf.data(), sizeof(head));
  ok = ok && head.version == flyt::ops::kNvmlSnapshotVersion &&
       head.head_size == sizeof(NvmlHead) && head.device_size == sizeof(NvmlDevice) &&
       head.process_size == sizeof(NvmlProcess) &&
       head.device_count <= flyt::ops::kMaxNvmlDevices &&
       head.process_count <= flyt::ops::kMaxNvmlProcesses &&
       len == sizeof(NvmlHead) + head.device_count * sizeof(NvmlDevice) +
                  head.process_count * sizeof(NvmlProcess) &&
       (at_init || head.device_count == s.devices.size());
  if (!ok) {
    FLYT_WARN("NVML: malformed snapshot from flyt-server (%zu bytes)", len);
    return NVML_ERROR_UNKNOWN;
  }
  head.driver_version[sizeof(head.driver_version) - 1] = '\0';
  head.nvml_version[sizeof(head.nvml_version) - 1] = '\0';
  s.head = head;
  const uint8_t* p = buf.data() + sizeof(NvmlHead);
  std::vector<NvmlDevice> devices(head.device_count);
  if (!devices.empty()) std::memcpy(devices.data(), p, devices.size() * sizeof(NvmlDevice));
  p += devices.size() * sizeof(NvmlDevice);
  for (auto& d : devices) d.name[sizeof(d.name) - 1] = '\0';
  if (!at_init) {  // identities stay those nvmlInit saw
    for (size_t i = 0; i < devices.size(); ++i) {
      std::memcpy(devices[i].name, s.devices[i].name, sizeof(devices[i].name));
      std::memcpy(devices[i].uuid, s.devices[i].uuid, sizeof(devices[i].uuid));
    }
  }
  s.devices = std::move(devices);
  s.processes.resize(head.process_count);
  if (!s.processes.empty())
    std::memcpy(s.processes.data(), p, s.processes.size() * sizeof(NvmlProcess));
  s.fetched_ns = NowNs();
  s.calls_at_fetch = ProcessCalls(s);  // counts the snapshot call itself
  if (s.lost) FLYT_INFO("NVML: flyt-server answers again");
  s.lost = false;
  return NVML_SUCCESS;
}

nvmlReturn_t RefreshLocked(State& s) {
  if (NowNs() - s.fetched_ns < s.cache_ns && !s.lost && ProcessCalls(s) == s.calls_at_fetch)
    return NVML_SUCCESS;
  return FetchLocked(s, false);
}

nvmlReturn_t Init() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.refs > 0) {
    ++s.refs;
    return NVML_SUCCESS;
  }
  if (s.snapshot == nullptr) {
    flyt::log::SetProcessTag("flyt-nvml");  // this library's own logger
    // Flyt's libcuda.so.1 when the program runs under `flyt run`; already
    // loaded if the program uses CUDA. Never unloaded (driver libraries
    // must not be).
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      FLYT_WARN(
          "nvmlInit: cannot load libcuda.so.1 (%s): Flyt's NVML answers through Flyt's "
          "client library; run the program under `flyt run`",
          why ? why : "?");
      return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    auto fn = reinterpret_cast<SnapshotFn>(dlsym(lib, "flyt_nvml_snapshot"));
    if (fn == nullptr) {
      FLYT_WARN(
          "nvmlInit: the libcuda.so.1 found first is not Flyt's client library (NVIDIA's "
          "driver?): Flyt's NVML answers only through Flyt; run the program under `flyt run`");
      return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    s.snapshot = fn;
    s.stats = reinterpret_cast<StatsFn>(dlsym(lib, "flyt_client_stats"));
  }
  s.cache_ns = 50ull * 1000000;
  if (const char* v = std::getenv("FLYT_NVML_CACHE_MS"); v != nullptr && v[0] != '\0') {
    char* end = nullptr;
    long ms = std::strtol(v, &end, 10);
    if (*end == '\0' && ms >= 0 && ms <= 3600000) s.cache_ns = static_cast<uint64_t>(ms) * 1000000;
  }
  s.lost = false;
  nvmlReturn_t rc = FetchLocked(s, true);
  if (rc != NVML_SUCCESS) return rc;
  s.refs = 1;
  FLYT_INFO("nvmlInit: %zu GPU(s) through Flyt", s.devices.size());
  return NVML_SUCCESS;
}

int HandleIndex(const State& s, nvmlDevice_t h) {
  auto at = reinterpret_cast<uintptr_t>(h), base = reinterpret_cast<uintptr_t>(g_handles);
  if (at < base || at >= base + sizeof(g_handles)) return -1;
  int i = static_cast<int>((at - base) / sizeof(g_handles[0]));
  return i < static_cast<int>(s.devices.size()) ? i : -1;
}

// Runs fn(device, state) under the lock for a valid handle of an initialised
// library; `dynamic`: with values at most FLYT_NVML_CACHE_MS old.
template <typename F>
nvmlReturn_t WithDevice(nvmlDevice_t h, bool dynamic, F&& fn) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.refs == 0) return NVML_ERROR_UNINITIALIZED;
  int i = HandleIndex(s, h);
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
  if (dynamic) {
    nvmlReturn_t rc = RefreshLocked(s);
    if (rc != NVML_SUCCESS) return rc;
  }
  return fn(s.devices[i], i, s);
}

template <typename F>
nvmlReturn_t WithState(F&& fn) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.refs == 0) return NVML_ERROR_UNINITIALIZED;
  return fn(s);
}

nvmlReturn_t PutText(char* dst, unsigned len, const char* text) {
  if (dst == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  size_t n = std::strlen(text);
  if (n + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(dst, text, n + 1);
  return NVML_SUCCESS;
}

// "domain:bus:device.function", "domain:bus:device" or "bus:device.function", hex.
bool ParseBusId(const char* text, unsigned* domain, unsigned* bus, unsigned* device) {
  unsigned v[3] = {0, 0, 0};
  int parts = 0;
  const char* p = text;
  for (;;) {
    if (parts == 3 || !std::isxdigit(static_cast<unsigned char>(*p))) return false;
    char* end = nullptr;
    unsigned long x = std::strtoul(p, &end, 16);
    if (end - p > 8) return false;
    v[parts++] = static_cast<unsigned>(x);
    p = end;
    if (*p == ':') {
      ++p;
      continue;
    }
    if (*p == '.') {  // the function: one hex digit, 0 for a GPU
      ++p;
      if (!std::isxdigit(static_cast<unsigned char>(*p)) || p[1] != '\0') return false;
    } else if (*p != '\0') {
      return false;
    }
    break;
  }
  if (parts == 3) {
    *domain = v[0];
    *bus = v[1];
    *device = v[2];
  } else if (parts == 2) {
    *domain = 0;
    *bus = v[0];
    *device = v[1];
  } else {
    return false;
  }
  return true;
}

// Legacy ABIs (16-byte records, no MIG fields) and the current one.
void PutProcess(nvmlProcessInfo_v1_t* out, const NvmlProcess& p) {
  out->pid = p.pid;
  out->usedGpuMemory = p.used_memory;
}
void PutProcess(nvmlProcessInfo_t* out, const NvmlProcess& p) {
  out->pid = p.pid;
  out->usedGpuMemory = p.used_memory;
  out->gpuInstanceId = 0xffffffffu;
  out->computeInstanceId = 0xffffffffu;
}

// The tenant's processes with a context or memory on the device.
template <typename Info>
nvmlReturn_t ComputeProcesses(nvmlDevice_t h, unsigned* count, Info* infos) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(h, true, [&](const NvmlDevice&, int index, State& s) {
    unsigned n = 0;
    for (const auto& p : s.processes) n += p.device == static_cast<unsigned>(index);
    if (*count < n) {
      *count = n;
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && infos == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned at = 0;
    for (const auto& p : s.processes)
      if (p.device == static_cast<unsigned>(index)) PutProcess(&infos[at++], p);
    *count = n;
    return NVML_SUCCESS;
  });
}

// Graphics and MPS process lists: the tenant's work is the compute list's.
nvmlReturn_t NoProcesses(nvmlDevice_t h, unsigned* count) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(h, false, [&](const NvmlDevice&, int, State&) {
    *count = 0;
    return NVML_SUCCESS;
  });
}

nvmlReturn_t FillLegacyPci(nvmlDevice_t h, nvmlPciInfoLegacy_t* pci) {
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(h, false, [&](const NvmlDevice& d, int, State&) {
    nvmlPciInfoLegacy_t out{};
    std::snprintf(out.busId, sizeof(out.busId), "%04X:%02X:%02X.0", d.pci_domain & 0xffff,
                  d.pci_bus & 0xff, d.pci_device & 0xff);
    out.domain = d.pci_domain;
    out.bus = d.pci_bus;
    out.device = d.pci_device;
    if (d.valid & flyt::ops::kNvmlHasPciIds) {
      out.pciDeviceId = d.pci_device_id;
      out.pciSubSystemId = d.pci_subsystem_id;
    }
    *pci = out;
    return NVML_SUCCESS;
  });
}

// A field of the dynamic part, NOT_SUPPORTED unless the server had it.
template <typename T, typename Get>
nvmlReturn_t DynamicField(nvmlDevice_t h, uint32_t valid_bit, T* out, Get&& get) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(h, true, [&](const NvmlDevice& d, int, State&) {
    if (!(d.valid & valid_bit)) return NVML_ERROR_NOT_SUPPORTED;
    *out = static_cast<T>(get(d));
    return NVML_SUCCESS;
  });
}

template <typename Match>
nvmlReturn_t FindHandle(nvmlDevice_t* out, const char* what, Match&& match) {
  if (out == nullptr || what == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithState([&](State& s) {
    for (size_t i = 0; i < s.devices.size(); ++i) {
      if (match(s.devices[i])) {
        *out = &g_handles[i];
        return NVML_SUCCESS;
      }
    }
    return NVML_ERROR_NOT_FOUND;
  });
}

}  // namespace

// Lets flyt-server refuse to load this library as the GPU host's NVML.
FLYT_NVML_API int flyt_nvml_marker() { return 1; }

// --- initialisation

FLYT_NVML_API nvmlReturn_t nvmlInit_v2() { return Init(); }
FLYT_NVML_API nvmlReturn_t nvmlInit() { return Init(); }
// NO_GPUS / NO_ATTACH change nothing here: the tenant's GPUs are the server's.
FLYT_NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int) { return Init(); }

FLYT_NVML_API nvmlReturn_t nvmlShutdown() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (--s.refs == 0) {
    s.devices.clear();
    s.processes.clear();
    s.head = NvmlHead{};
    s.fetched_ns = 0;
  }
  return NVML_SUCCESS;
}

FLYT_NVML_API const char* nvmlErrorString(nvmlReturn_t rc) {
  switch (rc) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED:
      return "Already Initialized";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER:
      return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    case NVML_ERROR_IRQ_ISSUE:
      return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND:
      return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
      return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM:
      return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED:
      return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM:
      return "The operating system has blocked the request";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return "RM has detected an NVML/RM version mismatch";
    case NVML_ERROR_IN_USE:
      return "In use by another client";
    case NVML_ERROR_MEMORY:
      return "Insufficient Memory";
    case NVML_ERROR_NO_DATA:
      return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
      return "The requested vgpu operation is not available on target device, because ECC is "
             "enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES:
      return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED:
      return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
      return "The provided version is invalid/unsupported";
    default:
      return "Unknown Error";
  }
}

// --- system

FLYT_NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return WithState([&](State& s) {
    if (s.head.driver_version[0] == '\0') return NVML_ERROR_NOT_SUPPORTED;
    return PutText(version, length, s.head.driver_version);
  });
}

FLYT_NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  return WithState([&](State& s) {
    if (s.head.nvml_version[0] == '\0') return NVML_ERROR_NOT_SUPPORTED;
    return PutText(version, length, s.head.nvml_version);
  });
}

FLYT_NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithState([&](State& s) {
    *version = s.head.cuda_driver_version;
    return NVML_SUCCESS;
  });
}
FLYT_NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  return nvmlSystemGetCudaDriverVersion_v2(version);
}

// Processes of this host only (a pid from another client host names nothing here).
FLYT_NVML_API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char* name,
                                                    unsigned int length) {
  if (name == nullptr || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
  return WithState([&](State&) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%u/cmdline", pid);
    char text[512] = {};
    size_t n = 0;
    if (FILE* f = std::fopen(path, "re")) {
      n = std::fread(text, 1, sizeof(text) - 1, f);
      std::fclose(f);
    }
    if (n == 0) {  // a kernel thread or a zombie: its short name
      std::snprintf(path, sizeof(path), "/proc/%u/comm", pid);
      FILE* f = std::fopen(path, "re");
      if (f == nullptr) return NVML_ERROR_NOT_FOUND;
      n = std::fread(text, 1, sizeof(text) - 1, f);
      std::fclose(f);
      while (n > 0 && text[n - 1] == '\n') text[--n] = '\0';
    }
    text[sizeof(text) - 1] = '\0';
    std::snprintf(name, length, "%s", text);  // cut to the caller's room, as NVML does
    return NVML_SUCCESS;
  });
}

// --- devices: identity

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithState([&](State& s) {
    *count = static_cast<unsigned>(s.devices.size());
    return NVML_SUCCESS;
  });
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) {
  return nvmlDeviceGetCount_v2(count);
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithState([&](State& s) {
    if (index >= s.devices.size()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_handles[index];
    return NVML_SUCCESS;
  });
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  return FindHandle(device, uuid, [&](const NvmlDevice& d) {
    return strcasecmp(flyt::GpuUuidText(d.uuid).c_str(), uuid) == 0;
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id,
                                                            nvmlDevice_t* device) {
  unsigned domain = 0, bus = 0, dev = 0;
  if (bus_id != nullptr && device != nullptr && !ParseBusId(bus_id, &domain, &bus, &dev))
    return NVML_ERROR_NOT_FOUND;
  return FindHandle(device, bus_id, [&](const NvmlDevice& d) {
    return d.pci_domain == domain && d.pci_bus == bus && d.pci_device == dev;
  });
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* bus_id, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, false, [&](const NvmlDevice&, int i, State&) {
    *index = static_cast<unsigned>(i);
    return NVML_SUCCESS;
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  return WithDevice(device, false, [&](const NvmlDevice& d, int, State&) {
    return PutText(name, length, d.name);
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  return WithDevice(device, false, [&](const NvmlDevice& d, int, State&) {
    return PutText(uuid, length, flyt::GpuUuidText(d.uuid).c_str());
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minor) {
  if (minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, false, [&](const NvmlDevice& d, int, State&) {
    if (!(d.valid & flyt::ops::kNvmlHasMinor)) return NVML_ERROR_NOT_SUPPORTED;
    *minor = d.minor;
    return NVML_SUCCESS;
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, false, [&](const NvmlDevice& d, int, State&) {
    nvmlPciInfo_t out{};
    std::snprintf(out.busIdLegacy, sizeof(out.busIdLegacy), "%04X:%02X:%02X.0",
                  d.pci_domain & 0xffff, d.pci_bus & 0xff, d.pci_device & 0xff);
    std::snprintf(out.busId, sizeof(out.busId), "%08X:%02X:%02X.0", d.pci_domain, d.pci_bus & 0xff,
                  d.pci_device & 0xff);
    out.domain = d.pci_domain;
    out.bus = d.pci_bus;
    out.device = d.pci_device;
    if (d.valid & flyt::ops::kNvmlHasPciIds) {
      out.pciDeviceId = d.pci_device_id;
      out.pciSubSystemId = d.pci_subsystem_id;
    }
    *pci = out;
    return NVML_SUCCESS;
  });
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfoLegacy_t* pci) {
  return FillLegacyPci(device, pci);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfoLegacy_t* pci) {
  return FillLegacyPci(device, pci);
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major,
                                                              int* minor) {
  if (major == nullptr || minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, false, [&](const NvmlDevice& d, int, State&) {
    *major = d.cc_major;
    *minor = d.cc_minor;
    return NVML_SUCCESS;
  });
}

// Interconnect: answers the GPU host's NVML gave flyt-server (NvmlTopology), errors
// included; NCCL asks these while it starts.

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                                  nvmlGpuP2PCapsIndex_t index,
                                                  nvmlGpuP2PStatus_t* status) {
  if (status == nullptr || index >= flyt::ops::kNvmlP2pIndices) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device1, false, [&](const NvmlDevice& d, int, State& s) {
    int j = HandleIndex(s, device2);
    if (j < 0) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = d.topology.p2p_rc[index][j];
    if (rc == NVML_SUCCESS) *status = d.topology.p2p[index][j];
    return rc;
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                               nvmlDevice_t device2,
                                                               nvmlGpuTopologyLevel_t* level) {
  if (level == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device1, false, [&](const NvmlDevice& d, int, State& s) {
    int j = HandleIndex(s, device2);
    if (j < 0) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = d.topology.level_rc[j];
    if (rc == NVML_SUCCESS) *level = d.topology.level[j] * 10u;
    return rc;
  });
}

namespace {

nvmlReturn_t PcieValue(nvmlDevice_t device, flyt::ops::NvmlPcie which, unsigned* out) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, false, [&](const NvmlDevice& d, int, State&) {
    nvmlReturn_t rc = d.topology.pcie_rc[which];
    if (rc == NVML_SUCCESS) *out = d.topology.pcie[which];
    return rc;
  });
}

// fn(link) for a valid link number of a valid device.
template <typename F>
nvmlReturn_t WithLink(nvmlDevice_t device, unsigned link, F&& fn) {
  return WithDevice(device, false, [&](const NvmlDevice& d, int, State&) {
    if (link >= flyt::ops::kNvmlMaxLinks) return NVML_ERROR_INVALID_ARGUMENT;
    return fn(d.topology.links[link]);
  });
}

}  // namespace

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned* v) {
  return PcieValue(device, flyt::ops::kPcieMaxGeneration, v);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned* v) {
  return PcieValue(device, flyt::ops::kPcieMaxWidth, v);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned* v) {
  return PcieValue(device, flyt::ops::kPcieCurrGeneration, v);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned* v) {
  return PcieValue(device, flyt::ops::kPcieCurrWidth, v);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetPcieLinkMaxSpeed(nvmlDevice_t device, unsigned* v) {
  return PcieValue(device, flyt::ops::kPcieMaxSpeed, v);
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned link,
                                                    nvmlEnableState_t* active) {
  if (active == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithLink(device, link, [&](const flyt::ops::NvmlLink& l) {
    if (l.state_rc == NVML_SUCCESS) *active = l.active;
    return static_cast<nvmlReturn_t>(l.state_rc);
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned link,
                                                               nvmlPciInfo_t* pci) {
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithLink(device, link, [&](const flyt::ops::NvmlLink& l) {
    if (l.remote_rc == NVML_SUCCESS) std::memcpy(pci, l.remote_pci, sizeof(*pci));
    return static_cast<nvmlReturn_t>(l.remote_rc);
  });
}

// The unversioned symbol is the ABI from before _v2: the legacy layout (a 16-byte bus id,
// reserved words where _v2 has the long one). NCCL binds this name.
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned link,
                                                            nvmlPciInfoLegacy_t* pci) {
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  nvmlPciInfo_t full{};
  nvmlReturn_t rc = nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, &full);
  if (rc != NVML_SUCCESS) return rc;
  nvmlPciInfoLegacy_t out{};
  static_assert(offsetof(nvmlPciInfo_t, busId) == offsetof(nvmlPciInfoLegacy_t, reserved0));
  std::memcpy(&out, &full, offsetof(nvmlPciInfoLegacy_t, reserved0));
  *pci = out;
  return NVML_SUCCESS;
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned link,
                                                         nvmlNvLinkCapability_t cap,
                                                         unsigned* result) {
  if (result == nullptr || cap >= flyt::ops::kNvmlLinkCaps) return NVML_ERROR_INVALID_ARGUMENT;
  return WithLink(device, link, [&](const flyt::ops::NvmlLink& l) {
    if (l.cap_rc[cap] == NVML_SUCCESS) *result = l.cap[cap];
    return static_cast<nvmlReturn_t>(l.cap_rc[cap]);
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device,
                                                     nvmlDeviceArchitecture_t* arch) {
  if (arch == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, false, [&](const NvmlDevice& d, int, State&) {
    int cc = d.cc_major * 10 + d.cc_minor;
    nvmlDeviceArchitecture_t a = NVML_DEVICE_ARCH_UNKNOWN;
    if (d.cc_major >= 10) {
      a = NVML_DEVICE_ARCH_BLACKWELL;
    } else if (d.cc_major == 9) {
      a = NVML_DEVICE_ARCH_HOPPER;
    } else if (cc == 89) {
      a = NVML_DEVICE_ARCH_ADA;
    } else if (d.cc_major == 8) {
      a = NVML_DEVICE_ARCH_AMPERE;
    } else if (cc == 75) {
      a = NVML_DEVICE_ARCH_TURING;
    } else if (d.cc_major == 7) {
      a = NVML_DEVICE_ARCH_VOLTA;
    } else if (d.cc_major == 6) {
      a = NVML_DEVICE_ARCH_PASCAL;
    } else if (d.cc_major == 5) {
      a = NVML_DEVICE_ARCH_MAXWELL;
    } else if (d.cc_major == 3) {
      a = NVML_DEVICE_ARCH_KEPLER;
    }
    *arch = a;
    return NVML_SUCCESS;
  });
}

// Every process of the tenant may use the GPU at once.
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t* mode) {
  if (mode == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, false, [&](const NvmlDevice&, int, State&) {
    *mode = NVML_COMPUTEMODE_DEFAULT;
    return NVML_SUCCESS;
  });
}

// The tenant's slice, as for a MIG instance: its SMs and its memory.
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                      nvmlDeviceAttributes_t* attributes) {
  if (attributes == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, true, [&](const NvmlDevice& d, int, State&) {
    nvmlDeviceAttributes_t a{};
    a.multiprocessorCount = d.sm_count;
    a.memorySizeMB = d.memory_total >> 20;
    *attributes = a;
    return NVML_SUCCESS;
  });
}

// --- devices: memory, utilization, processes (the tenant's)

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, true, [&](const NvmlDevice& d, int, State&) {
    memory->total = d.memory_total;
    memory->used = d.memory_used;
    memory->free = d.memory_free;
    return NVML_SUCCESS;
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                      nvmlMemory_v2_t* memory) {
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  return WithDevice(device, true, [&](const NvmlDevice& d, int, State&) {
    memory->total = d.memory_total;
    memory->reserved = 0;
    memory->used = d.memory_used;
    memory->free = d.memory_free;
    return NVML_SUCCESS;
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                         nvmlUtilization_t* utilization) {
  if (utilization == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return WithDevice(device, true, [&](const NvmlDevice& d, int, State&) {
    if (!(d.valid & flyt::ops::kNvmlHasUtilization)) return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = d.util_gpu;
    utilization->memory = d.util_memory;
    return NVML_SUCCESS;
  });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                   unsigned int* count,
                                                                   nvmlProcessInfo_t* infos) {
  return ComputeProcesses(device, count, infos);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                   unsigned int* count,
                                                                   nvmlProcessInfo_v2_t* infos) {
  return ComputeProcesses(device, count, infos);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                                unsigned int* count,
                                                                nvmlProcessInfo_v1_t* infos) {
  return ComputeProcesses(device, count, infos);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                                    unsigned int* count,
                                                                    nvmlProcessInfo_t*) {
  return NoProcesses(device, count);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                                    unsigned int* count,
                                                                    nvmlProcessInfo_v2_t*) {
  return NoProcesses(device, count);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device,
                                                                 unsigned int* count,
                                                                 nvmlProcessInfo_v1_t*) {
  return NoProcesses(device, count);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                      unsigned int* count,
                                                                      nvmlProcessInfo_t*) {
  return NoProcesses(device, count);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                      unsigned int* count,
                                                                      nvmlProcessInfo_v2_t*) {
  return NoProcesses(device, count);
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device,
                                                                   unsigned int* count,
                                                                   nvmlProcessInfo_v1_t*) {
  return NoProcesses(device, count);
}

// --- devices: telemetry of the whole GPU (the GPU host's NVML)

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                                    nvmlTemperatureSensors_t sensor,
                                                    unsigned int* temp) {
  if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
  return DynamicField(device, flyt::ops::kNvmlHasTemperature, temp,
                      [](const NvmlDevice& d) { return d.temperature_c; });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) {
  return DynamicField(device, flyt::ops::kNvmlHasPower, power,
                      [](const NvmlDevice& d) { return d.power_mw; });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device,
                                                           unsigned int* limit) {
  return DynamicField(device, flyt::ops::kNvmlHasPowerLimit, limit,
                      [](const NvmlDevice& d) { return d.power_limit_mw; });
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device,
                                                             unsigned int* limit) {
  return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int* speed) {
  return DynamicField(device, flyt::ops::kNvmlHasFan, speed,
                      [](const NvmlDevice& d) { return d.fan_percent; });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device,
                                                         nvmlPstates_t* state) {
  return DynamicField(device, flyt::ops::kNvmlHasPerfState, state,
                      [](const NvmlDevice& d) { return d.perf_state; });
}
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t* state) {
  return nvmlDeviceGetPerformanceState(device, state);
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                  unsigned int* clock) {
  if (type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
  return DynamicField(device, flyt::ops::kNvmlHasClocks, clock,
                      [type](const NvmlDevice& d) { return d.clock_mhz[type]; });
}

FLYT_NVML_API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                     unsigned int* clock) {
  if (type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
  return DynamicField(device, flyt::ops::kNvmlHasMaxClocks, clock,
                      [type](const NvmlDevice& d) { return d.max_clock_mhz[type]; });
}

// Only the current clock (clock id 0, NVML_CLOCK_ID_CURRENT).
FLYT_NVML_API nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t type,
                                              unsigned int clock_id, unsigned int* mhz) {
  if (clock_id != 0) return NVML_ERROR_NOT_SUPPORTED;
  return nvmlDeviceGetClockInfo(device, type, mhz);
}

// --- everything else: NVML_ERROR_NOT_SUPPORTED, said once per name

#define FLYT_NVML_UNSUPPORTED(name)                                                     \
  FLYT_NVML_API nvmlReturn_t name() {                                                   \
    static std::atomic<bool> said{false};                                               \
    if (!said.exchange(true))                                                           \
      FLYT_INFO("%s is not answered by Flyt's NVML (NVML_ERROR_NOT_SUPPORTED)", #name); \
    return NVML_ERROR_NOT_SUPPORTED;                                                    \
  }
#include "nvml/nvml_unsupported.inc"
#undef FLYT_NVML_UNSUPPORTED
