// The sim backend: a test double of NVIDIA's driver for machines without a GPU.
//
// Owns: fake device memory (host pages, every access range-checked), fake
// streams/events/contexts, kernel tables read from the loaded images
// (server/sim_kernels.h), and the launch record: with --sim-record FILE each
// launch appends `launch kernel=NAME grid=X,Y,Z block=X,Y,Z shared=N
// params=HEX:HEX...` (parameter bytes as the app passed them). Everything runs
// synchronously and no kernel executes (except a few the e2e programs name, which
// the sim models: SimKernelActions); host functions run on threads of their own
// in stream order, and an asynchronous copy on a stream waits for those queued on it
// before. Virtual memory management: a
// reservation is a PROT_NONE host range, a physical allocation a memfd, and
// cuMemMap maps the memfd into the range, so copies and memsets reach it and
// two mappings of one allocation share their bytes. Never a product feature.
//
// Sticky faults: a launch of a kernel whose name contains `flyt_sim_fault`
// succeeds, and from then on every call of this process that touches the
// context answers CUDA_ERROR_ILLEGAL_ADDRESS, as the driver does after a kernel
// touched an illegal address (which calls fail follows NVIDIA's driver 580 as
// measured on an H200): synchronisation, streams, events, allocations, copies,
// memsets, launches, module loads, function attributes, occupancy, IPC. Device
// queries, library loads, kernel attributes, contexts and the VMM calls keep
// working. The state is per process, as a real context's is (a primary
// context reset does not clear it natively; the sim does not model the
// driver's answers after such a reset).
//
// CUDA IPC works across processes: cuIpcGetMemHandle moves the allocation's
// pages into a memfd mapped over the same address, and the handle carries
// {magic, kind, exporter pid, descriptor, device, inode}; the opener maps
// /proc/<pid>/fd/<n> once its name shows one of the sim's IPC memfds and its
// inode the same file. An interprocess event keeps its completion state
// (records issued and done) in a shared page the same way. Unlike the driver,
// the sim also opens handles of its own process, because one sim process may
// serve several client processes (the session refuses a client its own
// handles, as the driver would), and it cannot open an event whose exporter
// has exited (the driver can).
//
// The JIT linker checks its inputs and hands back the first cubin or fatbin
// added (else the PTX as is); its logs get one fixed line.
//
// Context events: cuCtxRecordEvent records behind the host functions queued
// on every stream of the context (the NULL stream included); cuCtxWaitEvent
// makes those streams, and the context's streams made later, wait for it.
// Texture and surface objects are numbers from 1, each the smallest one free in
// this process (as the driver's in a fresh process: 1, 2, 3, ...; a restore
// counts on it, session_migrate.cc); each keeps the descriptors it was made
// with, which the Get*Desc calls return.
//
// Several devices (--sim-devices N, default 1): each has its own primary
// context, memory accounting (N x memory_bytes), UUID, PCI bus id and address
// range (device d's allocations start at 0x600000000000 + d TiB, so pointers of
// two devices never collide; device 0's are those of the one-device sim).
// All sim devices of one server are peer-capable unless --sim-no-peer: peer
// access is per (context, peer context) with the driver's errors (enabled
// twice, disabled when not enabled, a peer of the same device, no P2P); peer
// copies and copies between devices are plain copies of host pages. VMM
// allocations are any device's (counted on it); pools stay on device 0.
//
// Stream capture (cuStreamBeginCapture on a stream the app made): what the
// stream is given while it captures (launches, copies, memsets, host
// functions, event records and waits) becomes nodes of the capture's graph,
// each after the one before (or after the dependency set that
// cuStreamUpdateCaptureDependencies / cuStreamBeginCaptureToGraph gave), and runs
// only when the graph is launched. One stream at a time: a capture that another
// stream joins through an event is not modelled.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <cupti.h>
#include "common/cuda_image.h"
#include "common/log.h"
#include "server/driver_api.h"
#include "server/share.h"

#include "server/sim_cupti.h"
#include "server/sim_kernels.h"

namespace flyt::server {
namespace {

uint64_t kSimMemory = 80ull << 30;  // set from SimOptions (per device)
constexpr int kSimMaxDevices = 16;
// Shared memory a block may use without the function's opt-in (48 KiB).
constexpr unsigned kSimStaticSharedLimit = 49152;

struct SimLibrary;
struct SimKernel {
  std::string name;
  std::vector<sim::ParamSlot> params;
  SimLibrary* owner = nullptr;  // the library or module that loaded it
};
// A library (cuLibraryLoadData) or a module (cuModuleLoadData). A library's
// module (cuLibraryGetModule) is a view of its library: made on first use, with
// the library's kernels as its functions, unloaded with it.
struct SimLibrary {
  std::vector<std::unique_ptr<SimKernel>> kernels;
  std::map<std::string, CUdeviceptr> globals;
  bool is_library = false;
  SimLibrary* of_library = nullptr;         // set on a library's module
  std::unique_ptr<SimLibrary> module_view;  // a library's module, once asked for
};
// Host functions run on their own threads, one after another per stream; the
// queries and synchronisations below see them as pending work.
struct StreamWork {
  std::mutex mu;
  std::shared_future<void> last;
  std::atomic<int> pending{0};
};
struct SimGraph;
struct SimStream {
  int priority = 0;
  unsigned flags = 0;
  std::map<int, CUstreamAttrValue> attributes{};  // cuStreamSetAttribute
  std::shared_ptr<StreamWork> work = std::make_shared<StreamWork>();
  CUcontext ctx = nullptr;      // current at creation (checked with fake green contexts)
  SimGraph* capture = nullptr;  // the graph it captures into, if it captures
  // What the next captured node depends on: the last one captured, or what
  // cuStreamBeginCaptureToGraph / cuStreamUpdateCaptureDependencies set.
  std::vector<CUgraphNode> capture_deps{};
  uint64_t capture_id = 0;
};
// Stream capture: `st` when stream s captures, else null.
SimStream* CapturingStream(CUstream s);
// The work a capturing stream is given, as a node of its capture's graph.
CUresult CaptureCopy(SimStream* st, const CUDA_MEMCPY3D& c);
CUresult CaptureMemset(SimStream* st, const CUDA_MEMSET_NODE_PARAMS& m);
CUresult CaptureKernel(SimStream* st, const CUlaunchConfig* cfg, CUfunction f, const uint8_t* blob,
                       size_t size);
CUresult CaptureHost(SimStream* st, CUhostFn fn, void* data);
CUresult CaptureEvent(SimStream* st, CUevent e, bool record);
CUDA_MEMCPY3D Copy1D(CUmemorytype dst_type, uint64_t dst, CUmemorytype src_type, uint64_t src,
                     size_t n) {
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = src_type;
  c.dstMemoryType = dst_type;
  if (src_type == CU_MEMORYTYPE_HOST) {
    c.srcHost = reinterpret_cast<const void*>(src);
  } else {
    c.srcDevice = src;
  }
  if (dst_type == CU_MEMORYTYPE_HOST) {
    c.dstHost = reinterpret_cast<void*>(dst);
  } else {
    c.dstDevice = dst;
  }
  c.WidthInBytes = n;
  c.Height = 1;
  c.Depth = 1;
  return c;
}
template <typename T>
CUDA_MEMSET_NODE_PARAMS Memset2D(CUdeviceptr d, size_t pitch, T v, size_t w, size_t h) {
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = d;
  m.pitch = pitch;
  m.value = v;
  m.elementSize = sizeof(T);
  m.width = w;
  m.height = h;
  return m;
}
// Completion state of an interprocess event, in a page that the processes
// which opened the event map too: a record takes the next sequence number,
// and `done` reaches it once the stream's work before the record has run.
struct SimEventPage {
  uint32_t magic;
  uint32_t reserved;
  std::atomic<uint64_t> recorded;
  std::atomic<uint64_t> done;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-page atomics");
// One process's mapping of such a page; unmapped with the last reference
// (host functions queued behind a record hold one).
struct SimEventShared {
  SimEventPage* page = nullptr;
  ~SimEventShared() {
    if (page != nullptr) munmap(page, sizeof(SimEventPage));
  }
};
struct SimEvent {
  std::chrono::steady_clock::time_point at{};
  bool recorded = false;
  std::shared_ptr<StreamWork> work;  // the stream's pending host functions at record time
  std::shared_future<void> after;    // completes when those host functions have run
  unsigned flags = 0;                // CUevent_flags
  CUcontext ctx = nullptr;           // current at creation (cuCtxRecordEvent checks it)
  bool imported = false;             // opened with cuIpcOpenEventHandle
  int ipc_fd = -1;                   // exporter: the shared page's memfd
  uint64_t ipc_dev = 0, ipc_ino = 0;
  std::shared_ptr<SimEventShared> shared;  // interprocess events only
};

// A texture or surface object: the descriptors it was made with.
struct SimTexObject {
  bool surface = false;
  CUDA_RESOURCE_DESC res{};
  CUDA_TEXTURE_DESC tex{};  // textures only
  bool has_view = false;    // made with a resource view
  CUDA_RESOURCE_VIEW_DESC view{};
};

// The 64 bytes of a sim CUipcMemHandle / CUipcEventHandle.
struct SimIpcHandle {
  uint32_t magic;  // kSimIpcMagic
  uint32_t kind;   // kSimIpcMemory or kSimIpcEvent
  uint32_t pid;    // the exporting process
  int32_t fd;      // its descriptor of the memfd
  uint64_t dev;    // the memfd's device and inode: a descriptor number that was
  uint64_t ino;    // reused for another file since is noticed
  uint64_t size;   // bytes of the allocation (memory)
  uint64_t base;   // the allocation's address in the exporter (diagnostics)
  uint8_t reserved[16];
};
static_assert(sizeof(SimIpcHandle) == CU_IPC_HANDLE_SIZE);
constexpr uint32_t kSimIpcMagic = 0x43504946;  // "FIPC"
constexpr uint32_t kSimIpcMemory = 1;
constexpr uint32_t kSimIpcEvent = 2;
constexpr uint32_t kSimEventPageMagic = 0x45504946;  // "FIPE"
// Names of the memfds behind exported memory and interprocess events.
constexpr char kMemoryMemfd[] = "flyt-sim-ipc";
constexpr char kEventMemfd[] = "flyt-sim-ipc-event";

struct Sim {
  std::mutex mu;
  std::map<uint64_t, uint64_t> allocs;  // base -> size
  // Registered host memory (cuMemHostRegister): base -> size. Its device
  // pointer is the host address, as on a UVA GPU.
  std::map<uint64_t, uint64_t> registered;
  // Virtual memory management (cuMemAddressReserve / cuMemCreate / cuMemMap).
  struct Physical {
    int fd = -1;
    uint64_t size = 0;
    CUmemAllocationProp prop{};
    uint32_t refs = 0;      // create + retain - release
    uint32_t mappings = 0;  // freed when both are 0
  };
  struct Mapping {
    uint64_t size = 0;
    uint64_t handle = 0;
    unsigned long long access = 0;  // CUmemAccess_flags for device 0
  };
  std::map<uint64_t, uint64_t> reserved;  // base -> size
  std::map<uint64_t, Mapping> mapped;     // base -> mapping
  std::map<uint64_t, Physical> physical;  // handle -> allocation
  uint64_t next_handle = 0x10000;
  uint64_t used[kSimMaxDevices] = {};  // bytes allocated, per device
  int devices = 1;                     // SimOptions::devices
  bool peer = true;                    // devices are peer-capable (SimOptions::peer)
  uint64_t tex_base = 1;               // the smallest texture object value (SimOptions)
  // Device of each allocation not on device 0 (base -> ordinal).
  std::map<uint64_t, int> alloc_device;
  // Primary contexts of devices 1.. (device 0's is ctx_token).
  int primary_tokens[kSimMaxDevices] = {};
  // Device of each context made with cuCtxCreate or from a green context.
  std::map<CUcontext, int> ctx_device;
  // Peer access enabled: (context, peer context).
  std::set<std::pair<CUcontext, CUcontext>> peers;
  // Stream-ordered allocations (cuMemAllocAsync): not exportable over IPC.
  std::set<uint64_t> pool_allocs;
  // CUDA IPC. Exported allocations: base -> their memfd (the pages were moved
  // into it at the first cuIpcGetMemHandle).
  struct Exported {
    int fd = -1;
    uint64_t dev = 0, ino = 0;
  };
  std::map<uint64_t, Exported> exported;
  // Memory opened with cuIpcOpenMemHandle: base -> size (for range checks),
  // and what it maps with the opens not yet closed.
  struct Opened {
    uint64_t dev = 0, ino = 0;
    uint32_t refs = 0;
  };
  std::map<uint64_t, uint64_t> ipc_mapped;
  std::map<uint64_t, Opened> ipc_opened;
  FILE* record = nullptr;
  std::mutex record_mu;
  int ctx_token = 0;
  bool green = false;  // fake green contexts (SimOptions::green_contexts)
  // Contexts made with cuCtxCreate: their flags, by handle.
  std::map<CUcontext, unsigned> user_contexts;
  unsigned primary_flags = 0;  // cuCtxSetFlags on the primary (or a green) context
  // Managed allocations (cuMemAllocManaged): what cuMemRangeGetAttribute
  // reports of each, as a whole (the driver tracks pages).
  struct Managed {
    uint64_t size = 0;
    int read_mostly = 0;
    CUmemLocation preferred{CU_MEM_LOCATION_TYPE_INVALID, -2};
    CUmemLocation last_prefetch{CU_MEM_LOCATION_TYPE_INVALID, -2};
    bool accessed_by_device = false;
  };
  std::map<uint64_t, Managed> managed;
  // Live streams (cuCtxRecordEvent / cuCtxWaitEvent reach a context's streams)
  // and, by context, what its streams made later wait for (cuCtxWaitEvent).
  std::set<SimStream*> streams;
  std::map<CUcontext, std::shared_future<void>> ctx_waits;
  // Live arrays, which texture and surface objects may be made of.
  std::set<CUarray> arrays;
  // Texture and surface objects by value (never 0).
  std::map<uint64_t, SimTexObject> tex_objects;
};
Sim* g_sim = nullptr;
thread_local CUcontext t_current = nullptr;

// Set by a launch of a kernel named *flyt_sim_fault*: the process's context
// is broken for good, as after an illegal address on a GPU.
std::atomic<bool> g_faulted{false};
constexpr const char* kFaultKernelMark = "flyt_sim_fault";
bool Faulted() { return g_faulted.load(std::memory_order_relaxed); }

// The device of a context (g_sim->mu held); -1 for one the sim never made.
int CtxDeviceLocked(CUcontext c) {
  if (c == reinterpret_cast<CUcontext>(&g_sim->ctx_token)) return 0;
  for (int d = 1; d < g_sim->devices; ++d)
    if (c == reinterpret_cast<CUcontext>(&g_sim->primary_tokens[d])) return d;
  auto it = g_sim->ctx_device.find(c);
  return it != g_sim->ctx_device.end() ? it->second : -1;
}
// The device of the calling thread's current context (0 with none).
int CurrentDevice() {
  if (t_current == nullptr) return 0;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  int d = CtxDeviceLocked(t_current);
  return d < 0 ? 0 : d;
}
bool ValidDevice(CUdevice d) { return d >= 0 && d < g_sim->devices; }

// Fake green contexts: an SM count, and a context token of their own.
struct SimGreen {
  unsigned sms = 0;
  int token = 0;
  int device = 0;
};
struct SimDesc {
  unsigned sms = 0;
};
constexpr unsigned kSimSms = 132;
constexpr unsigned kSimSmGranularity = 8;

bool Within(const std::map<uint64_t, uint64_t>& ranges, uint64_t p, size_t n) {
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return false;
  --it;
  return p >= it->first && n <= it->second && p - it->first <= it->second - n;
}

// True when [p, p+n) lies in mappings that follow one another and all grant
// access (cuMemSetAccess); a copy may cross from one mapping into the next.
bool WithinMapped(uint64_t p, size_t n) {
  auto& m = g_sim->mapped;
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  if (p - it->first >= it->second.size) return false;
  uint64_t end = it->first;
  for (; it != m.end() && it->first == end; ++it) {
    if (it->second.access == CU_MEM_ACCESS_FLAGS_PROT_NONE) return false;
    end += it->second.size;
    if (n <= end - p) return true;
  }
  return false;
}

// True when [p, p+n) lies inside one allocation, one registered host range,
// accessible mappings or memory opened over IPC.
bool Valid(uint64_t p, size_t n) {
  std::lock_guard<std::mutex> lock(g_sim->mu);
  return Within(g_sim->allocs, p, n) || Within(g_sim->registered, p, n) || WithinMapped(p, n) ||
         Within(g_sim->ipc_mapped, p, n);
}

CUresult Alloc(CUdeviceptr* out, size_t n) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (n == 0) return CUDA_ERROR_INVALID_VALUE;
  const int dev = CurrentDevice();
  {
    std::lock_guard<std::mutex> lock(g_sim->mu);
    if (n > kSimMemory - g_sim->used[dev]) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Device memory lives in a range of its own, the same in every process (as
  // the driver's device addresses do): a session moved to another process
  // finds its client's addresses free there (server/session_migrate.cc).
  // Each device has a range of 1 TiB of its own.
  constexpr uint64_t kSimDeviceBase = 0x600000000000ull, kSimAllocAlign = 2ull << 20;
  constexpr uint64_t kSimDeviceSpan = 1ull << 40;
  static std::atomic<uint64_t> next[kSimMaxDevices];
  static std::once_flag bases;
  std::call_once(bases, [] {
    for (int d = 0; d < kSimMaxDevices; ++d)
      next[d] = kSimDeviceBase + static_cast<uint64_t>(d) * kSimDeviceSpan;
  });
  const uint64_t span = (n + kSimAllocAlign - 1) / kSimAllocAlign * kSimAllocAlign;
  void* p = MAP_FAILED;
  for (int tries = 0; tries < 4096 && p == MAP_FAILED; ++tries) {
    void* want = reinterpret_cast<void*>(next[dev].fetch_add(span));
    p = mmap(want, n, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && p != want) {  // a kernel that ignores the flag
      munmap(p, n);
      p = MAP_FAILED;
    }
  }
  if (p == MAP_FAILED)
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
             0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  g_sim->allocs[reinterpret_cast<uint64_t>(p)] = n;
  g_sim->used[dev] += n;
  if (dev != 0) g_sim->alloc_device[reinterpret_cast<uint64_t>(p)] = dev;
  *out = reinterpret_cast<uint64_t>(p);
  return CUDA_SUCCESS;
}

// Frees an allocation, also after a fault (the sim's own cleanup). An
// exported allocation's memfd goes too; processes that opened it keep their
// mappings (using them is undefined natively).
CUresult FreeAlloc(CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->allocs.find(p);
  if (it == g_sim->allocs.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(p), it->second);
  auto dev = g_sim->alloc_device.find(p);
  g_sim->used[dev != g_sim->alloc_device.end() ? dev->second : 0] -= it->second;
  if (dev != g_sim->alloc_device.end()) g_sim->alloc_device.erase(dev);
  g_sim->allocs.erase(it);
  g_sim->pool_allocs.erase(p);
  g_sim->managed.erase(p);
  auto ex = g_sim->exported.find(p);
  if (ex != g_sim->exported.end()) {
    close(ex->second.fd);
    g_sim->exported.erase(ex);
  }
  return CUDA_SUCCESS;
}
bool IsGraphAlloc(CUdeviceptr p);
CUresult simMemFree(CUdeviceptr p) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  // Memory of a graph's allocation node stays with the node (it is allocated
  // again at the graph's next launch natively); freeing it here is accepted.
  if (IsGraphAlloc(p)) return CUDA_SUCCESS;
  return FreeAlloc(p);
}

CUresult simInit(unsigned) { return CUDA_SUCCESS; }
CUresult simDriverGetVersion(int* v) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}
CUresult simDeviceGet(CUdevice* d, int ordinal) {
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult simDeviceGetCount(int* n) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *n = g_sim->devices;
  return CUDA_SUCCESS;
}
CUresult simDeviceGetName(char* name, int len, CUdevice d) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "Flyt Simulated GPU");
  return CUDA_SUCCESS;
}
// Device 0's UUID is f0f1..ff; device d's first byte is 0xe0 + d.
CUresult simDeviceGetUuid(CUuuid* u, CUdevice d) {
  if (u == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  for (int i = 0; i < 16; ++i) u->bytes[i] = static_cast<char>(0xf0 + i);
  if (d != 0) u->bytes[0] = static_cast<char>(0xe0 + d);
  return CUDA_SUCCESS;
}
CUresult simDeviceTotalMem(size_t* bytes, CUdevice d) {
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kSimMemory;
  return CUDA_SUCCESS;
}
// PCI bus ids as on an eight-GPU HGX board (device 0: 0x19, as before).
int SimPciBus(CUdevice d) {
  static const int kBus[] = {0x19, 0x3b, 0x4c, 0x5d, 0x9b, 0xbb, 0xcb, 0xdb};
  return d < 8 ? kBus[d] : 0xdb + d - 7;
}
CUresult simDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  static const std::unordered_map<int, int> kAttrs = {
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, kSimStaticSharedLimit},
      {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
      {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
      {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
      {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
      {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, static_cast<int>(kSimSms)},
      {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 1},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1, 1},
      {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
      {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
      {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x19},
      {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},
      {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
      {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
      {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
      {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
      {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
      {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024},
  };
  if (a <= 0 || a >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;  // as the driver
  auto it = kAttrs.find(a);
  *v = it == kAttrs.end() ? 0 : it->second;
  if (a == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) *v = SimPciBus(d);
  return CUDA_SUCCESS;
}
CUresult simPrimaryCtxRetain(CUcontext* c, CUdevice d) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  *c = reinterpret_cast<CUcontext>(d == 0 ? &g_sim->ctx_token : &g_sim->primary_tokens[d]);
  return CUDA_SUCCESS;
}
CUresult simPrimaryCtxRelease(CUdevice) { return CUDA_SUCCESS; }
CUresult simPrimaryCtxReset(CUdevice) { return CUDA_SUCCESS; }
CUresult simCtxSetCurrent(CUcontext c) {
  t_current = c;
  return CUDA_SUCCESS;
}
// Contexts the app creates: a token each (the handle), current on the thread
// that made it, and the flags it was made with. The sim has one memory space;
// the session frees what a context owned before it destroys the context.
CUresult simCtxCreate(CUcontext* out, CUctxCreateParams* params, unsigned flags, CUdevice d) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  const unsigned sched = flags & CU_CTX_SCHED_MASK;
  if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0 ||
      (sched != CU_CTX_SCHED_AUTO && sched != CU_CTX_SCHED_SPIN && sched != CU_CTX_SCHED_YIELD &&
       sched != CU_CTX_SCHED_BLOCKING_SYNC))
    return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr && (params->numExecAffinityParams != 0 || params->cigParams != nullptr))
    return CUDA_ERROR_NOT_SUPPORTED;
  auto* token = new int(0);
  auto ctx = reinterpret_cast<CUcontext>(token);
  std::lock_guard<std::mutex> lock(g_sim->mu);
  g_sim->user_contexts[ctx] = flags;
  g_sim->ctx_device[ctx] = d;
  t_current = ctx;
  *out = ctx;
  return CUDA_SUCCESS;
}
CUresult simCtxDestroy(CUcontext c) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  if (g_sim->user_contexts.erase(c) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  g_sim->ctx_waits.erase(c);
  g_sim->ctx_device.erase(c);
  for (auto it = g_sim->peers.begin(); it != g_sim->peers.end();)
    it = it->first == c || it->second == c ? g_sim->peers.erase(it) : std::next(it);
  delete reinterpret_cast<int*>(c);
  if (t_current == c) t_current = nullptr;  // popped from the caller's stack
  return CUDA_SUCCESS;
}
CUresult simCtxGetFlags(unsigned* flags) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->user_contexts.find(t_current);
  *flags = it != g_sim->user_contexts.end() ? it->second : g_sim->primary_flags;
  return CUDA_SUCCESS;
}
CUresult simCtxGetDevice(CUdevice* device) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = CurrentDevice();
  return CUDA_SUCCESS;
}

// --- peer access between the sim's devices
CUresult simDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(dev) || !ValidDevice(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer && g_sim->peer ? 1 : 0;  // a device is not its own peer (as natively)
  return CUDA_SUCCESS;
}
CUresult simDeviceGetP2PAttribute(int* v, CUdevice_P2PAttribute attr, CUdevice src, CUdevice dst) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(src) || !ValidDevice(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
      *v = 0;
      return CUDA_SUCCESS;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
      *v = g_sim->peer ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:  // a PCIe board: no peer atomics
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
      *v = 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult simCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  const int self = CtxDeviceLocked(t_current), other = CtxDeviceLocked(peer);
  if (self < 0 || other < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (self == other) return CUDA_ERROR_INVALID_DEVICE;
  if (!g_sim->peer) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (!g_sim->peers.emplace(t_current, peer).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}
CUresult simCtxDisablePeerAccess(CUcontext peer) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  if (CtxDeviceLocked(peer) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (g_sim->peers.erase({t_current, peer}) == 0) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  return CUDA_SUCCESS;
}
std::atomic<int> g_pending_host_funcs{0};
CUresult simCtxSynchronize() {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  while (g_pending_host_funcs.load() > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  return CUDA_SUCCESS;
}
CUresult simCtxGetLimit(size_t* v, CUlimit) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *v = 1024;
  return CUDA_SUCCESS;
}
CUresult simCtxSetLimit(CUlimit, size_t) {
  return Faulted() ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}
CUresult simCtxGetStreamPriorityRange(int* least, int* greatest) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}

// --- fake green contexts (SimOptions::green_contexts)
CUresult simDeviceGetDevResource(CUdevice d, CUdevResource* r, CUdevResourceType type) {
  if (r == nullptr || type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  *r = CUdevResource{};
  r->type = CU_DEV_RESOURCE_TYPE_SM;
  r->sm.smCount = kSimSms;
  r->sm.minSmPartitionSize = kSimSmGranularity;
  r->sm.smCoscheduledAlignment = kSimSmGranularity;
  return CUDA_SUCCESS;
}
CUresult simDevSmResourceSplitByCount(CUdevResource* result, unsigned* groups,
                                      const CUdevResource* input, CUdevResource* remaining,
                                      unsigned, unsigned min_count) {
  if (groups == nullptr || input == nullptr || input->type != CU_DEV_RESOURCE_TYPE_SM ||
      min_count > input->sm.smCount)
    return CUDA_ERROR_INVALID_VALUE;
  unsigned count = std::max(min_count, kSimSmGranularity);
  count = (count + kSimSmGranularity - 1) / kSimSmGranularity * kSimSmGranularity;
  unsigned possible = input->sm.smCount / count;
  if (result == nullptr) {
    *groups = possible;
    return CUDA_SUCCESS;
  }
  unsigned n = std::min(*groups, possible);
  for (unsigned i = 0; i < n; ++i) {
    result[i] = *input;
    result[i].sm.smCount = count;
  }
  if (remaining != nullptr) {
    *remaining = *input;
    remaining->sm.smCount = input->sm.smCount - n * count;
  }
  *groups = n;
  return CUDA_SUCCESS;
}
CUresult simDevResourceGenerateDesc(CUdevResourceDesc* out, CUdevResource* r, unsigned n) {
  if (out == nullptr || r == nullptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
  static std::mutex mu;
  static std::vector<std::unique_ptr<SimDesc>> descs;  // the driver never frees them either
  auto d = std::make_unique<SimDesc>();
  for (unsigned i = 0; i < n; ++i) d->sms += r[i].sm.smCount;
  std::lock_guard<std::mutex> lock(mu);
  *out = reinterpret_cast<CUdevResourceDesc>(d.get());
  descs.push_back(std::move(d));
  return CUDA_SUCCESS;
}
CUresult simGreenCtxCreate(CUgreenCtx* out, CUdevResourceDesc desc, CUdevice d, unsigned flags) {
  if (out == nullptr || desc == nullptr || !(flags & CU_GREEN_CTX_DEFAULT_STREAM))
    return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  auto* g = new SimGreen;
  g->sms = reinterpret_cast<SimDesc*>(desc)->sms;
  g->device = d;
  *out = reinterpret_cast<CUgreenCtx>(g);
  return CUDA_SUCCESS;
}
CUresult simGreenCtxDestroy(CUgreenCtx g) {
  if (g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  {
    std::lock_guard<std::mutex> lock(g_sim->mu);
    g_sim->ctx_device.erase(reinterpret_cast<CUcontext>(&reinterpret_cast<SimGreen*>(g)->token));
  }
  delete reinterpret_cast<SimGreen*>(g);
  return CUDA_SUCCESS;
}
CUresult simCtxFromGreenCtx(CUcontext* out, CUgreenCtx g) {
  if (out == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUcontext>(&reinterpret_cast<SimGreen*>(g)->token);
  std::lock_guard<std::mutex> lock(g_sim->mu);
  g_sim->ctx_device[*out] = reinterpret_cast<SimGreen*>(g)->device;
  return CUDA_SUCCESS;
}

// --- code
CUresult LoadKernels(const void* image, SimLibrary* lib) {
  ImageSpan span{};
  if (!LocateImage(image, &span)) return CUDA_ERROR_INVALID_IMAGE;
  std::vector<sim::KernelDesc> descs;
  std::string error;
  if (!sim::DescribeKernels(span.data, span.size, &descs, &error)) {
    FLYT_DEBUG("sim: image without kernels (%s)", error.c_str());
  }
  for (auto& d : descs)
    lib->kernels.push_back(std::make_unique<SimKernel>(SimKernel{d.name, d.params, lib}));
  return CUDA_SUCCESS;
}
CUresult simLibraryLoadData(CUlibrary* out, const void* code, CUjit_option*, void**, unsigned,
                            CUlibraryOption*, void**, unsigned) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto lib = std::make_unique<SimLibrary>();
  CUresult rc = LoadKernels(code, lib.get());
  if (rc != CUDA_SUCCESS) return rc;
  lib->is_library = true;
  *out = reinterpret_cast<CUlibrary>(lib.release());
  return CUDA_SUCCESS;
}
// Libraries load lazily and keep working after a fault; modules do not.
CUresult simModuleLoadData(CUmodule* out, const void* code) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  CUresult rc = simLibraryLoadData(reinterpret_cast<CUlibrary*>(out), code, nullptr, nullptr, 0,
                                   nullptr, nullptr, 0);
  if (rc == CUDA_SUCCESS) reinterpret_cast<SimLibrary*>(*out)->is_library = false;
  return rc;
}
// What a handle's kernels, functions and globals are: a library's module is its library's view.
SimLibrary* Contents(SimLibrary* lib) { return lib->of_library != nullptr ? lib->of_library : lib; }
CUresult simLibraryUnload(CUlibrary l) {
  auto* lib = reinterpret_cast<SimLibrary*>(l);
  for (auto& [name, p] : lib->globals) FreeAlloc(p);
  delete lib;
  return CUDA_SUCCESS;
}
CUresult simModuleUnload(CUmodule m) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  // As the driver: a module of a library goes with its library only.
  if (reinterpret_cast<SimLibrary*>(m)->of_library != nullptr) return CUDA_ERROR_NOT_PERMITTED;
  return simLibraryUnload(reinterpret_cast<CUlibrary>(m));
}
// A library's module (the sim has one context's worth of them).
SimLibrary* ModuleView(SimLibrary* lib) {
  if (!lib->is_library) return lib;
  if (lib->module_view == nullptr) {
    lib->module_view = std::make_unique<SimLibrary>();
    lib->module_view->of_library = lib;
  }
  return lib->module_view.get();
}
CUresult simLibraryGetModule(CUmodule* out, CUlibrary l) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (l == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto* lib = reinterpret_cast<SimLibrary*>(l);
  if (!lib->is_library) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUmodule>(ModuleView(lib));
  return CUDA_SUCCESS;
}
CUresult simFuncGetModule(CUmodule* out, CUfunction f) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *out = reinterpret_cast<CUmodule>(ModuleView(reinterpret_cast<SimKernel*>(f)->owner));
  return CUDA_SUCCESS;
}
CUresult simLibraryGetKernelCount(unsigned* n, CUlibrary l) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *n = static_cast<unsigned>(Contents(reinterpret_cast<SimLibrary*>(l))->kernels.size());
  return CUDA_SUCCESS;
}
CUresult simModuleGetFunctionCount(unsigned* n, CUmodule m) {
  return simLibraryGetKernelCount(n, reinterpret_cast<CUlibrary>(m));
}
CUresult simLibraryEnumerateKernels(CUkernel* out, unsigned n, CUlibrary l) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* lib = Contents(reinterpret_cast<SimLibrary*>(l));
  if (n > lib->kernels.size()) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i) out[i] = reinterpret_cast<CUkernel>(lib->kernels[i].get());
  return CUDA_SUCCESS;
}
CUresult simModuleEnumerateFunctions(CUfunction* out, unsigned n, CUmodule m) {
  return simLibraryEnumerateKernels(reinterpret_cast<CUkernel*>(out), n,
                                    reinterpret_cast<CUlibrary>(m));
}
CUresult simKernelGetName(const char** name, CUkernel k) {
  if (name == nullptr || k == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = reinterpret_cast<SimKernel*>(k)->name.c_str();
  return CUDA_SUCCESS;
}
CUresult simFuncGetName(const char** name, CUfunction f) {
  return simKernelGetName(name, reinterpret_cast<CUkernel>(f));
}
CUresult simKernelGetParamInfo(CUkernel k, size_t i, size_t* off, size_t* size) {
  auto* kern = reinterpret_cast<SimKernel*>(k);
  if (i >= kern->params.size()) return CUDA_ERROR_INVALID_VALUE;
  if (off) *off = kern->params[i].offset;
  if (size) *size = kern->params[i].size;
  return CUDA_SUCCESS;
}
CUresult simFuncGetParamInfo(CUfunction f, size_t i, size_t* off, size_t* size) {
  return simKernelGetParamInfo(reinterpret_cast<CUkernel>(f), i, off, size);
}
CUresult simKernelGetFunction(CUfunction* f, CUkernel k) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *f = reinterpret_cast<CUfunction>(k);
  return CUDA_SUCCESS;
}
// Device globals: the sim cannot read their sizes from the image, so each
// named global is a zeroed 1 MiB buffer created on first use.
CUresult simLibraryGetGlobal(CUdeviceptr* p, size_t* size, CUlibrary l, const char* name) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (name == nullptr || l == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* lib = Contents(reinterpret_cast<SimLibrary*>(l));
  auto it = lib->globals.find(name);
  if (it == lib->globals.end()) {
    CUdeviceptr d = 0;
    CUresult rc = Alloc(&d, 1 << 20);
    if (rc != CUDA_SUCCESS) return rc;
    it = lib->globals.emplace(name, d).first;
  }
  if (p) *p = it->second;
  if (size) *size = 1 << 20;
  return CUDA_SUCCESS;
}
CUresult simModuleGetGlobal(CUdeviceptr* p, size_t* size, CUmodule m, const char* name) {
  return simLibraryGetGlobal(p, size, reinterpret_cast<CUlibrary>(m), name);
}
// Settable attributes read back what was set, per handle, as with the driver
// (dynamic shared memory size, carveout, cluster shape).
std::mutex g_attr_mu;
std::map<std::pair<uint64_t, int>, int> g_attr_set;
CUresult FuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *v = a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0;
  if (a == CU_FUNC_ATTRIBUTE_PTX_VERSION || a == CU_FUNC_ATTRIBUTE_BINARY_VERSION) *v = 90;
  std::lock_guard<std::mutex> lock(g_attr_mu);
  auto it = g_attr_set.find({reinterpret_cast<uintptr_t>(f), static_cast<int>(a)});
  if (it != g_attr_set.end()) *v = it->second;
  return CUDA_SUCCESS;
}
CUresult FuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  std::lock_guard<std::mutex> lock(g_attr_mu);
  g_attr_set[{reinterpret_cast<uintptr_t>(f), static_cast<int>(a)}] = v;
  return CUDA_SUCCESS;
}
// Function attributes need the context; kernel attributes do not.
CUresult simFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  return FuncGetAttribute(v, a, f);
}
CUresult simFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  return FuncSetAttribute(f, a, v);
}
CUresult simKernelGetAttribute(int* v, CUfunction_attribute a, CUkernel k, CUdevice) {
  return FuncGetAttribute(v, a, reinterpret_cast<CUfunction>(k));
}
CUresult simKernelSetAttribute(CUfunction_attribute a, int v, CUkernel k, CUdevice) {
  return FuncSetAttribute(reinterpret_cast<CUfunction>(k), a, v);
}
CUresult simOccupancy(int* n, CUfunction, int block, size_t) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *n = block > 0 ? 2048 / block : 0;
  if (*n > 32) *n = 32;
  return CUDA_SUCCESS;
}
CUresult simOccupancyAvailableSmem(size_t* bytes, CUfunction, int blocks, int) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (bytes == nullptr || blocks <= 0) return CUDA_ERROR_INVALID_VALUE;
  *bytes = 232448 / static_cast<size_t>(blocks);
  return CUDA_SUCCESS;
}
CUresult simMaxActiveClusters(int* n, CUfunction, const CUlaunchConfig* cfg) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (n == nullptr || cfg == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *n = 132;
  return CUDA_SUCCESS;
}
CUresult simOccupancyFlags(int* n, CUfunction f, int block, size_t shm, unsigned) {
  return simOccupancy(n, f, block, shm);
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[p[i] >> 4]);
    s.push_back(kDigits[p[i] & 15]);
  }
  return s;
}

