// Loading NVIDIA's NCCL for the cuda backend (server/nccl_api.h).
#include "server/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace flyt::server {

namespace {

template <typename F>
void Resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

Status LoadRealNccl(NcclApi* api) {
  const char* path = std::getenv("FLYT_NCCL_LIBRARY");
  if (path == nullptr || path[0] == '\0') path = "libnccl.so.2";
  // Communicators are non-blocking (NCCL reads this at its first use): a worker never
  // waits in NCCL for other ranks; the client's libnccl waits where the app blocks.
  setenv("NCCL_COMM_BLOCKING", "0", 1);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return Status::Error(std::string("the GPU server cannot load NCCL (") + dlerror() +
                         "): install NCCL on the GPU host or start flyt-server with "
                         "FLYT_NCCL_LIBRARY set to its libnccl.so.2");
  if (dlsym(lib, "flyt_nccl_marker") != nullptr)
    return Status::Error(std::string(path) +
                         " is Flyt's client NCCL, not NVIDIA's: remove Flyt from LD_LIBRARY_PATH "
                         "and LD_PRELOAD of flyt-server or set FLYT_NCCL_LIBRARY");
  NcclApi a;
#define FLYT_NCCL_RESOLVE(sym) Resolve(lib, #sym, &a.sym);
  FLYT_NCCL_RESOLVE(ncclGetVersion)
  FLYT_NCCL_RESOLVE(ncclGetUniqueId)
  FLYT_NCCL_RESOLVE(ncclCommInitRankConfig)
  FLYT_NCCL_RESOLVE(ncclCommInitRankScalable)
  FLYT_NCCL_RESOLVE(ncclCommInitAll)
  FLYT_NCCL_RESOLVE(ncclCommSplit)
  FLYT_NCCL_RESOLVE(ncclCommShrink)
  FLYT_NCCL_RESOLVE(ncclCommFinalize)
  FLYT_NCCL_RESOLVE(ncclCommDestroy)
  FLYT_NCCL_RESOLVE(ncclCommAbort)
  FLYT_NCCL_RESOLVE(ncclCommGetAsyncError)
  FLYT_NCCL_RESOLVE(ncclGetLastError)
  FLYT_NCCL_RESOLVE(ncclCommCount)
  FLYT_NCCL_RESOLVE(ncclCommCuDevice)
  FLYT_NCCL_RESOLVE(ncclCommUserRank)
  FLYT_NCCL_RESOLVE(ncclAllReduce)
  FLYT_NCCL_RESOLVE(ncclBroadcast)
  FLYT_NCCL_RESOLVE(ncclReduce)
  FLYT_NCCL_RESOLVE(ncclAllGather)
  FLYT_NCCL_RESOLVE(ncclReduceScatter)
  FLYT_NCCL_RESOLVE(ncclAlltoAll)
  FLYT_NCCL_RESOLVE(ncclSend)
  FLYT_NCCL_RESOLVE(ncclRecv)
  FLYT_NCCL_RESOLVE(ncclGroupStart)
  FLYT_NCCL_RESOLVE(ncclGroupEnd)
  FLYT_NCCL_RESOLVE(ncclRedOpCreatePreMulSum)
  FLYT_NCCL_RESOLVE(ncclRedOpDestroy)
  FLYT_NCCL_RESOLVE(ncclCommRegister)
  FLYT_NCCL_RESOLVE(ncclCommDeregister)
#undef FLYT_NCCL_RESOLVE
  // What every NCCL since 2.14 has; the rest is optional.
  if (a.ncclGetVersion == nullptr || a.ncclGetUniqueId == nullptr ||
      a.ncclCommInitRankConfig == nullptr || a.ncclCommDestroy == nullptr ||
      a.ncclCommAbort == nullptr || a.ncclCommGetAsyncError == nullptr ||
      a.ncclAllReduce == nullptr || a.ncclGroupStart == nullptr || a.ncclGroupEnd == nullptr ||
      a.ncclSend == nullptr || a.ncclRecv == nullptr) {
    dlclose(lib);
    return Status::Error(std::string(path) +
                         " lacks entry points of NCCL 2.14 or later: install a newer NCCL on "
                         "the GPU host");
  }
  *api = a;
  return Status::Ok();
}

}  // namespace flyt::server
