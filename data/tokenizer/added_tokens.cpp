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

AddedTokenMatcher::Pass::Pass(const std::vector<const AddedToken*>& tokens) {
  for (const AddedToken* t : tokens) {
    if (!t->content.empty()) tokens_.push_back(*t);
  }
  std::stable_sort(tokens_.begin(), tokens_.end(), [](const AddedToken& a, const AddedToken& b) {
    const auto fa = static_cast<uint8_t>(a.content[0]);
    const auto fb = static_cast<uint8_t>(b.content[0]);
    if (fa != fb) return fa < fb;
    return a.content.size() > b.content.size();
  });
  by_first_byte_.fill({0, 0});
  for (size_t i = 0; i < tokens_.size(); ++i) {
    auto& range = by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])];
    if (range.first == range.second) range.first = static_cast<int>(i);
    range.second = static_cast<int>(i) + 1;
  }
}

int AddedTokenMatcher::Pass::longest_at(std::string_view text, size_t pos) const {
  const auto [begin, end] = by_first_byte_[static_cast<uint8_t>(text[pos])];
  for (int i = begin; i < end; ++i) {
    if (text.compare(pos, tokens_[size_t(i)].content.size(), tokens_[size_t(i)].content) == 0)
      return i;
  }
  return -1;
}

void AddedTokenMatcher::Pass::split(std::string_view text,
                                    const std::function<void(std::string_view)>& on_text,
                                    const std::function<void(int32_t)>& on_token) const {
  struct Found {
    size_t start, stop;
    int token;
  };
  std::vector<Found> found;
  for (size_t pos = 0; pos < text.size() && !tokens_.empty();) {
    const int i = longest_at(text, pos);
    if (i < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[size_t(i)];
    const size_t stop = pos + t.content.size();
    const bool inside_word = (pos > 0 && is_word_char(code_point_before(text, pos))) ||
                             (stop < text.size() && is_word_char(decode_utf8(text, stop).cp));
    if (!t.single_word || !inside_word) found.push_back({pos, stop, i});
    pos = stop;  // a dropped single_word match's text is not searched again
  }
  size_t segment_start = 0;  // start of the pending ordinary text
  for (size_t k = 0; k < found.size(); ++k) {
    const AddedToken& t = tokens_[size_t(found[k].token)];
    size_t start = found[k].start, stop = found[k].stop;
    if (t.lstrip) {
      while (start > segment_start) {
        const char32_t cp = code_point_before(text, start);
        if (cp == kInvalidCodePoint || !is_whitespace(cp)) break;
        std::string utf8;
        append_utf8(cp, utf8);
        start -= utf8.size();
      }
    }
    if (t.rstrip) {
      const size_t limit = k + 1 < found.size() ? found[k + 1].start : text.size();
      while (stop < limit) {
        const DecodedCodePoint d = decode_utf8(text, stop);
        if (d.cp == kInvalidCodePoint || !is_whitespace(d.cp)) break;
        stop += d.length;
      }
    }
    if (start > segment_start) on_text(text.substr(segment_start, start - segment_start));
    on_token(t.id);
    segment_start = stop;
  }
  if (segment_start < text.size()) on_text(text.substr(segment_start));
}

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  std::vector<const AddedToken*> raw, normalized;
  for (const AddedToken& t : tokens) (t.normalized ? normalized : raw).push_back(&t);
  raw_ = Pass(raw);
  normalized_ = Pass(normalized);
}

void AddedTokenMatcher::split(std::string_view text,
                              const std::function<void(std::string_view)>& on_text,
                              const std::function<void(int32_t)>& on_token) const {
  raw_.split(
      text, [&](std::string_view between) { normalized_.split(between, on_text, on_token); },
      on_token);
}

}  // namespace mt::data
