// Pipeline parallelism in the Trainer on real ranks (mpirun -np 2 and -np 4): an 8-block Llama
// (and an 8-block MoE) split into stages trains with the losses, gradient norms and validation
// losses of one process under every schedule (pp = all ranks, and on 4 ranks pp 2 x FSDP 2);
// zero bubble equals interleaved 1F1B bitwise; checkpoints saved with one pipeline degree resume
// under another; settings that cannot run are errors on every rank before any work.
#include <gtest/gtest.h>

#include <map>

#include <any>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/llama/model_args.h"
#include "models/moe/model_args.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"
#include "tests/testing/in_order_p2p.h"
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
  return testing::shared_dir(*world(), "mt_pipeline_mpi", name);
}

// shrink_llama with 8 blocks: 8 stages at most (pp 4 x 2 virtual stages).
void eight_layers(std::any& args) {
  testing::shrink_llama(args);
  std::any_cast<models::llama::ModelArgs&>(args).n_layers = 8;
}

// shrink_moe with 8 blocks (the first dense, 7 MoE).
void eight_moe_layers(std::any& args) {
  testing::shrink_moe(args);
  std::any_cast<models::moe::ModelArgs&>(args).n_layers = 8;
}

// 8 sequences of 32 tokens per step over the data-parallel ranks, 10 steps, validated at 5, 10.
config::JobConfig job(const fs::path& corpus, const fs::path& dump, int64_t local_batch,
                      std::vector<std::string> extra = {}) {
  static const fs::path tokenizer =
      testing::shared_small_tokenizer(*world(), "mt_pipeline_mpi", corpus);
  std::vector<std::string> args = testing::short_run_flags(corpus, tokenizer, dump, local_batch);
  args.insert(args.end(), extra.begin(), extra.end());
  return config::load_config(fs::path(), args);
}

TrainResult run(const config::JobConfig& cfg, std::shared_ptr<ProcessGroup> group,
                std::function<void(std::any&)> edit = eight_layers) {
  return Trainer(cfg, testing::quiet_trainer_options(std::move(edit), std::move(group))).train();
}

const TrainResult& reference(const fs::path& corpus) {
  static const TrainResult r = [&] {
    std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
    return run(job(corpus, shared_dir("reference") / std::to_string(world()->rank()), 8), self);
  }();
  return r;
}

std::vector<std::string> pp_args(int64_t pp, const std::string& schedule, int64_t microbatch,
                                 std::vector<std::string> more = {}) {
  more.push_back("--parallelism.pipeline_parallel_degree=" + std::to_string(pp));
  more.push_back("--parallelism.pipeline_parallel_schedule=" + schedule);
  more.push_back("--parallelism.pipeline_parallel_microbatch_size=" + std::to_string(microbatch));
  return more;
}

// pp = every rank, 4 micro-batches of 2 sequences, under each schedule (the interleaved ones
// with 2 stages per rank).
TEST(TrainerPipelineMpi, EverySchedulesMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t pp = world()->size();
  for (const std::string schedule :
       {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"}) {
    SCOPED_TRACE(schedule);
    testing::expect_same_run(run(job(corpus, shared_dir("pp_" + schedule), 8, pp_args(pp, schedule, 2)),
                        world()),
                    reference(corpus));
  }
}

// On GPUs a rank's point-to-point messages run in issue order on NCCL's stream, each send waiting
// for its receive, matched by order, not tag: the runner's message rounds must not deadlock
// there. Over a group whose messages behave so (testing::InOrderPointToPointGroup), every
// schedule trains as one process.
TEST(TrainerPipelineMpi, EveryScheduleRunsOverInOrderPointToPoint) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t pp = world()->size();
  auto mpi = std::shared_ptr<parallel::MpiProcessGroup>(
      dynamic_cast<parallel::MpiProcessGroup*>(world()->split(0, world()->rank()).release()));
  auto in_order = std::make_shared<testing::InOrderPointToPointGroup>(mpi);
  for (const std::string schedule :
       {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"}) {
    SCOPED_TRACE(schedule);
    testing::expect_same_run(
        run(job(corpus, shared_dir("in_order_" + schedule), 8, pp_args(pp, schedule, 2)),
            in_order),
        reference(corpus));
  }
}

// The zero-bubble schedule splits each backward into input and weight parts, with the weights'
// micro-batches in Interleaved1F1B's order: the same gradients, so bitwise the same run.
TEST(TrainerPipelineMpi, ZeroBubbleEqualsInterleaved1F1BBitwise) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t pp = world()->size();
  const TrainResult one_f_one_b =
      run(job(corpus, shared_dir("zb_ref"), 8, pp_args(pp, "Interleaved1F1B", 2)), world());
  const TrainResult zero_bubble =
      run(job(corpus, shared_dir("zb"), 8, pp_args(pp, "InterleavedZeroBubble", 2)), world());
  EXPECT_EQ(zero_bubble.losses, one_f_one_b.losses);
  EXPECT_EQ(zero_bubble.grad_norms, one_f_one_b.grad_norms);
  // Checkpointed blocks run whole in the input pass (their recompute's backward is not split).
  const std::vector<std::string> ac = {"--activation_checkpoint.mode=full"};
  const TrainResult zero_bubble_ac =
      run(job(corpus, shared_dir("zb_ac"), 8, pp_args(pp, "InterleavedZeroBubble", 2, ac)),
          world());
  EXPECT_EQ(zero_bubble_ac.losses, one_f_one_b.losses);
  EXPECT_EQ(zero_bubble_ac.grad_norms, one_f_one_b.grad_norms);
}

