// Implementation of client/compile_cache.h.
//
// The table's slots, as NVRTC 13.0 calls them on driver 580 (probed on the H200 with
// tests/gpu/probe; NVRTC's own trace, option --enable-cache-trace, names them):
//   0  size in bytes (56: seven slots)
//   1  CUresult MakeKey(Key** out, int stage, const void* input, size_t input_size,
//                       const char* options, const char* host, const char* build, int arch)
//      stage 2: NVVM bitcode to PTX, stage 1: PTX to cubin (the input is the bitcode for
//      both); options e.g. " -arch=compute_90 -ftz=0 ..."; host "HOST64"; build the
//      compiler's build date; arch 90. The driver returns CUDA_ERROR_NOT_INITIALIZED (3)
//      when CUDA_CACHE_DISABLE=1, and NVRTC then compiles every time.
//   2  CUresult FreeKey(Key* key)
//   3  CUresult Lookup(Key* key, int flags, void** data, uint32_t* size): on a hit a
//      buffer the caller hands back to slot 6; CUDA_ERROR_NOT_FOUND on a miss
//   4  CUresult Store(Key* key, int flags, const void* data, size_t size)
//   5  CUresult Delete(Key* key): NVRTC checks that it exists ("DeleteCacheData found")
//      but was never seen calling it; it forgets the entry
//   6  CUresult FreeData(void* data)
// Any failure here makes NVRTC compile as if there were no cache, so every slot fails
// safe: a bad argument, a full disk or a damaged file is a miss, never an error.
#include "client/compile_cache.h"

#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "common/log.h"

// xxHash (Debian libxxhash-dev) compiled in, static inline: nothing is exported and
// nothing is loaded at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace flyt::client {

const unsigned char kCompileCacheUuid[16] = {0xda, 0x91, 0x51, 0xd3, 0x3a, 0xe6, 0xcc, 0x41,
                                             0xa5, 0xc0, 0x4f, 0x26, 0xd5, 0x33, 0xe3, 0x28};

namespace {

constexpr uint64_t kKeyMagic = 0x59454b4354594c46ull;  // "FLYTCKEY"
constexpr size_t kMaxInput = size_t{1} << 30;          // larger inputs are not cached
constexpr size_t kMaxEntry = size_t{512} << 20;
constexpr size_t kMaxString = 64 << 10;
constexpr size_t kMemoryBudget = size_t{256} << 20;
// CUDA's documented default for CUDA_CACHE_MAXSIZE, and its ceiling.
constexpr uint64_t kDefaultDiskBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxDiskBytes = uint64_t{4} << 30;
constexpr char kFileMagic[8] = {'F', 'L', 'Y', 'T', 'C', 'C', '0', '2'};

using Digest = XXH128_canonical_t;  // 16 bytes, the same on every machine

// Streams bytes into a 128-bit XXH3 digest.
class Hasher {
 public:
  Hasher() {
    XXH3_INITSTATE(&state_);
    XXH3_128bits_reset(&state_);
  }
  void Update(const void* p, size_t n) { XXH3_128bits_update(&state_, p, n); }
  Digest Final() {
    Digest d;
    XXH128_canonicalFromHash(&d, XXH3_128bits_digest(&state_));
    return d;
  }

 private:
  XXH3_state_t state_;
};

Digest HashOf(const void* p, size_t n) {
  Hasher h;
  h.Update(p, n);
  return h.Final();
}

std::string Hex(const Digest& d) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(2 * sizeof(d.digest), '0');
  for (size_t i = 0; i < sizeof(d.digest); ++i) {
    s[2 * i] = kDigits[d.digest[i] >> 4];
    s[2 * i + 1] = kDigits[d.digest[i] & 15];
  }
  return s;
}

struct Key {
  uint64_t magic;
  uint32_t stage;
  Digest digest;
};

bool ValidKey(const Key* key) { return key != nullptr && key->magic == kKeyMagic; }

