// Argument marshalling derived from the real prototypes in cuda.h.
//
// Owns: how each C type of a driver API crosses the wire: arithmetic and enum
// values by value, opaque handles (CUstream, CUevent, ...) as 64-bit values
// the server validates, `const char*` as strings, non-const pointers as
// outputs returned in the reply, const pointers to plain structs and plain
// structs passed by value (CUmemLocation) by value.
// Anything else (void* buffers, arrays) does not compile here and must be
// hand-written. Used by the client stubs and the server's generic handlers.
// Must not know about sessions or transports.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "protocol/codec.h"

namespace flyt::marshal {

enum class HandleKind : uint8_t {
  kNone = 0,
  kStream,
  kEvent,
  kMemory,
  kModule,
  kLibrary,
  kKernel,
  kFunction,
  kContext,
  kArray,
  kGraph,
  kGraphExec,
  kMemPool,
  kGraphNode,
  kCount
};

template <typename T>
struct HandleOf {
  static constexpr HandleKind kind = HandleKind::kNone;
};
#define FLYT_HANDLE(type, k)                          \
  template <>                                         \
  struct HandleOf<type> {                             \
    static constexpr HandleKind kind = HandleKind::k; \
  };
FLYT_HANDLE(CUstream, kStream)
FLYT_HANDLE(CUevent, kEvent)
FLYT_HANDLE(CUmodule, kModule)
FLYT_HANDLE(CUlibrary, kLibrary)
FLYT_HANDLE(CUkernel, kKernel)
FLYT_HANDLE(CUfunction, kFunction)
FLYT_HANDLE(CUcontext, kContext)
FLYT_HANDLE(CUarray, kArray)
FLYT_HANDLE(CUgraph, kGraph)
FLYT_HANDLE(CUgraphExec, kGraphExec)
FLYT_HANDLE(CUmemoryPool, kMemPool)
FLYT_HANDLE(CUgraphNode, kGraphNode)
#undef FLYT_HANDLE

template <typename T>
inline constexpr bool kIsHandle = HandleOf<T>::kind != HandleKind::kNone;

enum class ArgRole { kValue, kHandle, kString, kOut, kInStruct, kStructValue, kUnsupported };

template <typename T>
constexpr ArgRole RoleOf() {
  if constexpr (kIsHandle<T>) {
    return ArgRole::kHandle;
  } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
    return ArgRole::kValue;
  } else if constexpr (std::is_same_v<T, const char*>) {
    return ArgRole::kString;
  } else if constexpr (std::is_class_v<T> && std::is_trivially_copyable_v<T>) {
    return ArgRole::kStructValue;  // a plain struct passed by value (CUmemLocation)
  } else if constexpr (std::is_pointer_v<T>) {
    using P = std::remove_pointer_t<T>;
    if constexpr (std::is_void_v<std::remove_cv_t<P>>) {
      return ArgRole::kUnsupported;
    } else if constexpr (!std::is_const_v<P> && std::is_trivially_copyable_v<P>) {
      return ArgRole::kOut;
    } else if constexpr (std::is_const_v<P> &&
                         (std::is_class_v<P> ||
                          std::is_union_v<P>)&&std::is_trivially_copyable_v<P>) {
      return ArgRole::kInStruct;
    } else {
      return ArgRole::kUnsupported;
    }
  } else {
    return ArgRole::kUnsupported;
  }
}

// Client side: encodes one argument of a request.
template <typename T>
void EncodeArg(wire::Writer& w, T v) {
  constexpr ArgRole role = RoleOf<T>();
  static_assert(role != ArgRole::kUnsupported, "this argument type needs a hand-written call");
  if constexpr (role == ArgRole::kValue || role == ArgRole::kStructValue) {
    w.Put(v);
  } else if constexpr (role == ArgRole::kHandle) {
    w.Put<uint64_t>(reinterpret_cast<uintptr_t>(v));
  } else if constexpr (role == ArgRole::kString) {
    w.Put<uint8_t>(v != nullptr);
    if (v != nullptr) w.PutString(v);
  } else if constexpr (role == ArgRole::kOut) {
    w.Put<uint8_t>(v != nullptr);
  } else if constexpr (role == ArgRole::kInStruct) {
    w.Put<uint8_t>(v != nullptr);
    if (v != nullptr) w.Put(*v);
  }
}

// Client side: copies one output of a reply into the caller's memory.
template <typename T>
bool DecodeOut(wire::Reader& r, T v) {
  if constexpr (RoleOf<T>() == ArgRole::kOut) {
    if (v != nullptr) return r.Get(v);
  }
  return true;
}

}  // namespace flyt::marshal
