#include "train/config/command_line.h"

#include <sstream>

#include "runtime/core/error.h"
#include "train/config/lookup.h"
#include "train/config/schema.h"

namespace mt::train::config {

namespace {

const std::vector<std::string> kOptions = {"config", "print-config", "describe-model",
                                           "print-pipeline-schedule", "help"};

bool is_flag(const std::string& arg) { return arg.rfind("--", 0) == 0 && arg.size() > 2; }

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h") {
      out.help = true;
      continue;
    }
    MT_CHECK(is_flag(arg), "unexpected command-line argument '", arg,
             "' (flags start with --; give the config file as --config FILE)");
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (name == "print-config" || name == "describe-model" || name == "print-pipeline-schedule" ||
        name == "help") {
      MT_CHECK(eq == std::string::npos, "--", name, " takes no value, got ", arg);
      (name == "help"                      ? out.help
       : name == "print-config"            ? out.print_config
       : name == "print-pipeline-schedule" ? out.print_pipeline_schedule
                                           : out.describe_model) = true;
      continue;
    }
    const FieldSpec* field = name == "config" ? nullptr : find_field(name);
    if (name != "config" && !field) fail_unknown_flag(name, arg, kOptions);
    // The value: after '=', or the next argument unless that is a flag itself.
    std::string text, flag;
    if (eq != std::string::npos) {
      text = arg.substr(eq + 1);
      flag = arg;
    } else {
      MT_CHECK(i + 1 < args.size() && !is_flag(args[i + 1]), "missing value after ", arg,
               " (write ", arg, "=VALUE or ", arg, " VALUE)");
      text = args[++i];
      flag = arg + " " + text;
    }
    if (!field) {
      MT_CHECK(!text.empty(), "--config: expected a file name, got an empty value");
      MT_CHECK(out.config_file.empty(), "--config given twice (", out.config_file, " and ", text,
               "): give one file; it may `extends` another");
      out.config_file = text;
      continue;
    }
    Parsed parsed = parse_text(field->type, text);
    MT_CHECK(parsed.value, field->key(), ": ", parsed.problem, " at command-line flag ", flag);
    out.overrides.push_back(Override{field->key(), std::move(*parsed.value), flag});
  }
  return out;
}

CommandLine parse_command_line(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_command_line(args);
}

void apply_overrides(JobConfig& config, const std::vector<Override>& overrides) {
  for (const Override& o : overrides) {
    const FieldSpec* field = find_field(o.key);
    MT_CHECK(field, "unknown config key '", o.key, "' in an override");
    MT_CHECK(o.value.index() == field->get(config).index(), o.key, ": expected ",
             expected_phrase(field->type), " in the override ", o.flag);
    field->set(config, o.value);
    config.origins[o.key] = Origin{"", 0, o.flag};
  }
}

std::string help_text(std::string_view program) {
  std::ostringstream os;
  os << "usage: " << program
     << " [--config FILE] [--section.key=VALUE | --section.key VALUE]... [--print-config]\n"
        "       [--describe-model] [--print-pipeline-schedule]\n\n"
        "  --config FILE    TOML config file (it may `extends = \"base.toml\"`)\n"
        "  --print-config   print the resolved config as TOML and exit\n"
        "  --describe-model print the model's parameter count and training FLOPs per token (at\n"
        "                   training.seq_len) and exit; allocates nothing, so any flavor works\n"
        "  --print-pipeline-schedule  print each pp rank's pipeline actions as a grid, and each\n"
        "                   stage's layers, and exit\n"
        "  --help, -h       print this help and exit\n\n"
        "Every key below can be set in the file's [section] or on the command line; the command\n"
        "line wins over the file, which wins over the defaults. Lists: a,b,c or [\"a\", \"b\"].\n";
  const JobConfig defaults;
  for (const SectionSpec& s : schema()) {
    os << "\n[" << s.name << "]  " << s.doc << "\n";
    for (const FieldSpec& f : s.fields) {
      os << "  --" << f.key() << "=" << placeholder(f.type) << "  (default "
         << to_toml(f.get(defaults));
      if (!f.check.rule.empty()) os << "; " << f.check.rule;
      os << ")\n      " << f.doc << "\n";
    }
  }
  return os.str();
}

}  // namespace mt::train::config
