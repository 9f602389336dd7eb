// Tests of the BPE trainer: a hand-checked small case (merge order, tie-breaking, min_frequency),
// option validation, and on tinyshakespeare (a synthetic corpus when ../shared/data is absent):
// exact vocabulary size, speed, determinism, file and text input agreeing, round trips, save and
// reload equality, and compression better than bytes. Agreement of trained tokenizers with
// Hugging Face `tokenizers` is tested in tokenizer_test.cpp.
#include "data/tokenizer/bpe_trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/byte_level.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"
#include "tests/testing/shared_data.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

using mt::testing::shared_data;

// A file for the trainer: tinyshakespeare when present, else a written synthetic corpus.
class Corpus {
 public:
  Corpus() {
    const auto dir = shared_data();
    if (dir && fs::exists(*dir / "tinyshakespeare.txt")) {
      path_ = *dir / "tinyshakespeare.txt";
      std::ifstream in(path_, std::ios::binary);
      std::stringstream s;
      s << in.rdbuf();
      text_ = s.str();
      return;
    }
    std::cout << "tinyshakespeare.txt not found (set MT_SHARED_DATA); using a synthetic corpus\n";
    // Pseudo-words of 1-4 syllables: enough distinct words and pairs for 4096 tokens.
    std::mt19937 rng(5);
    const std::vector<std::string> syllables = {
        "the", "ki",   "ng",  "qu", "een", "sha", "ll", "no", "be", "my", "lo", "rd",
        "ve",  "thee", "wha", "is", "he",  "re",  "to", "an", "ow", "ce", "ma", "st",
        "er",  "in",   "ou",  "gh", "ar",  "pe",  "ri", "ta", "so", "mi", "da", "ul"};
    while (text_.size() < (size_t{1} << 20) + 1000) {
      const int n = 3 + rng() % 10;
      for (int i = 0; i < n; ++i) {
        text_ += i ? " " : "";
        for (int k = 1 + rng() % 4; k > 0; --k) text_ += syllables[rng() % syllables.size()];
      }
      text_ += rng() % 3 ? ".\n" : ", 'tis 1599!\n\n";
    }
    path_ = fs::temp_directory_path() / ("mt_bpe_trainer_corpus_" + std::to_string(::getpid()));
    std::ofstream(path_, std::ios::binary) << text_;
    owned_ = true;
  }
  ~Corpus() {
    std::error_code ec;
    if (owned_) fs::remove(path_, ec);
  }
  const fs::path& path() const { return path_; }
  const std::string& text() const { return text_; }

 private:
  fs::path path_;
  std::string text_;
  bool owned_ = false;
};

const Corpus& corpus() {
  static const Corpus c;
  return c;
}

using mt::testing::error_of;

int32_t byte_id(char c) {
  const auto& order = byte_level_order();
  return static_cast<int32_t>(std::find(order.begin(), order.end(), static_cast<uint8_t>(c)) -
                              order.begin());
}

TEST(BpeTrainer, SmallCaseMergeOrderAndTies) {
  BpeTrainerOptions options;
  options.vocab_size = 300;
  options.min_frequency = 1;
  BpeTrainer trainer(options);
  for (int i = 0; i < 3; ++i) trainer.add_text("aaab");  // one piece each: a letter run
  EXPECT_EQ(trainer.distinct_words(), 1);
  const TokenizerSpec spec = trainer.train();
  // (a,a) occurs 6 times -> "aa"; then (aa,a) and (a,b) both 3: the tie goes to the smaller ids,
  // (a,b) -> "ab"; then (aa,ab) -> "aaab"; then no pair is left and training stops early.
  const int32_t a = byte_id('a'), b = byte_id('b');
  ASSERT_EQ(spec.merges.size(), 3u);
  EXPECT_EQ(spec.merges[0], std::make_pair(a, a));
  EXPECT_EQ(spec.merges[1], std::make_pair(a, b));
  EXPECT_EQ(spec.merges[2], std::make_pair(256, 257));
  ASSERT_EQ(spec.vocab.size(), 259u);
  EXPECT_EQ(spec.vocab[256], "aa");
  EXPECT_EQ(spec.vocab[257], "ab");
  EXPECT_EQ(spec.vocab[258], "aaab");
  ASSERT_EQ(spec.added_tokens.size(), 1u);
  EXPECT_EQ(spec.added_tokens[0].id, 259);
  EXPECT_EQ(spec.added_tokens[0].content, "<|endoftext|>");
  const BpeTokenizer tok(spec);
  EXPECT_EQ(tok.vocab_size(), 260);
  EXPECT_EQ(tok.encode("aaab<|endoftext|>aab"), (Ids{258, 259, 256, b}));
  EXPECT_EQ(tok.bos_id(), 259);

  // min_frequency: after "aa" (6), the best pairs occur 3 times, fewer than 4.
  options.min_frequency = 4;
  BpeTrainer strict(options);
  for (int i = 0; i < 3; ++i) strict.add_text("aaab");
  EXPECT_EQ(strict.train().merges.size(), 1u);
}

TEST(BpeTrainer, SpecialTokensInTheCorpusAreNotLearned) {
  BpeTrainerOptions options;
  options.vocab_size = 400;
  options.min_frequency = 1;
  BpeTrainer trainer(options);
  trainer.add_text("xy<|endoftext|>xy<|endoftext|><|endoftext|>");
  EXPECT_EQ(trainer.distinct_words(), 1);  // only "xy"
  const TokenizerSpec spec = trainer.train();
  ASSERT_EQ(spec.merges.size(), 1u);
  EXPECT_EQ(spec.vocab.back(), "xy");
}

