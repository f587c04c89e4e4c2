/* nvml_query: Flyt's libnvidia-ml.so.1 against a sim flyt-server (tests/e2e).
 *
 * A plain C program (no nvcc): it dlopens libnvidia-ml.so.1 and libcuda.so.1 as
 * monitoring tools and PyTorch do, with its own declarations of the NVML ABI
 * (written apart from src/nvml/nvml_types.h, so that a layout mistake there
 * shows here). Modes:
 *   check QUOTA SM [OTHER_PID OTHER_BYTES]  the tenant's view: identity equal to
 *       what CUDA reports, memory total = QUOTA, SM count, used memory and the
 *       process list following this program's cuMemAlloc (and OTHER_PID holding
 *       OTHER_BYTES, another program of the same server), handles by UUID and
 *       PCI bus id, unsupported entry points, init/shutdown reference counting
 *   noserver      nvmlInit fails cleanly (no flyt-server listening)
 *   notflyt       nvmlInit fails with NVML_ERROR_LIBRARY_NOT_FOUND (another libcuda.so.1)
 *   peers N       a server with N GPUs (flyt-server --sim-devices N): count, one
 *                 handle per index with its own index, UUID and PCI bus id (equal
 *                 to CUDA's), P2P status and common ancestor between GPUs 0 and 1
 *   gone          prints "ready", then polls memory until the server is killed:
 *                 NVML_ERROR_GPU_IS_LOST, names still answered
 * Prints key=value lines and ends with "nvml_query: PASS" (exit 0), or
 * "nvml_query: FAIL at nvml_query.c:LINE (...)" (exit 1). SIGALRM after
 * E2E_WATCHDOG_S seconds: exit 3.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef void* nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} Memory;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} MemoryV2;
typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} PciInfo;
typedef struct {
  unsigned int gpu, memory;
} Utilization;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} ProcessV1;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} Process;
typedef struct {
  unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
      sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
  unsigned long long memorySizeMB;
} Attributes;

enum {
  kSuccess = 0,
  kUninitialized = 1,
  kNotSupported = 3,
  kNotFound = 6,
  kInsufficientSize = 7,
  kGpuIsLost = 15,
  kVersionMismatch = 25,
};
#define MEMORY_V2_VERSION ((unsigned)(sizeof(MemoryV2) | (2u << 24)))

static const char* g_step = "start";
static void* g_nvml;
static void* g_cuda;

#define FAIL(...)                                                                \
  do {                                                                           \
    printf("nvml_query: FAIL at nvml_query.c:%d (step %s): ", __LINE__, g_step); \
    printf(__VA_ARGS__);                                                         \
    printf("\n");                                                                \
    fflush(stdout);                                                              \
    exit(1);                                                                     \
  } while (0)
#define CHECK(cond, ...)            \
  do {                              \
    if (!(cond)) FAIL(__VA_ARGS__); \
  } while (0)
#define NVML_OK(call)                                     \
  do {                                                    \
    nvmlReturn_t rc_ = (call);                            \
    CHECK(rc_ == kSuccess, "%s returned %d", #call, rc_); \
  } while (0)
#define CU_OK(call)                                                \
  do {                                                             \
    CUresult rc_ = (call);                                         \
    CHECK(rc_ == CUDA_SUCCESS, "%s returned %d", #call, (int)rc_); \
  } while (0)

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "nvml_query: FAIL (watchdog: hung)\n";
  ssize_t unused = write(1, msg, sizeof(msg) - 1);
  (void)unused;
  _exit(3);
}

static void* nvml_sym(const char* name) {
  void* p = dlsym(g_nvml, name);
  CHECK(p != NULL, "libnvidia-ml.so.1 lacks %s", name);
  return p;
}
static void* cuda_sym(const char* name) {
  void* p = dlsym(g_cuda, name);
  CHECK(p != NULL, "libcuda.so.1 lacks %s", name);
  return p;
}
#define NV(type, name) ((type)nvml_sym(#name))
#define CU(type, name) ((type)cuda_sym(#name))

typedef nvmlReturn_t (*Void_t)(void);
typedef nvmlReturn_t (*Flags_t)(unsigned);
typedef nvmlReturn_t (*Uint_t)(unsigned*);
typedef nvmlReturn_t (*Int_t)(int*);
typedef nvmlReturn_t (*Text_t)(char*, unsigned);
typedef nvmlReturn_t (*ByIndex_t)(unsigned, nvmlDevice_t*);
typedef nvmlReturn_t (*ByText_t)(const char*, nvmlDevice_t*);
typedef nvmlReturn_t (*DevText_t)(nvmlDevice_t, char*, unsigned);
typedef nvmlReturn_t (*DevUint_t)(nvmlDevice_t, unsigned*);
typedef nvmlReturn_t (*DevInt_t)(nvmlDevice_t, int*);
typedef nvmlReturn_t (*DevUintUint_t)(nvmlDevice_t, unsigned, unsigned*);
typedef nvmlReturn_t (*DevPtr_t)(nvmlDevice_t, void*);
typedef nvmlReturn_t (*DevIntInt_t)(nvmlDevice_t, int*, int*);
typedef nvmlReturn_t (*Procs_t)(nvmlDevice_t, unsigned*, void*);
typedef const char* (*ErrorString_t)(nvmlReturn_t);
typedef nvmlReturn_t (*DevDevUintUint_t)(nvmlDevice_t, nvmlDevice_t, unsigned, unsigned*);
typedef nvmlReturn_t (*DevDevUint_t)(nvmlDevice_t, nvmlDevice_t, unsigned*);
typedef nvmlReturn_t (*DevUintPtr_t)(nvmlDevice_t, unsigned, void*);
typedef nvmlReturn_t (*DevUintUintUint_t)(nvmlDevice_t, unsigned, unsigned, unsigned*);

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void open_libs(int with_cuda) {
  g_nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(g_nvml != NULL, "dlopen libnvidia-ml.so.1: %s", dlerror());
  CHECK(dlsym(g_nvml, "flyt_nvml_marker") != NULL, "libnvidia-ml.so.1 is not Flyt's");
  if (with_cuda) {
    g_cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(g_cuda != NULL, "dlopen libcuda.so.1: %s", dlerror());
  }
}

static Memory memory_now(nvmlDevice_t dev) {
  Memory m;
  memset(&m, 0xab, sizeof(m));
  NVML_OK(NV(DevPtr_t, nvmlDeviceGetMemoryInfo)(dev, &m));
  CHECK(m.used + m.free == m.total, "used %llu + free %llu != total %llu", m.used, m.free, m.total);
  return m;
}

/* Entries of the v3 process list (24-byte records). */
static unsigned processes(nvmlDevice_t dev, Process* out, unsigned room) {
  Procs_t get = NV(Procs_t, nvmlDeviceGetComputeRunningProcesses_v3);
  unsigned n = 0;
  nvmlReturn_t rc = get(dev, &n, NULL);
  CHECK(rc == kSuccess || rc == kInsufficientSize, "process count query returned %d", rc);
  CHECK(n <= room, "%u processes", n);
  memset(out, 0xcd, sizeof(*out) * room);
  unsigned got = room;
  NVML_OK(get(dev, &got, out));
  CHECK(got == n, "process count %u, then %u", n, got);
  for (unsigned i = 0; i < got; ++i)
    CHECK(out[i].gpuInstanceId == 0xffffffffu && out[i].computeInstanceId == 0xffffffffu,
          "MIG ids of a process: %u %u", out[i].gpuInstanceId, out[i].computeInstanceId);
  return got;
}

