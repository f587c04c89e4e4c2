// Code loading and launches: images are hashed and shipped unopened (once per
// server), the server answers with every kernel and its parameter layout, so
// kernel lookups are local and a launch is one fire-and-forget frame.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "client/client.h"
#include "client/managed_memory.h"
#include "client/query_cache.h"
#include "common/cuda_image.h"
#include "common/cupti_records.h"
#include "common/log.h"

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::FuncInfo;
using flyt::client::QueryCache;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace {

// 128-bit content hash of an image (two independent 64-bit FNV-1a style lanes).
void Hash(const uint8_t* p, size_t n, uint64_t* h0, uint64_t* h1) {
  uint64_t a = 0xcbf29ce484222325ull ^ n, b = 0x84222325cbf29ce4ull + n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    a = (a ^ v) * 0x100000001b3ull;
    b = (b ^ (v >> 29 | v << 35)) * 0x9e3779b97f4a7c15ull;
  }
  for (; i < n; ++i) {
    a = (a ^ p[i]) * 0x100000001b3ull;
    b = (b ^ p[i]) * 0x9e3779b97f4a7c15ull;
  }
  *h0 = a ^ (a >> 31);
  *h1 = b ^ (b >> 29);
}

CUresult LoadImage(const void* image, bool library, uint64_t* handle) {
  return flyt::client::LoadImageOn(image, library, handle);
}

}  // namespace

// Loads on the calling thread's route (the current context's server, or a
// RouteScope's); with several servers the handles carry that server's tag.
CUresult flyt::client::LoadImageOn(const void* image, bool library, uint64_t* handle) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  flyt::ImageSpan span{};
  if (image == nullptr || !flyt::LocateImage(image, &span)) return CUDA_ERROR_INVALID_IMAGE;
  if (span.size > wire::kMaxPayload) return CUDA_ERROR_INVALID_IMAGE;
  const auto* bytes = static_cast<const uint8_t*>(span.data);
  uint64_t h0 = 0, h1 = 0;
  Hash(bytes, span.size, &h0, &h1);
  const char* name = library ? "cuLibraryLoadData" : "cuModuleLoadData";
  auto* load_hook = flyt::client::g_module_load_hook.load(std::memory_order_relaxed);
  const uint64_t load_start = load_hook != nullptr ? flyt::cupti_records::RealtimeNs() : 0;
  std::vector<uint8_t> reply;
  CUresult rc = CUDA_ERROR_NOT_FOUND;
  for (int with_bytes = 0; with_bytes < 2 && rc == CUDA_ERROR_NOT_FOUND; ++with_bytes) {
    wire::Writer w;
    w.Put<uint8_t>(library ? 0 : 1);
    w.Put(h0);
    w.Put(h1);
    w.Put<uint64_t>(span.size);
    w.Put<uint8_t>(static_cast<uint8_t>(with_bytes));
    if (with_bytes) w.PutBytes(bytes, span.size);
    rc = c.Call(name, ops::kOpLoadImage, w, ReplySink{&reply});
  }
  if (rc != CUDA_SUCCESS) return rc;
  const int server = c.multi() ? Client::LastRoute() : 0;
  wire::Reader r(reply.data(), reply.size());
  uint64_t h = 0;
  std::vector<std::pair<uint64_t, FuncInfo>> fns;
  if (!r.Get(&h) || !flyt::client::ReadFunctionList(r, library, &fns)) return CUDA_ERROR_UNKNOWN;
  if (server != 0) {
    h = Client::Tag(h, server);
    for (auto& f : fns) f.first = Client::Tag(f.first, server);
  }
  c.AddImage(h, library, std::move(fns));
  // Several servers: a library's kernels may be launched on another server's GPU.
  if (library && c.multi()) flyt::client::NoteLibraryImage(h, bytes, span.size);
  if (load_hook != nullptr) load_hook(load_start, flyt::cupti_records::RealtimeNs());
  *handle = h;
  return CUDA_SUCCESS;
}

namespace {

bool ReadFile(const char* path, std::vector<char>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  out->push_back('\0');  // PTX text needs its terminator
  return true;
}

}  // namespace

