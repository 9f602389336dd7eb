// mt_prepare_dataset: tokenizes text into a token file (data/dataset/token_file.h) for training.
//
//   mt_prepare_dataset --tokenizer path/to/tokenizer.json (or its folder) --output data.h5
//                      [--format auto|text|jsonl] [--doc-separator blank-line|file]
//                      [--eos-id N] [--allow-special] [--threads N] INPUT...
//
// Inputs: plain text, or JSON lines with a string field "text" per line (--format auto picks
// jsonl for *.jsonl / *.json files, in any case); binary files (compressed, token files) are
// refused. A blank "text" is no document. Plain text is split into documents at blank lines
// (--doc-separator blank-line, the default) or taken as one document per file (file). Each
// document is followed by EOS (the tokenizer's, or --eos-id). Text is encoded as ordinary text:
// a literal "<|endoftext|>" in the corpus stays text and cannot fake a document boundary
// (--allow-special matches added tokens instead). Documents are encoded in parallel in batches of
// a few MiB and written in input order, so the output does not depend on --threads; memory stays
// bounded except for a whole file in --doc-separator file mode. Progress (bytes processed /
// total) goes to stderr once a second.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset/text_corpus.h"
#include "data/dataset/token_file.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "runtime/core/error.h"
#include "tools/flags.h"

namespace fs = std::filesystem;
using mt::data::BpeTokenizer;

using mt::tools::FlagReader;

namespace {

struct Args {
  fs::path tokenizer;
  fs::path output;
  std::string format = "auto";
  std::string doc_separator = "blank-line";
  std::optional<int64_t> eos_id;
  bool allow_special = false;
  int threads = 0;
  std::vector<fs::path> inputs;
};

void usage(std::ostream& os) {
  os << "usage: mt_prepare_dataset --tokenizer TOKENIZER_JSON_OR_DIR --output OUT.h5\n"
        "         [--format auto|text|jsonl] [--doc-separator blank-line|file]\n"
        "         [--eos-id N] [--allow-special] [--threads N] INPUT...\n";
}

Args parse_args(int argc, char** argv) {
  Args a;
  FlagReader flags("mt_prepare_dataset", argc, argv);
  while (flags.next()) {
    const std::string& arg = flags.arg();
    if (arg == "--help" || arg == "-h") {
      usage(std::cout);
      std::exit(0);
    } else if (arg == "--tokenizer") {
      a.tokenizer = flags.value();
    } else if (arg == "--output") {
      a.output = flags.value();
    } else if (arg == "--format") {
      a.format = flags.value();
    } else if (arg == "--doc-separator") {
      a.doc_separator = flags.value();
    } else if (arg == "--eos-id") {
      a.eos_id = flags.int_value();
    } else if (arg == "--threads") {
      a.threads = int(flags.int_value());
    } else if (arg == "--allow-special") {
      a.allow_special = true;
    } else if (arg.rfind("--", 0) == 0) {
      MT_FAIL("mt_prepare_dataset: unknown option ", arg, " (see --help)");
    } else {
      a.inputs.emplace_back(arg);
    }
  }
  MT_CHECK(!a.tokenizer.empty(), "mt_prepare_dataset: --tokenizer is required");
  MT_CHECK(!a.output.empty(), "mt_prepare_dataset: --output is required");
  MT_CHECK(!a.inputs.empty(), "mt_prepare_dataset: no input file given");
  MT_CHECK(a.format == "auto" || a.format == "text" || a.format == "jsonl",
           "mt_prepare_dataset: --format must be auto, text or jsonl, got '", a.format, "'");
  MT_CHECK(a.doc_separator == "blank-line" || a.doc_separator == "file",
           "mt_prepare_dataset: --doc-separator must be blank-line or file, got '", a.doc_separator,
           "'");
  return a;
}

// Prints "bytes processed / total" at most once a second.
class Progress {
  using Clock = std::chrono::steady_clock;

