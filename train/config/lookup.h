// Looking up sections and keys by the names a user wrote, failing with a message that says where
// the name was written and suggests the nearest valid name ("did you mean [training]?").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/config/schema.h"

namespace mt::train::config {

// `where` is "configs/x.toml line 4" or "command-line flag --x"; it ends up in the message.
const SectionSpec& lookup_section(std::string_view name, const std::string& where);
const FieldSpec& lookup_field(const SectionSpec& section, std::string_view name,
                              const std::string& where);
// The nearest valid "section.key" to `name` in `section`, else a key of that name (or near it) in
// another section (`lr` under [training] -> optimizer.lr); nullopt when nothing is near.
std::optional<std::string> suggest_key(const SectionSpec& section, std::string_view name);
// A key written outside any section (`steps = 10` at the top of a file).
[[noreturn]] void fail_top_level_key(std::string_view name, const std::string& where);
// A key written in a table that only groups dotted sections (`enable = true` under [quantize],
// which holds [quantize.linear.float8]): suggests the nearest key of those sections.
[[noreturn]] void fail_group_key(std::string_view group, std::string_view name,
                                 const std::string& where);
// The sections of a group, for messages: "[quantize.linear.float8]".
std::string sections_in_group_text(std::string_view group);
// A command-line flag "--name" that is neither a known option nor "--section.key".
[[noreturn]] void fail_unknown_flag(std::string_view name, const std::string& flag,
                                    const std::vector<std::string>& options);

}  // namespace mt::train::config
