// MpiProcessGroup on real ranks: run by CTest under `mpirun -np 2`, `-np 3` and `-np 4` (label
// "mpi"). Every test checks values against closed forms of the rank-dependent inputs; sizes are
// chosen so they do not split evenly over the ranks or into message chunks.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/comm_trace.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/in_order_p2p.h"

namespace mt::parallel {
namespace {

using runtime::bfloat16;
using runtime::DType;
using runtime::from_vector;

// Every dtype a collective moves, and those it reduces (bool is moved, never reduced).
constexpr DType kEveryDtype[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                 DType::I32, DType::I64, DType::Bool};
constexpr DType kReducibleDtypes[] = {DType::F32, DType::F64, DType::BF16,
                                      DType::F16, DType::I32, DType::I64};

MpiProcessGroup& world() {
  static std::unique_ptr<MpiProcessGroup> pg = MpiProcessGroup::world();
  return *pg;
}

// Restores the default message limit at scope exit.
struct ChunkLimit {
  explicit ChunkLimit(int64_t n) { set_max_message_elements(n); }
  ~ChunkLimit() { set_max_message_elements(INT_MAX); }
};

Tensor make(int64_t n, const runtime::Shape& shape, DType d, auto&& value_of) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value_of(i);
  return from_vector(v, shape, {d});
}

TEST(MpiProcessGroup, LaunchedWithSeveralRanks) {
  ASSERT_TRUE(MpiProcessGroup::launched_by_launcher()) << "run this test under mpirun";
  EXPECT_GE(world().size(), 2);
  EXPECT_GE(world().rank(), 0);
  EXPECT_LT(world().rank(), world().size());
}

TEST(MpiProcessGroup, AllReduceClosedForms) {
  const int R = world().rank(), W = world().size();
  for (DType d : kReducibleDtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      bool floating = runtime::is_floating(d);
      if (op == ReduceOp::Avg && !floating) continue;
      // 13 elements: no rank count divides them.
      Tensor t = make(13, {13}, d, [&](int64_t i) { return double((R + 1) * (i + 1)); });
      world().all_reduce(t, op, "ar");
      auto got = t.to_vector<double>();
      for (int64_t i = 0; i < 13; ++i) {
        double base = double(i + 1), expect = 0;
        switch (op) {
          case ReduceOp::Sum:
            expect = base * W * (W + 1) / 2;
            break;
          case ReduceOp::Avg:
            expect = base * (W + 1) / 2.0;
            break;
          case ReduceOp::Max:
            expect = base * W;
            break;
          case ReduceOp::Min:
            expect = base;
            break;
        }
        double tol = (d == DType::BF16 || d == DType::F16) ? std::abs(expect) * 1e-2 : 0.0;
        EXPECT_NEAR(got[size_t(i)], expect, tol) << d << " " << reduce_op_name(op) << " i=" << i;
      }
    }
  }
}

TEST(MpiProcessGroup, Bf16SumEqualsF32SumRounded) {
  const int R = world().rank();
  for (DType d : {DType::BF16, DType::F16}) {
    // Values exactly representable in the 16-bit type, so only the reduction rounds.
    Tensor x = make(64, {64}, d, [&](int64_t i) { return 1.0 + 0.37 * i + 0.013 * R; });
    Tensor x32 = x.to(DType::F32).clone();
    world().all_reduce(x, ReduceOp::Sum, "half");
    world().all_reduce(x32, ReduceOp::Sum, "f32");
    // f32 accumulation then one rounding: identical to rounding the f32 result.
    EXPECT_EQ(x.to_vector<double>(), x32.to(d).to_vector<double>()) << d;
  }
}

