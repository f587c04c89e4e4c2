// Kernel parameter layouts from fatbins, ELF cubins and PTX (see sim_kernels.h).
//
// Owns: the fatbin entry walk and decompression (zstd, LZ4), the .nv.info attribute
// reader and a small PTX .entry parser. Every read is bounds-checked against the
// buffer it came from; malformed input yields an error, never a crash. Must not
// touch: the wire, sessions or the real CUDA backend.
//
// Layout facts (checked against nvcc 13.0 output):
//   fatbin header (16 bytes): u32 magic 0xBA55ED50, u16 version 1, u16 header size 16,
//     u64 size of the entries that follow.
//   entry header (0x40 for ELF, 0x50 for PTX, 0x48/0x80 with -G, 0x70 for sm_100+,
//     0x78 for LTO-IR; always read the size field): u16 kind (1 PTX, 2 ELF, 8 LTO-IR),
//     u16 version 0x0101, u32 header size, u64 payload size (padded to 8),
//     u32 compressed size @16, u32 @20, u16 minor @24, u16 major @26, u32 arch @28,
//     u32 name offset @32, u32 name length @36, u64 flags @40, u64 @48,
//     u64 uncompressed size @56. Flags: 0x1 64-bit, 0x2 debug, 0x10 (always set),
//     0x2000 LZ4 raw block (-compress-mode=speed), 0x8000 zstd frame (default mode).
//   Default nvcc 13 compresses PTX, debug (-G) ELF and relocatable (-rdc) ELF only;
//     -Xfatbin -compress-all compresses every entry (NVIDIA's own libraries ship that
//     way); -Xfatbin -compress=false stores everything plain. Fatbins sit back to back
//     in an executable's .nv_fatbin, each a multiple of 8 bytes long.
//   .nv.info.<kernel> attributes: u8 format, u8 attribute id, then for format 1 (no
//     value; sm_80 emits 0x35 this way), 2 (byte) and 3 (u16) a 2-byte field, for
//     format 4 a u16 length and that many bytes; every record is 4-byte aligned. EIATTR_KPARAM_INFO
//     (0x17): u32 index, u16 ordinal, u16 offset, u32 (size << 18 | flags). EIATTR_KPARAM_INFO_V2
//     (0x45, used when a parameter is too large for the 14-bit size): u32 index, u16 ordinal, u16
//     offset, u16 size, u16 flags. EIATTR_PARAM_CBANK (0x0a): u32 symbol, u16 bank offset, u16
//     total size. EIATTR_CBANK_PARAM_SIZE (0x19, u16): total size.
//   Entry functions are STT_FUNC symbols with STO_CUDA_ENTRY (0x10) in st_other.
#include "server/sim_kernels.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "common/log.h"

namespace flyt::sim {
namespace {

constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr uint16_t kEntryPtx = 1;
constexpr uint16_t kEntryElf = 2;
constexpr uint64_t kFlagLz4 = 0x2000;
constexpr uint64_t kFlagZstd = 0x8000;
// Refuse to inflate an entry beyond this (a corrupt size field, not a real image).
constexpr uint64_t kMaxInflated = uint64_t{1} << 30;

constexpr unsigned char kElfMagic[4] = {0x7f, 'E', 'L', 'F'};
constexpr uint32_t kShtSymtab = 2;
constexpr uint32_t kShtNobits = 8;
constexpr uint8_t kSttFunc = 2;
constexpr uint8_t kStoCudaEntry = 0x10;

constexpr uint8_t kEifmtNval = 1;
constexpr uint8_t kEifmtBval = 2;
constexpr uint8_t kEifmtHval = 3;
constexpr uint8_t kEifmtSval = 4;
constexpr uint8_t kEiattrParamCbank = 0x0a;
constexpr uint8_t kEiattrKparamInfo = 0x17;
constexpr uint8_t kEiattrCbankParamSize = 0x19;
constexpr uint8_t kEiattrKparamInfoV2 = 0x45;

// A bounds-checked little-endian view.
class Bytes {
 public:
  Bytes(const void* data, size_t size) : p_(static_cast<const uint8_t*>(data)), n_(size) {}
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  bool Contains(uint64_t off, uint64_t len) const { return off <= n_ && len <= n_ - off; }
  template <typename T>
  bool Get(uint64_t off, T* v) const {
    if (!Contains(off, sizeof(T))) return false;
    std::memcpy(v, p_ + off, sizeof(T));
    return true;
  }
  template <typename T>
  T At(uint64_t off) const {  // caller has checked Contains
    T v;
    std::memcpy(&v, p_ + off, sizeof(T));
    return v;
  }
  Bytes Sub(uint64_t off, uint64_t len) const { return Bytes(p_ + off, len); }