bool flyt::client::ReadFunctionList(wire::Reader& r, bool is_kernel,
                                    std::vector<std::pair<uint64_t, FuncInfo>>* fns) {
  uint32_t n = 0;
  if (!r.Get(&n) || n > ops::kMaxKernelsPerImage) return false;
  fns->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t fh = 0;
    FuncInfo info;
    uint32_t np = 0;
    if (!r.Get(&fh) || !r.GetString(&info.name, ops::kMaxNameLen) || !r.Get(&np)) return false;
    info.is_kernel = is_kernel;
    if (np == ops::kLayoutUnknown) {
      info.layout_known = false;
      fns->emplace_back(fh, std::move(info));
      continue;
    }
    if (np > ops::kMaxParams) return false;
    info.params.resize(np);
    if (np > 0 && !r.GetBytes(info.params.data(), np * sizeof(ops::ParamSlot))) return false;
    for (const auto& s : info.params)
      info.param_bytes = std::max(info.param_bytes, s.offset + s.size);
    fns->emplace_back(fh, std::move(info));
  }
  return true;
}

std::shared_ptr<const FuncInfo> flyt::client::FuncLayout(uint64_t f, CUresult* why) {
  Client& c = Client::Get();
  auto seen = c.Func(f);
  if (seen != nullptr && seen->layout_known) return seen;
  CUresult last = CUDA_ERROR_INVALID_HANDLE;
  // A handle of no image seen load (another API path) may be either kind.
  for (uint8_t is_kernel = 0; is_kernel < 2; ++is_kernel) {
    if (seen != nullptr && is_kernel != (seen->is_kernel ? 1 : 0)) continue;
    wire::Writer w;
    w.Put(Client::WireValue(f));
    w.Put(is_kernel);
    std::vector<uint8_t> reply;
    Client::RouteScope scope(c.multi() ? Client::TagOf(f) : -1);  // the function's server
    last = c.Call("paramLayout", ops::kOpFuncParamLayout, w, ReplySink{&reply});
    if (last != CUDA_SUCCESS) continue;
    wire::Reader r(reply.data(), reply.size());
    uint32_t np = 0;
    FuncInfo info;
    if (seen != nullptr) {
      info = *seen;
      info.superseded = seen;
    }
    if (!r.Get(&np) || np > ops::kMaxParams) break;
    info.params.resize(np);
    if (np > 0 && !r.GetBytes(info.params.data(), np * sizeof(ops::ParamSlot))) break;
    info.param_bytes = 0;
    for (const auto& s : info.params)
      info.param_bytes = std::max(info.param_bytes, s.offset + s.size);
    info.is_kernel = is_kernel != 0;
    info.layout_known = true;
    auto shared = std::make_shared<const FuncInfo>(std::move(info));
    c.AliasFunc(f, shared);
    return shared;
  }
  if (why != nullptr) *why = last == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : last;
  return nullptr;
}