SimStream* AsStream(CUstream s);
void WaitIdle(const std::shared_ptr<StreamWork>& w);
// With fake green contexts, a stream works only while its own context is
// current, so a stream the server forgot to move after a live SM change shows.
CUresult CheckStreamContext(CUstream s) {
  SimStream* st = AsStream(s);
  if (!g_sim->green || st == nullptr || st->ctx == nullptr || t_current == nullptr)
    return CUDA_SUCCESS;
  return st->ctx == t_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

void SimKernelActions(const std::string& name, const std::vector<sim::ParamSlot>& slots,
                      const uint8_t* blob);

CUresult simLaunchKernelEx(const CUlaunchConfig* cfg, CUfunction f, void** params, void** extra) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  auto* k = reinterpret_cast<SimKernel*>(f);
  if (CUresult rc = CheckStreamContext(cfg->hStream); rc != CUDA_SUCCESS) return rc;
  if (cfg->gridDimX == 0 || cfg->gridDimY == 0 || cfg->gridDimZ == 0 || cfg->blockDimX == 0 ||
      cfg->blockDimY == 0 || cfg->blockDimZ == 0 ||
      uint64_t{cfg->blockDimX} * cfg->blockDimY * cfg->blockDimZ > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  // Dynamic shared memory above 48 KiB needs the opt-in set for this handle on
  // this server, as with the driver.
  if (cfg->sharedMemBytes > kSimStaticSharedLimit) {
    int opt_in = 0;
    FuncGetAttribute(&opt_in, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f);
    if (cfg->sharedMemBytes > static_cast<unsigned>(opt_in)) return CUDA_ERROR_INVALID_VALUE;
  }
  const uint8_t* blob = nullptr;
  size_t blob_size = 0;
  for (int i = 0; extra != nullptr && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
      blob = static_cast<const uint8_t*>(extra[i + 1]);
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) blob_size = *static_cast<size_t*>(extra[i + 1]);
  }
  (void)params;
  std::string line = "launch kernel=" + k->name + " grid=" + std::to_string(cfg->gridDimX) + "," +
                     std::to_string(cfg->gridDimY) + "," + std::to_string(cfg->gridDimZ) +
                     " block=" + std::to_string(cfg->blockDimX) + "," +
                     std::to_string(cfg->blockDimY) + "," + std::to_string(cfg->blockDimZ) +
                     " shared=" + std::to_string(cfg->sharedMemBytes) + " params=";
  for (size_t i = 0; i < k->params.size(); ++i) {
    const auto& p = k->params[i];
    if (blob == nullptr || p.offset + p.size > blob_size) return CUDA_ERROR_INVALID_VALUE;
    if (i > 0) line += ":";
    line += Hex(blob + p.offset, p.size);
  }
  if (SimStream* st = CapturingStream(cfg->hStream))
    return CaptureKernel(st, cfg, f, blob, blob_size);  // runs with the graph
  if (g_sim->record != nullptr) {
    std::lock_guard<std::mutex> lock(g_sim->record_mu);
    std::fprintf(g_sim->record, "%s\n", line.c_str());
    std::fflush(g_sim->record);
  }
  uint64_t start = sim_cupti::Recording() ? sim_cupti::Now() : 0;
  if (blob != nullptr) SimKernelActions(k->name, k->params, blob);
  if (start != 0) sim_cupti::RecordKernel(k->name, *cfg, start, sim_cupti::Now());
  // The launch itself succeeds; the fault shows from the next call on.
  if (k->name.find(kFaultKernelMark) != std::string::npos && !g_faulted.exchange(true))
    FLYT_WARN(
        "sim: kernel %s faults (illegal address): this process's CUDA calls now fail "
        "with CUDA_ERROR_ILLEGAL_ADDRESS",
        k->name.c_str());
  return CUDA_SUCCESS;
}

// --- memory and copies (synchronous; stream arguments are accepted and ignored)
CUresult simMemAlloc(CUdeviceptr* p, size_t n) { return Alloc(p, n); }
CUresult simMemAllocPitch(CUdeviceptr* p, size_t* pitch, size_t w, size_t h, unsigned) {
  if (pitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (w == 0 || h == 0) return CUDA_ERROR_INVALID_VALUE;
  *pitch = (w + 511) / 512 * 512;
  return Alloc(p, *pitch * h);
}
CUresult simMemGetInfo(size_t* free_b, size_t* total) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  const int dev = t_current != nullptr ? CtxDeviceLocked(t_current) : 0;
  if (free_b) *free_b = kSimMemory - g_sim->used[dev > 0 ? dev : 0];
  if (total) *total = kSimMemory;
  return CUDA_SUCCESS;
}
CUresult simMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  for (const auto* ranges : {&g_sim->allocs, &g_sim->ipc_mapped}) {  // IPC: its own range
    auto it = ranges->upper_bound(p);
    if (it != ranges->begin() && p - std::prev(it)->first < std::prev(it)->second) {
      --it;
      if (base) *base = it->first;
      if (size) *size = it->second;
      return CUDA_SUCCESS;
    }
  }
  auto m = g_sim->mapped.upper_bound(p);  // a mapping: its own range, as the driver answers
  if (m == g_sim->mapped.begin() || p - std::prev(m)->first >= std::prev(m)->second.size)
    return CUDA_ERROR_NOT_FOUND;
  --m;
  if (base) *base = m->first;
  if (size) *size = m->second.size;
  return CUDA_SUCCESS;
}
// A copy of n bytes on a stream, recorded for CUPTI when a session profiles.
template <typename Copy>
CUresult RecordedCopy(CUpti_ActivityMemcpyKind kind, size_t n, CUstream stream, Copy&& copy) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  // A copy on a stream runs after the host functions queued on it before (a host
  // function may write the source, or read the destination next).
  if (SimStream* st = AsStream(stream); st != nullptr) WaitIdle(st->work);
  uint64_t start = sim_cupti::Recording() ? sim_cupti::Now() : 0;
  CUresult rc = copy();
  if (rc == CUDA_SUCCESS && start != 0) {
    auto side = [&](bool host) {
      return static_cast<uint8_t>(host ? CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE
                                       : CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
    };
    sim_cupti::RecordMemcpy(
        static_cast<uint8_t>(kind), side(kind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD),
        side(kind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH), n, stream, start, sim_cupti::Now());
  }
  return rc;
}
CUresult HtoDOn(CUdeviceptr d, const void* h, size_t n, CUstream s) {
  return RecordedCopy(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, n, s, [&] {
    if (!Valid(d, n)) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(reinterpret_cast<void*>(d), h, n);
    return CUDA_SUCCESS;
  });
}
CUresult simHtoD(CUdeviceptr d, const void* h, size_t n) { return HtoDOn(d, h, n, nullptr); }
CUresult simHtoDAsync(CUdeviceptr d, const void* h, size_t n, CUstream s) {
  if (CUresult rc = CheckStreamContext(s); rc != CUDA_SUCCESS) return rc;
  if (SimStream* st = CapturingStream(s))
    return CaptureCopy(
        st, Copy1D(CU_MEMORYTYPE_DEVICE, d, CU_MEMORYTYPE_HOST, reinterpret_cast<uint64_t>(h), n));
  return HtoDOn(d, h, n, s);
}
CUresult DtoHOn(void* h, CUdeviceptr d, size_t n, CUstream s) {
  return RecordedCopy(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, n, s, [&] {
    if (!Valid(d, n)) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(h, reinterpret_cast<void*>(d), n);
    return CUDA_SUCCESS;
  });
}
CUresult simDtoH(void* h, CUdeviceptr d, size_t n) { return DtoHOn(h, d, n, nullptr); }
CUresult simDtoHAsync(void* h, CUdeviceptr d, size_t n, CUstream s) {
  if (CUresult rc = CheckStreamContext(s); rc != CUDA_SUCCESS) return rc;
  if (SimStream* st = CapturingStream(s))
    return CaptureCopy(
        st, Copy1D(CU_MEMORYTYPE_HOST, reinterpret_cast<uint64_t>(h), CU_MEMORYTYPE_DEVICE, d, n));
  return DtoHOn(h, d, n, s);
}
CUresult DtoDOn(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  return RecordedCopy(CUPTI_ACTIVITY_MEMCPY_KIND_DTOD, n, st, [&] {
    if (!Valid(d, n) || !Valid(s, n)) return CUDA_ERROR_INVALID_VALUE;
    std::memmove(reinterpret_cast<void*>(d), reinterpret_cast<void*>(s), n);
    return CUDA_SUCCESS;
  });
}
CUresult simDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) { return DtoDOn(d, s, n, nullptr); }
// Peer copies: the bytes of two devices are host pages of this process.
CUresult simMemcpyPeer(CUdeviceptr d, CUcontext, CUdeviceptr s, CUcontext, size_t n) {
  return DtoDOn(d, s, n, nullptr);
}
CUresult simMemcpyPeerAsync(CUdeviceptr d, CUcontext, CUdeviceptr s, CUcontext, size_t n,
                            CUstream st);
