// mt_train_tokenizer: trains a byte-level BPE tokenizer (data/tokenizer/bpe_trainer.h) on a corpus
// and saves it as tokenizer.json + tokenizer_config.json (loadable by BpeTokenizer::from_file,
// mt_prepare_dataset, the train binary and Hugging Face `tokenizers`).
//
//   mt_train_tokenizer --input FILE_OR_DIR [--input ...] --output DIR [--vocab-size 2048]
//                      [--format text|fortune] [--min-frequency 2] [--documents OUT.jsonl]
//
// Inputs: files, or folders whose regular files are read in name order (hidden files and, with
// --format fortune, the *.dat / *.u8 index and link files of the `fortune` program are skipped).
// --format text: each file is one stream of text. --format fortune: files are fortune cookie
// databases (e.g. /usr/share/games/fortunes/*), documents separated by lines holding only "%";
// each fortune is a document. --documents writes the documents as JSON lines {"text": ...}, the
// input format of mt_prepare_dataset, so the same documents make the token file. The special
// token <|endoftext|> is BOS and EOS.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/bpe_trainer.h"
#include "runtime/core/error.h"
#include "tools/flags.h"

namespace fs = std::filesystem;

using mt::tools::FlagReader;

namespace {

struct Args {
  std::vector<fs::path> inputs;
  fs::path output;
  int32_t vocab_size = 2048;
  int64_t min_frequency = 2;
  std::string format = "text";
  fs::path documents;
};

void usage(std::ostream& os) {
  os << "usage: mt_train_tokenizer --input FILE_OR_DIR [--input ...] --output DIR\n"
        "         [--vocab-size N (2048)] [--format text|fortune] [--min-frequency N (2)]\n"
        "         [--documents OUT.jsonl]\n";
}

Args parse_args(int argc, char** argv) {
  Args a;
  FlagReader flags("mt_train_tokenizer", argc, argv);
  while (flags.next()) {
    const std::string& arg = flags.arg();
    if (arg == "--help" || arg == "-h") {
      usage(std::cout);
      std::exit(0);
    } else if (arg == "--input") {
      a.inputs.emplace_back(flags.value());
    } else if (arg == "--output") {
      a.output = flags.value();
    } else if (arg == "--vocab-size") {
      const int64_t n = flags.int_value();
      MT_CHECK(n >= 257 && n <= (int64_t{1} << 24),
               "mt_train_tokenizer: --vocab-size must be in [257, 16777216], got ", n);
      a.vocab_size = int32_t(n);
    } else if (arg == "--min-frequency") {
      a.min_frequency = flags.int_value();
      MT_CHECK(a.min_frequency >= 1, "mt_train_tokenizer: --min-frequency must be >= 1");
    } else if (arg == "--format") {
      a.format = flags.value();
    } else if (arg == "--documents") {
      a.documents = flags.value();
    } else {
      MT_FAIL("mt_train_tokenizer: unknown argument ", arg, " (see --help)");
    }
  }
  MT_CHECK(!a.inputs.empty(), "mt_train_tokenizer: no --input given (see --help)");
  MT_CHECK(!a.output.empty(), "mt_train_tokenizer: --output DIR is required");
  MT_CHECK(!fs::exists(a.output) || fs::is_directory(a.output), "mt_train_tokenizer: --output ",
           a.output.string(), " is a file; name a folder (tokenizer.json is written into it)");
  MT_CHECK(a.format == "text" || a.format == "fortune",
           "mt_train_tokenizer: --format must be text or fortune, got '", a.format, "'");
  return a;
}

// The files an input stands for, in a stable order.
std::vector<fs::path> expand(const fs::path& input, bool fortune) {
  MT_CHECK(fs::exists(input), "mt_train_tokenizer: input ", input.string(), " does not exist");
  if (!fs::is_directory(input)) return {input};
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(input)) {
    const fs::path& p = entry.path();
    const std::string name = p.filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (fortune && (p.extension() == ".dat" || p.extension() == ".u8")) continue;
    if (entry.is_regular_file()) files.push_back(p);
  }
  std::sort(files.begin(), files.end());
  MT_CHECK(!files.empty(), "mt_train_tokenizer: folder ", input.string(), " holds no file");
  return files;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "mt_train_tokenizer: cannot read ", path.string());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Fortunes of a fortune database: the text between lines holding only "%", trimmed of blank
// leading/trailing lines; empty ones are dropped.
std::vector<std::string> split_fortunes(const std::string& text) {
  std::vector<std::string> docs;
  std::string doc;
  auto flush = [&] {
    const size_t b = doc.find_first_not_of(" \t\r\n");
    if (b != std::string::npos) {
      const size_t e = doc.find_last_not_of(" \t\r\n");
      docs.push_back(doc.substr(b, e - b + 1));
    }
    doc.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == "%") {
      flush();
    } else {
      doc.append(line);
      doc.push_back('\n');
    }
    pos = end + 1;
  }
  flush();
  return docs;
}

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  const bool fortune = args.format == "fortune";
  std::vector<fs::path> files;
  for (const fs::path& in : args.inputs)
    for (fs::path& f : expand(in, fortune)) files.push_back(std::move(f));

  mt::data::BpeTrainerOptions options;
  options.vocab_size = args.vocab_size;
  options.min_frequency = args.min_frequency;
  mt::data::BpeTrainer trainer(options);
  std::ofstream jsonl;
  if (!args.documents.empty()) {
    if (args.documents.has_parent_path()) fs::create_directories(args.documents.parent_path());
    jsonl.open(args.documents, std::ios::binary | std::ios::trunc);
    MT_CHECK(jsonl, "mt_train_tokenizer: cannot write ", args.documents.string());
  }
  int64_t bytes = 0, documents = 0;
  for (const fs::path& f : files) {
    const std::string text = read_file(f);
    bytes += int64_t(text.size());
    std::vector<std::string> docs;
    if (fortune) {
      docs = split_fortunes(text);
    } else {
      docs.push_back(text);
    }
    for (const std::string& d : docs) {
      trainer.add_text(d);
      if (jsonl.is_open()) {
        // Invalid UTF-8 becomes U+FFFD: JSON lines must be valid UTF-8.
        jsonl << nlohmann::json{{"text", d}}.dump(-1, ' ', false,
                                                  nlohmann::json::error_handler_t::replace)
              << '\n';
      }
    }
    documents += int64_t(docs.size());
  }
  std::fprintf(stderr,
               "mt_train_tokenizer: %zu file(s), %.2f MiB, %lld documents, %lld distinct pieces; "
               "training a vocab of %d\n",
               files.size(), double(bytes) / 1048576.0, static_cast<long long>(documents),
               static_cast<long long>(trainer.distinct_words()), args.vocab_size);
  MT_CHECK(trainer.distinct_words() > 0, "mt_train_tokenizer: the input (", files.size(),
           " file(s), ", bytes, " bytes) holds no text to learn merges from; nothing was written");
  const auto t0 = std::chrono::steady_clock::now();
  mt::data::BpeTokenizer tokenizer(trainer.train());
  fs::create_directories(args.output);
  tokenizer.save(args.output);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "mt_train_tokenizer: vocab %d saved to %s/tokenizer.json in %.1f s\n",
               tokenizer.vocab_size(), args.output.string().c_str(), secs);
  if (jsonl.is_open()) {
    jsonl.close();
    MT_CHECK(jsonl, "mt_train_tokenizer: error writing ", args.documents.string());
    std::fprintf(stderr, "mt_train_tokenizer: %lld documents written to %s\n",
                 static_cast<long long>(documents), args.documents.string().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
