// A model's named flavors ("debugmodel", "8B", ...): a table of (name, args) and the two lookups
// every model exposes (flavor_names, flavor_args), written once for all models.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/error.h"

namespace mt::models {

template <class Args>
struct Flavor {
  const char* name;
  Args args;
};

template <class Args>
std::vector<std::string> flavor_names_of(const std::vector<Flavor<Args>>& table) {
  std::vector<std::string> out;
  for (const auto& f : table) out.emplace_back(f.name);
  return out;
}

// The args of `flavor`; throws mt::Error naming `model` and listing the valid flavors.
template <class Args>
Args find_flavor(const std::vector<Flavor<Args>>& table, std::string_view flavor,
                 std::string_view model) {
  std::string valid;
  for (const auto& f : table) {
    if (flavor == f.name) return f.args;
    valid += (valid.empty() ? "" : ", ") + std::string(f.name);
  }
  MT_FAIL(model, ": unknown flavor '", flavor, "'; valid flavors: ", valid);
}

}  // namespace mt::models
