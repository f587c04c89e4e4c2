// ops::kOpNvmlSnapshot: the tenant's view of its GPUs for Flyt's NVML library
// (src/nvml/, docs/nvml.md).
//
// Names, UUIDs, PCI ids and compute capability come from the device inventory;
// memory from the tenant's share (total = quota, or the GPU's memory without
// one; used = what the tenant's sessions hold); the process list from the live
// sessions. Utilization, temperature, power, clocks and the driver's version
// text come from the GPU host's own NVML, which the cuda backend dlopens (never
// links) on first use; without it they are left out (the client answers
// NVML_ERROR_NOT_SUPPORTED). The sim backend answers fixed values.
#include <dlfcn.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_uuid.h"
#include "common/log.h"
#include "nvml/nvml_types.h"
#include "server/session.h"
#include "server/tenant_board.h"

namespace flyt::server {
namespace {

// The GPU host's NVML, bound once and kept for the server's life.
struct HostNvml {
  bool ok = false;
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*HandleByUuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*UtilizationRates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*ProcessUtilization)(nvmlDevice_t, nvmlProcessUtilizationSample_t*, unsigned*,
                                     unsigned long long) = nullptr;
  nvmlReturn_t (*ComputeProcesses)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*) = nullptr;
  nvmlReturn_t (*Temperature)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned*) = nullptr;
  nvmlReturn_t (*PowerUsage)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*PowerLimit)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*ClockInfo)(nvmlDevice_t, nvmlClockType_t, unsigned*) = nullptr;
  nvmlReturn_t (*MaxClockInfo)(nvmlDevice_t, nvmlClockType_t, unsigned*) = nullptr;
  nvmlReturn_t (*PerfState)(nvmlDevice_t, nvmlPstates_t*) = nullptr;
  nvmlReturn_t (*FanSpeed)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*MinorNumber)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*PciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*MemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  // Interconnect (NvmlTopology).
  nvmlReturn_t (*Pcie[ops::kPcieCount])(nvmlDevice_t, unsigned*) = {};
  nvmlReturn_t (*P2PStatus)(nvmlDevice_t, nvmlDevice_t, nvmlGpuP2PCapsIndex_t,
                            nvmlGpuP2PStatus_t*) = nullptr;
  nvmlReturn_t (*CommonAncestor)(nvmlDevice_t, nvmlDevice_t, nvmlGpuTopologyLevel_t*) = nullptr;
  nvmlReturn_t (*LinkState)(nvmlDevice_t, unsigned, nvmlEnableState_t*) = nullptr;
  nvmlReturn_t (*LinkRemotePci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*LinkCapability)(nvmlDevice_t, unsigned, nvmlNvLinkCapability_t,
                                 unsigned*) = nullptr;
  std::string driver_version;
  std::string nvml_version;
};

template <typename F>
void Bind(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
}