CUresult simDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  if (SimStream* cap = CapturingStream(st))
    return CaptureCopy(cap, Copy1D(CU_MEMORYTYPE_DEVICE, d, CU_MEMORYTYPE_DEVICE, s, n));
  return DtoDOn(d, s, n, st);
}
CUresult simMemcpyPeerAsync(CUdeviceptr d, CUcontext, CUdeviceptr s, CUcontext, size_t n,
                            CUstream st) {
  return simDtoDAsync(d, s, n, st);
}
template <typename T>
CUresult Fill2D(CUdeviceptr d, size_t pitch, T v, size_t w, size_t h, CUstream stream = nullptr) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (h == 0 || w == 0) return CUDA_SUCCESS;
  if (pitch < w * sizeof(T) || !Valid(d, pitch * (h - 1) + w * sizeof(T)))
    return CUDA_ERROR_INVALID_VALUE;
  uint64_t start = sim_cupti::Recording() ? sim_cupti::Now() : 0;
  for (size_t y = 0; y < h; ++y) {
    T* row = reinterpret_cast<T*>(d + y * pitch);
    for (size_t x = 0; x < w; ++x) row[x] = v;
  }
  if (start != 0) sim_cupti::RecordMemset(v, w * h * sizeof(T), stream, start, sim_cupti::Now());
  return CUDA_SUCCESS;
}
CUresult simMemsetD8(CUdeviceptr d, unsigned char v, size_t n) {
  return Fill2D<uint8_t>(d, n, v, n, 1);
}
CUresult simMemsetD16(CUdeviceptr d, unsigned short v, size_t n) {
  return Fill2D<uint16_t>(d, n * 2, v, n, 1);
}
CUresult simMemsetD32(CUdeviceptr d, unsigned int v, size_t n) {
  return Fill2D<uint32_t>(d, n * 4, v, n, 1);
}
CUresult simMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  if (SimStream* st = CapturingStream(s))
    return CaptureMemset(st, Memset2D<uint8_t>(d, n, v, n, 1));
  return Fill2D<uint8_t>(d, n, v, n, 1, s);
}
CUresult simMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  if (SimStream* st = CapturingStream(s))
    return CaptureMemset(st, Memset2D<uint16_t>(d, n * 2, v, n, 1));
  return Fill2D<uint16_t>(d, n * 2, v, n, 1, s);
}
CUresult simMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  if (SimStream* st = CapturingStream(s))
    return CaptureMemset(st, Memset2D<uint32_t>(d, n * 4, v, n, 1));
  return Fill2D<uint32_t>(d, n * 4, v, n, 1, s);
}
CUresult simMemsetD2D8(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) {
  return Fill2D<uint8_t>(d, p, v, w, h);
}
CUresult simMemsetD2D16(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) {
  return Fill2D<uint16_t>(d, p, v, w, h);
}
CUresult simMemsetD2D32(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h) {
  return Fill2D<uint32_t>(d, p, v, w, h);
}
CUresult simMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h,
                            CUstream s) {
  if (SimStream* st = CapturingStream(s))
    return CaptureMemset(st, Memset2D<uint8_t>(d, p, v, w, h));
  return Fill2D<uint8_t>(d, p, v, w, h);
}
CUresult simMemsetD2D16Async(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h,
                             CUstream s) {
  if (SimStream* st = CapturingStream(s))
    return CaptureMemset(st, Memset2D<uint16_t>(d, p, v, w, h));
  return Fill2D<uint16_t>(d, p, v, w, h);
}
CUresult simMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h,
                             CUstream s) {
  if (SimStream* st = CapturingStream(s))
    return CaptureMemset(st, Memset2D<uint32_t>(d, p, v, w, h));
  return Fill2D<uint32_t>(d, p, v, w, h);
}

// One side of a 3D copy: base address of row (y, z); host or device.
CUresult simMemcpy3D(const CUDA_MEMCPY3D* c) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (c->srcMemoryType == CU_MEMORYTYPE_ARRAY || c->dstMemoryType == CU_MEMORYTYPE_ARRAY)
    return CUDA_ERROR_NOT_SUPPORTED;
  size_t w = c->WidthInBytes, h = c->Height, dep = c->Depth;
  if (w == 0 || h == 0 || dep == 0) return CUDA_SUCCESS;
  auto row = [&](bool src, size_t y, size_t z, uint8_t** out) -> bool {
    CUmemorytype type = src ? c->srcMemoryType : c->dstMemoryType;
    size_t x0 = src ? c->srcXInBytes : c->dstXInBytes, y0 = src ? c->srcY : c->dstY,
           z0 = src ? c->srcZ : c->dstZ, pitch = src ? c->srcPitch : c->dstPitch,
           height = src ? c->srcHeight : c->dstHeight;
    if (pitch < w && !(h == 1 && dep == 1)) return false;
    uint64_t off = ((z0 + z) * (height ? height : h) + y0 + y) * pitch + x0;
    if (type == CU_MEMORYTYPE_HOST) {
      *out = static_cast<uint8_t*>(const_cast<void*>(src ? c->srcHost : c->dstHost)) + off;
      return true;
    }
    uint64_t base = (src ? c->srcDevice : c->dstDevice) + off;
    if (!Valid(base, w)) return false;
    *out = reinterpret_cast<uint8_t*>(base);
    return true;
  };
  for (size_t z = 0; z < dep; ++z)
    for (size_t y = 0; y < h; ++y) {
      uint8_t *s = nullptr, *d = nullptr;
      if (!row(true, y, z, &s) || !row(false, y, z, &d)) return CUDA_ERROR_INVALID_VALUE;
      std::memmove(d, s, w);
    }
  return CUDA_SUCCESS;
}
CUresult simMemcpy3DAsync(const CUDA_MEMCPY3D* c, CUstream s) {
  if (SimStream* st = CapturingStream(s)) {
    if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return CaptureCopy(st, *c);
  }
  return simMemcpy3D(c);
}

// --- arrays: memory only (copies to and from arrays are not simulated)
struct SimArray {
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  CUdeviceptr mem = 0;
};
CUresult simArray3DCreate(CUarray* out, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  if (out == nullptr || d == nullptr || d->Width == 0 ||
      (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
    return CUDA_ERROR_INVALID_VALUE;
  uint64_t bytes = ArrayBytes(d->Width, d->Height, d->Depth, d->NumChannels, d->Format);
  auto a = std::make_unique<SimArray>();
  a->desc = *d;
  CUresult rc = Alloc(&a->mem, bytes);
  if (rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUarray>(a.release());
  std::lock_guard<std::mutex> lock(g_sim->mu);
  g_sim->arrays.insert(*out);
  return CUDA_SUCCESS;
}
CUresult simArrayCreate(CUarray* out, const CUDA_ARRAY_DESCRIPTOR* d) {
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d3{};
  d3.Width = d->Width;
  d3.Height = d->Height;
  d3.Format = d->Format;
  d3.NumChannels = d->NumChannels;
  return simArray3DCreate(out, &d3);
}
CUresult simArrayDestroy(CUarray a) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto* arr = reinterpret_cast<SimArray*>(a);
  FreeAlloc(arr->mem);
  {
    std::lock_guard<std::mutex> lock(g_sim->mu);
    g_sim->arrays.erase(a);
  }
  delete arr;
  return CUDA_SUCCESS;
}
CUresult simArray3DGetDescriptor(CUDA_ARRAY3D_DESCRIPTOR* d, CUarray a) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (d == nullptr || a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *d = reinterpret_cast<SimArray*>(a)->desc;
  return CUDA_SUCCESS;
}
CUresult simArrayGetDescriptor(CUDA_ARRAY_DESCRIPTOR* d, CUarray a) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (d == nullptr || a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_ARRAY3D_DESCRIPTOR& d3 = reinterpret_cast<SimArray*>(a)->desc;
  d->Width = d3.Width;
  d->Height = d3.Height;
  d->Format = d3.Format;
  d->NumChannels = d3.NumChannels;
  return CUDA_SUCCESS;
}
// --- texture and surface objects
constexpr uint64_t kSimTextureAlignment = 512;      // CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT
constexpr uint64_t kSimTexturePitchAlignment = 32;  // CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT
// cuDeviceGetTexture1DLinearMaxWidth: 2^28 elements, as Hopper's
// cudaDeviceProp::maxTexture1DLinear.
constexpr size_t kSimTexture1DLinearMax = size_t{1} << 28;

bool PlainFormat(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_HALF:
    case CU_AD_FORMAT_FLOAT:
      return true;
    default:
      return false;
  }
}
bool PlainChannels(unsigned n) { return n == 1 || n == 2 || n == 4; }

CUresult simDeviceGetTexture1DLinearMaxWidth(size_t* width, CUarray_format f, unsigned channels,
                                             CUdevice d) {
  if (width == nullptr || !PlainFormat(f) || !PlainChannels(channels))
    return CUDA_ERROR_INVALID_VALUE;
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  *width = kSimTexture1DLinearMax;
  return CUDA_SUCCESS;
}

// What a texture (or surface) may be made of: a live array (with
// CUDA_ARRAY3D_SURFACE_LDST for a surface), or for a texture aligned device
// memory that the sim can reach. Mipmapped arrays: the sim makes none.
CUresult CheckResource(const CUDA_RESOURCE_DESC& r, bool surface) {
  if (r.flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (r.resType == CU_RESOURCE_TYPE_ARRAY) {
    std::lock_guard<std::mutex> lock(g_sim->mu);
    if (g_sim->arrays.count(r.res.array.hArray) == 0) return CUDA_ERROR_INVALID_VALUE;
    const unsigned flags = reinterpret_cast<SimArray*>(r.res.array.hArray)->desc.Flags;
    if (surface && !(flags & CUDA_ARRAY3D_SURFACE_LDST)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  }
  if (surface) return CUDA_ERROR_INVALID_VALUE;
  if (r.resType == CU_RESOURCE_TYPE_LINEAR) {
    const auto& l = r.res.linear;
    if (!PlainFormat(l.format) || !PlainChannels(l.numChannels) || l.sizeInBytes == 0 ||
        l.devPtr % kSimTextureAlignment != 0 || !Valid(l.devPtr, l.sizeInBytes))
      return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  }
  if (r.resType == CU_RESOURCE_TYPE_PITCH2D) {
    const auto& p = r.res.pitch2D;
    if (!PlainFormat(p.format) || !PlainChannels(p.numChannels) || p.width == 0 || p.height == 0 ||
        p.devPtr % kSimTextureAlignment != 0 || p.pitchInBytes % kSimTexturePitchAlignment != 0)
      return CUDA_ERROR_INVALID_VALUE;
    const uint64_t row = ArrayBytes(p.width, 1, 1, p.numChannels, p.format);
    if (row > p.pitchInBytes) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t span = MulSat(p.pitchInBytes, p.height - 1) + row;
    if (span < row || !Valid(p.devPtr, span)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

uint64_t AddTexObject(SimTexObject o) {
  std::lock_guard<std::mutex> lock(g_sim->mu);
  uint64_t v = g_sim->tex_base;  // the smallest value free (the map is in value order)
  for (auto it = g_sim->tex_objects.lower_bound(v);
       it != g_sim->tex_objects.end() && it->first == v; ++it)
    ++v;
  g_sim->tex_objects.emplace(v, std::move(o));
  return v;
}
// The object of value `v` if it is a live one of the kind asked; under g_sim->mu.
const SimTexObject* FindTexObject(uint64_t v, bool surface) {
  auto it = g_sim->tex_objects.find(v);
  return it != g_sim->tex_objects.end() && it->second.surface == surface ? &it->second : nullptr;
}
CUresult DestroyTexObject(uint64_t v, bool surface) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (v == 0) return CUDA_SUCCESS;  // as cudart's destroy of 0: nothing to do
  std::lock_guard<std::mutex> lock(g_sim->mu);
  if (FindTexObject(v, surface) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  g_sim->tex_objects.erase(v);
  return CUDA_SUCCESS;
}

CUresult simTexObjectCreate(CUtexObject* out, const CUDA_RESOURCE_DESC* res,
                            const CUDA_TEXTURE_DESC* tex, const CUDA_RESOURCE_VIEW_DESC* view) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr || res == nullptr || tex == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = CheckResource(*res, false); rc != CUDA_SUCCESS) return rc;
  // A view reinterprets an array; the sim's arrays have one level and no layers.
  if (view != nullptr &&
      (res->resType != CU_RESOURCE_TYPE_ARRAY || view->firstMipmapLevel != 0 ||
       view->lastMipmapLevel != 0 || view->firstLayer != 0 || view->lastLayer != 0))
    return CUDA_ERROR_INVALID_VALUE;
  SimTexObject o;
  o.res = *res;
  o.tex = *tex;
  if (view != nullptr) {
    o.has_view = true;
    o.view = *view;
  }
  *out = AddTexObject(o);
  return CUDA_SUCCESS;
}
CUresult simTexObjectDestroy(CUtexObject t) { return DestroyTexObject(t, false); }
// The getters of a texture or surface object's descriptors: `pick` copies
// one of them out (false: the object has none of that kind).
template <typename Out, typename Pick>
CUresult ReadTexObject(Out* out, uint64_t handle, bool surface, Pick pick) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  const SimTexObject* o = FindTexObject(handle, surface);
  return o != nullptr && pick(*o, out) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult simTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* out, CUtexObject t) {
  return ReadTexObject(out, t, false, [](const SimTexObject& o, CUDA_RESOURCE_DESC* d) {
    *d = o.res;
    return true;
  });
}
CUresult simTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* out, CUtexObject t) {
  return ReadTexObject(out, t, false, [](const SimTexObject& o, CUDA_TEXTURE_DESC* d) {
    *d = o.tex;
    return true;
  });
}
// CUDA_ERROR_INVALID_VALUE for a texture made without a view (cuda.h).
CUresult simTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* out, CUtexObject t) {
  return ReadTexObject(out, t, false, [](const SimTexObject& o, CUDA_RESOURCE_VIEW_DESC* d) {
    if (o.has_view) *d = o.view;
    return o.has_view;
  });
}
CUresult simSurfObjectCreate(CUsurfObject* out, const CUDA_RESOURCE_DESC* res) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr || res == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = CheckResource(*res, true); rc != CUDA_SUCCESS) return rc;
  SimTexObject o;
  o.surface = true;
  o.res = *res;
  *out = AddTexObject(o);
  return CUDA_SUCCESS;
}
CUresult simSurfObjectDestroy(CUsurfObject v) { return DestroyTexObject(v, true); }
CUresult simSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* out, CUsurfObject v) {
  return ReadTexObject(out, v, true, [](const SimTexObject& o, CUDA_RESOURCE_DESC* d) {
    *d = o.res;
    return true;
  });
}

// Stream-ordered allocations: immediate (everything here is synchronous).
// Pool memory cannot be exported with cuIpcGetMemHandle.
CUresult PoolAlloc(CUdeviceptr* p, size_t n) {
  CUresult rc = Alloc(p, n);
  if (rc != CUDA_SUCCESS) return rc;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  g_sim->pool_allocs.insert(*p);
  return CUDA_SUCCESS;
}
CUresult simMemAllocAsync(CUdeviceptr* p, size_t n, CUstream) { return PoolAlloc(p, n); }
CUresult simMemFreeAsync(CUdeviceptr p, CUstream) { return simMemFree(p); }
// The device's default pool (the one device): a handle that names it. Pools
// (default and created) keep their properties and the attributes the app
// sets; the sim's own pool allocations are plain sim memory, so the usage
// figures it reports are 0 (a session that serves a pool itself reports its own).
int g_default_pool = 0;
CUmemoryPool DefaultPool() { return reinterpret_cast<CUmemoryPool>(&g_default_pool); }
struct SimPool {
  CUmemPoolProps props{};
  uint64_t release_threshold = 0;
  int reuse[3] = {1, 1, 1};  // follow event dependencies, opportunistic, internal dependencies
};
std::mutex g_pool_mu;
std::map<CUmemoryPool, SimPool>& Pools() {
  static std::map<CUmemoryPool, SimPool> pools = [] {
    std::map<CUmemoryPool, SimPool> m;
    SimPool& d = m[DefaultPool()];
    d.props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    d.props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    return m;
  }();
  return pools;
}
CUmemoryPool g_current_pool = nullptr;  // cuDeviceSetMemPool (null: the default)
uintptr_t g_next_pool = 0x9000;
CUresult simDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  *pool = DefaultPool();
  return CUDA_SUCCESS;
}
CUresult simDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  *pool = g_current_pool != nullptr ? g_current_pool : DefaultPool();
  return CUDA_SUCCESS;
}
CUresult simDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (Pools().count(pool) == 0) return CUDA_ERROR_INVALID_VALUE;
  g_current_pool = pool;
  return CUDA_SUCCESS;
}
CUresult simMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->win32SecurityAttributes)
    return CUDA_ERROR_INVALID_VALUE;
  if (props->location.id != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE &&
      props->handleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  CUmemoryPool p = reinterpret_cast<CUmemoryPool>(g_next_pool);
  g_next_pool += 0x10;
  Pools()[p].props = *props;
  *pool = p;
  return CUDA_SUCCESS;
}
CUresult simMemPoolDestroy(CUmemoryPool pool) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (pool == DefaultPool() || Pools().count(pool) == 0) return CUDA_ERROR_INVALID_VALUE;
  Pools().erase(pool);
  if (g_current_pool == pool) g_current_pool = nullptr;
  return CUDA_SUCCESS;
}
CUresult simMemPoolTrimTo(CUmemoryPool pool, size_t) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  return Pools().count(pool) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult simMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  auto it = Pools().find(pool);
  if (it == Pools().end() || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  SimPool& p = it->second;
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      p.reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] =
          *static_cast<int*>(value) != 0 ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      p.release_threshold = *static_cast<cuuint64_t*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:  // only a reset to 0
      return *static_cast<cuuint64_t*>(value) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult simMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  auto it = Pools().find(pool);
  if (it == Pools().end() || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const SimPool& p = it->second;
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = p.reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *static_cast<cuuint64_t*>(value) = p.release_threshold;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult simMemAllocFromPoolAsync(CUdeviceptr* p, size_t n, CUmemoryPool pool, CUstream) {
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    if (Pools().count(pool) == 0) return CUDA_ERROR_INVALID_VALUE;
  }
  return PoolAlloc(p, n);
}

// --- managed memory: ordinary sim memory that the range calls know. The
// answers and refusals follow NVIDIA's driver 580 as measured on an H200.
CUresult simMemAllocManaged(CUdeviceptr* p, size_t n, unsigned flags) {
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = Alloc(p, n);
  if (rc != CUDA_SUCCESS) return rc;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  g_sim->managed[*p].size = n;
  return CUDA_SUCCESS;
}
// The managed allocation that holds all of [p, p+n); null if none.
Sim::Managed* ManagedRangeLocked(CUdeviceptr p, size_t n) {
  auto it = g_sim->managed.upper_bound(p);
  if (it == g_sim->managed.begin()) return nullptr;
  --it;
  uint64_t off = p - it->first;
  if (n == 0 || off >= it->second.size || n > it->second.size - off) return nullptr;
  return &it->second;
}
bool ValidLocation(const CUmemLocation& l) {
  return (l.type == CU_MEM_LOCATION_TYPE_DEVICE && l.id == 0) ||
         l.type == CU_MEM_LOCATION_TYPE_HOST;
}
CUresult simMemAdvise_v2(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  Sim::Managed* m = ManagedRangeLocked(p, n);
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
      m->read_mostly = 1;
      return CUDA_SUCCESS;
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
      m->read_mostly = 0;
      return CUDA_SUCCESS;
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
      if (!ValidLocation(loc)) return CUDA_ERROR_INVALID_DEVICE;
      m->preferred = loc;
      return CUDA_SUCCESS;
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
      m->preferred = CUmemLocation{CU_MEM_LOCATION_TYPE_INVALID, -2};
      return CUDA_SUCCESS;
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
      if (!ValidLocation(loc)) return CUDA_ERROR_INVALID_DEVICE;
      if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE)
        m->accessed_by_device = advice == CU_MEM_ADVISE_SET_ACCESSED_BY;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult simMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned flags,
                                CUstream) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  Sim::Managed* m = ManagedRangeLocked(p, n);
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidLocation(loc)) return CUDA_ERROR_INVALID_DEVICE;
  m->last_prefetch = loc;
  return CUDA_SUCCESS;
}
CUresult simStreamAttachMemAsync(CUstream, CUdeviceptr p, size_t n, unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST && flags != CU_MEM_ATTACH_SINGLE)
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->managed.find(p);  // the whole allocation, from its start
  if (it == g_sim->managed.end() || (n != 0 && n != it->second.size))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult simMemRangeGetAttribute(void* data, size_t size, CUmem_range_attribute attr, CUdeviceptr p,
                                 size_t n) {
  std::lock_guard<std::mutex> lock(g_sim->mu);
  Sim::Managed* m = ManagedRangeLocked(p, n);
  if (m == nullptr || data == nullptr || size < 4 || size % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  auto* out = static_cast<int*>(data);
  // The legacy forms say -1 for the host, -2 for none.
  auto id = [](const CUmemLocation& l) {
    return l.type == CU_MEM_LOCATION_TYPE_DEVICE
               ? l.id
               : (l.type == CU_MEM_LOCATION_TYPE_INVALID ? -2 : -1);
  };
  if (attr != CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY && size != 4) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY:
      *out = m->read_mostly;
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION:
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID:
      *out = id(m->preferred);
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE:
      *out = m->preferred.type;
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID:
      *out = id(m->last_prefetch);
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE:
      *out = m->last_prefetch.type;
      return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY:
      for (size_t i = 0; i < size / 4; ++i) out[i] = -2;
      if (m->accessed_by_device) out[0] = 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// --- virtual memory management. Sizes, addresses and offsets must be
// multiples of the granularity, 2 MiB as on H100/H200 (the driver's answers
// to misuse, as measured on an H200, are kept).
constexpr uint64_t kSimVmmGranularity = 2ull << 20;

bool Granular(uint64_t v) { return v % kSimVmmGranularity == 0; }

CUresult CheckProp(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  return prop->location.id >= 0 && prop->location.id < g_sim->devices ? CUDA_SUCCESS
                                                                      : CUDA_ERROR_INVALID_DEVICE;
}

CUresult simMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                        CUmemAllocationGranularity_flags) {
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = CheckProp(prop); rc != CUDA_SUCCESS) return rc;
  *granularity = kSimVmmGranularity;  // minimum and recommended alike
  return CUDA_SUCCESS;
}

