// The schema of a job config: for every section and key, its name, type, doc string, value rule
// and accessors into JobConfig. It is the ONE place that lists the keys: parsing, command-line
// overrides, validation, --print-config, "did you mean" suggestions and --help all iterate it.
// The tables themselves are in schema.cpp.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "train/config/check.h"
#include "train/config/job_config.h"
#include "train/config/value.h"

namespace mt::train::config {

struct FieldSpec {
  std::string_view section;
  std::string_view name;
  FieldType type;
  std::string_view doc;
  Check check;
  std::function<Value(const JobConfig&)> get;
  std::function<void(JobConfig&, const Value&)> set;  // the Value holds this field's type

  std::string key() const;  // "section.name"
};

struct SectionSpec {
  std::string_view name;
  std::string_view doc;
  std::vector<FieldSpec> fields;

  const FieldSpec* find(std::string_view field) const;  // nullptr when absent
};

// Every section, in the order they are printed.
const std::vector<SectionSpec>& schema();

// Section names may be dotted ("quantize.linear.float8"); key names never are.
const SectionSpec* find_section(std::string_view name);  // nullptr when absent
// The sections whose names start with `group` and a dot: "quantize" and "quantize.linear" are
// groups ([quantize.linear.float8]), TOML tables that hold sections rather than keys.
std::vector<const SectionSpec*> sections_in_group(std::string_view group);
bool is_section_group(std::string_view name);  // sections_in_group(name) is not empty
// "section.name", split at the last dot; nullptr when absent.
const FieldSpec* find_field(std::string_view key);

}  // namespace mt::train::config