struct FileHeader {
  char magic[8];
  uint64_t size;
  Digest data_digest;
};

bool Truthy(const char* v) { return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0; }

std::string CacheRoot() {
  if (const char* p = std::getenv("CUDA_CACHE_PATH"); p != nullptr && p[0] != '\0') return p;
  std::string home;
  if (const char* h = std::getenv("HOME"); h != nullptr && h[0] != '\0') {
    home = h;
  } else {
    passwd pw{};
    passwd* found = nullptr;
    char buf[4096];
    if (getpwuid_r(getuid(), &pw, buf, sizeof(buf), &found) == 0 && found != nullptr &&
        found->pw_dir != nullptr)
      home = found->pw_dir;
  }
  return home.empty() ? std::string() : home + "/.nv/ComputeCache";
}

// Creates every missing folder of `path` (0700).
bool MakeFolders(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at != path.size() && path[at] != '/') continue;
    std::string part = path.substr(0, at);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

using Entry = std::shared_ptr<const std::vector<uint8_t>>;

// Entries in this process's memory (oldest dropped first past kMemoryBudget) and on disk:
// one file per key, named by its hex digest, written whole and renamed into place.
class Store {
 public:
  static Store& Get() {
    static Store* store = new Store();  // never destroyed: NVRTC may call during exit
    return *store;
  }

  Entry Find(const Digest& digest) {
    const std::string name = Hex(digest);
    {
      std::lock_guard lock(mu_);
      auto it = memory_.find(name);
      if (it != memory_.end()) return it->second;
    }
    Entry e = ReadFile(name);
    if (e) Remember(name, e);
    return e;
  }

  void Put(const Digest& digest, const void* data, size_t n) {
    const std::string name = Hex(digest);
    auto e = std::make_shared<const std::vector<uint8_t>>(static_cast<const uint8_t*>(data),
                                                          static_cast<const uint8_t*>(data) + n);
    Remember(name, e);
    WriteFile(name, *e);
  }

  void Erase(const Digest& digest) {
    const std::string name = Hex(digest);
    {
      std::lock_guard lock(mu_);
      auto it = memory_.find(name);
      if (it != memory_.end()) {
        memory_bytes_ -= it->second->size();
        memory_.erase(it);
      }
    }
    if (!folder_.empty()) ::unlink((folder_ + "/" + name).c_str());
  }

 private:
  Store() {
    const char* max = std::getenv("CUDA_CACHE_MAXSIZE");
    disk_limit_ = kDefaultDiskBytes;
    if (max != nullptr && max[0] != '\0') {
      char* end = nullptr;
      unsigned long long v = std::strtoull(max, &end, 10);
      if (end != nullptr && *end == '\0') disk_limit_ = v < kMaxDiskBytes ? v : kMaxDiskBytes;
    }
    std::string root = CacheRoot();
    if (disk_limit_ > 0 && !root.empty()) {
      std::string folder = root + "/flyt";
      if (MakeFolders(folder)) {
        folder_ = folder;
      } else {
        FLYT_INFO("compile cache: cannot use %s (%s); compiled code is kept in memory only",
                  folder.c_str(), std::strerror(errno));
      }
    }
    FLYT_DEBUG("compile cache: %s, %llu bytes at most on disk",
               folder_.empty() ? "memory only" : folder_.c_str(),
               static_cast<unsigned long long>(disk_limit_));
  }

  void Remember(const std::string& name, const Entry& e) {
    std::lock_guard lock(mu_);
    if (memory_.count(name) != 0) return;
    memory_.emplace(name, e);
    order_.push_back(name);
    memory_bytes_ += e->size();
    while (memory_bytes_ > kMemoryBudget && !order_.empty()) {
      auto it = memory_.find(order_.front());
      if (it != memory_.end()) {
        memory_bytes_ -= it->second->size();
        memory_.erase(it);
      }
      order_.pop_front();
    }
  }

