// Tests of the byte-level BPE tokenizer: UTF-8 and byte-level helpers, the hand-written
// pre-tokenizer regexes (expected pieces computed with Hugging Face `tokenizers`), the GPT-2
// tokenizer from ../shared/data (known ids, the whole tinyshakespeare corpus, round trips of any
// byte string), loader errors, and, when python3 with `tokenizers` is available, id-for-id
// agreement with Hugging Face on GPT-2, a trained Llama-3-style tokenizer and their variants.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "data/tokenizer/added_tokens.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/bpe_trainer.h"
#include "data/tokenizer/byte_level.h"
#include "data/tokenizer/pretokenizer.h"
#include "data/tokenizer/tokenizer_json.h"
#include "data/tokenizer/unicode_class.h"
#include "data/tokenizer/utf8.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"
#include "tests/testing/shared_data.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

using mt::testing::shared_data;


std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A fresh folder under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("mt_tokenizer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

using mt::testing::error_of;

const BpeTokenizer& gpt2(const fs::path& file) {
  static const BpeTokenizer tok = BpeTokenizer::from_file(file);
  return tok;
}

// Random valid UTF-8 text mixing ASCII, Latin, combining marks, CJK, Arabic, emoji and, with
// any_scalar, any scalar value. Without it, every letter and number drawn has been in Unicode for
// decades, so comparisons hold against `tokenizers` builds with older Unicode tables too.
std::string random_unicode(std::mt19937& rng, int max_code_points, bool any_scalar = true) {
  std::uniform_int_distribution<int> len_dist(0, max_code_points);
  std::uniform_int_distribution<int> kind_dist(0, 9);
  auto in = [&](char32_t lo, char32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };
  std::string out;
  const int n = len_dist(rng);
  for (int i = 0; i < n; ++i) {
    char32_t cp;
    switch (kind_dist(rng)) {
      case 0:
      case 1:
      case 2:
        cp = in(0x20, 0x7E);
        break;
      case 3:
        cp = " \n\t'\r"[in(0, 4)];
        break;
      case 4:
        cp = in(0xA0, 0x24F);
        break;
      case 5:
        cp = in(0x300, 0x36F);
        break;
      case 6:
        cp = i % 2 ? in(0x4E00, 0x9FA5) : in(0x600, 0x6FF);
        break;
      case 7:
        cp = in(0x1F300, 0x1FAFF);
        break;
      case 8:
        cp = in(0x30, 0x39);
        break;
      default:
        if (!any_scalar) {
          cp = in(0x2000, 0x206F);  // general punctuation and spaces
          break;
        }
        do cp = in(1, 0x10FFFF);
        while (cp >= 0xD800 && cp <= 0xDFFF);
    }
    append_utf8(cp, out);
  }
  return out;
}

// Strings that exercise every branch of the pre-tokenizers and the added-token matcher.
std::vector<std::string> sample_strings() {
  return {
      "Hello world",
      "Hello, world! How's it going? I'm fine; they'll've done it. DON'T 'S 'Re",
      "12345 1234567890 3.14159 ١٢٣٤٥ Ⅻ ½",
      "emoji 😀🎉👍🏽 family 👨‍👩‍👧",
      "中文测试，日本語のテキスト、한국어",
      "العربية مرحبا بالعالم",
      "combining: e\u0301 a\u0308 n\u0303 \u0301\u0301x",
      "<|endoftext|>in the middle<|endoftext|> and<|endoftext|><|endoftext|>",
      "x  \n\n  y\r\n\r\n z \t\t w   ",
      "\u00a0nbsp\u2003em\u3000ideographic\u0085next",
      "'sometimes ſ 'ſa 'ﬆ I'ſ",
      "    indented code() {\n        return 0;\n    }\n",
      "",
      " ",
      "\n",
      "a",
  };
}

// ---------------------------------------------------------------- UTF-8, byte level, classes

TEST(Utf8, DecodesValidAndMarksEachInvalidByte) {
  EXPECT_EQ(decode_utf8("A", 0).cp, U'A');
  EXPECT_EQ(decode_utf8("\xC3\xA9", 0).cp, U'\u00E9');
  EXPECT_EQ(decode_utf8("\xE4\xB8\xAD", 0).length, 3);
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80", 0).cp, U'\U0001F600');
  for (std::string_view bad : {"\x80", "\xC3", "\xC0\xAF", "\xE0\x80\x80", "\xED\xA0\x80",
                               "\xF4\x90\x80\x80", "\xFF", "\xE4\xB8"}) {
    const DecodedCodePoint d = decode_utf8(bad, 0);
    EXPECT_EQ(d.cp, kInvalidCodePoint) << "input of " << bad.size() << " bytes";
    EXPECT_EQ(d.length, 1);
  }
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("h\xC3llo"));
}