static const Process* find_pid(const Process* p, unsigned n, unsigned pid) {
  for (unsigned i = 0; i < n; ++i)
    if (p[i].pid == pid) return &p[i];
  return NULL;
}

static int check(int argc, char** argv) {
  if (argc < 4) FAIL("usage: nvml_query check QUOTA SM [OTHER_PID OTHER_BYTES]");
  unsigned long long quota = strtoull(argv[2], NULL, 10);
  unsigned sm = (unsigned)strtoul(argv[3], NULL, 10);
  unsigned other_pid = argc >= 6 ? (unsigned)strtoul(argv[4], NULL, 10) : 0;
  unsigned long long other_bytes = argc >= 6 ? strtoull(argv[5], NULL, 10) : 0;
  const unsigned long long kAlloc = 8ull << 20;
  open_libs(1);

  g_step = "before init";
  unsigned count = 99;
  CHECK(NV(Uint_t, nvmlDeviceGetCount_v2)(&count) == kUninitialized, "query before nvmlInit");
  CHECK(NV(Void_t, nvmlShutdown)() == kUninitialized, "nvmlShutdown before nvmlInit");

  g_step = "init";
  NVML_OK(NV(Void_t, nvmlInit_v2)());
  NVML_OK(NV(Flags_t, nvmlInitWithFlags)(0));  // a second reference
  NVML_OK(NV(Uint_t, nvmlDeviceGetCount_v2)(&count));
  CHECK(count == 1, "device count %u", count);
  printf("device_count=%u\n", count);

  g_step = "cuda identity";
  CU_OK(CU(CUresult(*)(unsigned), cuInit)(0));
  CUdevice cu_dev = 0;
  CU_OK(CU(CUresult(*)(CUdevice*, int), cuDeviceGet)(&cu_dev, 0));
  char cu_name[256] = {0};
  CU_OK(CU(CUresult(*)(char*, int, CUdevice), cuDeviceGetName)(cu_name, sizeof(cu_name), cu_dev));
  CUuuid cu_uuid;
  CU_OK(CU(CUresult(*)(CUuuid*, CUdevice), cuDeviceGetUuid_v2)(&cu_uuid, cu_dev));
  const unsigned char* b = (const unsigned char*)cu_uuid.bytes;
  char want_uuid[64];
  snprintf(want_uuid, sizeof(want_uuid),
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
  char cu_bus[64] = {0};
  CU_OK(CU(CUresult(*)(char*, int, CUdevice), cuDeviceGetPCIBusId)(cu_bus, sizeof(cu_bus), cu_dev));
  size_t cu_total = 0;
  CU_OK(CU(CUresult(*)(size_t*, CUdevice), cuDeviceTotalMem_v2)(&cu_total, cu_dev));
  int cu_major = 0, cu_minor = 0, cu_sm = 0;
  CUresult (*attr)(int*, CUdevice_attribute, CUdevice) =
      CU(CUresult(*)(int*, CUdevice_attribute, CUdevice), cuDeviceGetAttribute);
  CU_OK(attr(&cu_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu_dev));
  CU_OK(attr(&cu_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu_dev));
  CU_OK(attr(&cu_sm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cu_dev));

  g_step = "identity";
  nvmlDevice_t dev = NULL;
  NVML_OK(NV(ByIndex_t, nvmlDeviceGetHandleByIndex_v2)(0, &dev));
  nvmlDevice_t again = NULL;
  NVML_OK(NV(ByIndex_t, nvmlDeviceGetHandleByIndex)(0, &again));
  CHECK(again == dev, "handles of index 0 differ");
  CHECK(NV(ByIndex_t, nvmlDeviceGetHandleByIndex_v2)(1, &again) != kSuccess, "index 1 exists");
  char name[96] = {0};
  NVML_OK(NV(DevText_t, nvmlDeviceGetName)(dev, name, sizeof(name)));
  CHECK(strcmp(name, cu_name) == 0, "NVML name '%s', CUDA name '%s'", name, cu_name);
  CHECK(NV(DevText_t, nvmlDeviceGetName)(dev, name, 4) == kInsufficientSize,
        "a 4-byte name buffer");
  printf("name=%s\n", name);
  char uuid[96] = {0};
  NVML_OK(NV(DevText_t, nvmlDeviceGetUUID)(dev, uuid, sizeof(uuid)));
  CHECK(strcmp(uuid, want_uuid) == 0, "NVML UUID %s, CUDA UUID %s", uuid, want_uuid);
  printf("uuid=%s\n", uuid);
  unsigned index = 99;
  NVML_OK(NV(DevUint_t, nvmlDeviceGetIndex)(dev, &index));
  CHECK(index == 0, "index %u", index);
  unsigned minor = 99;
  NVML_OK(NV(DevUint_t, nvmlDeviceGetMinorNumber)(dev, &minor));
  int major = 0, cc_minor = 0;
  NVML_OK(NV(DevIntInt_t, nvmlDeviceGetCudaComputeCapability)(dev, &major, &cc_minor));
  CHECK(major == cu_major && cc_minor == cu_minor, "cc %d.%d, CUDA %d.%d", major, cc_minor,
        cu_major, cu_minor);
  printf("compute_capability=%d.%d\n", major, cc_minor);
  unsigned arch = 0;
  NVML_OK(NV(DevUint_t, nvmlDeviceGetArchitecture)(dev, &arch));
  if (major == 9) CHECK(arch == 9, "architecture %u for cc 9.x", arch);
  int cuda_version = 0;
  NVML_OK(NV(Int_t, nvmlSystemGetCudaDriverVersion_v2)(&cuda_version));
  int cu_version = 0;
  CU_OK(CU(CUresult(*)(int*), cuDriverGetVersion)(&cu_version));
  CHECK(cuda_version == cu_version, "NVML CUDA version %d, cuDriverGetVersion %d", cuda_version,
        cu_version);
  char text[96] = {0};
  NVML_OK(NV(Text_t, nvmlSystemGetDriverVersion)(text, sizeof(text)));
  printf("driver_version=%s\n", text);
  NVML_OK(NV(Text_t, nvmlSystemGetNVMLVersion)(text, sizeof(text)));

  g_step = "pci";
  PciInfo pci;
  memset(&pci, 0xee, sizeof(pci));
  NVML_OK(NV(DevPtr_t, nvmlDeviceGetPciInfo_v3)(dev, &pci));
  CHECK(strcasecmp(pci.busId, cu_bus) == 0, "NVML bus id %s, CUDA %s", pci.busId, cu_bus);
  printf("bus_id=%s\nbus_id_legacy=%s\n", pci.busId, pci.busIdLegacy);
  ByText_t by_bus = NV(ByText_t, nvmlDeviceGetHandleByPciBusId_v2);
  ByText_t by_uuid = NV(ByText_t, nvmlDeviceGetHandleByUUID);
  again = NULL;
  NVML_OK(by_bus(pci.busId, &again));
  CHECK(again == dev, "handle by bus id %s", pci.busId);
  again = NULL;
  NVML_OK(by_bus(pci.busIdLegacy, &again));
  CHECK(again == dev, "handle by legacy bus id %s", pci.busIdLegacy);
  again = NULL;
  NVML_OK(by_bus(cu_bus, &again));
  CHECK(again == dev, "handle by CUDA's bus id %s", cu_bus);
  CHECK(by_bus("0000:ff:1f.0", &again) == kNotFound, "an unknown bus id");
  again = NULL;
  NVML_OK(by_uuid(uuid, &again));
  CHECK(again == dev, "handle by UUID");
  CHECK(by_uuid("GPU-00000000-0000-0000-0000-000000000000", &again) == kNotFound,
        "an unknown UUID");

  g_step = "memory";
  Memory m0 = memory_now(dev);
  CHECK(m0.total == quota, "total %llu, quota %llu", m0.total, quota);
  CHECK(m0.total == cu_total, "total %llu, cuDeviceTotalMem %zu", m0.total, cu_total);
  CHECK(m0.used == other_bytes, "used %llu before this program allocates, want %llu", m0.used,
        other_bytes);
  MemoryV2 m2;
  memset(&m2, 0, sizeof(m2));
  m2.version = MEMORY_V2_VERSION;
  NVML_OK(NV(DevPtr_t, nvmlDeviceGetMemoryInfo_v2)(dev, &m2));
  CHECK(m2.total == quota && m2.used == m0.used && m2.free == m0.free && m2.reserved == 0,
        "v2: total %llu used %llu free %llu reserved %llu", m2.total, m2.used, m2.free,
        m2.reserved);
  m2.version = 1u << 24 | (unsigned)sizeof(MemoryV2);
  CHECK(NV(DevPtr_t, nvmlDeviceGetMemoryInfo_v2)(dev, &m2) == kVersionMismatch,
        "a wrong nvmlMemory_v2_t version");
  printf("mem_total=%llu\nmem_used_before=%llu\n", m0.total, m0.used);
  Attributes at;
  memset(&at, 0xff, sizeof(at));
  NVML_OK(NV(DevPtr_t, nvmlDeviceGetAttributes_v2)(dev, &at));
  CHECK(at.multiprocessorCount == sm && (int)sm == cu_sm, "SMs: NVML %u, CUDA %d, want %u",
        at.multiprocessorCount, cu_sm, sm);
  CHECK(at.memorySizeMB == quota >> 20, "memorySizeMB %llu", at.memorySizeMB);
  printf("sm_count=%u\n", at.multiprocessorCount);

  /* What NCCL asks before it starts (the sim's GPU: PCIe 5.0 x16, no NVLink). */
  g_step = "interconnect";
  unsigned st = 99;
  NVML_OK(NV(DevDevUintUint_t, nvmlDeviceGetP2PStatus)(dev, dev, 0, &st));
  printf("p2p_read_self=%u\n", st);
  NVML_OK(NV(DevDevUintUint_t, nvmlDeviceGetP2PStatus)(dev, dev, 1, &st));
  printf("p2p_write_self=%u\n", st);
  printf("p2p_bad_index_rc=%d\n", NV(DevDevUintUint_t, nvmlDeviceGetP2PStatus)(dev, dev, 7, &st));
  printf("topology_self_rc=%d\n",
         NV(DevDevUint_t, nvmlDeviceGetTopologyCommonAncestor)(dev, dev, &st));
  unsigned gen = 0, width = 0, speed = 0;
  NVML_OK(NV(DevUint_t, nvmlDeviceGetCurrPcieLinkGeneration)(dev, &gen));
  NVML_OK(NV(DevUint_t, nvmlDeviceGetCurrPcieLinkWidth)(dev, &width));
  NVML_OK(NV(DevUint_t, nvmlDeviceGetPcieLinkMaxSpeed)(dev, &speed));
  printf("pcie=gen%u x%u speed_enum=%u\n", gen, width, speed);
  printf("nvlink0_state_rc=%d\n", NV(DevUintUint_t, nvmlDeviceGetNvLinkState)(dev, 0, &st));
  printf("nvlink18_state_rc=%d\n", NV(DevUintUint_t, nvmlDeviceGetNvLinkState)(dev, 18, &st));
  char remote[68];
  printf("nvlink0_remote_rc=%d\n",
         NV(DevUintPtr_t, nvmlDeviceGetNvLinkRemotePciInfo)(dev, 0, remote));
  printf("nvlink0_p2p_cap_rc=%d\n",
         NV(DevUintUintUint_t, nvmlDeviceGetNvLinkCapability)(dev, 0, 0, &st));

  g_step = "telemetry";
  Utilization u = {99, 99};
  NVML_OK(NV(DevPtr_t, nvmlDeviceGetUtilizationRates)(dev, &u));
  CHECK(u.gpu == 0 && u.memory == 0, "sim utilization %u/%u", u.gpu, u.memory);
  unsigned v = 0;
  NVML_OK(NV(DevUintUint_t, nvmlDeviceGetTemperature)(dev, 0, &v));
  printf("temperature=%u\n", v);
  NVML_OK(NV(DevUint_t, nvmlDeviceGetPowerUsage)(dev, &v));
  printf("power_mw=%u\n", v);
  NVML_OK(NV(DevUintUint_t, nvmlDeviceGetClockInfo)(dev, 1, &v));
  printf("sm_clock_mhz=%u\n", v);
  NVML_OK(NV(DevUintUint_t, nvmlDeviceGetMaxClockInfo)(dev, 1, &v));
  CHECK(NV(DevUint_t, nvmlDeviceGetFanSpeed)(dev, &v) == kNotSupported, "fan speed of the sim");
  int pstate = -1;
  NVML_OK(NV(DevInt_t, nvmlDeviceGetPerformanceState)(dev, &pstate));

  g_step = "unsupported";
  DevPtr_t bar1 = NV(DevPtr_t, nvmlDeviceGetBAR1MemoryInfo);
  unsigned long long scratch[8];
  CHECK(bar1(dev, scratch) == kNotSupported, "nvmlDeviceGetBAR1MemoryInfo, first call");
  CHECK(bar1(dev, scratch) == kNotSupported, "nvmlDeviceGetBAR1MemoryInfo, second call");
  CHECK(strcmp(NV(ErrorString_t, nvmlErrorString)(kNotSupported), "Not Supported") == 0,
        "nvmlErrorString(3)");

  g_step = "processes before";
  Process procs[64];
  unsigned n = processes(dev, procs, 64);
  unsigned me = (unsigned)getpid();
  printf("pid=%u\n", me);
  CHECK(find_pid(procs, n, me) == NULL, "this program is listed before it has a context");
  if (other_pid != 0) {
    const Process* o = find_pid(procs, n, other_pid);
    CHECK(o != NULL, "the other program (pid %u) is not listed", other_pid);
    CHECK(o->usedGpuMemory == other_bytes, "the other program holds %llu, want %llu",
          o->usedGpuMemory, other_bytes);
  }

  g_step = "allocate";
  CUcontext ctx = NULL;
  CU_OK(CU(CUresult(*)(CUcontext*, CUdevice), cuDevicePrimaryCtxRetain)(&ctx, cu_dev));
  CU_OK(CU(CUresult(*)(CUcontext), cuCtxSetCurrent)(ctx));
  CUdeviceptr p = 0;
  CU_OK(CU(CUresult(*)(CUdeviceptr*, size_t), cuMemAlloc_v2)(&p, kAlloc));
  sleep_ms(120);  // past the snapshot cache (FLYT_NVML_CACHE_MS, 50 ms)
  Memory m1 = memory_now(dev);
  CHECK(m1.used == m0.used + kAlloc, "used %llu after an 8 MiB allocation, before %llu", m1.used,
        m0.used);
  CHECK(m1.free == quota - m1.used, "free %llu", m1.free);
  printf("mem_used_after=%llu\n", m1.used);
  n = processes(dev, procs, 64);
  const Process* mine = find_pid(procs, n, me);
  CHECK(mine != NULL, "this program (pid %u) is not in the process list (%u entries)", me, n);
  CHECK(mine->usedGpuMemory == kAlloc, "this program holds %llu", mine->usedGpuMemory);
  for (unsigned i = 0; i < n; ++i)
    printf("process=%u:%llu\n", procs[i].pid, procs[i].usedGpuMemory);
  ProcessV1 v1[64];
  unsigned n1 = 64;
  NVML_OK(NV(Procs_t, nvmlDeviceGetComputeRunningProcesses)(dev, &n1, v1));
  CHECK(n1 == n, "v1 list has %u entries, v3 %u", n1, n);
  int found = 0;
  for (unsigned i = 0; i < n1; ++i) found |= v1[i].pid == me && v1[i].usedGpuMemory == kAlloc;
  CHECK(found, "this program is not in the v1 (16-byte) process list");
  unsigned short_room = 0;
  CHECK(NV(Procs_t, nvmlDeviceGetComputeRunningProcesses_v3)(dev, &short_room, procs) ==
                kInsufficientSize &&
            short_room == n,
        "no room: want NVML_ERROR_INSUFFICIENT_SIZE and %u, got %u", n, short_room);
  unsigned graphics = 64;
  NVML_OK(NV(Procs_t, nvmlDeviceGetGraphicsRunningProcesses_v3)(dev, &graphics, procs));
  CHECK(graphics == 0, "%u graphics processes", graphics);
  char pname[256] = {0};
  NVML_OK(NV(nvmlReturn_t(*)(unsigned, char*, unsigned), nvmlSystemGetProcessName)(me, pname,
                                                                                   sizeof(pname)));
  CHECK(strstr(pname, "nvml_query") != NULL, "process name '%s'", pname);

  g_step = "free";
  CU_OK(CU(CUresult(*)(CUdeviceptr), cuMemFree_v2)(p));
  sleep_ms(120);
  Memory m3 = memory_now(dev);
  CHECK(m3.used == m0.used, "used %llu after the free, %llu before", m3.used, m0.used);

  g_step = "shutdown";
  NVML_OK(NV(Void_t, nvmlShutdown)());
  NVML_OK(NV(Uint_t, nvmlDeviceGetCount_v2)(&count));  // one reference left
  NVML_OK(NV(Void_t, nvmlShutdown)());
  CHECK(NV(Uint_t, nvmlDeviceGetCount_v2)(&count) == kUninitialized, "query after shutdown");
  CHECK(NV(Void_t, nvmlShutdown)() == kUninitialized, "a third nvmlShutdown");
  NVML_OK(NV(Void_t, nvmlInit)());  // again, with the legacy name
  NVML_OK(NV(Uint_t, nvmlDeviceGetCount)(&count));
  CHECK(count == 1, "device count %u after a new nvmlInit", count);
  NVML_OK(NV(Void_t, nvmlShutdown)());
  return 0;
}

/* peers N: the GPUs of one server as NVML shows them, and how they reach each other. */
static void peers(int argc, char** argv) {
  if (argc < 3) FAIL("usage: nvml_query peers N");
  unsigned want = (unsigned)strtoul(argv[2], NULL, 10);
  open_libs(1);
  g_step = "peers init";
  NVML_OK(NV(Void_t, nvmlInit_v2)());
  CU_OK(CU(CUresult(*)(unsigned), cuInit)(0));
  unsigned count = 0;
  NVML_OK(NV(Uint_t, nvmlDeviceGetCount_v2)(&count));
  printf("device_count=%u\n", count);
  CHECK(count == want, "device count %u, expected %u", count, want);
  nvmlDevice_t dev[16] = {0};
  char uuids[16][96];
  for (unsigned i = 0; i < count && i < 16; ++i) {
    g_step = "peers handle";
    NVML_OK(NV(ByIndex_t, nvmlDeviceGetHandleByIndex_v2)(i, &dev[i]));
    unsigned index = 99;
    NVML_OK(NV(DevUint_t, nvmlDeviceGetIndex)(dev[i], &index));
    CHECK(index == i, "index %u for handle %u", index, i);
    NVML_OK(NV(DevText_t, nvmlDeviceGetUUID)(dev[i], uuids[i], sizeof(uuids[i])));
    for (unsigned j = 0; j < i; ++j)
      CHECK(strcmp(uuids[i], uuids[j]) != 0, "GPUs %u and %u share UUID %s", i, j, uuids[i]);
    CUdevice cu_dev = 0;
    CU_OK(CU(CUresult(*)(CUdevice*, int), cuDeviceGet)(&cu_dev, (int)i));
    char cu_bus[32] = {0};
    CU_OK(
        CU(CUresult(*)(char*, int, CUdevice), cuDeviceGetPCIBusId)(cu_bus, sizeof(cu_bus), cu_dev));
    PciInfo pci;
    memset(&pci, 0, sizeof(pci));
    NVML_OK(NV(DevPtr_t, nvmlDeviceGetPciInfo_v3)(dev[i], &pci));
    CHECK(strcasecmp(pci.busId, cu_bus) == 0, "GPU %u: NVML bus id %s, CUDA %s", i, pci.busId,
          cu_bus);
    printf("bus_id.%u=%s\n", i, pci.busId);
  }
  if (count >= 2) {
    g_step = "peers p2p";
    unsigned st = 99;
    NVML_OK(NV(DevDevUintUint_t, nvmlDeviceGetP2PStatus)(dev[0], dev[1], 0, &st));
    printf("p2p_read_0_1=%u\n", st);
    NVML_OK(NV(DevDevUintUint_t, nvmlDeviceGetP2PStatus)(dev[1], dev[0], 1, &st));
    printf("p2p_write_1_0=%u\n", st);
    NVML_OK(NV(DevDevUintUint_t, nvmlDeviceGetP2PStatus)(dev[0], dev[1], 2, &st));
    printf("p2p_nvlink_0_1=%u\n", st);
    NVML_OK(NV(DevDevUintUint_t, nvmlDeviceGetP2PStatus)(dev[0], dev[0], 0, &st));
    printf("p2p_read_self=%u\n", st);
    NVML_OK(NV(DevDevUint_t, nvmlDeviceGetTopologyCommonAncestor)(dev[0], dev[1], &st));
    printf("topology_0_1=%u\n", st);
  }
  NVML_OK(NV(Void_t, nvmlShutdown)());
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  signal(SIGALRM, on_alarm);
  const char* wd = getenv("E2E_WATCHDOG_S");
  alarm(wd ? (unsigned)atoi(wd) : 120);
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "check") == 0) {
    check(argc, argv);
  } else if (strcmp(mode, "noserver") == 0 || strcmp(mode, "notflyt") == 0) {
    g_step = mode;
    open_libs(0);
    double t0 = now_s();
    nvmlReturn_t rc = NV(Void_t, nvmlInit_v2)();
    printf("init_rc=%d\ninit_s=%.2f\n", rc, now_s() - t0);
    CHECK(rc != kSuccess, "nvmlInit succeeded");
    unsigned count = 0;
    CHECK(NV(Uint_t, nvmlDeviceGetCount_v2)(&count) == kUninitialized,
          "a query after a failed nvmlInit");
    CHECK(NV(Void_t, nvmlShutdown)() == kUninitialized, "nvmlShutdown after a failed nvmlInit");
  } else if (strcmp(mode, "peers") == 0) {
    peers(argc, argv);
  } else if (strcmp(mode, "gone") == 0) {
    g_step = "gone";
    open_libs(0);
    NVML_OK(NV(Void_t, nvmlInit_v2)());
    nvmlDevice_t dev = NULL;
    NVML_OK(NV(ByIndex_t, nvmlDeviceGetHandleByIndex_v2)(0, &dev));
    Memory m;
    NVML_OK(NV(DevPtr_t, nvmlDeviceGetMemoryInfo)(dev, &m));
    printf("ready\n");
    double t0 = now_s();
    nvmlReturn_t rc = kSuccess;
    while (rc == kSuccess && now_s() - t0 < 60) {
      sleep_ms(100);
      rc = NV(DevPtr_t, nvmlDeviceGetMemoryInfo)(dev, &m);
    }
    printf("lost_rc=%d\n", rc);
    CHECK(rc == kGpuIsLost, "memory query after the server died returned %d", rc);
    Utilization u;
    CHECK(NV(DevPtr_t, nvmlDeviceGetUtilizationRates)(dev, &u) == kGpuIsLost,
          "utilization after the server died");
    char name[96] = {0};
    NVML_OK(NV(DevText_t, nvmlDeviceGetName)(dev, name, sizeof(name)));  // cached
    NVML_OK(NV(Void_t, nvmlShutdown)());
  } else {
    FAIL("usage: nvml_query check|noserver|notflyt|peers|gone ...");
  }
  printf("nvml_query: PASS\n");
  return 0;
}
