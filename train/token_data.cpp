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

// Tokenizes a text file (documents at blank lines) into `out`.
void tokenize_text_file(const fs::path& text, const data::BpeTokenizer& tok,
                        const fs::path& tokenizer_path, const fs::path& out,
                        const std::string& source) {
  MT_CHECK(tok.eos_id().has_value(), "train: the tokenizer ", tokenizer_path.string(),
           " defines no EOS token, needed to separate documents of ", text.string(),
           "; use mt_prepare_dataset --eos-id N");
  fs::create_directories(out.parent_path());
  data::TokenFileWriter writer(out, data::tokenizer_identity(tokenizer_path, tok), *tok.eos_id(),
                               {.source = source});
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
  if (const auto why = data::not_text_reason(dataset_path)) {
    MT_FAIL("train: training.dataset_path ", dataset_path.string(), " does not look like text: ",
            *why, "; give a UTF-8 text or JSON-lines file, or a token file made by "
            "mt_prepare_dataset");
  }
  MT_CHECK(!data::is_json_lines_path(dataset_path), "train: training.dataset_path ",
           dataset_path.string(), " is JSON lines, not a token file; ",
           prepare_hint(fs::path(dataset_path).replace_extension(".h5"), tokenizer_path));
  // Plain text: tokenized once into the dump folder, reused while it holds this file's tokens
  // (the same path, size and modification time) made with this tokenizer.
  const fs::path cache = dump_folder / (dataset_path.stem().string() + ".tokens.h5");
  const std::string source = data::source_description(dataset_path);
  if (fs::exists(cache)) {
    try {
      const data::TokenFileReader reader(cache);
      check_token_file_tokenizer(reader.info(), tokenizer, tokenizer_path);
      if (reader.info().source == source) {
        log << "data: reusing " << cache.string() << " (tokens of " << source << ")\n";
        return cache;
      }
    } catch (const Error&) {
      // unreadable or made with another tokenizer: make it again
    }
  }
  log << "data: tokenizing " << dataset_path.string() << " into " << cache.string()
      << " (documents at blank lines; mt_prepare_dataset does this for big corpora)\n"
      << std::flush;
  tokenize_text_file(dataset_path, tokenizer, tokenizer_path, cache, source);
  return cache;
}

}  // namespace mt::train
