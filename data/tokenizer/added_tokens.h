// Added tokens (Hugging Face's `added_tokens`: special tokens such as <|endoftext|>, and any other
// token added to a vocabulary): they are found in the raw text before pre-tokenization and map
// directly to their ids. Matching is leftmost-longest, as in `tokenizers`; `lstrip`/`rstrip`
// absorb the whitespace beside a match into it, `single_word` keeps only matches that are not
// inside a word (the characters beside it are not letters, numbers or '_').
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mt::data {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = true;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  // Splits text into ordinary segments (on_text, never empty) and added tokens (on_token(id)),
  // calling them in text order.
  void split(std::string_view text, const std::function<void(std::string_view)>& on_text,
             const std::function<void(int32_t)>& on_token) const;

 private:
  struct Candidate {
    std::string content;
    int32_t id;
    bool single_word, lstrip, rstrip;
  };
  // Match at pos: index into candidates_, or -1.
  int match_at(std::string_view text, size_t pos) const;

  std::vector<Candidate> candidates_;  // sorted by first byte, then longest first
  std::array<std::pair<int, int>, 256> by_first_byte_{};  // [begin, end) into candidates_
};

}  // namespace mt::data