 private:
  const uint8_t* p_;
  size_t n_;
};

// Kernels in first-found order; a name is kept once.
class KernelSet {
 public:
  bool Has(const std::string& name) const { return names_.count(name) != 0; }
  void Add(KernelDesc k) {
    if (names_.insert(k.name).second) list_.push_back(std::move(k));
  }
  std::vector<KernelDesc> Take() { return std::move(list_); }

 private:
  std::vector<KernelDesc> list_;
  std::unordered_set<std::string> names_;
};

struct RawParam {
  uint32_t ordinal;
  uint32_t offset;
  uint32_t size;
};

// Sorts by ordinal and checks that ordinals are 0..n-1 and that each parameter fits
// in `total` (when known). Returns false with a reason otherwise.
bool FinishParams(std::vector<RawParam> raw, int64_t total, std::vector<ParamSlot>* out,
                  std::string* why) {
  std::sort(raw.begin(), raw.end(),
            [](const RawParam& a, const RawParam& b) { return a.ordinal < b.ordinal; });
  out->clear();
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i].ordinal != i) {
      *why = "parameter ordinals are not 0..n-1";
      return false;
    }
    if (total >= 0 && uint64_t{raw[i].offset} + raw[i].size > uint64_t(total)) {
      *why = "parameter " + std::to_string(i) + " ends past the parameter block";
      return false;
    }
    out->push_back({raw[i].offset, raw[i].size});
  }
  return true;
}

// ---------------------------------------------------------------------------------
// ELF cubins

struct Section {
  uint32_t name;
  uint32_t type;
  uint64_t offset;
  uint64_t size;
  uint32_t link;
  uint32_t info;
  uint64_t entsize;
};

struct InfoParams {
  std::vector<RawParam> params;
  int64_t total = -1;  // from PARAM_CBANK / CBANK_PARAM_SIZE; -1 when absent
  bool has_param_attrs = false;
};

// Reads one .nv.info.<kernel> section.
bool ParseNvInfo(Bytes s, InfoParams* info, std::string* why) {
  uint64_t off = 0;
  while (off < s.size()) {
    if (!s.Contains(off, 2)) break;  // trailing padding byte
    const uint8_t format = s.At<uint8_t>(off);
    const uint8_t attr = s.At<uint8_t>(off + 1);
    if (format == kEifmtNval || format == kEifmtBval || format == kEifmtHval) {
      uint16_t value = 0;
      if (!s.Get(off + 2, &value)) {
        *why = "truncated attribute";
        return false;
      }
      if (attr == kEiattrCbankParamSize && format == kEifmtHval) {
        info->total = value;
        info->has_param_attrs = true;
      }
      off += 4;
      continue;
    }
    if (format != kEifmtSval) {
      *why = "unknown attribute format " + std::to_string(format);
      return false;
    }
    uint16_t len = 0;
    if (!s.Get(off + 2, &len) || !s.Contains(off + 4, len)) {
      *why = "truncated attribute";
      return false;
    }
    const Bytes v = s.Sub(off + 4, len);
    if (attr == kEiattrKparamInfo && len >= 12) {
      const uint32_t packed = v.At<uint32_t>(8);
      info->params.push_back({v.At<uint16_t>(4), v.At<uint16_t>(6), (packed >> 18) & 0x3fff});
      info->has_param_attrs = true;
    } else if (attr == kEiattrKparamInfoV2 && len >= 12) {
      info->params.push_back({v.At<uint16_t>(4), v.At<uint16_t>(6), v.At<uint16_t>(8)});
      info->has_param_attrs = true;
    } else if (attr == kEiattrParamCbank && len >= 8) {
      info->total = v.At<uint16_t>(6);
      info->has_param_attrs = true;
    }
    off += 4 + uint64_t{len};
  }
  return true;
}

