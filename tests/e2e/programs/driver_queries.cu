// driver_queries: driver entry points that answer about handles, graph kernel nodes,
// contexts and the older ABIs, as libraries and frameworks call them:
//  - handles: cuKernelGetLibrary, cuLibraryGetModule (the library's module: its
//    functions are found, it cannot be unloaded on its own), cuFuncGetModule of a
//    module's function and of a library kernel's function;
//  - graph kernel nodes: cuGraphKernelNodeGetParams (CUDA 12 and 11 ABIs; the arguments
//    in memory the node owns, in the form last set), kernel node attributes set, read
//    and copied, cuGraphInstantiateWithParams, cuGraphExecGetFlags, the CUDA 11
//    cuGraphInstantiate, cuGraphExecHostNodeSetParams, event nodes' events changed;
//  - contexts and devices: cuCtxSetFlags, cuCtxGetExecAffinity,
//    cuDeviceGetHostAtomicCapabilities, cuPointerSetAttribute,
//    cuOccupancyMaxPotentialClusterSize;
//  - the stream memory operations of the ABI before CUDA 11.7 (cuStreamWriteValue32
//    and the others without _v2), when the device says it takes them.
// Prints key=value lines (the same natively and through Flyt) and "driver_queries: PASS".
// Entry points through cudaGetDriverEntryPointByVersion, at the ABI asked for.
#include <cuda.h>  // driver types only; the program does not link libcuda

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "e2e_driver.h"

