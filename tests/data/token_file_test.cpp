// Tests of the HDF5 token file: writer/reader round trip across block and chunk boundaries,
// attributes, range reads, and the errors a user meets (missing file, not HDF5, wrong version,
// missing attributes or dataset, truncated dataset), each naming the file and the problem.
#include "data/dataset/token_file.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/dataset/loader.h"
#include "runtime/io/hdf5.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mt_token_file_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TokenizerIdentity test_tokenizer(int64_t vocab = 1000) {
  return {"/some/where/tokenizer.json", vocab, "0123456789abcdef", "fedcba9876543210"};
}

// Writes `docs` (each followed by EOS) with small blocks and chunks; returns the expected stream.
std::vector<uint32_t> write_docs(const fs::path& path,
                                 const std::vector<std::vector<int32_t>>& docs, int64_t eos,
                                 TokenFileWriterOptions opts) {
  TokenFileWriter w(path, test_tokenizer(), eos, opts);
  std::vector<uint32_t> expected;
  for (const auto& d : docs) {
    w.add_document(d);
    expected.insert(expected.end(), d.begin(), d.end());
    expected.push_back(uint32_t(eos));
  }
  w.finish();
  return expected;
}

using mt::testing::error_of;

TEST_F(TokenFileTest, RoundTripAcrossBlocksAndChunks) {
  std::mt19937 gen(7);
  std::vector<std::vector<int32_t>> docs;
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> d(gen() % 57);  // includes empty documents
    for (auto& t : d) t = int32_t(gen() % 999);
    docs.push_back(d);
  }
  const fs::path path = dir_ / "a.h5";
  const auto expected = write_docs(path, docs, 999, {/*block_tokens=*/13, /*chunk_tokens=*/16});
  EXPECT_FALSE(fs::exists(path.string() + ".partial"));

  TokenFileReader r(path);
  const TokenFileInfo& info = r.info();
  EXPECT_EQ(info.format_version, kTokenFileFormatVersion);
  EXPECT_EQ(info.eos_id, 999);
  EXPECT_EQ(info.num_documents, 40);
  EXPECT_EQ(info.num_tokens, int64_t(expected.size()));
  EXPECT_EQ(r.size(), int64_t(expected.size()));
  EXPECT_EQ(info.tokenizer.path, "/some/where/tokenizer.json");
  EXPECT_EQ(info.tokenizer.vocab_size, 1000);
  EXPECT_EQ(info.tokenizer.hash, "0123456789abcdef");
  EXPECT_EQ(info.tokenizer.fingerprint, "fedcba9876543210");

  EXPECT_EQ(r.read(0, r.size()), expected);
  // Every range crossing chunk (16) and block (13) boundaries.
  for (int64_t s = 0; s < 40; ++s) {
    for (int64_t e = s; e < 60; e += 7) {
      std::vector<uint32_t> want(expected.begin() + s, expected.begin() + e);
      ASSERT_EQ(r.read(s, e), want) << "[" << s << ", " << e << ")";
    }
  }
  EXPECT_EQ(r.read(r.size(), r.size()).size(), 0u);
}

TEST_F(TokenFileTest, AppendPiecesAndUnfinishedDocument) {
  const fs::path path = dir_ / "b.h5";
  TokenFileWriter w(path, test_tokenizer(), 5, {4, 8});
  const std::vector<int32_t> a{1, 2, 3}, b{4, 6, 7, 8, 9, 10};
  w.append(a);
  w.append(b);
  w.end_document();
  w.append(a);  // ended by finish()
  EXPECT_EQ(w.num_tokens(), 13);
  w.finish();
  TokenFileReader r(path);
  EXPECT_EQ(r.info().num_documents, 2);
  EXPECT_EQ(r.read(0, r.size()),
            (std::vector<uint32_t>{1, 2, 3, 4, 6, 7, 8, 9, 10, 5, 1, 2, 3, 5}));
}