TEST(MpiProcessGroup, AllGatherReduceScatterRoundTrip) {
  const int R = world().rank(), W = world().size();
  Tensor in = make(6, {2, 3}, DType::F32, [&](int64_t i) { return 100.0 * R + double(i); });
  Tensor gathered = runtime::zeros({2 * W, 3}, {DType::F32});
  world().all_gather_into(gathered, in, "ag");
  auto g = gathered.to_vector<double>();
  for (int r = 0; r < W; ++r) {
    for (int i = 0; i < 6; ++i) EXPECT_EQ(g[size_t(r * 6 + i)], 100.0 * r + i) << r << " " << i;
  }
  // Every rank holds the same gathered tensor: avg-reduce-scatter returns each rank's input.
  Tensor back = runtime::zeros({2, 3}, {DType::F32});
  world().reduce_scatter_into(back, gathered, ReduceOp::Avg, "rs");
  EXPECT_EQ(back.to_vector<double>(), in.to_vector<double>());
  // Non-contiguous input (a transposed view) gathers its logical values.
  Tensor t_in = in.t();  // [3, 2]
  Tensor t_out = runtime::zeros({3 * W, 2}, {DType::F32});
  world().all_gather_into(t_out, t_in, "ag_t");
  EXPECT_EQ(t_out.narrow(0, 3 * R, 3).to_vector<double>(), t_in.to_vector<double>());
}

TEST(MpiProcessGroup, AllGatherAndBroadcastMoveEveryDtype) {
  const int R = world().rank(), W = world().size();
  for (DType d : kEveryDtype) {
    auto value = [&](int r, int64_t i) {
      return d == DType::Bool ? double((r + i) % 2) : double(7 * r + i);
    };
    // 5 elements per rank: an odd block size, so rank blocks start at odd offsets of `out`.
    Tensor in = make(5, {5}, d, [&](int64_t i) { return value(R, i); });
    Tensor out = runtime::zeros({5 * W}, {d});
    world().all_gather_into(out, in, "ag_dtypes");
    const auto g = out.to_vector<double>();
    for (int r = 0; r < W; ++r) {
      for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(g[size_t(r * 5 + i)], value(r, i)) << d;
    }
    Tensor b = make(5, {5}, d, [&](int64_t i) { return value(R, i); });
    world().broadcast(b, W - 1, "bcast_dtypes");
    const auto bv = b.to_vector<double>();
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(bv[size_t(i)], value(W - 1, i)) << d;
  }
}

TEST(MpiProcessGroup, ReduceScatterRankDependent) {
  const int R = world().rank(), W = world().size();
  for (DType d : kReducibleDtypes) {
    Tensor in = make(6 * W, {2 * W, 3}, d, [&](int64_t i) { return double(R + i); });
    Tensor sum = runtime::zeros({2, 3}, {d}), mx = runtime::zeros({2, 3}, {d});
    world().reduce_scatter_into(sum, in, ReduceOp::Sum, "rs_sum");
    world().reduce_scatter_into(mx, in, ReduceOp::Max, "rs_max");
    auto s = sum.to_vector<double>(), m = mx.to_vector<double>();
    for (int i = 0; i < 6; ++i) {
      double j = 6.0 * R + i;
      EXPECT_EQ(s[size_t(i)], W * j + W * (W - 1) / 2.0) << d;
      EXPECT_EQ(m[size_t(i)], j + W - 1) << d;
    }
  }
}

TEST(MpiProcessGroup, Broadcast) {
  const int R = world().rank(), W = world().size();
  for (DType d : kEveryDtype) {
    const int root = W - 1;
    Tensor t = make(10, {5, 2}, d, [&](int64_t i) { return R == root ? double(i % 2 + i) : 0; });
    world().broadcast(t, root, "bc");
    for (int i = 0; i < 10; ++i) {
      double expect = d == DType::Bool ? double(i % 2 + i != 0) : double(i % 2 + i);
      EXPECT_EQ(t.to_vector<double>()[size_t(i)], expect) << d;
    }
  }
}

// Element c of row k of the block from rank r to rank j: distinct small integers (exact in bf16
// and f16), and for bool a parity that differs between neighbouring blocks and rows.
double a2a_value(DType d, int r, int j, int k, int c) {
  return d == DType::Bool ? double((r + j + k + c) % 2) : double(32 * r + 8 * j + 2 * k + c);
}