TEST(ByteLevel, MatchesGpt2Alphabet) {
  EXPECT_EQ(byte_to_unicode(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), U'\u010A');  // 'Ċ'
  EXPECT_EQ(byte_to_unicode('A'), U'A');
  EXPECT_EQ(byte_to_unicode(0xAD), U'\u0143');  // the last of the 68 remapped bytes
  EXPECT_EQ(byte_level_order()[0], '!');
  EXPECT_EQ(byte_level_order()[93], '~');
  EXPECT_EQ(byte_level_order()[188], 0x00);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level_to_bytes(bytes_to_byte_level(all)), all);
  EXPECT_EQ(bytes_to_byte_level(" world"), "\u0120world");
  EXPECT_FALSE(byte_level_to_bytes("a b").has_value());  // a raw space is not in the alphabet
}

TEST(UnicodeClass, LettersNumbersWhitespace) {
  EXPECT_STREQ(unicode_class_version(), "16.0.0");
  for (char32_t cp : {U'a', U'Z', U'\u00E9', U'\u4E2D', U'\u0627', U'\u017F', U'\u1C89'}) {
    EXPECT_EQ(unicode_class(cp), kLetter) << std::hex << uint32_t(cp);
  }
  for (char32_t cp : {U'0', U'\u0663', U'\u216B', U'\u00BD'}) {
    EXPECT_EQ(unicode_class(cp), kNumber) << std::hex << uint32_t(cp);
  }
  for (char32_t cp : {U' ', U'\t', U'\n', U'\u0085', U'\u00A0', U'\u2003', U'\u3000'}) {
    EXPECT_EQ(unicode_class(cp), kWhitespace) << std::hex << uint32_t(cp);
  }
  for (char32_t cp : {U'\'', U'_', U'\u0301', U'\U0001F600', U'\u200B', U'\u001C'}) {
    EXPECT_EQ(unicode_class(cp), 0) << std::hex << uint32_t(cp);
  }
}

// ---------------------------------------------------------------- pre-tokenizer

struct PretokenizeCase {
  PretokenizerKind kind;
  std::string text;
  std::vector<std::string> pieces;
};

TEST(Pretokenizer, MatchesHuggingFaceSplits) {
  // Expected pieces: tokenizers.pre_tokenizers.Split(Regex(<the regex>), "isolated").
  const std::vector<PretokenizeCase> cases = {
      {PretokenizerKind::kGpt2, "Hello world", {"Hello", " world"}},
      {PretokenizerKind::kGpt2,
       "I'm fine, they'll've 'S 'Re",
       {"I", "'m", " fine", ",", " they", "'ll", "'ve", " '", "S", " '", "Re"}},
      {PretokenizerKind::kGpt2, "12345 abc123", {"12345", " abc", "123"}},
      {PretokenizerKind::kGpt2, "x  \n\n  y", {"x", "  \n\n ", " y"}},
      {PretokenizerKind::kGpt2, "\t\tfoo  ", {"\t", "\t", "foo", "  "}},
      {PretokenizerKind::kGpt2,
       "a\r\n\r\n b!!\n\nc",
       {"a", "\r\n\r\n", " b", "!!", "\n", "\n", "c"}},
      {PretokenizerKind::kGpt2,
       "'sometimes \u017f 'S'\u017fa",
       {"'s", "ometimes", " \u017f", " '", "S", "'", "\u017fa"}},
      {PretokenizerKind::kGpt2,
       "e\u0301t\u00e9 \u4e2d\u6587 \u0627\u0644\u0639",
       {"e", "\u0301", "t\u00e9", " \u4e2d\u6587", " \u0627\u0644\u0639"}},
      {PretokenizerKind::kGpt2, " !? (x) ...\n", {" !?", " (", "x", ")", " ...", "\n"}},
      {PretokenizerKind::kGpt2, "   ", {"   "}},
      {PretokenizerKind::kGpt2,
       "a\u00a0b\u3000 \u2003c",
       {"a", "\u00a0", "b", "\u3000 ", "\u2003", "c"}},
      {PretokenizerKind::kLlama3, "Hello world", {"Hello", " world"}},
      {PretokenizerKind::kLlama3,
       "I'm fine, they'll've 'S 'Re",
       {"I", "'m", " fine", ",", " they", "'ll", "'ve", " '", "S", " '", "Re"}},
      {PretokenizerKind::kLlama3, "12345 abc123", {"123", "45", " abc", "123"}},
      {PretokenizerKind::kLlama3, "x  \n\n  y", {"x", "  \n\n", " ", " y"}},
      {PretokenizerKind::kLlama3, "\t\tfoo  ", {"\t", "\tfoo", "  "}},
      {PretokenizerKind::kLlama3, "a\r\n\r\n b!!\n\nc", {"a", "\r\n\r\n", " b", "!!\n\n", "c"}},
      {PretokenizerKind::kLlama3,
       "'sometimes \u017f 'S'\u017fa",
       {"'s", "ometimes", " \u017f", " '", "S", "'\u017f", "a"}},
      {PretokenizerKind::kLlama3,
       "e\u0301t\u00e9 \u4e2d\u6587 \u0627\u0644\u0639",
       {"e", "\u0301t\u00e9", " \u4e2d\u6587", " \u0627\u0644\u0639"}},
      {PretokenizerKind::kLlama3, " !? (x) ...\n", {" !?", " (", "x", ")", " ...\n"}},
      {PretokenizerKind::kLlama3, "   ", {"   "}},
      {PretokenizerKind::kLlama3, "a\u00a0b\u3000 \u2003c", {"a", "\u00a0b", "\u3000 ", "\u2003c"}},
  };
  for (const PretokenizeCase& c : cases) {
    std::vector<std::string_view> pieces;
    pretokenize(c.text, c.kind, pieces);
    EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()), c.pieces)
        << pretokenizer_name(c.kind) << " on \"" << c.text << "\"";
  }
}

