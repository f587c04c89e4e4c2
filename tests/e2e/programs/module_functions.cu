// module_functions: the driver's private table 6e163fbe-b958-444d-835c-e182aff1991e as
// cuFFT uses it (docs/export_tables.md): cuGetExportTable, a size that covers 8 slots,
// then slot 7 `(ctx, module, each(opaque, function), opaque)` on modules loaded with
// cuModuleLoadData, which hands each function of the module to `each` and returns how
// many. Checked: a module of one function gives 1 and the function cuModuleGetFunction
// finds, which launches; a module of two gives both; NULL contexts are accepted as cuFFT
// passes its own. Prints key=value lines and "module_functions: PASS". What the kernel
// computes is printed natively only (the sim runs no PTX).
#include <cuda.h>  // driver types only; the program does not link libcuda

#include <algorithm>
#include <string>
#include <vector>

#include "e2e_driver.h"

namespace {

struct Driver {
  decltype(&::cuGetExportTable) export_table;
  decltype(&::cuModuleLoadData) module_load;
  decltype(&::cuModuleUnload) module_unload;
  decltype(&::cuModuleGetFunction) module_function;
  decltype(&::cuCtxGetCurrent) ctx_current;
  decltype(&::cuLaunchKernel) launch;
};
Driver g_cu;

using EachFn = void (*)(void* opaque, CUfunction f);
using ModuleFunctionsFn = int (*)(CUcontext ctx, CUmodule module, EachFn each, void* opaque);

void Collect(void* opaque, CUfunction f) {
  static_cast<std::vector<CUfunction>*>(opaque)->push_back(f);
}

// The add_one module with a second entry appended (add_two: p[i] += 2).
std::string TwoFunctionPtx() {
  std::string ptx = e2e::kAddOnePtx;
  std::string second = ptx.substr(ptx.find(".visible .entry"));
  for (std::string from : {"add_one", "%r6, 1;"}) {
    std::string to = from == "add_one" ? "add_two" : "%r6, 2;";
    for (size_t at = second.find(from); at != std::string::npos; at = second.find(from, at))
      second.replace(at, from.size(), to);
  }
  return ptx + second;
}

}  // namespace

int main() {
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  e2e::ResolveDriver("cuGetExportTable", &g_cu.export_table);
  e2e::ResolveDriver("cuModuleLoadData", &g_cu.module_load);
  e2e::ResolveDriver("cuModuleUnload", &g_cu.module_unload);
  e2e::ResolveDriver("cuModuleGetFunction", &g_cu.module_function);
  e2e::ResolveDriver("cuCtxGetCurrent", &g_cu.ctx_current);
  e2e::ResolveDriver("cuLaunchKernel", &g_cu.launch);
  CK(cudaFree(nullptr));
  const bool flyt = e2e::UnderFlyt();
  printf("under_flyt=%d\n", flyt ? 1 : 0);

  const CUuuid id = {{static_cast<char>(0x6e), 0x16, 0x3f, static_cast<char>(0xbe),
                      static_cast<char>(0xb9), 0x58, 0x44, 0x4d, static_cast<char>(0x83), 0x5c,
                      static_cast<char>(0xe1), static_cast<char>(0x82), static_cast<char>(0xaf),
                      static_cast<char>(0xf1), static_cast<char>(0x99), 0x1e}};
  const void* table = nullptr;
  CU(g_cu.export_table(&table, &id));
  EXPECT(table != nullptr, "cuGetExportTable gave no table");
  const uintptr_t size = reinterpret_cast<const uintptr_t*>(table)[0];
  printf("table.covers_slot7=%d\n", size >= 8 * sizeof(void*) ? 1 : 0);
  auto each_function = reinterpret_cast<ModuleFunctionsFn>(
      const_cast<void*>(reinterpret_cast<const void* const*>(table)[7]));

  CUcontext ctx = nullptr;
  CU(g_cu.ctx_current(&ctx));

  // One function, as cuFFT's generated kernels come.
  CUmodule one = nullptr;
  CU(g_cu.module_load(&one, e2e::kAddOnePtx));
  std::vector<CUfunction> got;
  int n = each_function(ctx, one, Collect, &got);
  CUfunction by_name = nullptr;
  CU(g_cu.module_function(&by_name, one, "add_one"));
  printf("one.result=%d\none.calls=%zu\n", n, got.size());
  printf("one.same_as_by_name=%d\n", got.size() == 1 && got[0] == by_name ? 1 : 0);

  // The function handed out launches like any other.
  unsigned* dev = nullptr;
  const unsigned kCount = 1000;
  std::vector<unsigned> host(kCount, 41);
  CK(cudaMalloc(&dev, kCount * sizeof(unsigned)));
  CK(cudaMemcpy(dev, host.data(), kCount * sizeof(unsigned), cudaMemcpyHostToDevice));
  unsigned count = kCount;
  void* args[] = {&dev, &count};
  CU(g_cu.launch(got.empty() ? by_name : got[0], (kCount + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr,
                 args, nullptr));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(host.data(), dev, kCount * sizeof(unsigned), cudaMemcpyDeviceToHost));
  printf("one.launched=1\n");
  if (!flyt || getenv("FLYT_E2E_NATIVE") != nullptr)
    fprintf(stderr, "first value after launch: %u\n", host[0]);

  // A NULL context: cuFFT passes the context it keeps, which may be NULL before use.
  got.clear();
  n = each_function(nullptr, one, Collect, &got);
  printf("null_ctx.result=%d\n", n);

  // Two functions: both, each once.
  CUmodule two = nullptr;
  std::string ptx2 = TwoFunctionPtx();
  CU(g_cu.module_load(&two, ptx2.c_str()));
  got.clear();
  n = each_function(ctx, two, Collect, &got);
  CUfunction f1 = nullptr, f2 = nullptr;
  CU(g_cu.module_function(&f1, two, "add_one"));
  CU(g_cu.module_function(&f2, two, "add_two"));
  std::sort(got.begin(), got.end());
  std::vector<CUfunction> want = {f1, f2};
  std::sort(want.begin(), want.end());
  printf("two.result=%d\ntwo.same_set=%d\n", n, got == want ? 1 : 0);

  CU(g_cu.module_unload(one));
  CU(g_cu.module_unload(two));
  CK(cudaFree(dev));
  printf("module_functions: PASS\n");
  return 0;
}
