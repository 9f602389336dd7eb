#include "train/metrics/jsonl_writer.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>

#include "runtime/core/error.h"

namespace mt::train {

namespace {
// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4, cp = c & 0x07;
  else
    return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
    return 0;
  }
  return n;
}
}  // namespace

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      default:
        break;
    }
    if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round trip
  return std::string(buf, res.ptr);
}

JsonObject& JsonObject::raw(std::string_view key, std::string_view json_value) {
  if (body_.size() > 1) body_ += ", ";
  body_ += json_quote(key);
  body_ += ": ";
  body_ += json_value;
  return *this;
}

JsonObject& JsonObject::add(std::string_view key, int64_t value) {
  return raw(key, std::to_string(value));
}
JsonObject& JsonObject::add(std::string_view key, double value) {
  return raw(key, json_number(value));
}
JsonObject& JsonObject::add(std::string_view key, std::string_view value) {
  return raw(key, json_quote(value));
}
JsonObject& JsonObject::add(std::string_view key, bool value) {
  return raw(key, value ? "true" : "false");
}
JsonObject& JsonObject::add_null(std::string_view key) { return raw(key, "null"); }

JsonObject to_json(const StepMetrics& m) {
  JsonObject o;
  o.add("step", m.step)
      .add("loss", m.loss)
      .add("grad_norm", m.grad_norm)
      .add("lr", m.lr)
      .add(rate_name(m), m.tokens_per_sec)
      .add(rate_name(m) + "_total", m.tokens_per_sec * double(m.ranks))
      .add("mfu", m.mfu)
      .add("mem_in_use_bytes", m.mem_in_use_bytes)
      .add("mem_peak_bytes", m.mem_peak_bytes)
      .add("data_wait_fraction", m.data_wait_fraction)
      .add("comm_exposed_fraction", m.comm_exposed_fraction)
      .add("elapsed_sec", m.elapsed_sec)
      .add("eta_sec", m.eta_sec);
  for (const auto& [name, value] : m.model_metrics) o.add(name, value);
  return o;
}

JsonlWriter::JsonlWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  MT_CHECK(file_ != nullptr, "JsonlWriter: cannot open '", path,
           "' for appending: ", std::strerror(errno));
}

JsonlWriter::~JsonlWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void JsonlWriter::write(const JsonObject& object) {
  const std::string line = object.str() + "\n";
  const bool ok =
      std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  MT_CHECK(ok, "JsonlWriter: cannot write to '", path_, "': ", std::strerror(errno));
}

}  // namespace mt::train
