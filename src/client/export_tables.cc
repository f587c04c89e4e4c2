// Private driver export tables (`cuGetExportTable`) served by the client library.
//
// Owns: the table layouts (sizes, slot numbers), the slot functions, the context-local
// storage map and the integrity hash. Calls only public driver API functions from cuda.h,
// by their internal names (driver_impl_names.h): a table's calls are the driver's own,
// which CUPTI's driver API domain does not report (natively, cudart's calls through these
// tables are not reported either).
// Must not touch: transports, the wire protocol, handle translation, or the server; no slot
// may block on the network except through the public driver API calls it makes.
#include "client/export_tables.h"
#include "client/compile_cache.h"
#include "common/nccl_abi.h"
#include "common/profiler_abi.h"
#include "driver_impl_names.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log.h"

namespace flyt::client {
namespace {

// ---------------------------------------------------------------------------------------
// Table identities and layouts.
//
// Slot 0 of most tables holds the table's size in bytes, which readers check before they
// use a slot. We report the smallest size that covers the slots we implement (`claimed`):
// cudart 13.0, cuBLAS, cuBLASLt and cuDNN accept it, and a reader that sees a short table
// keeps away from the slots we cannot serve. Physically each table has the real driver's
// slot count (driver 580, `real`) plus kPadSlots, and every slot we do not implement holds
// a callable stub, so a reader that trusts a larger layout than we claim still never
// jumps to null.

enum TableIndex : int {
  kCudartInterface = 0,  // 6bd5fb6c
  kToolsCallbackHooks,   // a094798c
  kToolsTls,             // 42d85a81
  kContextStorage,       // c693336e
  kContextChecks,        // 263e8860
  kIntegrityCheck,       // d4082055
  kToolsContext,         // 21318c60
  kGpuTopology,          // 1734dc26
  kModuleFunctions,      // 6e163fbe
  kNumTables,
};

struct TableInfo {
  const char* name;
  unsigned char uuid[16];
  CUresult stub_result;  // what an unimplemented slot returns
};

constexpr TableInfo kTableInfo[kNumTables] = {
    {"cudart_interface",
     {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d,
      0xf9},
     CUDA_ERROR_NOT_SUPPORTED},
    // Hooks a profiler would install; with no profiler attached, doing nothing is success.
    {"tools_callback_hooks",
     {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a,
      0x66},
     CUDA_SUCCESS},
    {"tools_tls",
     {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec,
      0xdc},
     CUDA_ERROR_NOT_SUPPORTED},
    {"context_local_storage",
     {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95,
      0x93},
     CUDA_ERROR_NOT_SUPPORTED},
    {"context_checks",
     {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa,
      0x7e},
     CUDA_ERROR_NOT_SUPPORTED},
    {"integrity_check",
     {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1,
      0xf2},
     CUDA_ERROR_NOT_SUPPORTED},
    {"tools_context",
     {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8,
      0xf2},
     CUDA_ERROR_NOT_SUPPORTED},
    {"gpu_topology",
     {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b,
      0xca},
     CUDA_ERROR_NOT_SUPPORTED},
    {"module_functions",
     {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99,
      0x1e},
     CUDA_ERROR_NOT_SUPPORTED},
};

// Tables refused without a warning: asked for by libraries that work with them refused.
// f8cff951: asked first by every cudart copy; the driver serves 3 slots, none of which was
// called in our traces; cudart 13.0 (static and shared), cuBLAS, cuBLASLt and cuDNN run with
// it refused. da9151d3 (NVRTC's compile cache, client/compile_cache.h) is served, and
// refused quietly only when FLYT_COMPILE_CACHE=0: NVRTC then compiles every time.
constexpr unsigned char kRefusedQuietly[][16] = {
    {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d,
     0xd9},
    {0xda, 0x91, 0x51, 0xd3, 0x3a, 0xe6, 0xcc, 0x41, 0xa5, 0xc0, 0x4f, 0x26, 0xd5, 0x33, 0xe3,
     0x28},
};

constexpr size_t kPadSlots = 32;

struct Layout {
  size_t claimed;   // slots reported in slot 0
  size_t capacity;  // slots that exist
};
constexpr Layout MakeLayout(size_t claimed, size_t real) {
  return Layout{claimed, (claimed > real ? claimed : real) + kPadSlots};
}
constexpr Layout kCudartLayout = MakeLayout(13, 13);
constexpr Layout kHooksLayout = MakeLayout(7, 7);
constexpr Layout kToolsTlsLayout = MakeLayout(3, 3);
constexpr Layout kChecksLayout = MakeLayout(4, 15);
constexpr Layout kIntegrityLayout = MakeLayout(3, 3);
constexpr Layout kToolsContextLayout = MakeLayout(52, 93);
constexpr Layout kGpuTopologyLayout = MakeLayout(14, 17);
constexpr Layout kModuleFunctionsLayout = MakeLayout(8, 99);
// The storage table has no size slot: slots 0..2 are functions and slot 3 is null in the
// real driver (what follows it there is another table), so it is exactly four slots.
constexpr size_t kStorageCapacity = 4;

// Slot numbers of the entries we implement.
constexpr size_t kCudartGetModuleFromCubin = 1;
constexpr size_t kCudartGetPrimaryContext = 2;
constexpr size_t kCudartGetModuleFromCubinEx1 = 6;
constexpr size_t kCudartFn7 = 7;
constexpr size_t kCudartGetModuleFromCubinEx2 = 8;
constexpr size_t kCudartLoadCompilers = 12;
constexpr size_t kHooksBuffer1 = 2;
constexpr size_t kHooksBuffer2 = 6;
constexpr size_t kHooksReportRuntimeCall = 1;
constexpr size_t kHooksContextUid = 4;
constexpr size_t kHooksSlot3 = 3;
constexpr size_t kToolsTlsCurrentContext = 2;
constexpr size_t kStoragePut = 0;
constexpr size_t kStorageDelete = 1;
constexpr size_t kStorageGet = 2;
constexpr size_t kChecksContext = 2;
constexpr size_t kChecksGlobal = 3;
constexpr size_t kIntegrityHash = 1;
constexpr size_t kToolsContextId = 4;
constexpr size_t kToolsContextStreamId = 39;
constexpr size_t kToolsContextStream = 51;
constexpr size_t kGpuTopologyGet = 4;
constexpr size_t kGpuTopologyFree = 13;
constexpr size_t kModuleFunctionsEach = 7;

template <typename Fn>
const void* SlotOf(Fn* fn) {
  return reinterpret_cast<const void*>(fn);
}

const void* SizeSlot(size_t slots) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(slots * sizeof(void*)));
}