  // A file that is not whole and intact is removed and counts as a miss.
  Entry ReadFile(const std::string& name) {
    if (folder_.empty()) return nullptr;
    const std::string path = folder_ + "/" + name;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    FileHeader h{};
    Entry out;
    bool ok = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(h) &&
              ReadAll(fd, &h, sizeof(h)) && std::memcmp(h.magic, kFileMagic, 8) == 0 &&
              h.size <= kMaxEntry && h.size == static_cast<uint64_t>(st.st_size) - sizeof(h);
    if (ok) {
      auto data = std::make_shared<std::vector<uint8_t>>(h.size);
      ok = ReadAll(fd, data->data(), data->size());
      const Digest digest = HashOf(data->data(), data->size());
      ok = ok && std::memcmp(&digest, &h.data_digest, sizeof(digest)) == 0;
      if (ok) out = std::move(data);
    }
    ::close(fd);
    if (!ok) {
      FLYT_WARN("compile cache: %s is damaged; removing it (it will be compiled again)",
                path.c_str());
      ::unlink(path.c_str());
      return nullptr;
    }
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // recently used: trimmed last
    return out;
  }

  void WriteFile(const std::string& name, const std::vector<uint8_t>& data) {
    if (folder_.empty() || data.size() + sizeof(FileHeader) > disk_limit_) return;
    static std::atomic<uint64_t> serial{0};
    const std::string tmp =
        folder_ + "/.tmp." + std::to_string(getpid()) + "." + std::to_string(serial.fetch_add(1));
    FileHeader h{};
    std::memcpy(h.magic, kFileMagic, sizeof(h.magic));
    h.size = data.size();
    h.data_digest = HashOf(data.data(), data.size());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return;
    bool ok = WriteAll(fd, &h, sizeof(h)) && WriteAll(fd, data.data(), data.size());
    ok = ::close(fd) == 0 && ok;
    if (!ok || ::rename(tmp.c_str(), (folder_ + "/" + name).c_str()) != 0) {
      ::unlink(tmp.c_str());
      return;
    }
    uint64_t written = written_.fetch_add(data.size() + sizeof(h)) + data.size() + sizeof(h);
    if (written >= disk_limit_ / 8 || !trimmed_once_.exchange(true)) {
      written_ = 0;
      Trim();
    }
  }

  // Keeps the folder under CUDA_CACHE_MAXSIZE: least recently used files go first;
  // temporary files a crashed writer left behind go after an hour.
  void Trim() {
    DIR* dir = ::opendir(folder_.c_str());
    if (dir == nullptr) return;
    struct File {
      std::string path;
      int64_t mtime;
      uint64_t size;
    };
    std::vector<File> files;
    uint64_t total = 0;
    const int64_t now = static_cast<int64_t>(::time(nullptr));
    while (dirent* d = ::readdir(dir)) {
      if (d->d_name[0] == '.' && std::strncmp(d->d_name, ".tmp.", 5) != 0) continue;
      std::string path = folder_ + "/" + d->d_name;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (d->d_name[0] == '.') {
        if (now - st.st_mtime > 3600) ::unlink(path.c_str());
        continue;
      }
      files.push_back({path, static_cast<int64_t>(st.st_mtime), static_cast<uint64_t>(st.st_size)});
      total += static_cast<uint64_t>(st.st_size);
    }
    ::closedir(dir);
    if (total <= disk_limit_) return;
    std::sort(files.begin(), files.end(),
              [](const File& a, const File& b) { return a.mtime < b.mtime; });
    for (const File& f : files) {
      if (total <= disk_limit_ - disk_limit_ / 10) break;
      if (::unlink(f.path.c_str()) == 0) total -= f.size;
    }
  }

  std::mutex mu_;
  std::unordered_map<std::string, Entry> memory_;
  std::deque<std::string> order_;
  size_t memory_bytes_ = 0;
  std::string folder_;  // empty: memory only
  uint64_t disk_limit_ = 0;
  std::atomic<uint64_t> written_{0};
  std::atomic<bool> trimmed_once_{false};
};