const HostNvml& LoadHostNvml() {
  static const HostNvml* nvml = [] {
    auto* nv = new HostNvml;
    const char* path = std::getenv("FLYT_REAL_LIBNVML");
    if (path == nullptr || path[0] == '\0') path = "libnvidia-ml.so.1";
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      FLYT_WARN(
          "NVML of this GPU host is unavailable (%s): NVML clients see no utilization, "
          "temperature, power or clocks",
          dlerror());
      return nv;
    }
    if (dlsym(lib, "flyt_nvml_marker") != nullptr) {
      FLYT_WARN(
          "%s is Flyt's NVML library, not NVIDIA's: remove Flyt from LD_LIBRARY_PATH for "
          "flyt-server or set FLYT_REAL_LIBNVML; NVML clients see no utilization",
          path);
      return nv;
    }
    Bind(lib, "nvmlInit_v2", &nv->Init);
    Bind(lib, "nvmlDeviceGetHandleByUUID", &nv->HandleByUuid);
    Bind(lib, "nvmlDeviceGetUtilizationRates", &nv->UtilizationRates);
    Bind(lib, "nvmlDeviceGetProcessUtilization", &nv->ProcessUtilization);
    Bind(lib, "nvmlDeviceGetComputeRunningProcesses_v3", &nv->ComputeProcesses);
    Bind(lib, "nvmlDeviceGetTemperature", &nv->Temperature);
    Bind(lib, "nvmlDeviceGetPowerUsage", &nv->PowerUsage);
    Bind(lib, "nvmlDeviceGetEnforcedPowerLimit", &nv->PowerLimit);
    Bind(lib, "nvmlDeviceGetClockInfo", &nv->ClockInfo);
    Bind(lib, "nvmlDeviceGetMaxClockInfo", &nv->MaxClockInfo);
    Bind(lib, "nvmlDeviceGetPerformanceState", &nv->PerfState);
    Bind(lib, "nvmlDeviceGetFanSpeed", &nv->FanSpeed);
    Bind(lib, "nvmlDeviceGetMinorNumber", &nv->MinorNumber);
    Bind(lib, "nvmlDeviceGetPciInfo_v3", &nv->PciInfo);
    Bind(lib, "nvmlDeviceGetMemoryInfo", &nv->MemoryInfo);
    Bind(lib, "nvmlDeviceGetMaxPcieLinkGeneration", &nv->Pcie[ops::kPcieMaxGeneration]);
    Bind(lib, "nvmlDeviceGetMaxPcieLinkWidth", &nv->Pcie[ops::kPcieMaxWidth]);
    Bind(lib, "nvmlDeviceGetCurrPcieLinkGeneration", &nv->Pcie[ops::kPcieCurrGeneration]);
    Bind(lib, "nvmlDeviceGetCurrPcieLinkWidth", &nv->Pcie[ops::kPcieCurrWidth]);
    Bind(lib, "nvmlDeviceGetPcieLinkMaxSpeed", &nv->Pcie[ops::kPcieMaxSpeed]);
    Bind(lib, "nvmlDeviceGetP2PStatus", &nv->P2PStatus);
    Bind(lib, "nvmlDeviceGetTopologyCommonAncestor", &nv->CommonAncestor);
    Bind(lib, "nvmlDeviceGetNvLinkState", &nv->LinkState);
    Bind(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", &nv->LinkRemotePci);
    Bind(lib, "nvmlDeviceGetNvLinkCapability", &nv->LinkCapability);
    nvmlReturn_t (*driver)(char*, unsigned) = nullptr;
    nvmlReturn_t (*version)(char*, unsigned) = nullptr;
    Bind(lib, "nvmlSystemGetDriverVersion", &driver);
    Bind(lib, "nvmlSystemGetNVMLVersion", &version);
    if (nv->Init == nullptr || nv->HandleByUuid == nullptr) {
      FLYT_WARN("%s lacks nvmlInit_v2/nvmlDeviceGetHandleByUUID: NVML clients see no utilization",
                path);
      return nv;
    }
    nvmlReturn_t rc = nv->Init();
    if (rc != NVML_SUCCESS) {
      FLYT_WARN("nvmlInit_v2 of this GPU host failed with %d: NVML clients see no utilization", rc);
      return nv;
    }
    char text[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
    if (driver != nullptr && driver(text, sizeof(text)) == NVML_SUCCESS) nv->driver_version = text;
    text[0] = '\0';
    if (version != nullptr && version(text, sizeof(text)) == NVML_SUCCESS) nv->nvml_version = text;
    nv->ok = true;
    FLYT_INFO("NVML of this GPU host loaded (driver %s)", nv->driver_version.c_str());
    return nv;
  }();
  return *nvml;
}

uint64_t WallMicros() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  return static_cast<uint64_t>(tv.tv_sec) * 1000000u + static_cast<uint64_t>(tv.tv_usec);
}

