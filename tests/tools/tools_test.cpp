// The command-line tools end to end, as a user runs them: mt_train_tokenizer (fortune format)
// -> mt_prepare_dataset -> train, on a small synthetic corpus; plus their error exits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "data/dataset/token_file.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "runtime/core/error.h"
#include "tests/testing/run_command.h"

// tests/CMakeLists.txt defines the tools' paths when it builds them all.
#if !defined(MT_TRAIN_BIN) || !defined(MT_TRAIN_TOKENIZER_BIN) || !defined(MT_PREPARE_DATASET_BIN)
#define MT_TOOLS_MISSING 1
#define MT_TRAIN_BIN ""
#define MT_TRAIN_TOKENIZER_BIN ""
#define MT_PREPARE_DATASET_BIN ""
#define MT_SOURCE_DIR ""
#endif

namespace mt {
namespace {

namespace fs = std::filesystem;

using Result = testing::CommandResult;

Result run(const std::string& command) { return testing::run_command(command); }

std::string quote(const fs::path& p) { return mt::detail::concat("'", p.string(), "'"); }

// Command lines are built with concat (GCC 12 warns, wrongly, on long std::string + chains).
template <class... Args>
std::string cat(const Args&... args) {
  return mt::detail::concat(args...);
}

class Tools : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef MT_TOOLS_MISSING
    GTEST_SKIP() << "the command-line tools are not part of this build";
#endif
    dir_ = fs::temp_directory_path() / ("mt_tools_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "corpus");
    // 120 fortunes in the fortune format: documents separated by lines holding only "%".
    std::ofstream out(dir_ / "corpus" / "sayings");
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dreamed", "of", "fish"};
    for (int doc = 0; doc < 120; ++doc) {
      for (int w = 0; w < 12 + doc % 7; ++w) out << words[(doc * 7 + w * 3) % 10] << ' ';
      out << "\n\t\t-- Someone " << doc % 5 << "\n%\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(Tools, TokenizerDatasetAndTrainRunEndToEnd) {
  const fs::path tok = dir_ / "tokenizer", docs = dir_ / "docs.jsonl", h5 = dir_ / "tokens.h5";
  Result r = run(cat(MT_TRAIN_TOKENIZER_BIN, " --input ", quote(dir_ / "corpus"),
                     " --format fortune --vocab-size 300 --output ", quote(tok), " --documents ",
                     quote(docs)));
  ASSERT_EQ(r.status, 0) << r.output;
  const data::BpeTokenizer tokenizer = data::BpeTokenizer::from_file(tok);
  // At most the requested size: a corpus this small runs out of pairs seen twice before 300.
  EXPECT_LE(tokenizer.vocab_size(), 300);
  EXPECT_GT(tokenizer.vocab_size(), 257);
  std::ifstream lines(docs);
  int64_t documents = 0;
  for (std::string line; std::getline(lines, line);) documents += !line.empty();
  EXPECT_EQ(documents, 120);

  r = run(cat(MT_PREPARE_DATASET_BIN, " --tokenizer ", quote(tok), " --output ", quote(h5), " ",
              quote(docs)));
  ASSERT_EQ(r.status, 0) << r.output;
  const data::TokenFileReader reader(h5);
  EXPECT_EQ(reader.info().num_documents, 120);
  EXPECT_GT(reader.info().num_tokens, 120 * 5);

  const fs::path dump = dir_ / "run";
  const std::string train =
      cat(MT_TRAIN_BIN, " --config ",
          quote(fs::path(MT_SOURCE_DIR) / "configs" / "fortunes_debug.toml"),
          " --model.tokenizer_path=", quote(tok), " --training.dataset_path=", quote(h5),
          " --job.dump_folder=", quote(dump),
          " --training.steps=3 --lr_scheduler.warmup_steps=1 --training.seq_len=32"
          " --training.local_batch_size=2 --metrics.log_freq=1 --validation.freq=3"
          " --validation.steps=1");
  // Started without OMP_WAIT_POLICY and OPENBLAS_THREAD_TIMEOUT, train restarts itself with
  // PASSIVE waits and short OpenBLAS spins.
  r = run(cat("env -u OMP_WAIT_POLICY -u OPENBLAS_THREAD_TIMEOUT ", train));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step    3  loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" (OMP_WAIT_POLICY=PASSIVE, OPENBLAS_THREAD_TIMEOUT=16)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dump / "config.toml"));
  EXPECT_TRUE(fs::exists(dump / "loss.svg"));
  std::ifstream metrics(dump / "metrics.jsonl");
  int64_t metric_lines = 0;
  for (std::string line; std::getline(metrics, line);) metric_lines += !line.empty();
  EXPECT_GE(metric_lines, 3);
  // Values the user set are kept; the one not set is still added.
  for (const auto& [env, shown] :
       {std::pair{"-u OPENBLAS_THREAD_TIMEOUT OMP_WAIT_POLICY=ACTIVE",
                  "OMP_WAIT_POLICY=ACTIVE, OPENBLAS_THREAD_TIMEOUT=16"},
        std::pair{"OMP_WAIT_POLICY=ACTIVE OPENBLAS_THREAD_TIMEOUT=28",
                  "OMP_WAIT_POLICY=ACTIVE, OPENBLAS_THREAD_TIMEOUT=28"}}) {
    r = run(cat("env ", env, " ", train, " --training.steps=1"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(cat(" (", shown, ")")), std::string::npos) << r.output;
  }
}

// Empty input used to succeed silently (0 tokens; a vocab of the 256 bytes + 1): both errors.
TEST_F(Tools, EmptyInputIsAnError) {
  std::ofstream(dir_ / "empty.txt").close();
  Result r = run(cat(MT_TRAIN_TOKENIZER_BIN, " --input ", quote(dir_ / "empty.txt"), " --output ",
                     quote(dir_ / "tok")));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("holds no text to learn merges from"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "tok" / "tokenizer.json"));
  r = run(cat(MT_TRAIN_TOKENIZER_BIN, " --input ", quote(dir_ / "corpus"), " --output ",
              quote(dir_ / "tok")));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(cat(MT_PREPARE_DATASET_BIN, " --tokenizer ", quote(dir_ / "tok"), " --output ",
              quote(dir_ / "x.h5"), " ", quote(dir_ / "empty.txt")));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("holds no document to tokenize"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "x.h5"));
}

// mt_prepare_dataset replaces an earlier token file, and nothing else: an output that is also an
// input (it was overwritten with its own tokens) or any other file is refused, left as it was.
TEST_F(Tools, PrepareDatasetOverwritesOnlyAnEarlierTokenFile) {
  Result r = run(cat(MT_TRAIN_TOKENIZER_BIN, " --input ", quote(dir_ / "corpus"), " --output ",
                     quote(dir_ / "tok")));
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path text = dir_ / "corpus.txt";
  std::ofstream(text) << "one document\n\nanother document\n";
  const std::string prepare = cat(MT_PREPARE_DATASET_BIN, " --tokenizer ", quote(dir_ / "tok"));
  r = run(cat(prepare, " --output ", quote(text), " ", quote(text)));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("is also an input; name a new file"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("mt_prepare_dataset: error: mt_prepare_dataset"), std::string::npos)
      << r.output;
  const fs::path other = dir_ / "notes.h5";
  std::ofstream(other) << "not a token file";
  r = run(cat(prepare, " --output ", quote(other), " ", quote(text)));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("exists and is not a token file"), std::string::npos) << r.output;
  for (const fs::path& kept : {text, other}) {
    std::ifstream in(kept);
    const std::string first((std::istreambuf_iterator<char>(in)), {});
    EXPECT_TRUE(first.starts_with(kept == text ? "one document" : "not a token file")) << kept;
  }
  const fs::path tokens = dir_ / "tokens.h5";
  for (int run_no = 0; run_no < 2; ++run_no) {  // prepared again: replaced
    r = run(cat(prepare, " --output ", quote(tokens), " ", quote(text)));
    EXPECT_EQ(r.status, 0) << run_no << ": " << r.output;
  }
  // An input that holds no document leaves the earlier token file as it was.
  std::ofstream(dir_ / "empty.txt").close();
  const auto bytes_of = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string before = bytes_of(tokens);
  r = run(cat(prepare, " --output ", quote(tokens), " ", quote(dir_ / "empty.txt")));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("holds no document to tokenize"), std::string::npos) << r.output;
  EXPECT_EQ(bytes_of(tokens), before);
}