namespace {

struct Driver {
  decltype(&::cuLibraryLoadData) library_load;
  decltype(&::cuLibraryUnload) library_unload;
  decltype(&::cuLibraryGetKernel) library_kernel;
  decltype(&::cuKernelGetLibrary) kernel_library;
  decltype(&::cuLibraryGetModule) library_module;
  decltype(&::cuKernelGetFunction) kernel_function;
  decltype(&::cuFuncGetModule) func_module;
  decltype(&::cuModuleLoadData) module_load;
  decltype(&::cuModuleUnload) module_unload;
  decltype(&::cuModuleGetFunction) module_function;
  decltype(&::cuGraphCreate) graph_create;
  decltype(&::cuGraphDestroy) graph_destroy;
  decltype(&::cuGraphAddKernelNode_v2) add_kernel;
  decltype(&::cuGraphKernelNodeGetParams_v2) kernel_params;
  CUresult (*kernel_params_v1)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v1*);
  decltype(&::cuGraphKernelNodeSetParams_v2) set_kernel_params;
  decltype(&::cuGraphKernelNodeGetAttribute) get_attr;
  decltype(&::cuGraphKernelNodeSetAttribute) set_attr;
  decltype(&::cuGraphKernelNodeCopyAttributes) copy_attrs;
  decltype(&::cuGraphAddMemsetNode) add_memset;
  decltype(&::cuGraphInstantiateWithParams) instantiate_params;
  CUresult (*instantiate_v2)(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
  decltype(&::cuGraphExecGetFlags) exec_flags;
  decltype(&::cuGraphExecDestroy) exec_destroy;
  decltype(&::cuGraphLaunch) launch;
  decltype(&::cuGraphAddHostNode) add_host;
  decltype(&::cuGraphHostNodeGetParams) host_params;
  decltype(&::cuGraphExecHostNodeSetParams) exec_host;
  decltype(&::cuGraphAddEventRecordNode) add_record;
  decltype(&::cuGraphAddEventWaitNode) add_wait;
  decltype(&::cuGraphEventRecordNodeGetEvent) record_event;
  decltype(&::cuGraphEventWaitNodeGetEvent) wait_event;
  decltype(&::cuGraphEventRecordNodeSetEvent) set_record_event;
  decltype(&::cuGraphEventWaitNodeSetEvent) set_wait_event;
  decltype(&::cuGraphExecEventRecordNodeSetEvent) exec_record_event;
  decltype(&::cuCtxGetFlags) ctx_flags;
  decltype(&::cuCtxGetCurrent) ctx_current;
  decltype(&::cuCtxSetFlags) set_ctx_flags;
  decltype(&::cuCtxGetExecAffinity) exec_affinity;
  decltype(&::cuDeviceGetAttribute) device_attribute;
  decltype(&::cuDeviceGetHostAtomicCapabilities) host_atomics;
  decltype(&::cuPointerSetAttribute) set_pointer;
  decltype(&::cuPointerGetAttribute) get_pointer;
  decltype(&::cuOccupancyMaxPotentialClusterSize) cluster_size;
  CUresult (*write32_v1)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
  CUresult (*wait32_v1)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
  CUresult (*write64_v1)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
  CUresult (*wait64_v1)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
  CUresult (*batch_v1)(CUstream, unsigned, CUstreamBatchMemOpParams_v1*, unsigned);
};
Driver g_cu;

std::atomic<int> g_first{0}, g_second{0};
void First(void*) { g_first++; }
void Second(void*) { g_second++; }

void ResolveAll() {
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  e2e::ResolveDriver("cuLibraryLoadData", &g_cu.library_load);
  e2e::ResolveDriver("cuLibraryUnload", &g_cu.library_unload);
  e2e::ResolveDriver("cuLibraryGetKernel", &g_cu.library_kernel);
  e2e::ResolveDriver("cuKernelGetLibrary", &g_cu.kernel_library);
  e2e::ResolveDriver("cuLibraryGetModule", &g_cu.library_module);
  e2e::ResolveDriver("cuKernelGetFunction", &g_cu.kernel_function);
  e2e::ResolveDriver("cuFuncGetModule", &g_cu.func_module);
  e2e::ResolveDriver("cuModuleLoadData", &g_cu.module_load);
  e2e::ResolveDriver("cuModuleUnload", &g_cu.module_unload);
  e2e::ResolveDriver("cuModuleGetFunction", &g_cu.module_function);
  e2e::ResolveDriver("cuGraphCreate", &g_cu.graph_create);
  e2e::ResolveDriver("cuGraphDestroy", &g_cu.graph_destroy);
  e2e::ResolveDriver("cuGraphAddKernelNode", &g_cu.add_kernel);
  e2e::ResolveDriver("cuGraphKernelNodeGetParams", &g_cu.kernel_params);
  e2e::ResolveDriver("cuGraphKernelNodeGetParams", &g_cu.kernel_params_v1, 11000);
  e2e::ResolveDriver("cuGraphKernelNodeSetParams", &g_cu.set_kernel_params);
  e2e::ResolveDriver("cuGraphKernelNodeGetAttribute", &g_cu.get_attr);
  e2e::ResolveDriver("cuGraphKernelNodeSetAttribute", &g_cu.set_attr);
  e2e::ResolveDriver("cuGraphKernelNodeCopyAttributes", &g_cu.copy_attrs);
  e2e::ResolveDriver("cuGraphAddMemsetNode", &g_cu.add_memset);
  e2e::ResolveDriver("cuGraphInstantiateWithParams", &g_cu.instantiate_params);
  e2e::ResolveDriver("cuGraphInstantiate", &g_cu.instantiate_v2, 11000);
  e2e::ResolveDriver("cuGraphExecGetFlags", &g_cu.exec_flags);
  e2e::ResolveDriver("cuGraphExecDestroy", &g_cu.exec_destroy);
  e2e::ResolveDriver("cuGraphLaunch", &g_cu.launch);
  e2e::ResolveDriver("cuGraphAddHostNode", &g_cu.add_host);
  e2e::ResolveDriver("cuGraphHostNodeGetParams", &g_cu.host_params);
  e2e::ResolveDriver("cuGraphExecHostNodeSetParams", &g_cu.exec_host);
  e2e::ResolveDriver("cuGraphAddEventRecordNode", &g_cu.add_record);
  e2e::ResolveDriver("cuGraphAddEventWaitNode", &g_cu.add_wait);
  e2e::ResolveDriver("cuGraphEventRecordNodeGetEvent", &g_cu.record_event);
  e2e::ResolveDriver("cuGraphEventWaitNodeGetEvent", &g_cu.wait_event);
  e2e::ResolveDriver("cuGraphEventRecordNodeSetEvent", &g_cu.set_record_event);
  e2e::ResolveDriver("cuGraphEventWaitNodeSetEvent", &g_cu.set_wait_event);
  e2e::ResolveDriver("cuGraphExecEventRecordNodeSetEvent", &g_cu.exec_record_event);
  e2e::ResolveDriver("cuCtxGetFlags", &g_cu.ctx_flags);
  e2e::ResolveDriver("cuCtxGetCurrent", &g_cu.ctx_current);
  e2e::ResolveDriver("cuCtxSetFlags", &g_cu.set_ctx_flags);
  e2e::ResolveDriver("cuCtxGetExecAffinity", &g_cu.exec_affinity);
  e2e::ResolveDriver("cuDeviceGetAttribute", &g_cu.device_attribute);
  e2e::ResolveDriver("cuDeviceGetHostAtomicCapabilities", &g_cu.host_atomics);
  e2e::ResolveDriver("cuPointerSetAttribute", &g_cu.set_pointer);
  e2e::ResolveDriver("cuPointerGetAttribute", &g_cu.get_pointer);
  e2e::ResolveDriver("cuOccupancyMaxPotentialClusterSize", &g_cu.cluster_size);
  // The ABI of CUDA 8 to 11.6 (cuGetProcAddress hands it out below 11070).
  e2e::ResolveDriver("cuStreamWriteValue32", &g_cu.write32_v1, 11000);
  e2e::ResolveDriver("cuStreamWaitValue32", &g_cu.wait32_v1, 11000);
  e2e::ResolveDriver("cuStreamWriteValue64", &g_cu.write64_v1, 11000);
  e2e::ResolveDriver("cuStreamWaitValue64", &g_cu.wait64_v1, 11000);
  e2e::ResolveDriver("cuStreamBatchMemOp", &g_cu.batch_v1, 11000);
}

void Handles(CUlibrary lib, CUmodule mod) {
  e2e::Step("handle to handle");
  CUkernel kernel = nullptr;
  CU(g_cu.library_kernel(&kernel, lib, "add_one"));
  CUlibrary owner = nullptr;
  CU(g_cu.kernel_library(&owner, kernel));
  printf("kernel.library_same=%d\n", owner == lib ? 1 : 0);
  printf("kernel.library_null_out=%s\n", e2e::CuName(g_cu.kernel_library(nullptr, kernel)));

  CUmodule lib_mod = nullptr;
  CU(g_cu.library_module(&lib_mod, lib));
  CUmodule again = nullptr;
  CU(g_cu.library_module(&again, lib));
  printf("library_module.found=%d\nlibrary_module.stable=%d\n", lib_mod != nullptr ? 1 : 0,
         again == lib_mod ? 1 : 0);
  printf("library_module.null_out=%s\n", e2e::CuName(g_cu.library_module(nullptr, lib)));
  CUfunction by_name = nullptr;
  CUresult r = g_cu.module_function(&by_name, lib_mod, "add_one");
  printf("library_module.get_function=%s\n", e2e::CuName(r));
  CUfunction kfunc = nullptr;
  CU(g_cu.kernel_function(&kfunc, kernel));
  printf("library_module.function_is_kernel_function=%d\n", by_name == kfunc ? 1 : 0);
  CUmodule of_kfunc = nullptr;
  CU(g_cu.func_module(&of_kfunc, kfunc));
  printf("kernel_function.module_is_library_module=%d\n", of_kfunc == lib_mod ? 1 : 0);
  // The library owns its module: unloading it alone is refused.
  printf("library_module.unload=%s\n", e2e::CuName(g_cu.module_unload(lib_mod)));
  CUfunction still = nullptr;
  printf("library_module.after_refused_unload=%s\n",
         e2e::CuName(g_cu.module_function(&still, lib_mod, "add_one")));

  CUfunction mfunc = nullptr;
  CU(g_cu.module_function(&mfunc, mod, "add_one"));
  CUmodule of_mfunc = nullptr;
  CU(g_cu.func_module(&of_mfunc, mfunc));
  printf("module_function.module_same=%d\n", of_mfunc == mod ? 1 : 0);
  printf("func_module.null_out=%s\n", e2e::CuName(g_cu.func_module(nullptr, mfunc)));
}

void KernelNodes(CUmodule mod, unsigned* dev) {
  e2e::Step("graph kernel nodes");
  CUfunction f = nullptr;
  CU(g_cu.module_function(&f, mod, "add_one"));
  CUgraph g = nullptr;
  CU(g_cu.graph_create(&g, 0));
  unsigned count = 1000;
  void* args[] = {&dev, &count};
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = f;
  p.gridDimX = 4;
  p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = 256;
  p.blockDimY = p.blockDimZ = 1;
  p.kernelParams = args;
  CUgraphNode node = nullptr, other = nullptr;
  CU(g_cu.add_kernel(&node, g, nullptr, 0, &p));
  count = 7;  // the node keeps the value it was given
  CU(g_cu.add_kernel(&other, g, &node, 1, &p));

  CUDA_KERNEL_NODE_PARAMS got{};
  CU(g_cu.kernel_params(node, &got));
  printf("get_params.func_same=%d\n", got.func == f ? 1 : 0);
  printf("get_params.grid=%u,%u,%u\nget_params.block=%u,%u,%u\nget_params.shared=%u\n",
         got.gridDimX, got.gridDimY, got.gridDimZ, got.blockDimX, got.blockDimY, got.blockDimZ,
         got.sharedMemBytes);
  printf("get_params.form=%s\n", got.kernelParams != nullptr && got.extra == nullptr
                                     ? "kernelParams"
                                     : (got.extra != nullptr ? "extra" : "none"));
  if (got.kernelParams != nullptr) {
    unsigned* p0 = nullptr;
    std::memcpy(&p0, got.kernelParams[0], sizeof(p0));
    printf("get_params.arg0_same=%d\nget_params.arg1=%u\n", p0 == dev ? 1 : 0,
           *static_cast<unsigned*>(got.kernelParams[1]));
  }
  CUDA_KERNEL_NODE_PARAMS_v1 v1{};
  CU(g_cu.kernel_params_v1(other, &v1));
  printf("get_params_v1.func_same=%d\nget_params_v1.arg1=%u\n", v1.func == f ? 1 : 0,
         v1.kernelParams != nullptr ? *static_cast<unsigned*>(v1.kernelParams[1]) : 0u);
  printf("get_params.null_out=%s\n", e2e::CuName(g_cu.kernel_params(node, nullptr)));

  // Arguments given as one buffer come back as one buffer.
  struct {
    unsigned* p;
    unsigned n;
    unsigned pad;
  } buf = {dev, 33, 0};
  size_t size = 12;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUDA_KERNEL_NODE_PARAMS q = p;
  q.kernelParams = nullptr;
  q.extra = extra;
  CU(g_cu.set_kernel_params(other, &q));
  CU(g_cu.kernel_params(other, &got));
  unsigned n_back = 0;
  std::string keys;  // the keys of the array handed back, in order
  for (int i = 0; got.extra != nullptr && i < 10; i += 2) {
    const uintptr_t key = reinterpret_cast<uintptr_t>(got.extra[i]);
    keys += (keys.empty() ? "" : ",") + std::to_string(key);
    if (got.extra[i] == CU_LAUNCH_PARAM_END) break;
    if (got.extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER && got.extra[i + 1] != nullptr)
      std::memcpy(&n_back, static_cast<char*>(got.extra[i + 1]) + 8, sizeof(n_back));
  }
  printf("extra.form=%s\nextra.keys=%s\nextra.arg1=%u\n",
         got.extra != nullptr ? "extra" : "kernelParams", keys.c_str(), n_back);

  // Attributes.
  CUkernelNodeAttrValue v{};
  v.cooperative = 1;
  CU(g_cu.set_attr(node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v));
  CUkernelNodeAttrValue back{};
  CU(g_cu.get_attr(node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &back));
  printf("attr.cooperative=%d\n", back.cooperative);
  CUkernelNodeAttrValue before{};
  CU(g_cu.get_attr(other, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &before));
  // As the driver answers it (measured natively on the GPU: see run_e2e.py).
  printf("attr.copy=%s\n", e2e::CuName(g_cu.copy_attrs(other, node)));
  CUkernelNodeAttrValue copied{};
  CU(g_cu.get_attr(other, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &copied));
  printf("attr.before_copy=%d\nattr.copied=%d\n", before.cooperative, copied.cooperative);
  {  // into a node of its own graph, with no dependency and plain kernelParams
    CUgraph g2 = nullptr;
    CU(g_cu.graph_create(&g2, 0));
    CUgraphNode fresh = nullptr;
    CU(g_cu.add_kernel(&fresh, g2, nullptr, 0, &p));
    printf("attr.copy_other_graph=%s\n", e2e::CuName(g_cu.copy_attrs(fresh, node)));
    CUgraphNode sibling = nullptr;
    CU(g_cu.add_kernel(&sibling, g, nullptr, 0, &p));
    printf("attr.copy_same_graph=%s\n", e2e::CuName(g_cu.copy_attrs(sibling, node)));
    CU(g_cu.graph_destroy(g2));
  }
  CUDA_MEMSET_NODE_PARAMS ms{};
  ms.dst = reinterpret_cast<CUdeviceptr>(dev);
  ms.elementSize = 4;
  ms.width = 16;
  ms.height = 1;
  CUgraphNode memset_node = nullptr;
  CUcontext ctx = nullptr;
  CU(g_cu.ctx_current(&ctx));
  CU(g_cu.add_memset(&memset_node, g, nullptr, 0, &ms, ctx));
  printf("attr.of_memset_node=%s\n",
         e2e::CuName(g_cu.get_attr(memset_node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &back)));
  v.cooperative = 0;
  CU(g_cu.set_attr(node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v));
  CU(g_cu.set_attr(other, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v));

  // Instantiation with parameters, and the flags it leaves.
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_GRAPH_INSTANTIATE_PARAMS ip{};
  ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
  ip.hUploadStream = reinterpret_cast<CUstream>(stream);
  ip.result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
  CUgraphExec exec = nullptr;
  CU(g_cu.instantiate_params(&exec, g, &ip));
  cuuint64_t flags = 99;
  CU(g_cu.exec_flags(exec, &flags));
  printf("instantiate.result=%d\ninstantiate.err_node_null=%d\ninstantiate.upload_flags=%llu\n",
         static_cast<int>(ip.result_out), ip.hErrNode_out == nullptr ? 1 : 0,
         static_cast<unsigned long long>(flags));
  CU(g_cu.launch(exec, reinterpret_cast<CUstream>(stream)));
  CK(cudaStreamSynchronize(stream));
  CU(g_cu.exec_destroy(exec));
  ip = CUDA_GRAPH_INSTANTIATE_PARAMS{};
  ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
  CU(g_cu.instantiate_params(&exec, g, &ip));
  CU(g_cu.exec_flags(exec, &flags));
  printf("instantiate.auto_free_flags=%llu\n", static_cast<unsigned long long>(flags));
  CU(g_cu.exec_destroy(exec));
  printf("instantiate.null_params=%s\n", e2e::CuName(g_cu.instantiate_params(&exec, g, nullptr)));
  CUgraphNode err_node = memset_node;  // overwritten: no node failed
  char log[64] = "unchanged";
  CU(g_cu.instantiate_v2(&exec, g, &err_node, log, sizeof(log)));
  CU(g_cu.exec_flags(exec, &flags));
  printf("instantiate_v11.flags=%llu\ninstantiate_v11.err_node_null=%d\n",
         static_cast<unsigned long long>(flags), err_node == nullptr ? 1 : 0);
  CU(g_cu.exec_destroy(exec));
  CK(cudaStreamDestroy(stream));
  CU(g_cu.graph_destroy(g));
}

void HostAndEventNodes() {
  e2e::Step("host and event nodes of an executable graph");
  CUgraph g = nullptr;
  CU(g_cu.graph_create(&g, 0));
  CUDA_HOST_NODE_PARAMS hp{First, nullptr};
  CUgraphNode host = nullptr;
  CU(g_cu.add_host(&host, g, nullptr, 0, &hp));
  cudaEvent_t e1, e2, e3;
  CK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&e3, cudaEventDisableTiming));
  CUgraphNode record = nullptr, wait = nullptr;
  CU(g_cu.add_record(&record, g, &host, 1, reinterpret_cast<CUevent>(e1)));
  CU(g_cu.add_wait(&wait, g, &record, 1, reinterpret_cast<CUevent>(e1)));
  CU(g_cu.set_record_event(record, reinterpret_cast<CUevent>(e2)));
  CU(g_cu.set_wait_event(wait, reinterpret_cast<CUevent>(e2)));
  CUevent got_record = nullptr, got_wait = nullptr;
  CU(g_cu.record_event(record, &got_record));
  CU(g_cu.wait_event(wait, &got_wait));
  printf("event.record_set=%d\nevent.wait_set=%d\n",
         got_record == reinterpret_cast<CUevent>(e2) ? 1 : 0,
         got_wait == reinterpret_cast<CUevent>(e2) ? 1 : 0);
  printf("event.set_on_host_node=%s\n",
         e2e::CuName(g_cu.set_record_event(host, reinterpret_cast<CUevent>(e2))));

  CUgraphExec exec = nullptr;
  CUDA_GRAPH_INSTANTIATE_PARAMS ip{};
  CU(g_cu.instantiate_params(&exec, g, &ip));
  CUDA_HOST_NODE_PARAMS second{Second, nullptr};
  CU(g_cu.exec_host(exec, host, &second));
  CU(g_cu.exec_record_event(exec, record, reinterpret_cast<CUevent>(e3)));
  CU(g_cu.launch(exec, nullptr));
  CK(cudaStreamSynchronize(nullptr));
  printf("exec_host.new_ran=%d\nexec_host.old_ran=%d\n", g_second.load(), g_first.load());
  CUDA_HOST_NODE_PARAMS still{};
  CU(g_cu.host_params(host, &still));
  printf("exec_host.graph_node_unchanged=%d\n", still.fn == First ? 1 : 0);
  printf("exec_event.recorded=%s\n", cudaGetErrorName(cudaEventQuery(e3)));
  CU(g_cu.exec_destroy(exec));
  CU(g_cu.graph_destroy(g));
  CK(cudaEventDestroy(e1));
  CK(cudaEventDestroy(e2));
  CK(cudaEventDestroy(e3));
}

