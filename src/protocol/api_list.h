// The one declaration of every generically remoted driver API.
//
// Owns: each entry point's stable op id and call class. The argument
// directions come from the real prototype in cuda.h (see protocol/marshal.h):
// values and handles travel to the server, non-const pointers come back as
// outputs, const pointers to plain structs travel by value. From this list the
// build generates the client's exported stubs (client/gen_entry_points.py) and
// the server compiles its handlers (Session::RunGeneric, server/session.cc), so the two
// sides cannot drift apart. Op ids are stable across versions: append only,
// never renumber. Hand-written calls (launches, copies, code loading, contexts)
// have their ids in protocol/ops.h.
//
// X(op_id, symbol, call_class, releases) where call_class is SYNC (the caller
// needs the reply) or ASYNC (fire-and-forget, errors are deferred), and
// releases is the handle kind the call destroys through its first argument.
//
// Virtual memory management (245-253; cuMemSetAccess and
// cuMemRetainAllocationHandle are hand-written, protocol/ops.h): the server
// runs them through the session (server/session_vmm.cc), which checks that
// handles and ranges are the session's own, charges cuMemCreate to the quota
// and undoes everything at the session's end. cuMemMap and cuMemSetAccess are
// SYNC although nothing comes back: an allocator (PyTorch's expandable
// segments) checks their result at once and grows a segment only when they
// worked, and the client may know a range as device memory only after the
// driver mapped it. The calls that tear down (cuMemUnmap, cuMemRelease,
// cuMemAddressFree) are ASYNC when the client knows the range or handle, and
// SYNC otherwise, so that a bad argument fails at the call (client/api_vmm.cc).
//
// Managed memory (263-266, client/api_managed.cc): the server allocates real
// managed memory and its pager (server/managed_pager.h) moves pages to and
// from the client's host view. Advice and stream attachment are SYNC (the
// driver checks the range at the call); prefetches are ASYNC, checked on the
// client against the managed ranges it knows. The CUdevice forms (cuMemAdvise,
// cuMemPrefetchAsync) become these on the client.
//
// Context events (267-268): cuCtxRecordEvent and cuCtxWaitEvent are SYNC,
// unlike cuEventRecord and cuStreamWaitEvent (ASYNC: frameworks call those for
// every operation, and their errors come back deferred). The driver answers
// these two at the call with errors the client cannot foresee: an event of
// another context (CUDA_ERROR_INVALID_HANDLE), a stream of the context being
// captured (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, which also invalidates that
// capture). They are rare calls, so the app gets that answer at the call, as
// natively, for one round trip. The server translates the context (the
// primary context is the session's execution context under an SM share).
//
// Texture and surface objects (230-233, 270-273) are values, not handles: the
// server's driver checks them (CUDA_ERROR_INVALID_VALUE for one it never made);
// the Get*Desc calls return the descriptors the object was made with.
//
// Kernel node attributes, an executable graph's flags and event nodes' events
// (274-281) are SYNC: rare calls whose errors (a node of another type, an
// attribute a kernel node does not take) the app checks at once. Setting an
// attribute that names an event runs through the session, which lets only the
// session's own events reach the driver (server/session_vmm.h).
//
// Peer access (283-286) is SYNC: apps check each answer at once (enabling
// twice answers CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED). The server's driver
// decides; the peer context travels as the client's handle and is translated.
// cuDeviceCanAccessPeer is checked on the client for bad ordinals first
// (client/api_device.cc). Peer copies (174-175) are generic ASYNC calls.
//
// Stream memory operations (259-262) are SYNC: the driver checks address, alignment
// and flags at the call and apps test the result at once; the wait itself still
// happens on the GPU, in stream order.
#pragma once

