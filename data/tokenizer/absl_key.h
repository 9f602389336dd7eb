// Debian 12's Abseil has its own absl::string_view (not std::string_view), so heterogeneous
// lookups in absl::flat_hash_map<std::string, ...> go through this conversion.
#pragma once

#include <absl/strings/string_view.h>

#include <string_view>

namespace mt::data {

inline absl::string_view absl_key(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace mt::data
