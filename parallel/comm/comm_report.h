// Summaries of communication records (comm_trace.h): per collective kind and group, the calls,
// bytes, time, mean busbw and share of the step time, as the trainer prints at the end of a run
// with [comm] trace and mt_comm_report prints from a dump folder; and Chrome trace events, one
// track per process group, for the profiler's trace of a step and for mt_comm_report's merged
// trace of every rank.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/comm_trace.h"

namespace mt::parallel {

class CommSummary {
 public:
  void add(const CommRecord& r);
  // Adds a traced step's wall time and the part of it the training thread was blocked in
  // collectives.
  void add_step(double seconds, double exposed_seconds);
  bool empty() const { return rows_.empty() && steps_ == 0; }

  // A table: one row per (collective, group), most time first, then the exposed share.
  std::string text() const;

 private:
  struct Row {
    int64_t calls = 0, bytes = 0;
    double seconds = 0, busbw_sum = 0;
    int64_t busbw_calls = 0;  // calls with a busbw (not uneven all_to_all, not barriers)
  };
  std::map<std::pair<std::string, std::string>, Row> rows_;  // (collective, group label)
  int64_t steps_ = 0;
  double step_seconds_ = 0, exposed_seconds_ = 0;
};

// The group as every member names it: "dp_shard [0,1]" (the mesh dimension, or the group's name
// when it has none, and the members' world ranks where known).
std::string comm_group_label(const CommRecord& r);

// Chrome trace events (JSON objects, comma-free) for the records of one process: each group on
// its own track (tid from first_tid up, named by a metadata event), times in microseconds
// relative to origin_us (wall clock), on process `pid`.
std::vector<std::string> comm_chrome_events(const std::vector<CommRecord>& records, int pid,
                                            double origin_us, int first_tid);

}  // namespace mt::parallel
