// nccl-tests' bandwidth definitions on known sizes, and uneven all-to-all traffic from split sizes.
#include "parallel/comm/bandwidth.h"

#include <gtest/gtest.h>

#include "runtime/core/error.h"

namespace mt::parallel {
namespace {

TEST(Bandwidth, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllReduce, 4), 1.5);       // 2 (n - 1) / n
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllGather, 4), 0.75);      // (n - 1) / n
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::ReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::AllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::SendRecv, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveKind::PostedSendRecv, 4), 1.0);
}

TEST(Bandwidth, AlgbwAndBusbwOfKnownSizes) {
  // 1 GB in 0.5 s: algbw 2 GB/s; an all_reduce on 4 ranks moves 1.5x that per link.
  EXPECT_DOUBLE_EQ(algbw_bytes_per_second(1000000000, 0.5), 2e9);
  EXPECT_DOUBLE_EQ(busbw_bytes_per_second(CollectiveKind::AllReduce, 4, 1000000000, 0.5), 3e9);
  EXPECT_DOUBLE_EQ(busbw_bytes_per_second(CollectiveKind::AllGather, 2, 1 << 20, 1e-3),
                   double(1 << 20) / 1e-3 * 0.5);
  EXPECT_THROW(algbw_bytes_per_second(8, 0.0), Error);
}

TEST(Bandwidth, UnevenAllToAllCountsOffRankBytesOnly) {
  // Rank 1 of 3 sends 10, 20, 30 bytes and receives 5, 6, 7: its own block (20, 6) is local.
  const AllToAllTraffic t = all_to_all_traffic({10, 20, 30}, {5, 6, 7}, 1);
  EXPECT_EQ(t.sent_off_rank, 40);
  EXPECT_EQ(t.received_off_rank, 12);
  EXPECT_EQ(t.off_rank(), 52);
  EXPECT_EQ(bottleneck_rank({{1, 1}, {40, 12}, {30, 30}}), 2);
  EXPECT_EQ(bottleneck_rank({{5, 5}, {10, 0}}), 0);  // the first of equals
  EXPECT_THROW(all_to_all_traffic({1, 2}, {1}, 0), Error);
}

TEST(Bandwidth, CollectiveNamesRoundTrip) {
  for (CollectiveKind k : {CollectiveKind::AllReduce, CollectiveKind::AllGather,
                           CollectiveKind::ReduceScatter, CollectiveKind::AllToAll,
                           CollectiveKind::Broadcast, CollectiveKind::SendRecv,
                           CollectiveKind::PostedSendRecv}) {
    EXPECT_EQ(collective_kind_from_name(collective_kind_name(k)), k);
  }
  try {
    collective_kind_from_name("allreduce");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce, all_gather"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::parallel