TEST(Pretokenizer, CoversAnyByteString) {
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string text(rng() % 64, '\0');
    for (char& ch : text) ch = static_cast<char>(rng() % 256);
    for (PretokenizerKind kind : {PretokenizerKind::kGpt2, PretokenizerKind::kLlama3}) {
      std::vector<std::string_view> pieces;
      pretokenize(text, kind, pieces);
      std::string joined;
      for (std::string_view p : pieces) {
        EXPECT_FALSE(p.empty());
        joined += p;
      }
      EXPECT_EQ(joined, text);
    }
  }
  // An invalid byte is a code point of its own, neither letter nor number nor space.
  std::vector<std::string_view> pieces;
  pretokenize(
      "ab\xFF"
      "cd \xC3",
      PretokenizerKind::kGpt2, pieces);
  EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()),
            (std::vector<std::string>{"ab", "\xFF", "cd", " \xC3"}));
}

// ---------------------------------------------------------------- added tokens

// The matcher's split of `text`: ordinary segments, and added tokens as "#<id>".
std::vector<std::string> split_parts(const AddedTokenMatcher& m, std::string_view text) {
  std::vector<std::string> parts;
  m.split(
      text, [&](std::string_view s) { parts.emplace_back(s); },
      [&](int32_t id) { parts.push_back("#" + std::to_string(id)); });
  return parts;
}

TEST(AddedTokens, LeftmostLongestWithStripAndSingleWord) {
  const AddedTokenMatcher m({{.id = 1, .content = "<pad>", .lstrip = true},
                             {.id = 2, .content = "<pa"},
                             {.id = 3, .content = "[X]", .rstrip = true},
                             {.id = 4, .content = "qqz", .single_word = true}});
  auto run = [&](std::string_view text) { return split_parts(m, text); };
  // Behaviour checked against Hugging Face `tokenizers` 0.23 on the same tokens.
  EXPECT_EQ(run("a  <pad>  b"), (std::vector<std::string>{"a", "#1", "  b"}));
  EXPECT_EQ(run("<pa<pad>"), (std::vector<std::string>{"#2", "#1"}));
  EXPECT_EQ(run("a [X]  \n b"), (std::vector<std::string>{"a ", "#3", "b"}));
  EXPECT_EQ(run("\u3000<pad>"), (std::vector<std::string>{"#1"}));
  EXPECT_EQ(run("aqqz qqz qqzs 1qqz qqz"),
            (std::vector<std::string>{"aqqz ", "#4", " qqzs 1qqz ", "#4"}));
  EXPECT_EQ(run("no tokens"), (std::vector<std::string>{"no tokens"}));
  EXPECT_EQ(run(""), (std::vector<std::string>{}));
}

