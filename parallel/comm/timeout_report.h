// The message a rank prints when one of its collectives runs out of time: which call, which
// group, and where every other member is (its last call on the group), so a user sees at once
// which ranks did not arrive. Backend-agnostic: MPI today, NCCL later.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace mt::parallel {

struct PeerRecord {
  int rank = 0;                            // rank in the group
  int world_rank = 0;                      // rank in the launch
  std::optional<CollectiveRecord> record;  // nullopt: the rank did not answer
};

// `mine` is the timed-out call. For a collective, a peer whose sequence number is below mine did
// not arrive; for send/recv (`point_to_point`) the peers are the other side and are only
// described.
std::string describe_collective_timeout(const std::string& group, int rank, int group_size,
                                        const CollectiveRecord& mine, double timeout_seconds,
                                        const std::vector<PeerRecord>& peers,
                                        bool point_to_point);

}  // namespace mt::parallel
