// jit_link: the JIT linker as NVRTC + JIT-LTO programs use it, through driver
// entry points (cudaGetDriverEntryPointByVersion).
//
//   jit_link   a PTX string linked with info and error log buffers, verbose
//              log, wall time: cuLinkCreate, cuLinkAddData, cuLinkComplete;
//              the output sizes stay within the buffers, the cubin is loaded
//              with cuModuleLoadData, its kernel fetched and launched, and it
//              stays valid (same bytes) until cuLinkDestroy. The same PTX
//              written to a temp file, through the 5.5 ABIs (cuLinkCreate,
//              cuLinkAddFile asked at version 5050): loaded and launched too.
//              Garbage given as PTX fails at cuLinkAddData with an error and
//              an error log; a missing file fails at cuLinkAddFile;
//              completing with nothing valid added is printed. Under Flyt only (the
//              driver may crash): a destroyed state is refused.
//   jit_link leak  creates a link state, adds the PTX and exits without
//              cuLinkDestroy (prints "leaving"): the server destroys it.
//
// Prints key=value lines and "jit_link: PASS". What the kernels compute is
// never checked (valid under the sim, where no kernel runs).
#include <cuda.h>  // driver types only; the program does not link libcuda
#include <dlfcn.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "e2e_driver.h"

namespace {

struct Driver {
  decltype(&::cuLinkCreate_v2) link_create;
  decltype(&::cuLinkAddData_v2) link_add_data;
  decltype(&::cuLinkAddFile_v2) link_add_file;
  decltype(&::cuLinkCreate_v2) link_create_55;     // the 5.5 ABIs, same signatures
  decltype(&::cuLinkAddFile_v2) link_add_file_55;  //
  decltype(&::cuLinkComplete) link_complete;
  decltype(&::cuLinkDestroy) link_destroy;
  decltype(&::cuModuleLoadData) module_load;
  decltype(&::cuModuleUnload) module_unload;
  decltype(&::cuModuleGetFunction) module_function;
  decltype(&::cuLaunchKernel) launch;
  // cuCtxSynchronize at this CUDA version is cuCtxSynchronize_v2 (it takes a
  // context): asked by version, the driver hands out the ABI of that version.
  CUresult (*sync)(CUcontext);
};

Driver g_cu;

constexpr unsigned kLogBytes = 8192;

// Options of a link with both logs; the arrays live as long as the link.
struct LinkOptions {
  char info[kLogBytes];
  char error[kLogBytes];
  CUjit_option options[6];
  void* values[6];
  unsigned count = 0;
  void Init(bool verbose) {
    memset(info, 0, sizeof(info));
    memset(error, 0, sizeof(error));
    count = 0;
    Add(CU_JIT_INFO_LOG_BUFFER, info);
    Add(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, reinterpret_cast<void*>(uintptr_t{kLogBytes}));
    Add(CU_JIT_ERROR_LOG_BUFFER, error);
    Add(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, reinterpret_cast<void*>(uintptr_t{kLogBytes}));
    Add(CU_JIT_WALL_TIME, nullptr);
    if (verbose) Add(CU_JIT_LOG_VERBOSE, reinterpret_cast<void*>(uintptr_t{1}));
  }
  void Add(CUjit_option o, void* v) {
    options[count] = o;
    values[count] = v;
    ++count;
  }
  size_t Out(CUjit_option o) const {
    for (unsigned i = 0; i < count; ++i)
      if (options[i] == o) return static_cast<unsigned>(reinterpret_cast<uintptr_t>(values[i]));
    return 0;
  }
};

std::string FirstLine(const char* s) {
  std::string line(s, strnlen(s, kLogBytes));
  size_t nl = line.find('\n');
  if (nl != std::string::npos) line.resize(nl);
  return line;
}

// Loads `image`, fetches add_one and launches it over a small buffer.
void LoadAndLaunch(const void* image, const char* what) {
  CUmodule mod = nullptr;
  CU(g_cu.module_load(&mod, image));
  CUfunction fn = nullptr;
  CU(g_cu.module_function(&fn, mod, "add_one"));
  unsigned* d = nullptr;
  unsigned n = 256;
  CK(cudaMalloc(&d, n * sizeof(unsigned)));
  CK(cudaMemset(d, 0, n * sizeof(unsigned)));
  CUdeviceptr dp = reinterpret_cast<CUdeviceptr>(d);
  void* params[] = {&dp, &n};
  CU(g_cu.launch(fn, 1, 1, 1, n, 1, 1, 0, nullptr, params, nullptr));
  CU(g_cu.sync(nullptr));  // the current context
  CK(cudaFree(d));
  CU(g_cu.module_unload(mod));
  printf("%s.launched=1\n", what);
}

}  // namespace

