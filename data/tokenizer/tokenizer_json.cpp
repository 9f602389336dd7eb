#include "data/tokenizer/tokenizer_json.h"

#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "data/tokenizer/byte_level.h"
#include "data/tokenizer/utf8.h"
#include "runtime/core/error.h"

namespace mt::data {
namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

json read_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  MT_CHECK(in, file.string(), ": cannot open the file for reading");
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::exception& e) {
    MT_FAIL(file.string(), ": malformed JSON: ", e.what());
  }
}

// Reads obj[key] as T when present and not null; `what` names the key in messages.
template <class T>
T get_or(const json& obj, const char* key, T fallback, const std::string& where,
         const std::string& what) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    MT_FAIL(where, ": ", what, ".", key, " has the wrong type (", it->type_name(), ")");
  }
}

const json& require(const json& obj, const char* key, json::value_t type, const std::string& where,
                    const std::string& what) {
  auto it = obj.find(key);
  MT_CHECK(it != obj.end(), where, ": missing ", what, key);
  MT_CHECK(
      it->type() == type || (type == json::value_t::number_integer && it->is_number_unsigned()),
      where, ": ", what, key, " should be ", json(type).type_name(), ", got ", it->type_name());
  return *it;
}

// obj[key], or null when absent (operator[] on a const json must not see a missing key).
json field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? json() : *it;
}

void check_unsupported(bool ok, const std::string& where, const std::string& setting,
                       const json& value) {
  MT_CHECK(
      ok, where, ": unsupported setting ", setting, " = ", value.dump(),
      " (minititan loads byte-level BPE tokenizers only; see data/tokenizer/tokenizer_json.h)");
}

// pre_tokenizer -> kind and add_prefix_space.
void parse_pre_tokenizer(const json& root, const std::string& where, TokenizerSpec& spec) {
  auto it = root.find("pre_tokenizer");
  MT_CHECK(it != root.end() && it->is_object(), where,
           ": missing pre_tokenizer (expected ByteLevel, or Sequence[Split, ByteLevel])");
  std::vector<json> steps;
  const std::string type = get_or<std::string>(*it, "type", "", where, "pre_tokenizer");
  if (type == "Sequence") {
    const json& list = require(*it, "pretokenizers", json::value_t::array, where, "pre_tokenizer.");
    steps.assign(list.begin(), list.end());
  } else {
    steps.push_back(*it);
  }
  auto step_type = [&](const json& step) {
    return step.is_object() ? get_or<std::string>(step, "type", "", where, "pre_tokenizer step")
                            : std::string();
  };
  if (steps.size() == 1 && step_type(steps[0]) == "ByteLevel") {
    check_unsupported(get_or<bool>(steps[0], "use_regex", true, where, "pre_tokenizer"), where,
                      "pre_tokenizer ByteLevel.use_regex (without a Split before it)",
                      field(steps[0], "use_regex"));
    spec.pretokenizer = PretokenizerKind::kGpt2;
    spec.add_prefix_space = get_or<bool>(steps[0], "add_prefix_space", false, where, "ByteLevel");
    return;
  }
  if (steps.size() == 2 && step_type(steps[0]) == "Split" && step_type(steps[1]) == "ByteLevel") {
    const json& split = steps[0];
    const json& byte_level = steps[1];
    const json pattern = field(split, "pattern");
    const std::string regex =
        pattern.is_object() ? get_or<std::string>(pattern, "Regex", "", where, "Split.pattern")
                            : std::string();
    if (regex == kGpt2Regex) {
      spec.pretokenizer = PretokenizerKind::kGpt2;
    } else if (regex == kLlama3Regex) {
      spec.pretokenizer = PretokenizerKind::kLlama3;
    } else {
      check_unsupported(false, where,
                        "pre_tokenizer Split.pattern (only the GPT-2 and Llama 3 regexes are "
                        "implemented)",
                        pattern);
    }
    const std::string behavior = get_or<std::string>(split, "behavior", "", where, "Split");
    check_unsupported(behavior == "Isolated", where, "pre_tokenizer Split.behavior",
                      field(split, "behavior"));
    check_unsupported(!get_or<bool>(split, "invert", false, where, "Split"), where,
                      "pre_tokenizer Split.invert", field(split, "invert"));
    check_unsupported(!get_or<bool>(byte_level, "use_regex", true, where, "ByteLevel"), where,
                      "pre_tokenizer ByteLevel.use_regex after a Split",
                      field(byte_level, "use_regex"));
    check_unsupported(!get_or<bool>(byte_level, "add_prefix_space", false, where, "ByteLevel"),
                      where, "pre_tokenizer ByteLevel.add_prefix_space after a Split",
                      field(byte_level, "add_prefix_space"));
    return;
  }
  check_unsupported(false, where, "pre_tokenizer", *it);
}

