// UTF-8 decoding that never fails: byte-level tokenizers must accept any byte string, so an
// invalid or truncated sequence decodes as one code point per offending byte (kInvalidCodePoint,
// length 1). Overlong forms, surrogates (U+D800..U+DFFF) and values above U+10FFFF are invalid.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mt::data {

inline constexpr char32_t kInvalidCodePoint = 0xFFFFFFFF;

struct DecodedCodePoint {
  char32_t cp;  // kInvalidCodePoint for a byte that does not start a valid sequence
  int length;   // bytes consumed, 1..4
};

// Decodes the code point starting at text[pos]; requires pos < text.size().
DecodedCodePoint decode_utf8(std::string_view text, size_t pos);

// Appends the UTF-8 encoding of cp (which must be a valid scalar value) to out.
void append_utf8(char32_t cp, std::string& out);

// True when text is well-formed UTF-8.
bool is_valid_utf8(std::string_view text);

}  // namespace mt::data
