// Execution traces and their replay on real ranks: a profiled FSDP step of a 2-layer Llama,
// traced with [profiling] execution_trace, lists its kernels with their tensors and exactly the
// FSDP collectives (2 x layers all-gathers, layers + 1 reduce-scatters, one clip all-reduce);
// replaying it issues the same collectives (kind, group, dtype, shapes, sizes, async or not) in
// the same order, as CommTrace sees them, the async ones waited for where the step waited; lazy
// allocation peaks lower than pre-allocation with the same outputs;
// --scale-bytes 2 doubles every size; with compute (mt_replay --all) every kernel is re-run by
// name from its recorded arguments between the same collectives, with and without overlapping
// the async ones (the same values either way); a pipelined step's posted
// isend / irecv replay in their place and complete where the step waited; the context-parallel
// ring's batches replay as batches, also on in-order streams (NCCL's semantics); bad traces are
// errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <map>
#include <set>

#include "parallel/comm/comm_trace.h"
#include "parallel/comm/execution_trace.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/replay.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"
#include "tests/testing/in_order_p2p.h"
#include "tests/testing/mpi_fixtures.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/trainer_fixtures.h"
#include "train/config/load.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using parallel::CommRecord;
using parallel::ExecutionTrace;
using parallel::TraceNode;

std::shared_ptr<parallel::ProcessGroup> world() {
  static std::shared_ptr<parallel::ProcessGroup> pg(parallel::MpiProcessGroup::world());
  return pg;
}

// The traced runs: FSDP over every rank; a 2-stage pipeline (1F1B, 2 micro-batches per dp rank)
// whose activations and gradients move by posted isend / irecv; context parallelism over every
// rank with the ring (each pass one batch_isend_irecv).
enum class Run { Fsdp, Pipeline, Ring };

// Every rank's trace of step 2 of a traced run (trained once per process).
const std::vector<ExecutionTrace>& traces(const fs::path& corpus, Run run = Run::Fsdp) {
  static std::map<Run, std::vector<ExecutionTrace>> cache;
  if (auto it = cache.find(run); it != cache.end()) return it->second;
  const std::string name = run == Run::Fsdp ? "run" : run == Run::Pipeline ? "pipeline" : "ring";
  const fs::path dump = testing::shared_dir(*world(), "mt_replay_mpi", name);
  const fs::path tokenizer = testing::shared_small_tokenizer(*world(), "mt_replay_mpi", corpus);
  const int64_t dp = run == Run::Fsdp       ? world()->size()
                     : run == Run::Pipeline ? world()->size() / 2
                                            : 1;
  std::vector<std::string> args = {
      "--job.dump_folder=" + dump.string(), "--model.tokenizer_path=" + tokenizer.string(),
      "--training.dataset_path=" + corpus.string(),
      "--training.local_batch_size=" + std::to_string(8 / dp), "--training.global_batch_size=8",
      "--training.seq_len=32", "--training.steps=2", "--training.max_norm=0.5",
      "--training.mixed_precision_param=float32", "--profiling.enable=true",
      "--profiling.profile_freq=2", "--profiling.execution_trace=true"};
  if (run == Run::Pipeline) {
    args.insert(args.end(), {"--parallelism.pipeline_parallel_degree=2",
                             "--parallelism.pipeline_parallel_schedule=1F1B",
                             "--parallelism.pipeline_parallel_microbatch_size=" +
                                 std::to_string(8 / dp / 2)});
  }
  if (run == Run::Ring) {
    args.insert(args.end(), {"--parallelism.context_parallel_degree=" +
                                 std::to_string(world()->size()),
                             "--parallelism.context_parallel_rotate_method=alltoall"});
  }
  TrainerOptions options;
  options.edit_model_args = testing::shrink_llama;
  options.quiet = true;
  options.handle_signals = false;
  options.write_files = false;
  options.world = world();
  Trainer(config::load_config(fs::path(), args), options).train();
  world()->barrier("traces written");
  std::vector<ExecutionTrace>& out = cache[run];
  for (int r = 0; r < world()->size(); ++r) {
    out.push_back(parallel::read_execution_trace(
        (dump / "profile_traces" / "execution_trace" / "step_2" /
         ("rank-" + std::to_string(r) + ".json"))
            .string()));
  }
  return out;
}

