// Finding a CUDA code image and its length from a bare pointer.
//
// Owns: recognising the four shapes an application may pass to cuModuleLoadData,
// cuModuleLoadDataEx, cuModuleLoadFatBinary, cuLibraryLoadData (which pass no
// length): the fatbin wrapper struct that nvcc emits into .nvFatBinSegment, a
// fatbin, an ELF cubin and NUL-terminated PTX text. Used by the client library, so
// it depends on nothing but libc/libstdc++, never allocates, never logs and never
// decompresses or parses image contents (the server's driver does that).
// Must not touch: anything beyond the bytes the headers say belong to the image.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flyt {

enum class ImageKind { kFatbinWrapper, kFatbin, kElf, kPtx, kUnknown };

// The bytes to ship for an image.
//   kFatbinWrapper: `image` was the 24-byte wrapper {u32 magic 0x466243b1, u32 version,
//                   const void* fatbin, void* prelinked}; data/size describe the fatbin
//                   it points to (the wrapper itself holds only pointers).
//   kFatbin:        data == image; size = header size + payload size from the header.
//   kElf:           data == image; size = end of the furthest header table, section or
//                   segment the ELF header describes.
//   kPtx:           data == image; size = strlen + 1 (the NUL is included).
struct ImageSpan {
  ImageKind kind;
  const void* data;
  size_t size;
};

inline constexpr uint32_t kFatbinWrapperMagic = 0x466243b1;
inline constexpr uint32_t kFatbinMagic = 0xBA55ED50;

// Returns false (out->kind = kUnknown, out->size = 0) when `image` is null or none of
// the shapes above is recognised, or when its headers are implausible.
bool LocateImage(const void* image, ImageSpan* out);
// The same for bytes received from elsewhere: never reads past `available`
// bytes, and fails when the image the headers describe does not fit in them
// (or is a wrapper, which points outside itself).
bool LocateImageWithin(const void* image, size_t available, ImageSpan* out);

}  // namespace flyt
