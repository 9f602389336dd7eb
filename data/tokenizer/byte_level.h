// GPT-2's byte-level alphabet (`bytes_to_unicode`): each of the 256 byte values is shown as one
// printable code point, so that a token (a byte string) can be written as text in tokenizer.json.
// Printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves; the other 68
// bytes map in order to U+0100.. (a space 0x20 becomes 'Ġ' U+0120, a newline 0x0A becomes 'Ċ').
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mt::data {

// The code point standing for byte b.
char32_t byte_to_unicode(uint8_t b);

// The 256 bytes in the order GPT-2 lists them (the printable ones first): GPT-2's vocabulary, and
// the trainer's, give byte_level_order()[i] the token id i.
const std::array<uint8_t, 256>& byte_level_order();

// Raw bytes -> their byte-level text (UTF-8 of the mapped code points).
std::string bytes_to_byte_level(std::string_view bytes);

// Byte-level text -> raw bytes; std::nullopt when the text is not valid UTF-8 or holds a code
// point outside the byte-level alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view text);

}  // namespace mt::data
