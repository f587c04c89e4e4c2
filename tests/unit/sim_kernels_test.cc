// Tests for server/sim_kernels: kernel parameter layouts read from real nvcc output
// of tests/unit/data/sim_kernels.cu in every form nvcc produces (fatbins in each
// compression mode, several architectures, PTX only, -rdc, -G, a cubin, PTX text,
// the .nv_fatbin section of an executable), plus hand-written PTX and damaged input.
//
// Owns: nothing but these tests. Must not touch: the files under FLYT_TEST_DATA_DIR.
#include "server/sim_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_images.h"

namespace flyt::sim {

bool operator==(const ParamSlot& a, const ParamSlot& b) {
  return a.offset == b.offset && a.size == b.size;
}
void PrintTo(const ParamSlot& p, std::ostream* os) {
  *os << "{" << p.offset << "," << p.size << "}";
}

namespace {

using testing::FindHostSection;
using testing::LoadLE;
using testing::ReadTestImage;
using Layout = std::vector<ParamSlot>;

// What nvcc 13.0 (ptxas and the PTX it emits) lays out for tests/unit/data/sim_kernels.cu.
const std::map<std::string, Layout>& Expected() {
  static const std::map<std::string, Layout> kExpected = {
      // (int, double, char, struct{float x,y,z}, void*)
      {"mixed", {{0, 4}, {8, 8}, {16, 1}, {20, 12}, {32, 8}}},
      // (char, short, int, long long, float, double, unsigned char, bool)
      {"scalars", {{0, 1}, {2, 2}, {4, 4}, {8, 8}, {16, 4}, {24, 8}, {32, 1}, {33, 1}}},
      // (char, alignas(16) float[3], struct{char; double}, char)
      {"aligned", {{0, 1}, {16, 16}, {32, 16}, {48, 1}}},
      // (char, float4, double2, int3, char2)
      {"vectors", {{0, 1}, {16, 16}, {32, 16}, {48, 12}, {60, 2}}},
      // (int, char[4000], float*): legacy EIATTR_KPARAM_INFO
      {"big", {{0, 4}, {4, 4000}, {4008, 8}}},
      // (int, char[32000], float*): EIATTR_KPARAM_INFO_V2
      {"huge", {{0, 4}, {4, 32000}, {32008, 8}}},
      // (const __grid_constant__ double[2000], int)
      {"grid_const", {{0, 16000}, {16000, 4}}},
      {"noparams", {}},
      {"_Z4tmplIfEvPT_S0_i", {{0, 8}, {8, 4}, {12, 4}}},
      {"_Z4tmplIdEvPT_S0_i", {{0, 8}, {8, 8}, {16, 4}}},
      {"_Z9cpp_namedPii", {{0, 8}, {8, 4}}},
      {"_ZN2ns12in_namespaceEmPKf", {{0, 8}, {8, 8}}},
      {"uses_helper", {{0, 8}, {8, 4}}},
  };
  return kExpected;
}

std::map<std::string, Layout> ByName(const std::vector<KernelDesc>& kernels) {
  std::map<std::string, Layout> out;
  for (const KernelDesc& k : kernels) {
    EXPECT_TRUE(out.emplace(k.name, k.params).second) << "listed twice: " << k.name;
  }
  return out;
}

void ExpectAllKernels(const std::vector<uint8_t>& image) {
  ASSERT_FALSE(image.empty()) << "test image missing";
  std::vector<KernelDesc> kernels;
  std::string error;
  ASSERT_TRUE(DescribeKernels(image.data(), image.size(), &kernels, &error)) << error;
  EXPECT_EQ(ByName(kernels), Expected());
}

TEST(SimKernelsTest, DefaultFatbin) { ExpectAllKernels(ReadTestImage("kernels.fatbin")); }
TEST(SimKernelsTest, ZstdFatbin) { ExpectAllKernels(ReadTestImage("kernels_zstd.fatbin")); }
TEST(SimKernelsTest, Lz4Fatbin) { ExpectAllKernels(ReadTestImage("kernels_lz4.fatbin")); }
TEST(SimKernelsTest, PlainFatbin) { ExpectAllKernels(ReadTestImage("kernels_plain.fatbin")); }
TEST(SimKernelsTest, MultiArchFatbin) { ExpectAllKernels(ReadTestImage("kernels_multi.fatbin")); }
// Each entry of the multi-architecture fatbin on its own, as a one-entry fatbin.
TEST(SimKernelsTest, EveryArchitectureAlone) {
  const std::vector<uint8_t> fb = ReadTestImage("kernels_multi.fatbin");
  ASSERT_FALSE(fb.empty());
  const uint16_t header = LoadLE<uint16_t>(&fb[6]);
  const uint64_t end = header + LoadLE<uint64_t>(&fb[8]);
  std::vector<std::pair<uint16_t, uint32_t>> seen;  // (kind, arch)
  for (uint64_t e = header; e < end;) {
    const uint16_t kind = LoadLE<uint16_t>(&fb[e]);
    const uint64_t len = LoadLE<uint32_t>(&fb[e + 4]) + LoadLE<uint64_t>(&fb[e + 8]);
    seen.emplace_back(kind, LoadLE<uint32_t>(&fb[e + 28]));
    SCOPED_TRACE("kind " + std::to_string(kind) + " arch " + std::to_string(seen.back().second));
    std::vector<uint8_t> one(fb.begin(), fb.begin() + header);
    std::memcpy(&one[8], &len, sizeof(len));
    one.insert(one.end(), fb.begin() + e, fb.begin() + e + len);
    ExpectAllKernels(one);
    e += len;
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::pair<uint16_t, uint32_t>>{
                      {1, 90}, {2, 75}, {2, 80}, {2, 90}, {2, 100}, {2, 120}}));
}

TEST(SimKernelsTest, PtxOnlyFatbin) { ExpectAllKernels(ReadTestImage("kernels_ptx.fatbin")); }
TEST(SimKernelsTest, DebugFatbin) { ExpectAllKernels(ReadTestImage("kernels_debug.fatbin")); }
TEST(SimKernelsTest, Cubin) { ExpectAllKernels(ReadTestImage("kernels.cubin")); }

// -rdc=true keeps `helper` as a function symbol; only entry functions are kernels.
TEST(SimKernelsTest, RelocatableFatbin) { ExpectAllKernels(ReadTestImage("kernels_rdc.fatbin")); }

TEST(SimKernelsTest, PtxText) {
  std::vector<uint8_t> ptx = ReadTestImage("kernels.ptx");
  ExpectAllKernels(ptx);  // no NUL
  ptx.push_back(0);
  ptx.push_back('!');  // after the NUL: ignored
  ExpectAllKernels(ptx);
}

// The .nv_fatbin section of an executable holds cudart's kernel-less fatbin and ours,
// back to back.
TEST(SimKernelsTest, ExecutableFatbinSection) {
  const std::vector<uint8_t> exe = ReadTestImage("kernels_exe");
  const auto fat = FindHostSection(exe, ".nv_fatbin");
  ASSERT_TRUE(fat.found);
  ExpectAllKernels(
      std::vector<uint8_t>(exe.begin() + fat.offset, exe.begin() + fat.offset + fat.size));
}

// Entry header flags that decide the decompression path, as nvcc 13 writes them.
std::vector<std::pair<uint16_t, uint64_t>> EntryKindsAndFlags(const std::vector<uint8_t>& fb) {
  std::vector<std::pair<uint16_t, uint64_t>> out;
  const uint64_t end = LoadLE<uint16_t>(&fb[6]) + LoadLE<uint64_t>(&fb[8]);
  for (uint64_t e = LoadLE<uint16_t>(&fb[6]); e < end;) {
    out.emplace_back(LoadLE<uint16_t>(&fb[e]), LoadLE<uint64_t>(&fb[e + 40]));
    e += LoadLE<uint32_t>(&fb[e + 4]) + LoadLE<uint64_t>(&fb[e + 8]);
  }
  return out;
}

TEST(SimKernelsTest, TestImagesCoverEveryCompressionPath) {
  constexpr uint64_t kLz4 = 0x2000, kZstd = 0x8000;
  using KF = std::vector<std::pair<uint16_t, uint64_t>>;
  auto masked = [](KF v) {
    for (auto& [kind, flags] : v) flags &= 0xa000;
    return v;
  };
  // Default: ELF stored plain, PTX zstd-compressed.
  EXPECT_EQ(masked(EntryKindsAndFlags(ReadTestImage("kernels.fatbin"))), (KF{{2, 0}, {1, kZstd}}));
  EXPECT_EQ(masked(EntryKindsAndFlags(ReadTestImage("kernels_zstd.fatbin"))),
            (KF{{2, kZstd}, {1, kZstd}}));
  EXPECT_EQ(masked(EntryKindsAndFlags(ReadTestImage("kernels_lz4.fatbin"))),
            (KF{{2, kLz4}, {1, kLz4}}));
  EXPECT_EQ(masked(EntryKindsAndFlags(ReadTestImage("kernels_plain.fatbin"))),
            (KF{{2, 0}, {1, 0}}));
  // -rdc=true: the relocatable ELF is compressed by default too.
  EXPECT_EQ(masked(EntryKindsAndFlags(ReadTestImage("kernels_rdc.fatbin"))),
            (KF{{2, kZstd}, {1, kZstd}}));
  // -G: and so is the debug ELF.
  EXPECT_EQ(masked(EntryKindsAndFlags(ReadTestImage("kernels_debug.fatbin"))),
            (KF{{2, kZstd}, {1, kZstd}}));
}

// A damaged ELF entry is skipped; the PTX entry still describes every kernel.
TEST(SimKernelsTest, CorruptElfEntryFallsBackToPtx) {
  std::vector<uint8_t> fb = ReadTestImage("kernels_zstd.fatbin");
  ASSERT_FALSE(fb.empty());
  const uint64_t e = LoadLE<uint16_t>(&fb[6]);
  ASSERT_EQ(LoadLE<uint16_t>(&fb[e]), 2);
  const uint64_t payload = e + LoadLE<uint32_t>(&fb[e + 4]);
  for (int i = 0; i < 4; ++i) fb[payload + i] ^= 0x5a;  // the zstd frame magic
  ExpectAllKernels(fb);
}

TEST(SimKernelsTest, HandWrittenPtx) {
  const std::string ptx = R"(
// a comment with .entry fake( .param .u32 x )
/* block comment .entry alsofake() */
.version 8.0
.target sm_90
.address_size 64
.extern .func (.param .b32 ret) device_fn (.param .b64 p);
.visible .func (.param .b32 r) other(.param .align 16 .b8 big[64]) { ret; }
.global .align 4 .b8 table[16];

.weak .entry ptrs(
    .param .u64 .ptr .global .align 16 p,   // pointee alignment, not the param's
    .param .u8 c,
    .param .u64 .ptr .align 1 q
)
.maxntid 256, 1, 1
{
  .reg .b32 %r<4>;
  { .reg .b32 inner; }
  .pragma "nounroll";
  ret;
}
.entry vecs(.param .v2 .f32 a, .param .u8 b, .param .v4 .u32 c, .param .b128 d,
            .param .align 8 .b8 arr[3][5], .param .f16 h, .param .bf16x2 g)
{
  ret;
}
.entry bare
{
  ret;
}
.entry empty() { ret; }
)";
  std::vector<KernelDesc> kernels;
  std::string error;
  ASSERT_TRUE(DescribeKernels(ptx.data(), ptx.size(), &kernels, &error)) << error;
  const std::map<std::string, Layout> expected = {
      {"ptrs", {{0, 8}, {8, 1}, {16, 8}}},
      {"vecs", {{0, 8}, {8, 1}, {16, 16}, {32, 16}, {48, 15}, {64, 2}, {68, 4}}},
      {"bare", {}},
      {"empty", {}},
  };
  EXPECT_EQ(ByName(kernels), expected);
  ASSERT_EQ(kernels.size(), 4u);
  EXPECT_EQ(kernels[0].name, "ptrs");  // order of appearance
}

