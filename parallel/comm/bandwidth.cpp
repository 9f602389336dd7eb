// nccl-tests' bandwidth definitions and uneven all-to-all traffic.
#include "parallel/comm/bandwidth.h"

#include "runtime/core/error.h"

namespace mt::parallel {

namespace {

struct KindName {
  CollectiveKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {CollectiveKind::AllReduce, "all_reduce"},         {CollectiveKind::AllGather, "all_gather"},
    {CollectiveKind::ReduceScatter, "reduce_scatter"}, {CollectiveKind::AllToAll, "all_to_all"},
    {CollectiveKind::Broadcast, "broadcast"},          {CollectiveKind::SendRecv, "sendrecv"},
    {CollectiveKind::PostedSendRecv, "isend_irecv"},
};

}  // namespace

const char* collective_kind_name(CollectiveKind kind) {
  for (const KindName& k : kKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

CollectiveKind collective_kind_from_name(const std::string& name) {
  std::string valid;
  for (const KindName& k : kKinds) {
    if (name == k.name) return k.kind;
    valid += (valid.empty() ? "" : ", ") + std::string(k.name);
  }
  MT_FAIL("unknown collective '", name, "'; valid: ", valid);
}

double bus_factor(CollectiveKind kind, int64_t ranks) {
  MT_CHECK(ranks >= 1, "bus_factor: expected ranks >= 1, got ", ranks);
  const double n = double(ranks);
  switch (kind) {
    case CollectiveKind::AllReduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll: return (n - 1) / n;
    case CollectiveKind::Broadcast:
    case CollectiveKind::SendRecv:
    case CollectiveKind::PostedSendRecv: return 1.0;
  }
  return 1.0;
}

double algbw_bytes_per_second(int64_t size_bytes, double seconds) {
  MT_CHECK(seconds > 0, "algbw: expected a positive time, got ", seconds);
  return double(size_bytes) / seconds;
}

double busbw_bytes_per_second(CollectiveKind kind, int64_t ranks, int64_t size_bytes,
                              double seconds) {
  return algbw_bytes_per_second(size_bytes, seconds) * bus_factor(kind, ranks);
}

AllToAllTraffic all_to_all_traffic(const std::vector<int64_t>& send_bytes,
                                   const std::vector<int64_t>& recv_bytes, int64_t self) {
  MT_CHECK(send_bytes.size() == recv_bytes.size() && self >= 0 &&
               self < int64_t(send_bytes.size()),
           "all_to_all_traffic: expected one send and one receive size per rank and self in "
           "range, got ", send_bytes.size(), " and ", recv_bytes.size(), " sizes, self ", self);
  AllToAllTraffic t;
  for (size_t j = 0; j < send_bytes.size(); ++j) {
    if (int64_t(j) == self) continue;
    t.sent_off_rank += send_bytes[j];
    t.received_off_rank += recv_bytes[j];
  }
  return t;
}

int64_t bottleneck_rank(const std::vector<AllToAllTraffic>& ranks) {
  MT_CHECK(!ranks.empty(), "bottleneck_rank: no ranks");
  int64_t best = 0;
  for (size_t r = 1; r < ranks.size(); ++r)
    if (ranks[r].off_rank() > ranks[size_t(best)].off_rank()) best = int64_t(r);
  return best;
}

}  // namespace mt::parallel