CUresult simMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                              unsigned long long) {
  if (ptr == nullptr || size == 0 || !Granular(size) || (alignment & (alignment - 1)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  uint64_t align = std::max<uint64_t>(alignment, kSimVmmGranularity);
  const int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void* p = MAP_FAILED;
  if (addr != 0 && addr % align == 0)  // a hint: taken when that range is free
    p = mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != MAP_FAILED && p != reinterpret_cast<void*>(addr)) {
    munmap(p, size);
    p = MAP_FAILED;
  }
  if (p == MAP_FAILED) {  // anywhere, then trimmed to the alignment
    if (size > UINT64_MAX - align) return CUDA_ERROR_OUT_OF_MEMORY;
    void* raw = mmap(nullptr, size + align, PROT_NONE, kFlags, -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t lo = reinterpret_cast<uint64_t>(raw);
    uint64_t base = (lo + align - 1) / align * align;
    if (base > lo) munmap(raw, base - lo);
    if (base + size < lo + size + align)
      munmap(reinterpret_cast<void*>(base + size), lo + size + align - (base + size));
    p = reinterpret_cast<void*>(base);
  }
  std::lock_guard<std::mutex> lock(g_sim->mu);
  g_sim->reserved[reinterpret_cast<uint64_t>(p)] = size;
  *ptr = reinterpret_cast<uint64_t>(p);
  return CUDA_SUCCESS;
}

CUresult simMemAddressFree(CUdeviceptr ptr, size_t size) {
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->reserved.find(ptr);
  if (it == g_sim->reserved.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto inside = g_sim->mapped.lower_bound(ptr);
  if (inside != g_sim->mapped.end() && inside->first < ptr + size)
    return CUDA_ERROR_INVALID_VALUE;  // unmap first
  munmap(reinterpret_cast<void*>(ptr), size);
  g_sim->reserved.erase(it);
  return CUDA_SUCCESS;
}

CUresult simMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                      const CUmemAllocationProp* prop, unsigned long long flags) {
  if (handle == nullptr || size == 0 || !Granular(size) || flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = CheckProp(prop); rc != CUDA_SUCCESS) return rc;
  {
    std::lock_guard<std::mutex> lock(g_sim->mu);
    if (size > kSimMemory - g_sim->used[prop->location.id]) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  int fd = memfd_create("flyt-sim-vmm", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::lock_guard<std::mutex> lock(g_sim->mu);
  uint64_t h = g_sim->next_handle++;
  Sim::Physical& phys = g_sim->physical[h];
  phys.fd = fd;
  phys.size = size;
  phys.prop = *prop;
  phys.refs = 1;
  g_sim->used[prop->location.id] += size;
  *handle = h;
  return CUDA_SUCCESS;
}

// Frees a physical allocation nobody holds or maps any more (g_sim->mu held).
void FreeIfUnused(std::map<uint64_t, Sim::Physical>::iterator it) {
  if (it->second.refs > 0 || it->second.mappings > 0) return;
  close(it->second.fd);
  g_sim->used[it->second.prop.location.id] -= it->second.size;
  g_sim->physical.erase(it);
}

CUresult simMemRelease(CUmemGenericAllocationHandle handle) {
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->physical.find(handle);
  if (it == g_sim->physical.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  it->second.refs--;
  FreeIfUnused(it);
  return CUDA_SUCCESS;
}

CUresult simMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                   unsigned long long flags) {
  if (flags != 0 || size == 0 || !Granular(ptr) || !Granular(size)) return CUDA_ERROR_INVALID_VALUE;
  if (!Granular(offset)) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto phys = g_sim->physical.find(handle);
  if (phys == g_sim->physical.end() || phys->second.refs == 0 || offset > phys->second.size ||
      size > phys->second.size - offset)
    return CUDA_ERROR_INVALID_VALUE;
  if (!Within(g_sim->reserved, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  auto next = g_sim->mapped.lower_bound(ptr);
  if ((next != g_sim->mapped.end() && next->first - ptr < size) ||
      (next != g_sim->mapped.begin() &&
       ptr - std::prev(next)->first < std::prev(next)->second.size))
    return CUDA_ERROR_INVALID_VALUE;  // overlaps a mapping
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 phys->second.fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  g_sim->mapped[ptr] = Sim::Mapping{size, handle, CU_MEM_ACCESS_FLAGS_PROT_NONE};
  phys->second.mappings++;
  return CUDA_SUCCESS;
}

// A range of one reservation that cuts no mapping in two; holes are fine.
CUresult simMemUnmap(CUdeviceptr ptr, size_t size) {
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto& m = g_sim->mapped;
  if (size == 0 || !Within(g_sim->reserved, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  auto first = m.lower_bound(ptr);
  auto last = m.lower_bound(ptr + size);
  if ((first != m.begin() && ptr - std::prev(first)->first < std::prev(first)->second.size) ||
      (last != first && std::prev(last)->second.size > ptr + size - std::prev(last)->first))
    return CUDA_ERROR_INVALID_VALUE;  // a part of a mapping
  // Back to a reservation: the range stays the client's, without memory.
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_UNKNOWN;
  std::vector<uint64_t> handles;
  for (auto it = first; it != last; ++it) handles.push_back(it->second.handle);
  g_sim->mapped.erase(first, last);
  for (uint64_t h : handles) {
    auto phys = g_sim->physical.find(h);
    if (phys == g_sim->physical.end()) continue;
    phys->second.mappings--;
    FreeIfUnused(phys);
  }
  return CUDA_SUCCESS;
}

CUresult simMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (size == 0 || (desc == nullptr && count > 0)) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || desc[i].location.id >= g_sim->devices)
      return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
    access = desc[i].flags;
  }
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto& m = g_sim->mapped;
  auto it = m.upper_bound(ptr);
  if (it == m.begin() || ptr - std::prev(it)->first >= std::prev(it)->second.size)
    return CUDA_ERROR_INVALID_VALUE;
  --it;
  auto first = it;
  uint64_t end = it->first;
  for (; it != m.end() && it->first == end && end - ptr < size; ++it) end += it->second.size;
  if (end - ptr < size) return CUDA_ERROR_INVALID_VALUE;  // a hole in the range
  for (auto at = first; at != it; ++at) at->second.access = access;
  return CUDA_SUCCESS;
}

CUresult simMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                         CUdeviceptr ptr) {
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (location->id != 0) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->mapped.upper_bound(ptr);
  if (it == g_sim->mapped.begin() || ptr - std::prev(it)->first >= std::prev(it)->second.size)
    return CUDA_ERROR_INVALID_VALUE;
  *flags = std::prev(it)->second.access;
  return CUDA_SUCCESS;
}

CUresult simMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                 CUmemGenericAllocationHandle handle) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->physical.find(handle);  // released but still mapped counts, as natively
  if (it == g_sim->physical.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second.prop;
  return CUDA_SUCCESS;
}

CUresult simMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  uint64_t p = reinterpret_cast<uint64_t>(addr);
  auto it = g_sim->mapped.upper_bound(p);
  if (it == g_sim->mapped.begin() || p - std::prev(it)->first >= std::prev(it)->second.size)
    return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = std::prev(it)->second.handle;
  auto phys = g_sim->physical.find(h);
  if (phys == g_sim->physical.end()) return CUDA_ERROR_INVALID_VALUE;
  phys->second.refs++;
  *handle = h;
  return CUDA_SUCCESS;
}

// Shareable handles: a duplicate of the physical allocation's memfd; importing
// one (in this process or another) makes a handle on the same pages.
CUresult simMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                       CUmemAllocationHandleType type, unsigned long long) {
  if (shareable == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->physical.find(handle);
  if (it == g_sim->physical.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult simMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                         CUmemAllocationHandleType type) {
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int given = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  // Only what simMemCreate made: a memfd of its name, of a granular size.
  char link[64], target[128];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", given);
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  struct stat sb {};
  if (n <= 0 || fstat(given, &sb) != 0) return CUDA_ERROR_INVALID_VALUE;
  target[n] = '\0';
  if (std::strncmp(target, "/memfd:flyt-sim-vmm", 19) != 0 || sb.st_size <= 0 ||
      !Granular(static_cast<size_t>(sb.st_size)))
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(given, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  uint64_t h = g_sim->next_handle++;
  Sim::Physical& phys = g_sim->physical[h];
  phys.fd = fd;
  phys.size = static_cast<uint64_t>(sb.st_size);
  phys.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  phys.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  phys.prop.location.id = 0;
  phys.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  phys.refs = 1;
  g_sim->used[0] += phys.size;
  *handle = h;
  return CUDA_SUCCESS;
}

// --- streams and events
SimStream g_default_stream;

void WaitIdle(const std::shared_ptr<StreamWork>& w) {
  while (w->pending.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// A new stream joins the registry; its first host function waits for what
// its context was last told to wait for (cuCtxWaitEvent), if that is not done.
void AddStream(SimStream* st) {
  std::lock_guard<std::mutex> lock(g_sim->mu);
  g_sim->streams.insert(st);
  auto it = g_sim->ctx_waits.find(st->ctx);
  if (it == g_sim->ctx_waits.end()) return;
  if (it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    g_sim->ctx_waits.erase(it);
    return;
  }
  st->work->last = it->second;
}

CUresult simStreamCreate(CUstream* s, unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* st = new SimStream{0, flags};
  st->ctx = t_current;
  AddStream(st);
  *s = reinterpret_cast<CUstream>(st);
  return CUDA_SUCCESS;
}
CUresult simStreamCreateWithPriority(CUstream* s, unsigned flags, int prio) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* st = new SimStream{prio < -5 ? -5 : (prio > 0 ? 0 : prio), flags};
  st->ctx = t_current;
  AddStream(st);
  *s = reinterpret_cast<CUstream>(st);
  return CUDA_SUCCESS;
}
SimStream* AsStream(CUstream s) {
  uintptr_t v = reinterpret_cast<uintptr_t>(s);
  return v <= 2 ? nullptr : reinterpret_cast<SimStream*>(s);
}
SimStream* StreamOf(CUstream s) {
  SimStream* st = AsStream(s);
  return st != nullptr ? st : &g_default_stream;
}
CUresult simStreamDestroy(CUstream s) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (SimStream* st = AsStream(s)) {
    std::lock_guard<std::mutex> lock(g_sim->mu);
    g_sim->streams.erase(st);
  }
  delete AsStream(s);  // queued host functions keep their StreamWork alive
  return CUDA_SUCCESS;
}
CUresult simStreamSynchronize(CUstream s) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (AsStream(s) == nullptr) {
    while (g_pending_host_funcs.load() > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  } else {
    WaitIdle(StreamOf(s)->work);
  }
  return CUDA_SUCCESS;
}
CUresult simStreamQuery(CUstream s) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  bool busy = AsStream(s) == nullptr ? g_pending_host_funcs.load() > 0
                                     : StreamOf(s)->work->pending.load() > 0;
  return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
// Appends `body` to the stream's chain of host-side work: it runs on its own
// thread after everything queued before it, and counts as pending meanwhile.
void EnqueueOnStream(CUstream s, std::function<void()> body) {
  std::shared_ptr<StreamWork> work = StreamOf(s)->work;
  std::lock_guard<std::mutex> lock(work->mu);
  work->pending++;
  g_pending_host_funcs++;
  std::shared_future<void> before = work->last;
  auto done = std::make_shared<std::promise<void>>();
  work->last = done->get_future().share();
  std::thread([work, before, done, body = std::move(body)] {
    if (before.valid()) before.wait();
    body();
    work->pending--;
    g_pending_host_funcs--;
    done->set_value();
  }).detach();
}
CUresult simLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (SimStream* st = CapturingStream(s)) return CaptureHost(st, fn, data);
  EnqueueOnStream(s, [fn, data] { fn(data); });
  return CUDA_SUCCESS;
}
// An interprocess event is done when its page says its last record is.
bool PageDone(const SimEventPage* page, uint64_t target) {
  return page->done.load(std::memory_order_acquire) >= target;
}
void WaitPage(const SimEventPage* page, uint64_t target) {
  while (!PageDone(page, target)) std::this_thread::sleep_for(std::chrono::microseconds(200));
}
// Later host functions of the waiting stream run only after those the event
// was recorded behind (for an interprocess event, in whichever process).
CUresult simStreamWaitEvent(CUstream s, CUevent e, unsigned) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (SimStream* st = CapturingStream(s)) return CaptureEvent(st, e, false);
  auto* ev = reinterpret_cast<SimEvent*>(e);
  if (ev->shared != nullptr) {
    uint64_t target = ev->shared->page->recorded.load(std::memory_order_acquire);
    if (!PageDone(ev->shared->page, target))
      EnqueueOnStream(s, [shared = ev->shared, target] { WaitPage(shared->page, target); });
    return CUDA_SUCCESS;
  }
  std::shared_future<void> dep = ev->after;
  if (dep.valid()) EnqueueOnStream(s, [dep] { dep.wait(); });
  return CUDA_SUCCESS;
}
CUresult simStreamGetPriority(CUstream s, int* p) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *p = AsStream(s) ? AsStream(s)->priority : 0;
  return CUDA_SUCCESS;
}
CUresult simStreamGetFlags(CUstream s, unsigned* f) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *f = AsStream(s) ? AsStream(s)->flags : 0;
  return CUDA_SUCCESS;
}
// Stream attributes are kept per stream as set (the legacy stream keeps none):
// the access policy window, synchronization policy and priority as the driver
// reports them back. Values are checked as the driver checks them where the
// sim can (the window's hit ratio, its properties).
CUresult simStreamSetAttribute(CUstream s, CUstreamAttrID attr, const CUstreamAttrValue* v) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (attr == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
    const CUaccessPolicyWindow& w = v->accessPolicyWindow;
    if (w.hitRatio < 0.0f || w.hitRatio > 1.0f || w.hitProp > CU_ACCESS_PROPERTY_PERSISTING ||
        w.missProp > CU_ACCESS_PROPERTY_PERSISTING)
      return CUDA_ERROR_INVALID_VALUE;
  } else if (attr != CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY &&
             attr != CU_LAUNCH_ATTRIBUTE_PRIORITY && attr != CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN &&
             attr != CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  SimStream* st = AsStream(s);
  if (st == nullptr) return CUDA_SUCCESS;  // the default stream keeps nothing here
  std::lock_guard<std::mutex> lock(g_sim->mu);
  st->attributes[attr] = *v;
  return CUDA_SUCCESS;
}
CUresult simStreamGetAttribute(CUstream s, CUstreamAttrID attr, CUstreamAttrValue* v) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memset(v, 0, sizeof(*v));
  SimStream* st = AsStream(s);
  if (st == nullptr) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = st->attributes.find(attr);
  if (it != st->attributes.end()) *v = it->second;
  return CUDA_SUCCESS;
}
// The stream's context (the current one for the NULL and legacy streams).
CUresult simStreamGetCtx(CUstream s, CUcontext* ctx) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  SimStream* st = AsStream(s);
  *ctx = st != nullptr && st->ctx != nullptr ? st->ctx : t_current;
  return *ctx != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