// A slot we do not implement. Readers call slots with their own argument lists; this
// function takes none, which the x86-64 calling convention tolerates, and only returns.
template <int kTable, size_t kSlot>
CUresult UnimplementedSlot() {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true, std::memory_order_relaxed)) {
    FLYT_WARN("export table %s: unimplemented slot %zu called", kTableInfo[kTable].name, kSlot);
  }
  return kTableInfo[kTable].stub_result;
}

template <int kTable, size_t kCapacity, size_t... kSlots>
void FillStubs(const void* (&slots)[kCapacity], std::index_sequence<kSlots...>) {
  ((slots[kSlots] = SlotOf(&UnimplementedSlot<kTable, kSlots>)), ...);
}

template <int kTable, size_t kCapacity>
void FillStubs(const void* (&slots)[kCapacity]) {
  FillStubs<kTable>(slots, std::make_index_sequence<kCapacity>());
}

// ---------------------------------------------------------------------------------------
// 6bd5fb6c: runtime interface.

// Slot 2: the device's primary context, without leaving it retained (the real driver hands
// out the handle of an inactive primary context and keeps it inactive). The handle of a
// device's primary context never changes, so it is looked up once per device.
constexpr int kMaxCachedDevices = 64;
std::atomic<CUcontext> primary_context_cache[kMaxCachedDevices];

CUresult CudartGetPrimaryContext(CUcontext* ctx, CUdevice dev) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool cacheable = dev >= 0 && dev < kMaxCachedDevices;
  if (cacheable) {
    CUcontext cached = primary_context_cache[dev].load(std::memory_order_acquire);
    if (cached != nullptr) {
      *ctx = cached;
      return CUDA_SUCCESS;
    }
  }
  CUcontext handle = nullptr;
  CUresult rc = cuDevicePrimaryCtxRetain(&handle, dev);
  if (rc != CUDA_SUCCESS) return rc;
  rc = cuDevicePrimaryCtxRelease(dev);
  if (rc != CUDA_SUCCESS) return rc;
  if (cacheable) primary_context_cache[dev].store(handle, std::memory_order_release);
  FLYT_TRACE("export table cudart_interface: primary context of device %d is %p", dev,
             static_cast<void*>(handle));
  *ctx = handle;
  return CUDA_SUCCESS;
}

// The `__fatBinC_Wrapper_t` that nvcc emits around each embedded fatbin.
struct FatbinWrapper {
  uint32_t magic;
  uint32_t version;
  const void* data;
  const void* prelinked;
};
constexpr uint32_t kFatbinWrapperMagic = 0x466243b1;

CUresult LoadFatbin(CUmodule* module, const void* image, const void* extra1, const void* extra2,
                    unsigned int extra3) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (extra1 != nullptr || extra2 != nullptr || extra3 != 0) return CUDA_ERROR_NOT_SUPPORTED;
  return cuModuleLoadData(module, image);
}

const void* UnwrapFatbin(const void* wrapper) {
  if (wrapper == nullptr) return nullptr;
  const auto* w = static_cast<const FatbinWrapper*>(wrapper);
  return w->magic == kFatbinWrapperMagic ? w->data : wrapper;
}

// Slots 1, 6 and 8: the pre-12.x way for cudart to load an embedded fatbin (cudart 13 uses
// cuLibraryLoadData instead). Served by cuModuleLoadData for the plain forms only.
CUresult CudartGetModuleFromCubin(CUmodule* module, const void* wrapper) {
  return LoadFatbin(module, UnwrapFatbin(wrapper), nullptr, nullptr, 0);
}

CUresult CudartGetModuleFromCubinEx1(CUmodule* module, const void* wrapper, void* a3, void* a4,
                                     unsigned int a5) {
  return LoadFatbin(module, UnwrapFatbin(wrapper), a3, a4, a5);
}

CUresult CudartGetModuleFromCubinEx2(const void* fatbin, CUmodule* module, void* a3, void* a4,
                                     unsigned int a5) {
  return LoadFatbin(module, fatbin, a3, a4, a5);
}

void CudartFn7(uintptr_t) {}

