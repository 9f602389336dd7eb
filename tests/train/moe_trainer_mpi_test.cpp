// MoE training with expert parallelism on real ranks (mpirun -np 2 and -np 4): the `train` loop
// with ep = 2 and ep = 4 (FSDP on the rest), and with tensor parallelism (tp 2, TP 2 x EP 2; also
// with the sequence-wise auxiliary loss), against one process with the same global batch, and
// checkpoints saved at ep = 4 resumed at ep = 2 and ep = 1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <any>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "models/moe/model_args.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"
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
  return testing::shared_dir(*world(), "mt_moe_trainer_mpi", name);
}

fs::path small_tokenizer(const fs::path& corpus) {
  static const fs::path dir = testing::shared_small_tokenizer(*world(), "mt_moe_trainer_mpi", corpus);
  return dir;
}

config::JobConfig job(const fs::path& corpus, const fs::path& dump, int64_t local_batch,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "--model.name=deepseek_v3",
      "--model.flavor=moe_debug",
      "--job.dump_folder=" + dump.string(),
      "--model.tokenizer_path=" + small_tokenizer(corpus).string(),
      "--training.dataset_path=" + corpus.string(),
      "--training.local_batch_size=" + std::to_string(local_batch),
      "--training.global_batch_size=8",
      "--training.seq_len=32",
      "--training.steps=10",
      "--training.seed=5",
      "--training.max_norm=0.5",
      "--training.mixed_precision_param=float32",
      "--optimizer.lr=1e-2",
      "--lr_scheduler.warmup_steps=1",
      "--validation.enable=false",
  };
  args.insert(args.end(), extra.begin(), extra.end());
  return config::load_config(fs::path(), args);
}

TrainResult run(const config::JobConfig& cfg, std::shared_ptr<ProcessGroup> group,
               int64_t num_experts = 8, double aux_loss_alpha = 0) {
  const auto shrink = [num_experts, aux_loss_alpha](std::any& args) {
    testing::shrink_moe(args);
    auto& moe = std::any_cast<models::moe::ModelArgs&>(args);
    moe.n_routed_experts = num_experts;
    moe.aux_loss_alpha = aux_loss_alpha;
  };
  return Trainer(cfg, testing::quiet_trainer_options(shrink, std::move(group))).train();
}

// One process (a group of this rank alone), 8 sequences per step.
const TrainResult& reference(const fs::path& corpus) {
  static const TrainResult r = [&] {
    std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
    return run(job(corpus, shared_dir("reference") / std::to_string(world()->rank()), 8), self);
  }();
  return r;
}

// Losses, total grad norms (both meshes) and the load imbalance (counts summed over ranks).
void expect_same_run(const TrainResult& got, const TrainResult& want, size_t from = 0) {
  ASSERT_EQ(got.losses.size() + from, want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    const size_t w = i + from;
    EXPECT_NEAR(got.losses[i], want.losses[w], 2e-5 * want.losses[w]) << "step " << w + 1;
    EXPECT_NEAR(got.grad_norms[i], want.grad_norms[w], 2e-5 * want.grad_norms[w])
        << "step " << w + 1;
    ASSERT_TRUE(want.model_metrics[w].count("moe_load_imbalance")) << "step " << w + 1;
    EXPECT_NEAR(got.model_metrics[i].at("moe_load_imbalance"),
                want.model_metrics[w].at("moe_load_imbalance"), 1e-9)
        << "step " << w + 1;
  }
}

TEST(MoeTrainerMpi, ExpertParallelMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const TrainResult& want = reference(corpus);
  EXPECT_LT(want.losses.back(), want.losses.front() - 0.5);  // it trains
  for (int64_t ep = 2; ep <= w; ep *= 2) {  // np 2: ep 2; np 4: ep 2 (efsdp 2) and ep 4
    SCOPED_TRACE(::testing::Message() << "ep = " << ep << " on " << w << " ranks");
    const std::vector<std::string> extra = {"--parallelism.expert_parallel_degree=" +
                                            std::to_string(ep)};
    expect_same_run(run(job(corpus, shared_dir("ep" + std::to_string(ep)), 8 / w, extra), world()),
                    want);
  }
}

