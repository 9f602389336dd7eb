// XXH64 against the reference library's values (libxxhash 0.8.1, seed 0 unless given), and the
// streaming interface against one-shot hashing for every way of splitting the input.
#include "checkpoint/checksum.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mt::checkpoint {
namespace {

uint64_t of(const std::string& s, uint64_t seed = 0) { return xxh64(s.data(), s.size(), seed); }

std::vector<unsigned char> squares(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * i) % 251);
  return v;
}

TEST(Xxh64Test, MatchesTheReferenceImplementation) {
  EXPECT_EQ(of(""), 0xef46db3751d8e999ULL);
  EXPECT_EQ(of("a"), 0xd24ec4f1a98c6e5bULL);
  EXPECT_EQ(of("abc"), 0x44bc2cf5ad770999ULL);
  EXPECT_EQ(of("0123456789abcdef0123456789abcdef"), 0x642a94958e71e6c5ULL);
  EXPECT_EQ(of("abc", 0x9E3779B1), 0x1318df30094a85fdULL);
  std::string bytes;
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 256; ++i) bytes.push_back(char(i));
  }
  bytes += "xyz";
  EXPECT_EQ(of(bytes), 0xe146cb31b65bc21aULL);
  const auto sq = squares(1000);
  EXPECT_EQ(xxh64(sq.data(), sq.size()), 0x2d5f4044a731ebd7ULL);
  EXPECT_EQ(xxh64(sq.data(), sq.size(), 12345), 0xa6d6333ef10f5be9ULL);
}

TEST(Xxh64Test, StreamingEqualsOneShotForAnySplit) {
  const auto data = squares(300);
  for (size_t n : {size_t{0}, size_t{5}, size_t{31}, size_t{32}, size_t{33}, size_t{64},
                   size_t{100}, size_t{300}}) {
    const uint64_t expected = xxh64(data.data(), n);
    for (size_t piece = 1; piece <= 70; ++piece) {
      Xxh64 h;
      for (size_t at = 0; at < n; at += piece) h.update(data.data() + at, std::min(piece, n - at));
      ASSERT_EQ(h.digest(), expected) << "n " << n << " pieces of " << piece;
    }
    // Uneven pieces that straddle stripe boundaries.
    Xxh64 h;
    size_t at = 0;
    for (size_t k = 1; at < n; ++k) {
      const size_t take = std::min(n - at, (k * 7) % 41);
      h.update(data.data() + at, take);
      at += take;
    }
    EXPECT_EQ(h.digest(), expected) << n;
  }
}

TEST(Xxh64Test, DigestDoesNotEndTheStream) {
  const auto data = squares(100);
  Xxh64 h;
  h.update(data.data(), 40);
  EXPECT_EQ(h.digest(), xxh64(data.data(), 40));
  h.update(data.data() + 40, 60);
  EXPECT_EQ(h.digest(), xxh64(data.data(), 100));
}

}  // namespace
}  // namespace mt::checkpoint
