// Added tokens (Hugging Face's `added_tokens`: special tokens such as <|endoftext|>, and any other
// token added to a vocabulary): they are found in the raw text before pre-tokenization and map
// directly to their ids. As in `tokenizers`: the tokens with normalized = false are matched
// first, then those with normalized = true in the text between; each pass finds leftmost-longest
// matches, drops a single_word match that sits inside a word (the characters beside it are
// letters, numbers or '_'; its text is not searched again), then lets `lstrip`/`rstrip` absorb
// the whitespace beside a match, up to the neighbouring matches.
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
  // One matching pass over the tokens of one kind (normalized or not).
  class Pass {
   public:
    Pass() = default;
    explicit Pass(const std::vector<const AddedToken*>& tokens);
    void split(std::string_view text, const std::function<void(std::string_view)>& on_text,
               const std::function<void(int32_t)>& on_token) const;

   private:
    // The longest token whose content starts at pos: index into tokens_, or -1.
    int longest_at(std::string_view text, size_t pos) const;

    std::vector<AddedToken> tokens_;  // sorted by first byte, then longest first
    std::array<std::pair<int, int>, 256> by_first_byte_{};  // [begin, end) into tokens_
  };

  Pass raw_, normalized_;
};

}  // namespace mt::data
