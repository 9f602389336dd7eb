// Algorithm and bus bandwidth of collectives, by nccl-tests' definitions (its PERFORMANCE.md):
// algbw = size / time, and busbw = algbw x a factor that makes the number comparable to the
// hardware's peak whatever the rank count:
//   all_reduce                             2 (n - 1) / n
//   all_gather, reduce_scatter, all_to_all  (n - 1) / n
//   broadcast, send/recv (also posted)      1
// `size` is nccl-tests' per-rank size: the buffer for all_reduce, broadcast and send/recv, the
// gathered output for all_gather, the full input for reduce_scatter, and each rank's whole send
// buffer for all_to_all.
//
// An uneven all-to-all (MoE dispatch, embedding exchange) has no such factor: the ranks move
// different amounts. Its useful numbers are each rank's off-rank bytes (sent to and received from
// the other ranks, its own block excluded), that rank's off-rank bandwidth, and the bottleneck:
// the rank with the most off-rank bytes, which the collective waits for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::parallel {

// SendRecv: blocking send and recv; PostedSendRecv: isend and irecv posted together, then
// waited for (the pipeline's and the context-parallel ring's pattern).
enum class CollectiveKind {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  SendRecv,
  PostedSendRecv
};

const char* collective_kind_name(CollectiveKind kind);  // "all_reduce", ...
// Parses those names; throws naming the valid ones.
CollectiveKind collective_kind_from_name(const std::string& name);

double bus_factor(CollectiveKind kind, int64_t ranks);
double algbw_bytes_per_second(int64_t size_bytes, double seconds);
double busbw_bytes_per_second(CollectiveKind kind, int64_t ranks, int64_t size_bytes,
                              double seconds);

struct AllToAllTraffic {
  int64_t sent_off_rank = 0, received_off_rank = 0;
  int64_t off_rank() const { return sent_off_rank + received_off_rank; }
};
// One rank's off-rank traffic from the bytes it sends to and receives from each rank.
AllToAllTraffic all_to_all_traffic(const std::vector<int64_t>& send_bytes,
                                   const std::vector<int64_t>& recv_bytes, int64_t self);
// The rank with the most off-rank bytes (the first of equals).
int64_t bottleneck_rank(const std::vector<AllToAllTraffic>& ranks);

}  // namespace mt::parallel
