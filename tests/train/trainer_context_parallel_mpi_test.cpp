// Context parallelism in the Trainer on real ranks (mpirun -np 2 and -np 4): each rank of a cp
// group trains on its share of every sequence (load-balanced chunks, attention over the gathered
// keys and values), and the runs give the losses, gradient norms and validation losses of one
// process: cp = every rank (also with activation checkpointing and gradient accumulation, and
// with the ring instead of the all-gather; in bf16 to its rounding), and on
// 4 ranks cp 2 x FSDP 2, HSDP 2 x cp 2, cp 2 x TP 2 (sequence parallel), pp 2 x cp 2, and the MoE
// with cp alone and cp 2 x EP 2, and with its sequence-wise auxiliary loss (cp 2, pp 2 x cp 2).
// The text sample is one process's. Checkpoints saved under cp resume without it and the other
// way round; layouts that cannot run are errors on every rank before any work.
#include <gtest/gtest.h>

#include <any>
#include <filesystem>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "models/moe/model_args.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"
#include "tests/testing/mpi_fixtures.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/trainer_fixtures.h"
#include "train/config/load.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using parallel::ProcessGroup;

constexpr auto world = &testing::mpi_world;

fs::path shared_dir(const std::string& name) {
  return testing::shared_dir(*world(), "mt_context_parallel_mpi", name);
}

// 8 sequences of 32 tokens per step over the data-parallel ranks, 10 steps, validated at 5, 10.
config::JobConfig job(const fs::path& corpus, const fs::path& dump, int64_t local_batch,
                      std::vector<std::string> extra = {}) {
  static const fs::path tokenizer =
      testing::shared_small_tokenizer(*world(), "mt_context_parallel_mpi", corpus);
  std::vector<std::string> args = testing::short_run_flags(corpus, tokenizer, dump, local_batch);
  args.insert(args.end(), extra.begin(), extra.end());
  return config::load_config(fs::path(), args);
}

TrainResult run(const config::JobConfig& cfg, std::shared_ptr<ProcessGroup> group,
                std::function<void(std::any&)> edit = testing::shrink_llama) {
  return Trainer(cfg, testing::quiet_trainer_options(std::move(edit), std::move(group))).train();
}

// One process (this rank alone) with `extra` flags.
TrainResult one_process(const fs::path& corpus, const std::string& name,
                        std::vector<std::string> extra = {},
                        std::function<void(std::any&)> edit = testing::shrink_llama) {
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  return run(job(corpus, shared_dir(name) / std::to_string(world()->rank()), 8, std::move(extra)),
             self, std::move(edit));
}

const TrainResult& reference(const fs::path& corpus) {
  static const TrainResult r = one_process(corpus, "reference");
  return r;
}

std::vector<std::string> cp_args(int64_t cp, std::vector<std::string> more = {}) {
  more.insert(more.begin(), "--parallelism.context_parallel_degree=" + std::to_string(cp));
  return more;
}

const std::vector<std::string> kMoe = {"--model.name=deepseek_v3", "--model.flavor=moe_debug"};

TEST(TrainerContextParallelMpi, EveryRankOneSequenceShardMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t cp = world()->size();  // dp 1: each rank reads all 8 sequences, 32 / cp tokens
  testing::expect_same_run(run(job(corpus, shared_dir("cp"), 8, cp_args(cp)), world()),
                           reference(corpus));
  // Recomputed blocks gather the keys and values again in backward, and gradients of
  // micro-batches accumulate. (Validation batches are 4 sequences: 4 of them read the
  // reference's 2 of 8.)
  SCOPED_TRACE("activation checkpointing, 2 micro-batches");
  testing::expect_same_run(
      run(job(corpus, shared_dir("cp_ac_accum"), 4,
              cp_args(cp, {"--activation_checkpoint.mode=full", "--validation.steps=4",
                           "--training.global_batch_size=8"})),
          world()),
      reference(corpus));
}

// The ring ("alltoall"): the key/value chunks and their gradients pass around the cp ranks; the
// same run, also with recomputed blocks (the ring runs again in backward) and on 4 ranks beside
// FSDP.
TEST(TrainerContextParallelMpi, RingMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::string ring = "--parallelism.context_parallel_rotate_method=alltoall";
  const int64_t cp = world()->size();
  testing::expect_same_run(run(job(corpus, shared_dir("ring"), 8, cp_args(cp, {ring})), world()),
                           reference(corpus));
  SCOPED_TRACE("activation checkpointing");
  testing::expect_same_run(
      run(job(corpus, shared_dir("ring_ac"), 8,
              cp_args(cp, {ring, "--activation_checkpoint.mode=full"})),
          world()),
      reference(corpus));
  if (world()->size() == 4) {
    SCOPED_TRACE("cp 2 x FSDP 2");
    testing::expect_same_run(run(job(corpus, shared_dir("ring_fsdp"), 4, cp_args(2, {ring})),
                                 world()),
                             reference(corpus));
  }
}