std::vector<CommRecord> collectives_of(const ExecutionTrace& t) {
  std::vector<CommRecord> out;
  for (const TraceNode& n : t.nodes)
    if (n.type == TraceNode::Type::Collective) out.push_back(n.collective);
  return out;
}

TEST(ExecutionTrace, ListsTheKernelsWithTheirTensorsAndTheFsdpCollectives) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const ExecutionTrace& mine = traces(corpus)[size_t(world()->rank())];
  EXPECT_EQ(mine.rank, world()->rank());
  EXPECT_EQ(mine.world_size, world()->size());
  EXPECT_EQ(mine.step, 2);
  std::map<std::string, int64_t> counts;
  int64_t ops_with_tensors = 0;
  int64_t views = 0;  // dims of traced tensors that are not laid out contiguously
  int64_t last_id = 0;
  std::map<int64_t, int> waits;  // async collective node id -> its wait nodes
  for (const TraceNode& n : mine.nodes) {
    EXPECT_EQ(n.id, last_id + 1);
    last_id = n.id;
    if (n.type == TraceNode::Type::Collective) {
      ++counts[n.collective.name + " " + n.collective.collective];
      if (n.collective.async) waits[n.id] = 0;
      continue;
    }
    if (n.type == TraceNode::Type::Wait) {
      ASSERT_TRUE(waits.count(n.waits_for)) << "wait node " << n.id;
      ++waits[n.waits_for];
      continue;
    }
    EXPECT_EQ(n.thread, "main");
    if (!n.inputs.empty() && !n.outputs.empty()) ++ops_with_tensors;
    for (const auto& t : n.inputs) EXPECT_NE(t.storage, 0u) << n.name;
    for (const auto* list : {&n.inputs, &n.outputs})
      for (const auto& t : *list) {
        ASSERT_EQ(t.strides.size(), t.shape.size()) << n.name;
        int64_t contiguous = 1;
        for (size_t d = t.shape.size(); d-- > 0; contiguous *= t.shape[d])
          if (t.shape[d] > 1 && t.strides[d] != contiguous) ++views;
      }
    // Every argument is recorded: its tensor codes account for exactly its tensors.
    size_t tensors = 0;
    for (const std::string& code : n.args) {
      if (code == "T") tensors += 1;
      if (code[0] == 'V') tensors += size_t(std::stoll(code.substr(1)));
      if (code[0] == 'A')  // AdamW's operands: four tensors per step listed
        tensors += 4 * size_t(std::count(code.begin(), code.end(), ',') + 1);
    }
    EXPECT_EQ(tensors, n.inputs.size() + n.outputs.size()) << n.name;
    if (n.name == "rms_norm") {
      // x, weight, eps, y, rstd, and the float8 amax slot (undefined: no float8 here)
      ASSERT_EQ(n.args.size(), 6u);
      EXPECT_EQ(n.args[5], "T-");
      EXPECT_EQ(n.args[2][0], 'f');
      EXPECT_GT(std::stod(n.args[2].substr(1)), 0.0) << "eps";
    }
  }
  const int64_t layers = 2;  // testing::shrink_llama
  EXPECT_EQ(counts["fsdp.all_gather all_gather_into"], 2 * layers);
  EXPECT_EQ(counts["fsdp.reduce_scatter reduce_scatter_into"], layers + 1);
  EXPECT_EQ(counts["clip_grad_norm all_reduce"], 1);
  // FSDP's prefetched all-gathers and its reduce-scatters run async, and the step waits for each
  // (a wait node after it: where a replay waits too).
  EXPECT_GE(waits.size(), size_t(layers + 1));
  for (const auto& [id, count] : waits) EXPECT_EQ(count, 1) << "async node " << id;
  // In flight, an async call's buffers are not touched by a kernel (the step wrote its input
  // before issuing it and read its output after waiting): kernels and calls are in issue order.
  std::map<uint64_t, int64_t> in_flight;  // storage -> the async node using it
  for (const TraceNode& n : mine.nodes) {
    if (n.type == TraceNode::Type::Collective && n.collective.async) {
      for (uint64_t storage : {n.collective.in_storage, n.collective.out_storage})
        if (storage != 0) in_flight[storage] = n.id;
    } else if (n.type == TraceNode::Type::Wait) {
      std::erase_if(in_flight, [&](const auto& e) { return e.second == n.waits_for; });
    } else if (n.type == TraceNode::Type::Op) {
      for (const auto* list : {&n.inputs, &n.outputs})
        for (const auto& t : *list)
          EXPECT_FALSE(in_flight.count(t.storage))
              << n.name << " (node " << n.id << ") uses the buffer of async node "
              << in_flight[t.storage] << " before its wait";
    }
  }
  EXPECT_GT(ops_with_tensors, 20);  // matmuls, norms, attention, the optimizer...
  EXPECT_GT(views, 0);  // e.g. attention's transposed q, k, v: traced with their strides
}