// The GPU's utilization by this server process (the tenant's work on that
// GPU): its latest sample of the last second, 0 when it has none. False when
// NVML does not list this process on the GPU (under MPS the MPS server runs
// the work; in a container NVML knows the host's pids) or cannot sample.
bool ServerProcessUtilization(const HostNvml& nv, nvmlDevice_t dev, unsigned* gpu, unsigned* mem) {
  if (nv.ComputeProcesses == nullptr || nv.ProcessUtilization == nullptr) return false;
  const unsigned me = static_cast<unsigned>(getpid());
  std::vector<nvmlProcessInfo_t> procs(64);
  unsigned n = static_cast<unsigned>(procs.size());
  nvmlReturn_t rc = nv.ComputeProcesses(dev, &n, procs.data());
  if (rc == NVML_ERROR_INSUFFICIENT_SIZE && n <= 4096) {
    procs.resize(n + 16);
    n = static_cast<unsigned>(procs.size());
    rc = nv.ComputeProcesses(dev, &n, procs.data());
  }
  if (rc != NVML_SUCCESS) return false;
  procs.resize(std::min<size_t>(n, procs.size()));
  if (std::none_of(procs.begin(), procs.end(), [&](const auto& p) { return p.pid == me; }))
    return false;
  const unsigned long long since = WallMicros() - 1000000u;
  unsigned count = 0;
  rc = nv.ProcessUtilization(dev, nullptr, &count, since);
  *gpu = *mem = 0;
  if (rc == NVML_ERROR_NOT_FOUND || (rc == NVML_SUCCESS && count == 0)) return true;  // idle
  if (rc != NVML_ERROR_INSUFFICIENT_SIZE && rc != NVML_SUCCESS) return false;
  std::vector<nvmlProcessUtilizationSample_t> samples(count + 8);
  count = static_cast<unsigned>(samples.size());
  rc = nv.ProcessUtilization(dev, samples.data(), &count, since);
  if (rc == NVML_ERROR_NOT_FOUND) return true;
  if (rc != NVML_SUCCESS) return false;
  unsigned long long latest = 0;
  for (unsigned i = 0; i < count && i < samples.size(); ++i) {
    const auto& s = samples[i];
    if (s.pid != me || s.timeStamp < latest) continue;
    latest = s.timeStamp;
    *gpu = std::min(s.smUtil, 100u);
    *mem = std::min(s.memUtil, 100u);
  }
  return true;
}

// Telemetry of one GPU from the host's NVML.
void ReadHostNvml(const HostNvml& nv, const uint8_t* uuid, ops::NvmlDevice* d) {
  nvmlDevice_t dev = nullptr;
  if (nv.HandleByUuid(GpuUuidText(uuid).c_str(), &dev) != NVML_SUCCESS) return;
  unsigned a = 0, b = 0;
  if (ServerProcessUtilization(nv, dev, &a, &b)) {
    d->util_gpu = a;
    d->util_memory = b;
    d->util_source = static_cast<uint32_t>(ops::NvmlUtilSource::kServerProcess);
    d->valid |= ops::kNvmlHasUtilization;
  } else if (nvmlUtilization_t u{};
             nv.UtilizationRates != nullptr && nv.UtilizationRates(dev, &u) == NVML_SUCCESS) {
    d->util_gpu = u.gpu;
    d->util_memory = u.memory;
    d->util_source = static_cast<uint32_t>(ops::NvmlUtilSource::kWholeGpu);
    d->valid |= ops::kNvmlHasUtilization;
  }
  if (nv.Temperature && nv.Temperature(dev, NVML_TEMPERATURE_GPU, &a) == NVML_SUCCESS) {
    d->temperature_c = a;
    d->valid |= ops::kNvmlHasTemperature;
  }
  if (nv.PowerUsage && nv.PowerUsage(dev, &a) == NVML_SUCCESS) {
    d->power_mw = a;
    d->valid |= ops::kNvmlHasPower;
  }
  if (nv.PowerLimit && nv.PowerLimit(dev, &a) == NVML_SUCCESS) {
    d->power_limit_mw = a;
    d->valid |= ops::kNvmlHasPowerLimit;
  }
  if (nv.FanSpeed && nv.FanSpeed(dev, &a) == NVML_SUCCESS) {
    d->fan_percent = a;
    d->valid |= ops::kNvmlHasFan;
  }
  if (nvmlPstates_t p = NVML_PSTATE_UNKNOWN;
      nv.PerfState && nv.PerfState(dev, &p) == NVML_SUCCESS && p >= 0 && p < 16) {
    d->perf_state = static_cast<uint32_t>(p);
    d->valid |= ops::kNvmlHasPerfState;
  }
  bool clocks = nv.ClockInfo != nullptr, max_clocks = nv.MaxClockInfo != nullptr;
  for (unsigned t = 0; t < NVML_CLOCK_COUNT; ++t) {
    clocks = clocks && nv.ClockInfo(dev, t, &d->clock_mhz[t]) == NVML_SUCCESS;
    max_clocks = max_clocks && nv.MaxClockInfo(dev, t, &d->max_clock_mhz[t]) == NVML_SUCCESS;
  }
  if (clocks) d->valid |= ops::kNvmlHasClocks;
  if (max_clocks) d->valid |= ops::kNvmlHasMaxClocks;
  if (nv.MinorNumber && nv.MinorNumber(dev, &a) == NVML_SUCCESS) {
    d->minor = a;
    d->valid |= ops::kNvmlHasMinor;
  }
  if (nvmlPciInfo_t pci{}; nv.PciInfo && nv.PciInfo(dev, &pci) == NVML_SUCCESS) {
    d->pci_device_id = pci.pciDeviceId;
    d->pci_subsystem_id = pci.pciSubSystemId;
    d->valid |= ops::kNvmlHasPciIds;
  }
  // Free memory is no more than the GPU really has (other tenants, contexts).
  if (nvmlMemory_t m{}; nv.MemoryInfo && nv.MemoryInfo(dev, &m) == NVML_SUCCESS)
    d->memory_free = std::min<uint64_t>(d->memory_free, m.free);
}