// bf16 compute (f32 master weights and reductions), both methods: cp = every rank tracks one
// process in bf16 to its rounding (the blocks of the ring are merged in f32, the all-gather's
// attention runs on a rank's queries alone).
TEST(TrainerContextParallelMpi, InBf16TracksOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::vector<std::string> bf16 = {"--training.mixed_precision_param=bfloat16",
                                         "--training.steps=5", "--validation.enable=false"};
  const TrainResult one = one_process(corpus, "bf16_one", bf16);
  for (const std::string method : {"allgather", "alltoall"}) {
    SCOPED_TRACE(method);
    const TrainResult cp = run(
        job(corpus, shared_dir("bf16_" + method), 8,
            cp_args(world()->size(),
                    {bf16[0], bf16[1], bf16[2],
                     "--parallelism.context_parallel_rotate_method=" + method})),
        world());
    ASSERT_EQ(cp.losses.size(), one.losses.size());
    for (size_t i = 0; i < one.losses.size(); ++i)
      EXPECT_NEAR(cp.losses[i], one.losses[i], 1e-2 * one.losses[i]) << "step " << i + 1;
  }
}

// cp 2 composed with the other dimensions on 4 ranks (pp, dp_replicate, dp_shard, cp, tp).
TEST(TrainerContextParallelMpi, ComposesWithFsdpHsdpTensorAndPipelineParallelism) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  if (world()->size() != 4) GTEST_SKIP() << "the 2 x 2 layouts need 4 ranks";
  const std::vector<std::tuple<std::string, int64_t, std::vector<std::string>>> layouts = {
      {"cp 2 x FSDP 2", 4, cp_args(2)},
      {"HSDP 2 x cp 2", 4,
       cp_args(2, {"--parallelism.data_parallel_replicate_degree=2",
                   "--parallelism.data_parallel_shard_degree=1"})},
      {"cp 2 x TP 2 (sequence parallel)", 8,
       cp_args(2, {"--parallelism.tensor_parallel_degree=2"})},
      {"cp 2 x TP 2 (no sequence parallel)", 8,
       cp_args(2, {"--parallelism.tensor_parallel_degree=2",
                   "--parallelism.enable_sequence_parallel=false"})},
      {"pp 2 x cp 2", 8,
       cp_args(2, {"--parallelism.pipeline_parallel_degree=2",
                   "--parallelism.pipeline_parallel_microbatch_size=2"})},
  };
  for (const auto& [name, local_batch, args] : layouts) {
    SCOPED_TRACE(name);
    testing::expect_same_run(run(job(corpus, shared_dir(name), local_batch, args), world()),
                             reference(corpus));
  }
}

// The MoE: each rank routes its share of the tokens, the load-balancing counts add up over the
// cp ranks; with EP the experts borrow their ranks from dp_shard x cp.
TEST(TrainerContextParallelMpi, MoeMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const TrainResult want = one_process(corpus, "moe_ref", kMoe, testing::shrink_moe);
  std::vector<std::pair<std::string, TrainResult>> runs;
  runs.emplace_back("cp 2", run(job(corpus, shared_dir("moe_cp"), 8 * 2 / world()->size(),
                                    cp_args(2, kMoe)),
                                world(), testing::shrink_moe));
  if (world()->size() == 4) {
    runs.emplace_back("cp 2 x EP 2",
                      run(job(corpus, shared_dir("moe_cp_ep"), 4,
                              cp_args(2, {kMoe[0], kMoe[1],
                                          "--parallelism.expert_parallel_degree=2"})),
                          world(), testing::shrink_moe));
  }
  for (const auto& [name, got] : runs) {
    SCOPED_TRACE(name);
    testing::expect_same_moe_run(got, want);
  }
}

// The MoE's sequence-wise auxiliary loss: each rank's share of a sequence counts the whole
// sequence's routing (summed over the cp ranks) and weights its own tokens' scores, so the
// shares add up to one process's loss; with a pipeline too (each stage's layers add theirs), and
// with tensor parallelism (each tp rank routes a share of the cp rank's tokens).
TEST(TrainerContextParallelMpi, MoeSequenceAuxLossMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const auto with_aux_loss = [](std::any& a) {
    testing::shrink_moe(a);
    std::any_cast<models::moe::ModelArgs&>(a).aux_loss_alpha = 0.1;
  };
  // 3 steps: the loss (step 1) and two updates. The auxiliary loss pushes the router's scores
  // together, so a later step's near-tie in the routing may flip between two float orders (it
  // did at step 4 in the sanitizer build), after which the runs drift apart.
  const std::vector<std::string> moe = {kMoe[0], kMoe[1], "--training.steps=3"};
  const TrainResult want = one_process(corpus, "moe_aux_ref", moe, with_aux_loss);
  // The loss is on: step 1 (the same weights and batch) costs more than without it.
  const TrainResult without = one_process(corpus, "moe_noaux_ref", moe, testing::shrink_moe);
  ASSERT_FALSE(want.losses.empty());
  EXPECT_GT(want.losses[0], without.losses[0] + 1e-3);
  std::vector<std::pair<std::string, TrainResult>> runs;
  runs.emplace_back("cp 2", run(job(corpus, shared_dir("moe_aux_cp"), 8 * 2 / world()->size(),
                                    cp_args(2, moe)),
                                world(), with_aux_loss));
  if (world()->size() == 4) {
    runs.emplace_back(
        "pp 2 x cp 2",
        run(job(corpus, shared_dir("moe_aux_pp_cp"), 8,
                cp_args(2, {moe[0], moe[1], moe[2], "--parallelism.pipeline_parallel_degree=2",
                            "--parallelism.pipeline_parallel_microbatch_size=2",
                            // the dense block and the first MoE block, then the second
                            "--parallelism.pipeline_parallel_split_points=layers.2"})),
            world(), with_aux_loss));
    // Each cp rank's share of a sequence split again over tp: the counts add up over both.
    runs.emplace_back("cp 2 x TP 2",
                      run(job(corpus, shared_dir("moe_aux_cp_tp"), 8,
                              cp_args(2, {moe[0], moe[1], moe[2],
                                          "--parallelism.tensor_parallel_degree=2"})),
                          world(), with_aux_loss));
  }
  for (const auto& [name, got] : runs) {
    SCOPED_TRACE(name);
    testing::expect_same_moe_run(got, want);
  }
}