 public:
  explicit Progress(int64_t total) : total_(total), last_(Clock::now()), start_(last_) {}
  void add(int64_t bytes) {
    done_ = std::min(total_, done_ + bytes);  // the last line's '\n' may be missing
    const auto now = Clock::now();
    if (now - last_ >= std::chrono::seconds(1)) {
      last_ = now;
      print();
    }
  }
  void finish() const {
    print();
    std::fprintf(stderr, "\n");
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  void print() const {
    const double s = seconds();
    std::fprintf(stderr, "\r  %.1f / %.1f MiB (%.0f%%), %.1f MiB/s", done_ / 1048576.0,
                 total_ / 1048576.0, total_ > 0 ? 100.0 * double(done_) / double(total_) : 100.0,
                 s > 0 ? done_ / 1048576.0 / s : 0.0);
    std::fflush(stderr);
  }

  int64_t total_;
  int64_t done_ = 0;
  Clock::time_point last_;
  Clock::time_point start_;
};

// Documents are gathered into batches, encoded in parallel and written in order.
class Encoder {
 public:
  Encoder(const BpeTokenizer& tok, mt::data::TokenFileWriter& writer, bool allow_special,
          Progress& progress)
      : tok_(tok), writer_(writer), allow_special_(allow_special), progress_(progress) {}
  // `bytes` = input bytes this document accounts for (for the progress line).
  void add(std::string doc, int64_t bytes) {
    pending_bytes_ += bytes;
    batch_bytes_ += int64_t(doc.size());
    docs_.push_back(std::move(doc));
    if (batch_bytes_ >= (int64_t{4} << 20) || docs_.size() >= 4096) flush();
  }
  void skip(int64_t bytes) { pending_bytes_ += bytes; }  // input that holds no document
  void flush() {
    std::vector<std::vector<int32_t>> ids(docs_.size());
    std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < int64_t(docs_.size()); ++i) {
      try {
        ids[size_t(i)] =
            allow_special_ ? tok_.encode(docs_[size_t(i)]) : tok_.encode_ordinary(docs_[size_t(i)]);
      } catch (...) {
#pragma omp critical
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    for (const auto& d : ids) writer_.add_document(d);
    docs_.clear();
    batch_bytes_ = 0;
    progress_.add(pending_bytes_);
    pending_bytes_ = 0;
  }

 private:
  const BpeTokenizer& tok_;
  mt::data::TokenFileWriter& writer_;
  bool allow_special_;
  Progress& progress_;
  std::vector<std::string> docs_;
  int64_t batch_bytes_ = 0;
  int64_t pending_bytes_ = 0;
};

void read_text(const fs::path& path, bool whole_file, Encoder& enc) {
  if (!whole_file) {
    mt::data::for_each_text_document(
        path, [&enc](std::string doc, int64_t bytes) { enc.add(std::move(doc), bytes); });
    return;
  }
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "mt_prepare_dataset: cannot read ", path.string());
  std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int64_t n = int64_t(doc.size());
  if (!mt::data::is_blank_line(doc)) enc.add(std::move(doc), n);
}

void read_jsonl(const fs::path& path, Encoder& enc) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "mt_prepare_dataset: cannot read ", path.string());
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const int64_t bytes = int64_t(line.size()) + 1;
    if (mt::data::is_blank_line(line)) {
      enc.skip(bytes);
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      MT_FAIL(path.string(), ":", line_no, ": not valid JSON (", e.what(), ")");
    }
    MT_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), path.string(), ":",
             line_no, ": expected an object with a string field \"text\"");
    std::string text = j["text"].get<std::string>();
    if (mt::data::is_blank_line(text)) {  // no document, as a blank paragraph of plain text
      enc.skip(bytes);
      continue;
    }
    enc.add(std::move(text), bytes);
  }
}

