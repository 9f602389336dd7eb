#include "train/config/job_config.h"

#include "train/config/schema.h"

namespace mt::train::config {

std::string Origin::where() const {
  if (!flag.empty()) return "command-line flag " + flag;
  return file + " line " + std::to_string(line);
}

std::string JobConfig::where(std::string_view key) const {
  auto it = origins.find(key);
  return it == origins.end() ? "default value" : it->second.where();
}

bool operator==(const JobConfig& a, const JobConfig& b) {
  for (const SectionSpec& s : schema()) {
    for (const FieldSpec& f : s.fields) {
      if (f.get(a) != f.get(b)) return false;
    }
  }
  return true;
}

}  // namespace mt::train::config
