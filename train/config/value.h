// The typed values of config keys: the five key types, a variant that holds any of them, and the
// conversions every key shares: from a TOML value, from command-line text, and back to TOML text.
//
// Conventions: integers are int64, numbers are finite doubles (a TOML integer is accepted where a
// number is expected), strings are UTF-8, lists are lists of strings. Conversions never throw on
// bad input: they return a Parsed whose `problem` says what was expected and what was found
// ("expected an integer, got string \"ten\""); the caller adds the key and where it came from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace mt::train::config {

enum class FieldType : uint8_t { Bool, Int, Float, String, StringList };

using StringList = std::vector<std::string>;
using Value = std::variant<bool, int64_t, double, std::string, StringList>;

// The C++ member type of each FieldType (bool, int64_t, double, std::string, StringList).
template <class T>
constexpr FieldType field_type_of();
template <>
constexpr FieldType field_type_of<bool>() {
  return FieldType::Bool;
}
template <>
constexpr FieldType field_type_of<int64_t>() {
  return FieldType::Int;
}
template <>
constexpr FieldType field_type_of<double>() {
  return FieldType::Float;
}
template <>
constexpr FieldType field_type_of<std::string>() {
  return FieldType::String;
}
template <>
constexpr FieldType field_type_of<StringList>() {
  return FieldType::StringList;
}

// "a boolean (true or false)", "an integer", "a number", "a string", "a list of strings".
std::string_view expected_phrase(FieldType type);
// Short placeholder for usage text: BOOL, INT, NUMBER, STRING, LIST.
std::string_view placeholder(FieldType type);

// A value rendered as TOML text that parses back to the same value (floats in shortest
// round-trip form, always with a '.' or an exponent; strings escaped; lists as ["a", "b"]).
std::string to_toml(const Value& value);
// A TOML basic string literal with quotes and escapes: "a\"b".
std::string quote(std::string_view text);

struct Parsed {
  std::optional<Value> value;
  std::string problem;  // set when !value
};

// Command-line text for a key of `type`: true/false; decimal integers; numbers (1e-4, 3, 0.5);
// strings as written (or a quoted TOML string); lists as a,b,c (empty text = empty list) or as
// a TOML array ["a", "b"].
Parsed parse_text(FieldType type, std::string_view text);

}  // namespace mt::train::config