// How `tokenizers` orders its matching, from its ids on the same tokens (GPT-2's vocab): tokens
// with normalized = false are matched before normalized ones, even where a normalized one starts
// earlier ('foo bar baz': [21943 "foo", 220 " ", "bar baz"]); an rstrip stops at the next match;
// a single_word match dropped inside a word is not searched again for shorter tokens.
TEST(AddedTokens, TokenizersMatchingOrder) {
  const AddedTokenMatcher m({{.id = 1, .content = "foo bar", .normalized = true},
                             {.id = 2, .content = "bar baz", .normalized = false},
                             {.id = 3, .content = "[R]", .rstrip = true},
                             {.id = 4, .content = " <t>"},
                             {.id = 5, .content = "zqxj", .single_word = true},
                             {.id = 6, .content = "qxj"}});
  auto run = [&](std::string_view text) { return split_parts(m, text); };
  EXPECT_EQ(run("foo bar baz"), (std::vector<std::string>{"foo ", "#2"}));
  EXPECT_EQ(run("foo bar!"), (std::vector<std::string>{"#1", "!"}));
  EXPECT_EQ(run("[R] <t>"), (std::vector<std::string>{"#3", "#4"}));
  EXPECT_EQ(run("[R]  x"), (std::vector<std::string>{"#3", "x"}));
  EXPECT_EQ(run("azqxj"), (std::vector<std::string>{"azqxj"}));
  EXPECT_EQ(run("a zqxj qxj"), (std::vector<std::string>{"a ", "#5", " ", "#6"}));
}

// ---------------------------------------------------------------- GPT-2 from ../shared/data

TEST(Gpt2Tokenizer, KnownIds) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  const BpeTokenizer& tok = gpt2(file);
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.encode("Hello world"), (Ids{15496, 995}));
  // Reference ids from Hugging Face `tokenizers` on the same tokenizer.json.
  EXPECT_EQ(tok.encode("Hello, world! How's it going? I'm fine; they'll've done it."),
            (Ids{15496, 11, 995, 0, 1374, 338, 340, 1016, 30, 314, 1101, 3734, 26, 484, 1183, 1053,
                 1760, 340, 13}));
  EXPECT_EQ(tok.encode("12345 1234567890 3.14159"),
            (Ids{10163, 2231, 17031, 2231, 30924, 3829, 513, 13, 1415, 19707}));
  EXPECT_EQ(tok.encode("combining: e\u0301 a\u0308 n\u0303"),
            (Ids{24011, 3191, 25, 304, 136, 223, 257, 136, 230, 299, 136, 225}));
  EXPECT_EQ(tok.encode("x  \n\n  y"), (Ids{87, 220, 220, 628, 220, 331}));
  EXPECT_EQ(tok.encode("CAPS'RE 'D 'M"), (Ids{33177, 50, 6, 2200, 705, 35, 705, 44}));
  EXPECT_EQ(tok.encode("中文测试，日本語のテキスト、한국어"),
            (Ids{40792, 23877, 229,   38184, 233,   46237, 243,  171,   120,   234,
                 33768, 98,    17312, 105,   45739, 252,   5641, 24336, 25084, 43302,
                 23513, 47991, 250,   166,   113,   255,   168,  244,   112}));
  EXPECT_EQ(tok.token_to_id("\u0120world"), 995);
  EXPECT_EQ(tok.id_to_token(995), "\u0120world");
  EXPECT_EQ(tok.token_bytes(995), " world");
  EXPECT_EQ(tok.fingerprint().size(), 16u);
}

TEST(Gpt2Tokenizer, SpecialTokensBosEos) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  const BpeTokenizer& tok = gpt2(file);
  EXPECT_EQ(tok.bos_id(), 50256);
  EXPECT_EQ(tok.eos_id(), 50256);
  EXPECT_EQ(tok.encode("<|endoftext|>in the middle<|endoftext|>"),
            (Ids{50256, 259, 262, 3504, 50256}));
  EXPECT_EQ(tok.encode("Hello world", /*add_bos=*/true, /*add_eos=*/true),
            (Ids{50256, 15496, 995, 50256}));
  const Ids ordinary = tok.encode_ordinary("<|endoftext|>");
  EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), 50256), 0);
  EXPECT_EQ(tok.decode(ordinary), "<|endoftext|>");
  EXPECT_EQ(tok.decode(Ids{50256, 15496}), "<|endoftext|>Hello");
}

TEST(Gpt2Tokenizer, WholeTinyShakespeare) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::string text = read_file(corpus);
  ASSERT_EQ(text.size(), 1115394u);
  const BpeTokenizer tok = BpeTokenizer::from_file(file);  // a fresh one: a cold cache
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = tok.encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ids.size(), 338025u);
  EXPECT_EQ(tok.decode(ids), text);
  std::cout << "encoded tinyshakespeare (" << text.size() << " bytes) in " << seconds << " s\n";
  EXPECT_LT(seconds, 10.0);  // about 0.2 s in a Release build
}

TEST(Gpt2Tokenizer, ConcurrentEncodesAgree) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::string text = read_file(corpus).substr(0, 200000);
  const Ids expected = gpt2(file).encode(text);
  const BpeTokenizer tok = BpeTokenizer::from_file(file);  // a cold cache, filled concurrently
  std::vector<Ids> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] { results[t] = tok.encode(text); });
  }
  for (std::thread& t : threads) t.join();
  for (const Ids& r : results) EXPECT_EQ(r, expected);
}

