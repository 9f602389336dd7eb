// data/dataset/text_corpus.h: a text file's documents are its paragraphs (split at lines of
// whitespace only, each keeping its own newlines), each byte up to the last document is counted
// once (progress), and the tokenizer identity names the tokenizer.json a folder holds.
#include "data/dataset/text_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/shared_data.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;

std::vector<std::pair<std::string, int64_t>> documents_of(const fs::path& file) {
  std::vector<std::pair<std::string, int64_t>> docs;
  for_each_text_document(
      file, [&](std::string text, int64_t bytes) { docs.emplace_back(std::move(text), bytes); });
  return docs;
}

TEST(TextCorpus, DocumentsAreParagraphsAndEveryByteIsCounted) {
  testing::ScratchDir dir;
  const std::string text = "\n  \nfirst line\nsecond line\n\t\r\nnext\n\n\nlast, no newline";
  std::ofstream(dir / "a.txt", std::ios::binary) << text;
  const auto docs = documents_of(dir / "a.txt");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].first, "first line\nsecond line\n");
  EXPECT_EQ(docs[1].first, "next\n");
  EXPECT_EQ(docs[2].first, "last, no newline");
  int64_t bytes = 0;
  for (const auto& d : docs) bytes += d.second;
  EXPECT_EQ(bytes, int64_t(text.size()) + 1);  // the last line's missing newline counted as one
  EXPECT_TRUE(is_blank_line(" \t\r\f\v"));
  EXPECT_FALSE(is_blank_line(" x "));
  std::ofstream(dir / "blank.txt") << "\n \n\n";
  EXPECT_TRUE(documents_of(dir / "blank.txt").empty());
  EXPECT_THAT(testing::error_of([&] { documents_of(dir / "missing.txt"); }),
              ::testing::HasSubstr("cannot read the text file " + (dir / "missing.txt").string()));
}

TEST(TextCorpus, TokenizerIdentityNamesTheTokenizerJson) {
  REQUIRE_SHARED_FILE(gpt2, "gpt2");
  const BpeTokenizer tok = BpeTokenizer::from_file(gpt2);
  const TokenizerIdentity id = tokenizer_identity(gpt2, tok);
  EXPECT_EQ(fs::path(id.path), fs::absolute(gpt2 / "tokenizer.json"));
  EXPECT_EQ(id.vocab_size, tok.vocab_size());
  EXPECT_EQ(id.hash, tokenizer_file_hash(gpt2 / "tokenizer.json"));
  EXPECT_EQ(id.fingerprint, tok.fingerprint());
  EXPECT_EQ(tokenizer_identity(gpt2 / "tokenizer.json", tok).path, id.path);
}

}  // namespace
}  // namespace mt::data
