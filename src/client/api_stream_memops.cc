// cuStreamBatchMemOp (the _v2 ABI and its per-thread twin): a batch of stream memory
// operations sent as one request (kOpStreamBatchMemOp); errors come back at the call,
// as natively. The single operations (cuStreamWaitValue32 ...) are generic calls.
//
// With several servers (client/multi_server.cc) the batch goes to the stream's server
// (the current context's for a default stream), the stream sent without its tag; an
// address known as another server's memory is refused (RefuseAcrossServers). The same
// rule serves the pre-11.7 ABI (client/api_driver_misc.cc).
//
// Owns: packing the batch, and where stream memory operations go. Must not touch other
// streams' state; no stdout.
#include <vector>

#include "client/client.h"

using flyt::client::Client;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace flyt::client {

uint64_t MemOpAddress(const CUstreamBatchMemOpParams& p) {
  switch (p.operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      return p.waitValue.address;
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
      return p.writeValue.address;
    default:  // flushes and barriers name no memory
      return 0;
  }
}

int StreamMemOpServer(CUstream stream, const uint64_t* addresses, size_t n) {
  Client& c = Client::Get();
  if (!c.multi()) return -1;
  const int server = c.StreamRoute(stream);
  for (size_t i = 0; i < n; ++i) {
    const int owner = addresses[i] != 0 ? c.ServerOfPointer(addresses[i]) : -1;
    if (owner >= 0 && owner != server) return -2;
  }
  return server;
}

}  // namespace flyt::client

namespace {

CUresult Batch(const char* name, bool per_thread, CUstream stream, unsigned count,
               CUstreamBatchMemOpParams* params, unsigned flags) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count > ops::kMaxBatchMemOps || (count > 0 && params == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint64_t> addresses(count);
  for (unsigned i = 0; i < count; ++i) addresses[i] = flyt::client::MemOpAddress(params[i]);
  const int server = flyt::client::StreamMemOpServer(stream, addresses.data(), count);
  if (server == -2) return flyt::client::RefuseAcrossServers(name);
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
