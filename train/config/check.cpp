#include "train/config/check.h"

#include <sstream>

namespace mt::train::config {

namespace {

// Int and Float values as a double; other types never reach numeric rules (the schema pairs
// numeric rules with numeric keys), and are rejected if they do.
bool numeric(const Value& v, double& out) {
  if (auto* i = std::get_if<int64_t>(&v)) {
    out = static_cast<double>(*i);
    return true;
  }
  if (auto* d = std::get_if<double>(&v)) {
    out = *d;
    return true;
  }
  return false;
}

std::string num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace

Check positive() {
  return {"> 0",
          [](const Value& v) {
            double x;
            return numeric(v, x) && x > 0;
          },
          {}};
}

Check non_negative() {
  return {">= 0",
          [](const Value& v) {
            double x;
            return numeric(v, x) && x >= 0;
          },
          {}};
}

Check positive_or(int64_t sentinel) {
  return {"> 0, or " + std::to_string(sentinel),
          [sentinel](const Value& v) {
            double x;
            return numeric(v, x) && (x > 0 || x == static_cast<double>(sentinel));
          },
          {}};
}

Check at_least(int64_t min) {
  return {">= " + std::to_string(min),
          [min](const Value& v) {
            double x;
            return numeric(v, x) && x >= static_cast<double>(min);
          },
          {}};
}

Check mebibytes() {
  return {"> 0 and at most 2^40 (MiB)",
          [](const Value& v) {
            double x;
            return numeric(v, x) && x > 0 && x <= 1099511627776.0;
          },
          {}};
}

Check in_range(double lo, double hi) {
  return {"in [" + num(lo) + ", " + num(hi) + "]",
          [lo, hi](const Value& v) {
            double x;
            return numeric(v, x) && x >= lo && x <= hi;
          },
          {}};
}

Check in_half_open(double lo, double hi) {
  return {"in [" + num(lo) + ", " + num(hi) + ")",
          [lo, hi](const Value& v) {
            double x;
            return numeric(v, x) && x >= lo && x < hi;
          },
          {}};
}

Check one_of(std::vector<std::string> choices) {
  std::string rule = "one of ";
  for (size_t i = 0; i < choices.size(); ++i) rule += (i ? ", " : "") + quote(choices[i]);
  return {rule,
          [choices](const Value& v) {
            auto* s = std::get_if<std::string>(&v);
            if (!s) return false;
            for (const auto& c : choices) {
              if (*s == c) return true;
            }
            return false;
          },
          choices};
}

Check non_empty() {
  return {"non-empty",
          [](const Value& v) {
            auto* s = std::get_if<std::string>(&v);
            return s && !s->empty();
          },
          {}};
}

Check custom(std::string rule, std::function<bool(const Value&)> accept) {
  return {std::move(rule), std::move(accept), {}};
}

}  // namespace mt::train::config