int main(int argc, char** argv) {
  e2e::Init("jit_link");
  bool leak = argc > 1 && strcmp(argv[1], "leak") == 0;
  e2e::Step("resolve");
  CK(cudaFree(nullptr));  // the primary context, current
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  e2e::ResolveDriver("cuLinkCreate", &g_cu.link_create);
  e2e::ResolveDriver("cuLinkAddData", &g_cu.link_add_data);
  e2e::ResolveDriver("cuLinkAddFile", &g_cu.link_add_file);
  e2e::ResolveDriver("cuLinkCreate", &g_cu.link_create_55, 5050);
  e2e::ResolveDriver("cuLinkAddFile", &g_cu.link_add_file_55, 5050);
  e2e::ResolveDriver("cuLinkComplete", &g_cu.link_complete);
  e2e::ResolveDriver("cuLinkDestroy", &g_cu.link_destroy);
  e2e::ResolveDriver("cuModuleLoadData", &g_cu.module_load);
  e2e::ResolveDriver("cuModuleUnload", &g_cu.module_unload);
  e2e::ResolveDriver("cuModuleGetFunction", &g_cu.module_function);
  e2e::ResolveDriver("cuLaunchKernel", &g_cu.launch);
  e2e::ResolveDriver("cuCtxSynchronize", &g_cu.sync);
  bool flyt = e2e::UnderFlyt();
  printf("under_flyt=%d\n", flyt ? 1 : 0);

  if (leak) {  // a link state left to the server to destroy
    e2e::Step("leak");
    CUlinkState left = nullptr;
    CU(g_cu.link_create(0, nullptr, nullptr, &left));
    CU(g_cu.link_add_data(left, CU_JIT_INPUT_PTX, const_cast<char*>(e2e::kAddOnePtx),
                          sizeof(e2e::kAddOnePtx), "add_one.ptx", 0, nullptr, nullptr));
    printf("leaving\n");
    e2e::Pass();
    return 0;
  }

  // 1. A PTX string, with logs.
  e2e::Step("link data");
  static LinkOptions opt;
  opt.Init(true);
  CUlinkState state = nullptr;
  CU(g_cu.link_create(opt.count, opt.options, opt.values, &state));
  EXPECT(state != nullptr, "no link state");
  CU(g_cu.link_add_data(state, CU_JIT_INPUT_PTX, const_cast<char*>(e2e::kAddOnePtx),
                        sizeof(e2e::kAddOnePtx), "add_one.ptx", 0, nullptr, nullptr));
  void* cubin = nullptr;
  size_t cubin_size = 0;
  CU(g_cu.link_complete(state, &cubin, &cubin_size));
  EXPECT(cubin != nullptr && cubin_size > 0, "cuLinkComplete gave %p, %zu bytes", cubin,
         cubin_size);
  size_t info_out = opt.Out(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
  size_t error_out = opt.Out(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
  EXPECT(info_out <= kLogBytes && error_out <= kLogBytes, "log sizes out: info %zu, error %zu",
         info_out, error_out);
  EXPECT(opt.info[0] != '\0', "a verbose link left no info log");
  EXPECT(opt.error[0] == '\0', "a good link has an error log: %.200s", opt.error);
  printf("data.cubin_bytes=%zu\n", cubin_size);
  printf("data.info_log=%s\n", FirstLine(opt.info).c_str());
  std::vector<unsigned char> copy(static_cast<unsigned char*>(cubin),
                                  static_cast<unsigned char*>(cubin) + cubin_size);
  LoadAndLaunch(cubin, "data");
  EXPECT_SAME(cubin, copy.data(), cubin_size, "the cubin before cuLinkDestroy");
  CU(g_cu.link_destroy(state));

  // 2. The same PTX from a file, through the 5.5 ABIs.
  e2e::Step("link file");
  char path[] = "/tmp/jit_link_XXXXXX.ptx";
  int fd = mkstemps(path, 4);
  EXPECT(fd >= 0, "mkstemps failed");
  size_t len = strlen(e2e::kAddOnePtx);
  EXPECT(write(fd, e2e::kAddOnePtx, len) == static_cast<ssize_t>(len), "cannot write %s", path);
  close(fd);
  static LinkOptions opt2;
  opt2.Init(false);
  CU(g_cu.link_create_55(opt2.count, opt2.options, opt2.values, &state));
  CU(g_cu.link_add_file_55(state, CU_JIT_INPUT_PTX, path, 0, nullptr, nullptr));
  CU(g_cu.link_complete(state, &cubin, &cubin_size));
  EXPECT(cubin != nullptr && cubin_size > 0, "cuLinkComplete gave %p, %zu bytes", cubin,
         cubin_size);
  printf("file.cubin_bytes=%zu\n", cubin_size);
  LoadAndLaunch(cubin, "file");
  CU(g_cu.link_destroy(state));
  unlink(path);

  // 3. Bad input fails at add-data with an error log, as natively.
  e2e::Step("bad input");
  static LinkOptions opt3;
  opt3.Init(false);
  CU(g_cu.link_create(opt3.count, opt3.options, opt3.values, &state));
  char garbage[256];
  for (size_t i = 0; i < sizeof(garbage) - 1; ++i) garbage[i] = static_cast<char>('!' + i % 90);
  garbage[sizeof(garbage) - 1] = '\0';
  CUresult bad = g_cu.link_add_data(state, CU_JIT_INPUT_PTX, garbage, sizeof(garbage),
                                    "garbage.ptx", 0, nullptr, nullptr);
  EXPECT(bad != CUDA_SUCCESS, "garbage PTX was accepted");
  EXPECT(opt3.error[0] != '\0', "garbage PTX failed with %d (%s) but left no error log",
         static_cast<int>(bad), e2e::CuName(bad));
  printf("bad.error=%s\n", e2e::CuName(bad));
  printf("bad.error_log=%s\n", FirstLine(opt3.error).c_str());
  CUresult missing =
      g_cu.link_add_file(state, CU_JIT_INPUT_PTX, "/nonexistent/jit_link.ptx", 0, nullptr, nullptr);
  EXPECT(missing != CUDA_SUCCESS, "a missing file was accepted");
  printf("missing.error=%s\n", e2e::CuName(missing));
  // Completing with no valid input: what the driver answers is printed, not judged.
  CUresult empty = g_cu.link_complete(state, &cubin, &cubin_size);
  printf("empty.result=%s\n", empty == CUDA_SUCCESS ? "CUDA_SUCCESS" : e2e::CuName(empty));
  CU(g_cu.link_destroy(state));

  // 4. Under Flyt: a destroyed state is refused, and the session goes on.
  if (flyt) {
    e2e::Step("destroyed state");
    CUresult again = g_cu.link_destroy(state);
    EXPECT(again == CUDA_ERROR_INVALID_HANDLE, "second cuLinkDestroy returned %d (%s)",
           static_cast<int>(again), e2e::CuName(again));
    CUresult add = g_cu.link_add_data(state, CU_JIT_INPUT_PTX, const_cast<char*>(e2e::kAddOnePtx),
                                      sizeof(e2e::kAddOnePtx), "x", 0, nullptr, nullptr);
    EXPECT(add == CUDA_ERROR_INVALID_HANDLE, "cuLinkAddData of a destroyed state returned %d (%s)",
           static_cast<int>(add), e2e::CuName(add));
    CU(g_cu.link_create(0, nullptr, nullptr, &state));
    CU(g_cu.link_destroy(state));
    printf("misuse=ok\n");
  }
  e2e::Pass();
  return 0;
}