// The replay's own calls, as CommTrace records them, against the traced ones.
void expect_same_calls(const std::vector<CommRecord>& replayed,
                       const std::vector<CommRecord>& traced, int64_t scale) {
  ASSERT_EQ(replayed.size(), traced.size());
  for (size_t i = 0; i < traced.size(); ++i) {
    const CommRecord& a = replayed[i];
    const CommRecord& b = traced[i];
    EXPECT_EQ(a.collective, b.collective) << i;
    EXPECT_EQ(a.name, "replay." + b.name) << i;
    EXPECT_EQ(a.members, b.members) << i;
    EXPECT_EQ(a.dtype, b.dtype) << i;
    EXPECT_EQ(a.reduce_op, b.reduce_op) << i;
    EXPECT_EQ(a.size_bytes, b.size_bytes * scale) << i << " " << b.name;
    EXPECT_EQ(a.async || a.posted(), b.async || b.posted()) << i << " " << b.name;
    EXPECT_EQ(a.peer, b.peer) << i;
    EXPECT_EQ(a.tag, b.tag) << i;
    if (scale == 1) {
      EXPECT_EQ(a.in_shape, b.in_shape) << i;
      EXPECT_EQ(a.out_shape, b.out_shape) << i;
    }
  }
}

parallel::ReplayResult replay(const fs::path& corpus,
                              parallel::ReplayOptions::Allocation allocation, int64_t scale,
                              std::vector<CommRecord>* issued, bool compute = false,
                              Run run = Run::Fsdp, bool overlap = true,
                              parallel::ProcessGroup* on = nullptr) {
  parallel::ReplayOptions o;
  o.allocation = allocation;
  o.scale_bytes = scale;
  o.compute = compute;
  o.overlap = overlap;
  const std::vector<ExecutionTrace>& step = traces(corpus, run);
  parallel::CommTrace::start();
  const parallel::ReplayResult r = parallel::replay_step(on ? *on : *world(), step, o);
  *issued = parallel::CommTrace::take();
  parallel::CommTrace::stop();
  // The replay's own barrier and group splits are not the traced calls.
  std::erase_if(*issued, [](const CommRecord& c) { return c.name.rfind("replay.", 0) != 0; });
  return r;
}

TEST(Replay, IssuesTheTracedCollectivesInOrderAndLazyAllocationPeaksLower) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::vector<CommRecord> traced = collectives_of(traces(corpus)[size_t(world()->rank())]);
  std::vector<CommRecord> lazy_calls, pre_calls;
  const parallel::ReplayResult lazy =
      replay(corpus, parallel::ReplayOptions::Allocation::Lazy, 1, &lazy_calls);
  const parallel::ReplayResult pre =
      replay(corpus, parallel::ReplayOptions::Allocation::Pre, 1, &pre_calls);
  expect_same_calls(lazy_calls, traced, 1);
  expect_same_calls(pre_calls, traced, 1);
  EXPECT_EQ(lazy.calls.size(), traced.size());
  for (size_t i = 0; i < traced.size(); ++i)
    EXPECT_EQ(lazy.calls[i].deferred, traced[i].async) << traced[i].name;
  EXPECT_GT(lazy.recorded_step_us, 0);
  EXPECT_GT(lazy.replayed_step_us, 0);
  EXPECT_EQ(lazy.digest, pre.digest);
  EXPECT_GT(lazy.peak_bytes, 0);
  EXPECT_LT(lazy.peak_bytes, pre.peak_bytes);
}