TEST(BpeTrainer, RejectsBadOptions) {
  EXPECT_NE(error_of([] { BpeTrainer({.vocab_size = 256}); }).find("vocab_size 256 is too small"),
            std::string::npos);
  BpeTrainerOptions unknown_bos;
  unknown_bos.bos_token = "<s>";
  EXPECT_NE(error_of([&] { BpeTrainer{unknown_bos}; }).find("\"<s>\" is not one of the special"),
            std::string::npos);
  BpeTrainerOptions twice;
  twice.special_tokens = {"<a>", "<a>"};
  EXPECT_NE(error_of([&] { BpeTrainer{twice}; }).find("listed twice"), std::string::npos);
  EXPECT_NE(error_of([] {
              BpeTrainer({}).add_file("/nonexistent/corpus.txt");
            }).find("/nonexistent/corpus.txt"),
            std::string::npos);
}

// Trains a 4096-token tokenizer on the corpus file once per pre-tokenizer kind.
struct Trained {
  TokenizerSpec spec;
  double seconds;
  int32_t last_progress = -1;
};

const Trained& trained(PretokenizerKind kind) {
  static std::map<PretokenizerKind, Trained> cache;
  auto it = cache.find(kind);
  if (it != cache.end()) return it->second;
  Trained t;
  BpeTrainerOptions options;
  options.vocab_size = 4096;
  options.pretokenizer = kind;
  options.on_progress = [&t](int32_t done, int32_t total) {
    EXPECT_GE(done, t.last_progress);
    EXPECT_EQ(total, 4096 - 256 - 1);
    t.last_progress = done;
  };
  const auto start = std::chrono::steady_clock::now();
  BpeTrainer trainer(options);
  trainer.add_file(corpus().path());
  t.spec = trainer.train();
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "trained " << pretokenizer_name(kind) << " BPE, 4096 tokens, on "
            << corpus().text().size() << " bytes in " << t.seconds << " s\n";
  return cache.emplace(kind, std::move(t)).first->second;
}

class TrainedOnCorpus : public ::testing::TestWithParam<PretokenizerKind> {};

TEST_P(TrainedOnCorpus, ExactVocabSizeFastAndCompresses) {
  const Trained& t = trained(GetParam());
  EXPECT_LT(t.seconds, 20.0);  // about 1 s in a Release build
  EXPECT_EQ(t.last_progress, 4096 - 256 - 1);
  const BpeTokenizer tok(t.spec);
  EXPECT_EQ(tok.vocab_size(), 4096);
  EXPECT_EQ(t.spec.vocab.size(), 4095u);
  EXPECT_GE(t.spec.merges.size(), 4095u - 256u);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 4095);
  const Ids ids = tok.encode(corpus().text());
  EXPECT_EQ(tok.decode(ids), corpus().text());
  const double bytes_per_token = double(corpus().text().size()) / ids.size();
  std::cout << pretokenizer_name(GetParam()) << ": " << bytes_per_token << " bytes per token\n";
  EXPECT_GT(bytes_per_token, 3.0);  // bytes would be 1.0; GPT-2's 50k vocab gives 3.3
}

TEST_P(TrainedOnCorpus, DeterministicAndFileEqualsText) {
  const Trained& t = trained(GetParam());
  BpeTrainerOptions options;
  options.vocab_size = 4096;
  options.pretokenizer = GetParam();
  BpeTrainer trainer(options);
  trainer.add_text(corpus().text());  // the whole text at once, not in file chunks
  const TokenizerSpec again = trainer.train();
  EXPECT_EQ(again.vocab, t.spec.vocab);
  EXPECT_EQ(again.merges, t.spec.merges);
  EXPECT_EQ(BpeTokenizer(again).fingerprint(), BpeTokenizer(t.spec).fingerprint());
}

TEST_P(TrainedOnCorpus, SaveAndReloadEncodeIdentically) {
  const Trained& t = trained(GetParam());
  const BpeTokenizer tok(t.spec);
  const fs::path dir =
      fs::temp_directory_path() / ("mt_bpe_trainer_test_" + std::to_string(::getpid()) + "_" +
                                   std::string(pretokenizer_name(GetParam())));
  tok.save(dir);
  ASSERT_TRUE(fs::exists(dir / "tokenizer.json"));
  ASSERT_TRUE(fs::exists(dir / "tokenizer_config.json"));
  const BpeTokenizer loaded = BpeTokenizer::from_file(dir);
  fs::remove_all(dir);
  EXPECT_EQ(loaded.fingerprint(), tok.fingerprint());
  EXPECT_EQ(loaded.spec().pretokenizer, GetParam());
  EXPECT_EQ(loaded.bos_id(), 4095);
  EXPECT_EQ(loaded.eos_id(), 4095);
  const std::string sample = corpus().text().substr(0, 50000) +
                             "<|endoftext|> 12345 don't \xFF\xFE emoji \xF0\x9F\x98\x80";
  EXPECT_EQ(loaded.encode(sample), tok.encode(sample));
  EXPECT_EQ(loaded.decode(loaded.encode(sample)), sample);
}

INSTANTIATE_TEST_SUITE_P(Kinds, TrainedOnCorpus,
                         ::testing::Values(PretokenizerKind::kGpt2, PretokenizerKind::kLlama3),
                         [](const auto& info) {
                           return std::string(pretokenizer_name(info.param));
                         });

}  // namespace
}  // namespace mt::data