// Slot 12: loads the JIT compilers in the real driver. The server's driver does that.
CUresult CudartLoadCompilers() { return CUDA_SUCCESS; }

// ---------------------------------------------------------------------------------------
// a094798c: tools runtime callback hooks. Slots 2 and 6 hand cudart two zeroed arrays and
// their entry counts (1024 and 14, as the driver reports); they hold per-callback switches
// that a profiler would set, so all zero means no tool is attached. Entries are sized at
// 8 bytes, the widest a reader could assume.

constexpr size_t kHooksBuffer1Entries = 1024;
constexpr size_t kHooksBuffer2Entries = 14;
uint64_t hooks_buffer1[kHooksBuffer1Entries];
uint64_t hooks_buffer2[kHooksBuffer2Entries];

void HooksGetBuffer1(void** buffer, size_t* entries) {
  if (buffer != nullptr) *buffer = hooks_buffer1;
  if (entries != nullptr) *entries = kHooksBuffer1Entries;
}

void HooksGetBuffer2(void** buffer, size_t* entries) {
  if (buffer != nullptr) *buffer = hooks_buffer2;
  if (entries != nullptr) *entries = kHooksBuffer2Entries;
}

// With a tool attached, cudart reports each runtime call: slot 4 first, which writes the
// context's number into the record, then slot 1 with the call's id and record (enter and
// exit). NVIDIA's CUPTI switches that on by setting 32-bit words 1..1202 of the first
// array to 1, all but 130 (cudaStreamDestroy_v3020) and 1024: Flyt's libcupti does the
// same through SetRuntimeApiHooks.
std::atomic<profiler::RuntimeApiHook> g_runtime_hook{nullptr};
std::atomic<profiler::ContextUidHook> g_context_uid_hook{nullptr};
constexpr size_t kRuntimeSwitchWords = 1203;
static_assert(kRuntimeSwitchWords <= sizeof(hooks_buffer1) / (sizeof(uint32_t)));

CUresult HooksReportRuntimeCall(uint32_t cbid, const void* record) {
  if (auto hook = g_runtime_hook.load(std::memory_order_acquire)) hook(cbid, record);
  return CUDA_SUCCESS;
}

// Slot 3: cudart calls it once when a tool is attached (seen under torch.profiler, with the
// context and an object of cudart's); what it reports is not known. Success, as the driver.
CUresult HooksSlot3() { return CUDA_SUCCESS; }

CUresult HooksContextUid(CUcontext ctx, uint32_t* uid) {
  auto hook = g_context_uid_hook.load(std::memory_order_acquire);
  if (uid != nullptr) *uid = hook != nullptr ? hook(ctx) : 0;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------
// 42d85a81: tools thread-local state. Slot 2: the calling thread's current context.

CUresult ToolsTlsCurrentContext(CUcontext* ctx) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FLYT_TRACE("export table tools_tls: current context");
  return cuCtxGetCurrent(ctx);
}

// ---------------------------------------------------------------------------------------
// c693336e: context-local storage. cudart keeps its per-context state here and reads it on
// nearly every runtime call, so `get` is answered from a map in this process with no driver
// round trip. A thread-local one-entry cache, validated by a generation counter that every
// change bumps, lets repeated gets of the same (context, key) skip the lock entirely.

using StorageDestructor = void (*)(CUcontext ctx, void* key, void* value);

struct StorageKey {
  CUcontext ctx;
  void* key;
  bool operator==(const StorageKey& other) const { return ctx == other.ctx && key == other.key; }
};

struct StorageKeyHash {
  size_t operator()(const StorageKey& k) const {
    uint64_t a = reinterpret_cast<uintptr_t>(k.ctx);
    uint64_t b = reinterpret_cast<uintptr_t>(k.key);
    return static_cast<size_t>((a * 0x9e3779b97f4a7c15ull) ^ (b + (a << 6) + (a >> 2)));
  }
};

struct StorageEntry {
  void* value;
  StorageDestructor destructor;
};

class ContextStorage {
 public:
  // Like the driver, refuses to replace an existing entry.
  CUresult Put(CUcontext ctx, void* key, void* value, StorageDestructor destructor) {
    std::unique_lock lock(mu_);
    bool inserted = map_.try_emplace(StorageKey{ctx, key}, StorageEntry{value, destructor}).second;
    if (!inserted) return CUDA_ERROR_INVALID_HANDLE;
    generation_.fetch_add(1, std::memory_order_release);
    return CUDA_SUCCESS;
  }

  CUresult Delete(CUcontext ctx, void* key) {
    std::unique_lock lock(mu_);
    if (map_.erase(StorageKey{ctx, key}) == 0) return CUDA_ERROR_INVALID_HANDLE;
    generation_.fetch_add(1, std::memory_order_release);
    return CUDA_SUCCESS;
  }

  CUresult Get(void** value, CUcontext ctx, void* key) {
    Cache& cache = cache_;
    if (cache.generation == generation_.load(std::memory_order_acquire) && cache.ctx == ctx &&
        cache.key == key) {
      *value = cache.value;
      return CUDA_SUCCESS;
    }
    std::shared_lock lock(mu_);
    auto it = map_.find(StorageKey{ctx, key});
    if (it == map_.end()) return CUDA_ERROR_INVALID_HANDLE;
    *value = it->second.value;
    cache = Cache{generation_.load(std::memory_order_relaxed), ctx, key, it->second.value};
    return CUDA_SUCCESS;
  }