TEST(Replay, ScaleBytesMultipliesEverySize) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::vector<CommRecord> traced = collectives_of(traces(corpus)[size_t(world()->rank())]);
  std::vector<CommRecord> calls;
  replay(corpus, parallel::ReplayOptions::Allocation::Lazy, 2, &calls);
  expect_same_calls(calls, traced, 2);
}

TEST(Replay, AllReRunsEveryKernelBetweenTheSameCollectives) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const ExecutionTrace& mine = traces(corpus)[size_t(world()->rank())];
  const std::vector<CommRecord> traced = collectives_of(mine);
  std::vector<CommRecord> lazy_calls, pre_calls;
  const parallel::ReplayResult lazy =
      replay(corpus, parallel::ReplayOptions::Allocation::Lazy, 1, &lazy_calls, true);
  const parallel::ReplayResult pre =
      replay(corpus, parallel::ReplayOptions::Allocation::Pre, 1, &pre_calls, true);
  expect_same_calls(lazy_calls, traced, 1);
  expect_same_calls(pre_calls, traced, 1);
  std::vector<const TraceNode*> kernels;
  for (const TraceNode& n : mine.nodes)
    if (n.type == TraceNode::Type::Op) kernels.push_back(&n);
  ASSERT_EQ(lazy.ops.size(), kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    const parallel::ReplayedOp& op = lazy.ops[i];
    EXPECT_EQ(op.node_id, kernels[i]->id);
    EXPECT_EQ(op.name, kernels[i]->name);
    EXPECT_EQ(op.skipped, "") << op.name;
    EXPECT_GT(op.replayed_us, 0.0) << op.name;
  }
  // The kernels wrote the collectives' inputs: the same digest both ways, and a different one
  // from the collectives-only replay (whose buffers keep their initial constants).
  EXPECT_EQ(lazy.digest, pre.digest);
  std::vector<CommRecord> comms_calls;
  const parallel::ReplayResult comms =
      replay(corpus, parallel::ReplayOptions::Allocation::Lazy, 1, &comms_calls);
  EXPECT_NE(lazy.digest, comms.digest);
  EXPECT_LT(lazy.peak_bytes, pre.peak_bytes);
  // Without overlap (mt_replay --no-overlap) every async call runs synchronously where it was
  // issued: the same calls, none async, and the same values (no kernel touched an in-flight
  // call's buffers).
  std::vector<CommRecord> serial_calls;
  const parallel::ReplayResult serial = replay(
      corpus, parallel::ReplayOptions::Allocation::Lazy, 1, &serial_calls, true, Run::Fsdp, false);
  ASSERT_EQ(serial_calls.size(), traced.size());
  for (size_t i = 0; i < traced.size(); ++i) {
    EXPECT_EQ(serial_calls[i].collective, traced[i].collective) << i;
    EXPECT_FALSE(serial_calls[i].async) << i;
    EXPECT_FALSE(serial.calls[i].deferred) << i;
  }
  EXPECT_EQ(serial.digest, lazy.digest);
  const std::string table = parallel::replay_ops_table(lazy);
  EXPECT_NE(table.find("matmul"), std::string::npos) << table;
  EXPECT_NE(table.find("0 skipped"), std::string::npos) << table;
  // Scaling dim 0 of every tensor would break the kernels' shapes: refused.
  parallel::ReplayOptions scaled;
  scaled.compute = true;
  scaled.scale_bytes = 2;
  EXPECT_THROW(parallel::replay_step(*world(), traces(corpus), scaled), mt::Error);
}

