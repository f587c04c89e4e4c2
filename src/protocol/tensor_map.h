// TMA descriptors (CUtensorMap, Hopper and later) on the wire: kOpTensorMap.
//
// Owns: one request type for cuTensorMapEncodeTiled / Im2col / Im2colWide and
// cuTensorMapReplaceAddress, and its encoding, shared by the client
// (client/api_tensor_map.cc) and the server (server/session_tensor_map.cc), so
// the two sides cannot read it differently. Array lengths follow from the rank
// (1..kMaxTensorRank), and an array the app passed as NULL travels as absent,
// so the driver sees the app's exact arguments and gives its own errors. The
// reply is the 128-byte descriptor. Must not know about sessions or transports.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "protocol/codec.h"

namespace flyt::tensor_map {

inline constexpr uint32_t kMaxTensorRank = 5;  // the driver's limit for every kind
inline constexpr size_t kMapBytes = sizeof(CUtensorMap);
static_assert(kMapBytes == 128);

enum Which : uint8_t { kTiled = 1, kIm2col = 2, kIm2colWide = 3, kReplaceAddress = 4 };

struct Request {
  uint8_t which = 0;
  bool has_map = false;         // the app's CUtensorMap* was not NULL
  uint8_t map[kMapBytes] = {};  // kReplaceAddress: the descriptor to change
  uint32_t dtype = 0, rank = 0;
  uint64_t address = 0;
  std::optional<std::vector<cuuint64_t>> dims, strides;    // rank, rank - 1
  std::optional<std::vector<cuuint32_t>> box;              // kTiled: rank
  std::optional<std::vector<int>> lower, upper;            // kIm2col: rank - 2
  std::optional<std::vector<cuuint32_t>> element_strides;  // rank
  int32_t lower_w = 0, upper_w = 0;                        // kIm2colWide
  uint32_t channels = 0, pixels = 0, wide_mode = 0;
  uint32_t interleave = 0, swizzle = 0, l2 = 0, oob = 0;
};

// Entries of an im2col corner array: one per spatial dimension.
inline size_t CornerCount(uint32_t rank) { return rank > 2 ? rank - 2 : 0; }

// A pointer's `n` elements, or absent for NULL.
template <typename T>
std::optional<std::vector<T>> Array(const T* p, size_t n) {
  if (p == nullptr) return std::nullopt;
  return std::vector<T>(p, p + n);
}
template <typename T>
const T* Data(const std::optional<std::vector<T>>& a) {
  return a ? a->data() : nullptr;
}

namespace detail {
template <typename T>
void PutArray(wire::Writer& w, const std::optional<std::vector<T>>& a) {
  w.Put<uint8_t>(a ? 1 : 0);
  if (a) w.PutBytes(a->data(), a->size() * sizeof(T));
}
template <typename T>
bool GetArray(wire::Reader& r, size_t n, std::optional<std::vector<T>>* a) {
  uint8_t present = 0;
  if (!r.Get(&present) || present > 1) return false;
  if (!present) return true;
  a->emplace(n);
  return r.GetBytes((*a)->data(), n * sizeof(T));
}
}  // namespace detail

inline void Put(wire::Writer& w, const Request& q) {
  w.Put(q.which);
  w.Put<uint8_t>(q.has_map ? 1 : 0);
  if (q.which == kReplaceAddress) {
    w.PutBytes(q.map, kMapBytes);
    w.Put(q.address);
    return;
  }
  w.Put(q.dtype);
  w.Put(q.rank);
  w.Put(q.address);
  detail::PutArray(w, q.dims);
  detail::PutArray(w, q.strides);
  if (q.which == kTiled) detail::PutArray(w, q.box);
  if (q.which == kIm2col) {
    detail::PutArray(w, q.lower);
    detail::PutArray(w, q.upper);
  }
  if (q.which == kIm2colWide) {
    w.Put(q.lower_w);
    w.Put(q.upper_w);
  }
  if (q.which != kTiled) {
    w.Put(q.channels);
    w.Put(q.pixels);
  }
  detail::PutArray(w, q.element_strides);
  for (uint32_t v : {q.wide_mode, q.interleave, q.swizzle, q.l2, q.oob}) w.Put(v);
}

// False for a malformed request (bad kind or rank, wrong length).
inline bool Get(wire::Reader& r, Request* q) {
  uint8_t has_map = 0;
  if (!r.Get(&q->which) || !r.Get(&has_map) || has_map > 1) return false;
  q->has_map = has_map != 0;
  if (q->which == kReplaceAddress)
    return r.GetBytes(q->map, kMapBytes) && r.Get(&q->address) && r.remaining() == 0;
  if (q->which < kTiled || q->which > kIm2colWide) return false;
  if (!r.Get(&q->dtype) || !r.Get(&q->rank) || !r.Get(&q->address)) return false;
  if (q->rank == 0 || q->rank > kMaxTensorRank) return false;
  const uint32_t n = q->rank;
  if (!detail::GetArray(r, n, &q->dims) || !detail::GetArray(r, n - 1, &q->strides)) return false;
  if (q->which == kTiled && !detail::GetArray(r, n, &q->box)) return false;
  if (q->which == kIm2col && (!detail::GetArray(r, CornerCount(n), &q->lower) ||
                              !detail::GetArray(r, CornerCount(n), &q->upper)))
    return false;
  if (q->which == kIm2colWide && (!r.Get(&q->lower_w) || !r.Get(&q->upper_w))) return false;
  if (q->which != kTiled && (!r.Get(&q->channels) || !r.Get(&q->pixels))) return false;
  if (!detail::GetArray(r, n, &q->element_strides)) return false;
  for (uint32_t* v : {&q->wide_mode, &q->interleave, &q->swizzle, &q->l2, &q->oob})
    if (!r.Get(v)) return false;
  return r.remaining() == 0;
}

}  // namespace flyt::tensor_map
