// Collectives on byte strings, for small control-plane messages (checkpoint plans, error texts):
// every rank contributes a string of any length and gets everyone's, in rank order.
#pragma once

#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace mt::parallel {

// Collective over `group`: rank r's `mine` is element r of the result on every rank.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine,
                                            const std::string& name);

}  // namespace mt::parallel