bool DescribeElf(Bytes elf, KernelSet* set, std::string* error) {
  if (elf.size() < 64 || std::memcmp(elf.data(), kElfMagic, 4) != 0) {
    *error = "not an ELF image";
    return false;
  }
  if (elf.At<uint8_t>(4) != 2 || elf.At<uint8_t>(5) != 1) {
    *error = "ELF image is not 64-bit little-endian";
    return false;
  }
  const uint64_t shoff = elf.At<uint64_t>(0x28);
  const uint16_t shentsize = elf.At<uint16_t>(0x3a);
  uint64_t shnum = elf.At<uint16_t>(0x3c);
  uint32_t shstrndx = elf.At<uint16_t>(0x3e);
  if (shoff == 0 || shentsize != 64 || !elf.Contains(shoff, 64)) {
    *error = "ELF image has no usable section header table";
    return false;
  }
  if (shnum == 0) shnum = elf.At<uint64_t>(shoff + 0x20);
  if (shstrndx == 0xffff) shstrndx = elf.At<uint32_t>(shoff + 0x28);
  if (shnum > elf.size() / 64 || !elf.Contains(shoff, shnum * 64)) {
    *error = "ELF section header table is truncated";
    return false;
  }
  std::vector<Section> sections(shnum);
  for (uint64_t i = 0; i < shnum; ++i) {
    const uint64_t h = shoff + i * 64;
    sections[i] = {elf.At<uint32_t>(h),        elf.At<uint32_t>(h + 4),
                   elf.At<uint64_t>(h + 0x18), elf.At<uint64_t>(h + 0x20),
                   elf.At<uint32_t>(h + 0x28), elf.At<uint32_t>(h + 0x2c),
                   elf.At<uint64_t>(h + 0x38)};
  }
  auto contents = [&](const Section& s, Bytes* out) {
    if (s.type == kShtNobits || !elf.Contains(s.offset, s.size)) return false;
    *out = elf.Sub(s.offset, s.size);
    return true;
  };
  // A NUL-terminated string at `off` inside string table `table`.
  auto string_at = [](Bytes table, uint64_t off) -> std::string_view {
    if (off >= table.size()) return {};
    const char* s = reinterpret_cast<const char*>(table.data()) + off;
    const void* nul = std::memchr(s, 0, table.size() - off);
    if (nul == nullptr) return {};
    return std::string_view(s, static_cast<const char*>(nul) - s);
  };
  Bytes shstrtab(nullptr, 0);
  if (shstrndx >= shnum || !contents(sections[shstrndx], &shstrtab)) {
    *error = "ELF image has no section name table";
    return false;
  }

  // Entry functions, from the symbol table(s).
  std::vector<std::string> entries;
  std::unordered_set<std::string> entry_names;
  for (const Section& s : sections) {
    Bytes syms(nullptr, 0), strtab(nullptr, 0);
    if (s.type != kShtSymtab || s.entsize != 24 || !contents(s, &syms)) continue;
    if (s.link >= shnum || !contents(sections[s.link], &strtab)) continue;
    for (uint64_t off = 0; off + 24 <= syms.size(); off += 24) {
      const uint8_t info = syms.At<uint8_t>(off + 4);
      const uint8_t other = syms.At<uint8_t>(off + 5);
      if ((info & 0xf) != kSttFunc || (other & kStoCudaEntry) == 0) continue;
      const std::string_view name = string_at(strtab, syms.At<uint32_t>(off));
      if (name.empty()) continue;
      if (entry_names.emplace(name).second) entries.emplace_back(name);
    }
  }

  // Parameter attributes, from .nv.info.<kernel>.
  constexpr std::string_view kInfoPrefix = ".nv.info.";
  std::unordered_map<std::string, InfoParams> infos;
  std::vector<std::string> info_order;
  std::unordered_set<std::string> unreadable;  // left for another entry to describe
  for (const Section& s : sections) {
    const std::string_view name = string_at(shstrtab, s.name);
    if (name.size() <= kInfoPrefix.size() || name.substr(0, kInfoPrefix.size()) != kInfoPrefix)
      continue;
    Bytes body(nullptr, 0);
    if (!contents(s, &body)) continue;
    std::string kernel(name.substr(kInfoPrefix.size()));
    InfoParams parsed;
    std::string why;
    if (!ParseNvInfo(body, &parsed, &why)) {
      FLYT_WARN("sim: %s in .nv.info.%s; kernel skipped", why.c_str(), kernel.c_str());
      unreadable.insert(std::move(kernel));
      continue;
    }
    if (infos.emplace(kernel, std::move(parsed)).second) info_order.push_back(kernel);
  }

  // Without a symbol table, fall back to the .nv.info sections that describe params.
  if (entries.empty()) {
    for (const std::string& k : info_order) {
      if (infos[k].has_param_attrs) entries.push_back(k);
    }
  }
  for (const std::string& name : entries) {
    if (set->Has(name) || unreadable.count(name) != 0) continue;
    KernelDesc desc{name, {}};
    auto it = infos.find(name);
    if (it != infos.end()) {
      std::string why;
      if (!FinishParams(it->second.params, it->second.total, &desc.params, &why)) {
        FLYT_WARN("sim: kernel %s: %s; skipped", name.c_str(), why.c_str());
        continue;
      }
    }
    set->Add(std::move(desc));
  }
  return true;
}

