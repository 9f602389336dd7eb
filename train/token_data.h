// The training data a `train` run reads: training.dataset_path is a token file made by
// mt_prepare_dataset (HDF5), or a plain text file, tokenized once into
// <dump_folder>/<name>.tokens.h5 (documents at blank lines, data/dataset/text_corpus.h) and
// reused while the tokenizer and the text are unchanged. JSON lines, binary data, a damaged
// token file or one made with another tokenizer are errors that say how to make the right one.
#pragma once

#include <filesystem>
#include <ostream>

#include "data/tokenizer/bpe_tokenizer.h"

namespace mt::train {

// The token file that `dataset_path` stands for, made from text if needed (logged on `log`).
std::filesystem::path resolve_token_file(const std::filesystem::path& dataset_path,
                                         const data::BpeTokenizer& tokenizer,
                                         const std::filesystem::path& tokenizer_path,
                                         const std::filesystem::path& dump_folder,
                                         std::ostream& log);

}  // namespace mt::train
