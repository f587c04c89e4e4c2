// cuStreamBatchMemOp: a batch of stream memory operations (waits, writes, flushes,
// barriers) on one of the session's streams (kOpStreamBatchMemOp, protocol/ops.h).
//
// Owns: decoding and checking the batch. The addresses are device pointers the driver
// checks itself; the single-operation calls (cuStreamWaitValue32 ...) are generic
// (protocol/api_list.h). Must not touch anything but the stream named.
#include <cstring>

#include "server/session.h"

namespace flyt::server {

using marshal::HandleKind;
using wire::Reader;

static_assert(sizeof(CUstreamBatchMemOpParams) == 48, "the batch travels as 48-byte entries");

bool Session::StreamBatchMemOp(Reader& in, bool per_thread, CUresult* rc) {
  DriverApi& a = state_->api;
  uint64_t stream = 0;
  uint32_t flags = 0, count = 0;
  if (!in.Get(&stream) || !in.Get(&flags) || !in.Get(&count) || count > ops::kMaxBatchMemOps ||
      in.remaining() != count * sizeof(CUstreamBatchMemOpParams))
    return false;
  std::vector<CUstreamBatchMemOpParams> ops(count);
  if (count > 0) std::memcpy(ops.data(), in.Skip(in.remaining()), count * sizeof(ops[0]));
  if (stream > 2 && !Owns(HandleKind::kStream, stream)) {
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return true;
  }
  auto batch = per_thread && a.cuStreamBatchMemOp_v2_pt ? a.cuStreamBatchMemOp_v2_pt
                                                        : a.cuStreamBatchMemOp_v2;
  *rc = batch == nullptr ? CUDA_ERROR_NOT_SUPPORTED
                         : batch(RealStream(stream == 0 && per_thread ? 2 : stream), count,
                                 count > 0 ? ops.data() : nullptr, flags);
  return true;
}

}  // namespace flyt::server