// Zero bubble with FSDP: each micro-batch's weight pass ends with the stage's reduce-scatters of
// its own gradients (the FSDP hooks pair a split backward's halves by pass, and a module's
// gathered parameters stay until its last weight pass). On 4 ranks pp 2 x FSDP 2 in f32 matches
// one process and Interleaved1F1B (gradient norms measured 1e-11..2e-8 apart: the
// reduce-scatters' buffers differ per pass; the losses, which those steps move, within 1e-6). bf16 stages (sharded on the pp ranks alone) train as
// Interleaved1F1B to bf16 rounding (losses measured 5e-5 apart by step 10), with activation
// checkpointing too.
TEST(TrainerPipelineMpi, ZeroBubbleWithFsdp) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  for (const bool ac : {false, true}) {
    SCOPED_TRACE(ac ? "bf16, activation checkpointing" : "bf16");
    std::vector<std::string> bf16 = {"--training.mixed_precision_param=bfloat16"};
    if (ac) bf16.push_back("--activation_checkpoint.mode=full");
    const std::string tag = ac ? "_ac" : "";
    const TrainResult one_f_one_b = run(
        job(corpus, shared_dir("zb_fsdp_ref" + tag), 8, pp_args(w, "Interleaved1F1B", 2, bf16)),
        world());
    const TrainResult zero_bubble = run(job(corpus, shared_dir("zb_fsdp" + tag), 8,
                                            pp_args(w, "InterleavedZeroBubble", 2, bf16)),
                                        world());
    ASSERT_EQ(zero_bubble.losses.size(), one_f_one_b.losses.size());
    for (size_t i = 0; i < one_f_one_b.losses.size(); ++i)
      EXPECT_NEAR(zero_bubble.losses[i], one_f_one_b.losses[i], 2e-4 * one_f_one_b.losses[i])
          << "step " << i + 1;
    EXPECT_LT(zero_bubble.losses.back(), zero_bubble.losses.front() - 0.5);  // it trains
  }
  if (w == 4) {
    SCOPED_TRACE("pp 2 x FSDP 2");
    const TrainResult zb =
        run(job(corpus, shared_dir("zb_pp_fsdp"), 4, pp_args(2, "InterleavedZeroBubble", 1)),
            world());
    testing::expect_same_run(zb, reference(corpus));
    const TrainResult i1f1b =
        run(job(corpus, shared_dir("i1f1b_pp_fsdp"), 4, pp_args(2, "Interleaved1F1B", 1)),
            world());
    ASSERT_EQ(zb.losses.size(), i1f1b.losses.size());
    for (size_t i = 0; i < i1f1b.grad_norms.size(); ++i) {
      EXPECT_NEAR(zb.losses[i], i1f1b.losses[i], 1e-6 * i1f1b.losses[i]) << "step " << i + 1;
      EXPECT_NEAR(zb.grad_norms[i], i1f1b.grad_norms[i], 1e-6 * i1f1b.grad_norms[i])
          << "step " << i + 1;
    }
  }
}

