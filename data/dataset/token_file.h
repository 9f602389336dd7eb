// Tokenized datasets on disk: one HDF5 file per dataset (format "minititan-tokens", version 1).
//
// Layout
//   /tokens   1-D dataset of u32 token ids (i32 is read too), chunked (64Ki tokens per chunk by
//             default) and uncompressed, so any [start, end) range is one cheap hyperslab read:
//             the loader reads random windows of a few thousand tokens.
//             Documents follow each other, each one followed by the EOS id.
//   attributes of the root group:
//     format "minititan-tokens", format_version (i64), eos_id (i64),
//     tokenizer_path (string, as given when the file was made), tokenizer_vocab_size (i64),
//     tokenizer_hash (string: 16 hex digits, FNV-1a 64 of the tokenizer.json bytes),
//     tokenizer_fingerprint (string: BpeTokenizer::fingerprint(), may be empty),
//     num_documents, num_tokens (i64; written last, by finish()),
//     source (string, optional: what the tokens were made from, e.g. `train`'s cache of a text
//     file records the file's path, size and modification time).
//
// The writer appends in blocks (memory is bounded by the block size, whatever the corpus size)
// to `<output>.partial` and renames it to `<output>` in finish(), so an interrupted run never
// leaves a file that looks complete. The reader checks everything on open and names the file and
// what is wrong (missing file, not HDF5, wrong format or version, missing attribute or dataset,
// a dataset shorter or longer than num_tokens says).
//
// This library knows nothing about tokenizers: the writer takes token ids, the caller supplies
// the tokenizer's identity (tools/prepare_dataset.cpp does both).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace mt::data {

inline constexpr const char* kTokenFileFormat = "minititan-tokens";
inline constexpr int64_t kTokenFileFormatVersion = 1;

struct TokenizerIdentity {
  std::string path;         // where the tokenizer was loaded from
  int64_t vocab_size = 0;   // every token id is < vocab_size
  std::string hash;         // tokenizer_file_hash() of tokenizer.json
  std::string fingerprint;  // BpeTokenizer::fingerprint(), or empty
};

// 16 hex digits: FNV-1a 64 of the file's bytes. Errors name the file when it cannot be read.
std::string tokenizer_file_hash(const std::filesystem::path& tokenizer_json);

struct TokenFileInfo {
  std::filesystem::path path;
  int64_t format_version = 0;
  TokenizerIdentity tokenizer;
  int64_t eos_id = -1;
  int64_t num_documents = 0;
  int64_t num_tokens = 0;
  std::string source;  // the "source" attribute, or empty
};

struct TokenFileWriterOptions {
  int64_t block_tokens = int64_t{1} << 20;  // tokens buffered in memory before each append
  int64_t chunk_tokens = int64_t{1} << 16;  // HDF5 chunk size (in tokens)
  std::string source;                       // the "source" attribute; empty: none written
};

class TokenFileWriter {
 public:
  // Creates `<path>.partial` (replacing any). eos_id must be in [0, tokenizer.vocab_size).
  TokenFileWriter(std::filesystem::path path, TokenizerIdentity tokenizer, int64_t eos_id,
                  TokenFileWriterOptions options = {});
  // Without finish(), the partial file is deleted: nothing half-written is left behind.
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Appends a document's tokens followed by EOS. Ids must be in [0, vocab_size).
  void add_document(std::span<const int32_t> tokens);
  // Lower level: tokens of the current document, in pieces; end_document() appends EOS.
  void append(std::span<const int32_t> tokens);
  void end_document();

  // Writes what is buffered (an unfinished document is ended first), the counts, and renames the
  // file into place. The writer cannot be used afterwards.
  void finish();

  int64_t num_tokens() const { return num_tokens_; }  // written or buffered, EOS included
  int64_t num_documents() const { return num_documents_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  struct Handles;
  void flush();

  std::filesystem::path path_;
  std::filesystem::path partial_path_;
  TokenizerIdentity tokenizer_;
  int64_t eos_id_;
  TokenFileWriterOptions options_;
  std::unique_ptr<Handles> h_;
  std::vector<uint32_t> buffer_;
  int64_t num_tokens_ = 0;
  int64_t num_flushed_ = 0;
  int64_t num_documents_ = 0;
  bool in_document_ = false;
};

class TokenFileReader {
 public:
  explicit TokenFileReader(const std::filesystem::path& path);
  ~TokenFileReader();
  TokenFileReader(TokenFileReader&&) noexcept;
  TokenFileReader& operator=(TokenFileReader&&) noexcept;

  const TokenFileInfo& info() const { return info_; }
  int64_t size() const { return info_.num_tokens; }

  // Tokens [start, end) into out (end - start values). 0 <= start <= end <= size(), else an
  // mt::Error naming the file and the range; so is a negative id in an i32 file. Safe to call from several threads, and beside
  // checkpoint saves: every HDF5 call holds the process-wide h5::Lock (runtime/io/hdf5.h).
  void read(int64_t start, int64_t end, uint32_t* out) const;
  std::vector<uint32_t> read(int64_t start, int64_t end) const;

 private:
  struct Handles;
  TokenFileInfo info_;
  std::unique_ptr<Handles> h_;
};

}  // namespace mt::data