#define FLYT_GENERIC_APIS(X)                                               \
  X(100, cuCtxSynchronize, SYNC, None)                                     \
  X(101, cuCtxGetLimit, SYNC, None)                                        \
  X(102, cuCtxSetLimit, SYNC, None)                                        \
  X(103, cuCtxGetCacheConfig, SYNC, None)                                  \
  X(104, cuCtxSetCacheConfig, ASYNC, None)                                 \
  X(105, cuCtxGetStreamPriorityRange, SYNC, None)                          \
  X(106, cuCtxResetPersistingL2Cache, ASYNC, None)                         \
  X(110, cuStreamCreate, SYNC, None)                                       \
  X(111, cuStreamCreateWithPriority, SYNC, None)                           \
  X(112, cuStreamDestroy_v2, ASYNC, Stream)                                \
  X(113, cuStreamSynchronize, SYNC, None)                                  \
  X(114, cuStreamQuery, SYNC, None)                                        \
  X(115, cuStreamWaitEvent, ASYNC, None)                                   \
  X(116, cuStreamGetPriority, SYNC, None)                                  \
  X(117, cuStreamGetFlags, SYNC, None)                                     \
  X(118, cuStreamBeginCapture_v2, SYNC, None)                              \
  X(119, cuStreamEndCapture, SYNC, None)                                   \
  X(120, cuStreamIsCapturing, SYNC, None)                                  \
  X(121, cuStreamGetId, SYNC, None)                                        \
  X(130, cuEventCreate, SYNC, None)                                        \
  X(131, cuEventDestroy_v2, ASYNC, Event)                                  \
  X(132, cuEventRecord, ASYNC, None)                                       \
  X(133, cuEventRecordWithFlags, ASYNC, None)                              \
  X(134, cuEventSynchronize, SYNC, None)                                   \
  X(135, cuEventQuery, SYNC, None)                                         \
  X(136, cuEventElapsedTime_v2, SYNC, None)                                \
  X(150, cuMemAlloc_v2, SYNC, None)                                        \
  X(151, cuMemAllocPitch_v2, SYNC, None)                                   \
  X(152, cuMemFree_v2, ASYNC, Memory)                                      \
  X(153, cuMemGetInfo_v2, SYNC, None)                                      \
  X(154, cuMemGetAddressRange_v2, SYNC, None)                              \
  X(155, cuMemsetD8_v2, ASYNC, None)                                       \
  X(156, cuMemsetD16_v2, ASYNC, None)                                      \
  X(157, cuMemsetD32_v2, ASYNC, None)                                      \
  X(158, cuMemsetD2D8_v2, ASYNC, None)                                     \
  X(159, cuMemsetD2D16_v2, ASYNC, None)                                    \
  X(160, cuMemsetD2D32_v2, ASYNC, None)                                    \
  X(161, cuMemsetD8Async, ASYNC, None)                                     \
  X(162, cuMemsetD16Async, ASYNC, None)                                    \
  X(163, cuMemsetD32Async, ASYNC, None)                                    \
  X(164, cuMemsetD2D8Async, ASYNC, None)                                   \
  X(165, cuMemsetD2D16Async, ASYNC, None)                                  \
  X(166, cuMemsetD2D32Async, ASYNC, None)                                  \
  X(167, cuMemcpyDtoD_v2, ASYNC, None)                                     \
  X(168, cuMemcpyDtoDAsync_v2, ASYNC, None)                                \
  X(169, cuArrayCreate_v2, SYNC, None)                                     \
  X(170, cuArray3DCreate_v2, SYNC, None)                                   \
  X(171, cuArrayDestroy, ASYNC, Array)                                     \
  X(172, cuArrayGetDescriptor_v2, SYNC, None)                              \
  X(173, cuArray3DGetDescriptor_v2, SYNC, None)                            \
  X(174, cuMemcpyPeer, ASYNC, None)                                        \
  X(175, cuMemcpyPeerAsync, ASYNC, None)                                   \
  X(190, cuFuncGetAttribute, SYNC, None)                                   \
  X(191, cuFuncSetAttribute, ASYNC, None)                                  \
  X(192, cuFuncSetCacheConfig, ASYNC, None)                                \
  X(193, cuKernelGetAttribute, SYNC, None)                                 \
  X(194, cuKernelSetAttribute, ASYNC, None)                                \
  X(195, cuKernelSetCacheConfig, ASYNC, None)                              \
  X(196, cuOccupancyMaxActiveBlocksPerMultiprocessor, SYNC, None)          \
  X(197, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, SYNC, None) \
  X(198, cuOccupancyAvailableDynamicSMemPerBlock, SYNC, None)              \
  X(199, cuFuncLoad, SYNC, None)                                           \
  X(200, cuFuncIsLoaded, SYNC, None)                                       \
  X(201, cuModuleGetGlobal_v2, SYNC, None)                                 \
  X(202, cuLibraryGetGlobal, SYNC, None)                                   \
  X(203, cuLibraryGetManaged, SYNC, None)                                  \
  X(204, cuModuleUnload, ASYNC, Module)                                    \
  X(205, cuLibraryUnload, ASYNC, Library)                                  \
  X(220, cuGraphInstantiateWithFlags, SYNC, None)                          \
  X(221, cuGraphLaunch, ASYNC, None)                                       \
  X(222, cuGraphExecDestroy, ASYNC, GraphExec)                             \
  X(223, cuGraphDestroy, ASYNC, Graph)                                     \
  X(224, cuGraphUpload, ASYNC, None)                                       \
  X(225, cuGraphCreate, SYNC, None)                                        \
  X(230, cuTexObjectCreate, SYNC, None)                                    \
  X(231, cuTexObjectDestroy, ASYNC, None)                                  \
  X(232, cuSurfObjectCreate, SYNC, None)                                   \
  X(233, cuSurfObjectDestroy, ASYNC, None)                                 \
  X(234, cuDeviceGetDefaultMemPool, SYNC, None)                            \
  X(235, cuDeviceGetMemPool, SYNC, None)                                   \
  X(236, cuDeviceSetMemPool, SYNC, None)                                   \
  X(237, cuMemPoolCreate, SYNC, None)                                      \
  X(238, cuMemPoolDestroy, ASYNC, MemPool)                                 \
  X(239, cuMemPoolTrimTo, ASYNC, None)                                     \
  X(240, cuMemAllocAsync, SYNC, None)                                      \
  X(241, cuMemAllocFromPoolAsync, SYNC, None)                              \
  X(242, cuMemFreeAsync, ASYNC, Memory)                                    \
  X(243, cuGraphExecUpdate_v2, SYNC, None)                                 \
  X(244, cuDeviceGraphMemTrim, SYNC, None)                                 \
  X(245, cuMemAddressReserve, SYNC, None)                                  \
  X(246, cuMemAddressFree, ASYNC, None)                                    \
  X(247, cuMemCreate, SYNC, None)                                          \
  X(248, cuMemRelease, ASYNC, None)                                        \
  X(249, cuMemMap, SYNC, None)                                             \
  X(250, cuMemUnmap, ASYNC, None)                                          \
  X(251, cuMemGetAccess, SYNC, None)                                       \
  X(252, cuMemGetAllocationGranularity, SYNC, None)                        \
  X(253, cuMemGetAllocationPropertiesFromHandle, SYNC, None)               \
  X(254, cuStreamSetAttribute, SYNC, None)                                 \
  X(255, cuStreamGetAttribute, SYNC, None)                                 \
  X(256, cuStreamGetCtx, SYNC, None)                                       \
  X(257, cuStreamGetDevice, SYNC, None)                                    \
  X(258, cuStreamCopyAttributes, SYNC, None)                               \
  X(259, cuStreamWriteValue32_v2, SYNC, None)                              \
  X(260, cuStreamWaitValue32_v2, SYNC, None)                               \
  X(261, cuStreamWriteValue64_v2, SYNC, None)                              \
  X(262, cuStreamWaitValue64_v2, SYNC, None)                               \
  X(263, cuMemAllocManaged, SYNC, None)                                    \
  X(264, cuStreamAttachMemAsync, SYNC, None)                               \
  X(265, cuMemAdvise_v2, SYNC, None)                                       \
  X(266, cuMemPrefetchAsync_v2, ASYNC, None)                               \
  X(267, cuCtxRecordEvent, SYNC, None)                                     \
  X(268, cuCtxWaitEvent, SYNC, None)                                       \
  X(269, cuDeviceGetTexture1DLinearMaxWidth, SYNC, None)                   \
  X(270, cuTexObjectGetResourceDesc, SYNC, None)                           \
  X(271, cuTexObjectGetTextureDesc, SYNC, None)                            \
  X(272, cuTexObjectGetResourceViewDesc, SYNC, None)                       \
  X(273, cuSurfObjectGetResourceDesc, SYNC, None)                          \
  X(274, cuGraphKernelNodeGetAttribute, SYNC, None)                        \
  X(275, cuGraphKernelNodeSetAttribute, SYNC, None)                        \
  X(276, cuGraphKernelNodeCopyAttributes, SYNC, None)                      \
  X(277, cuGraphExecGetFlags, SYNC, None)                                  \
  X(278, cuGraphEventRecordNodeSetEvent, SYNC, None)                       \
  X(279, cuGraphEventWaitNodeSetEvent, SYNC, None)                         \
  X(280, cuGraphExecEventRecordNodeSetEvent, SYNC, None)                   \
  X(281, cuGraphExecEventWaitNodeSetEvent, SYNC, None)                     \
  X(282, cuCtxGetExecAffinity, SYNC, None)                                 \
  X(283, cuDeviceCanAccessPeer, SYNC, None)                                \
  X(284, cuCtxEnablePeerAccess, SYNC, None)                                \
  X(285, cuCtxDisablePeerAccess, SYNC, None)                               \
  X(286, cuDeviceGetP2PAttribute, SYNC, None)

