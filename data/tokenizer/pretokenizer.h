// Pre-tokenization: splits text into the pieces ("words") that BPE then encodes one by one, as the
// regex of the tokenizer does. std::regex has no \p{L}, so the two regexes in use are matched by
// hand-written code that follows their alternation order and backtracking exactly:
//   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Any byte string is accepted: an invalid UTF-8 byte counts as one code point that is neither a
// letter, a number nor whitespace. The pieces cover the text exactly, in order.
#pragma once

#include <string_view>
#include <vector>

namespace mt::data {

enum class PretokenizerKind { kGpt2, kLlama3 };

// The regexes exactly as tokenizer.json spells them (ByteLevel's built-in regex is kGpt2Regex).
inline constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// "gpt2" or "llama3".
std::string_view pretokenizer_name(PretokenizerKind kind);
std::string_view pretokenizer_regex(PretokenizerKind kind);

// Appends the pieces of text to out (views into text). Empty text gives no piece.
void pretokenize(std::string_view text, PretokenizerKind kind, std::vector<std::string_view>& out);

}  // namespace mt::data