// The output replaces an earlier token file (a dataset prepared again), never an input (it was
// overwritten with its own tokens) nor any other file (a checkpoint, a text).
void check_output_replaces_nothing_else(const Args& args) {
  const std::string out = args.output.string();
  for (const fs::path& input : args.inputs) {
    std::error_code ec;
    MT_CHECK(!fs::equivalent(input, args.output, ec), "--output ", out,
             " is also an input; name a new file (nothing was written)");
  }
  if (!fs::exists(args.output)) return;
  bool token_file = false;
  try {
    mt::data::TokenFileReader earlier(args.output);
    token_file = true;
  } catch (const mt::Error&) {
  }
  MT_CHECK(token_file, "--output ", out, " exists and is not a token file; name a new file or "
           "remove it (nothing was written)");
}

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  if (args.threads > 0) omp_set_num_threads(args.threads);
  const BpeTokenizer tok = BpeTokenizer::from_file(args.tokenizer);
  int64_t eos = -1;
  if (args.eos_id) {
    eos = *args.eos_id;
  } else {
    MT_CHECK(tok.eos_id().has_value(), "mt_prepare_dataset: the tokenizer ",
             args.tokenizer.string(),
             " defines no EOS token (tokenizer_config.json eos_token); pass --eos-id N");
    eos = *tok.eos_id();
  }
  const mt::data::TokenizerIdentity identity = mt::data::tokenizer_identity(args.tokenizer, tok);
  int64_t total = 0;
  for (const auto& p : args.inputs) {
    std::error_code ec;
    const auto n = fs::file_size(p, ec);
    MT_CHECK(!ec, "mt_prepare_dataset: cannot read ", p.string(), ": ", ec.message());
    total += int64_t(n);
  }
  std::fprintf(stderr, "mt_prepare_dataset: %zu file(s), %.1f MiB -> %s (vocab %d, eos %lld)\n",
               args.inputs.size(), total / 1048576.0, args.output.string().c_str(),
               tok.vocab_size(), static_cast<long long>(eos));

  check_output_replaces_nothing_else(args);
  for (const auto& p : args.inputs) {  // before anything is written
    if (const auto why = mt::data::not_text_reason(p)) {
      MT_FAIL("mt_prepare_dataset: the input ", p.string(), " does not look like text: ", *why,
              " (compressed? a token file?); give UTF-8 text or JSON lines (nothing was "
              "written)");
    }
  }
  Progress progress(total);
  mt::data::TokenFileWriter writer(args.output, identity, eos);
  Encoder enc(tok, writer, args.allow_special, progress);
  for (const auto& p : args.inputs) {
    const bool jsonl =
        args.format == "jsonl" || (args.format == "auto" && mt::data::is_json_lines_path(p));
    if (jsonl) {
      read_jsonl(p, enc);
    } else {
      read_text(p, args.doc_separator == "file", enc);
    }
  }
  enc.flush();
  // An empty token file would only fail later, in train: the writer's partial file is dropped
  // and an earlier --output stays as it was.
  MT_CHECK(writer.num_tokens() > 0, "mt_prepare_dataset: the input (", args.inputs.size(),
           " file(s), ", total, " bytes) holds no document to tokenize; nothing was written to ",
           args.output.string());
  writer.finish();
  progress.finish();
  std::fprintf(stderr,
               "mt_prepare_dataset: wrote %lld documents, %lld tokens (%.3f tokens/byte) to %s "
               "in %.1f s\n",
               static_cast<long long>(writer.num_documents()),
               static_cast<long long>(writer.num_tokens()),
               total > 0 ? double(writer.num_tokens()) / double(total) : 0.0,
               args.output.string().c_str(), progress.seconds());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::string message = e.what();
    const std::string self = "mt_prepare_dataset: ";  // most messages name the tool already
    if (message.starts_with(self)) message.erase(0, self.size());
    std::fprintf(stderr, "\nmt_prepare_dataset: error: %s\n", message.c_str());
    return 1;
  }
}
