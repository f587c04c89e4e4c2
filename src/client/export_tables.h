// Private driver export tables (`cuGetExportTable`) served by the client library.
//
// Owns: Flyt's own copies of the undocumented function tables that cudart, cuBLAS(Lt) and
// cuDNN fetch by UUID; the context-local storage one of them exposes; the start-up
// integrity hash cudart checks. Every slot runs on the client and calls only public driver
// API functions declared in cuda.h (which the rest of the client library implements).
// Must not touch: transports, the wire protocol, handle translation. Never forward a table,
// or a call to one of its slots, to the server: table and function addresses are hashed
// into the integrity check, so they must be this process's own. docs/export_tables.md
// lists the tables, their sizes and what each used slot does.
#pragma once

#include <cuda.h>

#include "common/profiler_abi.h"

namespace flyt::client {

// Answers cuGetExportTable: sets *table to Flyt's own table for `id` and returns CUDA_SUCCESS,
// or returns CUDA_ERROR_NOT_SUPPORTED (logging the UUID once) for tables we do not provide.
CUresult GetExportTable(const void** table, const CUuuid* id);
// Flyt's profiler table for its libcupti (client/api_profiler.cc).
const void* ProfilerTable();
// Flyt's libnccl.so.2 (client/api_nccl.cc).
const void* NcclTable();

// Turns cudart's reports of runtime calls (tools-callback table a094798c) on, delivered to
// `each_call`, or off when either hook is null (Flyt's libcupti, through its profiler table).
void SetRuntimeApiHooks(profiler::RuntimeApiHook each_call, profiler::ContextUidHook uid);

// Runs, then forgets, the destructor callbacks that cudart stored for `ctx` through the
// context-local-storage table (entries without one are forgotten too). The context code
// calls it where the real driver does: in cuCtxDestroy (while `ctx` is still valid) and in
// cuDevicePrimaryCtxReset. Not on the cuDevicePrimaryCtxRelease that drops the last
// reference: the driver keeps the entries across that. Call it holding none of the caller's
// locks; the callbacks call back into the driver API.
void DestroyContextLocalStorage(CUcontext ctx);

}  // namespace flyt::client