CUresult simStreamGetDevice(CUstream s, CUdevice* dev) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  SimStream* st = AsStream(s);
  CUcontext ctx = st != nullptr && st->ctx != nullptr ? st->ctx : t_current;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  int d = ctx != nullptr ? CtxDeviceLocked(ctx) : 0;
  *dev = d < 0 ? 0 : d;
  return CUDA_SUCCESS;
}
CUresult simStreamCopyAttributes(CUstream dst, CUstream src) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  SimStream* to = AsStream(dst);
  SimStream* from = AsStream(src);
  if (to == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  to->attributes = from != nullptr ? from->attributes : std::map<int, CUstreamAttrValue>{};
  return CUDA_SUCCESS;
}
// Stream memory operations. Work here is synchronous, so a write happens at the call
// and a wait is checked at the call (for up to kSimWaitValueMs, as another thread of
// the app may still write the value); the GPU would wait in stream order instead.
constexpr int kSimWaitValueMs = 5000;
template <typename T>
CUresult WriteValue(CUstream s, CUdeviceptr addr, T value, unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (CUresult rc = CheckStreamContext(s); rc != CUDA_SUCCESS) return rc;
  // Driver 580 on an H200 refuses CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER too.
  if (flags != 0 || addr % sizeof(T) != 0 || !Valid(addr, sizeof(T)))
    return CUDA_ERROR_INVALID_VALUE;
  __atomic_store_n(reinterpret_cast<T*>(addr), value, __ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}
template <typename T>
CUresult WaitValue(CUstream s, CUdeviceptr addr, T value, unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (CUresult rc = CheckStreamContext(s); rc != CUDA_SUCCESS) return rc;
  const unsigned op = flags & ~unsigned{CU_STREAM_WAIT_VALUE_FLUSH};
  if (op > CU_STREAM_WAIT_VALUE_NOR || addr % sizeof(T) != 0 || !Valid(addr, sizeof(T)))
    return CUDA_ERROR_INVALID_VALUE;
  using Signed = std::make_signed_t<T>;
  auto met = [&] {
    T v = __atomic_load_n(reinterpret_cast<T*>(addr), __ATOMIC_SEQ_CST);
    switch (op) {
      case CU_STREAM_WAIT_VALUE_GEQ:
        return static_cast<Signed>(v - value) >= 0;
      case CU_STREAM_WAIT_VALUE_EQ:
        return v == value;
      case CU_STREAM_WAIT_VALUE_AND:
        return (v & value) != 0;
      default:  // NOR
        return ~(v | value) != 0;
    }
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kSimWaitValueMs);
  while (!met()) {
    if (std::chrono::steady_clock::now() > deadline) return CUDA_ERROR_LAUNCH_TIMEOUT;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return CUDA_SUCCESS;
}
CUresult simStreamWriteValue32(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned f) {
  return WriteValue<uint32_t>(s, a, v, f);
}
CUresult simStreamWaitValue32(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned f) {
  return WaitValue<uint32_t>(s, a, v, f);
}
CUresult simStreamWriteValue64(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned f) {
  return WriteValue<uint64_t>(s, a, v, f);
}
CUresult simStreamWaitValue64(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned f) {
  return WaitValue<uint64_t>(s, a, v, f);
}
CUresult simStreamBatchMemOp(CUstream s, unsigned count, CUstreamBatchMemOpParams* ops,
                             unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (flags != 0 || count > 256 || (count > 0 && ops == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    switch (ops[i].operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
      case CU_STREAM_MEM_OP_BARRIER:
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (unsigned i = 0; i < count; ++i) {
    const CUstreamBatchMemOpParams& p = ops[i];
    CUresult rc = CUDA_SUCCESS;
    switch (p.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        rc = WaitValue<uint32_t>(s, p.waitValue.address, p.waitValue.value, p.waitValue.flags);
        break;
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        rc = WaitValue<uint64_t>(s, p.waitValue.address, p.waitValue.value64, p.waitValue.flags);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        rc = WriteValue<uint32_t>(s, p.writeValue.address, p.writeValue.value, p.writeValue.flags);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        rc =
            WriteValue<uint64_t>(s, p.writeValue.address, p.writeValue.value64, p.writeValue.flags);
        break;
      default:  // flushes and barriers: every sim access is already ordered
        break;
    }
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
CUresult simThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_capture_mode);
  return CUDA_SUCCESS;
}
CUresult simStreamIsCapturing(CUstream s, CUstreamCaptureStatus* st) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (st == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *st = CapturingStream(s) != nullptr ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                      : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult simStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus* st, cuuint64_t* id, CUgraph* g,
                                 const CUgraphNode** deps, const CUgraphEdgeData** edges,
                                 size_t* n) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  SimStream* cap = CapturingStream(s);
  if (st) *st = cap != nullptr ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = cap != nullptr ? cap->capture_id : 0;
  if (g) *g = cap != nullptr ? reinterpret_cast<CUgraph>(cap->capture) : nullptr;
  const bool any = cap != nullptr && !cap->capture_deps.empty();
  if (deps) *deps = any ? cap->capture_deps.data() : nullptr;
  if (edges) *edges = nullptr;
  if (n) *n = any ? cap->capture_deps.size() : 0;
  return CUDA_SUCCESS;
}
CUresult simStreamGetId(CUstream s, unsigned long long* id) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *id = reinterpret_cast<uintptr_t>(s);
  return CUDA_SUCCESS;
}
// A memfd of one page holding a SimEventPage, mapped here.
CUresult NewEventPage(SimEvent* ev) {
  int fd = memfd_create(kEventMemfd, MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st {};
  void* p = MAP_FAILED;
  if (ftruncate(fd, sizeof(SimEventPage)) != 0 || fstat(fd, &st) != 0 ||
      (p = mmap(nullptr, sizeof(SimEventPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
          MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto* page = new (p) SimEventPage{kSimEventPageMagic, 0, {0}, {0}};
  ev->shared = std::make_shared<SimEventShared>();
  ev->shared->page = page;
  ev->ipc_fd = fd;
  ev->ipc_dev = st.st_dev;
  ev->ipc_ino = st.st_ino;
  return CUDA_SUCCESS;
}

constexpr unsigned kSimEventFlags =
    CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
CUresult simEventCreate(CUevent* e, unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (e == nullptr || (flags & ~kSimEventFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  // An interprocess event must not time (as the driver demands).
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
    return CUDA_ERROR_INVALID_VALUE;
  auto ev = std::make_unique<SimEvent>();
  ev->flags = flags;
  ev->ctx = t_current;
  if (flags & CU_EVENT_INTERPROCESS) {
    if (CUresult rc = NewEventPage(ev.get()); rc != CUDA_SUCCESS) return rc;
  }
  *e = reinterpret_cast<CUevent>(ev.release());
  return CUDA_SUCCESS;
}
CUresult simEventDestroy(CUevent e) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  auto* ev = reinterpret_cast<SimEvent*>(e);
  if (ev != nullptr && ev->ipc_fd >= 0) close(ev->ipc_fd);
  delete ev;  // queued waits keep the shared page mapped
  return CUDA_SUCCESS;
}
// Record `seq` of an interprocess event done (records may finish out of order).
void MarkPageDone(const SimEventShared& shared, uint64_t seq) {
  std::atomic<uint64_t>& done = shared.page->done;
  uint64_t was = done.load(std::memory_order_acquire);
  while (was < seq && !done.compare_exchange_weak(was, seq, std::memory_order_acq_rel)) {
  }
}
CUresult simEventRecord(CUevent e, CUstream s) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (SimStream* st = CapturingStream(s)) return CaptureEvent(st, e, true);
  auto* ev = reinterpret_cast<SimEvent*>(e);
  ev->at = std::chrono::steady_clock::now();
  ev->recorded = true;
  ev->work = StreamOf(s)->work;
  if (ev->shared != nullptr) {
    // Done at once, or when the host functions queued before it have run.
    SimEventPage* page = ev->shared->page;
    uint64_t seq = page->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
    auto mark = [shared = ev->shared, seq] { MarkPageDone(*shared, seq); };
    if (ev->work->pending.load() > 0) {
      EnqueueOnStream(s, mark);
    } else {
      mark();
    }
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(ev->work->mu);
  ev->after = ev->work->last;
  return CUDA_SUCCESS;
}
CUresult simEventQuery(CUevent e) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  auto* ev = reinterpret_cast<SimEvent*>(e);
  if (ev->shared != nullptr) {
    const SimEventPage* page = ev->shared->page;
    return PageDone(page, page->recorded.load(std::memory_order_acquire)) ? CUDA_SUCCESS
                                                                          : CUDA_ERROR_NOT_READY;
  }
  return ev->work != nullptr && ev->work->pending.load() > 0 ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
CUresult simEventSynchronize(CUevent e) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  auto* ev = reinterpret_cast<SimEvent*>(e);
  if (ev->shared != nullptr) {
    WaitPage(ev->shared->page, ev->shared->page->recorded.load(std::memory_order_acquire));
    return CUDA_SUCCESS;
  }
  if (ev->work != nullptr) WaitIdle(ev->work);
  return CUDA_SUCCESS;
}
CUresult simEventRecordWithFlags(CUevent e, CUstream s, unsigned) { return simEventRecord(e, s); }
CUresult simEventElapsedTime(float* ms, CUevent a, CUevent b) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* ea = reinterpret_cast<SimEvent*>(a);
  auto* eb = reinterpret_cast<SimEvent*>(b);
  if (!ea->recorded || !eb->recorded || ((ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING))
    return CUDA_ERROR_INVALID_HANDLE;
  *ms = std::chrono::duration<float, std::milli>(eb->at - ea->at).count();
  return CUDA_SUCCESS;
}
// --- context events
// The context's streams: the NULL stream (shared by every context here) and
// the streams made while it was current.
std::vector<SimStream*> StreamsOf(CUcontext ctx) {
  std::vector<SimStream*> out{&g_default_stream};
  std::lock_guard<std::mutex> lock(g_sim->mu);
  for (SimStream* st : g_sim->streams)
    if (st->ctx == ctx) out.push_back(st);
  return out;
}
// The event is done once every host function queued on the context's streams
// by now has run: a StreamWork of its own, pending until then, stands for
// them (cuEventQuery, cuEventSynchronize and the waits read it).
// The checks both context-event calls make; a null context is the current one.
CUresult CheckContextEvent(CUcontext* c, CUevent e) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (*c == nullptr) *c = t_current;
  if (*c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return e == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}
CUresult simCtxRecordEvent(CUcontext c, CUevent e) {
  if (CUresult rc = CheckContextEvent(&c, e); rc != CUDA_SUCCESS) return rc;
  auto* ev = reinterpret_cast<SimEvent*>(e);
  // The event must be of the context recorded (the driver's INVALID_HANDLE).
  if (ev->ctx != nullptr && ev->ctx != c) return CUDA_ERROR_INVALID_HANDLE;
  std::vector<std::shared_future<void>> before;
  for (SimStream* st : StreamsOf(c)) {
    std::lock_guard<std::mutex> lock(st->work->mu);
    if (st->work->pending.load() > 0 && st->work->last.valid()) before.push_back(st->work->last);
  }
  ev->at = std::chrono::steady_clock::now();
  ev->recorded = true;
  std::shared_ptr<SimEventShared> shared = ev->shared;
  uint64_t seq = 0;
  if (shared != nullptr) seq = shared->page->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
  auto work = std::make_shared<StreamWork>();
  if (before.empty()) {
    if (shared != nullptr) MarkPageDone(*shared, seq);
  } else {
    work->pending = 1;
    auto done = std::make_shared<std::promise<void>>();
    work->last = done->get_future().share();
    std::thread([work, before = std::move(before), done, shared, seq] {
      for (const auto& f : before) f.wait();
      if (shared != nullptr) MarkPageDone(*shared, seq);
      work->pending--;
      done->set_value();
    }).detach();
  }
  ev->work = work;
  ev->after = work->last;
  return CUDA_SUCCESS;
}
// Each stream of the context waits for the event (cuStreamWaitEvent), and so
// do the context's streams made later (AddStream).
CUresult simCtxWaitEvent(CUcontext c, CUevent e) {
  if (CUresult rc = CheckContextEvent(&c, e); rc != CUDA_SUCCESS) return rc;
  auto* ev = reinterpret_cast<SimEvent*>(e);
  for (SimStream* st : StreamsOf(c)) {
    CUstream s = st == &g_default_stream ? nullptr : reinterpret_cast<CUstream>(st);
    if (CUresult rc = simStreamWaitEvent(s, e, 0); rc != CUDA_SUCCESS) return rc;
  }
  if (ev->shared == nullptr && ev->after.valid()) {
    std::lock_guard<std::mutex> lock(g_sim->mu);
    g_sim->ctx_waits[c] = ev->after;
  }
  return CUDA_SUCCESS;
}
CUresult simMemHostAlloc(void** p, size_t n, unsigned) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *p = std::malloc(n ? n : 1);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult simMemFreeHost(void* p) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::free(p);
  return CUDA_SUCCESS;
}
CUresult simMemHostRegister(void* p, size_t n, unsigned) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (p == nullptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto base = reinterpret_cast<uint64_t>(p);
  auto next = g_sim->registered.lower_bound(base);
  if (next != g_sim->registered.end() && next->first < base + n)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (next != g_sim->registered.begin() && std::prev(next)->first + std::prev(next)->second > base)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  g_sim->registered[base] = n;
  return CUDA_SUCCESS;
}
CUresult simMemHostUnregister(void* p) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  return g_sim->registered.erase(reinterpret_cast<uint64_t>(p)) == 1
             ? CUDA_SUCCESS
             : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}
CUresult simMemHostGetDevicePointer(CUdeviceptr* d, void* p, unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (d == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  if (!Within(g_sim->registered, reinterpret_cast<uint64_t>(p), 1)) return CUDA_ERROR_INVALID_VALUE;
  *d = reinterpret_cast<uint64_t>(p);
  return CUDA_SUCCESS;
}

// --- CUDA IPC (see the top of this file)

// Opens the exporter's memfd through /proc (works for this process too) and
// checks that it is one of the sim's IPC memfds and still the file the
// handle names: a made-up handle cannot map any other file of the server.
int OpenExported(const SimIpcHandle& h, const char* memfd_name) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%u/fd/%d", h.pid, h.fd);
  char target[128] = {};
  ssize_t n = readlink(path, target, sizeof(target) - 1);
  std::string want = std::string("/memfd:") + memfd_name + " (deleted)";
  if (n < 0 || want != target) {
    FLYT_DEBUG("sim: IPC handle of pid %u names %s (%s), not an IPC export", h.pid, path,
               n < 0 ? strerror(errno) : target);
    return -1;
  }
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    FLYT_DEBUG("sim: cannot open IPC handle of pid %u (%s): %s", h.pid, path, strerror(errno));
    return -1;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_dev != h.dev || st.st_ino != h.ino ||
      static_cast<uint64_t>(st.st_size) < h.size) {
    FLYT_DEBUG("sim: IPC handle of pid %u names a file that is gone", h.pid);
    close(fd);
    return -1;
  }
  return fd;
}

// Moves an allocation's pages into a memfd mapped over the same addresses
// (g_sim->mu held). Pages of zeros are left out (the memfd reads as zero
// there), so that a large allocation never written costs no memory.
CUresult ShareAllocation(uint64_t base, uint64_t size, Sim::Exported* out) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t bytes = (size + page - 1) / page * page;
  int fd = memfd_create(kMemoryMemfd, MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st {};
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fstat(fd, &st) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  static const std::vector<char> zeros(1 << 16);
  for (uint64_t at = 0; at < bytes; at += page) {
    const char* from = reinterpret_cast<const char*>(base + at);
    bool zero = true;
    for (uint64_t off = 0; zero && off < page; off += zeros.size())
      zero =
          std::memcmp(from + off, zeros.data(), std::min<uint64_t>(zeros.size(), page - off)) == 0;
    for (uint64_t off = 0; !zero && off < page;) {
      ssize_t n = pwrite(fd, from + off, page - off, static_cast<off_t>(at + off));
      if (n <= 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      off += static_cast<uint64_t>(n);
    }
  }
  void* p = mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {  // MAP_FIXED failed: the old mapping is still in place
    close(fd);
    return CUDA_ERROR_MAP_FAILED;
  }
  *out = Sim::Exported{fd, st.st_dev, st.st_ino};
  return CUDA_SUCCESS;
}

// Any address inside an allocation made by cuMemAlloc/cuMemAllocPitch names
// it, as with the driver; pool memory and memory opened over IPC do not.
CUresult simIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr d) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->allocs.upper_bound(d);
  if (it == g_sim->allocs.begin() || d - std::prev(it)->first >= std::prev(it)->second)
    return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (g_sim->pool_allocs.count(it->first) != 0) return CUDA_ERROR_INVALID_VALUE;
  auto ex = g_sim->exported.find(it->first);
  if (ex == g_sim->exported.end()) {
    Sim::Exported shared;
    if (CUresult rc = ShareAllocation(it->first, it->second, &shared); rc != CUDA_SUCCESS)
      return rc;
    ex = g_sim->exported.emplace(it->first, shared).first;
  }
  SimIpcHandle h{};
  h.magic = kSimIpcMagic;
  h.kind = kSimIpcMemory;
  h.pid = static_cast<uint32_t>(getpid());
  h.fd = ex->second.fd;
  h.dev = ex->second.dev;
  h.ino = ex->second.ino;
  h.size = it->second;
  h.base = it->first;
  std::memcpy(handle->reserved, &h, sizeof(h));
  return CUDA_SUCCESS;
}

// Opening one allocation again returns the same address and counts the open.
CUresult simIpcOpenMemHandle(CUdeviceptr* out, CUipcMemHandle handle, unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr || !(flags & CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
    return CUDA_ERROR_INVALID_VALUE;
  SimIpcHandle h{};
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (h.magic != kSimIpcMagic || h.kind != kSimIpcMemory || h.size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  int fd = OpenExported(h, kMemoryMemfd);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // as the driver, once the exporter has exited
  std::lock_guard<std::mutex> lock(g_sim->mu);
  for (auto& [base, opened] : g_sim->ipc_opened) {
    if (opened.dev == h.dev && opened.ino == h.ino) {
      close(fd);
      opened.refs++;
      *out = base;
      return CUDA_SUCCESS;
    }
  }
  void* p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  uint64_t base = reinterpret_cast<uint64_t>(p);
  g_sim->ipc_mapped[base] = h.size;
  g_sim->ipc_opened[base] = Sim::Opened{h.dev, h.ino, 1};
  *out = base;
  return CUDA_SUCCESS;
}

CUresult simIpcCloseMemHandle(CUdeviceptr d) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->ipc_opened.find(d);
  if (it == g_sim->ipc_opened.end()) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs > 0) return CUDA_SUCCESS;
  munmap(reinterpret_cast<void*>(d), g_sim->ipc_mapped[d]);
  g_sim->ipc_mapped.erase(d);
  g_sim->ipc_opened.erase(it);
  return CUDA_SUCCESS;
}

CUresult simIpcGetEventHandle(CUipcEventHandle* handle, CUevent e) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* ev = reinterpret_cast<SimEvent*>(e);
  // Only events created interprocess, never one that was itself opened.
  if (ev == nullptr || ev->imported || ev->ipc_fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  SimIpcHandle h{};
  h.magic = kSimIpcMagic;
  h.kind = kSimIpcEvent;
  h.pid = static_cast<uint32_t>(getpid());
  h.fd = ev->ipc_fd;
  h.dev = ev->ipc_dev;
  h.ino = ev->ipc_ino;
  h.size = sizeof(SimEventPage);
  std::memcpy(handle->reserved, &h, sizeof(h));
  return CUDA_SUCCESS;
}

// Each open gives a new event that shares the exporter's completion state.
// (Unlike the driver, the sim cannot open an event whose exporter exited.)
CUresult simIpcOpenEventHandle(CUevent* out, CUipcEventHandle handle) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  SimIpcHandle h{};
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (h.magic != kSimIpcMagic || h.kind != kSimIpcEvent || h.size != sizeof(SimEventPage))
    return CUDA_ERROR_MAP_FAILED;  // what the driver answers for a handle it cannot map
  int fd = OpenExported(h, kEventMemfd);
  if (fd < 0) return CUDA_ERROR_MAP_FAILED;
  void* p = mmap(nullptr, sizeof(SimEventPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  auto* page = static_cast<SimEventPage*>(p);
  if (page->magic != kSimEventPageMagic) {
    munmap(p, sizeof(SimEventPage));
    return CUDA_ERROR_MAP_FAILED;
  }
  auto ev = std::make_unique<SimEvent>();
  ev->flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  ev->ctx = t_current;
  ev->imported = true;
  ev->shared = std::make_shared<SimEventShared>();
  ev->shared->page = page;
  *out = reinterpret_cast<CUevent>(ev.release());
  return CUDA_SUCCESS;
}

// --- the JIT linker: enough for CI. An input is checked by its type (PTX must
// look like PTX, a cubin must be an ELF, a fatbin a fatbin); the result is the
// first cubin or fatbin added, else the first PTX as is, which the sim's
// cuModuleLoadData accepts. The logs get one fixed line.
struct SimLink {
  std::vector<CUjit_option> options;
  void** values = nullptr;  // the caller's, written through as the driver does
  std::vector<uint8_t> binary, ptx, result;
  int inputs = 0;
};
std::mutex g_link_mu;
std::set<SimLink*> g_links;  // under g_link_mu

SimLink* FindLink(CUlinkState state) {
  auto it = g_links.find(reinterpret_cast<SimLink*>(state));
  return it == g_links.end() ? nullptr : *it;
}
// Writes `text` into the info or error log buffer the options name, and the
// bytes written (with the NUL) into the matching size option.
void SimLinkLog(SimLink* link, bool error, const std::string& text) {
  CUjit_option buffer = error ? CU_JIT_ERROR_LOG_BUFFER : CU_JIT_INFO_LOG_BUFFER;
  CUjit_option size =
      error ? CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES : CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES;
  int at_buffer = -1, at_size = -1;
  for (size_t i = 0; i < link->options.size(); ++i) {
    if (link->options[i] == buffer) at_buffer = static_cast<int>(i);
    if (link->options[i] == size) at_size = static_cast<int>(i);
  }
  if (at_buffer < 0 || at_size < 0 || link->values[at_buffer] == nullptr) return;
  auto cap = static_cast<size_t>(
      static_cast<unsigned>(reinterpret_cast<uintptr_t>(link->values[at_size])));
  if (cap == 0) return;
  size_t n = std::min(text.size(), cap - 1);
  auto* dst = static_cast<char*>(link->values[at_buffer]);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
  link->values[at_size] = reinterpret_cast<void*>(static_cast<uintptr_t>(n + 1));
}
// TMA descriptors: the driver's documented argument checks, and a descriptor
// of the sim's own layout (opaque[0] the address, then the other arguments,
// so that replacing the address back gives the same bytes).
size_t SimTensorElementBytes(uint32_t dtype) {
  switch (dtype) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
      return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
      return 2;
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
      return 8;
    default:
      return dtype <= CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ ? 4 : 0;
  }
}
CUresult simTensorMapCommon(CUtensorMap* map, uint32_t kind, CUtensorMapDataType dtype,
                            cuuint32_t rank, void* address, const cuuint64_t* dims,
                            const cuuint64_t* strides, const cuuint32_t* element_strides,
                            CUtensorMapInterleave interleave, uint64_t extra) {
  const uint64_t align = interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16;
  if (map == nullptr || rank == 0 || rank > 5 || SimTensorElementBytes(dtype) == 0 ||
      (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3) || dims == nullptr ||
      (rank > 1 && strides == nullptr) || element_strides == nullptr ||
      reinterpret_cast<uintptr_t>(address) % align != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
    if (element_strides[i] == 0 || element_strides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
    if (i + 1 < rank && (strides[i] % align != 0 || strides[i] >= (1ull << 40)))
      return CUDA_ERROR_INVALID_VALUE;
  }
  std::memset(map, 0, sizeof *map);
  map->opaque[0] = reinterpret_cast<uintptr_t>(address);
  map->opaque[1] = kind | static_cast<uint64_t>(dtype) << 8 | static_cast<uint64_t>(rank) << 16 |
                   static_cast<uint64_t>(interleave) << 24;
  map->opaque[2] = extra;
  for (cuuint32_t i = 0; i < rank; ++i) {
    map->opaque[3 + i] = dims[i];
    map->opaque[8 + i] = (i + 1 < rank ? strides[i] : 0) << 8 | element_strides[i];
  }
  return CUDA_SUCCESS;
}
CUresult simTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank,
                                 void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                                 const cuuint32_t* box, const cuuint32_t* element_strides,
                                 CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  if (box == nullptr || rank == 0 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
  uint64_t boxes = 0;
  for (cuuint32_t i = 0; i < rank; ++i) {
    if (box[i] == 0 || box[i] > 256) return CUDA_ERROR_INVALID_VALUE;
    boxes = boxes * 257 + box[i];
  }
  if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE &&
      box[0] * SimTensorElementBytes(dtype) % 16 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  return simTensorMapCommon(map, 1 | static_cast<uint32_t>(swizzle) << 4, dtype, rank, address,
                            dims, strides, element_strides, interleave, boxes);
}
CUresult simTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank,
                                  void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                                  const int* lower, const int* upper, cuuint32_t channels,
                                  cuuint32_t pixels, const cuuint32_t* element_strides,
                                  CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  if (rank < 3 || lower == nullptr || upper == nullptr || channels == 0 || channels > 256 ||
      pixels == 0 || pixels > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  return simTensorMapCommon(map, 2 | static_cast<uint32_t>(swizzle) << 4, dtype, rank, address,
                            dims, strides, element_strides, interleave,
                            static_cast<uint64_t>(channels) << 32 | pixels);
}
CUresult simTensorMapEncodeIm2colWide(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank,
                                      void* address, const cuuint64_t* dims,
                                      const cuuint64_t* strides, int, int, cuuint32_t channels,
                                      cuuint32_t pixels, const cuuint32_t* element_strides,
                                      CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode,
                                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion,
                                      CUtensorMapFloatOOBfill) {
  if (rank < 3 || channels == 0 || channels > 256 || pixels == 0 || pixels > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  return simTensorMapCommon(map, 3 | static_cast<uint32_t>(swizzle) << 4, dtype, rank, address,
                            dims, strides, element_strides, interleave,
                            static_cast<uint64_t>(channels) << 32 | pixels);
}
CUresult simTensorMapReplaceAddress(CUtensorMap* map, void* address) {
  if (map == nullptr || reinterpret_cast<uintptr_t>(address) % 16 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  map->opaque[0] = reinterpret_cast<uintptr_t>(address);
  return CUDA_SUCCESS;
}
CUresult simLinkCreate(unsigned n, CUjit_option* options, void** values, CUlinkState* out) {
  if (out == nullptr || (n > 0 && (options == nullptr || values == nullptr)))
    return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i)
    if (options[i] >= CU_JIT_NUM_OPTIONS) return CUDA_ERROR_INVALID_VALUE;
  auto* link = new SimLink;
  link->options.assign(options, options + n);
  link->values = values;
  std::lock_guard<std::mutex> lock(g_link_mu);
  g_links.insert(link);
  *out = reinterpret_cast<CUlinkState>(link);
  return CUDA_SUCCESS;
}
CUresult simLinkAddData(CUlinkState state, CUjitInputType type, void* data, size_t size,
                        const char* name, unsigned, CUjit_option*, void**) {
  std::lock_guard<std::mutex> lock(g_link_mu);
  SimLink* link = FindLink(state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (data == nullptr || size == 0 || type >= CU_JIT_NUM_INPUT_TYPES)
    return CUDA_ERROR_INVALID_VALUE;
  std::string what = name != nullptr ? name : "(unnamed input)";
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (type == CU_JIT_INPUT_PTX) {
    std::string text(reinterpret_cast<const char*>(bytes), strnlen(static_cast<char*>(data), size));
    if (text.find(".version") == std::string::npos || text.find(".target") == std::string::npos) {
      SimLinkLog(link, true, "ptxas fatal   : sim: " + what + " is not PTX");
      return CUDA_ERROR_INVALID_PTX;
    }
    if (link->ptx.empty()) {
      link->ptx.assign(text.begin(), text.end());
      link->ptx.push_back(0);
    }
  } else if (type == CU_JIT_INPUT_CUBIN || type == CU_JIT_INPUT_FATBINARY ||
             type == CU_JIT_INPUT_OBJECT) {
    ImageSpan span{};
    ImageKind want = type == CU_JIT_INPUT_FATBINARY ? ImageKind::kFatbin : ImageKind::kElf;
    if (!LocateImageWithin(data, size, &span) || span.kind != want) {
      SimLinkLog(link, true, "nvlink error   : sim: " + what + " is not a valid input");
      return CUDA_ERROR_INVALID_IMAGE;
    }
    if (link->binary.empty()) link->binary.assign(bytes, bytes + span.size);
  } else {
    return CUDA_ERROR_NOT_SUPPORTED;  // libraries and NVVM: not in the sim
  }
  link->inputs++;
  return CUDA_SUCCESS;
}
CUresult simLinkComplete(CUlinkState state, void** cubin, size_t* size) {
  std::lock_guard<std::mutex> lock(g_link_mu);
  SimLink* link = FindLink(state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (cubin == nullptr || size == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (link->inputs == 0) {
    SimLinkLog(link, true, "nvlink error   : sim: no input");
    return CUDA_ERROR_INVALID_VALUE;
  }
  link->result = !link->binary.empty() ? link->binary : link->ptx;
  SimLinkLog(link, false, "info    : sim: linked " + std::to_string(link->inputs) + " inputs");
  for (size_t i = 0; i < link->options.size(); ++i) {
    if (link->options[i] != CU_JIT_WALL_TIME) continue;
    float ms = 0.5f;
    uint32_t bits = 0;
    std::memcpy(&bits, &ms, sizeof(bits));
    link->values[i] = reinterpret_cast<void*>(static_cast<uintptr_t>(bits));
  }
  *cubin = link->result.data();
  *size = link->result.size();
  return CUDA_SUCCESS;
}
CUresult simLinkDestroy(CUlinkState state) {
  std::lock_guard<std::mutex> lock(g_link_mu);
  SimLink* link = FindLink(state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  g_links.erase(link);
  delete link;
  return CUDA_SUCCESS;
}

// --- CUDA graphs built by hand (and by the session's helpers). A graph is a
// list of nodes kept in a topological order (each node after its dependencies;
// edges added later reorder it), and each node lists its dependencies. An executable graph is a
// deep copy made at instantiation, with a map from the original nodes to its own (for the
// cuGraphExec*SetParams calls). A launch runs the copy's nodes in order on the calling thread,
// after the stream's pending host functions: kernels are recorded (and the modelled kernels act,
// see SimKernelActions), copies and memsets happen, host nodes call their function, conditional
// nodes run their body graphs by the conditional value. Memory of an allocation node is allocated
// when the node is added and freed with the graph that added it.
struct SimGraph;
struct SimCond {
  unsigned default_value = 0;
  unsigned flags = 0;
  std::atomic<unsigned> value{0};
};
struct SimNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  SimGraph* owner = nullptr;
  CUfunction func = nullptr;
  unsigned dims[6] = {};
  unsigned shmem = 0;
  std::vector<uint8_t> params;                  // kernel argument buffer
  std::vector<void*> param_ptrs;                // into params, for cuGraphKernelNodeGetParams
  std::map<int, CUlaunchAttributeValue> attrs;  // kernel node attributes set
  CUDA_MEMCPY3D copy{};
  CUDA_MEMSET_NODE_PARAMS memset{};
  CUDA_HOST_NODE_PARAMS host{};
  std::unique_ptr<SimGraph> child;  // child graph node
  CUevent event = nullptr;
  CUdeviceptr dptr = 0;  // allocation and free nodes
  size_t bytes = 0;
  bool owns_alloc = false;
  SimCond* cond = nullptr;
  CUgraphConditionalNodeType cond_type = CU_GRAPH_COND_TYPE_IF;
  std::vector<std::unique_ptr<SimGraph>> bodies;
  std::vector<CUgraph> body_handles;  // phGraph_out of the node's creation
  std::vector<SimNode*> deps;         // incoming edges, nodes of the same graph
  std::vector<CUgraphEdgeData> dep_data;
  bool enabled = true;  // cuGraphNodeSetEnabled, on an executable graph's copy
};
struct SimGraph {
  std::vector<std::unique_ptr<SimNode>> nodes;
  std::map<const SimNode*, SimNode*> from;  // clone or exec copy: original -> copy
  ~SimGraph();
};
struct SimExec {
  std::unique_ptr<SimGraph> graph;
  unsigned long long flags = 0;  // as instantiated (cuGraphExecGetFlags)
};
std::mutex g_graph_mu;  // guards the sets below
std::set<SimGraph*> g_graphs;
std::set<SimNode*> g_nodes;
std::set<SimExec*> g_execs;
std::set<SimCond*> g_conds;
std::map<CUdeviceptr, size_t> g_graph_allocs;  // live allocation-node memory
uint64_t g_graph_mem_high = 0;

void ForgetNodes(SimGraph* g) {
  for (auto& n : g->nodes) {
    g_nodes.erase(n.get());
    if (n->child) ForgetNodes(n->child.get());
    for (auto& b : n->bodies) ForgetNodes(b.get());
  }
  g_graphs.erase(g);
}
SimGraph::~SimGraph() {
  for (auto& n : nodes)
    if (n->owns_alloc && n->dptr != 0) {
      g_graph_allocs.erase(n->dptr);
      FreeAlloc(n->dptr);
    }
}

bool IsGraphAlloc(CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  return g_graph_allocs.count(p) != 0;
}

SimGraph* AsGraph(CUgraph g) {
  auto* p = reinterpret_cast<SimGraph*>(g);
  return g_graphs.count(p) ? p : nullptr;
}
SimNode* AsNode(CUgraphNode n) {
  auto* p = reinterpret_cast<SimNode*>(n);
  return g_nodes.count(p) ? p : nullptr;
}
SimExec* AsExec(CUgraphExec e) {
  auto* p = reinterpret_cast<SimExec*>(e);
  return g_execs.count(p) ? p : nullptr;
}

// Deep copy of `src` (nodes, edges implied by order, bodies and children).
// Allocation nodes of the copy do not own their memory. Every copied node is
// entered in `top->from` under its original.
std::unique_ptr<SimGraph> CopyGraph(const SimGraph& src, SimGraph* top) {
  auto g = std::make_unique<SimGraph>();
  if (top == nullptr) top = g.get();
  g_graphs.insert(g.get());
  for (const auto& n : src.nodes) {
    auto c = std::make_unique<SimNode>();
    c->type = n->type;
    c->owner = g.get();
    c->func = n->func;
    std::memcpy(c->dims, n->dims, sizeof(c->dims));
    c->shmem = n->shmem;
    c->params = n->params;
    c->attrs = n->attrs;
    c->copy = n->copy;
    c->memset = n->memset;
    c->host = n->host;
    if (n->child) c->child = CopyGraph(*n->child, top);
    c->event = n->event;
    c->dptr = n->dptr;
    c->bytes = n->bytes;
    c->cond = n->cond;
    c->cond_type = n->cond_type;
    for (const auto& b : n->bodies) c->bodies.push_back(CopyGraph(*b, top));
    c->dep_data = n->dep_data;
    c->enabled = n->enabled;
    for (SimNode* d : n->deps) c->deps.push_back(top->from.at(d));  // d came earlier
    top->from[n.get()] = c.get();
    g_nodes.insert(c.get());
    g->nodes.push_back(std::move(c));
  }
  return g;
}

CUresult simGraphCreate(CUgraph* out, unsigned flags) {
  if (out == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto* g = new SimGraph;
  std::lock_guard<std::mutex> lock(g_graph_mu);
  g_graphs.insert(g);
  *out = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}
CUresult simGraphDestroy(CUgraph graph) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = AsGraph(graph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ForgetNodes(g);
  delete g;
  return CUDA_SUCCESS;
}
CUresult simGraphGetNodes(CUgraph graph, CUgraphNode* out, size_t* count) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = AsGraph(graph);
  if (g == nullptr || count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (out != nullptr)
    for (size_t i = 0; i < *count && i < g->nodes.size(); ++i)
      out[i] = reinterpret_cast<CUgraphNode>(g->nodes[i].get());
  *count = g->nodes.size();
  return CUDA_SUCCESS;
}
CUresult simGraphNodeGetType(CUgraphNode node, CUgraphNodeType* type) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = AsNode(node);
  if (n == nullptr || type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = n->type;
  return CUDA_SUCCESS;
}

// Adds a node of `type` to `graph` after `deps` (all of that graph); the
// caller fills it through `fill` (g_graph_mu held), which may refuse it.
template <typename Fill>
CUresult AddNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t ndeps,
                 CUgraphNodeType type, Fill&& fill) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = AsGraph(graph);
  if (out == nullptr || g == nullptr || (ndeps > 0 && deps == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < ndeps; ++i) {
    SimNode* d = AsNode(deps[i]);
    if (d == nullptr || d->owner != g) return CUDA_ERROR_INVALID_VALUE;
  }
  auto n = std::make_unique<SimNode>();
  n->type = type;
  n->owner = g;
  for (size_t i = 0; i < ndeps; ++i) {
    SimNode* d = AsNode(deps[i]);
    if (std::find(n->deps.begin(), n->deps.end(), d) != n->deps.end())
      return CUDA_ERROR_INVALID_VALUE;  // the same dependency twice
    n->deps.push_back(d);
    n->dep_data.push_back(CUgraphEdgeData{});
  }
  CUresult rc = fill(n.get());
  if (rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUgraphNode>(n.get());
  g_nodes.insert(n.get());
  g->nodes.push_back(std::move(n));
  return CUDA_SUCCESS;
}

CUresult FillKernel(SimNode* n, const CUDA_KERNEL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUfunction f = p->func != nullptr ? p->func : reinterpret_cast<CUfunction>(p->kern);
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* k = reinterpret_cast<SimKernel*>(f);
  size_t size = 0;
  for (const auto& s : k->params) size = std::max<size_t>(size, s.offset + s.size);
  std::vector<uint8_t> blob(size);
  for (size_t i = 0; i < k->params.size(); ++i) {
    if (p->kernelParams == nullptr || p->kernelParams[i] == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(blob.data() + k->params[i].offset, p->kernelParams[i], k->params[i].size);
  }
  n->func = f;
  unsigned dims[6] = {p->gridDimX,  p->gridDimY,  p->gridDimZ,
                      p->blockDimX, p->blockDimY, p->blockDimZ};
  std::memcpy(n->dims, dims, sizeof(dims));
  n->shmem = p->sharedMemBytes;
  n->params = std::move(blob);
  return CUDA_SUCCESS;
}
CUresult simGraphAddKernelNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                               const CUDA_KERNEL_NODE_PARAMS* p) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_KERNEL,
                 [&](SimNode* n) { return FillKernel(n, p); });
}
// The node behind `node` of type `type`: of the graph, or of the exec's copy.
SimNode* NodeOf(CUgraphExec exec, CUgraphNode node, CUgraphNodeType type) {
  SimNode* n = AsNode(node);
  if (n == nullptr) return nullptr;
  if (exec != nullptr) {
    SimExec* e = AsExec(exec);
    if (e == nullptr) return nullptr;
    auto it = e->graph->from.find(n);
    if (it == e->graph->from.end()) return nullptr;
    n = it->second;
  }
  return n->type == type ? n : nullptr;
}
// GetParams/SetParams of the node types whose parameters are one SimNode field
// (kField), checked by check(p) before a set; `e` null: the graph's node.
template <CUgraphNodeType kType, auto kField, typename P>
CUresult GetNodeParams(CUgraphNode node, P* p) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, kType);
  if (n == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *p = n->*kField;
  return CUDA_SUCCESS;
}
template <CUgraphNodeType kType, auto kField, typename P, typename Check>
CUresult SetNodeParams(CUgraphExec e, CUgraphNode node, const P* p, Check check) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(e, node, kType);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = check(p);
  if (rc == CUDA_SUCCESS) n->*kField = *p;
  return rc;
}
CUresult simGraphKernelNodeSetParams(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS* p) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, CU_GRAPH_NODE_TYPE_KERNEL);
  return n == nullptr ? CUDA_ERROR_INVALID_VALUE : FillKernel(n, p);
}
CUresult simGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode node,
                                         const CUDA_KERNEL_NODE_PARAMS* p) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(e, node, CU_GRAPH_NODE_TYPE_KERNEL);
  return n == nullptr ? CUDA_ERROR_INVALID_VALUE : FillKernel(n, p);
}

CUresult CheckMemset(const CUDA_MEMSET_NODE_PARAMS* p) {
  if (p == nullptr || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) ||
      p->width == 0 || p->height == 0)
    return CUDA_ERROR_INVALID_VALUE;
  size_t row = p->width * p->elementSize;
  size_t pitch = p->height > 1 ? p->pitch : row;
  if (pitch < row || !Valid(p->dst, pitch * (p->height - 1) + row)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult simGraphAddMemsetNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                               const CUDA_MEMSET_NODE_PARAMS* p, CUcontext) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_MEMSET, [&](SimNode* n) {
    CUresult rc = CheckMemset(p);
    if (rc == CUDA_SUCCESS) n->memset = *p;
    return rc;
  });
}
CUresult simGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS* p) {
  return GetNodeParams<CU_GRAPH_NODE_TYPE_MEMSET, &SimNode::memset>(node, p);
}
CUresult SetMemset(CUgraphExec e, CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* p) {
  return SetNodeParams<CU_GRAPH_NODE_TYPE_MEMSET, &SimNode::memset>(e, node, p, CheckMemset);
}
CUresult simGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* p) {
  return SetMemset(nullptr, node, p);
}
CUresult simGraphExecMemsetNodeSetParams(CUgraphExec e, CUgraphNode node,
                                         const CUDA_MEMSET_NODE_PARAMS* p, CUcontext) {
  return SetMemset(e, node, p);
}