void parse_model_options(const json& model, const std::string& where, TokenizerSpec& spec) {
  const std::string type = get_or<std::string>(model, "type", "BPE", where, "model");
  check_unsupported(type == "BPE", where, "model.type", field(model, "type"));
  check_unsupported(get_or<double>(model, "dropout", 0.0, where, "model") == 0.0, where,
                    "model.dropout", field(model, "dropout"));
  check_unsupported(
      get_or<std::string>(model, "continuing_subword_prefix", "", where, "model").empty(), where,
      "model.continuing_subword_prefix", field(model, "continuing_subword_prefix"));
  check_unsupported(get_or<std::string>(model, "end_of_word_suffix", "", where, "model").empty(),
                    where, "model.end_of_word_suffix", field(model, "end_of_word_suffix"));
  check_unsupported(!get_or<bool>(model, "byte_fallback", false, where, "model"), where,
                    "model.byte_fallback", field(model, "byte_fallback"));
  spec.ignore_merges = get_or<bool>(model, "ignore_merges", false, where, "model");
}

std::vector<AddedToken> parse_added_tokens(const json& root, const std::string& where) {
  std::vector<AddedToken> out;
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return out;
  MT_CHECK(it->is_array(), where, ": added_tokens should be an array, got ", it->type_name());
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string what = "added_tokens[" + std::to_string(i) + "].";
    MT_CHECK(t.is_object(), where, ": ", what, " should be an object");
    AddedToken a;
    const json& id = require(t, "id", json::value_t::number_integer, where, what);
    MT_CHECK(id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX, where, ": ", what,
             "id = ", id.dump(), " is out of range");
    a.id = id.get<int32_t>();
    a.content = require(t, "content", json::value_t::string, where, what).get<std::string>();
    MT_CHECK(!a.content.empty(), where, ": ", what, "content is empty");
    a.single_word = get_or<bool>(t, "single_word", false, where, what);
    a.lstrip = get_or<bool>(t, "lstrip", false, where, what);
    a.rstrip = get_or<bool>(t, "rstrip", false, where, what);
    a.normalized = get_or<bool>(t, "normalized", false, where, what);
    a.special = get_or<bool>(t, "special", false, where, what);
    out.push_back(std::move(a));
  }
  return out;
}

// bos_token / eos_token of tokenizer_config.json: a string, an AddedToken object or null.
std::optional<std::string> config_token(const json& config, const char* key,
                                        const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  MT_FAIL(where, ": ", key, " should be a string or an object with a \"content\" string, got ",
          it->dump());
}

// "max_length 50" for truncation, "strategy BatchLongest" for padding; else the JSON.
std::string describe_ignored(const json& value, const char* detail_key) {
  const json detail = value.is_object() ? field(value, detail_key) : json();
  if (detail.is_null()) return value.dump();
  return std::string(detail_key) + " " +
         (detail.is_string() ? detail.get<std::string>() : detail.dump());
}

// The truncation and padding settings, which minititan ignores, as one line on `notes`; once per
// process and file (a process may load one file several times).
void note_ignored_settings(const json& root, const fs::path& file, std::ostream& notes) {
  std::string ignored;
  for (const auto& [key, detail_key] :
       {std::pair{"truncation", "max_length"}, std::pair{"padding", "strategy"}}) {
    const json value = field(root, key);
    if (value.is_null()) continue;
    ignored += ignored.empty() ? "" : " and ";
    ignored += std::string("\"") + key + "\" (" + describe_ignored(value, detail_key) + ")";
  }
  if (ignored.empty()) return;
  static std::mutex mutex;
  static std::set<std::string> noted;  // canonical paths
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(file, ec);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!noted.insert(ec ? file.string() : canonical.string()).second) return;
  }
  notes << ("tokenizer: " + file.string() + ": ignoring " + ignored +
            ": minititan encodes whole documents\n")
        << std::flush;
}

}  // namespace

