#include "tests/testing/shared_data.h"

#include <cstdlib>

namespace mt::testing {

namespace fs = std::filesystem;

std::optional<fs::path> shared_data() {
  if (const char* env = std::getenv("MT_SHARED_DATA"); env && *env) {
    if (fs::is_directory(env)) return fs::path(env);
    return std::nullopt;
  }
  for (const char* rel : {"../shared/data", "../../shared/data", "../../../shared/data"}) {
    if (fs::is_directory(rel)) return fs::absolute(rel);
  }
  // <repo>/tests/testing/ -> <repo>/../shared/data
  const fs::path from_source = fs::path(__FILE__).parent_path() / "../../../shared/data";
  if (fs::is_directory(from_source)) return from_source;
  return std::nullopt;
}

}  // namespace mt::testing
