// BpeTrainer: learns a byte-level BPE tokenizer from text, for users without one.
//
//   mt::data::BpeTrainer trainer({.vocab_size = 4096});
//   trainer.add_file("corpus.txt");
//   mt::data::BpeTokenizer tok(trainer.train());
//   tok.save("out/tokenizer");   // tokenizer.json + tokenizer_config.json, loadable by HF too
//
// The vocabulary is: the 256 single bytes (ids 0..255, in GPT-2's byte order, so they coincide
// with GPT-2's first 256 ids), then one token per merge, then the special tokens; vocab_size counts
// all three. Text is split on special tokens and pre-tokenized (GPT-2 or Llama 3 regex), distinct
// pieces are counted, and the most frequent adjacent pair is merged repeatedly, with pair counts
// updated incrementally (only words holding the merged pair are revisited) and a lazy max-heap.
// Ties are broken by the smaller (left id, right id), so training is deterministic. A merge whose
// bytes equal an existing token reuses its id (as `tokenizers` does), so the vocabulary can need
// more merges than vocab_size - 256 - specials. Training stops early, with a smaller vocabulary,
// when no pair occurs min_frequency times.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/tokenizer_spec.h"

namespace mt::data {

struct BpeTrainerOptions {
  int32_t vocab_size = 4096;  // bytes + merges + special tokens
  PretokenizerKind pretokenizer = PretokenizerKind::kLlama3;
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
  // Written to tokenizer_config.json; each must be one of special_tokens (or unset).
  std::optional<std::string> bos_token = "<|endoftext|>";
  std::optional<std::string> eos_token = "<|endoftext|>";
  int64_t min_frequency = 2;  // pairs seen fewer times (weighted by word count) are not merged
  // Called about every 1% of the merges, with (merges done, merges planned).
  std::function<void(int32_t, int32_t)> on_progress = nullptr;
};

class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainerOptions options);  // validates the options (mt::Error)
  ~BpeTrainer();

  // Counts the pieces of text; may be called any number of times.
  void add_text(std::string_view text);
  // add_text on the file's contents, read in chunks cut where no piece can straddle them.
  void add_file(const std::filesystem::path& path);

  // Number of distinct pieces counted so far.
  int64_t distinct_words() const;

  // Runs the merges and returns the tokenizer definition (source "<BpeTrainer>").
  TokenizerSpec train() const;

 private:
  struct Counts;
  BpeTrainerOptions options_;
  std::unique_ptr<Counts> counts_;
};

}  // namespace mt::data
