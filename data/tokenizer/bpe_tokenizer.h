// BpeTokenizer: byte-level BPE encode/decode, compatible with Hugging Face `tokenizers` for GPT-2
// and Llama 3 style tokenizer.json files (see tokenizer_json.h for the settings understood).
//
//   auto tok = mt::data::BpeTokenizer::from_file("../shared/data/gpt2");  // or .../tokenizer.json
//   std::vector<int32_t> ids = tok.encode("Hello world");                  // {15496, 995}
//   std::string text = tok.decode(ids);
//
// encode: added tokens (<|endoftext|>, ...) are matched in the raw text first and map to their
// ids; the rest is pre-tokenized (GPT-2 or Llama 3 regex), each piece's bytes are merged by merge
// rank (lowest first, leftmost on ties) into vocab ids. Any byte string is accepted, valid UTF-8
// or not, and decode(encode(x)) == x without add_prefix_space (decode writes added tokens as their
// content, special or not). Pieces' encodings are cached (thread-safe); encode/decode may be
// called concurrently.
//
// Checked against `tokenizers` on every code point, 5.6M fuzzed strings and real text (ids equal;
// tests/data/tokenizer_test.cpp). Known differences, none met by the GPT-2 or Llama 3 files:
// single_word added tokens take letters, numbers and '_' as word characters (tokenizers' \w also
// takes marks, connector punctuation and ZWJ); added-token ids are the file's (tokenizers
// re-assigns ids that disagree with the vocab); a vocab without some byte's token is an error on
// text holding that byte (tokenizers drops it or writes unk_token); the `decoder` field is not
// read (byte-level decoding always).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/tokenizer_spec.h"

namespace mt::data {

class BpeTokenizer {
 public:
  // Checks the spec (every merge's result must be in the vocab, ids in range, ...); errors name
  // spec.source.
  explicit BpeTokenizer(TokenizerSpec spec);
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  // A tokenizer.json file or the folder holding it (with tokenizer_config.json for BOS/EOS);
  // what it ignores is noted on `notes` (load_tokenizer_json).
  static BpeTokenizer from_file(const std::filesystem::path& path,
                                std::ostream& notes = std::cerr);
  // Writes tokenizer.json and tokenizer_config.json into folder.
  void save(const std::filesystem::path& folder) const;

  // add_bos / add_eos prepend / append the BOS / EOS id (an error when the tokenizer has none).
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false,
                              bool add_eos = false) const;
  // Appends to out; the same as encode without BOS/EOS.
  void encode_to(std::string_view text, std::vector<int32_t>& out) const;
  // Treats added-token text (e.g. "<|endoftext|>") as ordinary text: for untrusted input.
  std::vector<int32_t> encode_ordinary(std::string_view text) const;

  // Concatenates the tokens' bytes; an id outside the vocabulary is an mt::Error naming it.
  std::string decode(std::span<const int32_t> ids) const;
  // For a model's output, whose vocab may be larger than the tokenizer's (padded embedding
  // tables): ids outside the vocabulary are written as "<|id N|>" instead of an error.
  std::string decode_model_output(std::span<const int32_t> ids) const;

  // One past the largest id (model vocab and added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  // Id of an added token's content, or of a vocab token's byte-level spelling ("Ġworld").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Byte-level spelling of a vocab token, or an added token's content.
  std::string id_to_token(int32_t id) const;
  // Raw bytes of a token (what decode writes for it).
  const std::string& token_bytes(int32_t id) const;

  // 16 hex digits identifying vocab, merges, added tokens and pre-tokenizer (not BOS/EOS names):
  // recorded beside tokenized data so a mismatched tokenizer is detected.
  std::string fingerprint() const;
  const TokenizerSpec& spec() const { return spec_; }

 private:
  struct Impl;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t check_id(int32_t id) const;

  TokenizerSpec spec_;
  std::unique_ptr<Impl> impl_;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
};

}  // namespace mt::data
