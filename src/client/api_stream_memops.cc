// cuStreamBatchMemOp (the _v2 ABI and its per-thread twin): a batch of stream memory
// operations sent as one request (kOpStreamBatchMemOp); errors come back at the call,
// as natively. The single operations (cuStreamWaitValue32 ...) are generic calls.
//
// With several servers (client/multi_server.cc) the batch goes to the stream's server
// (the current context's for a default stream), the stream sent without its tag; an
// address known as another server's memory is refused (RefuseAcrossServers).
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
  int server = -1;
  if (c.multi()) {
    const uint64_t raw = reinterpret_cast<uintptr_t>(stream);
    server = raw > 2 ? Client::TagOf(raw) : c.RouteNow();
    for (unsigned i = 0; i < count; ++i) {
      const CUstreamBatchMemOpParams& p = params[i];
      uint64_t address = 0;
      switch (p.operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
          address = p.waitValue.address;
          break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
          address = p.writeValue.address;
          break;
        default:  // flushes and barriers name no memory
          break;
      }
      const int owner = address != 0 ? c.ServerOfPointer(address) : -1;
      if (owner >= 0 && owner != server) return flyt::client::RefuseAcrossServers(name);
    }
  }
  wire::Writer w;
  w.Put<uint64_t>(Client::WireHandle(stream));
  w.Put<uint32_t>(flags);
  w.Put<uint32_t>(count);
  if (count > 0) w.PutBytes(params, count * sizeof(CUstreamBatchMemOpParams));
  Client::RouteScope route(server);
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
