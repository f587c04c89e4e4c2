// The driver entry points flyt-server calls, as one table of function pointers.
//
// Owns: the table and the two ways to fill it: from NVIDIA's real
// libcuda.so.1 (dlopen, exact versioned symbols; the default backend) or from
// the sim backend (server/sim_backend.cc, a test double for machines without
// a GPU). Per-thread-default-stream variants (_ptsz/_ptds) sit beside their
// legacy twins (suffix _pt) and are never aliased to them.
// Must not know about sessions or the wire.
#pragma once

#include <cuda.h>

#include <string>

#include "common/status.h"
#include "protocol/api_list.h"

namespace flyt::server {

// Entry points the hand-written handlers use.
#define FLYT_BACKEND_APIS(X)              \
  X(cuInit)                               \
  X(cuDriverGetVersion)                   \
  X(cuDeviceGet)                          \
  X(cuDeviceGetCount)                     \
  X(cuDeviceGetName)                      \
  X(cuDeviceGetUuid_v2)                   \
  X(cuDeviceTotalMem_v2)                  \
  X(cuDeviceGetAttribute)                 \
  X(cuDevicePrimaryCtxRetain)             \
  X(cuDevicePrimaryCtxRelease_v2)         \
  X(cuDevicePrimaryCtxReset_v2)           \
  X(cuCtxSetCurrent)                      \
  X(cuCtxCreate_v4)                       \
  X(cuCtxDestroy_v2)                      \
  X(cuCtxGetFlags)                        \
  X(cuCtxGetDevice)                       \
  X(cuLibraryLoadData)                    \
  X(cuLibraryGetKernelCount)              \
  X(cuLibraryEnumerateKernels)            \
  X(cuKernelGetName)                      \
  X(cuKernelGetParamInfo)                 \
  X(cuKernelGetFunction)                  \
  X(cuModuleLoadData)                     \
  X(cuModuleGetFunctionCount)             \
  X(cuModuleEnumerateFunctions)           \
  X(cuFuncGetName)                        \
  X(cuFuncGetParamInfo)                   \
  X(cuLaunchKernelEx)                     \
  X(cuMemcpyHtoD_v2)                      \
  X(cuMemcpyHtoDAsync_v2)                 \
  X(cuMemcpyDtoH_v2)                      \
  X(cuMemcpyDtoHAsync_v2)                 \
  X(cuMemcpy3D_v2)                        \
  X(cuMemcpy3DAsync_v2)                   \
  X(cuMemHostAlloc)                       \
  X(cuLaunchHostFunc)                     \
  X(cuOccupancyMaxActiveClusters)         \
  X(cuMemPoolGetAttribute)                \
  X(cuMemPoolSetAttribute)                \
  X(cuStreamGetCaptureInfo_v3)            \
  X(cuStreamBeginCaptureToGraph)          \
  X(cuStreamUpdateCaptureDependencies_v2) \
  X(cuGraphGetNodes)                      \
  X(cuStreamBatchMemOp_v2)                \
  X(cuGraphGetEdges_v2)                   \
  X(cuGraphGetRootNodes)                  \
  X(cuGraphNodeGetDependencies_v2)        \
  X(cuGraphNodeGetDependentNodes_v2)      \
  X(cuGraphAddDependencies_v2)            \
  X(cuGraphRemoveDependencies_v2)         \
  X(cuGraphDestroyNode)                   \
  X(cuGraphNodeSetEnabled)                \
  X(cuGraphNodeGetEnabled)                \
  X(cuGraphNodeGetType)                   \
  X(cuGraphHostNodeGetParams)             \
  X(cuGraphAddKernelNode_v2)              \
  X(cuGraphKernelNodeSetParams_v2)        \
  X(cuGraphExecKernelNodeSetParams_v2)    \
  X(cuGraphAddMemsetNode)                 \
  X(cuThreadExchangeStreamCaptureMode)    \
  X(cuGraphAddHostNode)                   \
  X(cuGraphHostNodeSetParams)             \
  X(cuGraphMemsetNodeGetParams)           \
  X(cuGraphMemsetNodeSetParams)           \
  X(cuGraphExecMemsetNodeSetParams)       \
  X(cuGraphAddMemcpyNode)                 \
  X(cuGraphMemcpyNodeGetParams)           \
  X(cuGraphMemcpyNodeSetParams)           \
  X(cuGraphExecMemcpyNodeSetParams)       \
  X(cuGraphAddChildGraphNode)             \
  X(cuGraphChildGraphNodeGetGraph)        \
  X(cuGraphExecChildGraphNodeSetParams)   \
  X(cuGraphAddEmptyNode)                  \
  X(cuGraphAddEventRecordNode)            \
  X(cuGraphAddEventWaitNode)              \
  X(cuGraphEventRecordNodeGetEvent)       \
  X(cuGraphEventWaitNodeGetEvent)         \
  X(cuGraphAddMemAllocNode)               \
  X(cuGraphMemAllocNodeGetParams)         \
  X(cuGraphAddMemFreeNode)                \
  X(cuGraphMemFreeNodeGetParams)          \
  X(cuDeviceGetGraphMemAttribute)         \
  X(cuDeviceSetGraphMemAttribute)         \
  X(cuGraphConditionalHandleCreate)       \
  X(cuGraphAddNode_v2)                    \
  X(cuGraphClone)                         \
  X(cuGraphDebugDotPrint)                 \
  X(cuGraphNodeFindInClone)               \
  X(cuMemFreeHost)                        \
  X(cuMemHostRegister_v2)                 \
  X(cuMemHostUnregister)                  \
  X(cuMemHostGetDevicePointer_v2)         \
  X(cuDeviceGetDevResource)               \
  X(cuDevSmResourceSplitByCount)          \
  X(cuDevResourceGenerateDesc)            \
  X(cuGreenCtxCreate)                     \
  X(cuGreenCtxDestroy)                    \
  X(cuCtxFromGreenCtx)                    \
  X(cuMemSetAccess)                       \
  X(cuMemRetainAllocationHandle)          \
  X(cuMemExportToShareableHandle)         \
  X(cuMemImportFromShareableHandle)       \
  X(cuIpcGetMemHandle)                    \
  X(cuIpcOpenMemHandle_v2)                \
  X(cuIpcCloseMemHandle)                  \
  X(cuIpcGetEventHandle)                  \
  X(cuIpcOpenEventHandle)                 \
  X(cuLinkCreate_v2)                      \
  X(cuLinkAddData_v2)                     \
  X(cuLinkComplete)                       \
  X(cuLinkDestroy)                        \
  X(cuTensorMapEncodeTiled)               \
  X(cuTensorMapEncodeIm2col)              \
  X(cuTensorMapEncodeIm2colWide)          \
  X(cuTensorMapReplaceAddress)            \
  X(cuMemRangeGetAttribute)               \
  X(cuPointerGetAttribute)                \
  X(cuFuncGetModule)                      \
  X(cuLibraryGetModule)                   \
  X(cuGraphKernelNodeGetParams_v2)        \
  X(cuGraphExecHostNodeSetParams)         \
  X(cuGraphInstantiateWithParams)         \
  X(cuDeviceGetHostAtomicCapabilities)    \
  X(cuDeviceGetP2PAtomicCapabilities)     \
  X(cuPointerSetAttribute)                \
  X(cuOccupancyMaxPotentialClusterSize)   \
  X(cuCtxSetFlags)

struct DriverApi {
#define FLYT_DECLARE_GENERIC(op, sym, cls, rel) \
  decltype(&::sym) sym = nullptr;               \
  decltype(&::sym) sym##_pt = nullptr;
  FLYT_GENERIC_APIS(FLYT_DECLARE_GENERIC)
#undef FLYT_DECLARE_GENERIC
#define FLYT_DECLARE_BACKEND(sym) decltype(&::sym) sym = nullptr;
  FLYT_BACKEND_APIS(FLYT_DECLARE_BACKEND)
#undef FLYT_DECLARE_BACKEND
  // Per-thread twins of the hand-used copies.
  decltype(&::cuMemcpyHtoD_v2) cuMemcpyHtoD_v2_pt = nullptr;
  decltype(&::cuMemcpyDtoH_v2) cuMemcpyDtoH_v2_pt = nullptr;
  decltype(&::cuMemcpy3D_v2) cuMemcpy3D_v2_pt = nullptr;
  decltype(&::cuLaunchKernelEx) cuLaunchKernelEx_pt = nullptr;
  decltype(&::cuLaunchHostFunc) cuLaunchHostFunc_pt = nullptr;
  decltype(&::cuStreamBatchMemOp_v2) cuStreamBatchMemOp_v2_pt = nullptr;
  decltype(&::cuStreamGetCaptureInfo_v3) cuStreamGetCaptureInfo_v3_pt = nullptr;
  decltype(&::cuStreamBeginCaptureToGraph) cuStreamBeginCaptureToGraph_pt = nullptr;
  decltype(&::cuStreamUpdateCaptureDependencies_v2) cuStreamUpdateCaptureDependencies_v2_pt =
      nullptr;
  decltype(&::cuGraphInstantiateWithParams) cuGraphInstantiateWithParams_pt = nullptr;
  // The stream memory operations of the ABI before CUDA 11.7 (symbols without
  // _v2; cuda.h maps those names to the _v2 ABI), with their per-thread twins.
  decltype(&::cuStreamWaitValue32_v2) cuStreamWaitValue32_v1 = nullptr,
                                      cuStreamWaitValue32_v1_pt = nullptr;
  decltype(&::cuStreamWriteValue32_v2) cuStreamWriteValue32_v1 = nullptr,
                                       cuStreamWriteValue32_v1_pt = nullptr;
  decltype(&::cuStreamWaitValue64_v2) cuStreamWaitValue64_v1 = nullptr,
                                      cuStreamWaitValue64_v1_pt = nullptr;
  decltype(&::cuStreamWriteValue64_v2) cuStreamWriteValue64_v1 = nullptr,
                                       cuStreamWriteValue64_v1_pt = nullptr;
  decltype(&::cuStreamBatchMemOp_v2) cuStreamBatchMemOp_v1 = nullptr,
                                     cuStreamBatchMemOp_v1_pt = nullptr;
  bool is_sim = false;
};

// Loads NVIDIA's driver (FLYT_REAL_LIBCUDA or libcuda.so.1) and calls cuInit.
Status LoadCudaDriver(DriverApi* api);

struct SimOptions {
  std::string record_path;              // one line per launch (see sim_backend.cc)
  uint64_t memory_bytes = 80ull << 30;  // the simulated GPU's memory
  // Fake green contexts (SM partitions in multiples of 8, streams bound to the
  // context current at their creation), so that tests can drive the server's
  // live SM changes without a GPU.
  bool green_contexts = false;
  // Devices the sim presents (--sim-devices N, at most 16), each with
  // memory_bytes of its own; peer-capable among themselves unless `peer` is
  // false (--sim-no-peer: as GPUs without P2P).
  int devices = 1;
  bool peer = true;
  // The smallest texture and surface object value (--sim-texture-base N; the
  // driver's is 1): a target whose values differ, for tests of a restore's checks.
  uint64_t texture_base = 1;
};
// Fills the table with the sim backend: host memory, recorded launches, no kernels.
Status LoadSimDriver(const SimOptions& options, DriverApi* api);

}  // namespace flyt::server
