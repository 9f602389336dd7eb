// The timeout report's wording for each kind of peer: missing, ahead, silent, and send/recv.
#include "parallel/comm/timeout_report.h"

#include <gtest/gtest.h>

namespace mt::parallel {
namespace {

CollectiveRecord call(int64_t seq, const char* collective, const char* name, bool running) {
  return {seq, collective, name, running, {}};
}

TEST(TimeoutReport, ClassifiesEveryPeer) {
  const CollectiveRecord mine = call(5, "all_gather_into", "fsdp.all_gather", true);
  std::vector<PeerRecord> peers = {
      {1, 1, call(5, "all_gather_into", "fsdp.all_gather", true)},  // arrived
      {2, 6, call(4, "reduce_scatter_into", "fsdp.reduce_scatter", false)},
      {3, 7, call(6, "barrier", "x", true)},
      {4, 8, std::nullopt},
  };
  const std::string msg = describe_collective_timeout("mpi:world/split(0,0)", 0, 5, mine, 1.5,
                                                      peers, /*point_to_point=*/false);
  EXPECT_NE(msg.find("all_gather_into 'fsdp.all_gather' (call #5 on group mpi:world/split(0,0), "
                     "rank 0 of 5) did not complete within 1.5 s"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("ranks that did not arrive: 2 (world rank 6)\n"), std::string::npos) << msg;
  EXPECT_NE(msg.find("different collectives): 3 (world rank 7)\n"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did not answer (dead, or stuck where they cannot answer): 4 (world rank 8)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rank 1: call #5 all_gather_into 'fsdp.all_gather' (still running)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("rank 1 (world"), std::string::npos) << msg;  // same rank: not repeated
}

TEST(TimeoutReport, EveryoneArrived) {
  const CollectiveRecord mine = call(2, "all_reduce", "loss", true);
  std::vector<PeerRecord> peers = {{1, 1, call(2, "all_reduce", "loss", true)}};
  const std::string msg = describe_collective_timeout("mpi:world", 0, 2, mine, 300, peers, false);
  EXPECT_NE(msg.find("every rank of the group entered this call"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("did not arrive"), std::string::npos) << msg;
}

TEST(TimeoutReport, PointToPointDescribesThePeerOnly) {
  const CollectiveRecord mine = call(3, "recv", "pp.activations", true);
  std::vector<PeerRecord> peers = {{1, 1, call(1, "all_reduce", "warmup", false)}};
  const std::string msg = describe_collective_timeout("mpi:world", 0, 4, mine, 10, peers, true);
  EXPECT_EQ(msg.find("did not arrive"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1: call #1 all_reduce 'warmup' (finished)"), std::string::npos) << msg;
}

TEST(TimeoutReport, LimitIsProcessWideAndScoped) {
  const auto before = collective_timeout();
  {
    ScopedCollectiveTimeout scoped(std::chrono::milliseconds(0));
    EXPECT_EQ(collective_timeout().count(), 0);
  }
  EXPECT_EQ(collective_timeout(), before);
  EXPECT_THROW(set_collective_timeout(std::chrono::milliseconds(-1)), Error);
}

}  // namespace
}  // namespace mt::parallel
