// Tests for common/cuda_image: finding an image's kind and length from a bare pointer,
// on real nvcc output (fatbins in every compression mode, a cubin, PTX, and the
// fatbin wrappers of a built executable) and on hand-made edge cases.
//
// Owns: nothing but these tests. Must not touch: the files under FLYT_TEST_DATA_DIR.
#include "common/cuda_image.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_images.h"

namespace flyt {
namespace {

using testing::FindHostSection;
using testing::LoadLE;
using testing::ReadTestImage;

// The file followed by junk, so that a correct size cannot come from the buffer end.
std::vector<uint8_t> WithTrailingJunk(std::vector<uint8_t> bytes) {
  for (int i = 0; i < 4096; ++i) bytes.push_back(static_cast<uint8_t>(0xA5 ^ i));
  return bytes;
}

TEST(CudaImageTest, FatbinsOfEveryCompressionMode) {
  for (const char* name : {"kernels.fatbin", "kernels_zstd.fatbin", "kernels_lz4.fatbin",
                           "kernels_plain.fatbin", "kernels_multi.fatbin", "kernels_ptx.fatbin",
                           "kernels_rdc.fatbin", "kernels_debug.fatbin"}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> file = ReadTestImage(name);
    ASSERT_FALSE(file.empty());
    const std::vector<uint8_t> buf = WithTrailingJunk(file);
    ImageSpan span{};
    ASSERT_TRUE(LocateImage(buf.data(), &span));
    EXPECT_EQ(span.kind, ImageKind::kFatbin);
    EXPECT_EQ(span.data, buf.data());
    EXPECT_EQ(span.size, file.size());
  }
}

TEST(CudaImageTest, Cubin) {
  const std::vector<uint8_t> file = ReadTestImage("kernels.cubin");
  ASSERT_FALSE(file.empty());
  const std::vector<uint8_t> buf = WithTrailingJunk(file);
  ImageSpan span{};
  ASSERT_TRUE(LocateImage(buf.data(), &span));
  EXPECT_EQ(span.kind, ImageKind::kElf);
  EXPECT_EQ(span.data, buf.data());
  EXPECT_EQ(span.size, file.size());
}

TEST(CudaImageTest, ElfEntryInsideAPlainFatbin) {
  const std::vector<uint8_t> fatbin = ReadTestImage("kernels_plain.fatbin");
  ASSERT_GE(fatbin.size(), 16u + 64u);
  const uint16_t header = LoadLE<uint16_t>(&fatbin[6]);
  const uint8_t* entry = &fatbin[header];
  ASSERT_EQ(LoadLE<uint16_t>(entry), 2);  // the ELF entry comes first
  const uint32_t entry_header = LoadLE<uint32_t>(entry + 4);
  const uint64_t payload = LoadLE<uint64_t>(entry + 8);
  ImageSpan span{};
  ASSERT_TRUE(LocateImage(entry + entry_header, &span));
  EXPECT_EQ(span.kind, ImageKind::kElf);
  // The payload is the ELF padded to a multiple of 8.
  EXPECT_LE(span.size, payload);
  EXPECT_GT(span.size + 8, payload);
  // nvcc stores the same bytes that -cubin writes.
  const std::vector<uint8_t> cubin = ReadTestImage("kernels.cubin");
  EXPECT_EQ(span.size, cubin.size());
}

TEST(CudaImageTest, Ptx) {
  std::vector<uint8_t> file = ReadTestImage("kernels.ptx");
  ASSERT_FALSE(file.empty());
  file.push_back(0);
  file.push_back('x');  // must not be counted
  ImageSpan span{};
  ASSERT_TRUE(LocateImage(file.data(), &span));
  EXPECT_EQ(span.kind, ImageKind::kPtx);
  EXPECT_EQ(span.size, file.size() - 1);  // includes the NUL
}

TEST(CudaImageTest, HandMadeWrapper) {
  const std::vector<uint8_t> fatbin = ReadTestImage("kernels.fatbin");
  ASSERT_FALSE(fatbin.empty());
  struct {
    uint32_t magic;
    uint32_t version;
    const void* data;
    void* filename_or_fatbins;
  } wrapper{kFatbinWrapperMagic, 1, fatbin.data(), nullptr};
  ImageSpan span{};
  ASSERT_TRUE(LocateImage(&wrapper, &span));
  EXPECT_EQ(span.kind, ImageKind::kFatbinWrapper);
  EXPECT_EQ(span.data, fatbin.data());
  EXPECT_EQ(span.size, fatbin.size());

  wrapper.data = nullptr;
  EXPECT_FALSE(LocateImage(&wrapper, &span));
  EXPECT_EQ(span.kind, ImageKind::kUnknown);
}

// The wrappers nvcc put into an executable's .nvFatBinSegment (24 bytes each, the
// fatbin pointer at +8), with their pointers moved from link-time addresses to where
// the file sits in memory. The executable holds cudart's own fatbin and ours.
TEST(CudaImageTest, WrappersOfABuiltExecutable) {
  const std::vector<uint8_t> exe = ReadTestImage("kernels_exe");
  ASSERT_FALSE(exe.empty());
  const auto seg = FindHostSection(exe, ".nvFatBinSegment");
  const auto fat = FindHostSection(exe, ".nv_fatbin");
  ASSERT_TRUE(seg.found);
  ASSERT_TRUE(fat.found);
  ASSERT_EQ(seg.size % 24, 0u);
  uint64_t covered = 0;
  for (uint64_t w = 0; w < seg.size; w += 24) {
    std::vector<uint8_t> wrapper(exe.begin() + seg.offset + w, exe.begin() + seg.offset + w + 24);
    ASSERT_EQ(LoadLE<uint32_t>(wrapper.data()), kFatbinWrapperMagic);
    const uint64_t va = LoadLE<uint64_t>(wrapper.data() + 8);
    ASSERT_GE(va, fat.addr);
    ASSERT_LT(va, fat.addr + fat.size);
    const uint8_t* where = exe.data() + fat.offset + (va - fat.addr);
    std::memcpy(wrapper.data() + 8, &where, sizeof(where));
    ImageSpan span{};
    ASSERT_TRUE(LocateImage(wrapper.data(), &span));
    EXPECT_EQ(span.kind, ImageKind::kFatbinWrapper);
    EXPECT_EQ(span.data, where);
    EXPECT_LE(va - fat.addr + span.size, fat.size);
    covered += span.size;
  }
  EXPECT_GE(seg.size / 24, 2u);
  // Together the fatbins fill the section, but for alignment padding.
  EXPECT_LE(covered, fat.size);
  EXPECT_GT(covered + 8 * (seg.size / 24), fat.size);
}

// Minimal ELF64 with one section whose contents lie beyond the section header table.
std::vector<uint8_t> TinyElf64(uint64_t data_off, uint64_t data_size) {
  std::vector<uint8_t> e(64 + 2 * 64, 0);
  std::memcpy(e.data(), "\177ELF", 4);
  e[4] = 2;  // ELFCLASS64
  e[5] = 1;  // little-endian
  e[6] = 1;
  auto put16 = [&](size_t off, uint16_t v) { std::memcpy(&e[off], &v, 2); };
  auto put32 = [&](size_t off, uint32_t v) { std::memcpy(&e[off], &v, 4); };
  auto put64 = [&](size_t off, uint64_t v) { std::memcpy(&e[off], &v, 8); };
  put16(0x10, 1);    // ET_REL
  put16(0x12, 190);  // EM_CUDA
  put64(0x28, 64);   // e_shoff
  put16(0x34, 64);   // e_ehsize
  put16(0x3a, 64);   // e_shentsize
  put16(0x3c, 2);    // e_shnum
  const size_t sh1 = 64 + 64;
  put32(sh1 + 4, 1);  // SHT_PROGBITS
  put64(sh1 + 0x18, data_off);
  put64(sh1 + 0x20, data_size);
  return e;
}

TEST(CudaImageTest, ElfSizeIsTheFurthestExtent) {
  std::vector<uint8_t> e = TinyElf64(1000, 24);
  e.resize(2048, 0xEE);
  ImageSpan span{};
  ASSERT_TRUE(LocateImage(e.data(), &span));
  EXPECT_EQ(span.kind, ImageKind::kElf);
  EXPECT_EQ(span.size, 1024u);

  // A NOBITS section occupies no file bytes.
  const size_t sh1 = 128;
  e[sh1 + 4] = 8;
  ASSERT_TRUE(LocateImage(e.data(), &span));
  EXPECT_EQ(span.size, 192u);  // end of the section header table
}

TEST(CudaImageTest, RejectsImplausibleHeaders) {
  ImageSpan span{};
  EXPECT_FALSE(LocateImage(nullptr, &span));

  std::vector<uint8_t> e = TinyElf64(1000, 24);
  e[0x3a] = 40;  // wrong e_shentsize for ELFCLASS64
  EXPECT_FALSE(LocateImage(e.data(), &span));
  EXPECT_EQ(span.kind, ImageKind::kUnknown);

  e = TinyElf64(uint64_t{1} << 62, 24);  // section far beyond any real image
  EXPECT_FALSE(LocateImage(e.data(), &span));

  uint8_t fatbin[32] = {0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0};
  const uint64_t absurd = uint64_t{1} << 60;
  std::memcpy(fatbin + 8, &absurd, 8);
  EXPECT_FALSE(LocateImage(fatbin, &span));
  fatbin[6] = 4;  // header size below 16
  EXPECT_FALSE(LocateImage(fatbin, &span));

  const uint8_t binary[16] = {0x01, 0x02, 0x03, 0x04};
  EXPECT_FALSE(LocateImage(binary, &span));
  EXPECT_FALSE(LocateImage("", &span));
  EXPECT_FALSE(LocateImage("hello, not ptx", &span));
  EXPECT_FALSE(LocateImage(".version 8.0\x01 binary", &span));
}

// A NUL-terminated string at the very end of a readable page, followed by a page
// that faults: nothing past the NUL may be read.
TEST(CudaImageTest, ShortStringsAtThePageEnd) {
  const long page = sysconf(_SC_PAGESIZE);
  auto* base = static_cast<char*>(
      mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(base, MAP_FAILED);
  ASSERT_EQ(mprotect(base + page, page, PROT_NONE), 0);
  ImageSpan span{};
  for (const char* s : {"", "P", "\x7f", "\xb1", "\177E", "\x50\xed", ".version 9.0\n"}) {
    const size_t len = std::strlen(s) + 1;
    char* at = base + page - len;
    std::memcpy(at, s, len);
    const bool ok = LocateImage(at, &span);
    if (std::strcmp(s, ".version 9.0\n") == 0) {
      EXPECT_TRUE(ok);
      EXPECT_EQ(span.kind, ImageKind::kPtx);
      EXPECT_EQ(span.size, len);
    } else {
      EXPECT_FALSE(ok) << "input of length " << len - 1;
    }
  }
  munmap(base, 2 * page);
}

// Received bytes (the server's side): whole images are found, and any cut of
// them is refused without reading past the cut (ASan builds check the reads).
TEST(CudaImageTest, WithinAcceptsWholeImagesAndRefusesEveryCut) {
  for (const char* name : {"kernels.fatbin", "kernels_zstd.fatbin", "kernels.cubin"}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> file = ReadTestImage(name);
    ASSERT_FALSE(file.empty());
    ImageSpan span{};
    ASSERT_TRUE(LocateImageWithin(file.data(), file.size(), &span));
    EXPECT_EQ(span.size, file.size());
    for (size_t cut :
         {size_t{0}, size_t{2}, size_t{15}, size_t{63}, file.size() / 2, file.size() - 1}) {
      std::vector<uint8_t> head(file.begin(), file.begin() + static_cast<long>(cut));
      EXPECT_FALSE(LocateImageWithin(head.data(), head.size(), &span)) << "cut at " << cut;
    }
  }
  std::vector<uint8_t> ptx = ReadTestImage("kernels.ptx");
  ASSERT_FALSE(ptx.empty());
  ImageSpan span{};
  EXPECT_FALSE(LocateImageWithin(ptx.data(), ptx.size(), &span));  // no NUL inside
  ptx.push_back(0);
  EXPECT_TRUE(LocateImageWithin(ptx.data(), ptx.size(), &span));
  EXPECT_EQ(span.size, ptx.size());
  const uint8_t wrapper[24] = {0xb1, 0x43, 0x62, 0x46, 1, 0, 0, 0, 8};
  EXPECT_FALSE(LocateImageWithin(wrapper, sizeof(wrapper), &span));  // points elsewhere
}

}  // namespace
}  // namespace flyt