CUresult CheckHost(const CUDA_HOST_NODE_PARAMS* p) {
  return p == nullptr || p->fn == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
CUresult simGraphAddHostNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                             const CUDA_HOST_NODE_PARAMS* p) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_HOST, [&](SimNode* n) {
    CUresult rc = CheckHost(p);
    if (rc == CUDA_SUCCESS) n->host = *p;
    return rc;
  });
}
CUresult simGraphHostNodeGetParams(CUgraphNode node, CUDA_HOST_NODE_PARAMS* p) {
  return GetNodeParams<CU_GRAPH_NODE_TYPE_HOST, &SimNode::host>(node, p);
}
CUresult simGraphHostNodeSetParams(CUgraphNode node, const CUDA_HOST_NODE_PARAMS* p) {
  return SetNodeParams<CU_GRAPH_NODE_TYPE_HOST, &SimNode::host>(nullptr, node, p, CheckHost);
}

// A copy node's host sides must be this process's memory (the session's
// mirrors or shared buffers); device sides must be valid when it runs.
CUresult CheckCopy(const CUDA_MEMCPY3D* p) {
  if (p == nullptr || p->WidthInBytes == 0 || p->Height == 0 || p->Depth == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (p->srcMemoryType == CU_MEMORYTYPE_ARRAY || p->dstMemoryType == CU_MEMORYTYPE_ARRAY)
    return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}
CUresult simGraphAddMemcpyNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                               const CUDA_MEMCPY3D* p, CUcontext) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_MEMCPY, [&](SimNode* n) {
    CUresult rc = CheckCopy(p);
    if (rc == CUDA_SUCCESS) n->copy = *p;
    return rc;
  });
}
CUresult simGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D* p) {
  return GetNodeParams<CU_GRAPH_NODE_TYPE_MEMCPY, &SimNode::copy>(node, p);
}
CUresult SetCopy(CUgraphExec e, CUgraphNode node, const CUDA_MEMCPY3D* p) {
  return SetNodeParams<CU_GRAPH_NODE_TYPE_MEMCPY, &SimNode::copy>(e, node, p, CheckCopy);
}
CUresult simGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D* p) {
  return SetCopy(nullptr, node, p);
}
CUresult simGraphExecMemcpyNodeSetParams(CUgraphExec e, CUgraphNode node, const CUDA_MEMCPY3D* p,
                                         CUcontext) {
  return SetCopy(e, node, p);
}

bool HasCondOrAlloc(const SimGraph& g) {
  for (const auto& n : g.nodes)
    if (n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL || n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
        n->type == CU_GRAPH_NODE_TYPE_MEM_FREE || (n->child && HasCondOrAlloc(*n->child)))
      return true;
  return false;
}
CUresult simGraphAddChildGraphNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                                   CUgraph child) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_GRAPH, [&](SimNode* n) {
    SimGraph* c = AsGraph(child);
    if (c == nullptr || HasCondOrAlloc(*c)) return CUDA_ERROR_INVALID_VALUE;
    n->child = CopyGraph(*c, nullptr);
    n->child->from.clear();
    return CUDA_SUCCESS;
  });
}
CUresult simGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph* out) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, CU_GRAPH_NODE_TYPE_GRAPH);
  if (n == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraph>(n->child.get());
  return CUDA_SUCCESS;
}
// Same shape: the same node types in the same order, recursively.
bool SameShape(const SimGraph& a, const SimGraph& b) {
  if (a.nodes.size() != b.nodes.size()) return false;
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const SimNode &x = *a.nodes[i], &y = *b.nodes[i];
    if (x.type != y.type || x.bodies.size() != y.bodies.size() ||
        (x.child == nullptr) != (y.child == nullptr))
      return false;
    if (x.child && !SameShape(*x.child, *y.child)) return false;
    for (size_t j = 0; j < x.bodies.size(); ++j)
      if (!SameShape(*x.bodies[j], *y.bodies[j])) return false;
  }
  return true;
}
// Copies the parameters of `src` into `dst` (same shape), recursively.
void CopyParams(SimGraph& dst, const SimGraph& src) {
  for (size_t i = 0; i < dst.nodes.size(); ++i) {
    SimNode& d = *dst.nodes[i];
    const SimNode& s = *src.nodes[i];
    d.func = s.func;
    std::memcpy(d.dims, s.dims, sizeof(d.dims));
    d.shmem = s.shmem;
    d.params = s.params;
    d.copy = s.copy;
    d.memset = s.memset;
    d.host = s.host;
    d.event = s.event;
    if (d.type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) d.dptr = s.dptr;
    d.cond = s.cond;
    if (d.child) CopyParams(*d.child, *s.child);
    for (size_t j = 0; j < d.bodies.size(); ++j) CopyParams(*d.bodies[j], *s.bodies[j]);
  }
}
CUresult simGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode node, CUgraph child) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(e, node, CU_GRAPH_NODE_TYPE_GRAPH);
  SimGraph* c = AsGraph(child);
  if (n == nullptr || c == nullptr || !SameShape(*n->child, *c)) return CUDA_ERROR_INVALID_VALUE;
  CopyParams(*n->child, *c);
  return CUDA_SUCCESS;
}
CUresult simGraphAddEmptyNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_EMPTY, [](SimNode*) { return CUDA_SUCCESS; });
}
CUresult simGraphAddEventRecordNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                                    CUevent ev) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_EVENT_RECORD, [&](SimNode* n) {
    if (ev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    n->event = ev;
    return CUDA_SUCCESS;
  });
}
CUresult simGraphAddEventWaitNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                                  CUevent ev) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_WAIT_EVENT, [&](SimNode* n) {
    if (ev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    n->event = ev;
    return CUDA_SUCCESS;
  });
}
CUresult EventOf(CUgraphNode node, CUgraphNodeType type, CUevent* out) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, type);
  if (n == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = n->event;
  return CUDA_SUCCESS;
}
CUresult simGraphEventRecordNodeGetEvent(CUgraphNode node, CUevent* out) {
  return EventOf(node, CU_GRAPH_NODE_TYPE_EVENT_RECORD, out);
}
CUresult simGraphEventWaitNodeGetEvent(CUgraphNode node, CUevent* out) {
  return EventOf(node, CU_GRAPH_NODE_TYPE_WAIT_EVENT, out);
}

// --- stream capture (see the top of this file)
std::atomic<uint64_t> g_capture_ids{0};
SimStream* CapturingStream(CUstream s) {
  SimStream* st = AsStream(s);
  return st != nullptr && st->capture != nullptr ? st : nullptr;
}
// Adds a node after the capture's last one.
template <typename Fill>
CUresult CaptureNode(SimStream* st, CUgraphNodeType type, Fill&& fill) {
  CUgraphNode node = nullptr;
  const std::vector<CUgraphNode>& deps = st->capture_deps;
  CUresult rc =
      AddNode(&node, reinterpret_cast<CUgraph>(st->capture), deps.empty() ? nullptr : deps.data(),
              deps.size(), type, std::forward<Fill>(fill));
  if (rc == CUDA_SUCCESS) st->capture_deps.assign(1, node);
  return rc;
}
CUresult CaptureCopy(SimStream* st, const CUDA_MEMCPY3D& c) {
  return CaptureNode(st, CU_GRAPH_NODE_TYPE_MEMCPY, [&](SimNode* n) {
    CUresult rc = CheckCopy(&c);
    if (rc == CUDA_SUCCESS) n->copy = c;
    return rc;
  });
}
CUresult CaptureMemset(SimStream* st, const CUDA_MEMSET_NODE_PARAMS& m) {
  return CaptureNode(st, CU_GRAPH_NODE_TYPE_MEMSET, [&](SimNode* n) {
    CUresult rc = CheckMemset(&m);
    if (rc == CUDA_SUCCESS) n->memset = m;
    return rc;
  });
}
bool KernelNodeAttribute(CUkernelNodeAttrID attr);
CUresult CaptureKernel(SimStream* st, const CUlaunchConfig* cfg, CUfunction f, const uint8_t* blob,
                       size_t size) {
  return CaptureNode(st, CU_GRAPH_NODE_TYPE_KERNEL, [&](SimNode* n) {
    n->func = f;
    unsigned dims[6] = {cfg->gridDimX,  cfg->gridDimY,  cfg->gridDimZ,
                        cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ};
    std::memcpy(n->dims, dims, sizeof(dims));
    n->shmem = cfg->sharedMemBytes;
    n->params.assign(blob, blob + size);
    for (unsigned i = 0; i < cfg->numAttrs; ++i)  // the launch's attributes a node keeps
      if (KernelNodeAttribute(static_cast<CUkernelNodeAttrID>(cfg->attrs[i].id)))
        n->attrs[cfg->attrs[i].id] = cfg->attrs[i].value;
    return CUDA_SUCCESS;
  });
}
CUresult CaptureHost(SimStream* st, CUhostFn fn, void* data) {
  return CaptureNode(st, CU_GRAPH_NODE_TYPE_HOST, [&](SimNode* n) {
    n->host.fn = fn;
    n->host.userData = data;
    return CUDA_SUCCESS;
  });
}
CUresult CaptureEvent(SimStream* st, CUevent e, bool record) {
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return CaptureNode(st, record ? CU_GRAPH_NODE_TYPE_EVENT_RECORD : CU_GRAPH_NODE_TYPE_WAIT_EVENT,
                     [&](SimNode* n) {
                       n->event = e;
                       return CUDA_SUCCESS;
                     });
}
CUresult simStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  SimStream* st = AsStream(s);
  if (mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  if (st == nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream
  if (st->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  auto* g = new SimGraph;
  std::lock_guard<std::mutex> lock(g_graph_mu);
  g_graphs.insert(g);
  st->capture = g;
  st->capture_deps.clear();
  st->capture_id = ++g_capture_ids;
  return CUDA_SUCCESS;
}
// Captures into the app's graph `g` (a conditional node's body, say), after `deps`.
CUresult simStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode* deps,
                                      const CUgraphEdgeData* /*edges*/, size_t n,
                                      CUstreamCaptureMode mode) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  SimStream* st = AsStream(s);
  if (mode > CU_STREAM_CAPTURE_MODE_RELAXED || (n > 0 && deps == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  if (st == nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream
  if (st->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  auto* graph = reinterpret_cast<SimGraph*>(g);
  std::lock_guard<std::mutex> lock(g_graph_mu);
  if (g_graphs.count(graph) == 0) return CUDA_ERROR_INVALID_VALUE;
  st->capture = graph;
  st->capture_deps.assign(deps, deps + n);
  st->capture_id = ++g_capture_ids;
  return CUDA_SUCCESS;
}
// CU_STREAM_ADD_CAPTURE_DEPENDENCIES adds to what the next node depends on,
// CU_STREAM_SET_CAPTURE_DEPENDENCIES replaces it.
CUresult simStreamUpdateCaptureDependencies(CUstream s, CUgraphNode* deps,
                                            const CUgraphEdgeData* /*edges*/, size_t n,
                                            unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (flags > CU_STREAM_SET_CAPTURE_DEPENDENCIES || (n > 0 && deps == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  SimStream* st = CapturingStream(s);
  if (st == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) st->capture_deps.clear();
  for (size_t i = 0; i < n; ++i)
    if (std::find(st->capture_deps.begin(), st->capture_deps.end(), deps[i]) ==
        st->capture_deps.end())
      st->capture_deps.push_back(deps[i]);
  return CUDA_SUCCESS;
}
CUresult simStreamEndCapture(CUstream s, CUgraph* out) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  SimStream* st = CapturingStream(s);
  if (st == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  *out = reinterpret_cast<CUgraph>(st->capture);
  st->capture = nullptr;
  st->capture_deps.clear();
  return CUDA_SUCCESS;
}

CUresult simGraphAddMemAllocNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                                 CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_MEM_ALLOC, [&](SimNode* n) {
    if (p == nullptr || p->bytesize == 0 ||
        p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return CUDA_ERROR_INVALID_VALUE;
    if (p->poolProps.location.id != 0) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = Alloc(&n->dptr, p->bytesize);
    if (rc != CUDA_SUCCESS) return rc;
    n->bytes = p->bytesize;
    n->owns_alloc = true;
    g_graph_allocs[n->dptr] = n->bytes;
    uint64_t used = 0;
    for (auto& [ptr, bytes] : g_graph_allocs) used += bytes;
    g_graph_mem_high = std::max(g_graph_mem_high, used);
    p->dptr = n->dptr;
    return CUDA_SUCCESS;
  });
}
CUresult simGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
  if (n == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *p = CUDA_MEM_ALLOC_NODE_PARAMS{};
  p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->bytesize = n->bytes;
  p->dptr = n->dptr;
  return CUDA_SUCCESS;
}
// As the driver: only memory a graph's allocation node made, freed once.
CUresult simGraphAddMemFreeNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t nd,
                                CUdeviceptr dptr) {
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_MEM_FREE, [&](SimNode* n) {
    if (g_graph_allocs.count(dptr) == 0) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& other : n->owner->nodes)
      if (other->type == CU_GRAPH_NODE_TYPE_MEM_FREE && other->dptr == dptr)
        return CUDA_ERROR_INVALID_VALUE;
    n->dptr = dptr;
    return CUDA_SUCCESS;
  });
}
CUresult simGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr* out) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, CU_GRAPH_NODE_TYPE_MEM_FREE);
  if (n == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = n->dptr;
  return CUDA_SUCCESS;
}
CUresult simDeviceGetGraphMemAttribute(CUdevice d, CUgraphMem_attribute attr, void* value) {
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_graph_mu);
  uint64_t used = 0;
  for (auto& [ptr, bytes] : g_graph_allocs) used += bytes;
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = used;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = g_graph_mem_high;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}
CUresult simDeviceSetGraphMemAttribute(CUdevice d, CUgraphMem_attribute attr, void* value) {
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr || *static_cast<cuuint64_t*>(value) != 0 ||
      (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH))
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_graph_mu);
  g_graph_mem_high = 0;
  for (auto& [ptr, bytes] : g_graph_allocs) g_graph_mem_high += bytes;
  return CUDA_SUCCESS;
}
CUresult simDeviceGraphMemTrim(CUdevice d) {
  return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult simGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph graph, CUcontext,
                                         unsigned default_value, unsigned flags) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  if (out == nullptr || AsGraph(graph) == nullptr || (flags & ~CU_GRAPH_COND_ASSIGN_DEFAULT) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  auto* c = new SimCond;  // lives as long as the process, like the sim's descriptors
  c->default_value = default_value;
  c->flags = flags;
  c->value = default_value;
  g_conds.insert(c);
  *out = reinterpret_cast<uintptr_t>(c);
  return CUDA_SUCCESS;
}
// cuGraphAddNode_v2: conditional nodes (the only kind served only here) and
// the other kinds through their own entry points.
CUresult simGraphAddNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps,
                         const CUgraphEdgeData* edges, size_t nd, CUgraphNodeParams* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (edges != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL) return CUDA_ERROR_NOT_SUPPORTED;
  CUDA_CONDITIONAL_NODE_PARAMS& c = p->conditional;
  return AddNode(out, g, deps, nd, CU_GRAPH_NODE_TYPE_CONDITIONAL, [&](SimNode* n) {
    auto* cond = reinterpret_cast<SimCond*>(static_cast<uintptr_t>(c.handle));
    bool size_ok = c.type == CU_GRAPH_COND_TYPE_WHILE    ? c.size == 1
                   : c.type == CU_GRAPH_COND_TYPE_IF     ? c.size == 1 || c.size == 2
                   : c.type == CU_GRAPH_COND_TYPE_SWITCH ? c.size > 0 && c.size <= 4096
                                                         : false;
    if (g_conds.count(cond) == 0 || !size_ok) return CUDA_ERROR_INVALID_VALUE;
    n->cond = cond;
    n->cond_type = c.type;
    for (unsigned i = 0; i < c.size; ++i) {
      auto body = std::make_unique<SimGraph>();
      g_graphs.insert(body.get());
      n->body_handles.push_back(reinterpret_cast<CUgraph>(body.get()));
      n->bodies.push_back(std::move(body));
    }
    c.phGraph_out = n->body_handles.data();  // the node's own array, as the driver's
    return CUDA_SUCCESS;
  });
}