  // Removes every entry of `ctx`; returns those that had a destructor, in insertion-
  // independent order.
  std::vector<std::pair<void*, StorageEntry>> Take(CUcontext ctx) {
    std::vector<std::pair<void*, StorageEntry>> taken;
    std::unique_lock lock(mu_);
    for (auto it = map_.begin(); it != map_.end();) {
      if (it->first.ctx == ctx) {
        if (it->second.destructor != nullptr) taken.emplace_back(it->first.key, it->second);
        it = map_.erase(it);
      } else {
        ++it;
      }
    }
    generation_.fetch_add(1, std::memory_order_release);
    return taken;
  }

 private:
  struct Cache {
    uint64_t generation;  // 0 never matches: generation_ starts at 1
    CUcontext ctx;
    void* key;
    void* value;
  };
  static thread_local Cache cache_;

  std::shared_mutex mu_;
  std::unordered_map<StorageKey, StorageEntry, StorageKeyHash> map_;
  std::atomic<uint64_t> generation_{1};
};

thread_local ContextStorage::Cache ContextStorage::cache_{};

// Never destroyed: cudart deletes its entries from its own exit handlers, which may run
// after this library's static destructors.
ContextStorage& Storage() {
  static ContextStorage* storage = new ContextStorage();
  return *storage;
}

// A null context means the calling thread's current one.
CUresult ResolveContext(CUcontext* ctx) {
  if (*ctx != nullptr) return CUDA_SUCCESS;
  CUresult rc = cuCtxGetCurrent(ctx);
  if (rc != CUDA_SUCCESS) return rc;
  return *ctx != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult StoragePut(CUcontext ctx, void* key, void* value, StorageDestructor destructor) {
  FLYT_TRACE("export table context_local_storage: put ctx %p key %p", static_cast<void*>(ctx), key);
  CUresult rc = ResolveContext(&ctx);
  if (rc != CUDA_SUCCESS) return rc;
  return Storage().Put(ctx, key, value, destructor);
}

CUresult StorageDelete(CUcontext ctx, void* key) {
  FLYT_TRACE("export table context_local_storage: delete ctx %p key %p", static_cast<void*>(ctx),
             key);
  CUresult rc = ResolveContext(&ctx);
  if (rc != CUDA_SUCCESS) return rc;
  return Storage().Delete(ctx, key);
}

CUresult StorageGet(void** value, CUcontext ctx, void* key) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = ResolveContext(&ctx);
  if (rc != CUDA_SUCCESS) return rc;
  return Storage().Get(value, ctx, key);
}

// ---------------------------------------------------------------------------------------
// 263e8860: context checks. Slot 2 reports, for a context, a flag word that is 0 for every
// ordinary context (a non-zero value would make cudart look at the second output); slot 3
// a process-wide word that is likewise 0.

CUresult ChecksContext(CUcontext, uint32_t* flags, const void**) {
  if (flags != nullptr) *flags = 0;
  return CUDA_SUCCESS;
}

uint32_t ChecksGlobal() { return 0; }

// ---------------------------------------------------------------------------------------
// 21318c60: tools context interface (cuBLAS/cuBLASLt). Slot 4: the context's unique id, the
// value cuCtxGetId returns; a null context has id 0 (the driver does not substitute the
// current context here).

CUresult ToolsContextId(CUcontext ctx, unsigned long long* id) {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ctx == nullptr) {
    *id = 0;
    return CUDA_SUCCESS;
  }
  FLYT_TRACE("export table tools_context: id of ctx %p", static_cast<void*>(ctx));
  return cuCtxGetId(ctx, id);
}

// Slots 51 and 39 name a stream. cuBLAS and cuBLASLt keep a pool of workspaces and find
// the one of a stream by its 64-bit id: `slot51(ctx, stream, &object, stream == 2)`, then
// `slot39(ctx, object, &id)`. In the driver, slot 51 turns a public handle into its stream
// object: NULL is the legacy stream of `ctx` (of `ctx`, not of the current context), or
// the calling thread's per-thread stream when `per_thread` is set; CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD mean themselves whatever the flag; a created stream gives its
// object whatever the flag and `ctx`. A default stream with a NULL `ctx` is
// CUDA_ERROR_INVALID_HANDLE (measured for NULL and CU_STREAM_LEGACY). Slot 39 gives the
// object's unique id, the value cuStreamGetId returns; ids are never reused, even when a
// new stream gets the handle value of a destroyed one. Null output pointers are
// CUDA_ERROR_INVALID_VALUE in both.
//
// Here the object is the public handle itself (NULL plus the flag becomes
// CU_STREAM_PER_THREAD), so slot 39 is cuStreamGetId on it, run against `ctx` when the
// handle is one of the default streams. That is one forwarded call per lookup; a cache
// keyed by handle value would break the never-reused property cuBLAS relies on.