namespace {

void EncodeLaunchHead(wire::Writer& w, CUfunction f, uint32_t flags, const unsigned grid[3],
                      const unsigned block[3], unsigned shmem, CUstream stream,
                      const CUlaunchAttribute* attrs, unsigned nattrs) {
  w.Put<uint64_t>(Client::WireHandle(f));
  w.Put(flags);
  w.PutBytes(grid, 12);
  w.PutBytes(block, 12);
  w.Put<uint32_t>(shmem);
  w.Put<uint64_t>(Client::WireHandle(stream));
  w.Put<uint32_t>(nattrs);
  if (nattrs > 0) w.PutBytes(attrs, sizeof(CUlaunchAttribute) * nattrs);
}

// The launch-configuration errors the driver reports at once, checked here
// against the device's limits so that an asynchronous launch reports them too.
CUresult CheckLaunchConfig(uint64_t f, const unsigned grid[3], const unsigned block[3],
                           unsigned shmem) {
  Client& c = Client::Get();
  int dev = c.ContextDevice(flyt::client::CurrentContext());
  const ops::DeviceInfo* d = c.device(dev < 0 ? 0 : dev);
  if (d == nullptr) return CUDA_SUCCESS;
  const int* a = d->attributes;
  auto limit = [&](CUdevice_attribute attr) { return static_cast<uint64_t>(a[attr]); };
  for (int i = 0; i < 3; ++i)
    if (grid[i] == 0 || block[i] == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t threads = uint64_t{block[0]} * block[1] * block[2];
  if (limit(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) == 0) return CUDA_SUCCESS;  // unknown
  if (threads > limit(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) ||
      block[0] > limit(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X) ||
      block[1] > limit(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y) ||
      block[2] > limit(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z) ||
      grid[0] > limit(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) ||
      grid[1] > limit(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y) ||
      grid[2] > limit(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z))
    return CUDA_ERROR_INVALID_VALUE;
  if (shmem > limit(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
    return CUDA_ERROR_INVALID_VALUE;
  if (shmem > limit(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)) {
    int opt_in = c.MaxDynamicShared(f);
    if (opt_in < 0 || shmem > static_cast<unsigned>(opt_in)) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult flyt::client::PackKernelParams(const FuncInfo& info, void** params, void** extra,
                                        wire::Writer& w) {
  if (params != nullptr) {
    w.Put<uint32_t>(info.param_bytes);
    uint8_t* blob = w.Grow(info.param_bytes);
    std::memset(blob, 0, info.param_bytes);
    for (size_t i = 0; i < info.params.size(); ++i) {
      if (params[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(blob + info.params[i].offset, params[i], info.params[i].size);
    }
  } else if (extra != nullptr) {
    const void* buf = nullptr;
    size_t size = 0;
    for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END && i < 16; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *static_cast<size_t*>(extra[i + 1]);
    }
    if (buf == nullptr || size > ops::kMaxParamBytes) return CUDA_ERROR_INVALID_VALUE;
    w.PutBlob(buf, size);
  } else {
    if (info.param_bytes != 0) return CUDA_ERROR_INVALID_VALUE;
    w.Put<uint32_t>(0);
  }
  return CUDA_SUCCESS;
}

namespace {
using flyt::client::FuncLayout;

constexpr int kNoRoute = -2;

// Several servers: a launch (or a query about one) goes to its stream's server (the
// current context's for a default stream); a library's kernel is that server's copy,
// a module's function must be of that server, as of that context natively. -1: one
// server; kNoRoute: the function has no copy there.
int LaunchRoute(Client& c, CUstream stream, CUfunction* f) {
  if (!c.multi()) return -1;
  const int route = c.StreamRoute(stream);
  const uint64_t there = flyt::client::FunctionOnServer(reinterpret_cast<uintptr_t>(*f), route);
  if (there == 0) return kNoRoute;
  *f = reinterpret_cast<CUfunction>(there);
  return route;
}

CUresult Launch(const char* name, CUfunction f, const unsigned grid[3], const unsigned block[3],
                unsigned shmem, CUstream stream, void** params, void** extra,
                const CUlaunchAttribute* attrs, unsigned nattrs, uint32_t flags, bool pt) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (nattrs > 64) return CUDA_ERROR_INVALID_VALUE;
  int route = LaunchRoute(c, stream, &f);
  if (route == kNoRoute) return flyt::client::NoCopyError();
  Client::RouteScope scope(route);
  CUresult unknown = CUDA_ERROR_INVALID_HANDLE;
  auto info = FuncLayout(reinterpret_cast<uintptr_t>(f), &unknown);
  if (info == nullptr) return unknown;
  if (info->is_kernel) flags |= ops::kLaunchIsKernel;
  CUresult invalid = CheckLaunchConfig(reinterpret_cast<uintptr_t>(f), grid, block, shmem);
  if (invalid != CUDA_SUCCESS) return invalid;
  wire::Writer w;
  EncodeLaunchHead(w, f, flags, grid, block, shmem, stream, attrs, nattrs);
  CUresult packed = flyt::client::PackKernelParams(*info, params, extra, w);
  if (packed != CUDA_SUCCESS) return packed;
  // A pointer argument into pinned memory the GPU has no mapping of yet (XLA hands its
  // kernels pinned buffers by their host addresses): mapped before the launch.
  if (params != nullptr && c.AnyUnmappedPinned()) {
    for (size_t i = 0; i < info->params.size(); ++i) {
      if (info->params[i].size != sizeof(uint64_t)) continue;
      uint64_t v = 0;
      std::memcpy(&v, params[i], sizeof(v));
      if (c.MaybeUnmappedPinned(v)) flyt::client::MapPinnedIfUnmapped(name, v);
    }
  }
  return c.Post(name, ops::kOpLaunch, w, pt ? wire::kFlagPerThread : 0);
}

CUresult LaunchEx(const char* name, const CUlaunchConfig* cfg, CUfunction f, void** params,
                  void** extra, bool pt) {
  if (cfg == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned grid[3] = {cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ};
  unsigned block[3] = {cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ};
  return Launch(name, f, grid, block, cfg->sharedMemBytes, cfg->hStream, params, extra, cfg->attrs,
                cfg->numAttrs, 0, pt);
}

}  // namespace

// --- libraries and modules

FLYT_API CUresult cuLibraryLoadData(CUlibrary* lib, const void* code, CUjit_option*, void**,
                                    unsigned int, CUlibraryOption*, void**, unsigned int) {
  if (lib == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = 0;
  CUresult rc = LoadImage(code, true, &h);
  if (rc == CUDA_SUCCESS) *lib = reinterpret_cast<CUlibrary>(h);
  return rc;
}

FLYT_API CUresult cuLibraryLoadFromFile(CUlibrary* lib, const char* path, CUjit_option* o, void** v,
                                        unsigned int n, CUlibraryOption* lo, void** lv,
                                        unsigned int ln) {
  std::vector<char> bytes;
  if (path == nullptr || !ReadFile(path, &bytes)) return CUDA_ERROR_FILE_NOT_FOUND;
  return cuLibraryLoadData(lib, bytes.data(), o, v, n, lo, lv, ln);
}

FLYT_API CUresult cuModuleLoadData(CUmodule* mod, const void* image) {
  if (mod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = 0;
  CUresult rc = LoadImage(image, false, &h);
  if (rc == CUDA_SUCCESS) *mod = reinterpret_cast<CUmodule>(h);
  return rc;
}

FLYT_API CUresult cuModuleLoadDataEx(CUmodule* mod, const void* image, unsigned int, CUjit_option*,
                                     void**) {
  return cuModuleLoadData(mod, image);
}

FLYT_API CUresult cuModuleLoadFatBinary(CUmodule* mod, const void* image) {
  return cuModuleLoadData(mod, image);
}

FLYT_API CUresult cuModuleLoad(CUmodule* mod, const char* path) {
  std::vector<char> bytes;
  if (path == nullptr || !ReadFile(path, &bytes)) return CUDA_ERROR_FILE_NOT_FOUND;
  return cuModuleLoadData(mod, bytes.data());
}

FLYT_API CUresult cuModuleUnload(CUmodule m) {
  // A library's module goes with its library (cuLibraryGetModule's documentation).
  bool owned = false;
  if (Client::Get().ImageKind(reinterpret_cast<uintptr_t>(m), nullptr, &owned) && owned)
    return CUDA_ERROR_NOT_PERMITTED;
  Client::Get().RemoveImage(reinterpret_cast<uintptr_t>(m));
  flyt::client::managed::UnmapOwnedBy(reinterpret_cast<uintptr_t>(m));  // its __managed__ variables
  return Forward<204, false, false>("cuModuleUnload", m);
}

FLYT_API CUresult cuLibraryUnload(CUlibrary l) {
  Client::Get().RemoveImage(reinterpret_cast<uintptr_t>(l));
  if (Client::Get().multi()) flyt::client::ForgetLibraryImage(reinterpret_cast<uintptr_t>(l));
  flyt::client::managed::UnmapOwnedBy(reinterpret_cast<uintptr_t>(l));  // its __managed__ variables
  return Forward<205, false, false>("cuLibraryUnload", l);
}

FLYT_API CUresult cuLibraryGetKernel(CUkernel* k, CUlibrary lib, const char* name) {
  if (k == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = Client::Get().FindInImage(reinterpret_cast<uintptr_t>(lib), name);
  if (h == 0) return CUDA_ERROR_NOT_FOUND;
  *k = reinterpret_cast<CUkernel>(h);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuModuleGetFunction(CUfunction* f, CUmodule mod, const char* name) {
  if (f == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = Client::Get().FindInImage(reinterpret_cast<uintptr_t>(mod), name);
  if (h == 0) return CUDA_ERROR_NOT_FOUND;
  *f = reinterpret_cast<CUfunction>(h);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuLibraryGetKernelCount(unsigned int* n, CUlibrary lib) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *n = static_cast<unsigned>(
      Client::Get().ImageFuncCount(reinterpret_cast<uintptr_t>(lib), nullptr));
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuLibraryEnumerateKernels(CUkernel* out, unsigned int n, CUlibrary lib) {
  std::vector<uint64_t> hs;
  Client::Get().ImageFuncCount(reinterpret_cast<uintptr_t>(lib), &hs);
  if (out == nullptr || n > hs.size()) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i) out[i] = reinterpret_cast<CUkernel>(hs[i]);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuModuleGetFunctionCount(unsigned int* n, CUmodule mod) {
  return cuLibraryGetKernelCount(n, reinterpret_cast<CUlibrary>(mod));
}

FLYT_API CUresult cuModuleEnumerateFunctions(CUfunction* out, unsigned int n, CUmodule mod) {
  return cuLibraryEnumerateKernels(reinterpret_cast<CUkernel*>(out), n,
                                   reinterpret_cast<CUlibrary>(mod));
}

FLYT_API CUresult cuKernelGetFunction(CUfunction* f, CUkernel k) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto info = c.Func(reinterpret_cast<uintptr_t>(k));
  if (info == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Several servers: the kernel's copy on the current context's server.
  int server = -1;
  if (c.multi()) {
    server = c.RouteNow();
    const uint64_t there = flyt::client::KernelOnServer(reinterpret_cast<uintptr_t>(k), server);
    if (there == 0) return flyt::client::NoCopyError();
    k = reinterpret_cast<CUkernel>(there);
  }
  Client::RouteScope scope(server);
  // cudart asks before every launch of a CUkernel; the answer is fixed per context.
  const uint64_t ctx = reinterpret_cast<uintptr_t>(flyt::client::CurrentContext());
  uint64_t h = 0;
  if (QueryCache::Get().FindFunction(reinterpret_cast<uintptr_t>(k), ctx, &h)) {
    *f = reinterpret_cast<CUfunction>(h);
    return CUDA_SUCCESS;
  }
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(k));
  std::vector<uint8_t> reply;
  CUresult rc = c.Call("cuKernelGetFunction", ops::kOpKernelGetFunction, w, ReplySink{&reply});
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  if (!r.Get(&h)) return CUDA_ERROR_UNKNOWN;
  h = Client::Tag(h, server);
  // A driver may answer with the kernel's own value (the sim does): it stays the kernel.
  if (h != reinterpret_cast<uintptr_t>(k)) {
    if (c.multi()) c.LinkKernelHandles(reinterpret_cast<uintptr_t>(k), h);
    FuncInfo copy = *info;
    copy.is_kernel = false;
    c.AliasFunc(h, std::make_shared<const FuncInfo>(std::move(copy)));
  }
  QueryCache::Get().PutFunction(reinterpret_cast<uintptr_t>(k), ctx, h);
  *f = reinterpret_cast<CUfunction>(h);
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuKernelGetName(const char** name, CUkernel k) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto info = Client::Get().Func(reinterpret_cast<uintptr_t>(k));
  if (info == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = info->name.c_str();  // lives as long as the library is loaded
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuFuncGetName(const char** name, CUfunction f) {
  return cuKernelGetName(name, reinterpret_cast<CUkernel>(f));
}

FLYT_API CUresult cuKernelGetParamInfo(CUkernel k, size_t i, size_t* off, size_t* size) {
  auto info = FuncLayout(reinterpret_cast<uintptr_t>(k));
  if (info == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (i >= info->params.size()) return CUDA_ERROR_INVALID_VALUE;
  if (off) *off = info->params[i].offset;
  if (size) *size = info->params[i].size;
  return CUDA_SUCCESS;
}

FLYT_API CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t* off, size_t* size) {
  return cuKernelGetParamInfo(reinterpret_cast<CUkernel>(f), i, off, size);
}

// --- launches

#define FLYT_LAUNCH_PAIR(legacy, pt, coop)                                                      \
  FLYT_API CUresult legacy(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,    \
                           unsigned by, unsigned bz, unsigned shmem, CUstream s, void** params, \
                           void** extra) {                                                      \
    unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};                                          \
    return Launch(#legacy, f, g, b, shmem, s, params, extra, nullptr, 0, coop, false);          \
  }                                                                                             \
  FLYT_API CUresult pt(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,        \
                       unsigned by, unsigned bz, unsigned shmem, CUstream s, void** params,     \
                       void** extra) {                                                          \
    unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};                                          \
    return Launch(#pt, f, g, b, shmem, s, params, extra, nullptr, 0, coop, true);               \
  }

FLYT_LAUNCH_PAIR(cuLaunchKernel, cuLaunchKernel_ptsz, 0)

FLYT_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                            unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                            CUstream s, void** params) {
  unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
  return Launch("cuLaunchCooperativeKernel", f, g, b, shmem, s, params, nullptr, nullptr, 0,
                ops::kLaunchCooperative, false);
}
FLYT_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                 unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                                 unsigned shmem, CUstream s, void** params) {
  unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
  return Launch("cuLaunchCooperativeKernel_ptsz", f, g, b, shmem, s, params, nullptr, nullptr, 0,
                ops::kLaunchCooperative, true);
}

FLYT_API CUresult cuLaunchKernelEx(const CUlaunchConfig* cfg, CUfunction f, void** params,
                                   void** extra) {
  return LaunchEx("cuLaunchKernelEx", cfg, f, params, extra, false);
}
FLYT_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* cfg, CUfunction f, void** params,
                                        void** extra) {
  return LaunchEx("cuLaunchKernelEx_ptsz", cfg, f, params, extra, true);
}

// --- host functions: run on this process's callback thread when the stream
// reaches them on the GPU (see Client::EnqueueHostFunc).

FLYT_API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Client::Get().EnqueueHostFunc(
      s, [fn, data] { fn(data); }, false);
}
FLYT_API CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void* data) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Client::Get().EnqueueHostFunc(
      s, [fn, data] { fn(data); }, true);
}
FLYT_API CUresult cuStreamAddCallback(CUstream s, CUstreamCallback cb, void* data, unsigned flags) {
  if (cb == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return Client::Get().EnqueueHostFunc(
      s, [s, cb, data] { cb(s, CUDA_SUCCESS, data); }, false);
}
FLYT_API CUresult cuStreamAddCallback_ptsz(CUstream s, CUstreamCallback cb, void* data,
                                           unsigned flags) {
  if (cb == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return Client::Get().EnqueueHostFunc(
      s, [s, cb, data] { cb(s, CUDA_SUCCESS, data); }, true);
}

namespace {
// A cluster question about a launch of `f` with `cfg` that the server's driver answers
// (one i32): its launch head, after the sub-operation byte when `misc` is set.
CUresult AskClusterQuery(const char* name, uint16_t op, const uint8_t* misc, CUfunction f,
                         const CUlaunchConfig* cfg, int* out) {
  // Several servers: asked where the function lives (a kernel: the current context's
  // copy), whatever the config's stream, which the answer does not depend on (cuBLAS
  // asks with a stream of the device it started on).
  Client& c = Client::Get();
  CUstream stream = cfg->hStream;
  int route = -1;
  if (c.multi()) {
    f = flyt::client::FunctionHere(f);
    route = Client::TagOf(reinterpret_cast<uintptr_t>(f));
    const uint64_t s = reinterpret_cast<uintptr_t>(stream);
    if (s > 2 && Client::TagOf(s) != route) stream = nullptr;
  }
  Client::RouteScope scope(route);
  auto info = FuncLayout(reinterpret_cast<uintptr_t>(f));
  if (info == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  unsigned grid[3] = {cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ};
  unsigned block[3] = {cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ};
  wire::Writer w;
  if (misc != nullptr) w.Put<uint8_t>(*misc);
  EncodeLaunchHead(w, f, info->is_kernel ? uint32_t{ops::kLaunchIsKernel} : 0u, grid, block,
                   cfg->sharedMemBytes, stream, cfg->attrs, cfg->numAttrs);
  std::vector<uint8_t> reply;
  CUresult rc = c.Call(name, op, w, ReplySink{&reply});
  wire::Reader r(reply.data(), reply.size());
  int32_t v = 0;
  if (rc == CUDA_SUCCESS && !r.Get(&v)) rc = CUDA_ERROR_UNKNOWN;
  if (rc == CUDA_SUCCESS) *out = v;
  return rc;
}
}  // namespace

FLYT_API CUresult cuOccupancyMaxActiveClusters(int* n, CUfunction f, const CUlaunchConfig* cfg) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (n == nullptr || cfg == nullptr || cfg->numAttrs > 64) return CUDA_ERROR_INVALID_VALUE;
  return AskClusterQuery("cuOccupancyMaxActiveClusters", ops::kOpMaxActiveClusters, nullptr, f, cfg,
                         n);
}

// The largest cluster a launch of `f` with `cfg` could have (the server's driver answers).
FLYT_API CUresult cuOccupancyMaxPotentialClusterSize(int* size, CUfunction f,
                                                     const CUlaunchConfig* cfg) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (size == nullptr || cfg == nullptr || cfg->numAttrs > 64 ||
      (cfg->numAttrs > 0 && cfg->attrs == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  const uint8_t sub = ops::kDriverMiscMaxPotentialClusterSize;
  return AskClusterQuery("cuOccupancyMaxPotentialClusterSize", ops::kOpDriverMisc, &sub, f, cfg,
                         size);
}

// Function attributes: the dynamic shared memory opt-in is remembered so that
// launches above 48 KiB without it fail at once, as with the driver. Every
// answer is kept (QueryCache) until an attribute is set.
FLYT_API CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attr, int value) {
  f = flyt::client::FunctionHere(f);
  QueryCache::Get().AttributeSet(reinterpret_cast<uintptr_t>(f), false, attr, -1, value);
  CUresult rc = Forward<191, false, false>("cuFuncSetAttribute", f, attr, value);
  if (rc == CUDA_SUCCESS && attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
    Client::Get().SetMaxDynamicShared(reinterpret_cast<uintptr_t>(f), value);
  return rc;
}
FLYT_API CUresult cuKernelSetAttribute(CUfunction_attribute attr, int value, CUkernel k,
                                       CUdevice dev) {
  QueryCache::Get().AttributeSet(reinterpret_cast<uintptr_t>(k), true, attr, dev, value);
  CUresult rc = Forward<194, false, false>("cuKernelSetAttribute", attr, value, k, dev);
  if (rc == CUDA_SUCCESS && attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    Client& c = Client::Get();
    // Several servers: launches on that device use the kernel's copy on its server,
    // linked to this handle when it is made.
    if (c.multi())
      flyt::client::KernelOnServer(reinterpret_cast<uintptr_t>(k), c.DeviceServer(dev));
    c.SetMaxDynamicShared(reinterpret_cast<uintptr_t>(k), value);
  }
  return rc;
}
FLYT_API CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attr, CUfunction f) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  f = flyt::client::FunctionHere(f);
  QueryCache& q = QueryCache::Get();
  const uint64_t h = reinterpret_cast<uintptr_t>(f);
  if (q.FindAttribute(h, false, attr, -1, value)) return CUDA_SUCCESS;
  CUresult rc = Forward<190, true, false>("cuFuncGetAttribute", value, attr, f);
  if (rc == CUDA_SUCCESS) q.PutAttribute(h, false, attr, -1, *value);
  return rc;
}
FLYT_API CUresult cuKernelGetAttribute(int* value, CUfunction_attribute attr, CUkernel k,
                                       CUdevice dev) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  QueryCache& q = QueryCache::Get();
  const uint64_t h = reinterpret_cast<uintptr_t>(k);
  if (q.FindAttribute(h, true, attr, dev, value)) return CUDA_SUCCESS;
  CUresult rc = Forward<193, true, false>("cuKernelGetAttribute", value, attr, k, dev);
  if (rc == CUDA_SUCCESS) q.PutAttribute(h, true, attr, dev, *value);
  return rc;
}

// Cache configurations change what the occupancy calculator answers.
FLYT_API CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache config) {
  QueryCache::Get().CacheConfigChanged();
  return Forward<192, false, false>("cuFuncSetCacheConfig", f, config);
}
FLYT_API CUresult cuKernelSetCacheConfig(CUkernel k, CUfunc_cache config, CUdevice dev) {
  QueryCache::Get().CacheConfigChanged();
  return Forward<195, false, false>("cuKernelSetCacheConfig", k, config, dev);
}
FLYT_API CUresult cuCtxSetCacheConfig(CUfunc_cache config) {
  QueryCache::Get().CacheConfigChanged();
  return Forward<104, false, false>("cuCtxSetCacheConfig", config);
}

namespace {
CUresult Occupancy(int* blocks, CUfunction f, int block, size_t smem, unsigned flags,
                   bool with_flags) {
  if (blocks == nullptr) return CUDA_ERROR_INVALID_VALUE;
  f = flyt::client::FunctionHere(f);
  QueryCache& q = QueryCache::Get();
  const uint64_t h = reinterpret_cast<uintptr_t>(f);
  if (q.FindOccupancy(h, block, smem, flags, blocks)) return CUDA_SUCCESS;
  CUresult rc =
      with_flags ? Forward<197, true, false>("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
                                             blocks, f, block, smem, flags)
                 : Forward<196, true, false>("cuOccupancyMaxActiveBlocksPerMultiprocessor", blocks,
                                             f, block, smem);
  if (rc == CUDA_SUCCESS) q.PutOccupancy(h, block, smem, flags, *blocks);
  return rc;
}
}  // namespace

FLYT_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction f, int block,
                                                              size_t smem) {
  return Occupancy(blocks, f, block, smem, 0, false);
}
FLYT_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, CUfunction f,
                                                                       int block, size_t smem,
                                                                       unsigned int flags) {
  return Occupancy(blocks, f, block, smem, flags, true);
}

namespace {
// The block size with the most resident threads per SM, searched here rather
// than on the server: the app's callback (dynamic shared memory per block
// size) runs in this process. The search is the CUDA runtime's
// (cudaOccupancyMaxPotentialBlockSizeVariableSMemWithFlags): from the largest
// block size down in warps, keeping the first best; each step is one occupancy
// query, answered locally once seen.
CUresult PotentialBlockSize(int* min_grid, int* block_size, CUfunction f,
                            CUoccupancyB2DSize smem_of, size_t smem, int limit, unsigned flags) {
  if (min_grid == nullptr || block_size == nullptr || f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  int dev = c.ContextDevice(flyt::client::CurrentContext());
  const flyt::ops::DeviceInfo* info = c.device(dev < 0 ? 0 : dev);
  if (info == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const int sms = info->attributes[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT];
  const int warp = info->attributes[CU_DEVICE_ATTRIBUTE_WARP_SIZE];
  const int sm_threads = info->attributes[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR];
  int func_max = 0;
  CUresult rc = cuFuncGetAttribute(&func_max, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f);
  if (rc != CUDA_SUCCESS) return rc;
  if (warp <= 0 || func_max <= 0) return CUDA_ERROR_INVALID_VALUE;
  const int cap = limit > 0 ? std::min(limit, func_max) : func_max;
  int best_block = 0, best_blocks = 0, best_threads = 0;
  for (int aligned = (cap + warp - 1) / warp * warp; aligned > 0; aligned -= warp) {
    const int try_block = std::min(cap, aligned);
    const size_t dyn = smem_of != nullptr ? smem_of(try_block) : smem;
    int blocks = 0;
    rc = Occupancy(&blocks, f, try_block, dyn, flags, true);
    if (rc != CUDA_SUCCESS) return rc;
    if (blocks * try_block > best_threads) {
      best_block = try_block;
      best_blocks = blocks;
      best_threads = blocks * try_block;
    }
    if (best_threads == sm_threads) break;
  }
  *min_grid = best_blocks * sms;
  *block_size = best_block;
  return CUDA_SUCCESS;
}
}  // namespace

FLYT_API CUresult cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block_size, CUfunction f,
                                                   CUoccupancyB2DSize smem_of, size_t smem,
                                                   int limit) {
  return PotentialBlockSize(min_grid, block_size, f, smem_of, smem, limit, 0);
}
FLYT_API CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block_size,
                                                            CUfunction f,
                                                            CUoccupancyB2DSize smem_of, size_t smem,
                                                            int limit, unsigned int flags) {
  return PotentialBlockSize(min_grid, block_size, f, smem_of, smem, limit, flags);
}

// A stream whose work is known to be finished (Client::StreamDrained) is
// answered here; every other synchronize goes to the server.
namespace {
CUresult StreamSynchronize(const char* name, CUstream s, bool pt) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (c.StreamDrained(s, pt)) return CUDA_SUCCESS;
  CUresult rc = pt ? Forward<113, true, true>(name, s) : Forward<113, true, false>(name, s);
  if (rc == CUDA_SUCCESS && !c.AnyCapture()) c.NoteStreamDrained(s, pt);
  return rc;
}
}  // namespace

FLYT_API CUresult cuStreamSynchronize(CUstream s) {
  return StreamSynchronize("cuStreamSynchronize", s, false);
}
FLYT_API CUresult cuStreamSynchronize_ptsz(CUstream s) {
  return StreamSynchronize("cuStreamSynchronize_ptsz", s, true);
}

// Queries: a plain synchronous call (they also flush queued work, so polling
// loops make progress).
FLYT_API CUresult cuEventQuery(CUevent e) { return Forward<135, true, false>("cuEventQuery", e); }
FLYT_API CUresult cuStreamQuery(CUstream s) {
  return Forward<114, true, false>("cuStreamQuery", s);
}
FLYT_API CUresult cuStreamQuery_ptsz(CUstream s) {
  return Forward<114, true, true>("cuStreamQuery_ptsz", s);
}

// Lazy loading is the driver's default; CUDA_MODULE_LOADING=EAGER asks for eager.
FLYT_API CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const char* v = std::getenv("CUDA_MODULE_LOADING");
  *mode = (v != nullptr && std::strcmp(v, "EAGER") == 0) ? CU_MODULE_EAGER_LOADING
                                                         : CU_MODULE_LAZY_LOADING;
  return CUDA_SUCCESS;
}
