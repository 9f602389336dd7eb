// Collectives on byte strings and small host vectors, for control-plane messages (checkpoint
// plans, error texts) and metrics (held-out scores): every rank contributes any length and gets
// everyone's, in rank order.
#pragma once

#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace mt::parallel {

// Collective over `group`: rank r's `mine` is element r of the result on every rank.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine,
                                            const std::string& name);

// Collective over `group`: every rank's `mine`, concatenated in rank order.
std::vector<double> all_gather_values(ProcessGroup& group, const std::vector<double>& mine,
                                      const std::string& name);

}  // namespace mt::parallel