// The end-of-run text sample decodes the MoE model with a KV cache; with expert parallelism every
// rank decodes in lock-step (the tokens' experts on their ranks) and rank 0's token is everyone's:
// one process's text, sampled and greedy, untrained and after training.
TEST(MoeTrainerMpi, TextSampleWithExpertParallelMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const auto shrink = [](std::any& args) { testing::shrink_moe(args); };
  const auto samples = [&](const Trainer& t) {
    return std::vector<std::string>{t.generate_sample("", 12, 0.8),
                                    t.generate_sample("ROMEO:", 12, 0.0)};
  };
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const std::vector<std::string> ep = {"--parallelism.expert_parallel_degree=" + std::to_string(w)};
  Trainer one(job(corpus, shared_dir("sample_one") / std::to_string(world()->rank()), 8),
              testing::quiet_trainer_options(shrink, self));
  Trainer sharded(job(corpus, shared_dir("sample_ep"), 8 / w, ep),
                  testing::quiet_trainer_options(shrink, world()));
  const std::vector<std::string> before = samples(one);
  ASSERT_GT(before[0].size(), 8u);
  EXPECT_EQ(samples(sharded), before);
  one.train();
  sharded.train();
  const std::vector<std::string> after = samples(one);
  // Some text to compare (the greedy one may end at once: the trained model picks EOS).
  ASSERT_GE(after[0].size(), 4u);
  EXPECT_NE(after, before);
  EXPECT_EQ(samples(sharded), after);
}

// With tensor parallelism (tp 2 on each pair of ranks) every decode step's tokens are padded to
// a multiple of tp, with sequence parallelism and without it (then the MoE layers still split
// the tokens over tp: one decoded token used to leave the other rank none, and the gather
// failed): one process's text.
TEST(MoeTrainerMpi, TextSampleWithTensorParallelMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const auto shrink = [](std::any& args) { testing::shrink_moe(args); };
  const auto samples = [&](const Trainer& t) {
    return std::vector<std::string>{t.generate_sample("", 12, 0.8),
                                    t.generate_sample("ROMEO:", 12, 0.0)};
  };
  const int64_t r = world()->rank();
  std::shared_ptr<ProcessGroup> self = world()->split(int(r), 0);
  std::shared_ptr<ProcessGroup> pair = world()->split(int(r / 2), int(r));
  const Trainer one(job(corpus, shared_dir("tp_sample_one") / std::to_string(r), 8),
                    testing::quiet_trainer_options(shrink, self));
  const std::vector<std::string> want = samples(one);
  ASSERT_GT(want[0].size(), 8u);
  for (const bool sp : {true, false}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallel");
    const std::vector<std::string> tp = {
        "--parallelism.tensor_parallel_degree=2",
        std::string("--parallelism.enable_sequence_parallel=") + (sp ? "true" : "false")};
    const Trainer split(
        job(corpus, shared_dir(sp ? "tp_sample_sp" : "tp_sample_no_sp") / std::to_string(r / 2),
            8, tp),
        testing::quiet_trainer_options(shrink, pair));
    EXPECT_EQ(samples(split), want);
  }
}

const std::vector<std::string> kFloat8Experts = {"--quantize.grouped_mm.float8.fqns=experts",
                                                 "--quantize.grouped_mm.float8.emulate=true"};

// One process with float8 experts (emulated grouped GEMMs).
const TrainResult& float8_reference(const fs::path& corpus) {
  static const TrainResult r = [&] {
    std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
    return run(job(corpus, shared_dir("f8_reference") / std::to_string(world()->rank()), 8,
                   kFloat8Experts),
               self);
  }();
  return r;
}

// Float8 grouped GEMMs (emulated) scale each token by its own row and each expert by its own
// tokens, which expert parallelism brings together on the expert's rank: EP trains as one process
// with the same float8 experts.
TEST(MoeTrainerMpi, Float8GroupedGemmsWithExpertParallelMatchOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const int64_t w = world()->size();
  const TrainResult& want = float8_reference(corpus);
  EXPECT_NE(want.losses, reference(corpus).losses) << "float8 experts gave the f32 losses";
  std::vector<std::string> extra = kFloat8Experts;
  extra.push_back("--parallelism.expert_parallel_degree=" + std::to_string(w));
  expect_same_run(run(job(corpus, shared_dir("f8_ep"), 8 / w, extra), world()), want);
}

// tp 2 on 2 ranks, TP 2 x EP 2 on 4, with and without sequence parallelism, against `want`.
void expect_tensor_parallel_runs(const fs::path& corpus, const std::string& name,
                                 const TrainResult& want, double aux_loss_alpha,
                                 std::vector<std::string> more = {}) {
  const int64_t w = world()->size(), dp = w / 2;
  for (const bool sp : {true, false}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallel");
    std::vector<std::string> extra = {"--parallelism.tensor_parallel_degree=2",
                                      std::string("--parallelism.enable_sequence_parallel=") +
                                          (sp ? "true" : "false")};
    extra.insert(extra.end(), more.begin(), more.end());
    if (w == 4) extra.push_back("--parallelism.expert_parallel_degree=2");
    expect_same_run(run(job(corpus, shared_dir(name + (sp ? "_sp" : "_no_sp")), 8 / dp, extra),
                        world(), 8, aux_loss_alpha),
                    want);
  }
}

