#include "train/config/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <system_error>
#include <toml.hpp>

#include "train/config/toml_convert.h"

namespace mt::train::config {

std::string_view expected_phrase(FieldType type) {
  switch (type) {
    case FieldType::Bool:
      return "a boolean (true or false)";
    case FieldType::Int:
      return "an integer";
    case FieldType::Float:
      return "a number";
    case FieldType::String:
      return "a string";
    case FieldType::StringList:
      return "a list of strings";
  }
  return "?";
}

std::string_view placeholder(FieldType type) {
  switch (type) {
    case FieldType::Bool:
      return "BOOL";
    case FieldType::Int:
      return "INT";
    case FieldType::Float:
      return "NUMBER";
    case FieldType::String:
      return "STRING";
    case FieldType::StringList:
      return "LIST";
  }
  return "?";
}

std::string quote(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

namespace {

std::string float_text(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  std::string s(buf, end);
  // Keep it a TOML float: "1" would read back as an integer (accepted, but not what we wrote).
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

struct ToToml {
  std::string operator()(bool b) const { return b ? "true" : "false"; }
  std::string operator()(int64_t i) const { return std::to_string(i); }
  std::string operator()(double d) const { return float_text(d); }
  std::string operator()(const std::string& s) const { return quote(s); }
  std::string operator()(const StringList& list) const {
    std::string out = "[";
    for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + quote(list[i]);
    return out + "]";
  }
};

Parsed fail(std::string problem) { return Parsed{std::nullopt, std::move(problem)}; }

std::string got_text(std::string_view text) { return "got " + quote(text); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Parses `text` as a TOML value (the right-hand side of `v = text`).
std::optional<toml::value> parse_toml_literal(std::string_view text) {
  if (!toml_text_problem(text).empty() || toml_nesting_depth(text) > kMaxTomlNesting) {
    return std::nullopt;  // toml11 is not safe on such text
  }
  std::istringstream in("v = " + std::string(text) + "\n");
  try {
    toml::value root = toml::parse(in, "command line");
    return root.at("v");
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::string to_toml(const Value& value) { return std::visit(ToToml{}, value); }

Parsed parse_text(FieldType type, std::string_view text) {
  const std::string expected = "expected " + std::string(expected_phrase(type)) + ", ";
  switch (type) {
    case FieldType::Bool:
      if (text == "true") return Parsed{Value{true}, {}};
      if (text == "false") return Parsed{Value{false}, {}};
      return fail(expected + got_text(text));
    case FieldType::Int: {
      int64_t i = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
      if (ec == std::errc::result_out_of_range) {
        return fail(expected + got_text(text) + " (out of the 64-bit range)");
      }
      if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
        return fail(expected + got_text(text));
      }
      return Parsed{Value{i}, {}};
    }
    case FieldType::Float: {
      double d = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty() ||
          !std::isfinite(d)) {
        return fail("expected a finite number, " + got_text(text));
      }
      return Parsed{Value{d}, {}};
    }
    case FieldType::String:
      if (text.size() >= 2 && ((text.front() == '"' && text.back() == '"') ||
                               (text.front() == '\'' && text.back() == '\''))) {
        auto v = parse_toml_literal(text);
        if (!v || !v->is_string()) return fail("malformed quoted string " + std::string(text));
        return Parsed{Value{v->as_string().str}, {}};
      }
      return Parsed{Value{std::string(text)}, {}};
    case FieldType::StringList: {
      if (!text.empty() && trim(text).front() == '[') {
        auto v = parse_toml_literal(text);
        if (!v)
          return fail("expected a TOML array of strings such as [\"a\", \"b\"], " + got_text(text));
        return from_toml(type, *v);
      }
      StringList list;
      if (!trim(text).empty()) {
        size_t start = 0;
        while (true) {
          size_t comma = text.find(',', start);
          std::string_view item =
              trim(text.substr(start, comma == std::string_view::npos ? text.npos : comma - start));
          if (item.empty()) return fail("empty item in the comma-separated list " + quote(text));
          list.emplace_back(item);
          if (comma == std::string_view::npos) break;
          start = comma + 1;
        }
      }
      return Parsed{Value{std::move(list)}, {}};
    }
  }
  return fail("unknown type");
}

}  // namespace mt::train::config
