// Formats the collective-timeout report (see timeout_report.h).
#include "parallel/comm/timeout_report.h"

#include <sstream>

namespace mt::parallel {

namespace {

std::string describe_call(const CollectiveRecord& r) {
  if (r.seq < 0) return "has no such group (not created yet, or already destroyed)";
  if (r.seq == 0) return "no call yet on this group";
  std::ostringstream s;
  s << "call #" << r.seq << " " << r.collective << " '" << r.name << "' "
    << (r.running ? "(still running)" : "(finished)");
  return s.str();
}

std::string rank_list(const std::vector<const PeerRecord*>& peers) {
  std::ostringstream s;
  for (size_t i = 0; i < peers.size(); ++i) {
    s << (i ? ", " : "") << peers[i]->rank;
    if (peers[i]->world_rank != peers[i]->rank) s << " (world rank " << peers[i]->world_rank << ")";
  }
  return s.str();
}

}  // namespace

std::string describe_collective_timeout(const std::string& group, int rank, int group_size,
                                        const CollectiveRecord& mine, double timeout_seconds,
                                        const std::vector<PeerRecord>& peers,
                                        bool point_to_point) {
  std::ostringstream s;
  s << "collective timeout: " << mine.collective << " '" << mine.name << "' (call #" << mine.seq
    << " on group " << group << ", rank " << rank << " of " << group_size
    << ") did not complete within " << timeout_seconds << " s ([comm] timeout_seconds).";
  std::vector<const PeerRecord*> missing, silent, ahead;
  for (const PeerRecord& p : peers) {
    if (!p.record) {
      silent.push_back(&p);
    } else if (!point_to_point && p.record->seq < mine.seq) {
      missing.push_back(&p);
    } else if (!point_to_point && p.record->seq > mine.seq) {
      ahead.push_back(&p);
    }
  }
  if (!point_to_point) {
    if (missing.empty() && silent.empty() && ahead.empty()) {
      s << "\n  every rank of the group entered this call; it is stuck inside the library";
    } else if (!missing.empty()) {
      s << "\n  ranks that did not arrive: " << rank_list(missing);
    }
    if (!ahead.empty()) {
      s << "\n  ranks already past this call (the ranks issued different collectives): "
        << rank_list(ahead);
    }
  }
  if (!silent.empty()) {
    s << "\n  ranks that did not answer (dead, or stuck where they cannot answer): "
      << rank_list(silent);
  }
  for (const PeerRecord& p : peers) {
    if (!p.record) continue;
    s << "\n  rank " << p.rank << ": " << describe_call(*p.record);
  }
  s << "\nEnding every rank of the job.";
  return s.str();
}

}  // namespace mt::parallel
