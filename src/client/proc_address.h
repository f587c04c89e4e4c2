// cuGetProcAddress resolution and the "not supported yet" answer of driver entry points.
//
// Owns: the (base name, ABI version, per-thread) -> function lookup over the table that
// gen_driver_api.py generates from NVIDIA's headers (driver_api_pointers.cc), and
// ReportUnsupported, which every generated weak stub calls. Must not touch: the
// cuGetProcAddress/cuGetProcAddress_v2 entry points themselves (they call
// LookupDriverProc), any remoting, and stdout.
//
// Generated files include this header with FLYT_PROC_ADDRESS_TABLE_ONLY defined: they
// declare every driver symbol as `int sym(void)`, which clashes with cuda.h, so that part
// of the header must stay free of cuda.h.
#pragma once

#include <cstddef>

namespace flyt::client {

// One row of the generated table. Rows are sorted by `base` (strcmp order), then
// `per_thread`, then `version`.
struct DriverProcEntry {
  const char* base;    // name that cuGetProcAddress is asked for, e.g. "cuMemAlloc"
  int version;         // CUDA version that introduced this ABI, e.g. 3020
  int per_thread;      // 1 for the _ptds/_ptsz variant, 0 for the legacy-stream one
  const char* symbol;  // exported symbol, e.g. "cuMemAlloc_v2"
  void* fn;            // its address (a real entry point, or the weak stub)
};

// Defined in the generated driver_api_pointers.cc.
extern const DriverProcEntry kDriverProcTable[];
extern const std::size_t kDriverProcTableSize;

// Called by the weak stub of every entry point Flyt does not implement yet. Logs
// "<symbol> is not supported by Flyt yet" at warn level the first time each symbol is
// reported (thread-safe, lock-free, no allocation) and returns 801
// (CUDA_ERROR_NOT_SUPPORTED).
int ReportUnsupported(const char* symbol);

}  // namespace flyt::client

#ifndef FLYT_PROC_ADDRESS_TABLE_ONLY
#include <cuda.h>

namespace flyt::client {

// Implements cuGetProcAddress semantics: picks the highest ABI version <= `version` of
// `symbol` (the base name, e.g. "cuMemAlloc"). Flags: CU_GET_PROC_ADDRESS_DEFAULT (0),
// LEGACY_STREAM (1), PER_THREAD_DEFAULT_STREAM (2). Sets *found (optional) like the real
// driver and *pfn. Behaviour, as measured on driver 580.159.04 (CUDA 13.0) over every
// name in the table at every ABI boundary and all three flags:
//  - DEFAULT and LEGACY_STREAM behave the same: the legacy-stream ABI. DEFAULT means
//    per-thread only for code compiled with per-thread default stream, and such code
//    passes 2 itself (cuda.h's inline cuGetProcAddress_v2_ptsz wrapper adds it).
//  - PER_THREAD_DEFAULT_STREAM (also 3, both bits): when `symbol` has _ptds/_ptsz ABIs,
//    only those count, never the legacy ones; below the first per-thread version the
//    answer is VERSION_NOT_SUFFICIENT. Names without per-thread ABIs answer as with 0.
//  - Unknown name: CUDA_SUCCESS, *pfn = NULL, *found = SYMBOL_NOT_FOUND. Names that
//    already carry a suffix ("cuMemAlloc_v2", "cuMemcpyAsync_ptsz", "cuGetProcAddress_v2")
//    are unknown names too: the driver only knows base names.
//  - Known name, `version` below its first ABI (0 included): CUDA_SUCCESS, *pfn = NULL,
//    *found = VERSION_NOT_SUFFICIENT.
//  - Negative `version` (the driver was seen with -1): the newest ABI.
//  - Flags with any bit other than 0 and 1: CUDA_ERROR_INVALID_VALUE, outputs untouched.
//  - `version` greater than the driver version: CUDA_ERROR_INVALID_VALUE, outputs
//    untouched. Only checked when `driver_version` > 0; pass the version that
//    cuDriverGetVersion reports.
//  - NULL `symbol` or `pfn`: CUDA_ERROR_INVALID_VALUE (the real driver crashes).
CUresult LookupDriverProc(const char* symbol, int version, unsigned long long flags, void** pfn,
                          CUdriverProcAddressQueryResult* found, int driver_version = 0);

}  // namespace flyt::client
#endif  // FLYT_PROC_ADDRESS_TABLE_ONLY
