// Value rules of config keys ("> 0", "in [0, 1)", "one of linear, sqrt, cosine") as data: one
// Check both tests a value and describes the rule, so docs, --help and error messages say the
// same thing. Rules about several keys at once live in validate.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "train/config/value.h"

namespace mt::train::config {

struct Check {
  std::string rule;                          // "> 0"; empty: every value of the type is valid
  std::function<bool(const Value&)> accept;  // null: every value is valid
  std::vector<std::string> choices;          // for one_of: the valid names (for suggestions)

  bool passes(const Value& value) const { return !accept || accept(value); }
};

Check positive();                                // > 0
Check non_negative();                            // >= 0
Check positive_or(int64_t sentinel);             // > 0, or the sentinel (e.g. -1 = "derive it")
Check at_least(int64_t min);                     // >= min
Check in_range(double lo, double hi);            // in [lo, hi]
Check in_half_open(double lo, double hi);        // in [lo, hi)
Check one_of(std::vector<std::string> choices);  // a string equal to one of `choices`
Check non_empty();                               // a non-empty string
Check custom(std::string rule, std::function<bool(const Value&)> accept);
Check mebibytes();  // a size in MiB: > 0 and at most 2^40 (its bytes fit in 63 bits)

}  // namespace mt::train::config
