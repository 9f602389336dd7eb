// mt_comm_report: the communication of a run traced with [comm] trace = true, from every rank's
// records (<dump_folder>/comm/rank-N.jsonl, parallel/comm/comm_trace.h):
//
//   mt_comm_report DUMP_FOLDER [--step S] [--trace OUT.json] [--calls]
//
// prints, over every rank, per collective and group: calls, bytes, time, mean busbw and share of
// the step time, then each rank's exposed communication, and for uneven all_to_alls (MoE
// dispatch, embedding exchange) the bottleneck rank of each call (the most off-rank bytes), per
// name (--calls: every call); and
// writes one Chrome trace of step S (default: the last traced) with a process per rank and a
// track per group (default path: DUMP_FOLDER/comm/trace-step-S.json).
#include "parallel/comm/comm_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "parallel/comm/comm_trace.h"
#include "runtime/core/error.h"
#include "tools/flags.h"

namespace {

using namespace mt;
namespace fs = std::filesystem;

struct RankTrace {
  int rank = 0;
  std::vector<parallel::TracedCollective> collectives;
  std::vector<parallel::TracedStep> steps;
};

std::vector<RankTrace> read_traces(const fs::path& dir) {
  MT_CHECK(fs::is_directory(dir), "mt_comm_report: no ", dir.string(),
           " (run train with --comm.trace true; this is <dump_folder>/comm)");
  std::vector<RankTrace> ranks;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::optional<int> rank =
        parallel::rank_of_file_name(entry.path().filename().string(), ".jsonl");
    if (!rank) continue;
    RankTrace t;
    t.rank = *rank;
    std::ifstream in(entry.path());
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      const std::string where = entry.path().string() + ":" + std::to_string(n);
      const auto parsed = parallel::parse_comm_trace_line(line, where);
      const int recorded = parsed.is_step ? parsed.step.rank : parsed.collective.rank;
      MT_CHECK(recorded == *rank, where, ": a record of rank ", recorded, " in the file of rank ",
               *rank, " (trace files are rank-<R>.jsonl, R the rank that wrote them)");
      if (parsed.is_step)
        t.steps.push_back(parsed.step);
      else
        t.collectives.push_back(parsed.collective);
    }
    ranks.push_back(std::move(t));
  }
  MT_CHECK(!ranks.empty(), "mt_comm_report: no rank-N.jsonl in ", dir.string());
  std::sort(ranks.begin(), ranks.end(),
            [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  // Ranks the calls name as members whose file is not here: the report covers the others.
  std::set<int> members, missing;
  for (const RankTrace& t : ranks)
    for (const auto& c : t.collectives)
      members.insert(c.record.members.begin(), c.record.members.end());
  for (int m : members) {
    const bool here = std::any_of(ranks.begin(), ranks.end(),
                                  [m](const RankTrace& t) { return t.rank == m; });
    if (!here) missing.insert(m);
  }
  if (!missing.empty()) {
    std::string list;
    for (int m : missing) list += (list.empty() ? "" : ", ") + std::to_string(m);
    std::fprintf(stderr,
                 "mt_comm_report: note: no trace of rank(s) %s in %s, though the traced calls "
                 "name them as members: the report covers the %zu rank(s) here\n",
                 list.c_str(), dir.string().c_str(), ranks.size());
  }
  return ranks;
}

// Each uneven all_to_all call (the same call on every member: step, members, seq): its
// bottleneck rank and that rank's off-rank bytes and bandwidth.
void print_uneven(const std::vector<RankTrace>& ranks, bool list_calls) {
  struct Call {
    std::string name;
    std::vector<std::pair<int, parallel::CommRecord>> on_rank;
  };
  std::map<std::tuple<int64_t, std::vector<int>, int64_t>, Call> calls;
  for (const RankTrace& t : ranks) {
    for (const auto& c : t.collectives) {
      if (!c.record.uneven()) continue;
      Call& call = calls[{c.step, c.record.members, c.record.seq}];
      call.name = c.record.name;
      call.on_rank.emplace_back(t.rank, c.record);
    }
  }
  if (calls.empty()) return;
  // Per name: how many calls, the bottleneck's mean off-rank bytes and bandwidth, and how often
  // each rank was the bottleneck.
  struct PerName {
    int64_t calls = 0, bytes = 0;
    double bandwidth = 0;
    std::map<int, int64_t> bottlenecks;
    bool incomplete = false;
  };
  std::map<std::string, PerName> by_name;
  for (const auto& [key, call] : calls) {
    int worst = -1;
    int64_t worst_bytes = -1;
    double seconds = 0;
    for (const auto& [rank, r] : call.on_rank) {
      seconds = std::max(seconds, r.seconds());
      if (r.traffic().off_rank() > worst_bytes) {
        worst_bytes = r.traffic().off_rank();
        worst = rank;
      }
    }
    PerName& p = by_name[call.name];
    p.calls += 1;
    p.bytes += worst_bytes;
    p.bandwidth += seconds > 0 ? double(worst_bytes) / seconds : 0.0;
    p.bottlenecks[worst] += 1;
    p.incomplete |= call.on_rank.size() < std::get<1>(key).size();
    if (list_calls) {
      std::printf("  step %lld %-28s seq %5lld: bottleneck rank %d, %lld B off-rank, %.3f GB/s\n",
                  (long long)std::get<0>(key), call.name.c_str(), (long long)std::get<2>(key),
                  worst, (long long)worst_bytes,
                  seconds > 0 ? double(worst_bytes) / seconds / 1e9 : 0.0);
    }
  }
  std::printf("  %-28s %7s %16s %16s  %s\n", "name", "calls", "bneck KiB (mean)",
              "bneck GB/s (mean)", "bottleneck rank: calls");
  for (const auto& [name, p] : by_name) {
    std::string ranks;
    for (const auto& [rank, n] : p.bottlenecks)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank) + ": " + std::to_string(n);
    std::printf("  %-28s %7lld %16.1f %16.3f  %s%s\n", name.c_str(), (long long)p.calls,
                double(p.bytes) / double(p.calls) / 1024.0, p.bandwidth / double(p.calls) / 1e9,
                ranks.c_str(), p.incomplete ? " (some members' records missing)" : "");
  }
}