// Rank r sends (r + 2j) % 3 rows of width 2 to rank j (zero rows included).
void check_uneven_all_to_all(bool async_op, DType d = DType::F64) {
  const int R = world().rank(), W = world().size();
  std::vector<int64_t> in_splits, out_splits;
  for (int j = 0; j < W; ++j) {
    in_splits.push_back((R + 2 * j) % 3);
    out_splits.push_back((j + 2 * R) % 3);
  }
  std::vector<double> in_v, expect;
  for (int j = 0; j < W; ++j) {
    for (int k = 0; k < in_splits[size_t(j)]; ++k) {
      for (int c = 0; c < 2; ++c) in_v.push_back(a2a_value(d, R, j, k, c));
    }
    for (int k = 0; k < out_splits[size_t(j)]; ++k) {
      for (int c = 0; c < 2; ++c) expect.push_back(a2a_value(d, j, R, k, c));
    }
  }
  Tensor in = from_vector(in_v, {int64_t(in_v.size() / 2), 2}, {d});
  // Prefilled with -1 (true for bool): rows left unwritten show up where it is not expected.
  Tensor out = runtime::full({int64_t(expect.size() / 2), 2}, d == DType::Bool ? 1.0 : -1.0, {d});
  world().all_to_all_single(out, in, out_splits, in_splits, "a2a", async_op).wait();
  EXPECT_EQ(out.to_vector<double>(), expect) << d;
}

TEST(MpiProcessGroup, AllToAllUneven) {
  for (DType d : kEveryDtype) {
    check_uneven_all_to_all(false, d);
  }
}

TEST(MpiProcessGroup, AllToAllMismatchedSplitsThrowOnEveryRank) {
  const int R = world().rank(), W = world().size();
  std::vector<int64_t> in_splits(size_t(W), 1), out_splits(size_t(W), 1);
  if (R == 0) out_splits[size_t(W - 1)] = 2;  // rank W-1 sends only one row to rank 0
  Tensor in = runtime::zeros({W, 2}, {DType::F32});
  Tensor out = runtime::zeros({R == 0 ? W + 1 : W, 2}, {DType::F32});
  EXPECT_THROW(world().all_to_all_single(out, in, out_splits, in_splits, "a2a_bad"), mt::Error);
}

TEST(MpiProcessGroup, SendRecvRing) {
  const int R = world().rank(), W = world().size();
  const int next = (R + 1) % W, prev = (R + W - 1) % W;
  for (DType d : kEveryDtype) {
    auto value = [&](int r, int64_t i) {
      return d == DType::Bool ? double((r + i) % 2) : 10.0 * r + double(i);
    };
    Tensor mine = make(15, {5, 3}, d, [&](int64_t i) { return value(R, i); });
    Tensor got = make(15, {5, 3}, d, [&](int64_t i) { return 1.0 - value(prev, i); });
    Work sent = world().send(mine, next, 7, "ring_send", /*async_op=*/true);
    world().recv(got, prev, 7, "ring_recv");
    sent.wait();
    auto g = got.to_vector<double>();
    for (int i = 0; i < 15; ++i) EXPECT_EQ(g[size_t(i)], value(prev, i)) << d << " i=" << i;
  }
}

// What each rank sends its neighbours in the crossing tests (n floats each way), and checks that
// what it received from them is theirs.
struct NeighbourPayloads {
  int next, prev;
  Tensor to_next, to_prev, from_prev, from_next;
  NeighbourPayloads(int rank, int size, int64_t n)
      : next((rank + 1) % size),
        prev((rank + size - 1) % size),
        to_next(make(n, {n}, DType::F32,
                     [&](int64_t i) { return 1000.0 * rank + double(i % 997); })),
        to_prev(make(n, {n}, DType::F32,
                     [&](int64_t i) { return -1000.0 * rank - double(i % 991); })),
        from_prev(runtime::zeros({n}, {DType::F32})),
        from_next(runtime::zeros({n}, {DType::F32})) {}
  void expect_received() const {
    const auto p = from_prev.to_vector<double>(), q = from_next.to_vector<double>();
    for (size_t i = 0; i < p.size(); i += 4099) {
      EXPECT_EQ(p[i], 1000.0 * prev + double(i % 997)) << "n=" << p.size() << " i=" << i;
      EXPECT_EQ(q[i], -1000.0 * next - double(i % 991)) << "n=" << p.size() << " i=" << i;
    }
  }
};