// ---------------------------------------------------------------------------------
// PTX

class PtxLexer {
 public:
  PtxLexer(const char* p, size_t n) : p_(p), end_(p + n) {
    const void* nul = std::memchr(p, 0, n);
    if (nul != nullptr) end_ = static_cast<const char*>(nul);
  }
  // Next token: an identifier/directive/number, a quoted string, or one punctuation
  // character. Empty at the end of the text.
  std::string_view Next() {
    for (;;) {
      while (p_ < end_ && IsSpace(*p_)) ++p_;
      if (end_ - p_ >= 2 && p_[0] == '/' && p_[1] == '/') {
        while (p_ < end_ && *p_ != '\n') ++p_;
        continue;
      }
      if (end_ - p_ >= 2 && p_[0] == '/' && p_[1] == '*') {
        const char* q = p_ + 2;
        while (end_ - q >= 2 && !(q[0] == '*' && q[1] == '/')) ++q;
        p_ = end_ - q >= 2 ? q + 2 : end_;
        continue;
      }
      break;
    }
    if (p_ >= end_) return {};
    const char* start = p_;
    if (IsWord(*p_)) {
      while (p_ < end_ && IsWord(*p_)) ++p_;
    } else if (*p_ == '"') {
      ++p_;
      while (p_ < end_ && *p_ != '"') p_ += (*p_ == '\\' && end_ - p_ >= 2) ? 2 : 1;
      if (p_ < end_) ++p_;
    } else {
      ++p_;
    }
    return std::string_view(start, p_ - start);
  }

 private:
  static bool IsSpace(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
  }
  static bool IsWord(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '$' || c == '%' || c == '.';
  }
  const char* p_;
  const char* end_;
};