bool IsDefaultStream(CUstream stream) {
  return stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

CUresult ToolsContextStream(CUcontext ctx, CUstream stream, void** object, int per_thread) {
  if (object == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (stream == nullptr && per_thread != 0) stream = CU_STREAM_PER_THREAD;
  if (ctx == nullptr && IsDefaultStream(stream)) return CUDA_ERROR_INVALID_HANDLE;
  FLYT_TRACE("export table tools_context: stream %p of ctx %p", static_cast<void*>(stream),
             static_cast<void*>(ctx));
  *object = static_cast<void*>(stream);
  return CUDA_SUCCESS;
}

CUresult ToolsContextStreamId(CUcontext ctx, void* object, unsigned long long* id) {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto stream = static_cast<CUstream>(object);
  CUcontext current = nullptr;
  if (ctx == nullptr || !IsDefaultStream(stream) || cuCtxGetCurrent(&current) != CUDA_SUCCESS ||
      current == ctx) {
    return cuStreamGetId(stream, id);
  }
  // A default stream of a context other than the current one.
  CUresult rc = cuCtxPushCurrent(ctx);
  if (rc != CUDA_SUCCESS) return rc;
  rc = cuStreamGetId(stream, id);
  CUcontext popped = nullptr;
  cuCtxPopCurrent(&popped);
  return rc;
}

// ---------------------------------------------------------------------------------------
// 1734dc26: GPU topology (cuBLASLt, on its first half-precision GEMM; nvrtc, nvJitLink,
// CUPTI and cuSPARSELt carry the UUID too). Slot 4 `(uint8_t** a, uint8_t** b)` hands out
// two malloc'ed byte arrays describing the current context's device layout: on an H200
// `a` holds GPC indices (0..7, cycling) and `b` each entry's index inside its GPC; slot 13
// `(void* a, void* b)` frees them. No public API exposes this layout, so slot 4 reports it
// as unavailable; cuBLASLt then takes its own path for a device without it and calls
// neither slot 13 nor anything else here. cuBLASLt calls slot 4 through the table pointer
// without a null check, which is why refusing the whole table crashed it.

CUresult GpuTopologyGet(void** gpc_index, void** index_in_gpc) {
  if (gpc_index != nullptr) *gpc_index = nullptr;
  if (index_in_gpc != nullptr) *index_in_gpc = nullptr;
  FLYT_TRACE("export table gpu_topology: layout not available");
  return CUDA_ERROR_NOT_SUPPORTED;
}

// Slot 4 never hands out arrays, so there is nothing of ours to free.
CUresult GpuTopologyFree(void*, void*) { return CUDA_SUCCESS; }

// ---------------------------------------------------------------------------------------
// 6e163fbe: module functions (cuFFT; 99 slots in driver 580, of which cuFFT 12 calls only
// slot 7, after checking that the size covers 8 slots). Slot 7
// `(CUcontext ctx, CUmodule module, void (*each)(void* opaque, CUfunction f), void* opaque)`
// calls `each` once per function of `module` and returns how many it called it for; cuFFT
// loads each of its run-time generated kernels as a module of one function, takes the
// function from the callback without knowing its name, and treats any result other than 1
// as an internal error. The functions handed out are used only through the public API
// (launches, attributes): cuFFT never reads the driver object itself (probed with the
// object in memory that faults on access: every read came from the driver). The client
// knows every function of each module it loaded, so this is answered without the server.

int ModuleFunctionsEach(CUcontext, CUmodule module, void (*each)(void*, CUfunction), void* opaque) {
  unsigned int count = 0;
  if (each == nullptr || cuModuleGetFunctionCount(&count, module) != CUDA_SUCCESS) return 0;
  std::vector<CUfunction> functions(count);
  if (count == 0 || cuModuleEnumerateFunctions(functions.data(), count, module) != CUDA_SUCCESS) {
    FLYT_WARN("export table module_functions: module %p has no functions Flyt knows of",
              static_cast<void*>(module));
    return 0;
  }
  for (CUfunction f : functions) each(opaque, f);
  return static_cast<int>(count);
}

// ---------------------------------------------------------------------------------------
// d4082055: integrity check. cudart asks for three 16-byte answers while it starts (its
// `version` argument ends in 0, 1 and 2). The first two are constants. The third is
// HMAC-MD2, under a fixed key, of: driver version, `version`, pid, thread id, the addresses
// of the runtime-interface table, of this table and of this slot's function, the time
// cudart passed, then UUID and PCI domain/bus/device of each device. cudart computes the
// same value itself from what it sees, so everything must describe this process: our
// tables, our answers to the device queries.

// MD2 (RFC 1319).
class Md2 {
 public:
  void Update(const void* data, size_t size, uint8_t xor_mask) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < size; ++i) Byte(static_cast<uint8_t>(bytes[i] ^ xor_mask));
  }

  void Final(uint8_t digest[16]) {
    uint8_t pad = static_cast<uint8_t>(16 - fill_);
    for (uint8_t i = 0; i < pad; ++i) Byte(pad);
    uint8_t checksum[16];
    std::memcpy(checksum, checksum_, sizeof(checksum));
    Update(checksum, sizeof(checksum), 0);
    std::memcpy(digest, state_, 16);
  }

 private:
  // The substitution table of RFC 1319, built from the digits of pi.
  // clang-format off
  static constexpr uint8_t kPi[256] = {
    0x29, 0x2e, 0x43, 0xc9, 0xa2, 0xd8, 0x7c, 0x01, 0x3d, 0x36, 0x54, 0xa1, 0xec, 0xf0, 0x06, 0x13,
    0x62, 0xa7, 0x05, 0xf3, 0xc0, 0xc7, 0x73, 0x8c, 0x98, 0x93, 0x2b, 0xd9, 0xbc, 0x4c, 0x82, 0xca,
    0x1e, 0x9b, 0x57, 0x3c, 0xfd, 0xd4, 0xe0, 0x16, 0x67, 0x42, 0x6f, 0x18, 0x8a, 0x17, 0xe5, 0x12,
    0xbe, 0x4e, 0xc4, 0xd6, 0xda, 0x9e, 0xde, 0x49, 0xa0, 0xfb, 0xf5, 0x8e, 0xbb, 0x2f, 0xee, 0x7a,
    0xa9, 0x68, 0x79, 0x91, 0x15, 0xb2, 0x07, 0x3f, 0x94, 0xc2, 0x10, 0x89, 0x0b, 0x22, 0x5f, 0x21,
    0x80, 0x7f, 0x5d, 0x9a, 0x5a, 0x90, 0x32, 0x27, 0x35, 0x3e, 0xcc, 0xe7, 0xbf, 0xf7, 0x97, 0x03,
    0xff, 0x19, 0x30, 0xb3, 0x48, 0xa5, 0xb5, 0xd1, 0xd7, 0x5e, 0x92, 0x2a, 0xac, 0x56, 0xaa, 0xc6,
    0x4f, 0xb8, 0x38, 0xd2, 0x96, 0xa4, 0x7d, 0xb6, 0x76, 0xfc, 0x6b, 0xe2, 0x9c, 0x74, 0x04, 0xf1,
    0x45, 0x9d, 0x70, 0x59, 0x64, 0x71, 0x87, 0x20, 0x86, 0x5b, 0xcf, 0x65, 0xe6, 0x2d, 0xa8, 0x02,
    0x1b, 0x60, 0x25, 0xad, 0xae, 0xb0, 0xb9, 0xf6, 0x1c, 0x46, 0x61, 0x69, 0x34, 0x40, 0x7e, 0x0f,
    0x55, 0x47, 0xa3, 0x23, 0xdd, 0x51, 0xaf, 0x3a, 0xc3, 0x5c, 0xf9, 0xce, 0xba, 0xc5, 0xea, 0x26,
    0x2c, 0x53, 0x0d, 0x6e, 0x85, 0x28, 0x84, 0x09, 0xd3, 0xdf, 0xcd, 0xf4, 0x41, 0x81, 0x4d, 0x52,
    0x6a, 0xdc, 0x37, 0xc8, 0x6c, 0xc1, 0xab, 0xfa, 0x24, 0xe1, 0x7b, 0x08, 0x0c, 0xbd, 0xb1, 0x4a,
    0x78, 0x88, 0x95, 0x8b, 0xe3, 0x63, 0xe8, 0x6d, 0xe9, 0xcb, 0xd5, 0xfe, 0x3b, 0x00, 0x1d, 0x39,
    0xf2, 0xef, 0xb7, 0x0e, 0x66, 0x58, 0xd0, 0xe4, 0xa6, 0x77, 0x72, 0xf8, 0xeb, 0x75, 0x4b, 0x0a,
    0x31, 0x44, 0x50, 0xb4, 0x8f, 0xed, 0x1f, 0x1a, 0xdb, 0x99, 0x8d, 0x33, 0x9f, 0x11, 0x83, 0x14,
  };
  // clang-format on

  void Byte(uint8_t b) {
    state_[16 + fill_] = b;
    state_[32 + fill_] = static_cast<uint8_t>(b ^ state_[fill_]);
    checksum_[fill_] ^= kPi[b ^ last_];
    last_ = checksum_[fill_];
    if (++fill_ == 16) {
      fill_ = 0;
      Compress();
    }
  }

  void Compress() {
    uint8_t t = 0;
    for (int round = 0; round < 18; ++round) {
      for (uint8_t& x : state_) t = x ^= kPi[t];
      t = static_cast<uint8_t>(t + round);
    }
  }

  uint8_t state_[48] = {};
  uint8_t checksum_[16] = {};
  uint8_t last_ = 0;
  unsigned fill_ = 0;
};

