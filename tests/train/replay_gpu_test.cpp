// mt_replay on a GPU: a profiled training step of a tiny Llama on one GPU (FSDP over the 1-rank
// NCCL world, bf16), traced with [profiling] execution_trace, replayed with its kernels
// (mt_replay --all) over an NCCL world: every kernel re-runs through its CUDA entry, and every
// copy between the host and the GPU and every host wait as what it was (none skipped); the
// collectives are the traced ones in order, the NCCL records name their members, and lazy and
// pre allocation give the same digest, lazy with the lower peak. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "parallel/comm/execution_trace.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/nccl_process_group.h"
#include "parallel/comm/replay.h"
#include "tests/testing/gpu.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/trainer_fixtures.h"
#include "train/config/load.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using parallel::ExecutionTrace;
using parallel::TraceNode;

TEST(ReplayGpu, AllReRunsEveryCudaKernelBetweenTheSameCollectives) {
  MT_REQUIRE_CUDA();
  if (parallel::MpiProcessGroup::launched_by_launcher()) GTEST_SKIP() << "one process only";
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  testing::ScratchDir dir;
  testing::save_small_tokenizer(corpus, dir.path() / "tokenizer");
  const fs::path dump = dir.path() / "run";
  const std::vector<std::string> args = {
      "--job.dump_folder=" + dump.string(),
      "--model.tokenizer_path=" + (dir.path() / "tokenizer").string(),
      "--training.dataset_path=" + corpus.string(),
      "--training.device=cuda",
      "--training.local_batch_size=4",
      "--training.seq_len=32",
      "--training.steps=2",
      "--profiling.enable=true",
      "--profiling.profile_freq=2",
      "--profiling.execution_trace=true"};
  Trainer(config::load_config(fs::path(), args),
          testing::quiet_trainer_options(testing::shrink_llama))
      .train();
  const ExecutionTrace trace = parallel::read_execution_trace(
      (dump / "profile_traces" / "execution_trace" / "step_2" / "rank-0.json").string());
  ASSERT_TRUE(parallel::trace_ran_on_gpu({trace}));
  std::vector<const TraceNode*> kernels, collectives;
  for (const TraceNode& n : trace.nodes) {
    if (n.type == TraceNode::Type::Op) kernels.push_back(&n);
    if (n.type == TraceNode::Type::Collective) {
      collectives.push_back(&n);
      EXPECT_EQ(n.collective.members, std::vector<int>{0}) << n.collective.name;
    }
  }
  ASSERT_GT(kernels.size(), 50u);
  // The batch's copies to the GPU are in the trace with their tensors (replayed as copies).
  const auto batch_copies = std::count_if(kernels.begin(), kernels.end(), [](const TraceNode* n) {
    return n->name == "copy_to_device" && n->inputs.size() == 1 && n->outputs.size() == 1;
  });
  EXPECT_GE(batch_copies, 2) << "the inputs' and the targets' copies";
  ASSERT_FALSE(collectives.empty());  // FSDP's gathers and reduce-scatters over NCCL

  runtime::set_current_device(runtime::Device::cuda(0));
  std::shared_ptr<parallel::ProcessGroup> host(parallel::MpiProcessGroup::world());
  std::shared_ptr<parallel::ProcessGroup> world = parallel::make_nccl_process_group(host);
  auto replay = [&](parallel::ReplayOptions::Allocation allocation) {
    parallel::ReplayOptions o;
    o.compute = true;
    o.allocation = allocation;
    return parallel::replay_step(*world, {trace}, o);
  };
  const parallel::ReplayResult lazy = replay(parallel::ReplayOptions::Allocation::Lazy);
  const parallel::ReplayResult pre = replay(parallel::ReplayOptions::Allocation::Pre);
  ASSERT_EQ(lazy.ops.size(), kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    EXPECT_EQ(lazy.ops[i].name, kernels[i]->name);
    EXPECT_EQ(lazy.ops[i].skipped, "") << kernels[i]->name << " (" << kernels[i]->device << ")";
  }
  ASSERT_EQ(lazy.calls.size(), collectives.size());
  for (size_t i = 0; i < collectives.size(); ++i)
    EXPECT_EQ(lazy.calls[i].collective, collectives[i]->collective.collective) << i;
  EXPECT_EQ(lazy.digest, pre.digest);
  EXPECT_LT(lazy.peak_bytes, pre.peak_bytes);
  EXPECT_GT(lazy.replayed_step_us, 0.0);
  const std::string table = parallel::replay_ops_table(lazy);
  EXPECT_NE(table.find("0 skipped"), std::string::npos) << table;
}

}  // namespace
}  // namespace mt::train