// Size in bytes of a PTX fundamental type used for a kernel parameter; 0 if unknown.
uint32_t PtxTypeSize(std::string_view t) {
  static const std::unordered_map<std::string_view, uint32_t> kSizes = {
      {".b8", 1},    {".u8", 1},     {".s8", 1},         {".pred", 1},    {".b16", 2},
      {".u16", 2},   {".s16", 2},    {".f16", 2},        {".bf16", 2},    {".b32", 4},
      {".u32", 4},   {".s32", 4},    {".f32", 4},        {".f16x2", 4},   {".bf16x2", 4},
      {".tf32", 4},  {".b64", 8},    {".u64", 8},        {".s64", 8},     {".f64", 8},
      {".b128", 16}, {".texref", 8}, {".samplerref", 8}, {".surfref", 8},
  };
  auto it = kSizes.find(t);
  return it == kSizes.end() ? 0 : it->second;
}

bool ParseNumber(std::string_view tok, uint64_t* v) {
  if (tok.empty() || tok.size() > 12) return false;
  uint64_t n = 0;
  for (char c : tok) {
    if (c < '0' || c > '9') return false;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  *v = n;
  return true;
}

// One `.param ...` declaration of a kernel, as tokens without the separators.
bool PtxParamLayout(const std::vector<std::string_view>& toks, uint32_t* size, uint32_t* align,
                    std::string* why) {
  if (toks.empty() || toks[0] != ".param") {
    *why = "kernel parameter is not a .param";
    return false;
  }
  uint64_t explicit_align = 0, elem = 0, vec = 1, count = 1;
  for (size_t i = 1; i < toks.size(); ++i) {
    const std::string_view t = toks[i];
    if (t == ".align") {
      uint64_t a = 0;
      if (i + 1 >= toks.size() || !ParseNumber(toks[i + 1], &a) || a == 0 || (a & (a - 1))) {
        *why = "bad .align";
        return false;
      }
      ++i;
      if (elem == 0) explicit_align = a;  // after the type it is the pointee's alignment
    } else if (t == ".v2" || t == ".v4" || t == ".v8") {
      vec = static_cast<uint64_t>(t[2] - '0');
    } else if (t == "[") {
      uint64_t n = 0;
      if (i + 2 >= toks.size() || !ParseNumber(toks[i + 1], &n) || toks[i + 2] != "]") {
        *why = "bad array size";
        return false;
      }
      i += 2;
      count *= n;
      if (count > (uint64_t{1} << 24)) {
        *why = "array too large";
        return false;
      }
    } else if (elem == 0 && !t.empty() && t[0] == '.') {
      const uint32_t s = PtxTypeSize(t);
      if (s != 0) elem = s;
      // Other directives (.ptr, .global, .const, ...) do not change the layout.
    }
  }
  if (elem == 0) {
    *why = "parameter has no known type";
    return false;
  }
  *size = static_cast<uint32_t>(elem * vec * count);
  *align = static_cast<uint32_t>(explicit_align != 0 ? explicit_align : elem * vec);
  return true;
}

bool DescribePtx(Bytes text, KernelSet* set, std::string* error) {
  PtxLexer lex(reinterpret_cast<const char*>(text.data()), text.size());
  int depth = 0;
  bool saw_version = false;
  for (std::string_view tok = lex.Next(); !tok.empty(); tok = lex.Next()) {
    if (tok == "{") ++depth;
    if (tok == "}" && depth > 0) --depth;
    if (tok == ".version") saw_version = true;
    if (depth != 0 || tok != ".entry") continue;

    std::string name(lex.Next());
    if (name.empty() || name == "(" || name == "{") {
      *error = "PTX .entry without a name";
      return false;
    }
    KernelDesc desc{name, {}};
    std::string why;
    std::string_view t = lex.Next();
    if (t == "(") {
      // Split the list at top-level commas; a declaration is kept as its tokens.
      std::vector<std::vector<std::string_view>> decls(1);
      int parens = 1;
      for (t = lex.Next(); !t.empty(); t = lex.Next()) {
        if (t == "(") ++parens;
        if (t == ")" && --parens == 0) break;
        if (t == "," && parens == 1) {
          decls.emplace_back();
          continue;
        }
        decls.back().push_back(t);
      }
      if (t.empty()) {
        *error = "PTX parameter list of " + name + " is not closed";
        return false;
      }
      if (decls.size() == 1 && decls[0].empty()) decls.clear();  // "()"
      uint64_t cursor = 0;
      for (const auto& decl : decls) {
        uint32_t size = 0, align = 1;
        if (!PtxParamLayout(decl, &size, &align, &why)) break;
        cursor = (cursor + align - 1) / align * align;
        if (cursor + size > UINT32_MAX) {
          why = "parameter block too large";
          break;
        }
        desc.params.push_back({static_cast<uint32_t>(cursor), size});
        cursor += size;
      }
      if (!why.empty()) {
        FLYT_WARN("sim: PTX kernel %s: %s; skipped", name.c_str(), why.c_str());
        continue;
      }
    } else if (t == "{") {
      ++depth;
    }
    if (!set->Has(name)) set->Add(std::move(desc));
  }
  if (!saw_version) {
    *error = "PTX text has no .version directive";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------
// Fatbins

struct Entry {
  uint16_t kind = 0;
  uint64_t flags = 0;
  Bytes payload{nullptr, 0};
  uint32_t compressed_size = 0;
  uint64_t inflated_size = 0;
};

// Inflated bytes; not zero-filled, so a large but bogus size costs no page faults.
struct Inflated {
  std::unique_ptr<uint8_t[]> bytes;
  size_t size = 0;
};

// Returns the entry's image bytes in *out (pointing into `storage` when inflated).
bool Inflate(const Entry& e, Inflated* storage, Bytes* out, std::string* why) {
  if ((e.flags & (kFlagLz4 | kFlagZstd)) == 0) {
    *out = e.payload;
    return true;
  }
  const size_t in_size = (e.compressed_size != 0 && e.compressed_size <= e.payload.size())
                             ? e.compressed_size
                             : e.payload.size();
  if (e.flags & kFlagZstd) {
    const size_t frame = ZSTD_findFrameCompressedSize(e.payload.data(), in_size);
    if (ZSTD_isError(frame)) {
      *why = std::string("zstd: ") + ZSTD_getErrorName(frame);
      return false;
    }
    uint64_t want = e.inflated_size;
    const unsigned long long declared = ZSTD_getFrameContentSize(e.payload.data(), frame);
    if (declared == ZSTD_CONTENTSIZE_ERROR) {
      *why = "zstd: bad frame header";
      return false;
    }
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN) {
      if (want != 0 && want != declared) {
        *why = "zstd frame size disagrees with the entry header";
        return false;
      }
      want = declared;
    }
    if (want == 0 || want > kMaxInflated) {
      *why = "zstd entry without a plausible uncompressed size";
      return false;
    }
    storage->bytes = std::make_unique_for_overwrite<uint8_t[]>(want);
    const size_t got = ZSTD_decompress(storage->bytes.get(), want, e.payload.data(), frame);
    if (ZSTD_isError(got)) {
      *why = std::string("zstd: ") + ZSTD_getErrorName(got);
      return false;
    }
    storage->size = got;
  } else {
    if (e.inflated_size == 0 || e.inflated_size > kMaxInflated || in_size > INT32_MAX) {
      *why = "LZ4 entry without a plausible uncompressed size";
      return false;
    }
    storage->bytes = std::make_unique_for_overwrite<uint8_t[]>(e.inflated_size);
    const int got =
        LZ4_decompress_safe(reinterpret_cast<const char*>(e.payload.data()),
                            reinterpret_cast<char*>(storage->bytes.get()),
                            static_cast<int>(in_size), static_cast<int>(e.inflated_size));
    if (got < 0) {
      *why = "LZ4 payload is corrupt";
      return false;
    }
    storage->size = static_cast<size_t>(got);
  }
  *out = Bytes(storage->bytes.get(), storage->size);
  return true;
}

// Reads every ELF, then every PTX entry of the fatbin(s) in `b`. Counts the entries
// that were read successfully in *usable.
bool DescribeFatbins(Bytes b, KernelSet* set, int* usable, std::string* error) {
  std::vector<Entry> entries;
  uint64_t off = 0;
  while (off < b.size()) {
    uint32_t magic = 0;
    if (!b.Get(off, &magic) || magic != kFatbinMagic) {
      // Zero padding may follow the last fatbin; anything else ends the walk.
      bool zeros = true;
      for (uint64_t i = off; i < b.size() && zeros; ++i) zeros = b.At<uint8_t>(i) == 0;
      if (zeros || !entries.empty()) break;
      *error = "bad fatbin magic";
      return false;
    }
    uint16_t header_size = 0;
    uint64_t fat_size = 0;
    if (!b.Get(off + 6, &header_size) || !b.Get(off + 8, &fat_size) || header_size < 16 ||
        !b.Contains(off, header_size) || !b.Contains(off + header_size, fat_size)) {
      *error = "truncated fatbin";
      return false;
    }
    const uint64_t end = off + header_size + fat_size;
    uint64_t e = off + header_size;
    while (e < end) {
      Entry entry;
      uint32_t entry_header = 0;
      uint64_t payload_size = 0;
      if (!b.Get(e, &entry.kind) || !b.Get(e + 4, &entry_header) || !b.Get(e + 8, &payload_size) ||
          entry_header < 16 || e + entry_header > end || payload_size > end - e - entry_header) {
        *error = "truncated fatbin entry";
        return false;
      }
      if (entry_header >= 20) entry.compressed_size = b.At<uint32_t>(e + 16);
      if (entry_header >= 48) entry.flags = b.At<uint64_t>(e + 40);
      if (entry_header >= 64) entry.inflated_size = b.At<uint64_t>(e + 56);
      entry.payload = b.Sub(e + entry_header, payload_size);
      entries.push_back(entry);
      e += entry_header + payload_size;
    }
    off = end;
    while (off < b.size() && off % 8 != 0 && b.At<uint8_t>(off) == 0) ++off;
  }
  if (entries.empty()) {
    *error = "fatbin has no entries";
    return false;
  }
  std::string last_error;
  for (uint16_t kind : {kEntryElf, kEntryPtx}) {
    for (const Entry& entry : entries) {
      if (entry.kind != kind) continue;
      Inflated storage;
      Bytes image(nullptr, 0);
      std::string why;
      const bool ok =
          Inflate(entry, &storage, &image, &why) &&
          (kind == kEntryElf ? DescribeElf(image, set, &why) : DescribePtx(image, set, &why));
      if (ok) {
        ++*usable;
      } else {
        FLYT_WARN("sim: fatbin %s entry skipped: %s", kind == kEntryElf ? "ELF" : "PTX",
                  why.c_str());
        last_error = why;
      }
    }
  }
  if (*usable == 0) {
    *error = last_error.empty() ? "fatbin has no ELF or PTX entry" : last_error;
    return false;
  }
  return true;
}

}  // namespace

bool DescribeKernels(const void* data, size_t size, std::vector<KernelDesc>* out,
                     std::string* error) {
  out->clear();
  std::string ignored;
  if (error == nullptr) error = &ignored;
  error->clear();
  if (data == nullptr || size < 4) {
    *error = "image is empty";
    return false;
  }
  const Bytes b(data, size);
  KernelSet set;
  bool ok = false;
  uint32_t magic = b.At<uint32_t>(0);
  if (magic == kFatbinMagic) {
    int usable = 0;
    ok = DescribeFatbins(b, &set, &usable, error);
  } else if (std::memcmp(b.data(), kElfMagic, 4) == 0) {
    ok = DescribeElf(b, &set, error);
  } else {
    ok = DescribePtx(b, &set, error);
  }
  if (!ok) return false;
  *out = set.Take();
  return true;
}

}  // namespace flyt::sim
