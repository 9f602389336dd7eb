#include "train/config/toml_convert.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mt::train::config {

std::string describe(const toml::value& value) {
  switch (value.type()) {
    case toml::value_t::boolean:
      return value.as_boolean() ? "boolean true" : "boolean false";
    case toml::value_t::integer:
      return "integer " + std::to_string(value.as_integer());
    case toml::value_t::floating:
      return "float " + to_toml(Value{value.as_floating()});
    case toml::value_t::string: {
      const std::string& s = value.as_string().str;
      return "string " + quote(s.size() > 60 ? s.substr(0, 57) + "..." : s);
    }
    case toml::value_t::array:
      return "an array";
    case toml::value_t::table:
      return "a table";
    case toml::value_t::empty:
      return "nothing";
    default:
      return "a date-time";
  }
}

// GCC 12 reports -Wmaybe-uninitialized inside std::optional<std::variant<...>> moves at -O2 with
// sanitizers (a known false positive); nothing here is read uninitialised.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
Parsed from_toml(FieldType type, const toml::value& value) {
  auto wrong = [&] {
    return Parsed{std::nullopt,
                  "expected " + std::string(expected_phrase(type)) + ", got " + describe(value)};
  };
  switch (type) {
    case FieldType::Bool:
      if (!value.is_boolean()) return wrong();
      return Parsed{Value{value.as_boolean()}, {}};
    case FieldType::Int:
      if (!value.is_integer()) return wrong();
      return Parsed{Value{static_cast<int64_t>(value.as_integer())}, {}};
    case FieldType::Float: {
      double d = 0;
      if (value.is_integer()) {
        d = static_cast<double>(value.as_integer());
      } else if (value.is_floating()) {
        d = value.as_floating();
      } else {
        return wrong();
      }
      if (!std::isfinite(d))
        return Parsed{std::nullopt, "expected a finite number, got " + describe(value)};
      return Parsed{Value{d}, {}};
    }
    case FieldType::String:
      if (!value.is_string()) return wrong();
      return Parsed{Value{value.as_string().str}, {}};
    case FieldType::StringList: {
      if (!value.is_array()) return wrong();
      StringList list;
      const auto& array = value.as_array();
      for (size_t i = 0; i < array.size(); ++i) {
        if (!array[i].is_string()) {
          return Parsed{std::nullopt, "expected a list of strings, got " + describe(array[i]) +
                                          " as item " + std::to_string(i + 1)};
        }
        list.push_back(array[i].as_string().str);
      }
      return Parsed{Value{std::move(list)}, {}};
    }
  }
  return wrong();
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (1-4), or 0 when it is not one
// (overlong forms, surrogates and code points above U+10FFFF included).
size_t utf8_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char b = byte(0);
  if (b < 0x80) return 1;
  const size_t n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 ? 2 : 0;
  if (n == 0 || b > 0xF4 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
  }
  if (n == 3 && ((b == 0xE0 && byte(1) < 0xA0) || (b == 0xED && byte(1) >= 0xA0))) return 0;
  if (n == 4 && ((b == 0xF0 && byte(1) < 0x90) || (b == 0xF4 && byte(1) >= 0x90))) return 0;
  return n;
}

}  // namespace

std::string toml_text_problem(std::string_view text) {
  size_t line = 1;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') ++line;
    const bool control = (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F;
    const size_t n = control ? 0 : utf8_length(text, i);
    if (n == 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", c);
      return std::string(control ? "control character " : "byte ") + hex + " at line " +
             std::to_string(line) + (control ? "" : " is not UTF-8");
    }
    i += n;
  }
  return "";
}

size_t toml_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0, i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '#') {  // a comment, to the end of the line
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {  // a string: basic or literal, one line or three quotes
      const bool multi_line = text.substr(i, 3) == std::string(3, c);
      const std::string_view close = text.substr(i, multi_line ? 3 : 1);
      i += close.size();
      while (i < text.size() && text.substr(i, close.size()) != close) {
        i += c == '"' && text[i] == '\\' ? 2 : 1;  // basic strings have escapes
      }
      i += close.size();
    } else {
      if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
      if ((c == ']' || c == '}') && depth > 0) --depth;
      ++i;
    }
  }
  return deepest;
}

}  // namespace mt::train::config