// isend / irecv (pipeline stages): every rank sends 4 MB (past MPI's eager limit: a blocking send
// would wait for its receive) to both neighbours before receiving from them, so blocking sends
// would deadlock; posted ones do not. Then in chunks of 3 elements, and a receive expecting more
// elements than arrive names what it got.
TEST(MpiProcessGroup, PostedSendsAndReceivesCrossWithoutDeadlock) {
  const int R = world().rank(), W = world().size();
  const int next = (R + 1) % W, prev = (R + W - 1) % W;
  for (int64_t n : {int64_t(1) << 20, int64_t(11)}) {
    std::optional<ChunkLimit> chunks;
    if (n == 11) chunks.emplace(3);
    const NeighbourPayloads m(R, W, n);
    std::vector<Work> works = {world().isend(m.to_next, next, 21, "cross_next"),
                               world().isend(m.to_prev, prev, 22, "cross_prev"),
                               world().irecv(m.from_prev, prev, 21, "cross_from_prev"),
                               world().irecv(m.from_next, next, 22, "cross_from_next")};
    for (const Work& w : works) w.wait();
    for (const Work& w : works) EXPECT_TRUE(w.is_completed());
    m.expect_received();
  }
  Work sent = world().isend(runtime::zeros({2}, {DType::F32}), next, 23, "short");
  Work got = world().irecv(runtime::zeros({4}, {DType::F32}), prev, 23, "short");
  sent.wait();
  try {
    got.wait();
    ADD_FAILURE() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 4 elements"), std::string::npos) << e.what();
  }
}

// batch_isend_irecv (the pipeline's rounds): each rank posts its sends to and receives from both
// neighbours as one batch, 4 MB each way, and gets one Work per op. A batch with one bad op posts
// nothing: the error names the op, and no message of the batch reaches the stats.
TEST(MpiProcessGroup, BatchedMessagesCrossAndABadOpPostsNothing) {
  const int R = world().rank(), W = world().size();
  const NeighbourPayloads m(R, W, int64_t(1) << 20);
  const int next = m.next, prev = m.prev;
  const Tensor &to_next = m.to_next, &from_prev = m.from_prev;
  using Op = ProcessGroup::P2POp;
  using Kind = Op::Kind;
  const std::vector<Work> works = world().batch_isend_irecv(
      {Op{Kind::Send, m.to_next, next, 31, "batch.to_next"},
       Op{Kind::Recv, m.from_next, next, 32, "batch.from_next"},
       Op{Kind::Send, m.to_prev, prev, 32, "batch.to_prev"},
       Op{Kind::Recv, m.from_prev, prev, 31, "batch.from_prev"}});
  ASSERT_EQ(works.size(), 4u);
  for (const Work& w : works) w.wait();
  m.expect_received();
  EXPECT_EQ(world().stats().at("batch.to_next").collective, "isend");
  EXPECT_EQ(world().stats().at("batch.from_prev").collective, "irecv");

  std::string message;
  try {
    world().batch_isend_irecv({Op{Kind::Send, to_next, next, 33, "bad_batch.first"},
                               Op{Kind::Recv, from_prev, W, 33, "bad_batch.second"}});
  } catch (const mt::Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("irecv on group"), std::string::npos) << message;
  EXPECT_NE(message.find("src must be another rank in [0, " + std::to_string(W) + "), got " +
                         std::to_string(W)),
            std::string::npos)
      << message;
  EXPECT_EQ(world().stats().count("bad_batch.first"), 0u);
  EXPECT_TRUE(world().batch_isend_irecv({}).empty());
}

// A batch may send to this rank itself, its receive in the same batch (what a one-GPU NCCL world
// can run of the batch path); one without its pair, or outside a batch, is an error posting
// nothing.
TEST(MpiProcessGroup, ABatchMaySendToItsOwnRank) {
  const int R = world().rank();
  using Op = ProcessGroup::P2POp;
  using Kind = Op::Kind;
  const Tensor mine = runtime::full({1000}, double(R + 7), {DType::F32});
  Tensor back = runtime::zeros({1000}, {DType::F32});
  for (const Work& w : world().batch_isend_irecv({Op{Kind::Recv, back, R, 41, "self.back"},
                                                  Op{Kind::Send, mine, R, 41, "self.mine"}}))
    w.wait();
  EXPECT_EQ(back.to_vector<float>(), mine.to_vector<float>());
  const std::string unpaired = testing::error_of(
      [&] { world().batch_isend_irecv({Op{Kind::Send, mine, R, 42, "self.alone"}}); });
  EXPECT_NE(unpaired.find("1 message(s) to this rank itself and 0 receive(s) from itself do not "
                          "pair up"),
            std::string::npos)
      << unpaired;
  EXPECT_EQ(world().stats().count("self.alone"), 0u);
  const std::string outside =
      testing::error_of([&] { world().isend(mine, R, 43, "self.outside"); });
  EXPECT_NE(outside.find("dst must be another rank"), std::string::npos) << outside;
}

