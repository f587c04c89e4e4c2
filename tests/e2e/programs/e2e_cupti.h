// What the CUPTI test programs share: loading libcupti.so.13 (Flyt's under `flyt run`,
// natively NVIDIA's from E2E_CUPTI), resolving its functions, and CUPTI(call), which
// fails the program with CUPTI's own name of the error.
#pragma once

#include <cupti.h>
#include <dlfcn.h>

#include <cstdlib>

#include "e2e_common.h"

namespace e2e {

inline decltype(&cuptiGetResultString) g_cupti_result_string = nullptr;

template <typename T>
void ResolveCupti(void* lib, const char* name, T* out) {
  *out = reinterpret_cast<T>(dlsym(lib, name));
  EXPECT(*out != nullptr, "libcupti lacks %s", name);
}

inline void* OpenCupti() {
  void* lib = dlopen("libcupti.so.13", RTLD_NOW);
  if (lib == nullptr && getenv("E2E_CUPTI") != nullptr) lib = dlopen(getenv("E2E_CUPTI"), RTLD_NOW);
  EXPECT(lib != nullptr, "cannot load libcupti.so.13: %s", dlerror());
  ResolveCupti(lib, "cuptiGetResultString", &g_cupti_result_string);
  return lib;
}

}  // namespace e2e

#define CUPTI(call)                                                            \
  do {                                                                         \
    CUptiResult _r = (call);                                                   \
    if (_r != CUPTI_SUCCESS) {                                                 \
      const char* _s = "?";                                                    \
      e2e::g_cupti_result_string(_r, &_s);                                     \
      e2e::Fail(__FILE__, __LINE__, "%s failed: %d (%s)", #call, (int)_r, _s); \
    }                                                                          \
  } while (0)