// Every interconnect answer "not supported": what a client sees when the host has no NVML.
void NoTopology(ops::NvmlTopology* t) {
  for (auto& rc : t->pcie_rc) rc = NVML_ERROR_NOT_SUPPORTED;
  for (auto& row : t->p2p_rc)
    for (auto& rc : row) rc = NVML_ERROR_NOT_SUPPORTED;
  for (auto& rc : t->level_rc) rc = NVML_ERROR_NOT_SUPPORTED;
  for (auto& l : t->links) {
    l.state_rc = l.remote_rc = NVML_ERROR_NOT_SUPPORTED;
    for (auto& rc : l.cap_rc) rc = NVML_ERROR_NOT_SUPPORTED;
  }
}

// The host NVML's answers for GPU `self` among the snapshot's `all` (by index).
void ReadHostTopology(const HostNvml& nv, nvmlDevice_t self, const std::vector<nvmlDevice_t>& all,
                      ops::NvmlTopology* t) {
  if (self == nullptr) return;
  for (uint32_t k = 0; k < ops::kPcieCount; ++k)
    if (nv.Pcie[k] != nullptr) t->pcie_rc[k] = nv.Pcie[k](self, &t->pcie[k]);
  for (size_t j = 0; j < all.size() && j < ops::kMaxNvmlDevices; ++j) {
    if (all[j] == nullptr) continue;
    for (uint32_t k = 0; k < ops::kNvmlP2pIndices && nv.P2PStatus != nullptr; ++k) {
      nvmlGpuP2PStatus_t st = 0;
      t->p2p_rc[k][j] = static_cast<uint8_t>(nv.P2PStatus(self, all[j], k, &st));
      t->p2p[k][j] = static_cast<uint8_t>(st);
    }
    nvmlGpuTopologyLevel_t level = 0;
    if (nv.CommonAncestor != nullptr) {
      t->level_rc[j] = static_cast<uint8_t>(nv.CommonAncestor(self, all[j], &level));
      t->level[j] = static_cast<uint8_t>(level / 10);
    }
  }
  for (unsigned l = 0; l < ops::kNvmlMaxLinks; ++l) {
    ops::NvmlLink& link = t->links[l];
    if (nv.LinkState != nullptr) link.state_rc = nv.LinkState(self, l, &link.active);
    nvmlPciInfo_t pci{};
    if (nv.LinkRemotePci != nullptr) link.remote_rc = nv.LinkRemotePci(self, l, &pci);
    std::memcpy(link.remote_pci, &pci, sizeof(link.remote_pci));
    for (unsigned c = 0; c < ops::kNvmlLinkCaps && nv.LinkCapability != nullptr; ++c)
      link.cap_rc[c] = nv.LinkCapability(self, l, c, &link.cap[c]);
  }
}

