// Command-line flags for the tools: `--name=value`, `--name value`, bare switches and positional
// arguments, with errors (mt::Error) that name the tool and the flag.
//
//   FlagReader flags("mt_generate", argc, argv);
//   while (flags.next()) {
//     if (flags.is("--prompt")) a.prompt = flags.value();
//     else if (flags.is("--top-k")) a.top_k = flags.int_value();
//     else flags.unknown();
//   }
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "runtime/core/error.h"

namespace mt::tools {

class FlagReader {
 public:
  FlagReader(std::string program, int argc, char** argv)
      : program_(std::move(program)), argc_(argc), argv_(argv) {}

  // Moves to the next argument; false when none is left.
  bool next() {
    if (++i_ >= argc_) return false;
    arg_ = argv_[i_];
    inline_value_.reset();
    const size_t eq = arg_.find('=');
    if (arg_.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value_ = arg_.substr(eq + 1);
      arg_ = arg_.substr(0, eq);
    }
    return true;
  }

  const std::string& arg() const { return arg_; }  // "--name" (without "=value"), or positional
  bool is(const char* name) const { return arg_ == name; }
  bool is_positional() const { return arg_.rfind("--", 0) != 0 && arg_ != "-h"; }

  // The flag's value: after '=', or the next argument.
  std::string value() {
    if (inline_value_) return *inline_value_;
    MT_CHECK(i_ + 1 < argc_, program_, ": ", arg_, " needs a value");
    return argv_[++i_];
  }
  int64_t int_value() {
    const std::string v = value();
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    MT_CHECK(!v.empty() && *end == '\0' && errno == 0, program_, ": ", arg_,
             " expects an integer, got '", v, "'");
    return n;
  }
  double double_value() {
    const std::string v = value();
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    MT_CHECK(!v.empty() && *end == '\0', program_, ": ", arg_, " expects a number, got '", v, "'");
    return d;
  }
  [[noreturn]] void unknown() const {
    MT_FAIL(program_, ": unknown argument '", arg_, "' (see --help)");
  }

 private:
  std::string program_;
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string arg_;
  std::optional<std::string> inline_value_;
};

}  // namespace mt::tools
