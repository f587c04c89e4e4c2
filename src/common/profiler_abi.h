// The private interface between Flyt's libcupti (src/cupti/) and its libcuda
// (src/client/api_profiler.cc), handed out by cuGetExportTable under a UUID of
// Flyt's own, as NVIDIA's CUPTI gets its driver interface.
//
// Owns: the table layout and the UUID. Append only: a libcupti of one Flyt
// version may meet a libcuda of another (it checks `size`).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "protocol/ops.h"

namespace flyt::profiler {

// "flyt-profiler-v1"
inline constexpr unsigned char kTableUuid[16] = {'f', 'l', 'y', 't', '-', 'p', 'r', 'o',
                                                 'f', 'i', 'l', 'e', 'r', '-', 'v', '1'};

// Called for each record of a drain; name is the kernel's (NUL-terminated) or "".
using RecordFn = void (*)(void* opaque, const ops::GpuActivity* record, const char* name);
// Called on the app's thread for every call Flyt sends to the server while set,
// with the call's id (the correlation id of the GPU work it issues). Runs under
// the client library's lock: it must not call into libcuda.
using CallHook = void (*)(uint64_t call_id);

struct Table {
  size_t size;  // sizeof(Table)
  // Enables GPU activity kinds (1 << ops::GpuActivityKind) on the server.
  // *enabled: the kinds it records; *server_now_ns: its clock at the reply,
  // *local_now_ns: this host's CLOCK_REALTIME half way through the call; why:
  // the server's reason for kinds it does not record (NUL-terminated, cut to why_len).
  CUresult (*start)(uint32_t kinds, uint32_t* enabled, uint64_t* server_now_ns,
                    uint64_t* local_now_ns, char* why, size_t why_len);
  CUresult (*stop)(uint32_t kinds);
  // Takes what the server recorded so far (forced: also work still running).
  CUresult (*drain)(int forced, RecordFn each, void* opaque, uint32_t* dropped);
  void (*set_call_hook)(CallHook hook);
};

}  // namespace flyt::profiler
