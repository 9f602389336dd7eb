// CommSummary and the Chrome trace events of communication records.
#include "parallel/comm/comm_report.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace mt::parallel {

std::string comm_group_label(const CommRecord& r) {
  std::string label = r.mesh_dim.empty() ? r.group : r.mesh_dim;
  if (r.members.empty()) return label;
  label += " [";
  for (size_t i = 0; i < r.members.size(); ++i) {
    if (i > 0) label += ',';
    label += std::to_string(r.members[i]);
  }
  return label + "]";
}

void CommSummary::add(const CommRecord& r) {
  Row& row = rows_[{r.collective, comm_group_label(r)}];
  row.calls += 1;
  row.bytes += r.size_bytes;
  row.seconds += r.seconds();
  const double busbw = r.busbw();
  if (busbw > 0) {
    row.busbw_sum += busbw;
    row.busbw_calls += 1;
  }
}

void CommSummary::add_step(double seconds, double exposed_seconds) {
  steps_ += 1;
  step_seconds_ += seconds;
  exposed_seconds_ += exposed_seconds;
}

std::string CommSummary::text() const {
  std::vector<std::pair<std::pair<std::string, std::string>, Row>> sorted(rows_.begin(),
                                                                          rows_.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.seconds > b.second.seconds;
  });
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "  %-20s %-40s %7s %12s %10s %10s %8s\n", "collective", "group",
                "calls", "MiB", "time(ms)", "busbw GB/s", "of step");
  out += line;
  for (const auto& [key, row] : sorted) {
    char busbw[32] = "-", share[32] = "-";
    if (row.busbw_calls > 0)
      std::snprintf(busbw, sizeof busbw, "%.3f", row.busbw_sum / double(row.busbw_calls) / 1e9);
    if (step_seconds_ > 0)
      std::snprintf(share, sizeof share, "%.1f%%", 100.0 * row.seconds / step_seconds_);
    std::snprintf(line, sizeof line, "  %-20s %-40s %7lld %12.2f %10.2f %10s %8s\n",
                  key.first.c_str(), key.second.c_str(), (long long)row.calls,
                  double(row.bytes) / double(1 << 20), row.seconds * 1e3, busbw, share);
    out += line;
  }
  if (steps_ > 0 && step_seconds_ > 0) {
    std::snprintf(line, sizeof line,
                  "  over %lld traced steps (%.3f s): exposed communication %.3f s = %.1f%% of "
                  "the step time (the time (ms) column counts async calls whole, overlapped or "
                  "not)\n",
                  (long long)steps_, step_seconds_, exposed_seconds_,
                  100.0 * exposed_seconds_ / step_seconds_);
    out += line;
  }
  return out;
}

std::vector<std::string> comm_chrome_events(const std::vector<CommRecord>& records, int pid,
                                            double origin_us, int first_tid) {
  std::map<std::string, int> tids;
  std::vector<std::string> events;
  for (const CommRecord& r : records) {
    const std::string track = "comm " + comm_group_label(r);
    auto [it, fresh] = tids.emplace(track, first_tid + int(tids.size()));
    if (fresh) {
      events.push_back(nlohmann::json{{"ph", "M"},
                                      {"name", "thread_name"},
                                      {"pid", pid},
                                      {"tid", it->second},
                                      {"args", {{"name", track}}}}
                           .dump());
    }
    nlohmann::json args = {{"bytes", r.size_bytes},
                           {"bytes_in", r.bytes_in},
                           {"bytes_out", r.bytes_out},
                           {"seq", r.seq},
                           {"async", r.async},
                           {"busbw_GBps", r.busbw() / 1e9},
                           {"algbw_GBps", r.algbw() / 1e9}};
    if (!r.serves.empty()) args["serves"] = r.serves;
    if (r.collective == "all_to_all_single") {
      args["off_rank_bytes"] = r.traffic().off_rank();
      args["send_bytes"] = r.send_bytes;
      args["recv_bytes"] = r.recv_bytes;
    }
    events.push_back(nlohmann::json{
        {"ph", "X"},
        {"name", r.name + " " + r.collective},
        {"cat", "comm"},
        {"pid", pid},
        {"tid", it->second},
        {"ts", r.start_us - origin_us},
        {"dur", r.end_us - r.start_us},
        {"args", args}}.dump());
  }
  return events;
}

}  // namespace mt::parallel
