// Finding a CUDA code image and its length from a bare pointer (see cuda_image.h).
//
// Owns: the header arithmetic for fatbin wrappers, fatbins, ELF cubins and PTX text.
// Must not touch: bytes outside what the headers describe; no allocation, no logging,
// no dependency beyond libc (this runs inside the client library).
#include "common/cuda_image.h"

#include <cstdint>
#include <cstring>

namespace flyt {
namespace {

// Anything larger is treated as a corrupt header rather than an image.
constexpr uint64_t kMaxImageBytes = uint64_t{16} << 30;

template <typename T>
T Load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Compares byte by byte and stops at the first mismatch, so a short NUL-terminated
// string is never read past its terminator.
bool HasPrefix(const unsigned char* p, const unsigned char* prefix, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != prefix[i]) return false;
  }
  return true;
}

constexpr unsigned char kWrapperBytes[4] = {0xb1, 0x43, 0x62, 0x46};  // 0x466243b1 LE
constexpr unsigned char kFatbinBytes[4] = {0x50, 0xed, 0x55, 0xba};   // 0xBA55ED50 LE
constexpr unsigned char kElfBytes[4] = {0x7f, 'E', 'L', 'F'};

// Whether [off, off + n) lies within the first `avail` bytes.
bool Within(uint64_t off, uint64_t n, size_t avail) { return off <= avail && n <= avail - off; }

// Fatbin header: u32 magic, u16 version, u16 header size, u64 payload size.
bool LocateFatbin(const unsigned char* p, size_t* size, size_t avail) {
  if (!Within(0, 16, avail) || !HasPrefix(p, kFatbinBytes, 4)) return false;
  const uint16_t header_size = Load<uint16_t>(p + 6);
  const uint64_t payload_size = Load<uint64_t>(p + 8);
  if (header_size < 16 || payload_size > kMaxImageBytes) return false;
  *size = static_cast<size_t>(header_size + payload_size);
  return true;
}

// ELF: the image ends at the furthest of the program header table, the section
// header table, every section with file contents and every segment's file image.
template <bool k64>
bool ElfExtent(const unsigned char* p, size_t* size, size_t avail) {
  if (!Within(0, k64 ? 64 : 52, avail)) return false;
  // Offsets of the header fields for ELFCLASS32 / ELFCLASS64.
  const uint64_t phoff = k64 ? Load<uint64_t>(p + 0x20) : Load<uint32_t>(p + 0x1c);
  const uint64_t shoff = k64 ? Load<uint64_t>(p + 0x28) : Load<uint32_t>(p + 0x20);
  const size_t fields = k64 ? 0x34 : 0x28;
  const uint16_t ehsize = Load<uint16_t>(p + fields);
  const uint16_t phentsize = Load<uint16_t>(p + fields + 2);
  uint64_t phnum = Load<uint16_t>(p + fields + 4);
  const uint16_t shentsize = Load<uint16_t>(p + fields + 6);
  uint64_t shnum = Load<uint16_t>(p + fields + 8);
  const size_t shdr_size = k64 ? 64 : 40;
  const size_t phdr_size = k64 ? 56 : 32;

  if (ehsize < (k64 ? 64 : 52)) return false;
  if (shoff != 0 && shentsize != shdr_size) return false;
  if (phoff != 0 && phnum != 0 && phentsize != phdr_size) return false;
  if (shoff > kMaxImageBytes || phoff > kMaxImageBytes) return false;

  uint64_t end = ehsize;
  if (shoff != 0) {
    if (!Within(shoff, shdr_size, avail)) return false;
    const unsigned char* sh0 = p + shoff;
    // Extended numbering: the real counts live in section header 0.
    if (shnum == 0) shnum = k64 ? Load<uint64_t>(sh0 + 0x20) : Load<uint32_t>(sh0 + 0x14);
    if (phnum == 0xffff) phnum = Load<uint32_t>(sh0 + (k64 ? 0x2c : 0x1c));
    if (shnum > kMaxImageBytes / shdr_size) return false;
    const uint64_t table_end = shoff + shnum * shdr_size;
    if (table_end > kMaxImageBytes || !Within(shoff, shnum * shdr_size, avail)) return false;
    if (table_end > end) end = table_end;
    for (uint64_t i = 0; i < shnum; ++i) {
      const unsigned char* sh = sh0 + i * shdr_size;
      const uint32_t type = Load<uint32_t>(sh + 4);
      if (type == 0 /*SHT_NULL*/ || type == 8 /*SHT_NOBITS*/) continue;
      const uint64_t off = k64 ? Load<uint64_t>(sh + 0x18) : Load<uint32_t>(sh + 0x10);
      const uint64_t len = k64 ? Load<uint64_t>(sh + 0x20) : Load<uint32_t>(sh + 0x14);
      if (off > kMaxImageBytes || len > kMaxImageBytes - off) return false;
      if (off + len > end) end = off + len;
    }
  }
  if (phoff != 0 && phnum != 0) {
    if (phnum > kMaxImageBytes / phdr_size) return false;
    const uint64_t table_end = phoff + phnum * phdr_size;
    if (table_end > kMaxImageBytes || !Within(phoff, phnum * phdr_size, avail)) return false;
    if (table_end > end) end = table_end;
    for (uint64_t i = 0; i < phnum; ++i) {
      const unsigned char* ph = p + phoff + i * phdr_size;
      const uint64_t off = k64 ? Load<uint64_t>(ph + 0x08) : Load<uint32_t>(ph + 0x04);
      const uint64_t len = k64 ? Load<uint64_t>(ph + 0x20) : Load<uint32_t>(ph + 0x10);
      if (off > kMaxImageBytes || len > kMaxImageBytes - off) return false;
      if (off + len > end) end = off + len;
    }
  }
  if (end > avail) return false;
  *size = static_cast<size_t>(end);
  return true;
}

