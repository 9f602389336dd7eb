// CommTrace on one process (the local world): a record per collective with its tensors, bytes,
// reduce op and peer; nccl-tests' busbw of each kind; an uneven all_to_all's per-peer bytes and
// off-rank traffic; purposes nest; exposed time counts the tracing thread only; the JSON lines
// round-trip and bad lines are errors naming the place; posted messages carry no bandwidth and
// get a wait node in execution traces.
#include "parallel/comm/comm_trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "parallel/comm/comm_report.h"
#include "parallel/comm/execution_trace.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"

namespace mt::parallel {
namespace {

using runtime::DType;
using runtime::Tensor;

struct TraceOn {
  TraceOn() { CommTrace::start(); }
  ~TraceOn() { CommTrace::stop(); }
};

TEST(CommTrace, RecordsEveryCallWithItsTensorsInIssueOrder) {
  auto world = MpiProcessGroup::world();
  world->set_mesh_dim("dp_shard");
  TraceOn on;
  Tensor a = runtime::ones({4, 3}, {DType::F32});
  Tensor gathered = runtime::zeros({4, 3}, {DType::F32});
  {
    ScopedCommPurpose purpose("layers.0");
    world->all_reduce(a, ReduceOp::Max, "t.reduce");
    world->all_gather_into(gathered, a, "t.gather", /*async_op=*/true).wait();
  }
  world->broadcast(a, 0, "t.bcast");
  const std::vector<CommRecord> records = CommTrace::take();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_TRUE(CommTrace::take().empty());  // taken once
  const CommRecord& r0 = records[0];
  EXPECT_EQ(r0.collective, "all_reduce");
  EXPECT_EQ(r0.name, "t.reduce");
  EXPECT_EQ(r0.serves, "layers.0");
  EXPECT_EQ(r0.mesh_dim, "dp_shard");
  EXPECT_EQ(r0.members, std::vector<int>({0}));
  EXPECT_EQ(r0.reduce_op, "max");
  EXPECT_EQ(r0.dtype, "f32");
  EXPECT_EQ(r0.in_shape, std::vector<int64_t>({4, 3}));
  EXPECT_EQ(r0.in_storage, a.storage()->id());
  EXPECT_EQ(r0.bytes_in, 48);
  EXPECT_EQ(r0.size_bytes, 48);
  EXPECT_FALSE(r0.async);
  EXPECT_LE(r0.start_us, r0.end_us);
  EXPECT_EQ(records[1].collective, "all_gather_into");
  EXPECT_TRUE(records[1].async);
  EXPECT_EQ(records[1].out_storage, gathered.storage()->id());
  EXPECT_NE(records[1].in_storage, records[1].out_storage);
  EXPECT_EQ(records[2].serves, "");  // outside the purpose's scope
  EXPECT_EQ(records[2].peer, 0);
  EXPECT_LT(records[0].issue, records[1].issue);
  EXPECT_LT(records[1].issue, records[2].issue);
  EXPECT_EQ(records[1].seq, records[0].seq + 1);
}

TEST(CommTrace, StorageIdsAreNeverReused) {
  uint64_t first = 0;
  {
    Tensor t = runtime::zeros({256}, {DType::F32});
    first = t.storage()->id();
  }
  Tensor u = runtime::zeros({256}, {DType::F32});  // the allocator may hand back the same block
  EXPECT_GT(u.storage()->id(), first);
}

CommRecord timed(const std::string& collective, int n, int64_t bytes, double seconds) {
  CommRecord r;
  r.collective = collective;
  r.group_size = n;
  r.size_bytes = bytes;
  r.start_us = 1e6;
  r.end_us = 1e6 + seconds * 1e6;
  return r;
}

TEST(CommTrace, BusBandwidthFollowsNcclTests) {
  // 1 MB in 1 ms is 1 GB/s of algbw; the bus factor depends on the kind and the group size.
  EXPECT_DOUBLE_EQ(timed("all_reduce", 4, 1000000, 1e-3).algbw(), 1e9);
  EXPECT_DOUBLE_EQ(timed("all_reduce", 4, 1000000, 1e-3).busbw(), 1.5e9);
  EXPECT_DOUBLE_EQ(timed("all_gather_into", 4, 1000000, 1e-3).busbw(), 0.75e9);
  EXPECT_DOUBLE_EQ(timed("reduce_scatter_into", 2, 1000000, 1e-3).busbw(), 0.5e9);
  EXPECT_DOUBLE_EQ(timed("all_to_all_single", 4, 1000000, 1e-3).busbw(), 0.75e9);
  EXPECT_DOUBLE_EQ(timed("broadcast", 8, 1000000, 1e-3).busbw(), 1e9);
  EXPECT_DOUBLE_EQ(timed("send", 2, 1000000, 1e-3).busbw(), 1e9);
  EXPECT_EQ(timed("barrier", 4, 0, 1e-3).busbw(), 0);
  // A posted message's time overlaps the caller's compute: no bandwidth, but a kind.
  for (const char* posted : {"isend", "irecv"}) {
    const CommRecord r = timed(posted, 2, 1000000, 1e-3);
    EXPECT_TRUE(r.posted());
    EXPECT_EQ(r.kind(), CollectiveKind::PostedSendRecv);
    EXPECT_EQ(r.algbw(), 0) << posted;
    EXPECT_EQ(r.busbw(), 0) << posted;
  }
  EXPECT_FALSE(timed("send", 2, 1000000, 1e-3).posted());
}

TEST(CommTrace, UnevenAllToAllKeepsPerPeerBytesAndNoBusbw) {
  CommRecord r = timed("all_to_all_single", 3, 600, 1e-3);
  r.group_rank = 1;
  r.send_bytes = {200, 200, 200};
  r.recv_bytes = {200, 200, 200};
  EXPECT_FALSE(r.uneven());
  EXPECT_GT(r.busbw(), 0);
  r.send_bytes = {100, 50, 450};
  r.recv_bytes = {10, 20, 30};
  EXPECT_TRUE(r.uneven());
  EXPECT_EQ(r.busbw(), 0);
  EXPECT_EQ(r.traffic().sent_off_rank, 550);  // its own block (50) excluded
  EXPECT_EQ(r.traffic().received_off_rank, 40);
  // Recorded from a real call: the split sizes in bytes.
  auto world = MpiProcessGroup::world();
  TraceOn on;
  Tensor in = runtime::ones({5, 2}, {DType::F32}), out = runtime::zeros({5, 2}, {DType::F32});
  world->all_to_all_single(out, in, {5}, {5}, "t.a2a");
  const std::vector<CommRecord> got = CommTrace::take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].send_bytes, std::vector<int64_t>({40}));
  EXPECT_EQ(got[0].recv_bytes, std::vector<int64_t>({40}));
  EXPECT_EQ(got[0].traffic().off_rank(), 0);
}

