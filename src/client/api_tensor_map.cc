// TMA descriptors: cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col,
// cuTensorMapEncodeIm2colWide and cuTensorMapReplaceAddress.
//
// Owns: sending the app's arguments (protocol/tensor_map.h) to the server's
// driver, which encodes the 128-byte descriptor, and a cache of the answers.
// Encoding is a pure function of the arguments (it touches neither the GPU nor
// a context), and libraries encode the same descriptors again and again (cuDNN
// before each launch of its fused attention), so an argument list seen before
// is answered here without a round trip. Failures are never cached: the
// server's driver gives each its own error. With several servers
// (client/multi_server.cc) a descriptor is encoded by the server whose memory
// holds its global address (else the current context's), and the cache keys
// on that server too. Must not touch code images or launches (api_code.cc).
#include <cuda.h>

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "client/client.h"
#include "protocol/ops.h"
#include "protocol/tensor_map.h"

using flyt::client::Client;
using flyt::client::ReplySink;
namespace tmap = flyt::tensor_map;
namespace wire = flyt::wire;
namespace ops = flyt::ops;

namespace {

constexpr size_t kMaxCached = 4096;  // descriptors; the cache starts over when full

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, CUtensorMap> maps;  // request bytes -> descriptor
};
Cache& TheCache() {
  static Cache* c = new Cache;  // never destroyed: the app may encode during exit
  return *c;
}

CUresult Encode(const char* name, const tmap::Request& q, CUtensorMap* out) {
  Client& c = Client::Get();
  if (!c.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  wire::Writer w;
  tmap::Put(w, q);
  std::string key(reinterpret_cast<const char*>(w.data()), w.size());
  // Several servers: the server of the tensor's memory encodes it.
  int route = -1;
  if (c.multi()) [[unlikely]] {
    route = c.ServerOfPointer(q.address);
    if (route < 0) route = c.RouteNow();
    key.push_back(static_cast<char>(route));
  }
  Client::RouteScope scope(route);
  Cache& cache = TheCache();
  if (out != nullptr) {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.maps.find(key);
    if (it != cache.maps.end()) {
      *out = it->second;
      return CUDA_SUCCESS;
    }
  }
  CUtensorMap map{};
  std::vector<uint8_t> ignored;
  ReplySink sink = out != nullptr ? ReplySink{nullptr, &map, sizeof map} : ReplySink{&ignored};
  CUresult rc = c.Call(name, ops::kOpTensorMap, w, sink);
  if (rc != CUDA_SUCCESS || out == nullptr) return rc;
  *out = map;
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.maps.size() >= kMaxCached) cache.maps.clear();
  cache.maps.emplace(std::move(key), map);
  return CUDA_SUCCESS;
}

// The fields every encoding has. A rank the driver can never accept is
// refused here, before its arrays are read.
bool Common(tmap::Request* q, tmap::Which which, CUtensorMap* map, CUtensorMapDataType dtype,
            cuuint32_t rank, void* address, const cuuint64_t* dims, const cuuint64_t* strides,
            const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
            CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  if (rank == 0 || rank > tmap::kMaxTensorRank) return false;
  q->which = which;
  q->has_map = map != nullptr;
  q->dtype = static_cast<uint32_t>(dtype);
  q->rank = rank;
  q->address = reinterpret_cast<uintptr_t>(address);
  q->dims = tmap::Array(dims, rank);
  q->strides = tmap::Array(strides, rank - 1);
  q->element_strides = tmap::Array(element_strides, rank);
  q->interleave = static_cast<uint32_t>(interleave);
  q->swizzle = static_cast<uint32_t>(swizzle);
  q->l2 = static_cast<uint32_t>(l2);
  q->oob = static_cast<uint32_t>(oob);
  return true;
}

}  // namespace

FLYT_API CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype,
                                         cuuint32_t rank, void* address, const cuuint64_t* dims,
                                         const cuuint64_t* strides, const cuuint32_t* box,
                                         const cuuint32_t* element_strides,
                                         CUtensorMapInterleave interleave,
                                         CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                         CUtensorMapFloatOOBfill oob) {
  tmap::Request q;
  if (!Common(&q, tmap::kTiled, map, dtype, rank, address, dims, strides, element_strides,
              interleave, swizzle, l2, oob))
    return CUDA_ERROR_INVALID_VALUE;
  q.box = tmap::Array(box, rank);
  return Encode("cuTensorMapEncodeTiled", q, map);
}

FLYT_API CUresult cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType dtype,
                                          cuuint32_t rank, void* address, const cuuint64_t* dims,
                                          const cuuint64_t* strides, const int* lower,
                                          const int* upper, cuuint32_t channels, cuuint32_t pixels,
                                          const cuuint32_t* element_strides,
                                          CUtensorMapInterleave interleave,
                                          CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                          CUtensorMapFloatOOBfill oob) {
  tmap::Request q;
  if (!Common(&q, tmap::kIm2col, map, dtype, rank, address, dims, strides, element_strides,
              interleave, swizzle, l2, oob))
    return CUDA_ERROR_INVALID_VALUE;
  q.lower = tmap::Array(lower, tmap::CornerCount(rank));
  q.upper = tmap::Array(upper, tmap::CornerCount(rank));
  q.channels = channels;
  q.pixels = pixels;
  return Encode("cuTensorMapEncodeIm2col", q, map);
}

FLYT_API CUresult cuTensorMapEncodeIm2colWide(
    CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* address,
    const cuuint64_t* dims, const cuuint64_t* strides, int lower_w, int upper_w,
    cuuint32_t channels, cuuint32_t pixels, const cuuint32_t* element_strides,
    CUtensorMapInterleave interleave, CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  tmap::Request q;
  if (!Common(&q, tmap::kIm2colWide, map, dtype, rank, address, dims, strides, element_strides,
              interleave, swizzle, l2, oob))
    return CUDA_ERROR_INVALID_VALUE;
  q.lower_w = lower_w;
  q.upper_w = upper_w;
  q.channels = channels;
  q.pixels = pixels;
  q.wide_mode = static_cast<uint32_t>(mode);
  return Encode("cuTensorMapEncodeIm2colWide", q, map);
}

FLYT_API CUresult cuTensorMapReplaceAddress(CUtensorMap* map, void* address) {
  if (map == nullptr) return CUDA_ERROR_INVALID_VALUE;
  tmap::Request q;
  q.which = tmap::kReplaceAddress;
  q.has_map = true;
  std::memcpy(q.map, map, sizeof q.map);
  q.address = reinterpret_cast<uintptr_t>(address);
  return Encode("cuTensorMapReplaceAddress", q, map);
}
