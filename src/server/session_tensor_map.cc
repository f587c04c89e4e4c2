// TMA descriptors for a session: kOpTensorMap (protocol/tensor_map.h).
//
// Owns: decoding the client's request and calling the driver's
// cuTensorMapEncodeTiled / Im2col / Im2colWide / cuTensorMapReplaceAddress
// with the app's exact arguments (NULL where the app passed NULL), so that
// every error is the driver's own; the descriptor goes back. Encoding touches
// no GPU state and no handle of the session. Must not touch other sessions'
// state.
#include "protocol/tensor_map.h"

#include <cstring>

#include "server/session.h"

namespace flyt::server {

bool Session::TensorMap(wire::Reader& in, wire::Writer& out, CUresult* rc) {
  namespace tmap = tensor_map;
  tmap::Request q;
  if (!tmap::Get(in, &q)) return false;
  const DriverApi& a = api();
  CUtensorMap map{};
  CUtensorMap* m = q.has_map ? &map : nullptr;
  auto* address = reinterpret_cast<void*>(static_cast<uintptr_t>(q.address));
  auto dtype = static_cast<CUtensorMapDataType>(q.dtype);
  auto interleave = static_cast<CUtensorMapInterleave>(q.interleave);
  auto swizzle = static_cast<CUtensorMapSwizzle>(q.swizzle);
  auto l2 = static_cast<CUtensorMapL2promotion>(q.l2);
  auto oob = static_cast<CUtensorMapFloatOOBfill>(q.oob);
  *rc = CUDA_ERROR_NOT_SUPPORTED;  // a driver without the entry point
  switch (q.which) {
    case tmap::kTiled:
      if (a.cuTensorMapEncodeTiled != nullptr)
        *rc = a.cuTensorMapEncodeTiled(m, dtype, q.rank, address, tmap::Data(q.dims),
                                       tmap::Data(q.strides), tmap::Data(q.box),
                                       tmap::Data(q.element_strides), interleave, swizzle, l2, oob);
      break;
    case tmap::kIm2col:
      if (a.cuTensorMapEncodeIm2col != nullptr)
        *rc = a.cuTensorMapEncodeIm2col(
            m, dtype, q.rank, address, tmap::Data(q.dims), tmap::Data(q.strides),
            tmap::Data(q.lower), tmap::Data(q.upper), q.channels, q.pixels,
            tmap::Data(q.element_strides), interleave, swizzle, l2, oob);
      break;
    case tmap::kIm2colWide:
      if (a.cuTensorMapEncodeIm2colWide != nullptr)
        *rc = a.cuTensorMapEncodeIm2colWide(
            m, dtype, q.rank, address, tmap::Data(q.dims), tmap::Data(q.strides), q.lower_w,
            q.upper_w, q.channels, q.pixels, tmap::Data(q.element_strides), interleave,
            static_cast<CUtensorMapIm2ColWideMode>(q.wide_mode), swizzle, l2, oob);
      break;
    case tmap::kReplaceAddress:
      std::memcpy(&map, q.map, sizeof map);
      if (a.cuTensorMapReplaceAddress != nullptr) *rc = a.cuTensorMapReplaceAddress(&map, address);
      break;
    default:
      return false;
  }
  if (*rc == CUDA_SUCCESS) out.PutBytes(&map, sizeof map);
  return true;
}

}  // namespace flyt::server