// Generic calls whose client entry point is hand-written because the client
// keeps state about them (client/api_*.cc calls Forward<> itself).
#define FLYT_CLIENT_WRAPPED(X)                            \
  X(cuMemAlloc_v2)                                        \
  X(cuMemAllocManaged)                                    \
  X(cuMemPrefetchAsync_v2)                                \
  X(cuMemAdvise_v2)                                       \
  X(cuLibraryGetManaged)                                  \
  X(cuCtxGetLimit)                                        \
  X(cuCtxSetLimit)                                        \
  X(cuMemAllocPitch_v2)                                   \
  X(cuMemFree_v2)                                         \
  X(cuModuleUnload)                                       \
  X(cuLibraryUnload)                                      \
  X(cuModuleGetGlobal_v2)                                 \
  X(cuLibraryGetGlobal)                                   \
  X(cuMemGetAddressRange_v2)                              \
  X(cuEventQuery)                                         \
  X(cuStreamQuery)                                        \
  X(cuMemAllocAsync)                                      \
  X(cuMemAllocFromPoolAsync)                              \
  X(cuMemFreeAsync)                                       \
  X(cuDeviceSetMemPool)                                   \
  X(cuMemPoolDestroy)                                     \
  X(cuFuncSetAttribute)                                   \
  X(cuKernelSetAttribute)                                 \
  X(cuStreamBeginCapture_v2)                              \
  X(cuGraphInstantiateWithFlags)                          \
  X(cuMemsetD8_v2)                                        \
  X(cuMemsetD16_v2)                                       \
  X(cuMemsetD32_v2)                                       \
  X(cuMemsetD2D8_v2)                                      \
  X(cuMemsetD2D16_v2)                                     \
  X(cuMemsetD2D32_v2)                                     \
  X(cuMemsetD8Async)                                      \
  X(cuMemsetD16Async)                                     \
  X(cuMemsetD32Async)                                     \
  X(cuMemsetD2D8Async)                                    \
  X(cuMemsetD2D16Async)                                   \
  X(cuMemsetD2D32Async)                                   \
  X(cuGraphLaunch)                                        \
  X(cuGraphExecDestroy)                                   \
  X(cuGraphDestroy)                                       \
  X(cuStreamEndCapture)                                   \
  X(cuStreamIsCapturing)                                  \
  X(cuStreamSynchronize)                                  \
  X(cuFuncGetAttribute)                                   \
  X(cuKernelGetAttribute)                                 \
  X(cuFuncSetCacheConfig)                                 \
  X(cuKernelSetCacheConfig)                               \
  X(cuCtxSetCacheConfig)                                  \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)          \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags) \
  X(cuMemAddressReserve)                                  \
  X(cuMemAddressFree)                                     \
  X(cuMemCreate)                                          \
  X(cuMemRelease)                                         \
  X(cuMemMap)                                             \
  X(cuMemUnmap)                                           \
  X(cuMemGetAccess)                                       \
  X(cuMemGetAllocationGranularity)                        \
  X(cuMemGetAllocationPropertiesFromHandle)               \
  X(cuCtxGetExecAffinity)                                 \
  X(cuDeviceCanAccessPeer)                                \
  X(cuGraphKernelNodeCopyAttributes)
