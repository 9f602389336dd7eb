#include "data/tokenizer/utf8.h"

#include <cstdint>

namespace mt::data {

DecodedCodePoint decode_utf8(std::string_view text, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t left = text.size() - pos;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {b0, 1};
  int length;
  char32_t cp;
  char32_t min_value;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2, cp = b0 & 0x1F, min_value = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3, cp = b0 & 0x0F, min_value = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4, cp = b0 & 0x07, min_value = 0x10000;
  } else {
    return {kInvalidCodePoint, 1};  // continuation byte, 0xC0/0xC1 or 0xF5..0xFF
  }
  if (left < static_cast<size_t>(length)) return {kInvalidCodePoint, 1};
  for (int i = 1; i < length; ++i) {
    if ((p[i] & 0xC0) != 0x80) return {kInvalidCodePoint, 1};
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  if (cp < min_value || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return {kInvalidCodePoint, 1};
  }
  return {cp, length};
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const DecodedCodePoint d = decode_utf8(text, pos);
    if (d.cp == kInvalidCodePoint) return false;
    pos += d.length;
  }
  return true;
}

}  // namespace mt::data
