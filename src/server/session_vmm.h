// Generic calls that the session runs itself instead of handing them straight
// to the driver: the virtual memory calls (server/session_vmm.cc), kernel
// node attributes that may name an event (server/session_driver_misc.cc), and
// the memory pool calls of pools the session serves (server/session_pools.cc).
//
// Owns: the table from a generic op id (protocol/api_list.h) to the Session
// method that takes the driver function's place, with exactly its
// parameters, so the generic handler (session.cc, RunGeneric) decodes and
// encodes as for any other call. Must not know the wire.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "protocol/api_list.h"
#include "server/session.h"

namespace flyt::server {

// The op id of a generically remoted API, by name; 0 when it is not one.
constexpr uint16_t GenericOp(std::string_view name) {
#define FLYT_GENERIC_OP(id, sym, cls, rel) \
  if (name == #sym) return id;
  FLYT_GENERIC_APIS(FLYT_GENERIC_OP)
#undef FLYT_GENERIC_OP
  return 0;
}

template <uint16_t Op>
struct ThroughSession {
  static constexpr bool kYes = false;
};

template <typename M>
struct AsFunction;
template <typename R, typename... A>
struct AsFunction<R (Session::*)(A...)> {
  using type = R (*)(A...);
};

#define FLYT_THROUGH_SESSION(sym, method)                                                       \
  static_assert(GenericOp(#sym) != 0, #sym " is not in FLYT_GENERIC_APIS");                     \
  static_assert(std::is_same_v<decltype(&::sym), AsFunction<decltype(&Session::method)>::type>, \
                "Session::" #method " must take exactly the arguments of " #sym);               \
  template <>                                                                                   \
  struct ThroughSession<GenericOp(#sym)> {                                                      \
    static constexpr bool kYes = true;                                                          \
    static constexpr auto kMethod = &Session::method;                                           \
  };

FLYT_THROUGH_SESSION(cuMemAddressReserve, VmmAddressReserve)
FLYT_THROUGH_SESSION(cuMemAddressFree, VmmAddressFree)
FLYT_THROUGH_SESSION(cuMemCreate, VmmCreate)
FLYT_THROUGH_SESSION(cuMemRelease, VmmRelease)
FLYT_THROUGH_SESSION(cuMemMap, VmmMap)
FLYT_THROUGH_SESSION(cuMemUnmap, VmmUnmap)
FLYT_THROUGH_SESSION(cuMemGetAccess, VmmGetAccess)
FLYT_THROUGH_SESSION(cuMemGetAllocationPropertiesFromHandle, VmmGetProperties)
FLYT_THROUGH_SESSION(cuGraphKernelNodeSetAttribute, KernelNodeSetAttribute)
FLYT_THROUGH_SESSION(cuMemAlloc_v2, MemAlloc)
FLYT_THROUGH_SESSION(cuMemAllocPitch_v2, MemAllocPitch)
FLYT_THROUGH_SESSION(cuMemGetAddressRange_v2, MemGetAddressRange)
FLYT_THROUGH_SESSION(cuMemPoolCreate, MemPoolCreate)
FLYT_THROUGH_SESSION(cuMemPoolDestroy, MemPoolDestroy)
FLYT_THROUGH_SESSION(cuMemPoolTrimTo, MemPoolTrimTo)
FLYT_THROUGH_SESSION(cuMemAllocFromPoolAsync, MemAllocFromPoolAsync)

#undef FLYT_THROUGH_SESSION

}  // namespace flyt::server