constexpr uint8_t kIntegrityKey[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
                                       0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};
constexpr uint64_t kIntegrityAnswer0[2] = {0x3341181c03cb675cull, 0x8ed383aa1f4cd1e8ull};
constexpr uint64_t kIntegrityAnswer1[2] = {0x1841181c03cb675cull, 0x8ed383aa1f4cd1e8ull};

struct IntegrityHeader {
  uint32_t driver_version;
  uint32_t version;
  uint32_t pid;
  uint32_t tid;
  const void* cudart_table;
  const void* integrity_table;
  const void* hash_function;
  uint64_t unix_seconds;
};
static_assert(sizeof(IntegrityHeader) == 48, "hashed byte for byte");

struct IntegrityDevice {
  CUuuid uuid;
  int32_t pci_domain;
  int32_t pci_bus;
  int32_t pci_device;
};
static_assert(sizeof(IntegrityDevice) == 28, "hashed byte for byte");

CUresult IntegrityHash(uint32_t version, uint64_t unix_seconds, uint64_t result[2]);

// ---------------------------------------------------------------------------------------
// The tables themselves: built once, never freed, never moved (their addresses are hashed).

struct Tables {
  const void* cudart[kCudartLayout.capacity];
  const void* hooks[kHooksLayout.capacity];
  const void* tools_tls[kToolsTlsLayout.capacity];
  const void* storage[kStorageCapacity];
  const void* checks[kChecksLayout.capacity];
  const void* integrity[kIntegrityLayout.capacity];
  const void* tools_context[kToolsContextLayout.capacity];
  const void* gpu_topology[kGpuTopologyLayout.capacity];
  const void* module_functions[kModuleFunctionsLayout.capacity];

