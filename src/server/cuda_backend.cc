// The real backend: resolves every entry point from NVIDIA's libcuda.so.1.
#include <dlfcn.h>

#include <cstdlib>

#include "common/log.h"
#include "server/driver_api.h"

namespace flyt::server {
namespace {

template <typename F>
void Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
}

template <typename F>
void ResolvePerThread(void* lib, const char* name, F* out) {
  std::string base(name);
  for (const char* suffix : {"_ptsz", "_ptds"}) {
    if (void* p = dlsym(lib, (base + suffix).c_str())) {
      *out = reinterpret_cast<F>(p);
      return;
    }
  }
}

// A session is one client process served by one server thread, and sessions
// share this process. A client's global-mode capture must guard the client's
// own threads, which here means the session's thread, and must not make other
// sessions' calls fail: on the server it is a thread-local capture.
decltype(&::cuStreamBeginCapture_v2) g_begin_capture = nullptr;
decltype(&::cuStreamBeginCapture_v2) g_begin_capture_pt = nullptr;
CUstreamCaptureMode SessionMode(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL : mode;
}
CUresult BeginCapture(CUstream s, CUstreamCaptureMode mode) {
  return g_begin_capture(s, SessionMode(mode));
}
CUresult BeginCapturePerThread(CUstream s, CUstreamCaptureMode mode) {
  return g_begin_capture_pt(s, SessionMode(mode));
}
decltype(&::cuStreamBeginCaptureToGraph) g_capture_to_graph = nullptr;
decltype(&::cuStreamBeginCaptureToGraph) g_capture_to_graph_pt = nullptr;
CUresult BeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode* deps,
                             const CUgraphEdgeData* edges, size_t n, CUstreamCaptureMode mode) {
  return g_capture_to_graph(s, g, deps, edges, n, SessionMode(mode));
}
CUresult BeginCaptureToGraphPerThread(CUstream s, CUgraph g, const CUgraphNode* deps,
                                      const CUgraphEdgeData* edges, size_t n,
                                      CUstreamCaptureMode mode) {
  return g_capture_to_graph_pt(s, g, deps, edges, n, SessionMode(mode));
}

}  // namespace

Status LoadCudaDriver(DriverApi* api) {
  const char* path = std::getenv("FLYT_REAL_LIBCUDA");
  if (path == nullptr || path[0] == '\0') path = "libcuda.so.1";
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return Status::Error(
        std::string("cannot load NVIDIA's driver library (") + dlerror() +
        "): install the NVIDIA driver, set FLYT_REAL_LIBCUDA, or use --backend sim "
        "for testing");
  if (dlsym(lib, "flyt_client_marker") != nullptr)
    return Status::Error(std::string(path) +
                         " is Flyt's client library, not NVIDIA's driver: remove Flyt from "
                         "LD_LIBRARY_PATH for flyt-server or set FLYT_REAL_LIBCUDA");
#define FLYT_RESOLVE_GENERIC(op, sym, cls, rel) \
  Resolve(lib, #sym, &api->sym);                \
  ResolvePerThread(lib, #sym, &api->sym##_pt);
  FLYT_GENERIC_APIS(FLYT_RESOLVE_GENERIC)
#undef FLYT_RESOLVE_GENERIC
#define FLYT_RESOLVE_BACKEND(sym) Resolve(lib, #sym, &api->sym);
  FLYT_BACKEND_APIS(FLYT_RESOLVE_BACKEND)
#undef FLYT_RESOLVE_BACKEND
  ResolvePerThread(lib, "cuMemcpyHtoD_v2", &api->cuMemcpyHtoD_v2_pt);
  ResolvePerThread(lib, "cuMemcpyDtoH_v2", &api->cuMemcpyDtoH_v2_pt);
  ResolvePerThread(lib, "cuMemcpy3D_v2", &api->cuMemcpy3D_v2_pt);
  ResolvePerThread(lib, "cuLaunchKernelEx", &api->cuLaunchKernelEx_pt);
  ResolvePerThread(lib, "cuLaunchHostFunc", &api->cuLaunchHostFunc_pt);
  ResolvePerThread(lib, "cuStreamBatchMemOp_v2", &api->cuStreamBatchMemOp_v2_pt);
  ResolvePerThread(lib, "cuStreamGetCaptureInfo_v3", &api->cuStreamGetCaptureInfo_v3_pt);
  ResolvePerThread(lib, "cuStreamBeginCaptureToGraph", &api->cuStreamBeginCaptureToGraph_pt);
  ResolvePerThread(lib, "cuStreamUpdateCaptureDependencies_v2",
                   &api->cuStreamUpdateCaptureDependencies_v2_pt);
  ResolvePerThread(lib, "cuGraphInstantiateWithParams", &api->cuGraphInstantiateWithParams_pt);
  // The pre-11.7 ABI of the stream memory operations, by its exact symbols.
  Resolve(lib, "cuStreamWaitValue32", &api->cuStreamWaitValue32_v1);
  Resolve(lib, "cuStreamWriteValue32", &api->cuStreamWriteValue32_v1);
  Resolve(lib, "cuStreamWaitValue64", &api->cuStreamWaitValue64_v1);
  Resolve(lib, "cuStreamWriteValue64", &api->cuStreamWriteValue64_v1);
  Resolve(lib, "cuStreamBatchMemOp", &api->cuStreamBatchMemOp_v1);
  ResolvePerThread(lib, "cuStreamWaitValue32", &api->cuStreamWaitValue32_v1_pt);
  ResolvePerThread(lib, "cuStreamWriteValue32", &api->cuStreamWriteValue32_v1_pt);
  ResolvePerThread(lib, "cuStreamWaitValue64", &api->cuStreamWaitValue64_v1_pt);
  ResolvePerThread(lib, "cuStreamWriteValue64", &api->cuStreamWriteValue64_v1_pt);
  ResolvePerThread(lib, "cuStreamBatchMemOp", &api->cuStreamBatchMemOp_v1_pt);
  g_begin_capture = api->cuStreamBeginCapture_v2;
  g_begin_capture_pt = api->cuStreamBeginCapture_v2_pt;
  if (g_begin_capture != nullptr) api->cuStreamBeginCapture_v2 = BeginCapture;
  if (g_begin_capture_pt != nullptr) api->cuStreamBeginCapture_v2_pt = BeginCapturePerThread;
  g_capture_to_graph = api->cuStreamBeginCaptureToGraph;
  g_capture_to_graph_pt = api->cuStreamBeginCaptureToGraph_pt;
  if (g_capture_to_graph != nullptr) api->cuStreamBeginCaptureToGraph = BeginCaptureToGraph;
  if (g_capture_to_graph_pt != nullptr)
    api->cuStreamBeginCaptureToGraph_pt = BeginCaptureToGraphPerThread;
  if (api->cuInit == nullptr || api->cuLaunchKernelEx == nullptr)
    return Status::Error(std::string(path) + " lacks cuInit/cuLaunchKernelEx: driver too old");
  if (api->cuKernelGetParamInfo == nullptr || api->cuLibraryEnumerateKernels == nullptr)
    return Status::Error("the NVIDIA driver is older than 12.4: Flyt needs cuKernelGetParamInfo");
  CUresult rc = api->cuInit(0);
  if (rc != CUDA_SUCCESS)
    return Status::Error("cuInit failed with error " + std::to_string(rc) +
                         ": check that a GPU is visible (nvidia-smi)");
  return Status::Ok();
}

}  // namespace flyt::server
