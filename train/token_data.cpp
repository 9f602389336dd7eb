#include "train/token_data.h"

#include <fstream>
#include <string>

#include "data/dataset/text_corpus.h"
#include "data/dataset/token_file.h"
#include "data/tokenizer/utf8.h"
#include "runtime/core/error.h"

namespace mt::train {

namespace fs = std::filesystem;

namespace {

bool is_hdf5_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  return in.gcount() == 8 && std::string(sig, 8) == std::string("\x89HDF\r\n\x1a\n", 8);
}

std::string prepare_hint(const fs::path& dataset_path, const fs::path& tokenizer_path) {
  return "make a token file with\n  mt_prepare_dataset --tokenizer " + tokenizer_path.string() +
         " --output " + dataset_path.string() +
         " CORPUS.txt|CORPUS.jsonl ...\nand set training.dataset_path to it";
}

// Whether the token file was made with this tokenizer (fingerprint, else file hash).
void check_token_file_tokenizer(const data::TokenFileInfo& info, const data::BpeTokenizer& tok,
                                const fs::path& tokenizer_path) {
  const std::string fp = tok.fingerprint();
  const bool same = !info.tokenizer.fingerprint.empty()
                        ? info.tokenizer.fingerprint == fp
                        : info.tokenizer.hash ==
                              data::tokenizer_file_hash(data::tokenizer_json_path(tokenizer_path));
  // The same file by name may have changed since (or another file may sit at that path).
  std::error_code ec;
  const bool same_path = fs::weakly_canonical(info.tokenizer.path, ec) ==
                         fs::weakly_canonical(data::tokenizer_json_path(tokenizer_path), ec);
  MT_CHECK(same, "train: the token file ", info.path.string(), " was made with the tokenizer ",
           info.tokenizer.path, " (vocab ", info.tokenizer.vocab_size,
           same_path ? ") as it was then: that file has changed since"
                     : std::string("), not with model.tokenizer_path = ") +
                           tokenizer_path.string() + " (vocab " +
                           std::to_string(tok.vocab_size()) + ")",
           "; re-make it with mt_prepare_dataset --tokenizer ", tokenizer_path.string(),
           " or change model.tokenizer_path");
  MT_CHECK(info.tokenizer.vocab_size <= tok.vocab_size(), "train: the token file ",
           info.path.string(), " has token ids up to ", info.tokenizer.vocab_size,
           " but the tokenizer's vocab is ", tok.vocab_size());
}

// Plain-text datasets must look like text: a file whose first 64 KiB are mostly not UTF-8 (or
// hold NUL bytes) is binary data, which would be tokenized byte by byte and trained on.
void check_looks_like_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(65536, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  size_t invalid = 0, nul = 0;
  for (size_t pos = 0; pos < head.size();) {
    const data::DecodedCodePoint d = data::decode_utf8(head, pos);
    // A sequence cut at the end of the sample is not counted.
    if (d.cp == data::kInvalidCodePoint && pos + 4 < head.size()) ++invalid;
    nul += d.cp == 0;
    pos += size_t(d.length);
  }
  MT_CHECK(nul == 0 && invalid * 20 <= head.size(), "train: training.dataset_path ", path.string(),
           " does not look like text: of its first ", head.size(), " bytes, ", invalid,
           " are not UTF-8 and ", nul,
           " are NUL; give a UTF-8 text or JSON-lines file, or a token file made by "
           "mt_prepare_dataset");
}

// Tokenizes a text file (documents at blank lines) into `out`.
void tokenize_text_file(const fs::path& text, const data::BpeTokenizer& tok,
                        const fs::path& tokenizer_path, const fs::path& out) {
  MT_CHECK(tok.eos_id().has_value(), "train: the tokenizer ", tokenizer_path.string(),
           " defines no EOS token, needed to separate documents of ", text.string(),
           "; use mt_prepare_dataset --eos-id N");
  fs::create_directories(out.parent_path());
  data::TokenFileWriter writer(out, data::tokenizer_identity(tokenizer_path, tok), *tok.eos_id());
  data::for_each_text_document(
      text, [&](std::string doc, int64_t) { writer.add_document(tok.encode_ordinary(doc)); });
  writer.finish();
}

}  // namespace

fs::path resolve_token_file(const fs::path& dataset_path, const data::BpeTokenizer& tokenizer,
                            const fs::path& tokenizer_path, const fs::path& dump_folder,
                            std::ostream& log) {
  MT_CHECK(!dataset_path.empty(), "train: training.dataset_path is empty; ",
           prepare_hint("data.h5", tokenizer_path));
  MT_CHECK(fs::exists(dataset_path), "train: training.dataset_path ", dataset_path.string(),
           " does not exist; ", prepare_hint(dataset_path, tokenizer_path));
  MT_CHECK(fs::is_regular_file(dataset_path), "train: training.dataset_path ",
           dataset_path.string(), " is not a file");
  const std::string ext = dataset_path.extension().string();
  if (is_hdf5_file(dataset_path)) {
    const data::TokenFileReader reader(dataset_path);  // checks the format, names what is wrong
    check_token_file_tokenizer(reader.info(), tokenizer, tokenizer_path);
    return dataset_path;
  }
  MT_CHECK(ext != ".h5" && ext != ".hdf5", "train: training.dataset_path ", dataset_path.string(),
           " is named as an HDF5 token file but is not HDF5 (no HDF5 signature): a damaged or "
           "unfinished file? ",
           prepare_hint(dataset_path, tokenizer_path));
  check_looks_like_text(dataset_path);
  MT_CHECK(ext != ".jsonl" && ext != ".json", "train: training.dataset_path ",
           dataset_path.string(), " is JSON lines, not a token file; ",
           prepare_hint(fs::path(dataset_path).replace_extension(".h5"), tokenizer_path));
  // Plain text: tokenized once into the dump folder, reused while up to date.
  const fs::path cache = dump_folder / (dataset_path.stem().string() + ".tokens.h5");
  if (fs::exists(cache) && fs::last_write_time(cache) >= fs::last_write_time(dataset_path)) {
    try {
      const data::TokenFileReader reader(cache);
      check_token_file_tokenizer(reader.info(), tokenizer, tokenizer_path);
      log << "data: reusing " << cache.string() << " (tokens of " << dataset_path.string() << ")\n";
      return cache;
    } catch (const Error&) {
      // stale or made with another tokenizer: make it again
    }
  }
  log << "data: tokenizing " << dataset_path.string() << " into " << cache.string()
      << " (documents at blank lines; mt_prepare_dataset does this for big corpora)\n"
      << std::flush;
  tokenize_text_file(dataset_path, tokenizer, tokenizer_path, cache);
  return cache;
}

}  // namespace mt::train