// The in-order test group (tests/testing/in_order_p2p.h) behaves as NCCL's streams do: each rank
// posting a large isend to its next rank, then an irecv from its previous one, deadlocks (every
// send waits for a receive queued behind the peer's own send) and the first send to run out of
// time fails saying so (its receive then runs and frees the others); the same messages as one
// batch_isend_irecv complete.
TEST(InOrderPointToPoint, CrossingMessagesDeadlockUnlessBatched) {
  const int R = world().rank(), W = world().size();
  const int next = (R + 1) % W, prev = (R + W - 1) % W;
  auto mpi = std::shared_ptr<MpiProcessGroup>(
      dynamic_cast<MpiProcessGroup*>(world().split(0, R).release()));
  testing::InOrderPointToPointGroup g(mpi, std::chrono::milliseconds(1500));
  const int64_t n = int64_t(1) << 20;
  Tensor out = runtime::full({n}, double(R), {DType::F32});
  Tensor in = runtime::zeros({n}, {DType::F32});
  Work sent = g.isend(out, next, 1, "cross.send");
  Work received = g.irecv(in, prev, 1, "cross.recv");
  std::string message;
  try {
    sent.wait();
  } catch (const mt::Error& e) {
    message = e.what();
  }
  Tensor failed = runtime::full({1}, message.empty() ? 0.0 : 1.0, {DType::F64});
  world().all_reduce(failed, ReduceOp::Sum, "cross.failed");
  EXPECT_GE(failed.item<double>(), 1.0);
  EXPECT_TRUE(message.empty() || message.find("would deadlock on in-order streams") !=
                                     std::string::npos)
      << message;
  received.wait();  // the stuck sends complete once the receives behind them run
  EXPECT_EQ(in.to_vector<double>()[size_t(n - 1)], double(prev));
  using Op = ProcessGroup::P2POp;
  Tensor in2 = runtime::zeros({n}, {DType::F32});
  for (const Work& w : g.batch_isend_irecv({Op{Op::Kind::Send, out, next, 2, "batch.send"},
                                            Op{Op::Kind::Recv, in2, prev, 2, "batch.recv"}}))
    w.wait();
  EXPECT_EQ(in2.to_vector<double>()[0], double(prev));
  g.barrier("done");
}

