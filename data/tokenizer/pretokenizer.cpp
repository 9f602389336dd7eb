#include "data/tokenizer/pretokenizer.h"

#include <cstdint>

#include "data/tokenizer/unicode_class.h"
#include "data/tokenizer/utf8.h"

namespace mt::data {
namespace {

// One decoded code point with its class bits; kOther stands for "[^\s\p{L}\p{N}]".
constexpr uint8_t kOther = 8;
constexpr uint8_t kNewline = 16;  // '\r' or '\n' (also kWhitespace)

struct Cp {
  char32_t cp;
  uint8_t cls;
  int length;
};

class Matcher {
 public:
  explicit Matcher(std::string_view text) : text_(text) {}

  Cp at(size_t pos) const {
    const DecodedCodePoint d = decode_utf8(text_, pos);
    uint8_t cls = d.cp == kInvalidCodePoint ? 0 : unicode_class(d.cp);
    if (cls == 0) cls = kOther;
    if (d.cp == '\r' || d.cp == '\n') cls |= kNewline;
    return {d.cp, cls, d.length};
  }

  // End of the run of code points having any of `cls` bits, starting at pos; at most max_count.
  size_t run_end(size_t pos, uint8_t cls, int max_count = -1) const {
    int count = 0;
    while (pos < text_.size() && count != max_count) {
      const Cp c = at(pos);
      if (!(c.cls & cls)) break;
      pos += c.length;
      ++count;
    }
    return pos;
  }

  // The tail shared by both regexes, at whitespace: `\s+(?!\S)|\s+`.
  size_t match_whitespace(size_t pos) const {
    size_t last_start = pos;
    size_t end = pos;
    while (end < text_.size()) {
      const Cp c = at(end);
      if (!(c.cls & kWhitespace)) break;
      last_start = end;
      end += c.length;
    }
    if (end == text_.size()) return end;      // \s+ up to the end: (?!\S) holds
    if (last_start > pos) return last_start;  // back off one, so whitespace follows
    return end;                               // a single whitespace before \S: \s+
  }

  // A ' followed by s|t|re|ve|m|ll|d (ASCII; any case and U+017F 'ſ' when case_insensitive).
  size_t match_contraction(size_t pos, bool case_insensitive) const {
    if (text_[pos] != '\'' || pos + 1 >= text_.size()) return 0;
    const Cp c1 = at(pos + 1);
    auto fold = [&](char32_t c) -> char32_t {
      if (!case_insensitive) return c;
      if (c >= 'A' && c <= 'Z') return c - 'A' + 'a';
      if (c == 0x17F) return 's';  // LATIN SMALL LETTER LONG S case-folds to 's'
      return c;
    };
    const char32_t a = fold(c1.cp);
    const size_t after1 = pos + 1 + c1.length;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return after1;
    if (after1 >= text_.size()) return 0;
    const char32_t b = fold(at(after1).cp);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
      return after1 + 1;
    }
    return 0;
  }

  size_t match_gpt2(size_t pos) const {
    if (size_t end = match_contraction(pos, false)) return end;
    const Cp c0 = at(pos);
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: the optional space only matters before such a run.
    if (c0.cp == ' ' && pos + 1 < text_.size()) {
      const Cp c1 = at(pos + 1);
      for (uint8_t cls : {kLetter, kNumber, kOther}) {
        if (c1.cls & cls) return run_end(pos + 1, cls);
      }
    }
    for (uint8_t cls : {kLetter, kNumber, kOther}) {
      if (c0.cls & cls) return run_end(pos, cls);
    }
    return match_whitespace(pos);
  }

  size_t match_llama3(size_t pos) const {
    if (size_t end = match_contraction(pos, true)) return end;
    const Cp c0 = at(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c0.cls & kLetter) return run_end(pos, kLetter);
    if (!(c0.cls & (kNewline | kNumber)) && pos + c0.length < text_.size() &&
        (at(pos + c0.length).cls & kLetter)) {
      return run_end(pos + c0.length, kLetter);
    }
    // \p{N}{1,3}
    if (c0.cls & kNumber) return run_end(pos, kNumber, 3);
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    size_t start = pos;
    if (c0.cp == ' ' && pos + 1 < text_.size() && (at(pos + 1).cls & kOther)) start = pos + 1;
    if (at(start).cls & kOther) return run_end(run_end(start, kOther), kNewline);
    // \s*[\r\n]+ : ends after the last newline of the whitespace run, if it has one.
    size_t end = pos;
    size_t after_newline = 0;
    while (end < text_.size()) {
      const Cp c = at(end);
      if (!(c.cls & kWhitespace)) break;
      end += c.length;
      if (c.cls & kNewline) after_newline = end;
    }
    if (after_newline) return after_newline;
    return match_whitespace(pos);
  }

 private:
  std::string_view text_;
};

}  // namespace

std::string_view pretokenizer_name(PretokenizerKind kind) {
  return kind == PretokenizerKind::kGpt2 ? "gpt2" : "llama3";
}

std::string_view pretokenizer_regex(PretokenizerKind kind) {
  return kind == PretokenizerKind::kGpt2 ? kGpt2Regex : kLlama3Regex;
}

void pretokenize(std::string_view text, PretokenizerKind kind, std::vector<std::string_view>& out) {
  const Matcher m(text);
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = kind == PretokenizerKind::kGpt2 ? m.match_gpt2(pos) : m.match_llama3(pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace mt::data
