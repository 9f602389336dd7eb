// Plain-text corpora as token files read them, shared by mt_prepare_dataset and `train` (a text
// training.dataset_path): documents are paragraphs split at blank lines (lines of whitespace
// only), each keeping its own newlines; and the identity a token file records of its tokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "data/dataset/token_file.h"
#include "data/tokenizer/bpe_tokenizer.h"

namespace mt::data {

// Whether a line holds only whitespace (a document boundary).
bool is_blank_line(const std::string& line);

// Why the file at `path` is not text, or nothing: a file whose first 64 KiB hold NUL bytes or are
// mostly not UTF-8 is binary data (compressed, a token file, an executable), which would be
// tokenized byte by byte and trained on. E.g. "of its first 65536 bytes, 3000 are not UTF-8 and
// 12 are NUL".
std::optional<std::string> not_text_reason(const std::filesystem::path& path);

// Whether a corpus file is JSON lines by its name: *.jsonl or *.json, in any case.
bool is_json_lines_path(const std::filesystem::path& path);

// What a token file made from the file at `path` records of it (its "source" attribute): the
// absolute path, size and modification time, so that a cache made from another file, or from
// this one before it changed, is told apart.
std::string source_description(const std::filesystem::path& path);

// Calls on_document(text, bytes) for each document of the text file at `path`, in order: bytes
// counts the file's bytes read since the previous call (for progress). A file that cannot be
// opened is an error naming it.
void for_each_text_document(
    const std::filesystem::path& path,
    const std::function<void(std::string text, int64_t bytes)>& on_document);

// The tokenizer.json a tokenizer path names (the file itself, or the one in a directory).
std::filesystem::path tokenizer_json_path(const std::filesystem::path& tokenizer_path);

// What a token file made with `tokenizer` (loaded from tokenizer_path) records of it.
TokenizerIdentity tokenizer_identity(const std::filesystem::path& tokenizer_path,
                                     const BpeTokenizer& tokenizer);

}  // namespace mt::data