  const void* const* Get(int index) const {
    switch (index) {
      case kCudartInterface:
        return cudart;
      case kToolsCallbackHooks:
        return hooks;
      case kToolsTls:
        return tools_tls;
      case kContextStorage:
        return storage;
      case kContextChecks:
        return checks;
      case kIntegrityCheck:
        return integrity;
      case kToolsContext:
        return tools_context;
      case kGpuTopology:
        return gpu_topology;
      case kModuleFunctions:
        return module_functions;
      default:
        return nullptr;
    }
  }
};

Tables* BuildTables() {
  auto* t = new Tables();

  FillStubs<kCudartInterface>(t->cudart);
  t->cudart[0] = SizeSlot(kCudartLayout.claimed);
  t->cudart[kCudartGetModuleFromCubin] = SlotOf(&CudartGetModuleFromCubin);
  t->cudart[kCudartGetPrimaryContext] = SlotOf(&CudartGetPrimaryContext);
  t->cudart[kCudartGetModuleFromCubinEx1] = SlotOf(&CudartGetModuleFromCubinEx1);
  t->cudart[kCudartFn7] = SlotOf(&CudartFn7);
  t->cudart[kCudartGetModuleFromCubinEx2] = SlotOf(&CudartGetModuleFromCubinEx2);
  t->cudart[kCudartLoadCompilers] = SlotOf(&CudartLoadCompilers);

  FillStubs<kToolsCallbackHooks>(t->hooks);
  t->hooks[0] = SizeSlot(kHooksLayout.claimed);
  t->hooks[kHooksBuffer1] = SlotOf(&HooksGetBuffer1);
  t->hooks[kHooksBuffer2] = SlotOf(&HooksGetBuffer2);
  t->hooks[kHooksReportRuntimeCall] = SlotOf(&HooksReportRuntimeCall);
  t->hooks[kHooksContextUid] = SlotOf(&HooksContextUid);
  t->hooks[kHooksSlot3] = SlotOf(&HooksSlot3);

  FillStubs<kToolsTls>(t->tools_tls);
  t->tools_tls[0] = SizeSlot(kToolsTlsLayout.claimed);
  t->tools_tls[kToolsTlsCurrentContext] = SlotOf(&ToolsTlsCurrentContext);

  FillStubs<kContextStorage>(t->storage);
  t->storage[kStoragePut] = SlotOf(&StoragePut);
  t->storage[kStorageDelete] = SlotOf(&StorageDelete);
  t->storage[kStorageGet] = SlotOf(&StorageGet);
  t->storage[3] = nullptr;

  FillStubs<kContextChecks>(t->checks);
  t->checks[0] = SizeSlot(kChecksLayout.claimed);
  t->checks[kChecksContext] = SlotOf(&ChecksContext);
  t->checks[kChecksGlobal] = SlotOf(&ChecksGlobal);

  FillStubs<kIntegrityCheck>(t->integrity);
  t->integrity[0] = SizeSlot(kIntegrityLayout.claimed);
  t->integrity[kIntegrityHash] = SlotOf(&IntegrityHash);

  FillStubs<kToolsContext>(t->tools_context);
  t->tools_context[0] = SizeSlot(kToolsContextLayout.claimed);
  t->tools_context[kToolsContextId] = SlotOf(&ToolsContextId);
  t->tools_context[kToolsContextStreamId] = SlotOf(&ToolsContextStreamId);
  t->tools_context[kToolsContextStream] = SlotOf(&ToolsContextStream);

  FillStubs<kGpuTopology>(t->gpu_topology);
  t->gpu_topology[0] = SizeSlot(kGpuTopologyLayout.claimed);
  t->gpu_topology[kGpuTopologyGet] = SlotOf(&GpuTopologyGet);
  t->gpu_topology[kGpuTopologyFree] = SlotOf(&GpuTopologyFree);

  FillStubs<kModuleFunctions>(t->module_functions);
  t->module_functions[0] = SizeSlot(kModuleFunctionsLayout.claimed);
  t->module_functions[kModuleFunctionsEach] = SlotOf(&ModuleFunctionsEach);
  return t;
}

const Tables& AllTables() {
  static const Tables* tables = BuildTables();
  return *tables;
}

