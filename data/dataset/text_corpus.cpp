#include "data/dataset/text_corpus.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <utility>

#include "data/tokenizer/utf8.h"
#include "runtime/core/error.h"

namespace mt::data {

namespace fs = std::filesystem;

bool is_blank_line(const std::string& line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

std::optional<std::string> not_text_reason(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot read ", path.string());
  std::string head(size_t(64) << 10, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  size_t invalid = 0, nul = 0;
  for (size_t pos = 0; pos < head.size();) {
    const DecodedCodePoint d = decode_utf8(head, pos);
    // A sequence cut at the end of the sample is not counted.
    if (d.cp == kInvalidCodePoint && pos + 4 < head.size()) ++invalid;
    nul += d.cp == 0;
    pos += size_t(d.length);
  }
  if (nul == 0 && invalid * 20 <= head.size()) return std::nullopt;
  return detail::concat("of its first ", head.size(), " bytes, ", invalid, " are not UTF-8 and ",
                        nul, " are NUL");
}

bool is_json_lines_path(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return ext == ".jsonl" || ext == ".json";
}

std::string source_description(const fs::path& path) {
  const fs::path absolute = fs::absolute(path).lexically_normal();
  const auto mtime = fs::last_write_time(path).time_since_epoch();
  return detail::concat(absolute.string(), " (", fs::file_size(path), " bytes, modified at ",
                        std::chrono::duration_cast<std::chrono::nanoseconds>(mtime).count(),
                        " ns)");
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
