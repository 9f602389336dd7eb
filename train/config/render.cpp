#include "train/config/render.h"

#include <fstream>
#include <sstream>
#include <system_error>

#include "runtime/core/error.h"
#include "train/config/schema.h"

namespace mt::train::config {

namespace fs = std::filesystem;

std::string render_toml(const JobConfig& config, const RenderOptions& options) {
  std::ostringstream os;
  os << "# minititan job config, resolved (defaults < config file < command line).\n"
        "# Train with it again: train --config THIS_FILE\n";
  for (const SectionSpec& s : schema()) {
    os << "\n[" << s.name << "]";
    if (options.docs) os << "  # " << s.doc;
    os << "\n";
    for (const FieldSpec& f : s.fields) {
      if (options.docs) {
        os << "# " << f.doc;
        if (!f.check.rule.empty()) os << " (" << f.check.rule << ")";
        os << "\n";
      }
      os << f.name << " = " << to_toml(f.get(config));
      if (options.origins) {
        if (auto it = config.origins.find(f.key()); it != config.origins.end()) {
          os << "  # from " << it->second.where();
        }
      }
      os << "\n";
    }
  }
  return os.str();
}

void write_config(const JobConfig& config, const fs::path& path, const RenderOptions& options) {
  std::error_code ec;
  if (path.has_parent_path()) {
    fs::create_directories(path.parent_path(), ec);
    MT_CHECK(!ec, "write_config: cannot create the folder '", path.parent_path().string(),
             "': ", ec.message());
  }
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MT_CHECK(out, "write_config: cannot open '", tmp.string(), "' for writing");
    out << render_toml(config, options);
    out.close();
    MT_CHECK(out, "write_config: failed writing '", tmp.string(), "'");
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    MT_FAIL("write_config: cannot move '", tmp.string(), "' to '", path.string(),
            "': ", ec.message());
  }
}

}  // namespace mt::train::config