TokenizerSpec load_tokenizer_json(const fs::path& path, std::ostream& notes) {
  const fs::path file = fs::is_directory(path) ? path / "tokenizer.json" : path;
  const std::string where = file.string();
  MT_CHECK(fs::exists(file), where, ": tokenizer file not found");
  // A FIFO or device would block or stream forever: only a file (or a folder holding one) is read.
  MT_CHECK(fs::is_regular_file(file), where,
           ": not a regular file; give a tokenizer.json or the folder that holds one");
  const json root = read_json(file);
  MT_CHECK(root.is_object(), where, ": expected a JSON object at the top level, got ",
           root.type_name());

  TokenizerSpec spec;
  spec.source = where;
  const json& model = require(root, "model", json::value_t::object, where, "");
  require(model, "vocab", json::value_t::object, where, "model.");
  require(model, "merges", json::value_t::array, where, "model.");
  if (auto it = root.find("normalizer"); it != root.end() && !it->is_null()) {
    const bool empty_sequence = it->value("type", "") == "Sequence" &&
                                it->contains("normalizers") && (*it)["normalizers"].is_array() &&
                                (*it)["normalizers"].empty();
    check_unsupported(empty_sequence, where, "normalizer", *it);
  }
  parse_pre_tokenizer(root, where, spec);
  spec.added_tokens = parse_added_tokens(root, where);
  std::unordered_set<std::string> added_contents;
  for (const AddedToken& t : spec.added_tokens) added_contents.insert(t.content);

  parse_model_options(model, where, spec);
  const json& vocab = require(model, "vocab", json::value_t::object, where, "model.");
  MT_CHECK(!vocab.empty(), where, ": model.vocab is empty");
  std::unordered_map<std::string, int32_t> token_ids;  // byte-level spelling -> id
  token_ids.reserve(vocab.size());
  spec.vocab.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, id_json] : vocab.items()) {
    MT_CHECK(id_json.is_number_integer(), where, ": model.vocab[\"", token,
             "\"] should be an integer id, got ", id_json.dump());
    const int64_t id = id_json.get<int64_t>();
    MT_CHECK(id >= 0 && id < static_cast<int64_t>(vocab.size()), where, ": model.vocab[\"", token,
             "\"] = ", id, " is outside 0..", vocab.size() - 1,
             " (the ids of model.vocab must be 0..N-1)");
    MT_CHECK(!seen[id], where, ": model.vocab id ", id, " is used twice (again by \"", token,
             "\")");
    seen[id] = true;
    std::optional<std::string> bytes = byte_level_to_bytes(token);
    if (!bytes) {
      MT_CHECK(added_contents.count(token), where, ": model.vocab token \"", token, "\" (id ", id,
               ") is not spelled in the byte-level alphabet; is this a byte-level BPE tokenizer?");
      bytes = token;
    }
    spec.vocab[id] = std::move(*bytes);
    token_ids.emplace(token, static_cast<int32_t>(id));
  }

  const json& merges = require(model, "merges", json::value_t::array, where, "model.");
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string parts[2];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      MT_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, where,
               ": model.merges[", i, "] = ", m.dump(),
               " should be two tokens separated by a space");
      parts[0] = s.substr(0, space);
      parts[1] = s.substr(space + 1);
    } else {
      MT_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), where,
               ": model.merges[", i, "] = ", m.dump(),
               " should be a string \"a b\" or a pair [\"a\", \"b\"]");
      parts[0] = m[0].get<std::string>();
      parts[1] = m[1].get<std::string>();
    }
    int32_t ids[2];
    for (int k = 0; k < 2; ++k) {
      auto it = token_ids.find(parts[k]);
      MT_CHECK(it != token_ids.end(), where, ": model.merges[", i, "] = ", m.dump(), ": \"",
               parts[k], "\" is not in model.vocab");
      ids[k] = it->second;
    }
    spec.merges.emplace_back(ids[0], ids[1]);
  }

  const fs::path config_file = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_file)) {
    const json config = read_json(config_file);
    MT_CHECK(config.is_object(), config_file.string(), ": expected a JSON object, got ",
             config.type_name());
    spec.bos_token = config_token(config, "bos_token", config_file.string());
    spec.eos_token = config_token(config, "eos_token", config_file.string());
  }
  note_ignored_settings(root, file, notes);
  return spec;
}

namespace {

void write_text(const std::string& text, const fs::path& file) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MT_CHECK(out, tmp.string(), ": cannot open the file for writing");
    out << text;
    out.close();
    MT_CHECK(out, tmp.string(), ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  MT_CHECK(!ec, file.string(), ": cannot rename ", tmp.string(), ": ", ec.message());
}

// Writes an object's members one per line ("key": compact value), at the given indent; the
// members named in `expanded` are written by the callback instead (the vocab and the merges: one
// entry per line, in id / rank order; ordered_json would insert 50k keys in quadratic time).
void append_object(std::string& out, const ordered_json& obj, const std::string& indent,
                   const std::function<void(const std::string& key)>& expanded) {
  out += "{\n";
  size_t i = 0;
  for (const auto& [key, value] : obj.items()) {
    out += indent + "  " + ordered_json(key).dump() + ": ";
    if (value.is_string() && value.get<std::string>() == "@expanded") {
      expanded(key);
    } else {
      out += value.dump(-1, ' ', false);
    }
    out += ++i < obj.size() ? ",\n" : "\n";
  }
  out += indent + "}";
}

ordered_json byte_level_json(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return ordered_json{{"type", "ByteLevel"},
                      {"add_prefix_space", add_prefix_space},
                      {"trim_offsets", trim_offsets},
                      {"use_regex", use_regex}};
}

ordered_json added_token_json(const AddedToken& t, bool with_id) {
  ordered_json j;
  if (with_id) j["id"] = t.id;
  j["content"] = t.content;
  j["single_word"] = t.single_word;
  j["lstrip"] = t.lstrip;
  j["rstrip"] = t.rstrip;
  j["normalized"] = t.normalized;
  j["special"] = t.special;
  return j;
}

}  // namespace

