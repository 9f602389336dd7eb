// metrics.jsonl: one JSON object per line, appended and flushed line by line, so a crashed or
// interrupted run keeps every line it logged and `tail -f` / pandas.read_json(lines=True) work.
//
// JsonObject builds one line with keys in insertion order. Values: integers, finite doubles
// (shortest text that reads back to the same double), strings (escaped per RFC 8259; invalid UTF-8
// bytes become U+FFFD so the file stays valid JSON), booleans and null. JSON has no NaN or
// infinity: such doubles are written as null (a NaN loss appears as "loss": null), and an absent
// optional (e.g. mfu without a known peak) is null too.
//
// The file is opened in append mode: a resumed run continues the same file (its step numbers
// continue), and readers should treat the last line for a step as authoritative.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "train/metrics/step_metrics.h"

namespace mt::train {

class JsonObject {
 public:
  JsonObject& add(std::string_view key, int64_t value);
  JsonObject& add(std::string_view key, int value) { return add(key, int64_t(value)); }
  JsonObject& add(std::string_view key, double value);  // non-finite -> null
  JsonObject& add(std::string_view key, std::string_view value);
  JsonObject& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, bool value);
  JsonObject& add_null(std::string_view key);
  template <class T>
  JsonObject& add(std::string_view key, const std::optional<T>& value) {
    return value ? add(key, *value) : add_null(key);
  }

  // The object as one line of JSON (no newline).
  std::string str() const { return body_ + "}"; }

 private:
  JsonObject& raw(std::string_view key, std::string_view json_value);
  std::string body_ = "{";
};

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);
// A double as JSON: shortest round-trip text, or "null" when not finite.
std::string json_number(double v);

// The standard fields of a step: step, loss, grad_norm, lr, tokens_per_sec, mfu,
// mem_in_use_bytes, mem_peak_bytes, data_wait_fraction, elapsed_sec, eta_sec. Callers may add
// more (e.g. val_loss) before writing.
JsonObject to_json(const StepMetrics& m);

class JsonlWriter {
 public:
  explicit JsonlWriter(const std::string& path);  // throws mt::Error naming the path
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  void write(const JsonObject& object);  // one line, flushed
  void write(const StepMetrics& m) { write(to_json(m)); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mt::train