TEST(Gpt2Tokenizer, RoundTripsAnyByteString) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  const BpeTokenizer& tok = gpt2(file);
  std::vector<std::string> inputs = sample_strings();
  for (std::string_view bad :
       {"\xFF\xFE", "\xC3", "\xE2\x82", "\xED\xA0\x80", "\xC0\xAF", "\xF4\x90\x80\x80",
        "abc\x80"
        "def 's \xF0\x9F\x98",
        "\x00\x01"}) {
    inputs.emplace_back(bad);
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 500; ++i) {
    std::string s(rng() % 200, '\0');
    for (char& ch : s) ch = static_cast<char>(rng() % 256);
    inputs.push_back(s);
    inputs.push_back(random_unicode(rng, 60));
  }
  for (const std::string& s : inputs) {
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
    EXPECT_EQ(tok.decode(tok.encode_ordinary(s)), s);
  }
}

TEST(Gpt2Tokenizer, DecodeRejectsUnknownIds) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  const BpeTokenizer& tok = gpt2(file);
  EXPECT_THROW(tok.decode(Ids{15496, 50257}), mt::Error);
  EXPECT_NE(error_of([&] { tok.decode(Ids{50257}); }).find("unknown token id 50257"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode(Ids{-3}); }).find("-3"), std::string::npos);
  EXPECT_THROW(tok.id_to_token(123456), mt::Error);
}

TEST(Gpt2Tokenizer, SaveAndReloadIsIdentical) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  const BpeTokenizer& tok = gpt2(file);
  TempDir dir;
  tok.save(dir.path());
  const BpeTokenizer again = BpeTokenizer::from_file(dir.path());
  EXPECT_EQ(again.fingerprint(), tok.fingerprint());
  EXPECT_EQ(again.vocab_size(), tok.vocab_size());
  EXPECT_EQ(again.eos_id(), 50256);
  for (const std::string& s : sample_strings()) EXPECT_EQ(again.encode(s), tok.encode(s));
}

// GPT-2's tokenizer.json has truncation.max_length = 50, which minititan ignores (it encodes whole
// documents): the tokenizer still encodes, and one stderr line says so, once per file. A copy
// (a path new to this process) so that no earlier load has said it already.
TEST(Gpt2Tokenizer, IgnoredTruncationIsNotedOnceAndEncodesWhole) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  TempDir dir;
  fs::copy_file(file, dir.path() / "tokenizer.json");
  fs::copy_file(file.parent_path() / "tokenizer_config.json", dir.path() / "tokenizer_config.json");
  ::testing::internal::CaptureStderr();
  const BpeTokenizer tok = BpeTokenizer::from_file(dir.path() / "tokenizer.json");
  const BpeTokenizer again = BpeTokenizer::from_file(dir.path());  // the same file, via its folder
  const Ids ids = tok.encode("Hello world");
  const std::string long_text(5000, 'a');  // far more than 50 tokens: nothing is cut
  const size_t long_ids = again.encode(long_text + " " + long_text).size();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(ids, (Ids{15496, 995}));
  EXPECT_GT(long_ids, 50u);
  EXPECT_EQ(again.decode(again.encode(long_text)), long_text);
  EXPECT_EQ(err, "tokenizer: " + (dir.path() / "tokenizer.json").string() +
                     ": ignoring \"truncation\" (max_length 50): minititan encodes whole "
                     "documents\n");
}

// ---------------------------------------------------------------- small hand-made tokenizers

