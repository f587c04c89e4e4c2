#include "node/gpu_inventory.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "common/log.h"

namespace flyt::node {
namespace {

using Json = nlohmann::json;

constexpr int kSimSmCount = 132;
constexpr int64_t kSimMemoryBytes = 141LL << 30;
constexpr const char* kSimName = "Simulated H200";

// --- NVML: the few prototypes we use (nvml.h is not needed at build time).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kNvmlNameSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kNvmlUuidSize = 96;     // > NVML_DEVICE_UUID_V2_BUFFER_SIZE (96)
constexpr unsigned kNvmlVersionSize = 96;  // > NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE (80)

struct Nvml {
  nvmlReturn_t (*Init)();
  nvmlReturn_t (*Shutdown)();
  const char* (*ErrorString)(nvmlReturn_t);
  nvmlReturn_t (*GetCount)(unsigned*);
  nvmlReturn_t (*GetHandleByIndex)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*GetName)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*GetUuid)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*GetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*GetDriverVersion)(char*, unsigned);
  nvmlReturn_t (*GetCudaDriverVersion)(int*);

  std::string Error(const char* call, nvmlReturn_t rc) const {
    const char* text = ErrorString != nullptr ? ErrorString(rc) : nullptr;
    return std::string(call) + " failed: " + (text ? text : "error") + " (" + std::to_string(rc) +
           ")";
  }
};

