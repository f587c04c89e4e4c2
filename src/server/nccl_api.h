// The NCCL entry points flyt-server calls for its clients, as one table of
// function pointers (the clients' calls arrive through Flyt's libnccl.so.2 and
// ops::kOpNccl; server/session_nccl.cc serves them).
//
// Owns: the table and its two fillers: NVIDIA's libnccl.so.2, loaded at a
// session's first NCCL call (FLYT_NCCL_LIBRARY, else the loader's search; the
// cuda backend), or the sim backend's NCCL (server/sim_nccl.cc: a test double
// whose ranks meet over TCP and reduce the sim's device memory on the host).
// Must not know about sessions or the wire. Optional entry points (newer NCCL)
// may be null.
#pragma once

#include <cuda.h>

#include <string>

#include "common/nccl_abi.h"
#include "common/status.h"

namespace flyt::server {

// ncclComm_t, opaque.
using NcclComm = void*;

struct NcclApi {
  int (*ncclGetVersion)(int* version) = nullptr;
  int (*ncclGetUniqueId)(nccl::UniqueId* id) = nullptr;
  // config: the app's ncclConfig_t or null.
  int (*ncclCommInitRankConfig)(NcclComm* comm, int nranks, nccl::UniqueId id, int rank,
                                void* config) = nullptr;
  int (*ncclCommInitRankScalable)(NcclComm* comm, int nranks, int rank, int nids,
                                  nccl::UniqueId* ids, void* config) = nullptr;
  int (*ncclCommInitAll)(NcclComm* comms, int ndev, const int* devices) = nullptr;
  int (*ncclCommSplit)(NcclComm comm, int color, int key, NcclComm* out, void* config) = nullptr;
  int (*ncclCommShrink)(NcclComm comm, int* exclude, int n, NcclComm* out, void* config,
                        int flags) = nullptr;
  int (*ncclCommFinalize)(NcclComm comm) = nullptr;
  int (*ncclCommDestroy)(NcclComm comm) = nullptr;
  int (*ncclCommAbort)(NcclComm comm) = nullptr;
  int (*ncclCommGetAsyncError)(NcclComm comm, int* result) = nullptr;
  const char* (*ncclGetLastError)(NcclComm comm) = nullptr;
  int (*ncclCommCount)(NcclComm comm, int* count) = nullptr;
  int (*ncclCommCuDevice)(NcclComm comm, int* device) = nullptr;
  int (*ncclCommUserRank)(NcclComm comm, int* rank) = nullptr;
  int (*ncclAllReduce)(const void* send, void* recv, size_t count, int type, int op, NcclComm comm,
                       CUstream stream) = nullptr;
  int (*ncclBroadcast)(const void* send, void* recv, size_t count, int type, int root,
                       NcclComm comm, CUstream stream) = nullptr;
  int (*ncclReduce)(const void* send, void* recv, size_t count, int type, int op, int root,
                    NcclComm comm, CUstream stream) = nullptr;
  int (*ncclAllGather)(const void* send, void* recv, size_t send_count, int type, NcclComm comm,
                       CUstream stream) = nullptr;
  int (*ncclReduceScatter)(const void* send, void* recv, size_t recv_count, int type, int op,
                           NcclComm comm, CUstream stream) = nullptr;
  int (*ncclAlltoAll)(const void* send, void* recv, size_t count, int type, NcclComm comm,
                      CUstream stream) = nullptr;
  int (*ncclSend)(const void* send, size_t count, int type, int peer, NcclComm comm,
                  CUstream stream) = nullptr;
  int (*ncclRecv)(void* recv, size_t count, int type, int peer, NcclComm comm,
                  CUstream stream) = nullptr;
  int (*ncclGroupStart)() = nullptr;
  int (*ncclGroupEnd)() = nullptr;
  int (*ncclRedOpCreatePreMulSum)(int* op, void* scalar, int type, int residence,
                                  NcclComm comm) = nullptr;
  int (*ncclRedOpDestroy)(int op, NcclComm comm) = nullptr;
  int (*ncclCommRegister)(NcclComm comm, void* buffer, size_t bytes, void** handle) = nullptr;
  int (*ncclCommDeregister)(NcclComm comm, void* handle) = nullptr;
};

// NVIDIA's NCCL: FLYT_NCCL_LIBRARY, else "libnccl.so.2" by the loader's search. The error
// says what to install or set.
Status LoadRealNccl(NcclApi* api);
// The sim backend's NCCL (server/sim_nccl.cc).
void LoadSimNccl(NcclApi* api);
// The sim backend's device of the calling thread's current context (0 with none,
// or before LoadSimDriver; server/sim_backend.cc), which the sim's NCCL records
// in a communicator at its init.
int SimCurrentDevice();

}  // namespace flyt::server