// A byte-level tokenizer.json with all 256 bytes, "ab" (256), "abc" (257), and the given merges.
std::string tiny_tokenizer_json(const nlohmann::json& merges, const nlohmann::json& extra = {}) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < 256; ++i) {
    vocab[bytes_to_byte_level(std::string(1, static_cast<char>(byte_level_order()[i])))] = i;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  nlohmann::json j = {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j.dump();
}

TEST(TokenizerJson, MergesAsStringsOrPairs) {
  TempDir dir;
  write_file(dir.path() / "strings.json", tiny_tokenizer_json({"a b", "ab c"}));
  using nlohmann::json;
  write_file(dir.path() / "pairs.json",
             tiny_tokenizer_json(json::array({json::array({"a", "b"}), json::array({"ab", "c"})})));
  const BpeTokenizer s = BpeTokenizer::from_file(dir.path() / "strings.json");
  const BpeTokenizer p = BpeTokenizer::from_file(dir.path() / "pairs.json");
  const Ids expected = {257, 256, 'x' - '!'};
  EXPECT_EQ(s.encode("abcabx"), expected);
  EXPECT_EQ(p.encode("abcabx"), expected);
  EXPECT_FALSE(s.bos_id().has_value());
  EXPECT_THROW(s.encode("a", /*add_bos=*/true), mt::Error);
}

TEST(TokenizerJson, IgnoreMergesTakesWholeWordsFromTheVocab) {
  TempDir dir;
  // Without the merge "ab c", "abc" cannot be reached by merging; ignore_merges finds it.
  const std::string json = tiny_tokenizer_json({"a b"});
  write_file(dir.path() / "plain.json", json);
  auto j = nlohmann::json::parse(json);
  j["model"]["ignore_merges"] = true;
  write_file(dir.path() / "ignore.json", j.dump());
  EXPECT_EQ(BpeTokenizer::from_file(dir.path() / "plain.json").encode("abc"),
            (Ids{256, 'c' - '!'}));
  EXPECT_EQ(BpeTokenizer::from_file(dir.path() / "ignore.json").encode("abc"), (Ids{257}));
}

TEST(TokenizerJson, IgnoredTruncationAndPaddingAreNotedOncePerFile) {
  TempDir dir;
  using nlohmann::json;
  const json padding = {{"strategy", {{"Fixed", 8}}}, {"direction", "Right"}, {"pad_id", 0}};
  write_file(dir.path() / "none.json",
             tiny_tokenizer_json({"a b"}, {{"truncation", nullptr}, {"padding", nullptr}}));
  const json truncation = {{"max_length", 4}, {"strategy", "LongestFirst"}};
  write_file(dir.path() / "both.json",
             tiny_tokenizer_json({"a b"}, {{"truncation", truncation}, {"padding", padding}}));
  ::testing::internal::CaptureStderr();
  BpeTokenizer::from_file(dir.path() / "none.json");
  for (int i = 0; i < 2; ++i) BpeTokenizer::from_file(dir.path() / "both.json");
  const BpeTokenizer both = BpeTokenizer::from_file(dir.path() / "both.json");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "tokenizer: " + (dir.path() / "both.json").string() +
                     ": ignoring \"truncation\" (max_length 4) and \"padding\" (strategy "
                     "{\"Fixed\":8}): minititan encodes whole documents\n");
  EXPECT_EQ(both.encode("ab"), (Ids{256}));                // not padded to 8
  EXPECT_EQ(both.encode(std::string(6, 'a')).size(), 6u);  // not truncated to 4
}

// A FIFO named as the tokenizer used to block forever in the read: only regular files are opened.
TEST(TokenizerJson, AFifoIsRefusedNotReadForever) {
  TempDir dir;
  const fs::path fifo = dir.path() / "tokenizer.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(error_of([&] { BpeTokenizer::from_file(fifo); }).find("not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { BpeTokenizer::from_file(dir.path()); }).find("not a regular file"),
            std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(TokenizerJson, ErrorsNameTheFileAndTheProblem) {
  TempDir dir;
  const fs::path f = dir.path() / "tokenizer.json";
  auto error_for = [&](const std::string& contents) {
    write_file(f, contents);
    return error_of([&] { BpeTokenizer::from_file(f); });
  };
  auto expect_has = [&](const std::string& message, std::vector<std::string> parts) {
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "\"" << message << "\" lacks " << part;
    }
  };
  const std::string missing = error_of([&] { BpeTokenizer::from_file(dir.path() / "nope.json"); });
  expect_has(missing, {"nope.json", "not found"});
  expect_has(error_for("{\"model\": {"), {f.string(), "malformed JSON"});
  expect_has(error_for("[1, 2]"), {f.string(), "JSON object"});
  expect_has(error_for("{}"), {f.string(), "missing model"});
  expect_has(error_for(R"({"model": {"merges": []}})"), {f.string(), "missing model.vocab"});
  expect_has(error_for(R"({"model": {"vocab": {"a": 0}}})"), {f.string(), "missing model.merges"});
  expect_has(error_for(R"({"model": {"vocab": {"a": "x"}, "merges": []},
                           "pre_tokenizer": {"type": "ByteLevel"}})"),
             {f.string(), "model.vocab[\"a\"]", "integer id"});
  expect_has(error_for(tiny_tokenizer_json({"a b", "ab zz"})),
             {f.string(), "model.merges[1]", "\"zz\" is not in model.vocab"});
  expect_has(error_for(tiny_tokenizer_json({"a b", "b c"})),
             {f.string(), "model.merges[1]", "merged token \"bc\" is not in model.vocab"});
  expect_has(error_for(tiny_tokenizer_json({"a b"}, {{"pre_tokenizer", {{"type", "Whitespace"}}}})),
             {f.string(), "unsupported setting pre_tokenizer", "Whitespace"});
  expect_has(
      error_for(tiny_tokenizer_json(
          {"a b"},
          {{"pre_tokenizer",
            {{"type", "Sequence"},
             {"pretokenizers",
              {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}},
               {{"type", "ByteLevel"}, {"use_regex", false}}}}}}})),
      {f.string(), "Split.pattern", "\\\\w+"});
  expect_has(error_for(tiny_tokenizer_json({"a b"}, {{"normalizer", {{"type", "NFC"}}}})),
             {f.string(), "unsupported setting normalizer", "NFC"});
  auto dropout = nlohmann::json::parse(tiny_tokenizer_json({"a b"}));
  dropout["model"]["dropout"] = 0.1;
  expect_has(error_for(dropout.dump()), {f.string(), "model.dropout"});

  // BOS/EOS from tokenizer_config.json must be tokens of the tokenizer.
  write_file(f, tiny_tokenizer_json({"a b"}));
  write_file(dir.path() / "tokenizer_config.json", R"({"bos_token": {"content": "<s>"}})");
  expect_has(error_of([&] { BpeTokenizer::from_file(dir.path()); }),
             {f.string(), "bos_token \"<s>\""});
  write_file(dir.path() / "tokenizer_config.json", "{oops");
  expect_has(error_of([&] { BpeTokenizer::from_file(dir.path()); }),
             {"tokenizer_config.json", "malformed JSON"});
}