// The end-of-run text sample decodes whole sequences on every rank (outside the sequence
// shards the training steps run on): one process's text, before and after training with cp =
// every rank.
TEST(TrainerContextParallelMpi, TextSampleMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const auto samples = [&](const config::JobConfig& cfg, std::shared_ptr<ProcessGroup> group) {
    Trainer t(cfg, testing::quiet_trainer_options(testing::shrink_llama, std::move(group)));
    std::vector<std::string> texts = {t.generate_sample("", 12, 0.8),
                                      t.generate_sample("ROMEO:", 12, 0.0)};
    t.train();
    texts.push_back(t.generate_sample("ROMEO:", 12, 0.0));
    texts.push_back(t.generate_sample("To be, or not", 8, 0.8));
    return texts;
  };
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const std::vector<std::string> one = samples(
      job(corpus, shared_dir("sample_one") / std::to_string(world()->rank()), 8), self);
  ASSERT_GT(one[0].size(), 8u);
  EXPECT_EQ(samples(job(corpus, shared_dir("sample_cp"), 8, cp_args(world()->size())), world()),
            one);
}

// A run resumed at step 5 on `ranks` ranks with `resumed` flags continues the straight one.
void expect_resumes(const fs::path& corpus, const fs::path& dump, const TrainResult& straight,
                    int ranks, int64_t local_batch, const std::vector<std::string>& resumed) {
  testing::expect_resumes_on(*world(), ranks, straight, 5, [&](std::shared_ptr<ProcessGroup> sub) {
    std::vector<std::string> args = {"--checkpoint.enable=true", "--checkpoint.interval=5",
                                     "--checkpoint.load_step=5"};
    args.insert(args.end(), resumed.begin(), resumed.end());
    return run(job(corpus, dump, local_batch, args), sub);
  });
}

// Checkpoints hold whole tensors: a cp run's resumes on one rank, and an FSDP run's with cp = the
// world (on 4 ranks: cp 2 x FSDP 2 -> FSDP 2 on 2 ranks, and -> cp 4).
TEST(TrainerContextParallelMpi, CheckpointsReshardAcrossContextParallelDegrees) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const std::vector<std::string> ckpt = {"--checkpoint.enable=true", "--checkpoint.interval=5"};
  {
    const fs::path dump = shared_dir("cp_ckpt");
    const TrainResult straight = run(job(corpus, dump, 8 * 2 / w, cp_args(2, ckpt)), world());
    expect_resumes(corpus, dump, straight, 1, 8, {});
    if (w == 4) {
      expect_resumes(corpus, dump, straight, 2, 4, {});
      expect_resumes(corpus, dump, straight, 4, 8, cp_args(4));
    }
  }
  {
    const fs::path dump = shared_dir("fsdp_ckpt");
    const TrainResult straight = run(job(corpus, dump, 8 / w, ckpt), world());
    expect_resumes(corpus, dump, straight, int(w), 8, cp_args(w));
  }
}

TEST(TrainerContextParallelMpi, LayoutsThatCannotRunAreErrorsOnEveryRank) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const auto expect_error = [&](const std::string& name, const std::vector<std::string>& args,
                                std::function<void(std::any&)> edit,
                                const std::vector<std::string>& needles) {
    SCOPED_TRACE(name);
    try {
      run(job(corpus, shared_dir(name), 1, args), world(), std::move(edit));
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  // Degrees that do not fit the world.
  expect_error("bad_world", cp_args(3), testing::shrink_llama,
               {"context_parallel_degree", "world size"});
  // 32 tokens cannot be cut into 2 x 32 chunks (cp 32 on a world of 2 or 4 fails first).
  expect_error("bad_seq", cp_args(2, {"--training.seq_len=30"}), testing::shrink_llama,
               {"multiple of 2 x context_parallel_degree", "training.seq_len = 30"});
}

}  // namespace
}  // namespace mt::train
