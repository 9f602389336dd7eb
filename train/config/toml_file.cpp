#include "train/config/toml_file.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.h"
#include "train/config/lookup.h"
#include "train/config/schema.h"
#include "train/config/toml_convert.h"

namespace mt::train::config {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kExtends = "extends";

struct Chain {
  std::vector<fs::path> canonical;  // files being applied, outermost first
  std::vector<std::string> shown;   // the same, as written/resolved, for messages
};

std::string at(const std::string& file, const toml::value& v) {
  return file + " line " + std::to_string(v.location().line());
}

// toml11's message without its "[error] " prefix and trailing newline.
std::string toml_message(const std::exception& e) {
  std::string msg = e.what();
  if (msg.rfind("[error] ", 0) == 0) msg.erase(0, 8);
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  return msg;
}

toml::value parse_file(const fs::path& file, const std::string& shown,
                       const std::string& included_from) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    MT_FAIL("config file '", shown, "' ", fs::is_directory(file, ec) ? "is a folder" : "not found",
            included_from);
  }
  std::ifstream in(file, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  MT_CHECK(bool(in) || in.eof(), "cannot read config file '", shown, "'", included_from);
  const std::string problem = toml_text_problem(text);
  MT_CHECK(problem.empty(), "malformed TOML in ", shown, ": ", problem);
  const size_t depth = toml_nesting_depth(text);
  MT_CHECK(depth <= kMaxTomlNesting, "malformed TOML in ", shown, ": arrays or inline tables nested ",
           depth, " deep (at most ", kMaxTomlNesting, ")");
  try {
    std::istringstream stream(text);
    return toml::parse(stream, file.string());
  } catch (const toml::syntax_error& e) {
    MT_FAIL("malformed TOML in ", shown, " line ", e.location().line(), ": ", toml_message(e));
  } catch (const std::exception& e) {
    MT_FAIL("cannot read config file '", shown, "'", included_from, ": ", toml_message(e));
  }
}

// The entries of a TOML table in file order (toml11 keeps tables unordered), so the first
// problem in a file is the one reported.
std::vector<std::pair<std::string, const toml::value*>> in_file_order(const toml::value& table) {
  std::vector<std::pair<std::string, const toml::value*>> out;
  for (const auto& [k, v] : table.as_table()) out.emplace_back(k, &v);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    const auto la = a.second->location(), lb = b.second->location();
    return std::pair(la.line(), la.column()) < std::pair(lb.line(), lb.column());
  });
  return out;
}

void apply_section(JobConfig& config, const SectionSpec& section, const toml::value& table,
                   const std::string& shown) {
  for (const auto& [name, value] : in_file_order(table)) {
    const FieldSpec& field = lookup_field(section, name, at(shown, *value));
    Parsed parsed = from_toml(field.type, *value);
    MT_CHECK(parsed.value, field.key(), ": ", parsed.problem, " at ", at(shown, *value));
    field.set(config, *parsed.value);
    config.origins[field.key()] = Origin{shown, static_cast<int64_t>(value->location().line()), ""};
  }
}

// "a" or "group.a": the dotted name of entry `key` of a table named `group` ("" at the top).
std::string dotted(const std::string& group, const std::string& key) {
  return group.empty() ? key : group + "." + key;
}

// An entry that is not a table where only tables belong: at the top of a file or in a group of
// dotted sections ([quantize] holds [quantize.linear.float8]).
[[noreturn]] void fail_not_a_table(const std::string& group, const std::string& key,
                                   const toml::value& value, const std::string& where) {
  const std::string name = dotted(group, key);
  if (find_section(name)) {
    MT_FAIL(name, ": expected a table (a [", name, "] section), got ", describe(value), " at ",
            where);
  }
  if (is_section_group(name)) {
    MT_FAIL(name, ": expected a table (holding the sections ", sections_in_group_text(name),
            "), got ", describe(value), " at ", where);
  }
  if (group.empty()) fail_top_level_key(name, where);
  fail_group_key(group, key, where);
}

// A table named by its dotted path ("training", "quantize.linear.float8"): a section's keys, or
// a group of dotted sections' tables. A table that is neither is followed down while it holds
// only tables, so that the error names the header the file wrote ([quantise.linear.float8]:
// "did you mean [quantize.linear.float8]?").
void apply_table(JobConfig& config, const std::string& name, const toml::value& table,
                 const std::string& shown) {
  if (const SectionSpec* section = find_section(name)) {
    apply_section(config, *section, table, shown);
    return;
  }
  const auto entries = in_file_order(table);
  const bool only_tables =
      !entries.empty() && std::all_of(entries.begin(), entries.end(),
                                      [](const auto& e) { return e.second->is_table(); });
  if (!is_section_group(name) && !only_tables) lookup_section(name, at(shown, table));  // fails
  for (const auto& [key, value] : entries) {
    if (!value->is_table()) fail_not_a_table(name, key, *value, at(shown, *value));
    apply_table(config, dotted(name, key), *value, shown);
  }
}

void apply_chain(JobConfig& config, const fs::path& file, const std::string& shown,
                 const std::string& included_from, Chain& chain) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(file, ec);
  if (ec) canonical = fs::absolute(file).lexically_normal();
  if (auto it = std::find(chain.canonical.begin(), chain.canonical.end(), canonical);
      it != chain.canonical.end()) {
    std::string cycle;
    for (size_t i = it - chain.canonical.begin(); i < chain.shown.size(); ++i) {
      cycle += chain.shown[i] + " -> ";
    }
    MT_FAIL("extends cycle: ", cycle, shown, " (", included_from.substr(2), ")");
  }
  const toml::value root = parse_file(file, shown, included_from);
  chain.canonical.push_back(canonical);
  chain.shown.push_back(shown);

  if (root.contains(std::string(kExtends))) {
    const toml::value& ext = root.at(std::string(kExtends));
    MT_CHECK(ext.is_string(), "extends: expected a string (a path to a base config), got ",
             describe(ext), " at ", at(shown, ext));
    const fs::path base = (file.parent_path() / ext.as_string().str).lexically_normal();
    apply_chain(config, base, base.string(), ", extended at " + at(shown, ext), chain);
  }
  for (const auto& [name, value] : in_file_order(root)) {
    if (name == kExtends) continue;
    if (!value->is_table()) fail_not_a_table("", name, *value, at(shown, *value));
    apply_table(config, name, *value, shown);
  }
  chain.canonical.pop_back();
  chain.shown.pop_back();
}

}  // namespace

void apply_file(JobConfig& config, const fs::path& file) {
  Chain chain;
  apply_chain(config, file, file.string(), "", chain);
}

}  // namespace mt::train::config