// The pipeline's posted messages: each isend / irecv node of the trace has one wait node after
// it (the runner waits for every message within the step), and the replay, with and without
// compute, posts the same messages (peer, tag, size) in the same order among the collectives,
// each completing at its wait.
TEST(Replay, PostsThePipelinesMessagesAndWaitsWhereTheStepWaited) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const ExecutionTrace& mine = traces(corpus, Run::Pipeline)[size_t(world()->rank())];
  std::map<int64_t, int> waits;  // posted (and, with FSDP, async) node id -> its wait nodes
  int64_t sends = 0, receives = 0;
  for (const TraceNode& n : mine.nodes) {
    if (n.type == TraceNode::Type::Wait) {
      ASSERT_TRUE(waits.count(n.waits_for)) << "wait node " << n.id;
      EXPECT_LT(n.waits_for, n.id);
      ++waits[n.waits_for];
    } else if (n.type == TraceNode::Type::Collective && n.collective.async) {
      waits[n.id] = 0;
    }
    if (n.type == TraceNode::Type::Collective && n.collective.posted()) {
      (n.collective.collective == "isend" ? sends : receives) += 1;
      EXPECT_EQ(n.collective.members.size(), 2u);  // the pp group
      EXPECT_GT(n.collective.size_bytes, 0);
    }
  }
  // 1F1B's stage sends each micro-batch's activations forward or gradients back: 2 per dp rank.
  EXPECT_EQ(sends, 2);
  EXPECT_EQ(receives, 2);
  for (const auto& [id, count] : waits) EXPECT_EQ(count, 1) << "posted node " << id;

  const std::vector<CommRecord> traced = collectives_of(mine);
  for (const bool compute : {false, true}) {
    SCOPED_TRACE(compute ? "--all" : "--comms");
    std::vector<CommRecord> issued;
    const parallel::ReplayResult r = replay(
        corpus, parallel::ReplayOptions::Allocation::Lazy, 1, &issued, compute, Run::Pipeline);
    expect_same_calls(issued, traced, 1);
    ASSERT_EQ(r.calls.size(), traced.size());
    for (const parallel::ReplayedCall& c : r.calls) {
      if (c.collective == "irecv" || c.collective == "isend") {
        EXPECT_GT(c.replayed_us, 0.0) << c.name;
      }
    }
    if (compute) {
      for (const parallel::ReplayedOp& op : r.ops) EXPECT_EQ(op.skipped, "") << op.name;
    }
  }
}

// The ops of each traced batch_isend_irecv, by batch in order: each batch's kinds ("isend" ...).
std::vector<std::multiset<std::string>> batches_of(const std::vector<CommRecord>& records) {
  std::map<int64_t, std::multiset<std::string>> by_batch;
  for (const CommRecord& r : records) {
    if (r.batch != 0) by_batch[r.batch].insert(r.collective);
  }
  std::vector<std::multiset<std::string>> out;
  for (auto& [batch, kinds] : by_batch) out.push_back(std::move(kinds));
  return out;
}

// The ring passes each key/value chunk (and, in backward, its gradient) by one batch_isend_irecv,
// the pipeline each round of messages: the trace numbers the ops of each batch, and the replay
// posts them as a batch again. So it also runs where a rank's messages run in issue order and
// each send waits for its receive (NCCL's streams, as testing::InOrderPointToPointGroup makes them
// on MPI), where a ring pass posted op by op waits forever: every rank's receive ahead of the send
// its peer waits for.
TEST(Replay, BatchesReplayAsBatchesOnInOrderStreams) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  auto mpi = std::shared_ptr<parallel::MpiProcessGroup>(
      dynamic_cast<parallel::MpiProcessGroup*>(world()->split(0, world()->rank()).release()));
  testing::InOrderPointToPointGroup in_order(mpi, std::chrono::seconds(20));
  for (const train::Run run : {train::Run::Ring, train::Run::Pipeline}) {
    SCOPED_TRACE(run == train::Run::Ring ? "ring" : "pipeline");
    const ExecutionTrace& mine = traces(corpus, run)[size_t(world()->rank())];
    std::set<int64_t> seen;
    int64_t previous_batch = 0;
    for (const TraceNode& n : mine.nodes) {
      const int64_t batch = n.type == TraceNode::Type::Collective ? n.collective.batch : 0;
      if (batch != 0) {
        EXPECT_TRUE(n.collective.posted()) << n.collective.collective;
        // A batch's ops are consecutive nodes (no wait between them), as the replay posts them.
        EXPECT_TRUE(batch == previous_batch || !seen.count(batch))
            << "node " << n.id << " of batch " << batch << " after another node";
        seen.insert(batch);
      }
      previous_batch = batch;
    }
    const std::vector<CommRecord> traced = collectives_of(mine);
    const std::vector<std::multiset<std::string>> batches = batches_of(traced);
    ASSERT_GE(batches.size(), 2u);  // passes or rounds in forward and backward
    if (run == train::Run::Ring) {
      for (const std::multiset<std::string>& kinds : batches) {
        EXPECT_EQ(kinds, (std::multiset<std::string>{"irecv", "isend"}));
      }
    }
    std::vector<CommRecord> issued;
    const parallel::ReplayResult r = replay(corpus, parallel::ReplayOptions::Allocation::Lazy, 1,
                                            &issued, false, run, true, &in_order);
    EXPECT_EQ(r.calls.size(), traced.size());
    EXPECT_EQ(batches_of(issued), batches);
  }
}

