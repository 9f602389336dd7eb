#include "train/config/lookup.h"

#include <algorithm>
#include <vector>

#include "runtime/core/error.h"
#include "train/config/suggest.h"

namespace mt::train::config {

namespace {

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const SectionSpec& s : schema()) out.emplace_back(s.name);
  return out;
}

std::string join(const std::vector<std::string>& names, std::string_view before,
                 std::string_view after) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i ? ", " : "") + std::string(before) + names[i] + std::string(after);
  }
  return out;
}

// The full key of a field named exactly `name`, or nearest to it, in any section but `skip`.
std::optional<std::string> key_in_other_section(std::string_view name, std::string_view skip) {
  std::vector<std::string> bare, full;
  for (const SectionSpec& s : schema()) {
    if (s.name == skip) continue;
    for (const FieldSpec& f : s.fields) {
      bare.emplace_back(f.name);
      full.push_back(f.key());
    }
  }
  auto best = nearest(name, bare);
  if (!best) return std::nullopt;
  for (size_t i = 0; i < bare.size(); ++i) {
    if (bare[i] == *best) return full[i];
  }
  return std::nullopt;
}

// The full key nearest to `name` among the keys of the group's sections ("enable" under
// [quantize] -> "quantize.linear.float8.enable").
std::optional<std::string> suggest_group_key(std::string_view group, std::string_view name) {
  std::vector<std::string> bare, full;
  for (const SectionSpec* s : sections_in_group(group)) {
    for (const FieldSpec& f : s->fields) {
      bare.emplace_back(f.name);
      full.push_back(f.key());
    }
  }
  auto best = nearest(name, bare);
  if (!best) return std::nullopt;
  return full[size_t(std::find(bare.begin(), bare.end(), *best) - bare.begin())];
}

}  // namespace

const SectionSpec& lookup_section(std::string_view name, const std::string& where) {
  if (const SectionSpec* s = find_section(name)) return *s;
  const auto names = section_names();
  if (auto best = nearest(name, names)) {
    MT_FAIL("unknown section [", name, "] at ", where, "; did you mean [", *best, "]?");
  }
  MT_FAIL("unknown section [", name, "] at ", where, "; valid sections: ", join(names, "[", "]"));
}

std::optional<std::string> suggest_key(const SectionSpec& section, std::string_view name) {
  std::vector<std::string> names;
  for (const FieldSpec& f : section.fields) names.emplace_back(f.name);
  if (auto best = nearest(name, names)) return std::string(section.name) + "." + *best;
  return key_in_other_section(name, section.name);
}

const FieldSpec& lookup_field(const SectionSpec& section, std::string_view name,
                              const std::string& where) {
  if (const FieldSpec* f = section.find(name)) return *f;
  const std::string key = std::string(section.name) + "." + std::string(name);
  if (auto best = suggest_key(section, name)) {
    MT_FAIL("unknown key '", key, "' at ", where, "; did you mean '", *best, "'?");
  }
  std::vector<std::string> names;
  for (const FieldSpec& f : section.fields) names.emplace_back(f.name);
  MT_FAIL("unknown key '", key, "' at ", where, "; valid keys of [", section.name,
          "]: ", join(names, "", ""));
}

void fail_top_level_key(std::string_view name, const std::string& where) {
  if (auto other = key_in_other_section(name, "")) {
    MT_FAIL("unknown top-level key '", name, "' at ", where,
            "; keys belong in a section: did you mean '", *other, "'?");
  }
  MT_FAIL("unknown top-level key '", name, "' at ", where,
          "; a file holds `extends = \"base.toml\"` and sections ",
          join(section_names(), "[", "]"));
}

std::string sections_in_group_text(std::string_view group) {
  std::vector<std::string> names;
  for (const SectionSpec* s : sections_in_group(group)) names.emplace_back(s->name);
  return join(names, "[", "]");
}

void fail_group_key(std::string_view group, std::string_view name, const std::string& where) {
  const std::string key = std::string(group) + "." + std::string(name);
  const std::string holds =
      "; [" + std::string(group) + "] holds only the sections " + sections_in_group_text(group);
  if (auto best = suggest_group_key(group, name)) {
    MT_FAIL("unknown key '", key, "' at ", where, holds, ": did you mean '", *best, "'?");
  }
  MT_FAIL("unknown key '", key, "' at ", where, holds);
}

void fail_unknown_flag(std::string_view name, const std::string& flag,
                       const std::vector<std::string>& options) {
  std::optional<std::string> best;
  const size_t dot = name.rfind('.');  // keys hold no dots; section names may
  if (dot != std::string_view::npos) {
    const std::string_view section = name.substr(0, dot), key = name.substr(dot + 1);
    if (const SectionSpec* s = find_section(section)) {
      best = suggest_key(*s, key);
    } else if (is_section_group(section)) {
      best = suggest_group_key(section, key);
    }
  }
  if (!best) {
    std::vector<std::string> candidates = options;
    for (const SectionSpec& s : schema()) {
      for (const FieldSpec& f : s.fields) candidates.push_back(f.key());
    }
    best = nearest(name, candidates);
  }
  if (best) MT_FAIL("unknown command-line flag ", flag, "; did you mean --", *best, "?");
  MT_FAIL("unknown command-line flag ", flag,
          "; flags are --section.key=VALUE (see --help for every key) or ",
          join(options, "--", ""));
}

}  // namespace mt::train::config
