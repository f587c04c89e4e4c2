// SHA-256 (FIPS 180-4) without dependencies, for code that cannot link OpenSSL: the
// client library inside applications (content keys of the compile cache).
//
// Owns: the hash only. Must not be used where a keyed MAC is needed (control/channel.h
// has HMAC-SHA256 from OpenSSL for that).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flyt {

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  // Writes the 32-byte digest; the object must not be updated afterwards.
  void Final(uint8_t out[32]);
  // Lower-case hex of a 32-byte digest.
  static std::string Hex(const uint8_t digest[32]);

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

}  // namespace flyt
