// Loading NVIDIA's CUPTI for server/cupti_api.h.
#include "server/cupti_api.h"

#include <dlfcn.h>

#include <cstdlib>

namespace flyt::server {

Status LoadCupti(CuptiApi* api) {
  if (api->loaded) return Status::Ok();
  std::string tried;
  void* lib = nullptr;
  const char* env = std::getenv("FLYT_CUPTI_LIBRARY");
  const char* candidates[] = {env,
                              "libcupti.so.13",
                              "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                              "/usr/local/cuda/lib64/libcupti.so.13",
                              "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13",
                              "libcupti.so"};
  const char* from = nullptr;
  for (const char* path : candidates) {
    if (path == nullptr || path[0] == '\0') continue;
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      from = path;
      break;
    }
    tried += std::string(tried.empty() ? "" : ", ") + path;
  }
  if (lib == nullptr)
    return Status::Error("cannot load NVIDIA's CUPTI on the GPU host (tried " + tried +
                         "): install the CUDA toolkit's CUPTI or set FLYT_CUPTI_LIBRARY "
                         "for flyt-server");
  CuptiApi got;
  std::string missing;
#define FLYT_RESOLVE_CUPTI(sym)                                    \
  got.sym = reinterpret_cast<decltype(got.sym)>(dlsym(lib, #sym)); \
  if (got.sym == nullptr) missing += std::string(missing.empty() ? "" : ", ") + #sym;
  FLYT_CUPTI_APIS(FLYT_RESOLVE_CUPTI)
#undef FLYT_RESOLVE_CUPTI
  if (!missing.empty()) {
    dlclose(lib);
    return Status::Error(std::string(from) + " lacks " + missing +
                         ": install CUPTI 13 or newer, or set FLYT_CUPTI_LIBRARY");
  }
  uint32_t version = 0;
  if (got.cuptiGetVersion(&version) != CUPTI_SUCCESS || version < CUPTI_API_VERSION) {
    dlclose(lib);
    return Status::Error(std::string(from) + " is CUPTI API version " + std::to_string(version) +
                         ", older than the " + std::to_string(CUPTI_API_VERSION) +
                         " Flyt reads: install CUPTI 13 or newer, or set FLYT_CUPTI_LIBRARY");
  }
  got.loaded = true;
  got.from = from;
  *api = got;
  return Status::Ok();
}

}  // namespace flyt::server
