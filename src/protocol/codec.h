// Bounds-checked encoding of frame payloads.
//
// Owns: Writer (appends little-endian values to a growable buffer) and Reader
// (consumes them, failing closed on any overrun). A Reader never reads past its
// span: every hostile length turns into ok() == false, never into a crash.
// Must not know about ops or transports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace flyt::wire {

class Writer {
 public:
  Writer() { buf_.reserve(256); }
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    PutBytes(&v, sizeof(T));
  }
  void PutBytes(const void* p, size_t n) {
    if (n == 0) return;
    size_t at = buf_.size();
    buf_.resize(at + n);
    std::memcpy(buf_.data() + at, p, n);
  }
  // Length-prefixed (u32) bytes.
  void PutBlob(const void* p, size_t n) {
    Put<uint32_t>(static_cast<uint32_t>(n));
    PutBytes(p, n);
  }
  void PutString(std::string_view s) { PutBlob(s.data(), s.size()); }
  // Reserves n bytes and returns where to write them.
  uint8_t* Grow(size_t n) {
    size_t at = buf_.size();
    buf_.resize(at + n);
    return buf_.data() + at;
  }
  void Clear() { buf_.clear(); }
  const uint8_t* data() const { return buf_.data(); }
  size_t size() const { return buf_.size(); }
  std::vector<uint8_t>& buffer() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  Reader(const void* p, size_t n) : p_(static_cast<const uint8_t*>(p)), n_(n) {}
  template <typename T>
  bool Get(T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return GetBytes(v, sizeof(T));
  }
  template <typename T>
  T Take() {
    T v{};
    Get(&v);
    return v;
  }
  bool GetBytes(void* dst, size_t n) {
    const uint8_t* src = Skip(n);
    if (src == nullptr) return n == 0 && ok_;
    std::memcpy(dst, src, n);
    return true;
  }
  // Returns a pointer to the next n bytes inside the span and consumes them,
  // or nullptr (and ok() == false) when fewer than n remain.
  const uint8_t* Skip(size_t n) {
    if (!ok_ || n > n_ - off_) {
      ok_ = false;
      return nullptr;
    }
    const uint8_t* at = p_ + off_;
    off_ += n;
    return at;
  }
  // Length-prefixed bytes, at most `limit` long.
  bool GetBlob(const uint8_t** data, uint32_t* len, uint32_t limit = UINT32_MAX) {
    if (!Get(len) || *len > limit) return ok_ = false;
    *data = Skip(*len);
    return ok_;
  }
  bool GetString(std::string* s, uint32_t limit = 4096) {
    const uint8_t* d = nullptr;
    uint32_t len = 0;
    if (!GetBlob(&d, &len, limit)) return false;
    s->assign(reinterpret_cast<const char*>(d), len);
    return true;
  }
  bool ok() const { return ok_; }
  size_t remaining() const { return n_ - off_; }
  void Fail() { ok_ = false; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
  bool ok_ = true;
};

}  // namespace flyt::wire
