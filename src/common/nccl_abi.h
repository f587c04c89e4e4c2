// NCCL's public ABI as Flyt needs it (types, result codes, the config struct's
// known fields), and the private interface between Flyt's libnccl.so.2
// (src/nccl/) and its libcuda (client/api_nccl.cc), handed out by
// cuGetExportTable under a UUID of Flyt's own, as profiler_abi.h for CUPTI.
//
// Owns: these declarations only. NCCL's header is not a build dependency: the
// ABI is plain C (an opaque communicator pointer, int enums, a 128-byte id).
// Append only: a libnccl of one Flyt version may meet a libcuda of another.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace flyt::nccl {

// ncclResult_t.
enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// ncclUniqueId: opaque bytes that name a communicator's rendezvous.
inline constexpr size_t kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};

// ncclConfig_t's leading fields (nccl.h since 2.14; later versions append). Flyt
// passes the app's struct through as bytes, with its two strings carried
// beside it (the pointers are the app's).
struct ConfigHead {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cga_cluster_size;
  int min_ctas;
  int max_ctas;
  const char* net_name;
  int split_share;
  int traffic_class;
  const char* comm_name;
};
static_assert(offsetof(ConfigHead, net_name) == 32 && offsetof(ConfigHead, comm_name) == 48,
              "ncclConfig_t layout");
inline constexpr size_t kMaxConfigBytes = 1024;

// ncclDataType_t sizes (ncclInt8 .. ncclFloat8e5m2); 0 for an unknown type.
inline size_t DataTypeBytes(int type) {
  static constexpr unsigned char kBytes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return type >= 0 && type < static_cast<int>(sizeof(kBytes)) ? kBytes[type] : 0;
}
// ncclScalarResidence_t.
inline constexpr int kScalarDevice = 0;
inline constexpr int kScalarHostImmediate = 1;

// The app's NCCL_* settings that the server's NCCL takes (set in the client's worker
// before NCCL is loaded there): debugging, algorithm and tuning knobs. Those that
// describe the client's machine (network interfaces, host identity, topology files,
// a rendezvous address) or that Flyt sets itself (NCCL_COMM_BLOCKING) are not.
inline bool ForwardedEnv(const char* name) {
  static constexpr const char* kNames[] = {"NCCL_DEBUG",
                                           "NCCL_DEBUG_SUBSYS",
                                           "NCCL_ALGO",
                                           "NCCL_PROTO",
                                           "NCCL_MIN_NCHANNELS",
                                           "NCCL_MAX_NCHANNELS",
                                           "NCCL_MIN_CTAS",
                                           "NCCL_MAX_CTAS",
                                           "NCCL_BUFFSIZE",
                                           "NCCL_NTHREADS",
                                           "NCCL_LAUNCH_MODE",
                                           "NCCL_CHECK_POINTERS",
                                           "NCCL_RUNTIME_CONNECT",
                                           "NCCL_NVLS_ENABLE",
                                           "NCCL_CUMEM_ENABLE",
                                           "NCCL_P2P_LEVEL",
                                           "NCCL_P2P_DISABLE",
                                           "NCCL_SHM_DISABLE",
                                           "NCCL_GRAPH_MIXING_SUPPORT",
                                           "NCCL_WORK_FIFO_BYTES",
                                           "NCCL_CTA_POLICY"};
  for (const char* n : kNames)
    if (std::strcmp(n, name) == 0) return true;
  return false;
}
inline constexpr uint32_t kMaxForwardedEnv = 64;

// ---- libnccl <-> libcuda --------------------------------------------------

// "flyt-nccl-abi-v1"
inline constexpr unsigned char kTableUuid[16] = {'f', 'l', 'y', 't', '-', 'n', 'c', 'c',
                                                 'l', '-', 'a', 'b', 'i', '-', 'v', '1'};

// Receives the reply's bytes of one call.
using ReplyFn = void (*)(void* opaque, const void* data, size_t n);

struct Table {
  size_t size;  // sizeof(Table) of the libcuda that made it
  // Sends one NCCL call (ops::kOpNccl: the request starts with its NcclOp) to
  // server `server` (-1: the current device's) and hands the reply's bytes to
  // `reply`. *used: the server it went to. A CUresult other than CUDA_SUCCESS
  // means the call did not reach NCCL (no server, not initialised, refused).
  CUresult (*call)(int server, const void* request, size_t n, ReplyFn reply, void* opaque,
                   int* used);
  // The server of a stream and the value its wire carries (the default streams:
  // the current device's server, the value unchanged).
  int (*stream_server)(CUstream stream, uint64_t* wire);
  // The server of a device ordinal and the ordinal there; -1 for a bad one.
  int (*device_server)(int device, int* local);
  // The number of servers of this process (FLYT_SERVER's list).
  int (*server_count)();
};

}  // namespace flyt::nccl