TEST_F(TokenFileTest, EmptyFileAndEmptyStrings) {
  const fs::path path = dir_ / "empty.h5";
  TokenFileWriter w(path, {"", 10, "", ""}, 0);
  w.finish();
  TokenFileReader r(path);
  EXPECT_EQ(r.size(), 0);
  EXPECT_EQ(r.info().num_documents, 0);
  EXPECT_EQ(r.info().tokenizer.path, "");
  EXPECT_EQ(r.info().tokenizer.hash, "");
}

TEST_F(TokenFileTest, WriterRejectsBadIdsAndCleansUp) {
  const fs::path path = dir_ / "bad.h5";
  EXPECT_THROW(TokenFileWriter(path, test_tokenizer(100), 100), mt::Error);
  {
    TokenFileWriter w(path, test_tokenizer(100), 0);
    const std::vector<int32_t> bad{1, 2, 100};
    const std::string msg = error_of([&] { w.add_document(bad); });
    EXPECT_NE(msg.find("token id 100"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad.h5"), std::string::npos) << msg;
    EXPECT_TRUE(fs::exists(path.string() + ".partial"));
  }  // destroyed without finish(): nothing is left behind
  EXPECT_FALSE(fs::exists(path.string() + ".partial"));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(TokenFileTest, ReadOutOfRangeNamesFileAndRange) {
  const fs::path path = dir_ / "c.h5";
  write_docs(path, {{1, 2, 3}}, 9, {});
  TokenFileReader r(path);
  const std::string msg = error_of([&] { r.read(2, 5); });
  EXPECT_NE(msg.find("c.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 5)"), std::string::npos) << msg;
  EXPECT_THROW(r.read(-1, 2), mt::Error);
  EXPECT_THROW(r.read(3, 2), mt::Error);
}

TEST_F(TokenFileTest, MissingFileAndNotHdf5) {
  const fs::path missing = dir_ / "nope.h5";
  std::string msg = error_of([&] { TokenFileReader r(missing); });
  EXPECT_NE(msg.find("nope.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;

  const fs::path text = dir_ / "text.h5";
  std::ofstream(text) << "hello, I am not an HDF5 file\n";
  msg = error_of([&] { TokenFileReader r(text); });
  EXPECT_NE(msg.find("text.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HDF5"), std::string::npos) << msg;
}

// Opens a finished file for writing with the raw C API to damage it.
struct RawFile {
  explicit RawFile(const fs::path& p)
      : file(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), "H5Fopen", p.string()) {}
  void set_i64(const char* name, int64_t v) {
    h5::Attribute a(H5Aopen(file.get(), name, H5P_DEFAULT), "H5Aopen", name);
    h5::check(H5Awrite(a.get(), H5T_NATIVE_INT64, &v), "H5Awrite", name);
  }
  h5::File file;
};

TEST_F(TokenFileTest, WrongVersion) {
  const fs::path path = dir_ / "v.h5";
  write_docs(path, {{1, 2}}, 9, {});
  RawFile(path).set_i64("format_version", 99);
  const std::string msg = error_of([&] { TokenFileReader r(path); });
  EXPECT_NE(msg.find("v.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("format_version is 99"), std::string::npos) << msg;
  EXPECT_NE(msg.find("version 1"), std::string::npos) << msg;
}

// An id at or past the file's tokenizer vocab (a damaged or hand-edited file) is named by the
// loader with the file and its place, not left to fail in the model's embedding hours later.
TEST_F(TokenFileTest, LoaderNamesAnIdOutsideTheVocab) {
  const fs::path path = dir_ / "ids.h5";
  std::vector<int32_t> doc(40);
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = int32_t(i % 5);
  doc[17] = 300;
  write_docs(path, {doc}, 9, {});
  RawFile(path).set_i64("tokenizer_vocab_size", 100);  // says every id is below 100
  LoaderOptions o;
  o.seq_len = 40;
  o.local_batch_size = 1;
  o.shuffle = false;
  Loader loader(path, o);
  const std::string msg = error_of([&] { loader.next(); });
  EXPECT_NE(msg.find("ids.h5 holds id 300 at token 17, outside its tokenizer's vocab of 100"),
            std::string::npos)
      << msg;
}

TEST_F(TokenFileTest, MissingAttributes) {
  const fs::path path = dir_ / "m.h5";
  for (const char* attr : {"format", "eos_id", "tokenizer_hash", "num_tokens"}) {
    write_docs(path, {{1, 2}}, 9, {});
    {
      RawFile f(path);
      h5::check(H5Adelete(f.file.get(), attr), "H5Adelete", attr);
    }
    const std::string msg = error_of([&] { TokenFileReader r(path); });
    EXPECT_NE(msg.find("m.h5"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("attribute '") + attr + "' is missing"), std::string::npos)
        << msg;
  }
  // The counts are written last: their absence means an interrupted writer.
  const std::string msg = error_of([&] { TokenFileReader r(path); });
  EXPECT_NE(msg.find("incomplete"), std::string::npos) << msg;
}

TEST_F(TokenFileTest, MissingAndTruncatedDataset) {
  const fs::path path = dir_ / "t.h5";
  write_docs(path, {{1, 2, 3, 4}}, 9, {});
  RawFile(path).set_i64("num_tokens", 7);  // dataset holds 5
  std::string msg = error_of([&] { TokenFileReader r(path); });
  EXPECT_NE(msg.find("t.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("holds 5 tokens but attribute num_tokens says 7"), std::string::npos) << msg;

  {
    RawFile f(path);
    h5::check(H5Ldelete(f.file.get(), "tokens", H5P_DEFAULT), "H5Ldelete", "tokens");
  }
  msg = error_of([&] { TokenFileReader r(path); });
  EXPECT_NE(msg.find("t.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset 'tokens' is missing"), std::string::npos) << msg;
}

// An i32 /tokens (written by other tools) is read; a negative id in it is an error naming the file
// and the offset (HDF5 used to clamp it to 0 in the u32 read, a valid id nobody wrote).
TEST_F(TokenFileTest, NegativeIdsOfASignedFileAreNamed) {
  const fs::path path = dir_ / "i32.h5";
  write_docs(path, {{1, 2, 3, 4}}, 9, {});  // 5 tokens with EOS
  {
    RawFile f(path);
    h5::check(H5Ldelete(f.file.get(), "tokens", H5P_DEFAULT), "H5Ldelete", "tokens");
    const hsize_t n[1] = {5};
    h5::Dataspace space(H5Screate_simple(1, n, nullptr), "H5Screate_simple", "i32");
    h5::Dataset d(H5Dcreate2(f.file.get(), "tokens", H5T_STD_I32LE, space.get(), H5P_DEFAULT,
                             H5P_DEFAULT, H5P_DEFAULT),
                  "H5Dcreate2", "i32");
    const int32_t ids[5] = {1, -1, 3, -7, 9};
    h5::check(H5Dwrite(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, ids), "H5Dwrite",
              "i32");
  }
  const TokenFileReader r(path);
  EXPECT_EQ(r.read(2, 3), std::vector<uint32_t>{3});
  EXPECT_EQ(r.read(4, 5), std::vector<uint32_t>{9});
  const std::string msg = error_of([&] { (void)r.read(0, 5); });
  EXPECT_NE(msg.find("i32.h5: token id -1 at offset 1 is negative"), std::string::npos) << msg;
}

TEST_F(TokenFileTest, TokenizerFileHash) {
  const fs::path a = dir_ / "tok_a.json", b = dir_ / "tok_b.json";
  std::ofstream(a) << "{\"model\": 1}";
  std::ofstream(b) << "{\"model\": 2}";
  const std::string ha = tokenizer_file_hash(a);
  EXPECT_EQ(ha.size(), 16u);
  EXPECT_EQ(ha, tokenizer_file_hash(a));
  EXPECT_NE(ha, tokenizer_file_hash(b));
  const std::string msg = error_of([&] { tokenizer_file_hash(dir_ / "none.json"); });
  EXPECT_NE(msg.find("none.json"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mt::data