// CommTrace on real ranks: an uneven all_to_all's record holds the bytes sent to and received from
// each rank (its split sizes), its off-rank traffic excludes its own block, and it has no busbw;
// an all_gather's record has the members and nccl-tests' busbw factor (n - 1) / n.
TEST(MpiProcessGroup, TracedCollectivesRecordTheirBytesPerPeer) {
  const int R = world().rank(), W = world().size();
  const int64_t row_bytes = 3 * 4;  // rows of 3 floats
  auto rows = [](int from, int to) { return int64_t(from + 2 * to + 1); };  // from -> to
  std::vector<int64_t> in_splits, out_splits;
  for (int j = 0; j < W; ++j) {
    in_splits.push_back(rows(R, j));
    out_splits.push_back(rows(j, R));
  }
  int64_t in_rows = 0, out_rows = 0;
  for (int j = 0; j < W; ++j) {
    in_rows += in_splits[size_t(j)];
    out_rows += out_splits[size_t(j)];
  }
  Tensor in = runtime::ones({in_rows, 3}, {DType::F32});
  Tensor out = runtime::zeros({out_rows, 3}, {DType::F32});
  Tensor gathered = runtime::zeros({int64_t(W) * 4}, {DType::F32});
  CommTrace::start();
  world().all_to_all_single(out, in, out_splits, in_splits, "uneven");
  world().all_gather_into(gathered, runtime::ones({4}, {DType::F32}), "ag");
  const std::vector<CommRecord> records = CommTrace::take();
  CommTrace::stop();
  ASSERT_EQ(records.size(), 2u);
  const CommRecord& a2a = records[0];
  std::vector<int> members(static_cast<size_t>(W));
  for (int j = 0; j < W; ++j) members[size_t(j)] = j;
  EXPECT_EQ(a2a.members, members);
  int64_t sent_off = 0, received_off = 0;
  for (int j = 0; j < W; ++j) {
    EXPECT_EQ(a2a.send_bytes[size_t(j)], rows(R, j) * row_bytes) << "to rank " << j;
    EXPECT_EQ(a2a.recv_bytes[size_t(j)], rows(j, R) * row_bytes) << "from rank " << j;
    if (j == R) continue;
    sent_off += rows(R, j) * row_bytes;
    received_off += rows(j, R) * row_bytes;
  }
  EXPECT_EQ(a2a.traffic().sent_off_rank, sent_off);
  EXPECT_EQ(a2a.traffic().received_off_rank, received_off);
  EXPECT_TRUE(a2a.uneven());
  EXPECT_EQ(a2a.busbw(), 0);
  const CommRecord& ag = records[1];
  EXPECT_EQ(ag.size_bytes, int64_t(W) * 16);
  EXPECT_EQ(ag.bytes_in, 16);
  EXPECT_EQ(ag.bytes_out, int64_t(W) * 16);
  EXPECT_DOUBLE_EQ(ag.busbw(), ag.algbw() * double(W - 1) / double(W));
}

// Posted messages while tracing: each gets a record once it is seen complete, with its peer, tag
// and bytes, its place in the issue order among the collectives, and when the caller first waited
// for it (none when is_completed() saw it done first); stats() counts them as before.
TEST(MpiProcessGroup, TracedPostedMessagesRecordWhenTheyWereWaitedFor) {
  const int R = world().rank(), W = world().size();
  const int next = (R + 1) % W, prev = (R + W - 1) % W;
  world().reset_stats();
  Tensor out = runtime::full({5, 2}, double(R), {DType::F32});
  Tensor in = runtime::zeros({5, 2}, {DType::F32});
  Tensor polled = runtime::zeros({3}, {DType::F64});
  CommTrace::start();
  Work sent = world().isend(out, next, 40, "ring.send");
  Work received = world().irecv(in, prev, 40, "ring.recv");
  world().barrier("between");
  received.wait();
  sent.wait();
  Work polled_send = world().isend(runtime::ones({3}, {DType::F64}), next, 41, "polled.send");
  Work polled_recv = world().irecv(polled, prev, 41, "polled.recv");
  while (!polled_recv.is_completed() || !polled_send.is_completed()) {
  }
  polled_send.wait();  // after is_completed() saw it done: not a wait for the trace
  const std::vector<CommRecord> records = CommTrace::take();
  CommTrace::stop();
  EXPECT_EQ(in.to_vector<double>(), std::vector<double>(10, double(prev)));
  ASSERT_EQ(records.size(), 5u);
  const CommRecord &s = records[0], &r = records[1], &b = records[2];
  EXPECT_EQ(s.collective, "isend");
  EXPECT_EQ(s.name, "ring.send");
  EXPECT_EQ(s.peer, next);
  EXPECT_EQ(s.tag, 40);
  EXPECT_EQ(s.bytes_in, 40);
  EXPECT_EQ(s.bytes_out, 0);
  EXPECT_EQ(s.in_storage, out.storage()->id());
  EXPECT_TRUE(s.async);
  EXPECT_EQ(r.collective, "irecv");
  EXPECT_EQ(r.peer, prev);
  EXPECT_EQ(r.out_shape, std::vector<int64_t>({5, 2}));
  EXPECT_EQ(r.out_storage, in.storage()->id());
  EXPECT_EQ(b.collective, "barrier");
  for (const CommRecord* p : {&s, &r}) {
    EXPECT_EQ(p->size_bytes, 40);
    EXPECT_EQ(p->dtype, "f32");
    EXPECT_EQ(p->group_size, W);
    EXPECT_EQ(p->busbw(), 0);
    EXPECT_LE(p->start_us, b.start_us);  // posted before the barrier,
    EXPECT_GE(p->waited_us, b.end_us);   // waited for after it,
    EXPECT_GE(p->end_us, p->waited_us);  // and complete once waited for
  }
  EXPECT_LT(s.issue, r.issue);
  EXPECT_LT(r.issue, b.issue);
  for (const CommRecord& p : {records[3], records[4]}) {
    EXPECT_EQ(p.tag, 41);
    EXPECT_EQ(p.waited_us, 0) << p.collective;
    EXPECT_GT(p.end_us, b.end_us);
  }
  EXPECT_EQ(polled.to_vector<double>(), std::vector<double>(3, 1.0));
  const auto stats = world().stats();
  EXPECT_EQ(stats.at("ring.send").collective, "isend");
  EXPECT_EQ(stats.at("ring.send").calls, 1);
  EXPECT_EQ(stats.at("ring.recv").bytes, 40);
}

