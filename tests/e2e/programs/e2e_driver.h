// Helpers of the e2e programs that call the driver API directly (vmm, contexts,
// jit_link): entry points resolved as a program linked against libcuda would
// get them, result names, CU/EXPECT_CU checks, whether Flyt's library is the
// one loaded, and a small PTX kernel. Builds on e2e_common.h.
#pragma once

#include <cuda.h>  // driver types only; the programs do not link libcuda
#include <dlfcn.h>

#include "e2e_common.h"

namespace e2e {

// cuGetErrorName, once a program has resolved it (names read "?" before).
inline decltype(&::cuGetErrorName) g_error_name = nullptr;

inline const char* CuName(CUresult r) {
  const char* n = nullptr;
  if (g_error_name != nullptr) g_error_name(r, &n);
  return n != nullptr ? n : "?";
}

// A driver entry point through the runtime, at the ABI of `version`.
template <typename F>
void ResolveDriver(const char* symbol, F* out, int version = CUDART_VERSION) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &status);
  EXPECT(err == cudaSuccess && status == cudaDriverEntryPointSuccess && fn != nullptr,
         "cudaGetDriverEntryPointByVersion(%s, %d): error %d (%s), status %d", symbol, version,
         static_cast<int>(err), cudaGetErrorName(err), static_cast<int>(status));
  *out = reinterpret_cast<F>(fn);
}

// True when the libcuda.so.1 this process loaded is Flyt's.
inline bool UnderFlyt() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  bool flyt = lib != nullptr && dlsym(lib, "flyt_client_marker") != nullptr;
  if (lib != nullptr) dlclose(lib);
  return flyt;
}

// add_one(unsigned* p, unsigned n): p[i] += 1. PTX as NVRTC would hand it over.
inline const char kAddOnePtx[] = R"(
.version 8.0
.target sm_75
.address_size 64

.visible .entry add_one(
    .param .u64 add_one_param_0,
    .param .u32 add_one_param_1
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [add_one_param_0];
    ld.param.u32 %r2, [add_one_param_1];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r6, [%rd4];
    add.s32 %r7, %r6, 1;
    st.global.u32 [%rd4], %r7;
DONE:
    ret;
}
)";

}  // namespace e2e

#define CU(call)                                                                             \
  do {                                                                                       \
    CUresult cu_r_ = (call);                                                                 \
    if (cu_r_ != CUDA_SUCCESS)                                                               \
      ::e2e::Fail(__FILE__, __LINE__, "%s returned %d (%s)", #call, static_cast<int>(cu_r_), \
                  ::e2e::CuName(cu_r_));                                                     \
  } while (0)

#define EXPECT_CU(call, want)                                                                    \
  do {                                                                                           \
    CUresult cu_r_ = (call);                                                                     \
    EXPECT(cu_r_ == (want), "%s returned %d (%s), want %d (%s)", #call, static_cast<int>(cu_r_), \
           ::e2e::CuName(cu_r_), static_cast<int>(want), ::e2e::CuName(want));                   \
  } while (0)