TEST(Replay, TracesThatDoNotFitAreErrors) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::vector<ExecutionTrace>& all = traces(corpus);
  std::vector<ExecutionTrace> fewer(all.begin(), all.end() - 1);
  EXPECT_THROW(parallel::replay_step(*world(), fewer, {}), mt::Error);
  std::vector<ExecutionTrace> no_members = all;
  for (ExecutionTrace& t : no_members)
    for (TraceNode& n : t.nodes) n.collective.members.clear();
  EXPECT_THROW(parallel::replay_step(*world(), no_members, {}), mt::Error);
  std::vector<ExecutionTrace> dangling_wait = traces(corpus, Run::Pipeline);
  for (ExecutionTrace& t : dangling_wait)
    for (TraceNode& n : t.nodes)
      if (n.type == TraceNode::Type::Wait) n.waits_for = n.id + 1;  // not a message before it
  EXPECT_THROW(parallel::replay_step(*world(), dangling_wait, {}), mt::Error);
  // Traces that would leave a rank waiting on a call its peer never issues are refused on every
  // rank alike, before any collective (these used to hang): a rank's trace twice, traces of two
  // steps, a trace cut short, a message with no receive.
  using testing::error_of;
  auto refused = [&](const std::vector<ExecutionTrace>& step, const std::string& why) {
    EXPECT_NE(error_of([&] { parallel::replay_step(*world(), step, {}); }).find(why),
              std::string::npos)
        << why;
  };
  std::vector<ExecutionTrace> twice = all;
  twice.back() = all.front();
  refused(twice, "two traces of rank 0");
  std::vector<ExecutionTrace> two_steps = all;
  two_steps.back().step += 1;
  refused(two_steps, "the traces are of different steps");
  std::vector<ExecutionTrace> cut = all;
  auto& cut_nodes = cut.back().nodes;
  const auto last_collective =
      std::find_if(cut_nodes.rbegin(), cut_nodes.rend(), [](const TraceNode& n) {
        return n.type == TraceNode::Type::Collective;
      });
  ASSERT_NE(last_collective, cut_nodes.rend());
  cut_nodes.erase(std::prev(last_collective.base()), cut_nodes.end());
  refused(cut, "the traces disagree on the group of ranks");
  std::vector<ExecutionTrace> lost_send = traces(corpus, Run::Pipeline);
  auto& sender = lost_send.front().nodes;
  const auto send = std::find_if(sender.begin(), sender.end(), [](const TraceNode& n) {
    return n.type == TraceNode::Type::Collective && n.collective.collective == "isend";
  });
  ASSERT_NE(send, sender.end());
  sender.erase(send);
  refused(lost_send, "messages than that rank receives");
  parallel::ReplayOptions zero;
  zero.scale_bytes = 0;
  EXPECT_THROW(parallel::replay_step(*world(), all, zero), mt::Error);
  const fs::path bad = testing::shared_dir(*world(), "mt_replay_mpi", "bad") / "rank-0.json";
  if (world()->rank() == 0) std::ofstream(bad) << "{\"format\": \"something else\"}";
  world()->barrier("bad written");
  EXPECT_THROW(parallel::read_execution_trace(bad.string()), mt::Error);
}

}  // namespace
}  // namespace mt::train