// ---------------------------------------------------------------- Hugging Face agreement

// Encodes strings with Hugging Face `tokenizers` through tests/data/compare_tokenizer.py;
// std::nullopt (and a reason) when python3 or the package is missing.
std::optional<std::vector<Ids>> hf_encode(const fs::path& tokenizer_json,
                                          const std::vector<std::string>& strings,
                                          std::string& why_not) {
  const fs::path script = fs::path(__FILE__).parent_path() / "compare_tokenizer.py";
  if (!fs::exists(script)) {
    why_not = script.string() + " not found";
    return std::nullopt;
  }
  if (std::system("python3 -c 'import tokenizers' >/dev/null 2>&1") != 0) {
    why_not = "python3 with the `tokenizers` package is not available (pip install tokenizers)";
    return std::nullopt;
  }
  TempDir dir;
  nlohmann::json input = nlohmann::json::array();
  for (const std::string& s : strings) input.push_back(s);
  write_file(dir.path() / "in.json", input.dump());
  const std::string command = "python3 '" + script.string() + "' '" + tokenizer_json.string() +
                              "' '" + (dir.path() / "in.json").string() + "' > '" +
                              (dir.path() / "out.json").string() + "'";
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    why_not = "compare_tokenizer.py failed";
    return std::nullopt;
  }
  return nlohmann::json::parse(read_file(dir.path() / "out.json")).get<std::vector<Ids>>();
}

// Valid UTF-8 test strings (HF takes only valid text): samples, corpus lines, random text.
std::vector<std::string> comparison_strings(const std::string& corpus) {
  std::vector<std::string> out = sample_strings();
  std::istringstream lines(corpus.substr(0, 20000));
  std::string line, paragraph;
  while (std::getline(lines, line)) {
    out.push_back(line);
    paragraph += line + "\n";
    if (line.empty()) out.push_back(std::move(paragraph)), paragraph.clear();
  }
  std::mt19937 rng(2024);
  for (int i = 0; i < 400; ++i) out.push_back(random_unicode(rng, 40, /*any_scalar=*/false));
  return out;
}

void expect_matches_hf(const BpeTokenizer& tok, const fs::path& tokenizer_json,
                       const std::vector<std::string>& strings) {
  std::string why_not;
  const auto reference = hf_encode(tokenizer_json, strings, why_not);
  if (!reference) GTEST_SKIP() << "not compared with Hugging Face: " << why_not;
  ASSERT_EQ(reference->size(), strings.size());
  int mismatches = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const Ids ours = tok.encode(strings[i]);
    if (ours != (*reference)[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "ids differ from Hugging Face for \"" << strings[i] << "\"";
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << strings.size() << " strings";
}

std::string corpus_or_synthetic() {
  const auto dir = shared_data();
  if (dir && fs::exists(*dir / "tinyshakespeare.txt")) {
    return read_file(*dir / "tinyshakespeare.txt");
  }
  std::string text;
  std::mt19937 rng(3);
  for (int i = 0; i < 3000; ++i) text += random_unicode(rng, 30) + " the cat's 123 hat\n";
  return text;
}

TEST(HuggingFaceAgreement, Gpt2) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  expect_matches_hf(gpt2(file), file, comparison_strings(corpus_or_synthetic()));
}

TEST(HuggingFaceAgreement, Gpt2WithAddPrefixSpace) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  TokenizerSpec spec = gpt2(file).spec();
  spec.add_prefix_space = true;
  TempDir dir;
  save_tokenizer_json(spec, dir.path());
  const BpeTokenizer tok = BpeTokenizer::from_file(dir.path());
  EXPECT_EQ(tok.encode("Hello"), (Ids{18435}));  // " Hello"
  expect_matches_hf(tok, dir.path() / "tokenizer.json", sample_strings());
}

