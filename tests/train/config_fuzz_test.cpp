// Config fuzzing, small and seeded: 400 mutations (byte flips, deletions, duplications, inserted
// TOML tokens, truncations) of the shipped configs and of the seeds in config_fuzz_corpus/ go
// through the config loader (file and command line). Each must load or be an mt::Error naming
// what is wrong; anything else (another exception, a crash, a hang) fails the test. The mutations
// are the same every run (std::mt19937 with a fixed seed), so a failure reproduces.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "runtime/core/error.h"
#include "tests/testing/scratch_dir.h"
#include "train/config/command_line.h"
#include "train/config/load.h"

#ifndef MT_SOURCE_DIR
#define MT_SOURCE_DIR ""
#endif

namespace mt::train::config {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Pieces of TOML syntax and values that parsers and range checks trip on.
const std::vector<std::string>& tokens() {
  static const std::vector<std::string> t = {
      "[", "]", "{", "}", "=", "\"", "'", "'''", "\"\"\"", "\n", "\\", "#", ",", ".", "[[x]]",
      "1e999", "-1", "0", "nan", "inf", "-inf", "9223372036854775808", "-9223372036854775809",
      "18446744073709552", "true", "1979-05-27T07:32:00Z", "0x7fffffff", "1_000", "\xff\xfe",
      std::string("\0", 1), "extends = \"", "[training]\n", "steps = ", "\u00e9", std::string(300, '['),
      "\"\\u0000\"", "\"\\uD800\""};
  return t;
}

std::string mutate(std::string text, std::mt19937& rng) {
  const int edits = 1 + int(rng() % 3);
  for (int e = 0; e < edits; ++e) {
    const size_t at = text.empty() ? 0 : rng() % (text.size() + 1);
    switch (rng() % 5) {
      case 0:  // flip a bit
        if (!text.empty()) text[at % text.size()] ^= char(1 << (rng() % 8));
        break;
      case 1:  // delete a range
        text.erase(at, rng() % 40);
        break;
      case 2:  // duplicate a range
        text.insert(at, text.substr(at, rng() % 80));
        break;
      case 3:  // insert a token
        text.insert(at, tokens()[rng() % tokens().size()]);
        break;
      default:  // truncate
        text.resize(at);
    }
  }
  return text;
}

// Loads `file`: true when it loaded, false on an mt::Error; any other outcome is a failure.
bool loads(const std::function<void()>& load, const std::string& what) {
  try {
    load();
    return true;
  } catch (const Error& e) {
    EXPECT_FALSE(std::string(e.what()).empty()) << what;
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not an mt::Error but " << typeid(e).name() << ": " << e.what();
    return false;
  }
}

TEST(ConfigFuzz, MutatedConfigsLoadOrAreErrors) {
  if (std::string(MT_SOURCE_DIR).empty()) GTEST_SKIP() << "MT_SOURCE_DIR is not defined";
  testing::ScratchDir scratch;
  std::vector<fs::path> corpus;
  for (const fs::path& dir : {fs::path(MT_SOURCE_DIR) / "configs",
                             fs::path(MT_SOURCE_DIR) / "tests/train/config_fuzz_corpus"}) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".toml") continue;
      corpus.push_back(e.path());
      fs::copy_file(e.path(), scratch / e.path().filename(),
                    fs::copy_options::overwrite_existing);  // `extends` finds its base beside
    }
  }
  std::sort(corpus.begin(), corpus.end());
  ASSERT_GE(corpus.size(), 8u);
  std::mt19937 rng(20261126);
  int loaded = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    const fs::path& seed = corpus[rng() % corpus.size()];
    const std::string text = mutate(read_text(seed), rng);
    const fs::path file = scratch / ("mutant_" + std::to_string(i) + ".toml");
    std::ofstream(file, std::ios::binary) << text;
    const std::string what = "mutant " + std::to_string(i) + " of " + seed.filename().string();
    (loads([&] { load_config(file); }, what) ? loaded : refused)++;
    // The same text as a command-line value of an integer, a string and a list key.
    const std::string value = text.substr(0, 200);
    for (const char* key : {"--training.steps=", "--job.description=",
                            "--checkpoint.exclude_from_loading="}) {
      loads([&] { load_config(parse_command_line({std::string(key) + value})); },
            what + " as " + key);
    }
    if (::testing::Test::HasFailure()) break;
  }
  // Both outcomes occur: the mutations are neither all harmless nor all fatal.
  EXPECT_GT(loaded, 20);
  EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace mt::train::config
