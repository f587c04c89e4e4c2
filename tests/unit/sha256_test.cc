// common/sha256.h against the FIPS 180-4 example vectors, fed whole and in odd pieces.
#include "common/sha256.h"

#include <gtest/gtest.h>

#include <string>

namespace {

std::string Digest(const std::string& text, size_t piece) {
  flyt::Sha256 sha;
  for (size_t at = 0; at < text.size(); at += piece)
    sha.Update(text.data() + at, std::min(piece, text.size() - at));
  uint8_t d[32];
  sha.Final(d);
  return flyt::Sha256::Hex(d);
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(Digest("", 1), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Digest("abc", 1), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  for (size_t piece : {1, 3, 55, 56, 63, 64, 1000})
    EXPECT_EQ(Digest(two_blocks, piece),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        << "pieces of " << piece;
  EXPECT_EQ(Digest(std::string(1000000, 'a'), 4097),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