void ContextsAndDevices(CUmodule mod, unsigned* dev) {
  e2e::Step("contexts and devices");
  unsigned old_flags = 0, now = 0;
  CU(g_cu.ctx_flags(&old_flags));
  CU(g_cu.set_ctx_flags((old_flags & ~CU_CTX_SCHED_MASK) | CU_CTX_SCHED_BLOCKING_SYNC));
  CU(g_cu.ctx_flags(&now));
  printf("ctx_flags.sched_after_set=%u\n", now & CU_CTX_SCHED_MASK);
  printf("ctx_flags.bogus=%s\n", e2e::CuName(g_cu.set_ctx_flags(0x10000u)));
  CU(g_cu.set_ctx_flags(old_flags));
  CU(g_cu.ctx_flags(&now));
  printf("ctx_flags.restored=%d\n", now == old_flags ? 1 : 0);

  int sms = 0;
  CU(g_cu.device_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
  CUexecAffinityParam aff{};
  CU(g_cu.exec_affinity(&aff, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
  printf("exec_affinity.type=%d\nexec_affinity.is_device_sms=%d\n", static_cast<int>(aff.type),
         aff.param.smCount.val == static_cast<unsigned>(sms) ? 1 : 0);
  printf("exec_affinity.null=%s\n",
         e2e::CuName(g_cu.exec_affinity(nullptr, CU_EXEC_AFFINITY_TYPE_SM_COUNT)));

  const CUatomicOperation ops[3] = {CU_ATOMIC_OPERATION_INTEGER_ADD, CU_ATOMIC_OPERATION_CAS,
                                    CU_ATOMIC_OPERATION_FLOAT_ADD};
  unsigned caps[3] = {0, 0, 0};
  CUresult r = g_cu.host_atomics(caps, ops, 3, 0);
  printf("host_atomics.result=%s\nhost_atomics.caps=%u,%u,%u\n", e2e::CuName(r), caps[0], caps[1],
         caps[2]);
  printf("host_atomics.count0=%s\n", e2e::CuName(g_cu.host_atomics(caps, ops, 0, 0)));
  printf("host_atomics.bad_device=%s\n", e2e::CuName(g_cu.host_atomics(caps, ops, 3, 99)));
  const CUatomicOperation bogus = static_cast<CUatomicOperation>(77);
  printf("host_atomics.bad_op=%s\n", e2e::CuName(g_cu.host_atomics(caps, &bogus, 1, 0)));

  const CUdeviceptr d = reinterpret_cast<CUdeviceptr>(dev);
  unsigned one = 1;
  int sync = -1;
  CU(g_cu.get_pointer(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d));
  printf("pointer.sync_before=%d\n", sync);
  CU(g_cu.set_pointer(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d));
  CU(g_cu.get_pointer(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d + 64));
  printf("pointer.sync_after=%d\n", sync);
  // What kind of memory it is, as the H200's driver answers (tests/gpu/ml/pointer_attributes.py):
  // cudaMalloc memory is legacy-IPC capable and GPUDirect RDMA capable where the device is;
  // a pool's is neither and names its pool; the GPU reads and writes both.
  int ipc = -1, rdma = -1, rdma_device = -1;
  unsigned access = 0;
  void* pool_of = reinterpret_cast<void*>(1);
  CU(g_cu.get_pointer(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, d));
  CU(g_cu.get_pointer(&rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, d));
  CK(cudaDeviceGetAttribute(&rdma_device, cudaDevAttrGPUDirectRDMASupported, 0));
  CU(g_cu.get_pointer(&access, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, d));
  CU(g_cu.get_pointer(&pool_of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d));
  printf("pointer.malloc=ipc%d,rdma_as_device%d,access%u,pool%d\n", ipc, rdma == (rdma_device != 0),
         access, pool_of != nullptr);
  void* from_pool = nullptr;
  cudaMemPool_t default_pool = nullptr;
  CK(cudaMallocAsync(&from_pool, 4096, 0));
  CK(cudaDeviceGetDefaultMemPool(&default_pool, 0));
  const CUdeviceptr fp = reinterpret_cast<CUdeviceptr>(from_pool);
  CU(g_cu.get_pointer(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, fp));
  CU(g_cu.get_pointer(&rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, fp));
  CU(g_cu.get_pointer(&access, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, fp + 100));
  CU(g_cu.get_pointer(&pool_of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, fp));
  printf("pointer.malloc_async=ipc%d,rdma%d,access%u,default_pool%d\n", ipc, rdma, access,
         pool_of == static_cast<void*>(default_pool));
  CK(cudaFreeAsync(from_pool, 0));
  CK(cudaDeviceSynchronize());
  // cudaMemcpyBatchAsync (CUDA 12.8+): one batch of H2D from memory read during the call
  // (overwritten right after it returns) and D2D; a second of D2H to pinned and to pageable
  // memory; the arguments the driver refuses.
  {
    int* dev_batch = nullptr;
    int* pinned = nullptr;
    CK(cudaMalloc(&dev_batch, 3 * 4096));
    CK(cudaMallocHost(&pinned, 4096));
    CK(cudaMemset(dev_batch + 2048, 5, 4096));
    CK(cudaDeviceSynchronize());  // the batches run on a non-blocking stream
    std::vector<int> source(1024), back(1024, -1);
    for (int i = 0; i < 1024; ++i) source[i] = 3 * i;
    cudaStream_t bs;
    CK(cudaStreamCreateWithFlags(&bs, cudaStreamNonBlocking));
    void* dsts[2] = {dev_batch, dev_batch + 1024};
    const void* srcs[2] = {source.data(), dev_batch + 2048};
    size_t sizes[2] = {4096, 4096};
    cudaMemcpyAttributes at[2] = {};
    at[0].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    at[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idxs[2] = {0, 1};
    CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, at, idxs, 2, bs));
    for (int i = 0; i < 1024; ++i) source[i] = -7;  // read during the call: too late to matter
    void* dsts2[2] = {pinned, back.data()};
    const void* srcs2[2] = {dev_batch, dev_batch + 1024};
    at[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t one[1] = {0};
    CK(cudaMemcpyBatchAsync(dsts2, srcs2, sizes, 2, at, one, 1, bs));
    CK(cudaStreamSynchronize(bs));
    int h2d = 1, d2d = 1;
    for (int i = 0; i < 1024; ++i) {
      h2d &= pinned[i] == 3 * i;
      d2d &= back[i] == 0x05050505;
    }
    printf("batch.ok=%d\n", h2d && d2d);
    if (!h2d || !d2d)
      printf("batch.detail=h2d%d,d2d%d,first%d,last%d\n", h2d, d2d, pinned[0], pinned[1023]);
    printf("batch.legacy_stream=%d\n",
           static_cast<int>(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, at, idxs, 2, 0)));
    cudaGetLastError();
    size_t bad_first[1] = {1};
    printf("batch.first_index_not_0=%d\n",
           static_cast<int>(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, at, bad_first, 1, bs)));
    cudaGetLastError();
    at[0].srcAccessOrder = static_cast<cudaMemcpySrcAccessOrder>(0);
    printf("batch.bad_order=%d\n",
           static_cast<int>(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, at, one, 1, bs)));
    cudaGetLastError();
    CK(cudaStreamSynchronize(bs));
    CK(cudaStreamDestroy(bs));
    CK(cudaFreeHost(pinned));
    CK(cudaFree(dev_batch));
  }
  int on_stack = 0;
  printf("pointer.set_host_stack=%s\n",
         e2e::CuName(g_cu.set_pointer(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                                      reinterpret_cast<CUdeviceptr>(&on_stack))));

  CUfunction f = nullptr;
  CU(g_cu.module_function(&f, mod, "add_one"));
  CUlaunchConfig cfg{};
  cfg.gridDimX = 16;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 128;
  cfg.blockDimY = cfg.blockDimZ = 1;
  int cluster = 0;
  r = g_cu.cluster_size(&cluster, f, &cfg);
  printf("cluster_size.result=%s\ncluster_size=%d\n", e2e::CuName(r), cluster);
  printf("cluster_size.null_config=%s\n", e2e::CuName(g_cu.cluster_size(&cluster, f, nullptr)));
}

