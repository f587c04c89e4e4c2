// Test helpers shared by cuda_image_test and sim_kernels_test: reading the images
// that tests/unit/sim_kernels.cmake builds with nvcc, and picking sections out of a
// host ELF executable.
//
// Owns: test-only file and ELF plumbing. Must not touch: product code paths.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#ifndef FLYT_TEST_DATA_DIR
#error "FLYT_TEST_DATA_DIR must name the folder of nvcc-built test images"
#endif

namespace flyt::testing {

inline std::string TestImagePath(const std::string& name) {
  return std::string(FLYT_TEST_DATA_DIR) + "/" + name;
}

// The whole file, or an empty vector when it cannot be read.
inline std::vector<uint8_t> ReadTestImage(const std::string& name) {
  std::ifstream in(TestImagePath(name), std::ios::binary);
  if (!in) return {};
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <typename T>
T LoadLE(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// One section of a 64-bit host ELF file (no bounds slack: test inputs are trusted).
struct HostSection {
  uint64_t addr = 0;    // virtual address at link time
  uint64_t offset = 0;  // file offset
  uint64_t size = 0;
  bool found = false;
};

inline HostSection FindHostSection(const std::vector<uint8_t>& elf, const std::string& name) {
  HostSection out;
  if (elf.size() < 64 || std::memcmp(elf.data(), "\177ELF", 4) != 0) return out;
  const uint64_t shoff = LoadLE<uint64_t>(&elf[0x28]);
  const uint16_t shnum = LoadLE<uint16_t>(&elf[0x3c]);
  const uint16_t shstrndx = LoadLE<uint16_t>(&elf[0x3e]);
  const uint8_t* strtab_hdr = &elf[shoff + uint64_t{shstrndx} * 64];
  const uint64_t strtab = LoadLE<uint64_t>(strtab_hdr + 0x18);
  for (uint16_t i = 0; i < shnum; ++i) {
    const uint8_t* sh = &elf[shoff + uint64_t{i} * 64];
    const char* sname = reinterpret_cast<const char*>(&elf[strtab + LoadLE<uint32_t>(sh)]);
    if (name != sname) continue;
    out.addr = LoadLE<uint64_t>(sh + 0x10);
    out.offset = LoadLE<uint64_t>(sh + 0x18);
    out.size = LoadLE<uint64_t>(sh + 0x20);
    out.found = true;
    break;
  }
  return out;
}

}  // namespace flyt::testing