CUresult simGraphClone(CUgraph* out, CUgraph graph) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = AsGraph(graph);
  if (out == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraph>(CopyGraph(*g, nullptr).release());
  return CUDA_SUCCESS;
}
CUresult simGraphNodeFindInClone(CUgraphNode* out, CUgraphNode node, CUgraph clone) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* c = AsGraph(clone);
  SimNode* n = AsNode(node);
  if (out == nullptr || c == nullptr || n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = c->from.find(n);
  if (it == c->from.end()) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraphNode>(it->second);
  return CUDA_SUCCESS;
}
CUresult simGraphInstantiate(CUgraphExec* out, CUgraph graph, unsigned long long flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = AsGraph(graph);
  if (out == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* e = new SimExec;
  e->graph = CopyGraph(*g, nullptr);
  e->flags = flags;
  g_execs.insert(e);
  *out = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}
CUresult simGraphExecDestroy(CUgraphExec exec) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimExec* e = AsExec(exec);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  g_execs.erase(e);
  ForgetNodes(e->graph.get());
  delete e;
  return CUDA_SUCCESS;
}
CUresult simGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo* info) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimExec* e = AsExec(exec);
  SimGraph* g = AsGraph(graph);
  if (e == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (info != nullptr) *info = CUgraphExecUpdateResultInfo{};
  if (!SameShape(*e->graph, *g)) {
    if (info != nullptr) info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  CopyParams(*e->graph, *g);
  if (info != nullptr) info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return CUDA_SUCCESS;
}

// `flyt_sim_affine(const unsigned* in, unsigned* out, unsigned long long n,
// unsigned mul, unsigned add)`: out[i] = in[i] * mul + add for i < n (in may be
// out), on any memory a kernel may reach: device memory, and pinned host
// memory mapped for the GPU (tests/e2e/programs/mapped_host.cu).
bool SimAffine(const std::string& name, const std::vector<sim::ParamSlot>& slots,
               const uint8_t* blob) {
  if (name.find("flyt_sim_affine") == std::string::npos) return false;
  const size_t want[] = {8, 8, 8, 4, 4};
  if (slots.size() != 5) return true;
  for (size_t i = 0; i < 5; ++i)
    if (slots[i].size != want[i]) return true;
  uint64_t in = 0, out = 0, n = 0;
  uint32_t mul = 0, add = 0;
  std::memcpy(&in, blob + slots[0].offset, 8);
  std::memcpy(&out, blob + slots[1].offset, 8);
  std::memcpy(&n, blob + slots[2].offset, 8);
  std::memcpy(&mul, blob + slots[3].offset, 4);
  std::memcpy(&add, blob + slots[4].offset, 4);
  if (n == 0 || n > (uint64_t{1} << 40) || !Valid(in, n * 4) || !Valid(out, n * 4)) {
    if (n != 0 && !g_faulted.exchange(true))
      FLYT_WARN("sim: flyt_sim_affine reaches memory a kernel may not (illegal address)");
    return true;
  }
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    std::memcpy(&v, reinterpret_cast<const uint8_t*>(in) + i * 4, 4);
    v = v * mul + add;
    std::memcpy(reinterpret_cast<uint8_t*>(out) + i * 4, &v, 4);
  }
  return true;
}

// Kernels the sim models (the e2e programs' kernels of these names do the
// same on a GPU): `flyt_sim_set_conditional(handle, unsigned value)` sets a
// conditional node's value; `flyt_sim_countdown(handle, int* c)` does
// c[0] -= 1, c[1] += 1 and sets the value to (c[0] > 0); flyt_sim_affine (above).
void SimKernelActions(const std::string& name, const std::vector<sim::ParamSlot>& slots,
                      const uint8_t* blob) {
  if (SimAffine(name, slots, blob)) return;
  bool set = name.find("flyt_sim_set_conditional") != std::string::npos;
  bool countdown = name.find("flyt_sim_countdown") != std::string::npos;
  if ((!set && !countdown) || slots.size() != 2 || slots[0].size != 8) return;
  uint64_t handle = 0;
  std::memcpy(&handle, blob + slots[0].offset, 8);
  auto* cond = reinterpret_cast<SimCond*>(static_cast<uintptr_t>(handle));
  unsigned value = 0;
  if (set && slots[1].size == 4) {
    std::memcpy(&value, blob + slots[1].offset, 4);
  } else if (countdown && slots[1].size == 8) {
    uint64_t p = 0;
    std::memcpy(&p, blob + slots[1].offset, 8);
    if (!Valid(p, 2 * sizeof(int))) return;
    int* counter = reinterpret_cast<int*>(p);
    counter[0] -= 1;
    counter[1] += 1;
    value = counter[0] > 0 ? 1 : 0;
  } else {
    return;
  }
  std::lock_guard<std::mutex> lock(g_graph_mu);
  if (g_conds.count(cond)) cond->value = value;
}

// --- Graph topology: edges, roots, adding and removing edges and nodes.
bool EdgeDataSet(const CUgraphEdgeData& d) {
  static const CUgraphEdgeData zero{};
  return std::memcmp(&d, &zero, sizeof(d)) != 0;
}
bool HasAllocNodes(const SimGraph& g) {
  for (const auto& n : g.nodes)
    if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || n->type == CU_GRAPH_NODE_TYPE_MEM_FREE)
      return true;
  return false;
}
// Puts g's nodes back in a topological order (stable); false on a cycle.
bool Reorder(SimGraph* g) {
  std::vector<std::unique_ptr<SimNode>> done;
  std::set<const SimNode*> placed;
  while (!g->nodes.empty()) {
    auto it = std::find_if(g->nodes.begin(), g->nodes.end(), [&](const auto& n) {
      return std::all_of(n->deps.begin(), n->deps.end(),
                         [&](const SimNode* d) { return placed.count(d) != 0; });
    });
    if (it == g->nodes.end()) {  // a cycle: leave the rest as it was
      for (auto& n : g->nodes) done.push_back(std::move(n));
      g->nodes = std::move(done);
      return false;
    }
    placed.insert(it->get());
    done.push_back(std::move(*it));
    g->nodes.erase(it);
  }
  g->nodes = std::move(done);
  return true;
}
// Writes up to *count entries of `list` (node, data) to out/data, NULLs past the end,
// and the number written (or, without `out`, the total) to *count.
CUresult ListOut(const std::vector<std::pair<SimNode*, CUgraphEdgeData>>& list, CUgraphNode* out,
                 CUgraphEdgeData* data, size_t* count) {
  if (count == nullptr || (data != nullptr && out == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (out == nullptr) {
    *count = list.size();
    return CUDA_SUCCESS;
  }
  bool lossy = false;
  for (size_t i = 0; i < *count; ++i) {
    out[i] = i < list.size() ? reinterpret_cast<CUgraphNode>(list[i].first) : nullptr;
    if (data != nullptr) data[i] = i < list.size() ? list[i].second : CUgraphEdgeData{};
    lossy = lossy || (i < list.size() && data == nullptr && EdgeDataSet(list[i].second));
  }
  *count = std::min(*count, list.size());
  return lossy ? CUDA_ERROR_LOSSY_QUERY : CUDA_SUCCESS;
}
// A DOT file of the graph: one line per node (its type), one per edge. The real
// driver's file says more (with flags, the nodes' parameters); tools read it as DOT.
CUresult simGraphDebugDotPrint(CUgraph graph, const char* path, unsigned /*flags*/) {
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::string dot = "digraph dot {\n";
  {
    std::lock_guard<std::mutex> lock(g_graph_mu);
    SimGraph* g = AsGraph(graph);
    if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::map<const SimNode*, size_t> index;
    for (const auto& n : g->nodes) index[n.get()] = index.size();
    for (const auto& n : g->nodes)
      dot += "  node" + std::to_string(index[n.get()]) + " [label=\"type " +
             std::to_string(static_cast<int>(n->type)) + "\"];\n";
    for (const auto& n : g->nodes)
      for (const SimNode* d : n->deps)
        dot += "  node" + std::to_string(index[d]) + " -> node" + std::to_string(index[n.get()]) +
               ";\n";
  }
  dot += "}\n";
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return CUDA_ERROR_OPERATING_SYSTEM;
  const bool written = std::fwrite(dot.data(), 1, dot.size(), f) == dot.size();
  return std::fclose(f) == 0 && written ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}
CUresult simGraphGetEdges(CUgraph graph, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
                          size_t* count) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = AsGraph(graph);
  if (g == nullptr || count == nullptr || (from == nullptr) != (to == nullptr) ||
      (data != nullptr && from == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::pair<SimNode*, CUgraphEdgeData>> froms, tos;
  for (const auto& n : g->nodes)
    for (size_t i = 0; i < n->deps.size(); ++i) {
      froms.emplace_back(n->deps[i], n->dep_data[i]);
      tos.emplace_back(n.get(), n->dep_data[i]);
    }
  if (from != nullptr) {
    size_t c = *count;
    CUresult rc = ListOut(tos, to, nullptr, &c);
    if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_LOSSY_QUERY) return rc;
  }
  return ListOut(froms, from, data, count);
}
CUresult simGraphGetRootNodes(CUgraph graph, CUgraphNode* out, size_t* count) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = AsGraph(graph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::pair<SimNode*, CUgraphEdgeData>> roots;
  for (const auto& n : g->nodes)
    if (n->deps.empty()) roots.emplace_back(n.get(), CUgraphEdgeData{});
  return ListOut(roots, out, nullptr, count);
}
CUresult NodeNeighbours(CUgraphNode node, bool dependents, CUgraphNode* out, CUgraphEdgeData* data,
                        size_t* count) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = AsNode(node);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::pair<SimNode*, CUgraphEdgeData>> list;
  if (!dependents) {
    for (size_t i = 0; i < n->deps.size(); ++i) list.emplace_back(n->deps[i], n->dep_data[i]);
  } else {
    for (const auto& m : n->owner->nodes)
      for (size_t i = 0; i < m->deps.size(); ++i)
        if (m->deps[i] == n) list.emplace_back(m.get(), m->dep_data[i]);
  }
  return ListOut(list, out, data, count);
}
CUresult simGraphNodeGetDependencies(CUgraphNode node, CUgraphNode* out, CUgraphEdgeData* data,
                                     size_t* count) {
  return NodeNeighbours(node, false, out, data, count);
}
CUresult simGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode* out, CUgraphEdgeData* data,
                                       size_t* count) {
  return NodeNeighbours(node, true, out, data, count);
}
// Checks an edge list of `graph`; on success *g is the graph.
CUresult CheckEdges(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to, size_t n,
                    SimGraph** g) {
  *g = AsGraph(graph);
  if (*g == nullptr || (n > 0 && (from == nullptr || to == nullptr)))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; ++i) {
    SimNode* a = AsNode(from[i]);
    SimNode* b = AsNode(to[i]);
    if (a == nullptr || b == nullptr || a->owner != *g || b->owner != *g || a == b)
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult simGraphAddDependencies(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                 const CUgraphEdgeData* data, size_t n) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = nullptr;
  if (CUresult rc = CheckEdges(graph, from, to, n, &g); rc != CUDA_SUCCESS) return rc;
  for (size_t i = 0; i < n; ++i) {  // an edge that exists (or twice in the list) is refused
    SimNode* b = AsNode(to[i]);
    if (std::count(b->deps.begin(), b->deps.end(), AsNode(from[i])) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    for (size_t j = 0; j < i; ++j)
      if (from[j] == from[i] && to[j] == to[i]) return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < n; ++i) {
    SimNode* b = AsNode(to[i]);
    b->deps.push_back(AsNode(from[i]));
    b->dep_data.push_back(data != nullptr ? data[i] : CUgraphEdgeData{});
  }
  if (!Reorder(g)) {  // a cycle: undo
    for (size_t i = n; i-- > 0;) {
      SimNode* b = AsNode(to[i]);
      b->deps.pop_back();
      b->dep_data.pop_back();
    }
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult simGraphRemoveDependencies(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                    const CUgraphEdgeData* data, size_t n) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimGraph* g = nullptr;
  if (CUresult rc = CheckEdges(graph, from, to, n, &g); rc != CUDA_SUCCESS) return rc;
  if (n > 0 && HasAllocNodes(*g)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::pair<SimNode*, size_t>> found;
  for (size_t i = 0; i < n; ++i) {
    SimNode* b = AsNode(to[i]);
    const CUgraphEdgeData want = data != nullptr ? data[i] : CUgraphEdgeData{};
    size_t k = 0;
    while (k < b->deps.size() && (b->deps[k] != AsNode(from[i]) ||
                                  std::memcmp(&b->dep_data[k], &want, sizeof(want)) != 0))
      ++k;
    if (k == b->deps.size()) return CUDA_ERROR_INVALID_VALUE;
    found.emplace_back(b, k);
  }
  std::sort(found.begin(), found.end(),
            [](const auto& x, const auto& y) { return x.second > y.second; });
  for (const auto& [b, k] : found) {
    b->deps.erase(b->deps.begin() + static_cast<std::ptrdiff_t>(k));
    b->dep_data.erase(b->dep_data.begin() + static_cast<std::ptrdiff_t>(k));
  }
  return CUDA_SUCCESS;
}
CUresult simGraphDestroyNode(CUgraphNode node) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = AsNode(node);
  if (n == nullptr || HasAllocNodes(*n->owner)) return CUDA_ERROR_INVALID_VALUE;
  SimGraph* g = n->owner;
  for (auto& m : g->nodes)
    for (size_t k = m->deps.size(); k-- > 0;)
      if (m->deps[k] == n) {
        m->deps.erase(m->deps.begin() + static_cast<std::ptrdiff_t>(k));
        m->dep_data.erase(m->dep_data.begin() + static_cast<std::ptrdiff_t>(k));
      }
  auto it =
      std::find_if(g->nodes.begin(), g->nodes.end(), [n](const auto& p) { return p.get() == n; });
  g_nodes.erase(n);
  if (n->child) ForgetNodes(n->child.get());
  for (auto& b : n->bodies) ForgetNodes(b.get());
  g->nodes.erase(it);
  return CUDA_SUCCESS;
}
// The executable graph's copy of `node` (a node of the graph it was instantiated from).
SimNode* ExecCopy(CUgraphExec exec, CUgraphNode node) {
  SimExec* e = AsExec(exec);
  SimNode* n = AsNode(node);
  if (e == nullptr || n == nullptr) return nullptr;
  auto it = e->graph->from.find(n);
  return it == e->graph->from.end() ? nullptr : it->second;
}
bool CanDisable(CUgraphNodeType t) {
  return t == CU_GRAPH_NODE_TYPE_KERNEL || t == CU_GRAPH_NODE_TYPE_MEMCPY ||
         t == CU_GRAPH_NODE_TYPE_MEMSET;
}
CUresult simGraphNodeSetEnabled(CUgraphExec exec, CUgraphNode node, unsigned enabled) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* c = ExecCopy(exec, node);
  if (c == nullptr || !CanDisable(c->type)) return CUDA_ERROR_INVALID_VALUE;
  c->enabled = enabled != 0;
  return CUDA_SUCCESS;
}
CUresult simGraphNodeGetEnabled(CUgraphExec exec, CUgraphNode node, unsigned* enabled) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* c = ExecCopy(exec, node);
  if (c == nullptr || enabled == nullptr || !CanDisable(c->type)) return CUDA_ERROR_INVALID_VALUE;
  *enabled = c->enabled ? 1 : 0;
  return CUDA_SUCCESS;
}

constexpr unsigned kSimMaxWhileIterations = 1u << 20;