void HashString(Hasher* h, const char* s) {
  uint64_t n = s == nullptr ? ~uint64_t{0} : strnlen(s, kMaxString);
  h->Update(&n, sizeof(n));
  if (s != nullptr) h->Update(s, n);
}

// Slot 1.
CUresult MakeKey(Key** out, int stage, const void* input, size_t input_size, const char* options,
                 const char* host, const char* build, int arch) {
  if (Truthy(std::getenv("CUDA_CACHE_DISABLE"))) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr || (input == nullptr && input_size != 0) || input_size > kMaxInput)
    return CUDA_ERROR_INVALID_VALUE;
  Hasher h;
  static const char kDomain[] = "flyt compile cache 1";
  h.Update(kDomain, sizeof(kDomain));
  int64_t numbers[3] = {stage, arch, static_cast<int64_t>(input_size)};
  h.Update(numbers, sizeof(numbers));
  HashString(&h, options);
  HashString(&h, host);
  HashString(&h, build);
  if (input_size > 0) h.Update(input, input_size);
  auto* key = new (std::nothrow) Key{kKeyMagic, static_cast<uint32_t>(stage), h.Final()};
  if (key == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  *out = key;
  FLYT_TRACE("compile cache: key %.16s for stage %d, arch %d, %zu input bytes",
             Hex(key->digest).c_str(), stage, arch, input_size);
  return CUDA_SUCCESS;
}

// Slot 2.
CUresult FreeKey(Key* key) {
  if (!ValidKey(key)) return CUDA_ERROR_INVALID_VALUE;
  key->magic = 0;
  delete key;
  return CUDA_SUCCESS;
}

// Slot 3.
CUresult Lookup(Key* key, int /*flags*/, void** data, uint32_t* size) {
  if (!ValidKey(key) || data == nullptr || size == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Entry e = Store::Get().Find(key->digest);
  if (!e) return CUDA_ERROR_NOT_FOUND;
  void* copy = std::malloc(e->empty() ? 1 : e->size());
  if (copy == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memcpy(copy, e->data(), e->size());
  *data = copy;
  *size = static_cast<uint32_t>(e->size());
  FLYT_TRACE("compile cache: hit, %zu bytes (stage %u)", e->size(), key->stage);
  return CUDA_SUCCESS;
}

// Slot 4.
CUresult StoreEntry(Key* key, int /*flags*/, const void* data, size_t size) {
  if (!ValidKey(key) || (data == nullptr && size != 0)) return CUDA_ERROR_INVALID_VALUE;
  if (size > kMaxEntry) return CUDA_ERROR_NOT_SUPPORTED;
  Store::Get().Put(key->digest, data, size);
  FLYT_TRACE("compile cache: stored %zu bytes (stage %u)", size, key->stage);
  return CUDA_SUCCESS;
}

// Slot 5.
CUresult DeleteEntry(Key* key) {
  if (!ValidKey(key)) return CUDA_ERROR_INVALID_VALUE;
  Store::Get().Erase(key->digest);
  return CUDA_SUCCESS;
}

// Slot 6.
CUresult FreeData(void* data) {
  std::free(data);
  return CUDA_SUCCESS;
}

}  // namespace

const void* CompileCacheTable() {
  static const void* const kTable[] = {
      reinterpret_cast<const void*>(uintptr_t{7 * sizeof(void*)}),
      reinterpret_cast<const void*>(&MakeKey),
      reinterpret_cast<const void*>(&FreeKey),
      reinterpret_cast<const void*>(&Lookup),
      reinterpret_cast<const void*>(&StoreEntry),
      reinterpret_cast<const void*>(&DeleteEntry),
      reinterpret_cast<const void*>(&FreeData),
  };
  const char* flag = std::getenv("FLYT_COMPILE_CACHE");
  if (flag != nullptr && std::strcmp(flag, "0") == 0) return nullptr;
  return kTable;
}

}  // namespace flyt::client
