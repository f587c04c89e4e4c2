// cuStreamBatchMemOp (the _v2 ABI and its per-thread twin): a batch of stream memory
// operations sent as one request (kOpStreamBatchMemOp); errors come back at the call,
// as natively. The single operations (cuStreamWaitValue32 ...) are generic calls.
//
// Owns: packing the batch. Must not touch other streams' state; no stdout.
#include "client/client.h"

using flyt::client::Client;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace {

CUresult Batch(const char* name, bool per_thread, CUstream stream, unsigned count,
               CUstreamBatchMemOpParams* params, unsigned flags) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count > ops::kMaxBatchMemOps || (count > 0 && params == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  wire::Writer w;
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(stream));
  w.Put<uint32_t>(flags);
  w.Put<uint32_t>(count);
  if (count > 0) w.PutBytes(params, count * sizeof(CUstreamBatchMemOpParams));
  return c.Call(name, ops::kOpStreamBatchMemOp, w, ReplySink{},
                per_thread ? wire::kFlagPerThread : 0);
}

}  // namespace

FLYT_API CUresult cuStreamBatchMemOp_v2(CUstream stream, unsigned count,
                                        CUstreamBatchMemOpParams* params, unsigned flags) {
  return Batch("cuStreamBatchMemOp", false, stream, count, params, flags);
}
FLYT_API CUresult cuStreamBatchMemOp_v2_ptsz(CUstream stream, unsigned count,
                                             CUstreamBatchMemOpParams* params, unsigned flags) {
  return Batch("cuStreamBatchMemOp_ptsz", true, stream, count, params, flags);
}
