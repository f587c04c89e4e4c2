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

// cudart reports each runtime API call, at its enter and at its exit, through
// slot 1 of the tools-callback table (a094798c; docs/export_tables.md): `record`
// is cudart's record of the call (RuntimeCallRecord below). Runs on the app's
// thread, outside the client library's lock.
using RuntimeApiHook = void (*)(uint32_t cbid, const void* record);
// The number a tool gives a context (CUpti_CallbackData::contextUid).
using ContextUidHook = uint32_t (*)(CUcontext ctx);

// cudart's record of a runtime call as slot 1 hands it (measured against NVIDIA's
// CUPTI with cudart 13.0, H200: tests/gpu/probe). 120 bytes; the fields a tool reads.
struct RuntimeCallRecord {
  uint64_t size;         // 120
  uint32_t context_uid;  // written by slot 4 before slot 1 is called
  uint32_t reserved0;
  uint64_t reserved1[2];
  uint64_t* correlation_data;  // CUpti_CallbackData::correlationData
  void* return_value;          // a cudaError_t
  const char* function_name;
  const void* params;  // cudart's <name>_params struct
  CUcontext context;
  uint64_t reserved2;
  uint32_t cbid;            // CUPTI_RUNTIME_TRACE_CBID_*
  uint32_t site;            // 0 enter, 1 exit (CUpti_ApiCallbackSite)
  const char* symbol_name;  // the kernel's, for launches
};
static_assert(offsetof(RuntimeCallRecord, cbid) == 80, "cudart's record layout");

// libcuda's report of one driver API call the app made (CUPTI's driver API domain), at
// its enter and again at its exit, with the same record: a call's hook sees enter and
// exit in pairs, nested calls (a callback's own) in between. Flyt's own calls inside
// libcuda are not reported.
struct DriverCallRecord {
  uint32_t size;  // sizeof(DriverCallRecord)
  uint32_t cbid;  // CUPTI_DRIVER_TRACE_CBID_*
  uint32_t site;  // 0 enter, 1 exit (CUpti_ApiCallbackSite)
  // The hook's own, kept from enter to exit: the call's correlation id, its start on
  // the app's clock, and whether it took the call (libcuda sets them to 0 at enter).
  uint32_t correlation_id;
  uint64_t start;
  uint32_t taken;
  uint32_t reserved;
  const char* function_name;     // the exported symbol's, e.g. "cuMemcpyHtoD_v2"
  const void* params;            // NVIDIA's <symbol>_params (generated_cuda_meta.h), or nullptr
  const CUresult* return_value;  // the call's result at exit (CUDA_SUCCESS at enter)
  CUcontext context;             // current on the calling thread at this site
  const char* symbol_name;       // the kernel's, for launches; else nullptr
  uint64_t correlation_data;     // CUpti_CallbackData::correlationData points here
};
// Runs on the app's thread, outside the client library's lock; it may call driver APIs
// (those calls are reported in turn).
using DriverApiHook = void (*)(DriverCallRecord* record);
using ModuleLoadHook = void (*)(uint64_t start_ns, uint64_t end_ns);

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
  // Turns cudart's reporting of runtime calls on (both hooks set) or off (nullptr).
  void (*set_runtime_hooks)(RuntimeApiHook each_call, ContextUidHook context_uid);
  // --- appended: present when size >= kTableSizeDriverHook
  // Turns libcuda's reporting of driver calls on (hook set) or off (nullptr).
  void (*set_driver_hook)(DriverApiHook each_call);
  // --- appended: present when size >= kTableSizeModuleLoadHook
  // Code images loaded (cuLibraryLoadData, cuModuleLoad*): each load's start and end
  // (CLOCK_REALTIME ns), called on the thread that loaded it while the hook is set.
  void (*set_module_load_hook)(ModuleLoadHook each_load);
};
// The size of the first version of the table (everything up to set_runtime_hooks): what
// a libcupti needs at least.
inline constexpr size_t kTableSizeV1 = offsetof(Table, set_driver_hook);
inline constexpr size_t kTableSizeDriverHook = offsetof(Table, set_driver_hook) + sizeof(void*);
inline constexpr size_t kTableSizeModuleLoadHook =
    offsetof(Table, set_module_load_hook) + sizeof(void*);

}  // namespace flyt::profiler