bool LocateElf(const unsigned char* p, size_t* size, size_t avail) {
  if (!Within(0, 16, avail) || !HasPrefix(p, kElfBytes, 4)) return false;
  if (p[5] != 1 /*ELFDATA2LSB*/) return false;
  if (p[4] == 2) return ElfExtent<true>(p, size, avail);
  if (p[4] == 1) return ElfExtent<false>(p, size, avail);
  return false;
}

// PTX: text up to the NUL, which must contain the mandatory .version directive.
bool LocatePtx(const unsigned char* p, size_t* size, size_t avail) {
  size_t n = 0;
  for (;; ++n) {
    if (n >= avail) return false;  // no NUL within the bytes there are
    const unsigned char c = p[n];
    if (c == 0) break;
    const bool text = c >= 0x20 || c == '\t' || c == '\n' || c == '\r' || c == '\f';
    if (!text || c == 0x7f) return false;
  }
  if (n == 0) return false;
  if (std::strstr(reinterpret_cast<const char*>(p), ".version") == nullptr) return false;
  *size = n + 1;
  return true;
}

}  // namespace

namespace {

bool Locate(const void* image, size_t avail, ImageSpan* out) {
  out->kind = ImageKind::kUnknown;
  out->data = image;
  out->size = 0;
  if (image == nullptr) return false;
  const auto* p = static_cast<const unsigned char*>(image);
  size_t size = 0;
  const bool bounded = avail != SIZE_MAX;

  if (Within(0, 4, avail) && HasPrefix(p, kWrapperBytes, 4)) {
    // {u32 magic, u32 version, const void* data, void* filename_or_fatbins}
    if (bounded) return false;  // a wrapper points elsewhere: never valid in received bytes
    const void* fatbin = Load<const void*>(p + 8);
    if (fatbin == nullptr) return false;
    if (!LocateFatbin(static_cast<const unsigned char*>(fatbin), &size, SIZE_MAX)) return false;
    *out = {ImageKind::kFatbinWrapper, fatbin, size};
    return true;
  }
  if (Within(0, 4, avail) && HasPrefix(p, kFatbinBytes, 4)) {
    if (!LocateFatbin(p, &size, avail) || size > avail) return false;
    *out = {ImageKind::kFatbin, image, size};
    return true;
  }
  if (Within(0, 4, avail) && HasPrefix(p, kElfBytes, 4)) {
    if (!LocateElf(p, &size, avail)) return false;
    *out = {ImageKind::kElf, image, size};
    return true;
  }
  if (!LocatePtx(p, &size, avail)) return false;
  *out = {ImageKind::kPtx, image, size};
  return true;
}

}  // namespace

bool LocateImage(const void* image, ImageSpan* out) { return Locate(image, SIZE_MAX, out); }

bool LocateImageWithin(const void* image, size_t available, ImageSpan* out) {
  return Locate(image, available, out);
}

}  // namespace flyt