TEST(SimKernelsTest, RejectsUnusableInput) {
  std::vector<KernelDesc> kernels;
  std::string error;
  EXPECT_FALSE(DescribeKernels(nullptr, 0, &kernels, &error));
  EXPECT_FALSE(error.empty());

  const std::string not_ptx = "hello world, this is not PTX";
  EXPECT_FALSE(DescribeKernels(not_ptx.data(), not_ptx.size(), &kernels, &error));
  EXPECT_FALSE(error.empty());

  const std::string unclosed = ".version 8.0\n.target sm_90\n.entry k(.param .u32 a,";
  EXPECT_FALSE(DescribeKernels(unclosed.data(), unclosed.size(), &kernels, &error));

  const std::vector<uint8_t> fb = ReadTestImage("kernels.fatbin");
  ASSERT_FALSE(fb.empty());
  EXPECT_FALSE(DescribeKernels(fb.data(), fb.size() / 2, &kernels, &error));
  EXPECT_FALSE(error.empty());

  // Both entries damaged: nothing usable.
  std::vector<uint8_t> bad = ReadTestImage("kernels_zstd.fatbin");
  const uint64_t end = LoadLE<uint16_t>(&bad[6]) + LoadLE<uint64_t>(&bad[8]);
  for (uint64_t e = LoadLE<uint16_t>(&bad[6]); e < end;) {
    const uint64_t payload = e + LoadLE<uint32_t>(&bad[e + 4]);
    for (int i = 0; i < 4; ++i) bad[payload + i] ^= 0xff;  // the zstd frame magic
    e = payload + LoadLE<uint64_t>(&bad[e + 8]);
  }
  EXPECT_FALSE(DescribeKernels(bad.data(), bad.size(), &kernels, &error));
  EXPECT_FALSE(error.empty());
  EXPECT_TRUE(kernels.empty());
}

// Truncations and random damage must end in a clean true/false, never a crash.
TEST(SimKernelsTest, SurvivesDamagedImages) {
  std::mt19937 rng(1234);
  for (const char* name : {"kernels.fatbin", "kernels_lz4.fatbin", "kernels_plain.fatbin",
                           "kernels.cubin", "kernels.ptx"}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> image = ReadTestImage(name);
    ASSERT_FALSE(image.empty());
    std::vector<KernelDesc> kernels;
    std::string error;
    for (size_t n = 0; n < image.size(); n += 1 + image.size() / 512) {
      std::vector<uint8_t> cut(image.begin(), image.begin() + n);  // exact-size heap copy
      DescribeKernels(cut.data(), cut.size(), &kernels, &error);
    }
    for (int round = 0; round < 300; ++round) {
      std::vector<uint8_t> damaged = image;
      for (int flips = 0; flips < 8; ++flips) damaged[rng() % damaged.size()] ^= 1u << (rng() % 8);
      DescribeKernels(damaged.data(), damaged.size(), &kernels, &error);
    }
  }
}

}  // namespace
}  // namespace flyt::sim
