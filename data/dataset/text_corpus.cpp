#include "data/dataset/text_corpus.h"

#include <fstream>
#include <utility>

#include "runtime/core/error.h"

namespace mt::data {

namespace fs = std::filesystem;

bool is_blank_line(const std::string& line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

void for_each_text_document(const fs::path& path,
                            const std::function<void(std::string, int64_t)>& on_document) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot read the text file ", path.string());
  std::string line, doc;
  int64_t bytes = 0;
  while (std::getline(in, line)) {
    bytes += int64_t(line.size()) + 1;
    if (is_blank_line(line)) {
      if (!doc.empty()) {
        on_document(std::move(doc), bytes);
        bytes = 0;
      }
      doc.clear();
      continue;
    }
    doc += line;
    if (!in.eof()) doc += '\n';  // the file's own newlines inside a paragraph
  }
  if (!doc.empty()) on_document(std::move(doc), bytes);
}

fs::path tokenizer_json_path(const fs::path& tokenizer_path) {
  return fs::is_directory(tokenizer_path) ? tokenizer_path / "tokenizer.json" : tokenizer_path;
}

TokenizerIdentity tokenizer_identity(const fs::path& tokenizer_path,
                                     const BpeTokenizer& tokenizer) {
  const fs::path json = tokenizer_json_path(tokenizer_path);
  return {fs::absolute(json).string(), tokenizer.vocab_size(), tokenizer_file_hash(json),
          tokenizer.fingerprint()};
}

}  // namespace mt::data