// Tensor parallelism: tp 2 on 2 ranks (the MoE layers run on each tp rank's sequence shard), and
// on 4 ranks TP 2 x EP 2 (dp_shard 2 = ep 2 x efsdp 1; expert mesh (dp_replicate, ep, efsdp, tp)),
// with sequence parallelism and without it (the MoE layers' input chunked, output gathered).
TEST(MoeTrainerMpi, TensorParallelTimesExpertParallelMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  expect_tensor_parallel_runs(corpus, "tp", reference(corpus), 0);
}

// Float8 experts under tensor parallelism: the experts are whole on each tp rank, which routes
// its own share of the tokens; the weight gradients' per-(expert, feature) scales are reduced over
// tp, so each expert is scaled over all its tokens and tp 2 (TP 2 x EP 2 on 4 ranks) trains as
// one process with the same float8 experts.
TEST(MoeTrainerMpi, Float8GroupedGemmsWithTensorParallelMatchOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  expect_tensor_parallel_runs(corpus, "f8_tp", float8_reference(corpus), 0, kFloat8Experts);
}

// The sequence-wise auxiliary loss under tensor parallelism: each tp rank routes a share of every
// sequence, the routed counts add up over tp and the ranks' losses are averaged, so tp 2 (and
// TP 2 x EP 2 on 4 ranks), with and without sequence parallelism, trains as one process.
TEST(MoeTrainerMpi, AuxLossUnderTensorParallelMatchesOneProcess) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  constexpr double alpha = 0.1;
  // 3 steps: the loss and two updates (the auxiliary loss pushes the router's scores together,
  // so a later near-tie in the routing may flip between two float orders).
  const std::vector<std::string> steps = {"--training.steps=3"};
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const TrainResult want =
      run(job(corpus, shared_dir("aux_reference") / std::to_string(world()->rank()), 8, steps),
          self, 8, alpha);
  ASSERT_FALSE(want.losses.empty());
  EXPECT_GT(want.losses[0], reference(corpus).losses[0] + 1e-3);  // the auxiliary loss is on
  expect_tensor_parallel_runs(corpus, "aux_tp", want, alpha, steps);
}

// 2 experts, ep = 2 and efsdp = 2: one expert per ep rank, fewer than the efsdp ranks that shard
// it, so FSDP shards each expert along dim 1.
TEST(MoeTrainerMpi, FewerExpertsThanShardingRanksShardExpertsOnDim1) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  if (world()->size() != 4) GTEST_SKIP() << "needs ep = 2 x efsdp = 2";
  std::shared_ptr<ProcessGroup> self = world()->split(world()->rank(), 0);
  const TrainResult want =
      run(job(corpus, shared_dir("dim1_ref") / std::to_string(world()->rank()), 8), self, 2);
  expect_same_run(run(job(corpus, shared_dir("dim1"), 2, {"--parallelism.expert_parallel_degree=2"}),
                      world(), 2),
                  want);
}

TEST(MoeTrainerMpi, CheckpointAtEp4ResumesAtEp2AndEp1) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  if (world()->size() != 4) GTEST_SKIP() << "saves on 4 ranks with ep = 4";
  const fs::path dump = shared_dir("reshard");
  const std::vector<std::string> ckpt = {"--checkpoint.enable=true", "--checkpoint.interval=5"};
  std::vector<std::string> saved = ckpt;
  saved.push_back("--parallelism.expert_parallel_degree=4");
  const TrainResult straight = run(job(corpus, dump, 2, saved), world());
  std::vector<std::string> resume = ckpt;
  resume.push_back("--checkpoint.load_step=5");
  // ep = 2 on 2 ranks (experts split in two, no efsdp), ep = 2 on 4 ranks (efsdp = 2), and one
  // process (ep = 1): the same steps 6..10.
  struct Layout {
    int ranks;
    int64_t ep;
  };
  for (const Layout l : {Layout{2, 2}, Layout{4, 2}, Layout{1, 1}}) {
    SCOPED_TRACE(::testing::Message() << "resumed on " << l.ranks << " ranks, ep " << l.ep);
    const bool member = world()->rank() < l.ranks;
    std::shared_ptr<ProcessGroup> sub = world()->split(member ? 0 : 1, world()->rank());
    if (!member) continue;
    std::vector<std::string> args = resume;
    args.push_back("--parallelism.expert_parallel_degree=" + std::to_string(l.ep));
    const TrainResult resumed = run(job(corpus, dump, 8 / l.ranks, args), sub);
    ASSERT_EQ(resumed.first_step, 6);
    expect_same_run(resumed, straight, 5);
  }
  world()->barrier("reshard.end");
}

}  // namespace
}  // namespace mt::train