// The interconnect of the GPUs in `view`, read once per set of GPUs for the worker's life
// (it is fixed hardware; a full read is ~150 NVML calls per GPU).
const std::vector<ops::NvmlTopology>& HostTopology(const HostNvml* nv,
                                                   const std::vector<ops::DeviceInfo>& view) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::vector<ops::NvmlTopology>>();
  std::string key;
  for (const auto& info : view) key += GpuUuidText(info.uuid);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  std::vector<ops::NvmlTopology> topo(view.size());
  for (auto& t : topo) NoTopology(&t);
  if (nv != nullptr) {
    std::vector<nvmlDevice_t> handles(view.size(), nullptr);
    for (size_t i = 0; i < view.size(); ++i)
      if (nv->HandleByUuid(GpuUuidText(view[i].uuid).c_str(), &handles[i]) != NVML_SUCCESS)
        handles[i] = nullptr;
    for (size_t i = 0; i < view.size(); ++i) ReadHostTopology(*nv, handles[i], handles, &topo[i]);
  }
  return cache->emplace(key, std::move(topo)).first->second;
}

// The sim's GPUs answer as a PCIe H200 without NVLink does (driver 580, measured): PCIe
// 5.0 x16 (the max speed is NVML's enum, 5 = 32000 MB/s), P2P status "not supported" for
// every caps index toward itself (with NVML_SUCCESS), no common ancestor with itself.
// Two GPUs of one sim server share a host bridge; P2P read, write and PCI say OK
// between them when the sim's driver answers cuDeviceCanAccessPeer with 1
// (flyt-server --sim-devices N without --sim-no-peer), NVLink and atomics "not
// supported" (a PCIe board); else "not supported" for all, as GPUs of two servers.
void SimTopology(DriverApi& api, size_t self, size_t count, ops::NvmlTopology* t) {
  const uint32_t pcie[ops::kPcieCount] = {5, 16, 5, 16, 5};
  for (uint32_t k = 0; k < ops::kPcieCount; ++k) {
    t->pcie_rc[k] = NVML_SUCCESS;
    t->pcie[k] = pcie[k];
  }
  for (size_t j = 0; j < count && j < ops::kMaxNvmlDevices; ++j) {
    int can = 0;
    if (j != self && api.cuDeviceCanAccessPeer != nullptr &&
        api.cuDeviceCanAccessPeer(&can, static_cast<CUdevice>(self), static_cast<CUdevice>(j)) !=
            CUDA_SUCCESS)
      can = 0;
    for (uint32_t k = 0; k < ops::kNvmlP2pIndices; ++k) {
      const bool ok = can != 0 && (k == 0 || k == 1 || k == 4);  // read, write, PCI
      t->p2p_rc[k][j] = NVML_SUCCESS;
      t->p2p[k][j] = ok ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    }
    t->level_rc[j] = j == self ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
    t->level[j] = NVML_TOPOLOGY_HOSTBRIDGE / 10;
  }
}

// The sim backend's fixed telemetry (a test double, like the sim itself).
void SimTelemetry(const ops::DeviceInfo& info, ops::NvmlDevice* d) {
  d->util_gpu = d->util_memory = 0;
  d->util_source = static_cast<uint32_t>(ops::NvmlUtilSource::kSim);
  d->temperature_c = 35;
  d->power_mw = 75000;
  d->power_limit_mw = 700000;
  d->perf_state = 0;
  uint32_t sm_mhz = static_cast<uint32_t>(info.attributes[CU_DEVICE_ATTRIBUTE_CLOCK_RATE] / 1000);
  uint32_t mem_mhz =
      static_cast<uint32_t>(info.attributes[CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE] / 1000);
  const uint32_t clocks[4] = {sm_mhz, sm_mhz, mem_mhz, 1755};
  std::memcpy(d->clock_mhz, clocks, sizeof(clocks));
  std::memcpy(d->max_clock_mhz, clocks, sizeof(clocks));
  d->minor = 0;
  d->pci_device_id = 0x233510de;  // an H200's device and vendor ids
  d->pci_subsystem_id = 0x18b010de;
  d->valid |= ops::kNvmlHasUtilization | ops::kNvmlHasTemperature | ops::kNvmlHasPower |
              ops::kNvmlHasPowerLimit | ops::kNvmlHasPerfState | ops::kNvmlHasClocks |
              ops::kNvmlHasMaxClocks | ops::kNvmlHasMinor | ops::kNvmlHasPciIds;
}

void CopyText(char* dst, size_t n, const std::string& text) {
  std::snprintf(dst, n, "%s", text.c_str());
}

}  // namespace