// Stages of unequal size at explicit split points; 8 micro-batches of one sequence.
TEST(TrainerPipelineMpi, SplitPointsMatchOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t pp = world()->size();
  const std::string points = pp == 2 ? "layers.3" : "layers.1,layers.2,layers.6";
  testing::expect_same_run(run(job(corpus, shared_dir("pp_split"), 8,
                          pp_args(pp, "1F1B", 1,
                                  {"--parallelism.pipeline_parallel_split_points=" + points})),
                      world()),
                  reference(corpus));
}

// 4 ranks: pp 2 x FSDP 2 (mesh (pp, dp_shard)), each data-parallel rank 4 sequences in 4
// micro-batches, with 1F1B and the interleaved schedule; and pp 2 x HSDP 2 (mesh (pp,
// dp_replicate, dp_shard = 1)).
TEST(TrainerPipelineMpi, PipelineTimesFsdpMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  if (world()->size() != 4) GTEST_SKIP() << "pp 2 x FSDP 2 needs 4 ranks";
  for (const std::string schedule : {"1F1B", "Interleaved1F1B"}) {
    SCOPED_TRACE(schedule);
    testing::expect_same_run(
        run(job(corpus, shared_dir("pp_fsdp_" + schedule), 4, pp_args(2, schedule, 1)), world()),
        reference(corpus));
  }
  SCOPED_TRACE("pp 2 x HSDP 2 (replicate 2, shard 1)");
  testing::expect_same_run(
      run(job(corpus, shared_dir("pp_hsdp"), 4,
              pp_args(2, "1F1B", 1,
                      {"--parallelism.data_parallel_replicate_degree=2",
                       "--parallelism.data_parallel_shard_degree=1"})),
          world()),
      reference(corpus));
}

// 4 ranks: pp 2 x TP 2 (mesh (pp, dp_replicate 1, dp_shard 1, tp)): the stages' TP plans
// cover their own blocks, sequence-parallel stages pass their sequence shards on, and the last
// stage's loss is loss parallel; with the interleaved schedule and without sequence parallelism
// (the MoE model: MoeMatchesOneProcess).
TEST(TrainerPipelineMpi, PipelineTimesTensorParallelMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  if (world()->size() != 4) GTEST_SKIP() << "pp 2 x TP 2 needs 4 ranks";
  const std::string tp = "--parallelism.tensor_parallel_degree=2";
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"1F1B", pp_args(2, "1F1B", 2, {tp})},
      {"Interleaved1F1B", pp_args(2, "Interleaved1F1B", 2, {tp})},
      {"no sequence parallel",
       pp_args(2, "1F1B", 2, {tp, "--parallelism.enable_sequence_parallel=false"})},
  };
  for (const auto& [name, args] : variants) {
    SCOPED_TRACE(name);
    testing::expect_same_run(run(job(corpus, shared_dir("pp_tp"), 8, args), world()),
                             reference(corpus));
  }
}