void save_tokenizer_json(const TokenizerSpec& spec, const fs::path& folder) {
  const std::string where = (folder / "tokenizer.json").string();
  for (const AddedToken& t : spec.added_tokens) {
    MT_CHECK(is_valid_utf8(t.content), where, ": added token id ", t.id,
             " is not valid UTF-8 and cannot be written to JSON");
  }
  MT_CHECK(spec.pretokenizer == PretokenizerKind::kGpt2 || !spec.add_prefix_space, where,
           ": add_prefix_space is only supported with the GPT-2 pre-tokenizer");
  std::unordered_set<std::string> added_contents;
  for (const AddedToken& t : spec.added_tokens) added_contents.insert(t.content);
  std::vector<std::string> spelling(spec.vocab.size());
  for (size_t id = 0; id < spec.vocab.size(); ++id) {
    // A vocab entry that is also an added token (GPT-2's <|endoftext|>) may be spelled as itself.
    spelling[id] = bytes_to_byte_level(spec.vocab[id]);
    if (added_contents.count(spec.vocab[id]) &&
        byte_level_to_bytes(spec.vocab[id]) != spec.vocab[id]) {
      spelling[id] = spec.vocab[id];
    }
  }

  ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = ordered_json::array();
  for (const AddedToken& t : spec.added_tokens) {
    root["added_tokens"].push_back(added_token_json(t, true));
  }
  root["normalizer"] = nullptr;
  if (spec.pretokenizer == PretokenizerKind::kGpt2) {
    root["pre_tokenizer"] = byte_level_json(spec.add_prefix_space, true, true);
  } else {
    ordered_json split = {{"type", "Split"},
                          {"pattern", {{"Regex", pretokenizer_regex(spec.pretokenizer)}}},
                          {"behavior", "Isolated"},
                          {"invert", false}};
    root["pre_tokenizer"] = {{"type", "Sequence"},
                             {"pretokenizers", {split, byte_level_json(false, true, false)}}};
  }
  root["post_processor"] = byte_level_json(true, false, true);
  root["decoder"] = byte_level_json(true, true, true);
  ordered_json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = spec.ignore_merges;
  model["vocab"] = "@expanded";
  model["merges"] = "@expanded";
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const auto [a, b] = spec.merges[i];
    MT_CHECK(a >= 0 && b >= 0 && a < static_cast<int32_t>(spec.vocab.size()) &&
                 b < static_cast<int32_t>(spec.vocab.size()),
             where, ": merge ", i, " refers to an id outside the vocab");
  }
  std::unordered_set<std::string> distinct(spelling.begin(), spelling.end());
  MT_CHECK(distinct.size() == spelling.size(), where, ": two vocab entries have the same bytes");
  root["model"] = "@expanded";

  ordered_json config;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  if (spec.bos_token) config["bos_token"] = *spec.bos_token;
  if (spec.eos_token) config["eos_token"] = *spec.eos_token;
  config["clean_up_tokenization_spaces"] = false;
  config["added_tokens_decoder"] = ordered_json::object();
  for (const AddedToken& t : spec.added_tokens) {
    config["added_tokens_decoder"][std::to_string(t.id)] = added_token_json(t, false);
  }

  std::error_code ec;
  fs::create_directories(folder, ec);
  MT_CHECK(!ec, folder.string(), ": cannot create the folder: ", ec.message());
  std::string text;
  append_object(text, root, "", [&](const std::string&) {
    append_object(text, model, "  ", [&](const std::string& key) {
      const bool is_vocab = key == "vocab";
      const size_t n = is_vocab ? spec.vocab.size() : spec.merges.size();
      text += is_vocab ? "{" : "[";
      for (size_t i = 0; i < n; ++i) {
        text += i ? ",\n      " : "\n      ";
        if (is_vocab) {
          text += ordered_json(spelling[i]).dump() + ": " + std::to_string(i);
        } else {
          const auto [a, b] = spec.merges[i];
          text += ordered_json(spelling[a] + " " + spelling[b]).dump();
        }
      }
      text += n ? "\n    " : "";
      text += is_vocab ? "}" : "]";
    });
  });
  write_text(text + "\n", folder / "tokenizer.json");
  write_text(config.dump(2) + "\n", folder / "tokenizer_config.json");
}

}  // namespace mt::data