// Runs a graph's nodes in order (g_graph_mu not held: host nodes call back).
CUresult RunGraph(const SimGraph& g, CUstream s) {
  for (const auto& n : g.nodes) {
    CUresult rc = CUDA_SUCCESS;
    if (!n->enabled) continue;  // cuGraphNodeSetEnabled(..., 0): skipped
    switch (n->type) {
      case CU_GRAPH_NODE_TYPE_KERNEL: {
        CUlaunchConfig cfg{};
        cfg.gridDimX = n->dims[0];
        cfg.gridDimY = n->dims[1];
        cfg.gridDimZ = n->dims[2];
        cfg.blockDimX = n->dims[3];
        cfg.blockDimY = n->dims[4];
        cfg.blockDimZ = n->dims[5];
        cfg.sharedMemBytes = n->shmem;
        cfg.hStream = s;
        size_t size = n->params.size();
        std::vector<uint8_t> blob = n->params;
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, blob.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                         &size, CU_LAUNCH_PARAM_END};
        rc = simLaunchKernelEx(&cfg, n->func, nullptr, extra);
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMCPY:
        rc = simMemcpy3D(&n->copy);
        break;
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        const CUDA_MEMSET_NODE_PARAMS& m = n->memset;
        size_t pitch = m.height > 1 ? m.pitch : m.width * m.elementSize;
        rc = m.elementSize == 1
                 ? Fill2D<uint8_t>(m.dst, pitch, static_cast<uint8_t>(m.value), m.width, m.height)
             : m.elementSize == 2
                 ? Fill2D<uint16_t>(m.dst, pitch, static_cast<uint16_t>(m.value), m.width, m.height)
                 : Fill2D<uint32_t>(m.dst, pitch, m.value, m.width, m.height);
        break;
      }
      case CU_GRAPH_NODE_TYPE_HOST:
        n->host.fn(n->host.userData);
        break;
      case CU_GRAPH_NODE_TYPE_GRAPH:
        rc = RunGraph(*n->child, s);
        break;
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        rc = simEventRecord(n->event, s);
        break;
      case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
        SimCond* c = n->cond;
        if (n->cond_type == CU_GRAPH_COND_TYPE_WHILE) {
          for (unsigned i = 0; rc == CUDA_SUCCESS && c->value != 0; ++i) {
            if (i == kSimMaxWhileIterations) return CUDA_ERROR_LAUNCH_TIMEOUT;
            rc = RunGraph(*n->bodies[0], s);
          }
        } else if (n->cond_type == CU_GRAPH_COND_TYPE_IF) {
          if (c->value != 0)
            rc = RunGraph(*n->bodies[0], s);
          else if (n->bodies.size() == 2)
            rc = RunGraph(*n->bodies[1], s);
        } else if (c->value < n->bodies.size()) {
          rc = RunGraph(*n->bodies[c->value], s);
        }
        break;
      }
      default:  // empty, event wait (all work here is synchronous), alloc, free
        break;
    }
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}
// Conditional handles with CU_GRAPH_COND_ASSIGN_DEFAULT start each launch at their default.
void ResetConds(const SimGraph& g) {
  for (const auto& n : g.nodes) {
    if (n->cond != nullptr && (n->cond->flags & CU_GRAPH_COND_ASSIGN_DEFAULT))
      n->cond->value = n->cond->default_value;
    if (n->child) ResetConds(*n->child);
    for (const auto& b : n->bodies) ResetConds(*b);
  }
}
CUresult simGraphLaunch(CUgraphExec exec, CUstream s) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (CUresult rc = CheckStreamContext(s); rc != CUDA_SUCCESS) return rc;
  SimExec* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_graph_mu);
    e = AsExec(exec);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    ResetConds(*e->graph);
  }
  // After the stream's earlier host functions, as in stream order.
  if (AsStream(s) != nullptr)
    WaitIdle(StreamOf(s)->work);
  else
    while (g_pending_host_funcs.load() > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  return RunGraph(*e->graph, s);
}
CUresult simGraphUpload(CUgraphExec exec, CUstream) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  return AsExec(exec) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// --- calls of session_driver_misc.cc and the kernel node queries
// Kernel node attributes: those a kernel node takes read back what was set
// (zero before); others are refused, as are nodes of other types.
bool KernelNodeAttribute(CUkernelNodeAttrID attr) {
  switch (attr) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return true;
    default:
      return false;
  }
}
CUresult simGraphKernelNodeGetAttribute(CUgraphNode node, CUkernelNodeAttrID attr,
                                        CUkernelNodeAttrValue* v) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, CU_GRAPH_NODE_TYPE_KERNEL);
  if (n == nullptr || v == nullptr || !KernelNodeAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
  std::memset(v, 0, sizeof(*v));
  auto it = n->attrs.find(attr);
  if (it != n->attrs.end()) *v = it->second;
  return CUDA_SUCCESS;
}
CUresult simGraphKernelNodeSetAttribute(CUgraphNode node, CUkernelNodeAttrID attr,
                                        const CUkernelNodeAttrValue* v) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, CU_GRAPH_NODE_TYPE_KERNEL);
  if (n == nullptr || v == nullptr || !KernelNodeAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
  if (attr == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && v->cooperative > 1)
    return CUDA_ERROR_INVALID_VALUE;
  n->attrs[attr] = *v;
  return CUDA_SUCCESS;
}
CUresult simGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* to = NodeOf(nullptr, dst, CU_GRAPH_NODE_TYPE_KERNEL);
  SimNode* from = NodeOf(nullptr, src, CU_GRAPH_NODE_TYPE_KERNEL);
  if (to == nullptr || from == nullptr) return CUDA_ERROR_INVALID_VALUE;
  to->attrs = from->attrs;
  return CUDA_SUCCESS;
}
// The node's parameters; kernelParams point into the node's own buffer.
CUresult simGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS* p) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(nullptr, node, CU_GRAPH_NODE_TYPE_KERNEL);
  if (n == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* k = reinterpret_cast<SimKernel*>(n->func);
  n->param_ptrs.clear();
  for (const auto& slot : k->params) n->param_ptrs.push_back(n->params.data() + slot.offset);
  *p = CUDA_KERNEL_NODE_PARAMS{};
  p->func = n->func;
  p->gridDimX = n->dims[0];
  p->gridDimY = n->dims[1];
  p->gridDimZ = n->dims[2];
  p->blockDimX = n->dims[3];
  p->blockDimY = n->dims[4];
  p->blockDimZ = n->dims[5];
  p->sharedMemBytes = n->shmem;
  p->kernelParams = n->param_ptrs.empty() ? nullptr : n->param_ptrs.data();
  return CUDA_SUCCESS;
}
CUresult simGraphExecHostNodeSetParams(CUgraphExec e, CUgraphNode node,
                                       const CUDA_HOST_NODE_PARAMS* p) {
  return SetNodeParams<CU_GRAPH_NODE_TYPE_HOST, &SimNode::host>(e, node, p, CheckHost);
}
CUresult SetEvent(CUgraphExec e, CUgraphNode node, CUgraphNodeType type, CUevent ev) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimNode* n = NodeOf(e, node, type);
  if (n == nullptr || ev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->event = ev;
  return CUDA_SUCCESS;
}
CUresult simGraphEventRecordNodeSetEvent(CUgraphNode node, CUevent ev) {
  return SetEvent(nullptr, node, CU_GRAPH_NODE_TYPE_EVENT_RECORD, ev);
}
CUresult simGraphEventWaitNodeSetEvent(CUgraphNode node, CUevent ev) {
  return SetEvent(nullptr, node, CU_GRAPH_NODE_TYPE_WAIT_EVENT, ev);
}
CUresult simGraphExecEventRecordNodeSetEvent(CUgraphExec e, CUgraphNode node, CUevent ev) {
  return e == nullptr ? CUDA_ERROR_INVALID_VALUE
                      : SetEvent(e, node, CU_GRAPH_NODE_TYPE_EVENT_RECORD, ev);
}
CUresult simGraphExecEventWaitNodeSetEvent(CUgraphExec e, CUgraphNode node, CUevent ev) {
  return e == nullptr ? CUDA_ERROR_INVALID_VALUE
                      : SetEvent(e, node, CU_GRAPH_NODE_TYPE_WAIT_EVENT, ev);
}
constexpr unsigned long long kInstantiateFlags =
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
CUresult simGraphInstantiateWithParams(CUgraphExec* out, CUgraph graph,
                                       CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  p->hErrNode_out = nullptr;
  p->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
  if ((p->flags & ~kInstantiateFlags) != 0 ||
      ((p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) != 0 &&
       (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0))
    return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = simGraphInstantiate(out, graph, p->flags);
  if (rc != CUDA_SUCCESS) return rc;
  std::lock_guard<std::mutex> lock(g_graph_mu);
  AsExec(*out)->flags =
      p->flags & ~static_cast<unsigned long long>(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
  p->result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
  return CUDA_SUCCESS;
}
CUresult simGraphExecGetFlags(CUgraphExec exec, cuuint64_t* flags) {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  SimExec* e = AsExec(exec);
  if (e == nullptr || flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = e->flags;
  return CUDA_SUCCESS;
}
// The sim's contexts are not limited to part of the GPU.
CUresult simCtxGetExecAffinity(CUexecAffinityParam* p, CUexecAffinityType type) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (p == nullptr || type != CU_EXEC_AFFINITY_TYPE_SM_COUNT) return CUDA_ERROR_INVALID_VALUE;
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  p->type = type;
  p->param.smCount.val = kSimSms;
  return CUDA_SUCCESS;
}
CUresult simCtxSetFlags(unsigned flags) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  const unsigned sched = flags & CU_CTX_SCHED_MASK;
  if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0 ||
      (sched != CU_CTX_SCHED_AUTO && sched != CU_CTX_SCHED_SPIN && sched != CU_CTX_SCHED_YIELD &&
       sched != CU_CTX_SCHED_BLOCKING_SYNC))
    return CUDA_ERROR_INVALID_VALUE;
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  auto it = g_sim->user_contexts.find(t_current);
  (it != g_sim->user_contexts.end() ? it->second : g_sim->primary_flags) = flags;
  return CUDA_SUCCESS;
}
// Host atomics over the sim's (PCIe-like) link: integer operations signed and
// unsigned on 32 and 64 bits, float operations on 32 and 64 bits.
CUresult simDeviceGetHostAtomicCapabilities(unsigned* caps, const CUatomicOperation* ops,
                                            unsigned count, CUdevice dev) {
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (caps == nullptr || ops == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i)
    if (ops[i] < 0 || ops[i] >= CU_ATOMIC_OPERATION_MAX) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    const bool fp = ops[i] >= CU_ATOMIC_OPERATION_FLOAT_ADD;
    caps[i] = CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64 |
              (fp ? 0u : CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED);
  }
  return CUDA_SUCCESS;
}
// Between two sim GPUs (a PCIe board): no peer atomics, as NATIVE_ATOMIC_SUPPORTED says.
CUresult simDeviceGetP2PAtomicCapabilities(unsigned* caps, const CUatomicOperation* ops,
                                           unsigned count, CUdevice src, CUdevice dst) {
  if (!ValidDevice(src) || !ValidDevice(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  if (caps == nullptr || ops == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i)
    if (ops[i] < 0 || ops[i] >= CU_ATOMIC_OPERATION_MAX) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) caps[i] = 0;
  return CUDA_SUCCESS;
}
CUresult simPointerSetAttribute(const void* value, CUpointer_attribute attr, CUdeviceptr ptr) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (value == nullptr || attr != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_sim->mu);
  return Within(g_sim->allocs, ptr, 1) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
// Hopper: 8 blocks per cluster portably, 16 with the non-portable opt-in.
CUresult simOccupancyMaxPotentialClusterSize(int* size, CUfunction f, const CUlaunchConfig* cfg) {
  if (Faulted()) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (size == nullptr || cfg == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int non_portable = 0;
  FuncGetAttribute(&non_portable, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, f);
  *size = non_portable ? 16 : 8;
  return CUDA_SUCCESS;
}
// The ABI before CUDA 11.7: the same operations, without memory barriers in a batch.
CUresult simStreamBatchMemOpV1(CUstream s, unsigned count, CUstreamBatchMemOpParams* ops,
                               unsigned flags) {
  for (unsigned i = 0; i < count && ops != nullptr; ++i)
    if (ops[i].operation == CU_STREAM_MEM_OP_BARRIER) return CUDA_ERROR_INVALID_VALUE;
  return simStreamBatchMemOp(s, count, ops, flags);
}

}  // namespace

int SimCurrentDevice() { return g_sim == nullptr ? 0 : CurrentDevice(); }

Status LoadSimDriver(const SimOptions& options, DriverApi* a) {
  static Sim sim;
  g_sim = &sim;
  kSimMemory = options.memory_bytes;
  sim.devices = std::clamp(options.devices, 1, kSimMaxDevices);
  sim.peer = options.peer;
  sim.tex_base = std::max<uint64_t>(options.texture_base, 1);
  if (!options.record_path.empty()) {
    sim.record = std::fopen(options.record_path.c_str(), "a");
    if (sim.record == nullptr)
      return Status::Error("cannot open sim record file " + options.record_path);
  }
  a->is_sim = true;
  a->cuInit = simInit;
  a->cuDriverGetVersion = simDriverGetVersion;
  a->cuDeviceGet = simDeviceGet;
  a->cuDeviceGetCount = simDeviceGetCount;
  a->cuDeviceGetName = simDeviceGetName;
  a->cuDeviceGetUuid_v2 = simDeviceGetUuid;
  a->cuDeviceTotalMem_v2 = simDeviceTotalMem;
  a->cuDeviceGetAttribute = simDeviceGetAttribute;
  a->cuDevicePrimaryCtxRetain = simPrimaryCtxRetain;
  a->cuDevicePrimaryCtxRelease_v2 = simPrimaryCtxRelease;
  a->cuDevicePrimaryCtxReset_v2 = simPrimaryCtxReset;
  a->cuCtxSetCurrent = simCtxSetCurrent;
  a->cuCtxCreate_v4 = simCtxCreate;
  a->cuCtxDestroy_v2 = simCtxDestroy;
  a->cuCtxGetFlags = simCtxGetFlags;
  a->cuCtxGetDevice = simCtxGetDevice;
  a->cuDeviceCanAccessPeer = simDeviceCanAccessPeer;
  a->cuDeviceGetP2PAttribute = simDeviceGetP2PAttribute;
  a->cuCtxEnablePeerAccess = simCtxEnablePeerAccess;
  a->cuCtxDisablePeerAccess = simCtxDisablePeerAccess;
  a->cuMemcpyPeer = simMemcpyPeer;
  a->cuMemcpyPeerAsync = simMemcpyPeerAsync;
  a->cuCtxSynchronize = simCtxSynchronize;
  a->cuCtxGetLimit = simCtxGetLimit;
  a->cuCtxSetLimit = simCtxSetLimit;
  a->cuCtxGetStreamPriorityRange = simCtxGetStreamPriorityRange;
  a->cuCtxRecordEvent = simCtxRecordEvent;
  a->cuCtxWaitEvent = simCtxWaitEvent;
  a->cuLibraryLoadData = simLibraryLoadData;
  a->cuModuleLoadData = simModuleLoadData;
  a->cuLibraryUnload = simLibraryUnload;
  a->cuModuleUnload = simModuleUnload;
  a->cuLibraryGetKernelCount = simLibraryGetKernelCount;
  a->cuModuleGetFunctionCount = simModuleGetFunctionCount;
  a->cuLibraryEnumerateKernels = simLibraryEnumerateKernels;
  a->cuModuleEnumerateFunctions = simModuleEnumerateFunctions;
  a->cuKernelGetName = simKernelGetName;
  a->cuFuncGetName = simFuncGetName;
  a->cuKernelGetParamInfo = simKernelGetParamInfo;
  a->cuFuncGetParamInfo = simFuncGetParamInfo;
  a->cuKernelGetFunction = simKernelGetFunction;
  a->cuLibraryGetGlobal = simLibraryGetGlobal;
  a->cuModuleGetGlobal_v2 = simModuleGetGlobal;
  a->cuFuncGetAttribute = simFuncGetAttribute;
  a->cuFuncSetAttribute = simFuncSetAttribute;
  a->cuKernelGetAttribute = simKernelGetAttribute;
  a->cuKernelSetAttribute = simKernelSetAttribute;
  a->cuOccupancyMaxActiveBlocksPerMultiprocessor = simOccupancy;
  a->cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags = simOccupancyFlags;
  a->cuOccupancyAvailableDynamicSMemPerBlock = simOccupancyAvailableSmem;
  a->cuOccupancyMaxActiveClusters = simMaxActiveClusters;
  a->cuLaunchKernelEx = simLaunchKernelEx;
  a->cuMemAlloc_v2 = simMemAlloc;
  a->cuMemAllocPitch_v2 = simMemAllocPitch;
  a->cuMemFree_v2 = simMemFree;
  a->cuMemAllocManaged = simMemAllocManaged;
  a->cuMemAdvise_v2 = simMemAdvise_v2;
  a->cuMemPrefetchAsync_v2 = simMemPrefetchAsync_v2;
  a->cuMemPrefetchAsync_v2_pt = simMemPrefetchAsync_v2;
  a->cuStreamAttachMemAsync = simStreamAttachMemAsync;
  a->cuStreamAttachMemAsync_pt = simStreamAttachMemAsync;
  a->cuMemRangeGetAttribute = simMemRangeGetAttribute;
  a->cuMemGetInfo_v2 = simMemGetInfo;
  a->cuMemGetAddressRange_v2 = simMemGetAddressRange;
  a->cuMemcpyHtoD_v2 = simHtoD;
  a->cuMemcpyHtoDAsync_v2 = simHtoDAsync;
  a->cuMemcpyDtoH_v2 = simDtoH;
  a->cuMemcpyDtoHAsync_v2 = simDtoHAsync;
  a->cuMemcpyDtoD_v2 = simDtoD;
  a->cuMemcpyDtoDAsync_v2 = simDtoDAsync;
  a->cuMemsetD8_v2 = simMemsetD8;
  a->cuMemsetD16_v2 = simMemsetD16;
  a->cuMemsetD32_v2 = simMemsetD32;
  a->cuMemsetD8Async = simMemsetD8Async;
  a->cuMemsetD16Async = simMemsetD16Async;
  a->cuMemsetD32Async = simMemsetD32Async;
  a->cuMemsetD2D8_v2 = simMemsetD2D8;
  a->cuMemsetD2D16_v2 = simMemsetD2D16;
  a->cuMemsetD2D32_v2 = simMemsetD2D32;
  a->cuMemsetD2D8Async = simMemsetD2D8Async;
  a->cuMemsetD2D16Async = simMemsetD2D16Async;
  a->cuMemsetD2D32Async = simMemsetD2D32Async;
  a->cuMemcpy3D_v2 = simMemcpy3D;
  a->cuMemcpy3DAsync_v2 = simMemcpy3DAsync;
  a->cuStreamCreate = simStreamCreate;
  a->cuStreamCreateWithPriority = simStreamCreateWithPriority;
  a->cuStreamDestroy_v2 = simStreamDestroy;
  a->cuStreamSynchronize = simStreamSynchronize;
  a->cuStreamQuery = simStreamQuery;
  a->cuLaunchHostFunc = simLaunchHostFunc;
  a->cuStreamWaitEvent = simStreamWaitEvent;
  a->cuStreamGetPriority = simStreamGetPriority;
  a->cuStreamSetAttribute = simStreamSetAttribute;
  a->cuStreamGetAttribute = simStreamGetAttribute;
  a->cuStreamGetCtx = simStreamGetCtx;
  a->cuStreamGetDevice = simStreamGetDevice;
  a->cuStreamCopyAttributes = simStreamCopyAttributes;
  a->cuStreamWriteValue32_v2 = simStreamWriteValue32;
  a->cuStreamWaitValue32_v2 = simStreamWaitValue32;
  a->cuStreamWriteValue64_v2 = simStreamWriteValue64;
  a->cuStreamWaitValue64_v2 = simStreamWaitValue64;
  a->cuStreamBatchMemOp_v2 = simStreamBatchMemOp;
  a->cuStreamGetFlags = simStreamGetFlags;
  a->cuStreamIsCapturing = simStreamIsCapturing;
  a->cuStreamBeginCapture_v2 = simStreamBeginCapture;
  a->cuStreamEndCapture = simStreamEndCapture;
  a->cuThreadExchangeStreamCaptureMode = simThreadExchangeStreamCaptureMode;
  a->cuStreamGetCaptureInfo_v3 = simStreamGetCaptureInfo;
  a->cuStreamBeginCaptureToGraph = simStreamBeginCaptureToGraph;
  a->cuStreamUpdateCaptureDependencies_v2 = simStreamUpdateCaptureDependencies;
  a->cuStreamGetId = simStreamGetId;
  a->cuEventCreate = simEventCreate;
  a->cuEventDestroy_v2 = simEventDestroy;
  a->cuEventRecord = simEventRecord;
  a->cuEventRecordWithFlags = simEventRecordWithFlags;
  a->cuEventSynchronize = simEventSynchronize;
  a->cuEventQuery = simEventQuery;
  a->cuEventElapsedTime_v2 = simEventElapsedTime;
  a->cuMemHostAlloc = simMemHostAlloc;
  a->cuMemHostRegister_v2 = simMemHostRegister;
  a->cuMemHostUnregister = simMemHostUnregister;
  a->cuMemHostGetDevicePointer_v2 = simMemHostGetDevicePointer;
  a->cuMemFreeHost = simMemFreeHost;
  a->cuArrayCreate_v2 = simArrayCreate;
  a->cuArray3DCreate_v2 = simArray3DCreate;
  a->cuArrayDestroy = simArrayDestroy;
  a->cuArrayGetDescriptor_v2 = simArrayGetDescriptor;
  a->cuArray3DGetDescriptor_v2 = simArray3DGetDescriptor;
  a->cuDeviceGetTexture1DLinearMaxWidth = simDeviceGetTexture1DLinearMaxWidth;
  a->cuTexObjectCreate = simTexObjectCreate;
  a->cuTexObjectDestroy = simTexObjectDestroy;
  a->cuTexObjectGetResourceDesc = simTexObjectGetResourceDesc;
  a->cuTexObjectGetTextureDesc = simTexObjectGetTextureDesc;
  a->cuTexObjectGetResourceViewDesc = simTexObjectGetResourceViewDesc;
  a->cuSurfObjectCreate = simSurfObjectCreate;
  a->cuSurfObjectDestroy = simSurfObjectDestroy;
  a->cuSurfObjectGetResourceDesc = simSurfObjectGetResourceDesc;
  a->cuMemAllocAsync = simMemAllocAsync;
  a->cuDeviceGetDefaultMemPool = simDeviceGetDefaultMemPool;
  a->cuDeviceGetMemPool = simDeviceGetMemPool;
  a->cuDeviceSetMemPool = simDeviceSetMemPool;
  a->cuMemPoolCreate = simMemPoolCreate;
  a->cuMemPoolDestroy = simMemPoolDestroy;
  a->cuMemPoolTrimTo = simMemPoolTrimTo;
  a->cuMemPoolSetAttribute = simMemPoolSetAttribute;
  a->cuMemPoolGetAttribute = simMemPoolGetAttribute;
  a->cuMemAllocFromPoolAsync = simMemAllocFromPoolAsync;
  a->cuMemFreeAsync = simMemFreeAsync;
  a->cuMemGetAllocationGranularity = simMemGetAllocationGranularity;
  a->cuMemAddressReserve = simMemAddressReserve;
  a->cuMemAddressFree = simMemAddressFree;
  a->cuMemCreate = simMemCreate;
  a->cuMemRelease = simMemRelease;
  a->cuMemMap = simMemMap;
  a->cuMemUnmap = simMemUnmap;
  a->cuMemSetAccess = simMemSetAccess;
  a->cuMemGetAccess = simMemGetAccess;
  a->cuMemGetAllocationPropertiesFromHandle = simMemGetAllocationPropertiesFromHandle;
  a->cuMemRetainAllocationHandle = simMemRetainAllocationHandle;
  a->cuMemExportToShareableHandle = simMemExportToShareableHandle;
  a->cuMemImportFromShareableHandle = simMemImportFromShareableHandle;
  a->cuIpcGetMemHandle = simIpcGetMemHandle;
  a->cuIpcOpenMemHandle_v2 = simIpcOpenMemHandle;
  a->cuIpcCloseMemHandle = simIpcCloseMemHandle;
  a->cuIpcGetEventHandle = simIpcGetEventHandle;
  a->cuIpcOpenEventHandle = simIpcOpenEventHandle;
  a->cuLinkCreate_v2 = simLinkCreate;
  a->cuLinkAddData_v2 = simLinkAddData;
  a->cuLinkComplete = simLinkComplete;
  a->cuLinkDestroy = simLinkDestroy;
  a->cuTensorMapEncodeTiled = simTensorMapEncodeTiled;
  a->cuTensorMapEncodeIm2col = simTensorMapEncodeIm2col;
  a->cuTensorMapEncodeIm2colWide = simTensorMapEncodeIm2colWide;
  a->cuTensorMapReplaceAddress = simTensorMapReplaceAddress;
  a->cuGraphCreate = simGraphCreate;
  a->cuGraphDestroy = simGraphDestroy;
  a->cuGraphGetNodes = simGraphGetNodes;
  a->cuGraphGetEdges_v2 = simGraphGetEdges;
  a->cuGraphDebugDotPrint = simGraphDebugDotPrint;
  a->cuGraphGetRootNodes = simGraphGetRootNodes;
  a->cuGraphNodeGetDependencies_v2 = simGraphNodeGetDependencies;
  a->cuGraphNodeGetDependentNodes_v2 = simGraphNodeGetDependentNodes;
  a->cuGraphAddDependencies_v2 = simGraphAddDependencies;
  a->cuGraphRemoveDependencies_v2 = simGraphRemoveDependencies;
  a->cuGraphDestroyNode = simGraphDestroyNode;
  a->cuGraphNodeSetEnabled = simGraphNodeSetEnabled;
  a->cuGraphNodeGetEnabled = simGraphNodeGetEnabled;
  a->cuGraphNodeGetType = simGraphNodeGetType;
  a->cuGraphAddKernelNode_v2 = simGraphAddKernelNode;
  a->cuGraphKernelNodeSetParams_v2 = simGraphKernelNodeSetParams;
  a->cuGraphExecKernelNodeSetParams_v2 = simGraphExecKernelNodeSetParams;
  a->cuGraphAddMemsetNode = simGraphAddMemsetNode;
  a->cuGraphMemsetNodeGetParams = simGraphMemsetNodeGetParams;
  a->cuGraphMemsetNodeSetParams = simGraphMemsetNodeSetParams;
  a->cuGraphExecMemsetNodeSetParams = simGraphExecMemsetNodeSetParams;
  a->cuGraphAddHostNode = simGraphAddHostNode;
  a->cuGraphHostNodeGetParams = simGraphHostNodeGetParams;
  a->cuGraphHostNodeSetParams = simGraphHostNodeSetParams;
  a->cuGraphAddMemcpyNode = simGraphAddMemcpyNode;
  a->cuGraphMemcpyNodeGetParams = simGraphMemcpyNodeGetParams;
  a->cuGraphMemcpyNodeSetParams = simGraphMemcpyNodeSetParams;
  a->cuGraphExecMemcpyNodeSetParams = simGraphExecMemcpyNodeSetParams;
  a->cuGraphAddChildGraphNode = simGraphAddChildGraphNode;
  a->cuGraphChildGraphNodeGetGraph = simGraphChildGraphNodeGetGraph;
  a->cuGraphExecChildGraphNodeSetParams = simGraphExecChildGraphNodeSetParams;
  a->cuGraphAddEmptyNode = simGraphAddEmptyNode;
  a->cuGraphAddEventRecordNode = simGraphAddEventRecordNode;
  a->cuGraphAddEventWaitNode = simGraphAddEventWaitNode;
  a->cuGraphEventRecordNodeGetEvent = simGraphEventRecordNodeGetEvent;
  a->cuGraphEventWaitNodeGetEvent = simGraphEventWaitNodeGetEvent;
  a->cuGraphAddMemAllocNode = simGraphAddMemAllocNode;
  a->cuGraphMemAllocNodeGetParams = simGraphMemAllocNodeGetParams;
  a->cuGraphAddMemFreeNode = simGraphAddMemFreeNode;
  a->cuGraphMemFreeNodeGetParams = simGraphMemFreeNodeGetParams;
  a->cuDeviceGetGraphMemAttribute = simDeviceGetGraphMemAttribute;
  a->cuDeviceSetGraphMemAttribute = simDeviceSetGraphMemAttribute;
  a->cuDeviceGraphMemTrim = simDeviceGraphMemTrim;
  a->cuGraphConditionalHandleCreate = simGraphConditionalHandleCreate;
  a->cuGraphAddNode_v2 = simGraphAddNode;
  a->cuGraphClone = simGraphClone;
  a->cuGraphNodeFindInClone = simGraphNodeFindInClone;
  a->cuGraphInstantiateWithFlags = simGraphInstantiate;
  a->cuGraphInstantiateWithParams = simGraphInstantiateWithParams;
  a->cuGraphExecGetFlags = simGraphExecGetFlags;
  a->cuGraphKernelNodeGetAttribute = simGraphKernelNodeGetAttribute;
  a->cuGraphKernelNodeSetAttribute = simGraphKernelNodeSetAttribute;
  a->cuGraphKernelNodeCopyAttributes = simGraphKernelNodeCopyAttributes;
  a->cuGraphKernelNodeGetParams_v2 = simGraphKernelNodeGetParams;
  a->cuGraphExecHostNodeSetParams = simGraphExecHostNodeSetParams;
  a->cuGraphEventRecordNodeSetEvent = simGraphEventRecordNodeSetEvent;
  a->cuGraphEventWaitNodeSetEvent = simGraphEventWaitNodeSetEvent;
  a->cuGraphExecEventRecordNodeSetEvent = simGraphExecEventRecordNodeSetEvent;
  a->cuGraphExecEventWaitNodeSetEvent = simGraphExecEventWaitNodeSetEvent;
  a->cuCtxGetExecAffinity = simCtxGetExecAffinity;
  a->cuCtxSetFlags = simCtxSetFlags;
  a->cuDeviceGetHostAtomicCapabilities = simDeviceGetHostAtomicCapabilities;
  a->cuDeviceGetP2PAtomicCapabilities = simDeviceGetP2PAtomicCapabilities;
  a->cuPointerSetAttribute = simPointerSetAttribute;
  a->cuOccupancyMaxPotentialClusterSize = simOccupancyMaxPotentialClusterSize;
  a->cuLibraryGetModule = simLibraryGetModule;
  a->cuFuncGetModule = simFuncGetModule;
  // The stream memory operations of the ABI before CUDA 11.7 (enabled in the
  // sim, as with NVreg_EnableStreamMemOPs=1: CAN_USE_STREAM_MEM_OPS_V1 says 1).
  a->cuStreamWriteValue32_v1 = a->cuStreamWriteValue32_v1_pt = simStreamWriteValue32;
  a->cuStreamWaitValue32_v1 = a->cuStreamWaitValue32_v1_pt = simStreamWaitValue32;
  a->cuStreamWriteValue64_v1 = a->cuStreamWriteValue64_v1_pt = simStreamWriteValue64;
  a->cuStreamWaitValue64_v1 = a->cuStreamWaitValue64_v1_pt = simStreamWaitValue64;
  a->cuStreamBatchMemOp_v1 = a->cuStreamBatchMemOp_v1_pt = simStreamBatchMemOpV1;
  a->cuGraphExecDestroy = simGraphExecDestroy;
  a->cuGraphExecUpdate_v2 = simGraphExecUpdate;
  a->cuGraphLaunch = simGraphLaunch;
  a->cuGraphUpload = simGraphUpload;
  sim.green = options.green_contexts;
  if (options.green_contexts) {
    a->cuDeviceGetDevResource = simDeviceGetDevResource;
    a->cuDevSmResourceSplitByCount = simDevSmResourceSplitByCount;
    a->cuDevResourceGenerateDesc = simDevResourceGenerateDesc;
    a->cuGreenCtxCreate = simGreenCtxCreate;
    a->cuGreenCtxDestroy = simGreenCtxDestroy;
    a->cuCtxFromGreenCtx = simCtxFromGreenCtx;
  }
  return Status::Ok();
}

}  // namespace flyt::server