// The end-of-run text sample decodes through the stages (each stage's own KV cache, the last
// stage's token broadcast to every rank): the untrained model samples the text of one process
// exactly (the stages run the whole model's ops in its order), at temperature 0.8 and greedy,
// with pp = every rank (interleaved: 2 stages per rank, the last stage's output sent around to
// rank 0's second stage) and on 4 ranks pp 2 x FSDP 2 and pp 2 x TP 2; after training, train()
// samples the text one process samples, and so does greedy decoding.
TEST(TrainerPipelineMpi, TextSampleMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const auto samples = [&](const config::JobConfig& cfg, std::shared_ptr<ProcessGroup> group) {
    const Trainer t(cfg, testing::quiet_trainer_options(eight_layers, std::move(group)));
    return std::vector<std::string>{t.generate_sample("", 12, 0.8),
                                    t.generate_sample("ROMEO:", 12, 0.0)};
  };
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const auto one = samples(job(corpus, shared_dir("sample_one") / std::to_string(world()->rank()),
                               8),
                           self);
  ASSERT_GT(one[0].size(), 8u);
  struct Variant {
    std::string name;
    int64_t local_batch;
    std::vector<std::string> args;
  };
  std::vector<Variant> variants = {
      {"pp every rank, Interleaved1F1B", 8, pp_args(w, "Interleaved1F1B", 2)}};
  if (w == 4) {
    variants.push_back({"pp 2 x FSDP 2", 4, pp_args(2, "1F1B", 1)});
    // Sequence-parallel stages pass [1, padded T / tp, dim] between them.
    variants.push_back(
        {"pp 2 x TP 2", 8, pp_args(2, "1F1B", 2, {"--parallelism.tensor_parallel_degree=2"})});
  }
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    EXPECT_EQ(samples(job(corpus, shared_dir("sample_pp"), v.local_batch, v.args), world()), one);
  }

  // Trained (the runs' weights equal to rounding): the same text (an untrained model's greedy
  // text is a token or two before EOS; a trained one's is longer).
  TrainerOptions options = testing::quiet_trainer_options(eight_layers, self);
  options.sample_tokens = 16;
  Trainer one_trainer(job(corpus, shared_dir("sample_one") / std::to_string(world()->rank()), 8),
                      options);
  const TrainResult trained_one = one_trainer.train();
  options.world = world();
  Trainer pp_trainer(job(corpus, shared_dir("sample_pp"), 8, pp_args(w, "1F1B", 2)), options);
  const TrainResult trained_pp = pp_trainer.train();
  ASSERT_GT(trained_one.sample.size(), 8u);
  EXPECT_EQ(trained_pp.sample, trained_one.sample);
  const std::string greedy = one_trainer.generate_sample("ROMEO:", 16, 0.0);
  ASSERT_GT(greedy.size(), 8u);
  EXPECT_EQ(pp_trainer.generate_sample("ROMEO:", 16, 0.0), greedy);
}

// Saved at step 5 of a run, resumed on `ranks` ranks with `resumed` settings: steps 6..10 as the
// uninterrupted run's.
void expect_resumes(const fs::path& corpus, const fs::path& dump, const TrainResult& straight,
                    int ranks, int64_t local_batch, const std::vector<std::string>& resumed,
                    std::function<void(std::any&)> edit = eight_layers) {
  testing::expect_resumes_on(*world(), ranks, straight, 5, [&](std::shared_ptr<ProcessGroup> sub) {
    std::vector<std::string> args = {"--checkpoint.enable=true", "--checkpoint.interval=5",
                                     "--checkpoint.load_step=5"};
    args.insert(args.end(), resumed.begin(), resumed.end());
    return run(job(corpus, dump, local_batch, args), sub, edit);
  });
}

// A checkpoint holds whole tensors in global coordinates: saved with pp = every rank, it resumes
// with pp 1 on one rank (and, on 4 ranks, pp 2 x FSDP 2); on 4 ranks pp 2 x FSDP 2 resumes with
// pp 4, and the MoE model saved with pp 2 x EP 2 resumes on one rank and with pp 4; saved by
// FSDP alone, it resumes with pp.
TEST(TrainerPipelineMpi, CheckpointsReshardAcrossPipelineDegrees) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const std::vector<std::string> ckpt = {"--checkpoint.enable=true", "--checkpoint.interval=5"};
  {
    const fs::path dump = shared_dir("pp_ckpt");
    std::vector<std::string> args = pp_args(w, "1F1B", 2, ckpt);
    const TrainResult straight = run(job(corpus, dump, 8, args), world());
    expect_resumes(corpus, dump, straight, 1, 8, {});
    if (w == 4) expect_resumes(corpus, dump, straight, 4, 4, pp_args(2, "Interleaved1F1B", 1));
  }
  if (w == 4) {  // pp 2 x FSDP 2 -> pp 4
    const fs::path dump = shared_dir("pp2_ckpt");
    const TrainResult straight = run(job(corpus, dump, 4, pp_args(2, "1F1B", 1, ckpt)), world());
    expect_resumes(corpus, dump, straight, 4, 8, pp_args(4, "1F1B", 2));
    const std::vector<std::string> moe = {"--model.name=deepseek_v3", "--model.flavor=moe_debug"};
    std::vector<std::string> ep = ckpt;
    ep.insert(ep.end(), moe.begin(), moe.end());
    ep.push_back("--parallelism.expert_parallel_degree=2");
    const fs::path moe_dump = shared_dir("pp2_ep2_ckpt");
    const TrainResult moe_straight =
        run(job(corpus, moe_dump, 4, pp_args(2, "1F1B", 1, ep)), world(), eight_moe_layers);
    expect_resumes(corpus, moe_dump, moe_straight, 1, 8, moe, eight_moe_layers);
    expect_resumes(corpus, moe_dump, moe_straight, 4, 8, pp_args(4, "1F1B", 2, moe),
                   eight_moe_layers);
  }
  {
    const fs::path dump = shared_dir("fsdp_ckpt");
    const TrainResult straight = run(job(corpus, dump, 8 / w, ckpt), world());
    expect_resumes(corpus, dump, straight, int(w), 8, pp_args(w, "GPipe", 2));
  }
}