TEST(MpiProcessGroup, RecvSizeMismatchThrows) {
  const int R = world().rank();
  if (R > 1) return;  // ranks 0 and 1 only; nothing collective below
  // Too long a message: MPI's own error (MPI_ERR_TRUNCATE) becomes mt::Error with its text and
  // the call's name.
  if (R == 0) {
    world().send(runtime::zeros({8}, {DType::F32}), 1, 11, "long");
  } else {
    Tensor small = runtime::zeros({4}, {DType::F32});
    try {
      world().recv(small, 0, 11, "long");
      FAIL() << "expected mt::Error";
    } catch (const mt::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("recv (MPI_Recv) 'long' on group mpi:world"), std::string::npos) << msg;
      EXPECT_NE(msg.find("MPI_ERR_TRUNCATE"), std::string::npos) << msg;
      EXPECT_NE(msg.find("the ranks called it with different sizes"), std::string::npos) << msg;
    }
  }
  // Too short a message: the received count is checked.
  if (R == 0) {
    world().send(runtime::zeros({2}, {DType::F32}), 1, 12, "short");
  } else {
    EXPECT_THROW(world().recv(runtime::zeros({4}, {DType::F32}), 0, 12, "short"), mt::Error);
  }
}

TEST(MpiProcessGroup, AsyncOpsGiveTheSameResults) {
  const int R = world().rank(), W = world().size();
  Tensor a = make(16, {16}, DType::F32, [&](int64_t i) { return double(R + i); });
  Tensor in = make(4, {4}, DType::F32, [&](int64_t i) { return double(R * 4 + i); });
  Tensor gathered = runtime::zeros({4 * W}, {DType::F32});
  Tensor b = make(3, {3}, DType::I64, [&](int64_t i) { return R == 0 ? double(i + 5) : 0.0; });
  std::vector<Work> works;
  works.push_back(world().all_reduce(a, ReduceOp::Sum, "async_ar", true));
  works.push_back(world().all_gather_into(gathered, in, "async_ag", true));
  works.push_back(world().broadcast(b, 0, "async_bc", true));
  for (const Work& w : works) w.wait();
  auto av = a.to_vector<double>(), gv = gathered.to_vector<double>(), bv = b.to_vector<double>();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(av[size_t(i)], W * double(i) + W * (W - 1) / 2.0);
  for (int i = 0; i < 4 * W; ++i) EXPECT_EQ(gv[size_t(i)], double(i));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bv[size_t(i)], double(i + 5));
  check_uneven_all_to_all(true);
  world().barrier("async_barrier", true).wait();
}

