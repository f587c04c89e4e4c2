// Stream-capture queries. Defined beside the legacy ABIs of the same names
// (cuStreamGetCaptureInfo v1, _v2, _v3), so cuda.h must not rename them.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "client/client.h"

using flyt::client::Client;
using flyt::client::Forward;
using flyt::client::ReplySink;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

// --- stream capture state. Dependency lists stay on the server: a capturing
// stream reports its status, id and graph, and no dependency nodes.

namespace {
CUresult CaptureInfo(const char* name, CUstream s, bool pt, CUstreamCaptureStatus* status,
                     cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                     const CUgraphEdgeData** edges, size_t* count) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!c.AnyCapture()) {
    // No capture anywhere in this process: PyTorch asks around every
    // allocation and cuBLAS call, so this must cost no round trip.
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (id) *id = 0;
    if (graph) *graph = nullptr;
    if (deps) *deps = nullptr;
    if (edges) *edges = nullptr;
    if (count) *count = 0;
    return CUDA_SUCCESS;
  }
  wire::Writer w;
  w.Put<uint64_t>(reinterpret_cast<uintptr_t>(s));
  std::vector<uint8_t> reply;
  CUresult rc =
      c.Call(name, ops::kOpStreamCaptureInfo, w, ReplySink{&reply}, pt ? wire::kFlagPerThread : 0);
  if (rc != CUDA_SUCCESS) return rc;
  wire::Reader r(reply.data(), reply.size());
  uint32_t st = 0;
  uint64_t i = 0, g = 0, n = 0;
  if (!r.Get(&st) || !r.Get(&i) || !r.Get(&g) || !r.Get(&n)) return CUDA_ERROR_UNKNOWN;
  *status = static_cast<CUstreamCaptureStatus>(st);
  if (id) *id = i;
  if (graph) *graph = reinterpret_cast<CUgraph>(g);
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (count) *count = 0;
  return CUDA_SUCCESS;
}
CUresult IsCapturing(const char* name, CUstream s, bool pt, CUstreamCaptureStatus* status) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!c.AnyCapture()) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  return pt ? Forward<120, true, true>(name, s, status)
            : Forward<120, true, false>(name, s, status);
}

CUresult EndCapture(const char* name, CUstream s, bool pt, CUgraph* graph) {
  CUresult rc =
      pt ? Forward<119, true, true>(name, s, graph) : Forward<119, true, false>(name, s, graph);
  // These answers end the capture; any other leaves the count high (safe).
  if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
      rc == CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
    Client::Get().CaptureEnded();
  return rc;
}
}  // namespace

FLYT_API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  return IsCapturing("cuStreamIsCapturing", s, false, status);
}
FLYT_API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* status) {
  return IsCapturing("cuStreamIsCapturing_ptsz", s, true, status);
}
FLYT_API CUresult cuStreamEndCapture(CUstream s, CUgraph* graph) {
  return EndCapture("cuStreamEndCapture", s, false, graph);
}
FLYT_API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* graph) {
  return EndCapture("cuStreamEndCapture_ptsz", s, true, graph);
}

FLYT_API CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus* st, cuuint64_t* id) {
  return CaptureInfo("cuStreamGetCaptureInfo", s, false, st, id, nullptr, nullptr, nullptr,
                     nullptr);
}
FLYT_API CUresult cuStreamGetCaptureInfo_ptsz(CUstream s, CUstreamCaptureStatus* st,
                                              cuuint64_t* id) {
  return CaptureInfo("cuStreamGetCaptureInfo_ptsz", s, true, st, id, nullptr, nullptr, nullptr,
                     nullptr);
}
FLYT_API CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus* st, cuuint64_t* id,
                                            CUgraph* g, const CUgraphNode** deps, size_t* n) {
  return CaptureInfo("cuStreamGetCaptureInfo_v2", s, false, st, id, g, deps, nullptr, n);
}
FLYT_API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream s, CUstreamCaptureStatus* st,
                                                 cuuint64_t* id, CUgraph* g,
                                                 const CUgraphNode** deps, size_t* n) {
  return CaptureInfo("cuStreamGetCaptureInfo_v2_ptsz", s, true, st, id, g, deps, nullptr, n);
}
FLYT_API CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus* st, cuuint64_t* id,
                                            CUgraph* g, const CUgraphNode** deps,
                                            const CUgraphEdgeData** edges, size_t* n) {
  return CaptureInfo("cuStreamGetCaptureInfo_v3", s, false, st, id, g, deps, edges, n);
}
FLYT_API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream s, CUstreamCaptureStatus* st,
                                                 cuuint64_t* id, CUgraph* g,
                                                 const CUgraphNode** deps,
                                                 const CUgraphEdgeData** edges, size_t* n) {
  return CaptureInfo("cuStreamGetCaptureInfo_v3_ptsz", s, true, st, id, g, deps, edges, n);
}