void StreamMemOpsV1(unsigned* dev) {
  e2e::Step("stream memory operations, the ABI before CUDA 11.7");
  int enabled = 0;
  CU(g_cu.device_attribute(&enabled, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0));
  printf("v1.enabled=%d\n", enabled);
  CK(cudaMemset(dev, 0, 64));
  CK(cudaDeviceSynchronize());
  const CUdeviceptr flag = reinterpret_cast<CUdeviceptr>(dev);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const CUstream cs = reinterpret_cast<CUstream>(s);
  CUresult r = g_cu.write32_v1(cs, flag, 5, 0);
  printf("v1.write32=%s\n", e2e::CuName(r));
  if (!enabled || r != CUDA_SUCCESS) {
    CK(cudaStreamDestroy(s));
    return;
  }
  CU(g_cu.wait32_v1(cs, flag, 5, CU_STREAM_WAIT_VALUE_EQ));
  CU(g_cu.write64_v1(cs, flag + 8, (1ull << 36) + 3, 0));
  CU(g_cu.wait64_v1(cs, flag + 8, 1ull << 36, CU_STREAM_WAIT_VALUE_GEQ));
  CUstreamBatchMemOpParams_v1 batch[2] = {};
  batch[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  batch[0].writeValue.address = flag + 16;
  batch[0].writeValue.value = 21;
  batch[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  batch[1].waitValue.address = flag + 16;
  batch[1].waitValue.value = 20;
  batch[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  CU(g_cu.batch_v1(cs, 2, batch, 0));
  CK(cudaStreamSynchronize(s));
  uint32_t v32[6] = {};
  CK(cudaMemcpy(v32, dev, sizeof(v32), cudaMemcpyDeviceToHost));
  uint64_t v64 = 0;
  std::memcpy(&v64, v32 + 2, sizeof(v64));
  printf("v1.value32=%u\nv1.value64=%llu\nv1.batch_value=%u\n", v32[0],
         static_cast<unsigned long long>(v64), v32[4]);
  printf("v1.misaligned=%s\n", e2e::CuName(g_cu.write32_v1(cs, flag + 2, 1, 0)));
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
}

}  // namespace

int main() {
  e2e::Init("driver_queries");
  ResolveAll();
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  printf("under_flyt=%d\n", e2e::UnderFlyt() ? 1 : 0);
  CUlibrary lib = nullptr;
  CU(g_cu.library_load(&lib, e2e::kAddOnePtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUmodule mod = nullptr;
  CU(g_cu.module_load(&mod, e2e::kAddOnePtx));
  unsigned* dev = nullptr;
  CK(cudaMalloc(&dev, 4096));
  CK(cudaMemset(dev, 0, 4096));

  Handles(lib, mod);
  KernelNodes(mod, dev);
  HostAndEventNodes();
  ContextsAndDevices(mod, dev);
  StreamMemOpsV1(dev);

  CK(cudaFree(dev));
  CU(g_cu.module_unload(mod));
  CU(g_cu.library_unload(lib));
  e2e::Pass();
  return 0;
}