TEST(MpiProcessGroup, ChunkedMessagesMatchUnchunked) {
  ChunkLimit limit(3);  // every message below is split into chunks of 3 elements
  const int R = world().rank(), W = world().size();
  for (DType d : kReducibleDtypes) {
    Tensor a = make(10, {10}, d, [&](int64_t i) { return double((R + 1) * (i + 1)); });
    world().all_reduce(a, ReduceOp::Sum, "chunk_ar");
    auto av = a.to_vector<double>();
    for (int i = 0; i < 10; ++i) EXPECT_EQ(av[size_t(i)], double(i + 1) * W * (W + 1) / 2) << d;
  }
  Tensor in = make(7, {7}, DType::F32, [&](int64_t i) { return 100.0 * R + i; });
  Tensor g = runtime::zeros({7 * W}, {DType::F32});
  world().all_gather_into(g, in, "chunk_ag");
  auto gv = g.to_vector<double>();
  for (int r = 0; r < W; ++r) {
    for (int i = 0; i < 7; ++i) EXPECT_EQ(gv[size_t(r * 7 + i)], 100.0 * r + i);
  }
  Tensor back = runtime::zeros({7}, {DType::F32});
  world().reduce_scatter_into(back, g, ReduceOp::Sum, "chunk_rs");
  auto bv = back.to_vector<double>();
  for (int i = 0; i < 7; ++i) EXPECT_EQ(bv[size_t(i)], W * (100.0 * R + i));
  Tensor b = make(10, {10}, DType::I32, [&](int64_t i) { return R == 1 ? double(i * i) : -1.0; });
  world().broadcast(b, 1, "chunk_bc");
  auto bcv = b.to_vector<double>();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(bcv[size_t(i)], double(i * i));
  check_uneven_all_to_all(false);  // rows of 2: blocks of 4 elements are split
  const int next = (R + 1) % W, prev = (R + W - 1) % W;
  Tensor mine = make(11, {11}, DType::F64, [&](int64_t i) { return 10.0 * R + i; });
  Tensor got = runtime::zeros({11}, {DType::F64});
  Work sent = world().send(mine, next, 3, "chunk_send", true);
  world().recv(got, prev, 3, "chunk_recv");
  sent.wait();
  auto rv = got.to_vector<double>();
  for (int i = 0; i < 11; ++i) EXPECT_EQ(rv[size_t(i)], 10.0 * prev + i);
}

TEST(MpiProcessGroup, SplitByParity) {
  const int R = world().rank(), W = world().size();
  auto sub = world().split(R % 2, R);
  const int members = (W - R % 2 + 1) / 2;
  EXPECT_EQ(sub->size(), members);
  EXPECT_EQ(sub->rank(), R / 2);
  EXPECT_NE(sub->name().find("split"), std::string::npos);
  Tensor t = make(1, {1}, DType::I64, [&](int64_t) { return double(R); });
  sub->all_reduce(t, ReduceOp::Sum, "parity_sum");
  double expect = 0;
  for (int r = R % 2; r < W; r += 2) expect += r;
  EXPECT_EQ(t.item<double>(), expect);
}

TEST(MpiProcessGroup, ArgumentErrorsNameTheCollective) {
  const int W = world().size();
  Tensor in = runtime::zeros({2, 3}, {DType::F32});
  Tensor bad_out = runtime::zeros({2 * W + 1, 3}, {DType::F32});
  try {
    world().all_gather_into(bad_out, in, "ag_bad");
    FAIL() << "expected mt::Error";
  } catch (const mt::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("all_gather_into on group mpi:world"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  }
  EXPECT_THROW(world().reduce_scatter_into(in, in, ReduceOp::Sum, "rs_bad"), mt::Error);
  EXPECT_THROW(world().broadcast(in, W, "bc_bad"), mt::Error);
  EXPECT_THROW(world().send(in, world().rank(), 0, "send_self"), mt::Error);
  EXPECT_THROW(world().all_to_all_single(in, in, {2}, {2}, "a2a_bad"), mt::Error);
  world().barrier("after_errors");  // nothing above reached MPI: the ranks stay in step
}

TEST(MpiProcessGroup, StatsRecordNamesAndBytes) {
  auto pg = MpiProcessGroup::world();
  Tensor t = runtime::zeros({8}, {DType::F64});
  pg->all_reduce(t, ReduceOp::Sum, "grad");
  pg->all_reduce(t, ReduceOp::Sum, "grad", true).wait();
  auto stats = pg->stats();
  EXPECT_EQ(stats["grad"].calls, 2);
  EXPECT_EQ(stats["grad"].bytes, 2 * 8 * 8);
  EXPECT_EQ(stats["grad"].collective, "all_reduce");
}

}  // namespace
}  // namespace mt::parallel