void write_merged_trace(const std::vector<RankTrace>& ranks, int64_t step, const fs::path& path) {
  double origin = -1;
  std::map<int, std::vector<parallel::CommRecord>> per_rank;
  for (const RankTrace& t : ranks) {
    for (const auto& c : t.collectives) {
      if (c.step != step) continue;
      per_rank[t.rank].push_back(c.record);
      if (origin < 0 || c.record.start_us < origin) origin = c.record.start_us;
    }
  }
  MT_CHECK(!per_rank.empty(), "mt_comm_report: no collectives recorded at step ", step);
  std::ofstream f(path);
  MT_CHECK(f.good(), "mt_comm_report: cannot write ", path.string());
  f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  for (const auto& [rank, records] : per_rank) {
    f << (first ? "" : ",\n") << "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " << rank
      << ", \"args\": {\"name\": \"rank " << rank << "\"}}";
    first = false;
    for (const std::string& e : parallel::comm_chrome_events(records, rank, origin, 0))
      f << ",\n" << e;
  }
  f << "\n]}\n";
  MT_CHECK(f.good(), "mt_comm_report: writing ", path.string(), " failed");
  std::cout << "\nChrome trace of step " << step << " (" << per_rank.size()
            << " ranks): " << path.string() << "\n";
}

int run(int argc, char** argv) {
  tools::FlagReader flags("mt_comm_report", argc, argv);
  std::string dump, trace_path;
  int64_t step = -1;
  bool list_calls = false;
  while (flags.next()) {
    if (flags.is("--help") || flags.is("-h")) {
      std::cout << "usage: mt_comm_report DUMP_FOLDER [--step S] [--trace OUT.json] [--calls]\n";
      return 0;
    }
    if (flags.is("--step"))
      step = flags.int_value();
    else if (flags.is("--calls"))
      list_calls = true;
    else if (flags.is("--trace"))
      trace_path = flags.value();
    else if (flags.is_positional() && dump.empty())
      dump = flags.arg();
    else
      flags.unknown();
  }
  MT_CHECK(!dump.empty(), "mt_comm_report: give the run's dump folder (see --help)");
  const fs::path dir = fs::path(dump) / "comm";
  const std::vector<RankTrace> ranks = read_traces(dir);

  parallel::CommSummary all;
  for (const RankTrace& t : ranks) {
    for (const auto& c : t.collectives) all.add(c.record);
    for (const auto& s : t.steps) all.add_step(s.seconds, s.exposed_seconds);
  }
  std::cout << "communication of " << ranks.size() << " ranks (" << dir.string()
            << "), every rank's calls summed:\n"
            << all.text();
  std::cout << "\nexposed communication per rank:\n";
  for (const RankTrace& t : ranks) {
    double seconds = 0, exposed = 0;
    for (const auto& s : t.steps) {
      seconds += s.seconds;
      exposed += s.exposed_seconds;
    }
    std::printf("  rank %d: %.3f s of %.3f s (%.1f%%) over %zu steps\n", t.rank, exposed, seconds,
                seconds > 0 ? 100.0 * exposed / seconds : 0.0, t.steps.size());
  }
  print_uneven(ranks, list_calls);
  if (step < 0) {
    for (const RankTrace& t : ranks)
      for (const auto& c : t.collectives) step = std::max(step, c.step);
  }
  if (step >= 0) {
    const fs::path out = trace_path.empty() ? dir / ("trace-step-" + std::to_string(step) + ".json")
                                            : fs::path(trace_path);
    write_merged_trace(ranks, step, out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
