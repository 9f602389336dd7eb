// "Did you mean ...?": the nearest valid name to a misspelt one, by edit distance (optimal
// string alignment: insertions, deletions, substitutions and swaps of neighbours cost 1).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mt::train::config {

size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `word`, if it is near enough to be a likely typo (at most
// max(2, |word| / 3) edits, and fewer than |word|); ties go to the first candidate.
std::optional<std::string> nearest(std::string_view word,
                                   const std::vector<std::string>& candidates);

}  // namespace mt::train::config
