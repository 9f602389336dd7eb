#include "data/tokenizer/byte_level.h"

#include "data/tokenizer/utf8.h"

namespace mt::data {
namespace {

struct ByteLevelTables {
  std::array<char32_t, 256> to_unicode{};
  std::array<uint8_t, 256> order{};
  std::array<int16_t, 324> from_unicode{};  // code point -> byte; -1 outside the alphabet
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t = [] {
    ByteLevelTables t;
    t.from_unicode.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      if (printable(b)) t.order[n++] = static_cast<uint8_t>(b), t.to_unicode[b] = b;
    }
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      if (!printable(b)) t.order[n++] = static_cast<uint8_t>(b), t.to_unicode[b] = 256 + extra++;
    }
    for (int b = 0; b < 256; ++b) t.from_unicode[t.to_unicode[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return t;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return tables().to_unicode[b]; }

const std::array<uint8_t, 256>& byte_level_order() { return tables().order; }

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(tables().to_unicode[static_cast<uint8_t>(c)], out);
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  const ByteLevelTables& t = tables();
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const DecodedCodePoint d = decode_utf8(text, pos);
    if (d.cp >= t.from_unicode.size() || t.from_unicode[d.cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.from_unicode[d.cp]));
    pos += d.length;
  }
  return out;
}

}  // namespace mt::data