// Inputs that are not text (a token file, anything binary) are refused before anything is
// written; JSON lines are recognised in any case (*.JSONL), and a blank "text" is no document.
TEST_F(Tools, PrepareDatasetRefusesBinaryInputsAndReadsJsonLinesByName) {
  Result r = run(cat(MT_TRAIN_TOKENIZER_BIN, " --input ", quote(dir_ / "corpus"), " --output ",
                     quote(dir_ / "tok")));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string prepare = cat(MT_PREPARE_DATASET_BIN, " --tokenizer ", quote(dir_ / "tok"));
  std::ofstream(dir_ / "a.txt") << "one document\n";
  r = run(cat(prepare, " --output ", quote(dir_ / "a.h5"), " ", quote(dir_ / "a.txt")));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(cat(prepare, " --output ", quote(dir_ / "b.h5"), " ", quote(dir_ / "a.h5")));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("a.h5 does not look like text: of its first"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "b.h5"));
  std::ofstream(dir_ / "docs.JSONL") << "{\"text\": \"one\"}\n{\"text\": \"  \"}\n"
                                        "{\"text\": \"two\"}\n";
  r = run(cat(prepare, " --output ", quote(dir_ / "docs.h5"), " ", quote(dir_ / "docs.JSONL")));
  ASSERT_EQ(r.status, 0) << r.output;
  const data::TokenFileReader docs(dir_ / "docs.h5");
  EXPECT_EQ(docs.info().num_documents, 2);  // the text fields, not the JSON; the blank one left out
  EXPECT_LT(docs.info().num_tokens, 8);
}