// The MoE model: its stages' load-balancing counts are summed over each stage's ranks, and the
// model-wide load imbalance is gathered from every stage; on 4 ranks also pp 2 x FSDP 2 and
// pp 2 x TP 2.
TEST(TrainerPipelineMpi, MoeMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const std::vector<std::string> moe = {"--model.name=deepseek_v3", "--model.flavor=moe_debug"};
  const auto moe_args = [&](std::vector<std::string> more) {
    more.insert(more.end(), moe.begin(), moe.end());
    return more;
  };
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const TrainResult want =
      run(job(corpus, shared_dir("moe_ref") / std::to_string(world()->rank()), 8, moe), self,
          eight_moe_layers);
  std::vector<std::pair<std::string, TrainResult>> runs;
  for (const std::string schedule :
       {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"}) {
    runs.emplace_back(schedule, run(job(corpus, shared_dir("moe_" + schedule), 8,
                                        pp_args(w, schedule, 2, moe_args({}))),
                                    world(), eight_moe_layers));
  }
  if (w == 4) {
    runs.emplace_back("pp 2 x FSDP 2", run(job(corpus, shared_dir("moe_pp_fsdp"), 4,
                                               pp_args(2, "1F1B", 1, moe_args({}))),
                                           world(), eight_moe_layers));
    runs.emplace_back("pp 2 x EP 2", run(job(corpus, shared_dir("moe_pp_ep"), 4,
                                             pp_args(2, "1F1B", 1,
                                                     moe_args({"--parallelism.expert_parallel_degree=2"}))),
                                     world(), eight_moe_layers));
    runs.emplace_back(
        "pp 2 x TP 2",
        run(job(corpus, shared_dir("moe_pp_tp"), 8,
                pp_args(2, "1F1B", 2, moe_args({"--parallelism.tensor_parallel_degree=2"}))),
            world(), eight_moe_layers));
  }
  for (const auto& [name, got] : runs) {
    SCOPED_TRACE(name);
    testing::expect_same_moe_run(got, want);
  }
}

// The sequence-wise auxiliary loss (aux_loss_alpha > 0) of each stage's MoE layers is added to
// the micro-batch's loss and backpropagated from its stage, its gradient reaching the earlier
// stages through the activations' gradients: losses (which include it) and gradient norms as one
// process, under every schedule.
TEST(TrainerPipelineMpi, MoeAuxiliaryLossMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const std::vector<std::string> moe = {"--model.name=deepseek_v3", "--model.flavor=moe_debug"};
  const auto with_aux = [](std::any& args) {
    eight_moe_layers(args);
    std::any_cast<models::moe::ModelArgs&>(args).aux_loss_alpha = 0.05;
  };
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const TrainResult want =
      run(job(corpus, shared_dir("aux_ref") / std::to_string(world()->rank()), 8, moe), self,
          with_aux);
  const TrainResult without =
      run(job(corpus, shared_dir("aux_off") / std::to_string(world()->rank()), 8, moe), self,
          eight_moe_layers);
  ASSERT_NE(want.losses, without.losses);  // the auxiliary loss is in the loss and its gradient
  std::map<std::string, TrainResult> runs;
  for (const std::string schedule :
       {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"}) {
    SCOPED_TRACE(schedule);
    runs[schedule] =
        run(job(corpus, shared_dir("aux_" + schedule), 8, pp_args(w, schedule, 2, moe)), world(),
            with_aux);
    testing::expect_same_run(runs[schedule], want);
  }
  if (w == 4) {
    SCOPED_TRACE("pp 2 x FSDP 2");
    testing::expect_same_run(run(job(corpus, shared_dir("aux_pp_fsdp"), 4,
                                     pp_args(2, "1F1B", 1, moe)),
                                 world(), with_aux),
                             want);
  }
  // Zero bubble against Interleaved1F1B: to float rounding, not bitwise as without the auxiliary
  // loss (measured: gradient norms 1e-11 apart at step 1, 2e-7 by step 9; the second backward
  // root changes the order in which the split passes sum some gradients).
  const TrainResult& zb = runs["InterleavedZeroBubble"];
  const TrainResult& ref = runs["Interleaved1F1B"];
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(zb.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(zb.grad_norms[i], ref.grad_norms[i], 1e-5 * ref.grad_norms[i]) << "step " << i + 1;
  }
}

// Float8 linears (emulated on the CPU) in the stages: each micro-batch's GEMMs scale its own
// activations, as one process's gradient-accumulation micro-batches of the same size do, so pp =
// every rank matches one process that accumulates 4 micro-batches of 2 sequences (tensorwise and
// rowwise recipes; and the MoE model with float8 experts).
TEST(TrainerPipelineMpi, Float8MatchesOneProcessWithTheSameMicroBatches) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  for (const std::string recipe : {"tensorwise", "rowwise"}) {
    SCOPED_TRACE(recipe);
    const std::vector<std::string> f8 = {"--quantize.linear.float8.enable=true",
                                         "--quantize.linear.float8.emulate=true",
                                         "--quantize.linear.float8.recipe_name=" + recipe,
                                         // validation batches would differ in size (2 and 8)
                                         "--validation.enable=false"};
    const TrainResult want =
        run(job(corpus, shared_dir("f8_ref_" + recipe) / std::to_string(world()->rank()), 2, f8),
            self);
    testing::expect_same_run(
        run(job(corpus, shared_dir("f8_" + recipe), 8, pp_args(w, "1F1B", 2, f8)), world()),
        want);
  }
  // The MoE model with float8 routed experts (rowwise grouped GEMMs) and linears: each stage
  // converts its own experts, each micro-batch's experts scale over its own tokens.
  SCOPED_TRACE("MoE, float8 experts");
  const std::vector<std::string> moe_f8 = {"--model.name=deepseek_v3", "--model.flavor=moe_debug",
                                           "--quantize.linear.float8.enable=true",
                                           "--quantize.linear.float8.emulate=true",
                                           "--quantize.grouped_mm.float8.fqns=experts",
                                           "--quantize.grouped_mm.float8.emulate=true",
                                           "--validation.enable=false"};
  const TrainResult want =
      run(job(corpus, shared_dir("f8_moe_ref") / std::to_string(world()->rank()), 2, moe_f8),
          self, eight_moe_layers);
  testing::expect_same_run(
      run(job(corpus, shared_dir("f8_moe"), 8, pp_args(w, "1F1B", 2, moe_f8)), world(),
          eight_moe_layers),
      want);
}

TEST(TrainerPipelineMpi, SettingsThatCannotRunAreErrorsOnEveryRank) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const auto expect_error = [&](const std::string& name, int64_t local_batch,
                                const std::vector<std::string>& args,
                                const std::vector<std::string>& needles) {
    SCOPED_TRACE(name);
    try {
      run(job(corpus, shared_dir(name), local_batch, args), world());
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  // Stages that do not divide the 8 layers.
  expect_error("bad_layers", 8,
               pp_args(w, "1F1B", 2, {"--parallelism.pipeline_parallel_layers_per_stage=3"}),
               {"8 layers", "layers_per_stage = 3"});
  // 1F1B needs at least pp micro-batches: 8 sequences of 8 make one.
  expect_error("too_few_microbatches", 8, pp_args(w, "1F1B", 8),
               {"1F1B", "1 micro-batches", "pipeline_parallel_microbatch_size 8"});
  // A micro-batch size that does not divide the local batch.
  expect_error("bad_microbatch", 8, pp_args(w, "1F1B", 3),
               {"local_batch_size", "pipeline_parallel_microbatch_size"});
  // Degrees that do not fit the world.
  expect_error("bad_world", 8, pp_args(w + 1, "1F1B", 1), {"pipeline_parallel_degree", "world"});
}

}  // namespace
}  // namespace mt::train