// An added token past the vocab leaves ids no token has: a model's output names them, as it names
// ids past the vocab, instead of writing nothing.
TEST(Gpt2Tokenizer, ModelOutputNamesIdsNoTokenHas) {
  REQUIRE_SHARED_FILE(file, "gpt2/tokenizer.json");
  TokenizerSpec spec = gpt2(file).spec();
  spec.added_tokens.push_back({.id = 50300, .content = "<tail>"});
  const BpeTokenizer tok(spec);
  EXPECT_EQ(tok.decode_model_output(Ids{15496, 50280, 50300, 60000}),
            "Hello<|id 50280|><tail><|id 60000|>");
}

// Tokenizers made by our trainer, one per pre-tokenizer: the Llama 3 one is saved as
// Sequence[Split(Llama 3 regex), ByteLevel], the GPT-2 one as ByteLevel(use_regex), as HF does.
struct TrainedTokenizer {
  TempDir dir;
  std::string corpus;
};

const TrainedTokenizer& trained(PretokenizerKind kind) {
  static std::map<PretokenizerKind, std::unique_ptr<TrainedTokenizer>> cache;
  std::unique_ptr<TrainedTokenizer>& t = cache[kind];
  if (t) return *t;
  t = std::make_unique<TrainedTokenizer>();
  t->corpus = corpus_or_synthetic();
  BpeTrainer trainer({.vocab_size = 2000,
                      .pretokenizer = kind,
                      .special_tokens = {"<|begin_of_text|>", "<|end_of_text|>"},
                      .bos_token = "<|begin_of_text|>",
                      .eos_token = "<|end_of_text|>"});
  trainer.add_text(t->corpus);
  std::mt19937 rng(11);
  for (int i = 0; i < 2000; ++i) trainer.add_text(random_unicode(rng, 20) + " 12345 don't\n");
  BpeTokenizer(trainer.train()).save(t->dir.path());
  return *t;
}

class TrainedTokenizerTest : public ::testing::TestWithParam<PretokenizerKind> {};

TEST_P(TrainedTokenizerTest, LoadsWithBosEosAndRoundTrips) {
  const fs::path file = trained(GetParam()).dir.path() / "tokenizer.json";
  const BpeTokenizer tok = BpeTokenizer::from_file(file);
  EXPECT_EQ(tok.spec().pretokenizer, GetParam());
  EXPECT_EQ(tok.vocab_size(), 2000);
  EXPECT_EQ(tok.bos_id(), 1998);
  EXPECT_EQ(tok.eos_id(), 1999);
  const Ids ids = tok.encode("12345", true, true);
  EXPECT_EQ(ids.front(), 1998);
  EXPECT_EQ(ids.back(), 1999);
  EXPECT_EQ(tok.decode(Ids(ids.begin() + 1, ids.end() - 1)), "12345");
  for (const std::string& s : sample_strings()) EXPECT_EQ(tok.decode(tok.encode(s)), s);
  EXPECT_EQ(tok.encode("<|end_of_text|>"), (Ids{1999}));
}

TEST_P(TrainedTokenizerTest, MatchesHuggingFace) {
  const TrainedTokenizer& t = trained(GetParam());
  const BpeTokenizer tok = BpeTokenizer::from_file(t.dir.path() / "tokenizer.json");
  expect_matches_hf(tok, t.dir.path() / "tokenizer.json", comparison_strings(t.corpus));
}

TEST_P(TrainedTokenizerTest, MatchesHuggingFaceWithIgnoreMerges) {
  const TrainedTokenizer& t = trained(GetParam());
  TokenizerSpec spec = load_tokenizer_json(t.dir.path() / "tokenizer.json");
  spec.ignore_merges = true;
  TempDir dir;
  save_tokenizer_json(spec, dir.path());
  const BpeTokenizer tok = BpeTokenizer::from_file(dir.path());
  EXPECT_TRUE(tok.spec().ignore_merges);
  expect_matches_hf(tok, dir.path() / "tokenizer.json", comparison_strings(t.corpus));
}

INSTANTIATE_TEST_SUITE_P(Kinds, TrainedTokenizerTest,
                         ::testing::Values(PretokenizerKind::kGpt2, PretokenizerKind::kLlama3),
                         [](const auto& info) {
                           return std::string(pretokenizer_name(info.param));
                         });

}  // namespace
}  // namespace mt::data
