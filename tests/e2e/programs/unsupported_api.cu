// unsupported_api: resolves driver functions Flyt does not implement through
// cudaGetDriverEntryPointByVersion (and, where the client library exports them, dlsym),
// calls them, and expects CUDA_ERROR_NOT_SUPPORTED (801) without a crash; asks
// cuGetExportTable for NVRTC's compile cache (da9151d3, served) and for one nobody
// serves; then shows the session still works with an ordinary allocation and copy round trip.
// Prints "unsupported_api: PASS".
#include <cuda.h>  // driver types only; the program does not link libcuda
#include <dlfcn.h>

#include <vector>

#include "e2e_common.h"

namespace {

typedef CUresult (*MapResourcesFn)(unsigned int, CUgraphicsResource*, CUstream);
typedef CUresult (*UnregisterResourceFn)(CUgraphicsResource);
typedef CUresult (*GetExportTableFn)(const void**, const CUuuid*);

void* Resolve(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, CUDART_VERSION, cudaEnableDefault, &status);
  printf("entry_point %s error=%s status=%d found=%d\n", symbol, cudaGetErrorName(err),
         static_cast<int>(status), fn != nullptr);
  EXPECT(err == cudaSuccess && status == cudaDriverEntryPointSuccess && fn != nullptr,
         "cudaGetDriverEntryPointByVersion(%s) gave error %d (%s), status %d, fn %p: the "
         "client should hand out a stub that answers CUDA_ERROR_NOT_SUPPORTED",
         symbol, static_cast<int>(err), cudaGetErrorName(err), static_cast<int>(status), fn);
  return fn;
}

void ExpectNotSupported(const char* what, CUresult r) {
  printf("call %s result=%d\n", what, static_cast<int>(r));
  EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "%s returned %d, want %d (CUDA_ERROR_NOT_SUPPORTED)", what,
         static_cast<int>(r), static_cast<int>(CUDA_ERROR_NOT_SUPPORTED));
}

}  // namespace

int main() {
  e2e::Init("unsupported_api");

  e2e::Step("initialise the runtime");
  CK(cudaFree(nullptr));

  e2e::Step("cuGraphicsMapResources through cudaGetDriverEntryPointByVersion");
  auto map_fn = reinterpret_cast<MapResourcesFn>(Resolve("cuGraphicsMapResources"));
  CUgraphicsResource res = nullptr;
  // Called twice: the client logs the warning once per symbol.
  ExpectNotSupported("cuGraphicsMapResources#1", map_fn(1, &res, nullptr));
  ExpectNotSupported("cuGraphicsMapResources#2", map_fn(1, &res, nullptr));

  e2e::Step("cuGraphicsUnregisterResource through cudaGetDriverEntryPointByVersion");
  auto unreg_fn = reinterpret_cast<UnregisterResourceFn>(Resolve("cuGraphicsUnregisterResource"));
  ExpectNotSupported("cuGraphicsUnregisterResource", unreg_fn(nullptr));

  e2e::Step("dlsym on the loaded libcuda.so.1");
  if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    void* sym = dlsym(lib, "cuGraphicsMapResources");
    printf("dlsym cuGraphicsMapResources found=%d\n", sym != nullptr);
    if (sym)
      ExpectNotSupported("dlsym(cuGraphicsMapResources)",
                         reinterpret_cast<MapResourcesFn>(sym)(1, &res, nullptr));
    dlclose(lib);
  } else {
    printf("dlopen libcuda.so.1 RTLD_NOLOAD failed: %s\n", dlerror());
  }

  e2e::Step("cuGetExportTable refusals");
  auto table_fn = reinterpret_cast<GetExportTableFn>(Resolve("cuGetExportTable"));
  // NVRTC's compile cache table is served as the driver serves it (7 slots). The other
  // UUID is made up: refused with one warning naming it.
  const CUuuid nvrtc_table = {{'\xda', '\x91', '\x51', '\xd3', '\x3a', '\xe6', '\xcc', '\x41',
                               '\xa5', '\xc0', '\x4f', '\x26', '\xd5', '\x33', '\xe3', '\x28'}};
  const CUuuid made_up = {{'\x0f', '\x1e', '\x2d', '\x3c', '\x4b', '\x5a', '\x69', '\x78', '\x87',
                           '\x96', '\xa5', '\xb4', '\xc3', '\xd2', '\xe1', '\xf0'}};
  const void* cache_table = nullptr;
  EXPECT(table_fn(&cache_table, &nvrtc_table) == CUDA_SUCCESS && cache_table != nullptr,
         "NVRTC's compile cache table was not served");
  EXPECT(*static_cast<const size_t*>(cache_table) == 56, "its size slot reads %zu, want 56",
         *static_cast<const size_t*>(cache_table));
  for (const CUuuid* id : {&made_up, &made_up}) {
    const void* table = &table;
    ExpectNotSupported("cuGetExportTable", table_fn(&table, id));
    EXPECT(table == nullptr, "a refused export table left the output at %p", table);
  }

  e2e::Step("the session still works");
  CK(cudaGetLastError());
  const size_t n = (1 << 20) + 3;
  std::vector<unsigned char> src(n), got(n, 0);
  e2e::Fill(src.data(), n, 801);
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, n));
  CK(cudaMemcpy(d, src.data(), n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(got.data(), d, n, cudaMemcpyDeviceToHost));
  EXPECT_SAME(got.data(), src.data(), n, "round trip after the unsupported calls");
  CK(cudaFree(d));
  CK(cudaDeviceSynchronize());
  e2e::Pass();
  return 0;
}
