// TokenizerSpec: everything that defines a byte-level BPE tokenizer, as plain data. The loader
// (tokenizer_json.h) fills it from Hugging Face files, the trainer (bpe_trainer.h) produces it,
// BpeTokenizer (bpe_tokenizer.h) is built from it and can save it back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer/added_tokens.h"
#include "data/tokenizer/pretokenizer.h"

namespace mt::data {

struct TokenizerSpec {
  // model.vocab: vocab[id] is the token's raw bytes (not its byte-level spelling); ids 0..N-1.
  std::vector<std::string> vocab;
  // model.merges in rank order (rank 0 is applied first), as pairs of vocab ids.
  std::vector<std::pair<int32_t, int32_t>> merges;
  // added_tokens; their ids may lie inside the vocab (GPT-2's <|endoftext|>) or after it.
  std::vector<AddedToken> added_tokens;
  PretokenizerKind pretokenizer = PretokenizerKind::kGpt2;
  bool add_prefix_space = false;  // ByteLevel's add_prefix_space (GPT-2 style only)
  bool ignore_merges = false;     // model.ignore_merges: a word found in the vocab is one token
  // bos_token / eos_token contents from tokenizer_config.json (when present).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // Where the spec came from, for error messages: a file path, or e.g. "<trained>".
  std::string source = "<memory>";
};

}  // namespace mt::data
