#include "train/config_agreement.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/comm/object_collectives.h"
#include "runtime/core/error.h"
#include "train/config/render.h"

namespace mt::train {

namespace {

// Keys whose values may name each rank's own place (node-local storage), so may differ.
constexpr const char* kMayDiffer[] = {"[job] dump_folder = ", "[embedding] kv_path = "};

// "[section] key = value" lines of a rendered config (without docs and origins), less kMayDiffer.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("[")) {
      section = line.substr(0, line.find(']') + 1) + " ";
      continue;
    }
    if (line.empty() || line.starts_with("#")) continue;
    line = section + line;
    const bool may_differ = std::any_of(std::begin(kMayDiffer), std::end(kMayDiffer),
                                        [&](const char* key) { return line.starts_with(key); });
    if (!may_differ) lines.push_back(line);
  }
  return lines;
}

// The first line where `a` and `b` differ, each side's own; nullopt when none does.
std::optional<std::pair<std::string, std::string>> first_difference(
    const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (size_t i = 0; i < a.size() || i < b.size(); ++i) {
    const std::string x = i < a.size() ? a[i] : "(nothing)";
    const std::string y = i < b.size() ? b[i] : "(nothing)";
    if (x != y) return std::pair{x, y};
  }
  return std::nullopt;
}

}  // namespace

void check_same_config_on_every_rank(const config::JobConfig& config,
                                     parallel::ProcessGroup& world) {
  if (world.size() == 1) return;
  const std::string mine =
      config::render_toml(config, config::RenderOptions{.docs = false, .origins = false});
  const std::vector<std::string> all = parallel::all_gather_strings(world, mine, "config.agree");
  const std::vector<std::string> rank_0 = lines_of(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const auto difference = first_difference(rank_0, lines_of(all[r]));
    if (!difference) continue;
    const auto& [on_0, on_r] = *difference;
    MT_FAIL("train: rank ", r, " was given another config than rank 0: ", on_0, " on rank 0, ",
            on_r, " on rank ", r, ". Give every rank the same config file and overrides");
  }
}

}  // namespace mt::train
