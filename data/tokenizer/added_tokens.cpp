#include "data/tokenizer/added_tokens.h"

#include <algorithm>

#include "data/tokenizer/unicode_class.h"
#include "data/tokenizer/utf8.h"

namespace mt::data {
namespace {

bool is_word_char(char32_t cp) {
  return cp == '_' || (cp != kInvalidCodePoint && (is_letter(cp) || is_number(cp)));
}

// The code point that ends just before text[pos] (pos > 0).
char32_t code_point_before(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && pos - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) {
    --start;
  }
  const DecodedCodePoint d = decode_utf8(text, start);
  return start + d.length == pos ? d.cp : kInvalidCodePoint;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    candidates_.push_back({t.content, t.id, t.single_word, t.lstrip, t.rstrip});
  }
  std::stable_sort(candidates_.begin(), candidates_.end(),
                   [](const Candidate& a, const Candidate& b) {
                     const auto fa = static_cast<uint8_t>(a.content[0]);
                     const auto fb = static_cast<uint8_t>(b.content[0]);
                     if (fa != fb) return fa < fb;
                     return a.content.size() > b.content.size();
                   });
  by_first_byte_.fill({0, 0});
  for (size_t i = 0; i < candidates_.size(); ++i) {
    auto& range = by_first_byte_[static_cast<uint8_t>(candidates_[i].content[0])];
    if (range.first == range.second) range.first = static_cast<int>(i);
    range.second = static_cast<int>(i) + 1;
  }
}

int AddedTokenMatcher::match_at(std::string_view text, size_t pos) const {
  const auto [begin, end] = by_first_byte_[static_cast<uint8_t>(text[pos])];
  for (int i = begin; i < end; ++i) {
    const Candidate& c = candidates_[i];
    if (text.compare(pos, c.content.size(), c.content) != 0) continue;
    if (c.single_word) {
      const size_t stop = pos + c.content.size();
      if (pos > 0 && is_word_char(code_point_before(text, pos))) continue;
      if (stop < text.size() && is_word_char(decode_utf8(text, stop).cp)) continue;
    }
    return i;
  }
  return -1;
}

void AddedTokenMatcher::split(std::string_view text,
                              const std::function<void(std::string_view)>& on_text,
                              const std::function<void(int32_t)>& on_token) const {
  if (candidates_.empty()) {
    if (!text.empty()) on_text(text);
    return;
  }
  size_t segment_start = 0;  // start of the pending ordinary text
  for (size_t pos = 0; pos < text.size();) {
    const auto [begin, end] = by_first_byte_[static_cast<uint8_t>(text[pos])];
    const int match = begin == end ? -1 : match_at(text, pos);
    if (match < 0) {
      ++pos;
      continue;
    }
    const Candidate& c = candidates_[match];
    size_t text_end = pos;
    size_t stop = pos + c.content.size();
    if (c.lstrip) {
      while (text_end > segment_start) {
        const char32_t cp = code_point_before(text, text_end);
        if (cp == kInvalidCodePoint || !is_whitespace(cp)) break;
        std::string utf8;
        append_utf8(cp, utf8);
        text_end -= utf8.size();
      }
    }
    if (c.rstrip) {
      while (stop < text.size()) {
        const DecodedCodePoint d = decode_utf8(text, stop);
        if (d.cp == kInvalidCodePoint || !is_whitespace(d.cp)) break;
        stop += d.length;
      }
    }
    if (text_end > segment_start) on_text(text.substr(segment_start, text_end - segment_start));
    on_token(c.id);
    segment_start = pos = stop;
  }
  if (segment_start < text.size()) on_text(text.substr(segment_start));
}

}  // namespace mt::data
