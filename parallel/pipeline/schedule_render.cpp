// render_schedule (parallel/pipeline/schedule.h): the schedule as a text grid, one column per time
// unit of simulate_schedule with f=1, b=2, bi=bw=1, cut into blocks of time when rows grow long.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mt::parallel::pipeline {

namespace {

std::string cell_label(const Action& a, bool show_stage) {
  static const char kLetter[] = {'F', 'B', 'I', 'W'};
  std::string label = kLetter[size_t(a.kind)] + std::to_string(a.microbatch);
  if (show_stage) label += ".s" + std::to_string(a.stage);
  return label;
}

}  // namespace

std::string render_schedule(const PipelineSchedule& schedule) {
  const ScheduleTiming timing = simulate_schedule(schedule, 1, 2, 1, 1);
  const bool show_stage = schedule.stages_per_rank > 1;
  const size_t columns = size_t(std::llround(timing.makespan));

  // Every action covers whole time units: cells[r][t] is what rank r runs at time t.
  std::vector<std::vector<std::string>> cells(schedule.ranks.size(),
                                              std::vector<std::string>(columns, "."));
  size_t width = 1;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
      const Action& a = schedule.ranks[r][i];
      const std::string label = cell_label(a, show_stage);
      width = std::max(width, label.size());
      const size_t t0 = size_t(std::llround(timing.start[r][i]));
      const size_t units = a.kind == ActionKind::Backward ? 2 : 1;
      for (size_t t = t0; t < t0 + units && t < columns; ++t) cells[r][t] = label;
    }
  }

  std::ostringstream os;
  os << schedule_kind_name(schedule.kind) << " pp=" << schedule.pp
     << " v=" << schedule.stages_per_rank << " microbatches=" << schedule.microbatches
     << " makespan=" << timing.makespan << " (f=1 b=2 i=1 w=1) bubble:";
  for (size_t r = 0; r < timing.bubble_fraction.size(); ++r) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " r%zu=%.3f", r, timing.bubble_fraction[r]);
    os << buf;
  }
  os << "\n";
  // Rows wider than kMaxRowChars are cut into blocks of time columns, each headed by its span.
  constexpr size_t kMaxRowChars = 132;
  const size_t per_block = std::max<size_t>(1, kMaxRowChars / (width + 1));
  const std::string last_rank = std::to_string(schedule.ranks.size() - 1);
  for (size_t begin = 0; begin < std::max<size_t>(columns, 1); begin += per_block) {
    const size_t end = std::min(columns, begin + per_block);
    if (columns > per_block) os << (begin ? "\n" : "") << "t " << begin << ".." << end - 1 << ":\n";
    for (size_t r = 0; r < cells.size(); ++r) {
      std::string row = "rank " + std::to_string(r);
      row.append(last_rank.size() + 1 - std::to_string(r).size(), ' ');
      row += "|";
      for (size_t t = begin; t < end; ++t) {
        row += " " + cells[r][t];
        row.append(width - cells[r][t].size(), ' ');
      }
      row.erase(row.find_last_not_of(' ') + 1);
      os << row << "\n";
    }
  }
  return os.str();
}

}  // namespace mt::parallel::pipeline
