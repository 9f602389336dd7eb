// Reading and writing the Hugging Face tokenizer files of a byte-level BPE tokenizer:
// tokenizer.json (the model: vocab, merges, added tokens, pre-tokenizer) and, beside it,
// tokenizer_config.json (bos_token / eos_token, as strings or AddedToken objects).
//
// Supported tokenizer.json settings (anything else is an error naming the setting):
//   normalizer: null;  model: BPE with byte-level vocab, merges as "a b" strings or [a, b] pairs,
//   ignore_merges, no dropout / byte_fallback / subword prefix or suffix;
//   pre_tokenizer: ByteLevel with use_regex (the GPT-2 regex; add_prefix_space allowed), or a
//   Sequence of Split(the GPT-2 or Llama 3 regex, Isolated) and ByteLevel without use_regex.
// decoder and post_processor are not interpreted (decoding is byte-level; BOS/EOS are added on
// request by BpeTokenizer::encode). truncation and padding are ignored: minititan encodes whole
// documents (dataset preparation must not cut them; the loader packs the tokens into windows).
// GPT-2's tokenizer.json, for one, has truncation.max_length = 50. Loading a file whose
// truncation or padding is not null says so once per process and file, on stderr:
//   tokenizer: gpt2/tokenizer.json: ignoring "truncation" (max_length 50): minititan encodes
//   whole documents
#pragma once

#include <filesystem>
#include <iostream>

#include "data/tokenizer/tokenizer_spec.h"

namespace mt::data {

// Loads `path`: a tokenizer.json file, or a folder holding one. tokenizer_config.json is read
// when it lies beside it. Errors (mt::Error) name the file and what is wrong. Settings minititan
// ignores (truncation, padding) are noted on `notes`, once per process and file.
TokenizerSpec load_tokenizer_json(const std::filesystem::path& path,
                                  std::ostream& notes = std::cerr);

// Writes folder/tokenizer.json and folder/tokenizer_config.json (creating folder), in the format
// Hugging Face `tokenizers` loads with Tokenizer.from_file. Merges are written as "a b" strings,
// which every version of `tokenizers` reads (byte-level tokens never hold a space).
void save_tokenizer_json(const TokenizerSpec& spec, const std::filesystem::path& folder);

}  // namespace mt::data