TEST(CommTrace, ExposedTimeCountsTheTracingThreadOnly) {
  TraceOn on;
  {
    ExposedCommScope blocked;
    ExposedCommScope nested;  // a sync call waiting on its Work: counted once
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::thread other([] {
    ExposedCommScope blocked;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  other.join();
  const double s = CommTrace::take_exposed_seconds();
  EXPECT_GE(s, 0.019);
  EXPECT_LT(s, 0.039);  // counted twice (nested) it would be >= 0.04
  EXPECT_EQ(CommTrace::take_exposed_seconds(), 0);
}

TEST(CommTrace, JsonLinesRoundTripAndBadLinesAreErrors) {
  CommRecord r = timed("all_to_all_single", 2, 96, 2e-3);
  r.issue = 7;
  r.seq = 3;
  r.name = "ep.dispatch";
  r.serves = "layers.1.moe";
  r.group = "mpi:world/split(0,1)";
  r.mesh_dim = "ep";
  r.members = {2, 3};
  r.group_rank = 1;
  r.dtype = "bf16";
  r.in_shape = {6, 4};
  r.out_shape = {5, 4};
  r.in_storage = 11;
  r.out_storage = 12;
  r.bytes_in = 48;
  r.bytes_out = 40;
  r.send_bytes = {16, 32};
  r.recv_bytes = {24, 16};
  r.async = true;
  r.waited_us = 1.0005e6;
  r.device_timed = true;
  r.batch = 7;
  const CommTraceLine l = parse_comm_trace_line(comm_record_json(r, 5, 3), "x");
  ASSERT_FALSE(l.is_step);
  EXPECT_EQ(l.collective.step, 5);
  EXPECT_EQ(l.collective.rank, 3);
  const CommRecord& g = l.collective.record;
  EXPECT_EQ(comm_record_json(g, 5, 3), comm_record_json(r, 5, 3));
  EXPECT_EQ(g.members, r.members);
  EXPECT_EQ(g.send_bytes, r.send_bytes);
  EXPECT_EQ(g.waited_us, r.waited_us);
  EXPECT_TRUE(g.device_timed);
  EXPECT_EQ(g.batch, 7);
  // Schema 3 lines (before batches were numbered) are in no batch.
  nlohmann::json v3 = nlohmann::json::parse(comm_record_json(r, 5, 3));
  v3["schema"] = 3;
  v3.erase("batch");
  EXPECT_EQ(parse_comm_trace_line(v3.dump(), "x").collective.record.batch, 0);
  // Schema 2 lines (before device times) are host-timed.
  nlohmann::json v2 = nlohmann::json::parse(comm_record_json(r, 5, 3));
  v2["schema"] = 2;
  v2.erase("device_timed");
  v2.erase("batch");
  EXPECT_FALSE(parse_comm_trace_line(v2.dump(), "x").collective.record.device_timed);
  // Schema 1 lines (written before posted messages were traced) have no waited_us.
  nlohmann::json v1 = nlohmann::json::parse(comm_record_json(r, 5, 3));
  v1["schema"] = 1;
  v1.erase("waited_us");
  v1.erase("device_timed");
  v1.erase("batch");
  const CommRecord old = parse_comm_trace_line(v1.dump(), "x").collective.record;
  EXPECT_EQ(old.waited_us, 0);
  EXPECT_EQ(old.recv_bytes, r.recv_bytes);
  const CommTraceLine s = parse_comm_trace_line(comm_step_json({4, 1, 0.5, 0.1}), "x");
  ASSERT_TRUE(s.is_step);
  EXPECT_EQ(s.step.step, 4);
  EXPECT_DOUBLE_EQ(s.step.exposed_seconds, 0.1);
  // A call that ends before it starts would sum negative times into the report.
  nlohmann::json backwards = nlohmann::json::parse(comm_record_json(r, 5, 3));
  backwards["end_us"] = backwards["start_us"].get<double>() - 4e12;
  EXPECT_NE(testing::error_of([&] { parse_comm_trace_line(backwards.dump(), "rank-0.jsonl:3"); })
                .find("rank-0.jsonl:3: the call ends (end_us"),
            std::string::npos);
  for (const std::string bad :
       {"{", "[1]", R"({"schema": 99, "type": "step"})",
        R"({"schema": 1, "type": "collective", "step": 1})", R"({"schema": 1, "type": "lunch"})"}) {
    try {
      (void)parse_comm_trace_line(bad, "rank-0.jsonl:7");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const mt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank-0.jsonl:7"), std::string::npos) << e.what();
    }
  }
}

// A record a backend timed on its device gets those times when taken (the host's stay where the
// device could not time the call), and the bandwidth follows them.
TEST(CommTrace, TakeReplacesHostTimesWithDeviceTimes) {
  struct Fixed : DeviceTimes {
    std::optional<std::pair<double, double>> times;
    std::optional<std::pair<double, double>> wall_us() const override { return times; }
  };
  TraceOn on;
  CommRecord timed_on_device = timed("all_reduce", 2, 1 << 20, 5e-3);
  timed_on_device.issue = CommTrace::next_issue();
  auto device = std::make_shared<Fixed>();
  device->times = std::pair{timed_on_device.start_us + 1000, timed_on_device.start_us + 2000};
  timed_on_device.device_times = device;
  CommRecord untimed = timed_on_device;
  untimed.issue = CommTrace::next_issue();
  untimed.device_times = std::make_shared<Fixed>();  // nullopt: the call failed
  CommTrace::add(timed_on_device);
  CommTrace::add(untimed);
  const std::vector<CommRecord> taken = CommTrace::take();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_TRUE(taken[0].device_timed);
  EXPECT_FALSE(taken[0].device_times);
  EXPECT_DOUBLE_EQ(taken[0].start_us, timed_on_device.start_us + 1000);
  EXPECT_DOUBLE_EQ(taken[0].end_us, timed_on_device.start_us + 2000);
  EXPECT_DOUBLE_EQ(taken[0].algbw(), double(1 << 20) / 1e-3);
  EXPECT_FALSE(taken[1].device_timed);
  EXPECT_DOUBLE_EQ(taken[1].start_us, timed_on_device.start_us);
  EXPECT_DOUBLE_EQ(taken[1].end_us, timed_on_device.end_us);
}

TEST(CommTrace, SummaryAndChromeTracksPerGroup) {
  CommRecord a = timed("all_gather_into", 2, 1000000, 1e-3);
  a.name = "fsdp.all_gather";
  a.mesh_dim = "dp_shard";
  a.members = {0, 1};
  CommRecord b = a;
  b.mesh_dim = "tp";
  b.members = {0, 2};
  CommSummary summary;
  summary.add(a);
  summary.add(a);
  summary.add(b);
  summary.add_step(0.01, 0.002);
  const std::string text = summary.text();
  EXPECT_NE(text.find("dp_shard [0,1]"), std::string::npos) << text;
  EXPECT_NE(text.find("tp [0,2]"), std::string::npos) << text;
  EXPECT_NE(text.find("20.0%"), std::string::npos) << text;  // 2 ms of a 10 ms step, dp_shard
  EXPECT_NE(text.find("= 20.0% of the step time"), std::string::npos) << text;
  const std::vector<std::string> events = comm_chrome_events({a, b, a}, 3, 1e6, 10);
  ASSERT_EQ(events.size(), 5u);  // two track names, three calls
  EXPECT_NE(events[0].find("\"tid\":10"), std::string::npos) << events[0];
  EXPECT_NE(events[2].find("\"tid\":11"), std::string::npos) << events[2];
  EXPECT_NE(events[4].find("\"tid\":10"), std::string::npos) << events[4];
}

// A posted message in an execution trace: its node where it was posted, and a wait node where
// the step first waited for it (after the post even within the same microsecond); a message
// never waited for (only tested) has no wait node; both survive the JSON file.
TEST(ExecutionTrace, PostedMessagesHaveAWaitNodeAfterThem) {
  runtime::ProfileReport ops;
  ops.wall_start_us = 1e6;
  CommRecord sent = timed("isend", 2, 64, 3e-4);
  sent.issue = 4;
  sent.issued_us = sent.start_us;
  sent.waited_us = sent.start_us;  // waited at once
  sent.members = {0, 1};
  sent.peer = 1;
  sent.tag = 9;
  CommRecord received = sent;
  received.collective = "irecv";
  received.issue = 5;
  received.waited_us = 0;  // seen complete by is_completed() only
  CommRecord reduced = timed("all_reduce", 2, 8, 1e-4);
  reduced.issue = 6;
  reduced.issued_us = reduced.start_us + 10;
  const ExecutionTrace t = make_execution_trace(ops, {sent, received, reduced}, 0, 2, 3);
  ASSERT_EQ(t.nodes.size(), 4u);
  EXPECT_EQ(t.nodes[0].name, "isend");
  EXPECT_EQ(t.nodes[1].type, TraceNode::Type::Wait);
  EXPECT_EQ(t.nodes[1].waits_for, t.nodes[0].id);
  EXPECT_DOUBLE_EQ(t.nodes[1].dur_us, 300);  // blocked from the wait to the completion
  EXPECT_EQ(t.nodes[2].name, "irecv");
  EXPECT_EQ(t.nodes[3].name, "all_reduce");
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / "mt_posted_execution_trace.json";
  write_execution_trace(t, file.string());
  const ExecutionTrace back = read_execution_trace(file.string());
  std::filesystem::remove(file);
  ASSERT_EQ(back.nodes.size(), 4u);
  EXPECT_EQ(back.schema, kExecutionTraceSchema);
  EXPECT_EQ(back.nodes[1].type, TraceNode::Type::Wait);
  EXPECT_EQ(back.nodes[1].waits_for, 1);
  EXPECT_EQ(back.nodes[2].collective.collective, "irecv");
  EXPECT_EQ(back.nodes[2].collective.tag, 9);
}

// Each rank's trace file is rank-<R><extension>; only such names give a rank back.
TEST(CommTrace, RankFileNamesRoundTrip) {
  EXPECT_EQ(rank_file_name(12, ".jsonl"), "rank-12.jsonl");
  EXPECT_EQ(rank_of_file_name(rank_file_name(12, ".jsonl"), ".jsonl"), 12);
  EXPECT_EQ(rank_of_file_name("rank-0.json", ".json"), 0);
  for (const char* other : {"rank-.json", "rank-1.jsonl", "rank-1a.json", "rank--1.json",
                            "xrank-1.json", "rank-1.json.bak", "rank-12345678901.json"}) {
    EXPECT_EQ(rank_of_file_name(other, ".json"), std::nullopt) << other;
  }
}

}  // namespace
}  // namespace mt::parallel