bool Session::NvmlSnapshot(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  uint32_t flags = 0;
  if (!in.Get(&flags) || in.remaining() != 0) return false;
  const bool sim = state_->api.is_sim;
  const HostNvml* nv = nullptr;
  if (!sim) {
    const HostNvml& host = LoadHostNvml();
    if (host.ok) nv = &host;
  }
  std::vector<ops::DeviceInfo> view = state_->share.Devices(nullptr);
  if (view.size() > ops::kMaxNvmlDevices) view.resize(ops::kMaxNvmlDevices);

  // One entry per client process with a context or memory, merged by (pid, device).
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> procs;
  for (const WorkerSlot& w : state_->board->layout().slots) {  // every client of the tenant
    if (w.state.load() != static_cast<uint32_t>(WorkerState::kServing)) continue;
    uint32_t pid = w.client_pid.load();
    int dev = w.device.load();
    if (pid == 0) continue;
    // A process appears on the device of its context and on each device it holds memory on.
    for (int d = 0; d < kBoardDevices && d < static_cast<int>(view.size()); ++d) {
      uint64_t bytes = w.charged_dev[d].load();
      if (bytes == 0 && d != dev) continue;
      if (procs.size() >= ops::kMaxNvmlProcesses) break;
      procs[{pid, static_cast<uint32_t>(d)}] += bytes;
    }
  }

  ops::NvmlHead head{};
  head.version = ops::kNvmlSnapshotVersion;
  head.head_size = sizeof(ops::NvmlHead);
  head.device_size = sizeof(ops::NvmlDevice);
  head.process_size = sizeof(ops::NvmlProcess);
  head.device_count = static_cast<uint32_t>(view.size());
  head.process_count = static_cast<uint32_t>(procs.size());
  head.cuda_driver_version = state_->driver_version;
  if (sim) {
    CopyText(head.driver_version, sizeof(head.driver_version), "flyt-sim");
    CopyText(head.nvml_version, sizeof(head.nvml_version), "flyt-sim");
  } else if (nv != nullptr) {
    CopyText(head.driver_version, sizeof(head.driver_version), nv->driver_version);
    CopyText(head.nvml_version, sizeof(head.nvml_version), nv->nvml_version);
  }
  out.Put(head);
  // The cached interconnect, not a copy of it (up to 64 GPUs x 3 KB per snapshot).
  const std::vector<ops::NvmlTopology>* topology = sim ? nullptr : &HostTopology(nv, view);
  for (size_t i = 0; i < view.size(); ++i) {
    const ops::DeviceInfo& info = view[i];
    const int* attr = info.attributes;
    ops::NvmlDevice d{};
    CopyText(d.name, sizeof(d.name), info.name);
    std::memcpy(d.uuid, info.uuid, sizeof(d.uuid));
    d.pci_domain = static_cast<uint32_t>(attr[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]);
    d.pci_bus = static_cast<uint32_t>(attr[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]);
    d.pci_device = static_cast<uint32_t>(attr[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]);
    d.cc_major = attr[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
    d.cc_minor = attr[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
    d.sm_count = static_cast<uint32_t>(attr[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]);
    d.sm_total = i < state_->devices.size()
                     ? static_cast<uint32_t>(
                           state_->devices[i].attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT])
                     : d.sm_count;
    // The quota holds per GPU: this GPU's use against it.
    d.memory_total = info.total_mem;
    d.memory_used = std::min(state_->share.memory_used(static_cast<int>(i)), d.memory_total);
    d.memory_free = d.memory_total - d.memory_used;
    NoTopology(&d.topology);
    if (sim) {
      SimTelemetry(info, &d);
      SimTopology(state_->api, i, view.size(), &d.topology);
    } else if (nv != nullptr) {
      ReadHostNvml(*nv, info.uuid, &d);
    }
    if (topology != nullptr && i < topology->size()) {
      d.topology = (*topology)[i];
    }
    out.Put(d);
  }
  for (const auto& [key, bytes] : procs) {
    ops::NvmlProcess p{key.first, key.second, bytes};
    out.Put(p);
  }
  keep_deferred_ = true;  // the app's asynchronous errors stay for the app
  *rc = CUDA_SUCCESS;
  return true;
}

}  // namespace flyt::server