template <typename Fn>
bool Bind(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

// --- libcuda: SM counts by UUID (NVML has no SM count for a whole GPU).
struct CuUuid {
  unsigned char bytes[16];
};
constexpr int kCuAttrMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT

std::string FormatUuid(const CuUuid& u) {
  char text[64];
  const unsigned char* b = u.bytes;
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

// uuid -> SM count for every GPU CUDA sees. Uses NVIDIA's driver, never Flyt's
// client library (same rule and variable as flyt-server: FLYT_REAL_LIBCUDA).
Status CudaSmCounts(std::map<std::string, int>* out) {
  const char* path = std::getenv("FLYT_REAL_LIBCUDA");
  if (path == nullptr || path[0] == '\0') path = "libcuda.so.1";
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return Status::Error(std::string("cannot load NVIDIA's driver library to count SMs (") +
                         dlerror() + "): install the NVIDIA driver or set FLYT_REAL_LIBCUDA");
  if (dlsym(lib, "flyt_client_marker") != nullptr)
    return Status::Error(std::string(path) +
                         " is Flyt's client library, not NVIDIA's driver: remove Flyt from "
                         "LD_LIBRARY_PATH for flyt-node-manager or set FLYT_REAL_LIBCUDA");
  int (*init)(unsigned) = nullptr;
  int (*count)(int*) = nullptr;
  int (*get)(int*, int) = nullptr;
  int (*attr)(int*, int, int) = nullptr;
  int (*uuid)(CuUuid*, int) = nullptr;
  if (!Bind(lib, "cuDeviceGetUuid_v2", &uuid)) Bind(lib, "cuDeviceGetUuid", &uuid);
  if (!Bind(lib, "cuInit", &init) || !Bind(lib, "cuDeviceGetCount", &count) ||
      !Bind(lib, "cuDeviceGet", &get) || !Bind(lib, "cuDeviceGetAttribute", &attr) ||
      uuid == nullptr)
    return Status::Error(
        std::string(path) +
        " lacks cuInit/cuDeviceGetAttribute/cuDeviceGetUuid: " + "the NVIDIA driver is too old");
  int rc = init(0);
  if (rc != 0)
    return Status::Error("cuInit failed with CUDA error " + std::to_string(rc) +
                         ": check the driver with nvidia-smi");
  int n = 0;
  rc = count(&n);
  if (rc != 0)
    return Status::Error("cuDeviceGetCount failed with CUDA error " + std::to_string(rc));
  for (int i = 0; i < n; ++i) {
    int dev = 0, sms = 0;
    CuUuid u{};
    rc = get(&dev, i);
    if (rc == 0) rc = attr(&sms, kCuAttrMultiprocessorCount, dev);
    if (rc == 0) rc = uuid(&u, dev);
    if (rc != 0)
      return Status::Error("cannot read CUDA device " + std::to_string(i) + ": CUDA error " +
                           std::to_string(rc));
    (*out)[FormatUuid(u)] = sms;
  }
  // The library stays loaded: unloading a driver library is not supported.
  return Status::Ok();
}

Status NvmlInventory(std::vector<GpuInfo>* out) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return Status::Error(std::string("cannot load NVML (") + dlerror() +
                         "): install the NVIDIA driver on this host, or set inventory=sim:N "
                         "to simulate N GPUs on a host without any");
  Nvml nv{};
  Bind(lib, "nvmlErrorString", &nv.ErrorString);
  if (!Bind(lib, "nvmlInit_v2", &nv.Init) || !Bind(lib, "nvmlShutdown", &nv.Shutdown) ||
      !Bind(lib, "nvmlDeviceGetCount_v2", &nv.GetCount) ||
      !Bind(lib, "nvmlDeviceGetHandleByIndex_v2", &nv.GetHandleByIndex) ||
      !Bind(lib, "nvmlDeviceGetName", &nv.GetName) ||
      !Bind(lib, "nvmlDeviceGetUUID", &nv.GetUuid) ||
      !Bind(lib, "nvmlDeviceGetMemoryInfo", &nv.GetMemoryInfo) ||
      !Bind(lib, "nvmlSystemGetDriverVersion", &nv.GetDriverVersion) ||
      !Bind(lib, "nvmlSystemGetCudaDriverVersion_v2", &nv.GetCudaDriverVersion)) {
    const char* err = dlerror();
    return Status::Error("libnvidia-ml.so.1 lacks a function the node manager needs (" +
                         std::string(err ? err : "?") + "): the driver is too old");
  }
  nvmlReturn_t rc = nv.Init();
  if (rc != kNvmlSuccess)
    return Status::Error(nv.Error("nvmlInit_v2", rc) + ": check the driver with nvidia-smi");
  Status st;
  char version[kNvmlVersionSize] = {};
  int cuda_version = 0;
  unsigned count = 0;
  if ((rc = nv.GetDriverVersion(version, sizeof(version))) != kNvmlSuccess)
    st = Status::Error(nv.Error("nvmlSystemGetDriverVersion", rc));
  else if ((rc = nv.GetCudaDriverVersion(&cuda_version)) != kNvmlSuccess)
    st = Status::Error(nv.Error("nvmlSystemGetCudaDriverVersion_v2", rc));
  else if ((rc = nv.GetCount(&count)) != kNvmlSuccess)
    st = Status::Error(nv.Error("nvmlDeviceGetCount_v2", rc));
  std::vector<GpuInfo> gpus;
  for (unsigned i = 0; st.ok() && i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    char name[kNvmlNameSize] = {}, uuid[kNvmlUuidSize] = {};
    nvmlMemory_t mem{};
    const char* call = nullptr;
    if ((rc = nv.GetHandleByIndex(i, &dev)) != kNvmlSuccess)
      call = "nvmlDeviceGetHandleByIndex_v2";
    else if ((rc = nv.GetName(dev, name, sizeof(name))) != kNvmlSuccess)
      call = "nvmlDeviceGetName";
    else if ((rc = nv.GetUuid(dev, uuid, sizeof(uuid))) != kNvmlSuccess)
      call = "nvmlDeviceGetUUID";
    else if ((rc = nv.GetMemoryInfo(dev, &mem)) != kNvmlSuccess)
      call = "nvmlDeviceGetMemoryInfo";
    if (call != nullptr) {
      st = Status::Error(nv.Error(call, rc) + " for GPU " + std::to_string(i));
      break;
    }
    GpuInfo g;
    g.uuid = uuid;
    g.index = static_cast<int>(i);
    g.name = name;
    g.memory_bytes = static_cast<int64_t>(mem.total);
    g.driver_version = version;
    g.cuda_version = CudaVersionText(cuda_version);
    gpus.push_back(std::move(g));
  }
  nv.Shutdown();
  if (!st.ok()) return st;
  if (gpus.empty()) {
    *out = {};
    return Status::Ok();
  }
  std::map<std::string, int> sms;
  st = CudaSmCounts(&sms);
  if (!st.ok()) return st;
  out->clear();
  for (auto& g : gpus) {
    auto it = sms.find(g.uuid);
    if (it == sms.end()) {
      // Hidden by CUDA_VISIBLE_DEVICES (an operator's way to keep GPUs out of
      // Flyt), or a MIG-enabled GPU: it cannot be given to a flyt-server.
      FLYT_WARN("GPU %d (%s, %s) is not visible to CUDA from the node manager: left out", g.index,
                g.name.c_str(), g.uuid.c_str());
      continue;
    }
    g.sm_count = it->second;
    out->push_back(std::move(g));
  }
  return Status::Ok();
}

bool AllDigits(const std::string& s) {
  if (s.empty() || s.size() > 4) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// 64-bit FNV-1a: stable across builds and platforms (std::hash is not).
uint64_t Fnv1a(const std::string& s, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// splitmix64's finaliser: every input bit reaches every output bit.
uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

Json ToJson(const GpuInfo& g) {
  return Json{{"uuid", g.uuid},
              {"index", g.index},
              {"name", g.name},
              {"sm_count", g.sm_count},
              {"memory_bytes", g.memory_bytes},
              {"driver_version", g.driver_version},
              {"cuda_version", g.cuda_version}};
}

std::string CudaVersionText(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

bool IsSimulatedInventory(const std::string& spec) { return spec.rfind("sim:", 0) == 0; }

std::string SimulatedUuid(const std::string& node_id, int index) {
  uint64_t a = Mix(Fnv1a(node_id + "#" + std::to_string(index)));
  uint64_t b = Mix(a ^ 0x666c79742d73696dULL);
  unsigned char bytes[16];
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<unsigned char>(a >> (8 * i));
    bytes[8 + i] = static_cast<unsigned char>(b >> (8 * i));
  }
  CuUuid u;
  std::copy(bytes, bytes + 16, u.bytes);
  return FormatUuid(u);
}

std::vector<GpuInfo> SimulatedGpus(int count, const std::string& node_id) {
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < count; ++i) {
    GpuInfo g;
    g.uuid = SimulatedUuid(node_id, i);
    g.index = i;
    g.name = kSimName;
    g.sm_count = kSimSmCount;
    g.memory_bytes = kSimMemoryBytes;
    g.driver_version = "sim";
    g.cuda_version = "13.0";
    gpus.push_back(std::move(g));
  }
  return gpus;
}

Status ParseSimInventory(const std::string& json_text, const std::string& node_id,
                         const std::string& source, std::vector<GpuInfo>* out) {
  Json doc = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return Status::Error(source + " is not valid JSON: expected {\"gpus\":[{...}]}");
  const Json* list = &doc;
  if (doc.is_object()) {
    auto it = doc.find("gpus");
    if (it == doc.end()) return Status::Error(source + " has no \"gpus\" list");
    list = &*it;
  }
  if (!list->is_array()) return Status::Error(source + ": \"gpus\" must be a list of objects");
  std::vector<GpuInfo> gpus = SimulatedGpus(static_cast<int>(list->size()), node_id);
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& e = (*list)[i];
    const std::string where = source + ": GPU " + std::to_string(i);
    if (!e.is_object()) return Status::Error(where + " is not an object");
    GpuInfo& g = gpus[i];
    for (auto it = e.begin(); it != e.end(); ++it) {
      const std::string& key = it.key();
      const Json& v = it.value();
      bool ok = true;
      if (key == "cuda_version" && v.is_number_integer() && v.get<int64_t>() > 0 &&
          v.get<int64_t>() < 1000000) {
        g.cuda_version = CudaVersionText(v.get<int>());
      } else if (key == "uuid" || key == "name" || key == "driver_version" ||
                 key == "cuda_version") {
        ok = v.is_string() && !v.get_ref<const std::string&>().empty();
        if (ok)
          (key == "uuid"             ? g.uuid
           : key == "name"           ? g.name
           : key == "driver_version" ? g.driver_version
                                     : g.cuda_version) = v.get<std::string>();
      } else if (key == "sm_count") {
        ok = v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() < (1 << 30);
        if (ok) g.sm_count = v.get<int>();
      } else if (key == "memory_bytes") {
        ok = v.is_number_integer() && v.get<int64_t>() > 0;
        if (ok) g.memory_bytes = v.get<int64_t>();
      } else if (key == "memory_gb") {
        ok = v.is_number() && v.get<double>() > 0 && v.get<double>() < 1e9;
        if (ok) g.memory_bytes = static_cast<int64_t>(v.get<double>() * (1LL << 30));
      } else if (key != "index") {
        return Status::Error(where + ": unknown field \"" + key +
                             "\" (known: uuid, name, sm_count, memory_bytes, memory_gb, "
                             "driver_version, cuda_version)");
      }
      if (!ok) return Status::Error(where + ": bad value for \"" + key + "\": " + v.dump());
    }
  }
  for (size_t i = 0; i < gpus.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (gpus[i].uuid == gpus[j].uuid)
        return Status::Error(source + ": GPUs " + std::to_string(j) + " and " + std::to_string(i) +
                             " have the same uuid " + gpus[i].uuid);
  *out = std::move(gpus);
  return Status::Ok();
}

Status LoadInventory(const std::string& spec, const std::string& node_id,
                     std::vector<GpuInfo>* out) {
  if (spec == "nvml") return NvmlInventory(out);
  if (!IsSimulatedInventory(spec))
    return Status::Error("unknown inventory '" + spec +
                         "': use nvml (the real GPUs), sim:N or sim:FILE.json");
  std::string arg = spec.substr(4);
  if (AllDigits(arg)) {
    int n = std::atoi(arg.c_str());
    if (n < 1) return Status::Error("inventory " + spec + ": simulate at least one GPU");
    *out = SimulatedGpus(n, node_id);
    return Status::Ok();
  }
  std::ifstream in(arg);
  if (!in)
    return Status::Error("cannot read simulated inventory file '" + arg + "' (inventory=" + spec +
                         "): give sim:N or an existing JSON file");
  std::stringstream text;
  text << in.rdbuf();
  return ParseSimInventory(text.str(), node_id, arg, out);
}

}  // namespace flyt::node