TEST_F(Tools, BadInputExitsNonZeroWithAMessage) {
  Result r = run(cat(MT_PREPARE_DATASET_BIN, " --tokenizer ", quote(dir_ / "nope"), " --output ",
                     quote(dir_ / "x.h5"), " ", quote(dir_ / "missing.txt")));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("nope"), std::string::npos) << r.output;
  r = run(cat(MT_TRAIN_TOKENIZER_BIN, " --input ", quote(dir_ / "corpus"),
              " --vocab-size lots --output ", quote(dir_ / "t")));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--vocab-size expects an integer"), std::string::npos) << r.output;
  const std::string train_with =
      cat(MT_TRAIN_BIN, " --config ",
          quote(fs::path(MT_SOURCE_DIR) / "configs" / "fortunes_debug.toml"));
  r = run(cat(train_with, " --model.name=DLRM"));  // not a language model lacking a tokenizer
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("model.name = 'DLRM' (command-line flag --model.name=DLRM) is not a "
                          "model; valid names: llama3, deepseek_v3, dlrm"),
            std::string::npos)
      << r.output;
  r = run(cat(train_with, " --model.tokenizer_path=", quote(dir_ / "no_tokenizer")));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("no_tokenizer does not exist"), std::string::npos) << r.output;
  r = run(cat(MT_TRAIN_TOKENIZER_BIN, " --input ", quote(dir_ / "corpus"),
              " --format fortune --vocab-size 280 --output ", quote(dir_ / "tok")));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(cat(train_with, " --model.tokenizer_path=", quote(dir_ / "tok"),
              " --training.dataset_path=", quote(dir_ / "absent.h5")));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("absent.h5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mt_prepare_dataset"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mt