// The hash proper. `cudart_table`, `integrity_table` and `hash_function` are the addresses
// cudart was given: the runtime-interface table, the integrity table and its slot 1.
CUresult ComputeIntegrityHash(uint32_t version, uint64_t unix_seconds, const void* cudart_table,
                              const void* integrity_table, const void* hash_function,
                              uint64_t result[2]) {
  if (result == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (version % 10) {
    case 0:
      std::memcpy(result, kIntegrityAnswer0, sizeof(kIntegrityAnswer0));
      return CUDA_SUCCESS;
    case 1:
      std::memcpy(result, kIntegrityAnswer1, sizeof(kIntegrityAnswer1));
      return CUDA_SUCCESS;
    default:
      break;
  }
  IntegrityHeader header{};
  int driver_version = 0;
  CUresult rc = cuDriverGetVersion(&driver_version);
  if (rc != CUDA_SUCCESS) return rc;
  header.driver_version = static_cast<uint32_t>(driver_version);
  header.version = version;
  header.pid = static_cast<uint32_t>(getpid());
  header.tid = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(pthread_self()));
  header.cudart_table = cudart_table;
  header.integrity_table = integrity_table;
  header.hash_function = hash_function;
  header.unix_seconds = unix_seconds;

  Md2 inner;
  inner.Update(kIntegrityKey, sizeof(kIntegrityKey), 0x36);
  inner.Update(&header, sizeof(header), 0);
  int count = 0;
  rc = cuDeviceGetCount(&count);
  if (rc != CUDA_SUCCESS) return rc;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice dev = 0;
    IntegrityDevice info{};
    rc = cuDeviceGet(&dev, ordinal);
    if (rc == CUDA_SUCCESS) rc = cuDeviceGetUuid(&info.uuid, dev);
    if (rc == CUDA_SUCCESS) {
      rc = cuDeviceGetAttribute(&info.pci_domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev);
    }
    if (rc == CUDA_SUCCESS) {
      rc = cuDeviceGetAttribute(&info.pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
    }
    if (rc == CUDA_SUCCESS) {
      rc = cuDeviceGetAttribute(&info.pci_device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev);
    }
    if (rc != CUDA_SUCCESS) return rc;
    inner.Update(&info, sizeof(info), 0);
  }
  uint8_t inner_digest[16];
  inner.Final(inner_digest);

  Md2 outer;
  outer.Update(kIntegrityKey, sizeof(kIntegrityKey), 0x5c);
  outer.Update(inner_digest, sizeof(inner_digest), 0);
  uint8_t digest[16];
  outer.Final(digest);
  std::memcpy(result, digest, sizeof(digest));
  return CUDA_SUCCESS;
}

// Slot 1.
CUresult IntegrityHash(uint32_t version, uint64_t unix_seconds, uint64_t result[2]) {
  const Tables& tables = AllTables();
  CUresult rc = ComputeIntegrityHash(version, unix_seconds, tables.cudart, tables.integrity,
                                     tables.integrity[kIntegrityHash], result);
  FLYT_TRACE("export table integrity_check: version %u -> %d", version, static_cast<int>(rc));
  return rc;
}

// ---------------------------------------------------------------------------------------
// Refused tables: each distinct UUID is logged once.

void FormatUuid(const CUuuid* id, char (&out)[37]) {
  const auto* b = reinterpret_cast<const unsigned char*>(id->bytes);
  std::snprintf(out, sizeof(out),
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
                b[15]);
}

bool FirstRefusal(const CUuuid* id) {
  static std::mutex mu;
  static auto* seen = new std::vector<CUuuid>();
  std::lock_guard lock(mu);
  for (const CUuuid& s : *seen) {
    if (std::memcmp(s.bytes, id->bytes, sizeof(s.bytes)) == 0) return false;
  }
  seen->push_back(*id);
  return true;
}

}  // namespace

CUresult GetExportTable(const void** table, const CUuuid* id) {
  if (table == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (std::memcmp(id->bytes, profiler::kTableUuid, sizeof(id->bytes)) == 0) {
    *table = ProfilerTable();  // Flyt's libcupti (client/api_profiler.cc)
    return CUDA_SUCCESS;
  }
  if (std::memcmp(id->bytes, nccl::kTableUuid, sizeof(id->bytes)) == 0) {
    *table = NcclTable();  // Flyt's libnccl (client/api_nccl.cc)
    return CUDA_SUCCESS;
  }
  if (std::memcmp(id->bytes, kCompileCacheUuid, sizeof(id->bytes)) == 0) {
    if (const void* cache = CompileCacheTable(); cache != nullptr) {
      *table = cache;
      return CUDA_SUCCESS;
    }
  }
  for (int i = 0; i < kNumTables; ++i) {
    if (std::memcmp(id->bytes, kTableInfo[i].uuid, sizeof(id->bytes)) == 0) {
      *table = AllTables().Get(i);
      FLYT_DEBUG("cuGetExportTable: serving %s", kTableInfo[i].name);
      return CUDA_SUCCESS;
    }
  }
  *table = nullptr;
  if (FirstRefusal(id)) {
    char text[37];
    FormatUuid(id, text);
    bool optional = false;
    for (const auto& quiet : kRefusedQuietly) {
      optional = optional || std::memcmp(id->bytes, quiet, sizeof(id->bytes)) == 0;
    }
    if (optional) {
      FLYT_DEBUG("cuGetExportTable: refusing %s (optional)", text);
    } else {
      FLYT_WARN("cuGetExportTable: no table %s; refusing it", text);
    }
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

void DestroyContextLocalStorage(CUcontext ctx) {
  if (ctx == nullptr) return;
  for (auto& [key, entry] : Storage().Take(ctx)) entry.destructor(ctx, key, entry.value);
}

void SetRuntimeApiHooks(profiler::RuntimeApiHook each_call, profiler::ContextUidHook uid) {
  bool on = each_call != nullptr && uid != nullptr;
  g_context_uid_hook.store(on ? uid : nullptr, std::memory_order_release);
  g_runtime_hook.store(on ? each_call : nullptr, std::memory_order_release);
  auto* words = reinterpret_cast<std::atomic<uint32_t>*>(hooks_buffer1);
  for (size_t i = 1; i < kRuntimeSwitchWords; ++i)
    if (i != 130 && i != 1024) words[i].store(on ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace flyt::client
