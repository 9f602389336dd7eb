// Internal to the config system: conversion of toml11 values into config Values, and short
// descriptions of TOML values for error messages. Includes <toml.hpp>, so only the config
// system's .cpp files include it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <toml.hpp>

#include "train/config/value.h"

namespace mt::train::config {

// `value` as a key of `type`, or the problem: "expected an integer, got string \"ten\"".
Parsed from_toml(FieldType type, const toml::value& value);

// What a TOML value is, for "got ..." in messages: string "ten", integer 10, float 0.5,
// boolean true, array, table, date-time.
std::string describe(const toml::value& value);

// toml11 parses arrays and inline tables recursively, so text nested thousands deep (`x =
// [[[[...]]]]`) would overflow the stack: the deepest nesting of [ and { in TOML text (strings
// and comments skipped), which callers check against kMaxTomlNesting before parsing.
inline constexpr size_t kMaxTomlNesting = 64;
size_t toml_nesting_depth(std::string_view text);

// TOML text must be UTF-8 without control characters other than tab, CR and LF (the spec's
// rule); toml11 reads past its buffer on some invalid UTF-8 (found by config_fuzz_test under
// AddressSanitizer), so text is checked before it parses. "" when fine, else e.g. "byte 0xE1 at
// line 5 is not UTF-8".
std::string toml_text_problem(std::string_view text);

}  // namespace mt::train::config
