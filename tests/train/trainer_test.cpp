// The Trainer (train/trainer.h) end to end: a shrunk Llama debug model trained on tinyshakespeare
// (tokenized on the fly with a small BPE tokenizer trained in the test) gets its loss below a
// threshold, two runs give bit-for-bit identical losses (also with another thread count),
// gradient accumulation matches one large batch, float8 training (emulated on the CPU) tracks
// float32, and config/data errors reach the user as messages.
#include "train/trainer.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/dataset/token_file.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/determinism.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/tensorboard_events.h"
#include "tests/testing/trainer_fixtures.h"
#include "train/config/load.h"
#include "train/float8_setup.h"
#include "train/run_scaffold.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

fs::path temp_dir(const std::string& name) {
  // Per process: ctest runs each TEST as its own process, several at once.
  return testing::process_temp_dir("mt_trainer_test", name);
}

// The small tokenizer (tests/testing/trainer_fixtures.h), saved once per process.
fs::path small_tokenizer(const fs::path& corpus) {
  static const fs::path dir = [&] {
    const fs::path d = temp_dir("tokenizer");
    testing::save_small_tokenizer(corpus, d);
    return d;
  }();
  return dir;
}

config::JobConfig tiny_config(const fs::path& corpus, const fs::path& dump,
                              std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "--job.dump_folder=" + dump.string(),
      "--model.tokenizer_path=" + small_tokenizer(corpus).string(),
      "--training.dataset_path=" + corpus.string(),
      "--training.local_batch_size=8",
      "--training.seq_len=64",
      "--training.steps=60",
      "--training.seed=3",
      "--training.deterministic=true",
      "--training.mixed_precision_param=float32",
      "--optimizer.lr=1e-2",
      "--lr_scheduler.warmup_steps=1",
      "--validation.enable=true",
      "--validation.freq=30",
      "--validation.steps=2",
      "--metrics.log_freq=20",
  };
  args.insert(args.end(), extra.begin(), extra.end());
  return config::load_config(fs::path(), args);
}

// As run(), keeping the log in `log`.
TrainResult run_logged(const config::JobConfig& cfg, std::string& log) {
  TrainerOptions options;
  options.edit_model_args = testing::shrink_llama;
  std::ostringstream out;
  options.log = &out;
  options.handle_signals = false;
  options.write_files = false;
  options.sample_tokens = 0;
  TrainResult r = Trainer(cfg, options).train();
  log = out.str();
  return r;
}

TrainResult run(const config::JobConfig& cfg, bool write_files = false) {
  TrainerOptions options;
  options.edit_model_args = testing::shrink_llama;
  options.quiet = true;
  options.handle_signals = false;
  options.write_files = write_files;
  options.sample_tokens = 0;
  Trainer trainer(cfg, options);
  return trainer.train();
}

double mean_last(const std::vector<double>& v, size_t n) {
  return std::accumulate(v.end() - long(n), v.end(), 0.0) / double(n);
}

TEST(Trainer, LossFallsAndRunsAreBitForBitReproducible) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dump = temp_dir("reproducible");
  const int threads = omp_get_max_threads();
  const TrainResult a = run(tiny_config(corpus, dump), /*write_files=*/true);
  ASSERT_EQ(a.losses.size(), 60u);
  EXPECT_EQ(a.steps_done, 60);
  // ln(512) = 6.24 at the start; a bigram-level model is near 3.9.
  EXPECT_GT(a.losses.front(), 5.8);
  EXPECT_LT(mean_last(a.losses, 5), 4.6) << "the loss did not fall enough";
  ASSERT_EQ(a.val_losses.size(), 2u);
  EXPECT_EQ(a.val_losses[0].first, 30);
  EXPECT_LT(a.val_losses[1].second, a.val_losses[0].second);
  for (double g : a.grad_norms) EXPECT_TRUE(std::isfinite(g) && g > 0);
  // The run's files.
  EXPECT_TRUE(fs::exists(dump / "config.toml"));
  EXPECT_TRUE(fs::exists(dump / "metrics.jsonl"));
  EXPECT_TRUE(fs::exists(dump / "loss.svg"));
  EXPECT_TRUE(fs::exists(dump / "tinyshakespeare.tokens.h5"));  // the tokenized text, cached

  // Same config, another thread count: the same losses, bit for bit.
  omp_set_num_threads(threads == 1 ? 2 : 1);
  const TrainResult b = run(tiny_config(corpus, dump));
  omp_set_num_threads(threads);
  ASSERT_EQ(b.losses.size(), a.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  EXPECT_EQ(a.val_losses, b.val_losses);
}

// [profiling]: every profile_freq-th step writes a Chrome trace, and profiling changes no result.
TEST(Trainer, ProfiledStepsWriteTracesAndLeaveTheLossesAlone) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::vector<std::string> short_run = {"--training.steps=4", "--validation.enable=false"};
  std::vector<std::string> profiled = short_run;
  profiled.insert(profiled.end(), {"--profiling.enable=true", "--profiling.profile_freq=2",
                                   "--profiling.save_traces_folder=traces"});
  const fs::path plain_dump = temp_dir("unprofiled"), dump = temp_dir("profiled");
  const TrainResult plain = run(tiny_config(corpus, plain_dump, short_run), true);
  const TrainResult with = run(tiny_config(corpus, dump, profiled), true);
  EXPECT_EQ(with.losses, plain.losses);
  EXPECT_EQ(with.grad_norms, plain.grad_norms);
  for (int step = 1; step <= 4; ++step) {
    const fs::path trace = dump / "traces" / ("step_" + std::to_string(step) + ".json");
    EXPECT_EQ(fs::exists(trace), step % 2 == 0) << trace;
    if (step % 2 == 0) {
      EXPECT_GT(fs::file_size(trace), 1000u) << trace;
    }
  }
  EXPECT_FALSE(fs::exists(plain_dump / "profile_traces"));
}

// Between logged steps the host does not read the losses (on a GPU it queues the next steps):
// every step's loss and norm still reach the result, and the logged lines show their own step's.
TEST(Trainer, LossesReadAtLoggedStepsAreEveryStepsLosses) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::vector<std::string> short_run = {"--training.steps=7", "--validation.enable=false"};
  std::vector<std::string> sparse = short_run, every = short_run;
  sparse.push_back("--metrics.log_freq=3");
  sparse.push_back("--metrics.enable_tensorboard=true");
  every.push_back("--metrics.log_freq=1");
  const fs::path dump = temp_dir("log_freq_3");
  const TrainResult each = run(tiny_config(corpus, temp_dir("log_freq_1"), every));
  const TrainResult logged = run(tiny_config(corpus, dump, sparse), /*write_files=*/true);
  ASSERT_EQ(each.losses.size(), 7u);
  EXPECT_EQ(logged.losses, each.losses);
  EXPECT_EQ(logged.grad_norms, each.grad_norms);
  EXPECT_EQ(logged.model_metrics.size(), 7u);
  std::ifstream jsonl(dump / "metrics.jsonl");
  std::vector<int> steps;
  for (std::string line; std::getline(jsonl, line);) {
    const auto field = [&](const std::string& key) {
      const size_t at = line.find("\"" + key + "\":");
      EXPECT_NE(at, std::string::npos) << key << " in " << line;
      return at == std::string::npos ? std::nan("") : std::stod(line.substr(at + key.size() + 3));
    };
    const int step = int(field("step"));
    steps.push_back(step);
    if (step >= 1 && step <= 7) {
      EXPECT_DOUBLE_EQ(field("loss"), each.losses[size_t(step - 1)]) << line;
    }
  }
  EXPECT_EQ(steps, (std::vector<int>{1, 3, 6, 7}));
  // TensorBoard gets the same logged steps' values (as floats).
  const testing::EventFile tb = testing::read_event_file(testing::only_event_file(dump / "tb"));
  std::vector<int> tb_steps;
  for (const testing::ScalarEvent& e : tb.scalars) {
    if (e.tag != "loss") continue;
    tb_steps.push_back(int(e.step));
    EXPECT_EQ(e.value, float(each.losses[size_t(e.step - 1)])) << "step " << e.step;
  }
  EXPECT_EQ(tb_steps, (std::vector<int>{1, 3, 6, 7}));
}

// [training] deterministic holds for the run (RunScaffold, around every trainer's steps), and
// the process's mode comes back after it.
TEST(Trainer, DeterministicConfigHoldsForTheRun) {
  ASSERT_TRUE(runtime::deterministic_algorithms());
  auto world = parallel::MpiProcessGroup::world();
  TrainerOptions options;
  options.handle_signals = false;
  options.write_files = false;
  std::ostringstream out;
  for (bool deterministic : {false, true}) {
    const std::string flag = deterministic ? "true" : "false";
    const config::JobConfig cfg =
        config::load_config(fs::path(), {"--training.deterministic=" + flag});
    {
      RunScaffold run(cfg, options, *world, nullptr, out);
      EXPECT_EQ(runtime::deterministic_algorithms(), deterministic);
    }
    EXPECT_TRUE(runtime::deterministic_algorithms());
  }
}

TEST(Trainer, GradientAccumulationMatchesOneLargeBatch) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dump = temp_dir("accumulation");
  const std::vector<std::string> common = {"--training.steps=3", "--validation.enable=false"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return tiny_config(corpus, dump, extra);
  };
  // 8 rows at once vs 2 micro-batches of 4: the loader hands out the same windows in order.
  const config::JobConfig one = with({"--training.local_batch_size=8"});
  const config::JobConfig acc =
      with({"--training.local_batch_size=4", "--training.global_batch_size=8"});
  TrainerOptions options;
  options.edit_model_args = testing::shrink_llama;
  EXPECT_EQ(Trainer(acc, options).grad_accum_steps(), 2);
  const TrainResult a = run(one), b = run(acc);
  ASSERT_EQ(a.losses.size(), 3u);
  ASSERT_EQ(b.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-4) << "step " << i + 1;
    EXPECT_NEAR(a.grad_norms[i], b.grad_norms[i], 1e-4 * a.grad_norms[i]) << "step " << i + 1;
  }
}

TEST(Trainer, OneProcessAppliesBf16MixedPrecision) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dump = temp_dir("bf16");
  auto with = [&](const std::string& param_dtype) {
    return tiny_config(corpus, dump,
                       {"--training.steps=20", "--validation.enable=false",
                        "--training.mixed_precision_param=" + param_dtype});
  };
  // FSDP on a 1-rank mesh casts the f32 master weights to bf16 for forward and backward: the
  // losses are not f32's bit for bit (so the policy did apply) but track them and still fall.
  const TrainResult f32 = run(with("float32")), bf16 = run(with("bfloat16"));
  ASSERT_EQ(bf16.losses.size(), 20u);
  double max_diff = 0.0;
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_NEAR(f32.losses[i], bf16.losses[i], 0.05 * f32.losses[i]) << "step " << i + 1;
    max_diff = std::max(max_diff, std::abs(f32.losses[i] - bf16.losses[i]));
  }
  // bf16 keeps 8 bits of mantissa: the losses differ in the third digit, not the seventh.
  EXPECT_GT(max_diff, 5e-4) << "bfloat16 compute gave float32's losses";
  std::cout << "bf16 vs f32: max loss difference over 20 steps " << max_diff << "\n";
  EXPECT_LT(mean_last(bf16.losses, 3), bf16.losses.front() - 0.5);
}

// On one shard rank "default" keeps the blocks' bf16 copies from forward to backward (nothing to
// gather, so no memory is worth casting them again); "always" casts again: the same losses.
TEST(Trainer, OneRankDefaultKeepsTheBlocksUnshardedWithTheSameLosses) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  auto train_with = [&](const std::string& reshard, std::string& log) {
    return run_logged(tiny_config(corpus, temp_dir("reshard_" + reshard),
                                  {"--training.steps=4", "--validation.enable=false",
                                   "--training.mixed_precision_param=bfloat16",
                                   "--parallelism.fsdp_reshard_after_forward=" + reshard}),
                      log);
  };
  std::string default_log, always_log;
  const TrainResult kept = train_with("default", default_log);
  const TrainResult recast = train_with("always", always_log);
  EXPECT_NE(default_log.find("reshard after forward: default (blocks: no, root: no)"),
            std::string::npos)
      << default_log;
  EXPECT_NE(always_log.find("reshard after forward: always (blocks: yes, root: yes)"),
            std::string::npos)
      << always_log;
  ASSERT_EQ(kept.losses.size(), 4u);
  EXPECT_EQ(kept.losses, recast.losses);
  EXPECT_EQ(kept.grad_norms, recast.grad_norms);
}

// [activation_checkpoint]: the default (selective, every 2 blocks, as torchtitan's) recomputes
// every second block, full every block; both give the losses of none, bitwise.
TEST(Trainer, ActivationCheckpointingAppliesAndKeepsTheLosses) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  std::map<std::string, TrainResult> runs;
  std::map<std::string, std::string> logs;
  for (const std::string mode : {"none", "full", "default", "op"}) {
    std::vector<std::string> flags = {"--training.steps=3", "--validation.enable=false"};
    if (mode == "op")
      flags.push_back("--activation_checkpoint.selective_ac_option=op");
    else if (mode != "default")
      flags.push_back("--activation_checkpoint.mode=" + mode);
    runs[mode] = run_logged(tiny_config(corpus, temp_dir("ac_" + mode), flags), logs[mode]);
  }
  const int64_t blocks = 2;  // testing::shrink_llama
  EXPECT_NE(logs["none"].find("activation checkpointing: none (0 blocks recomputed"),
            std::string::npos)
      << logs["none"];
  EXPECT_NE(logs["full"].find("activation checkpointing: full (" + std::to_string(blocks) +
                              " blocks recomputed"),
            std::string::npos)
      << logs["full"];
  EXPECT_NE(logs["default"].find("activation checkpointing: selective, every 2 blocks (1 block "
                                 "recomputed"),
            std::string::npos)
      << logs["default"];
  EXPECT_NE(logs["op"].find("activation checkpointing: selective by op, keeping attention and "
                            "every other matmul output (2 blocks recomputed"),
            std::string::npos)
      << logs["op"];
  ASSERT_EQ(runs["none"].losses.size(), 3u);
  EXPECT_EQ(runs["full"].losses, runs["none"].losses);
  EXPECT_EQ(runs["op"].losses, runs["none"].losses);
  EXPECT_EQ(runs["op"].grad_norms, runs["none"].grad_norms);
  EXPECT_EQ(runs["default"].losses, runs["none"].losses);
  EXPECT_EQ(runs["default"].grad_norms, runs["none"].grad_norms);
}

// [quantize.linear.float8] with emulate = true: the CPU reference of float8 training. Every
// linear of the shrunk debug model (2 blocks of wq, wk, wv, wo, w1, w2, w3; all sizes multiples
// of 16) runs its GEMMs in FP8 but the output projection (filter_fqns' default); the losses track
// the float32 run's from the same seed without being them bit for bit (float8 did run).
TEST(Trainer, Float8EmulatedOnTheCpuTracksHighPrecision) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  auto train_with = [&](bool float8, const std::string& param_dtype, int64_t steps,
                        std::string& log, const std::string& recipe = "tensorwise") {
    std::vector<std::string> flags = {"--training.steps=" + std::to_string(steps),
                                      "--validation.enable=false", "--metrics.log_freq=5",
                                      "--training.mixed_precision_param=" + param_dtype};
    if (float8) {
      flags.push_back("--quantize.linear.float8.enable=true");
      flags.push_back("--quantize.linear.float8.emulate=true");
      flags.push_back("--quantize.linear.float8.recipe_name=" + recipe);
    }
    const std::string name = std::string(float8 ? "float8_" + recipe + "_" : "high_") + param_dtype;
    return run_logged(tiny_config(corpus, temp_dir(name), flags), log);
  };
  std::string high_log, f8_log;
  const TrainResult high = train_with(false, "float32", 10, high_log);
  const TrainResult f8 = train_with(true, "float32", 10, f8_log);
  EXPECT_NE(f8_log.find("float8: 14 linears (tensorwise), 1 left in float32: output (filtered)"),
            std::string::npos)
      << f8_log;
  EXPECT_EQ(high_log.find("float8:"), std::string::npos) << high_log;
  ASSERT_EQ(high.losses.size(), 10u);
  ASSERT_EQ(f8.losses.size(), 10u);
  double max_rel = 0.0;
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_TRUE(std::isfinite(f8.losses[i]) && std::isfinite(f8.grad_norms[i])) << "step " << i + 1;
    EXPECT_NEAR(f8.losses[i], high.losses[i], 0.05 * high.losses[i]) << "step " << i + 1;
    max_rel = std::max(max_rel, std::abs(f8.losses[i] - high.losses[i]) / high.losses[i]);
  }
  EXPECT_NE(f8.losses, high.losses) << "float8 gave the float32 losses bit for bit: did it run?";
  EXPECT_LT(mean_last(f8.losses, 3), f8.losses.front() - 0.5) << "the float8 loss did not fall";
  std::cout << "float8 (emulated) vs float32: max relative loss difference over 10 steps "
            << max_rel << "\n";

  // The rowwise recipe: every linear's operands scaled per row along the contracted dimension.
  std::string rowwise_log;
  const TrainResult rowwise = train_with(true, "float32", 10, rowwise_log, "rowwise");
  EXPECT_NE(rowwise_log.find("float8: 14 linears (rowwise)"), std::string::npos) << rowwise_log;
  ASSERT_EQ(rowwise.losses.size(), 10u);
  double rowwise_rel = 0.0;
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(rowwise.losses[i], high.losses[i], 0.05 * high.losses[i]) << "step " << i + 1;
    rowwise_rel =
        std::max(rowwise_rel, std::abs(rowwise.losses[i] - high.losses[i]) / high.losses[i]);
  }
  EXPECT_NE(rowwise.losses, f8.losses) << "rowwise gave the tensorwise losses: did it run?";
  EXPECT_LT(mean_last(rowwise.losses, 3), rowwise.losses.front() - 0.5);
  std::cout << "float8 rowwise (emulated) vs float32: max relative loss difference over 10 steps "
            << rowwise_rel << "\n";

  // With bf16 mixed precision (FSDP on a 1-rank mesh, the model built without values and
  // converted before it is sharded) the linears left out are in bfloat16, and it trains too.
  std::string bf16_log;
  const TrainResult bf16 = train_with(true, "bfloat16", 3, bf16_log);
  EXPECT_NE(bf16_log.find("float8: 14 linears (tensorwise), 1 left in bfloat16: output "
                          "(filtered)"),
            std::string::npos)
      << bf16_log;
  EXPECT_NE(bf16_log.find("parameters computed in bfloat16 (the float8 layers' GEMMs in FP8)"),
            std::string::npos)
      << bf16_log;
  ASSERT_EQ(bf16.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(bf16.losses[i], high.losses[i], 0.05 * high.losses[i]) << "step " << i + 1;
  }
}

// Float8 on a CPU without emulate = true is an error naming the device, also where
// training.device = "auto" resolved to the CPU (the config alone cannot tell).
TEST(Trainer, Float8OnTheCpuWithoutEmulateNamesTheDevice) {
  const config::JobConfig job = config::load_config(
      fs::path(), {"--training.device=auto", "--quantize.linear.float8.enable=true"});
  const std::string msg = error_of([&] { check_float8_device(job, runtime::Device::cpu()); });
  EXPECT_NE(msg.find("training.device = \"auto\" (command-line flag --training.device=auto) "
                     "runs on cpu"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("set quantize.linear.float8.emulate = true to run the exact CPU reference"),
            std::string::npos)
      << msg;
  config::JobConfig emulated = job;
  emulated.float8.emulate = true;
  EXPECT_NO_THROW(check_float8_device(emulated, runtime::Device::cpu()));
  config::JobConfig off = job;
  off.float8.enable = false;
  EXPECT_NO_THROW(check_float8_device(off, runtime::Device::cpu()));
}

// [quantize.grouped_mm.float8] names its own keys: its emulate on a CPU, and fqns that match no
// routed experts (llama has none) before any training.
TEST(Trainer, Float8GroupedMmErrorsNameTheirKeys) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const config::JobConfig job = config::load_config(
      fs::path(), {"--training.device=auto", "--quantize.grouped_mm.float8.fqns=experts"});
  const std::string device_msg =
      error_of([&] { check_float8_device(job, runtime::Device::cpu()); });
  EXPECT_NE(device_msg.find("set quantize.grouped_mm.float8.emulate = true"), std::string::npos)
      << device_msg;
  std::string log;
  const std::string msg = error_of([&] {
    run_logged(tiny_config(corpus, temp_dir("grouped_llama"),
                           {"--quantize.grouped_mm.float8.fqns=experts",
                            "--quantize.grouped_mm.float8.emulate=true", "--training.steps=1"}),
               log);
  });
  EXPECT_NE(msg.find("quantize.grouped_mm.float8.fqns = [\"experts\"] (command-line flag "
                     "--quantize.grouped_mm.float8.fqns=experts) matches no MoE routed experts of "
                     "model.name = \"llama3\""),
            std::string::npos)
      << msg;
}

// How the log line names what stayed in high precision: grouped by reason, a few names each.
TEST(Trainer, Float8ConversionTextGroupsTheSkippedLinears) {
  runtime::nn::Float8Conversion c;
  c.converted = {"layers.0.attention.wq"};
  EXPECT_EQ(float8_conversion_text(c, "tensorwise", "bfloat16"), "1 linear (tensorwise)");
  c.skipped = {{"output", "filtered"},
               {"layers.0.moe.router.gate", "in 64 x out 8 is not a multiple of 16"},
               {"layers.1.moe.router.gate", "in 64 x out 8 is not a multiple of 16"},
               {"layers.2.moe.router.gate", "in 64 x out 8 is not a multiple of 16"},
               {"layers.3.moe.router.gate", "in 64 x out 8 is not a multiple of 16"}};
  EXPECT_EQ(float8_conversion_text(c, "tensorwise", "bfloat16"),
            "1 linear (tensorwise), 5 left in bfloat16: output (filtered); "
            "layers.0.moe.router.gate, layers.1.moe.router.gate, layers.2.moe.router.gate and 1 "
            "more (in 64 x out 8 is not a multiple of 16)");
}

TEST(Trainer, GeneratesASample) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dump = temp_dir("sample");
  TrainerOptions options;
  options.edit_model_args = testing::shrink_llama;
  options.quiet = true;
  options.handle_signals = false;
  options.write_files = false;
  Trainer trainer(tiny_config(corpus, dump, {"--training.steps=2"}), options);
  const std::string greedy = trainer.generate_sample("ROMEO:", 10, 0.0);
  EXPECT_FALSE(greedy.empty());
  EXPECT_EQ(greedy, trainer.generate_sample("ROMEO:", 10, 0.0));  // greedy is deterministic
}

// model.vocab_size_multiple_of pads the model's vocab past the tokenizer's 512 ids: the header
// names both, the padded output projection trains (in FP8 too: 576 is a multiple of 16), and
// samples hold only the tokenizer's ids (a padded id would decode as "<|id N|>").
TEST(Trainer, VocabSizeMultipleOfPadsTheModelsVocab) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const std::vector<std::string> padded = {"--model.vocab_size_multiple_of=96",
                                           "--validation.enable=false"};
  std::vector<std::string> float8 = padded;
  for (const char* flag :
       {"--training.steps=3", "--quantize.linear.float8.enable=true",
        "--quantize.linear.float8.emulate=true", "--quantize.linear.float8.filter_fqns=[]"}) {
    float8.push_back(flag);
  }
  std::string log;
  const TrainResult r = run_logged(tiny_config(corpus, temp_dir("padded_vocab"), float8), log);
  EXPECT_NE(log.find("vocab 576 (the tokenizer's 512)"), std::string::npos) << log;
  EXPECT_NE(log.find("float8: 15 linears (tensorwise)"), std::string::npos) << log;
  ASSERT_EQ(r.losses.size(), 3u);
  for (double loss : r.losses) EXPECT_TRUE(std::isfinite(loss));

  std::vector<std::string> two_steps = padded;
  two_steps.push_back("--training.steps=2");
  Trainer trainer(tiny_config(corpus, temp_dir("padded_vocab_sample"), two_steps),
                  testing::quiet_trainer_options(testing::shrink_llama));
  for (double temperature : {0.0, 1.0, 2.0}) {
    const std::string sample = trainer.generate_sample("ROMEO:", 40, temperature);
    EXPECT_FALSE(sample.empty());
    EXPECT_EQ(sample.find("<|id "), std::string::npos) << temperature << ": " << sample;
  }

  const std::string e = error_of([] {
    config::load_config(fs::path(), {"--model.vocab_size_multiple_of=0"});
  });
  EXPECT_NE(e.find("model.vocab_size_multiple_of"), std::string::npos) << e;
}

TEST(Trainer, UnknownConfigKeyIsAConfigError) {
  const fs::path dir = temp_dir("bad_key");
  const fs::path file = dir / "bad.toml";
  std::ofstream(file) << "[training]\nsteps = 10\nlocal_batch_sise = 4\n";
  try {
    (void)config::load_config(file);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("local_batch_sise"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad.toml"), std::string::npos) << msg;
    EXPECT_NE(msg.find("local_batch_size"), std::string::npos) << msg;  // did you mean
  }
}

// lr = 2^31 makes the weights blow up after step 1: the first non-finite step stops the run,
// before its update, naming the step and the last checkpoint (which holds finite weights); with
// [training] skip_nonfinite_steps = N the first N such steps are skipped with a warning.
TEST(Trainer, NonFiniteStepsStopTheRunOrAreSkippedAsAllowed) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dump = temp_dir("nonfinite");
  const std::vector<std::string> huge_lr = {"--optimizer.lr=2147483648", "--training.steps=8",
                                            "--validation.enable=false", "--checkpoint.enable=true",
                                            "--checkpoint.interval=1",   "--metrics.log_freq=1"};
  std::string e;
  try {
    run(tiny_config(corpus, dump, huge_lr));
  } catch (const Error& error) {
    e = error.what();
  }
  const size_t at = e.find("train: step ");
  ASSERT_NE(at, std::string::npos) << e;
  const int64_t bad = std::stoll(e.substr(at + 12));
  ASSERT_GE(bad, 2) << e;
  EXPECT_NE(e.find("(not finite): stopping; the last checkpoint is " +
                   (dump / "checkpoint" / ("step-" + std::to_string(bad - 1))).string()),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("skip_nonfinite_steps"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dump / "checkpoint" / ("step-" + std::to_string(bad))));

  // Skipping: the weights stay as they were before the first bad step, so every later step is
  // bad too; 2 allowed -> stops at the third, 20 allowed -> the run ends, every skip logged.
  std::vector<std::string> skip2 = huge_lr;
  skip2.push_back("--checkpoint.enable=false");
  skip2.push_back("--training.skip_nonfinite_steps=2");
  const std::string e2 = error_of([&] { run(tiny_config(corpus, temp_dir("skip2"), skip2)); });
  EXPECT_NE(e2.find("train: step " + std::to_string(bad + 2) + ":"), std::string::npos) << e2;
  std::vector<std::string> skip20 = skip2;
  skip20.push_back("--training.skip_nonfinite_steps=20");
  std::string log;
  const TrainResult r = run_logged(tiny_config(corpus, temp_dir("skip20"), skip20), log);
  ASSERT_EQ(r.skipped_steps.size(), size_t(8 - bad + 1));
  EXPECT_EQ(r.skipped_steps.front(), bad);
  EXPECT_NE(log.find("warning: step " + std::to_string(bad) +
                     ": the gradient norm is nan: skipped, no update (1 of 20 allowed"),
            std::string::npos)
      << log;
}

// What the tokenizer's file sets and minititan ignores (GPT-2's truncation) is noted in the run's
// log, which rank 0 alone writes, not on every rank's stderr. A copy of the tokenizer: a path new
// to this process, which notes each file once.
TEST(Trainer, TheTokenizersIgnoredSettingsAreNotedInTheLog) {
  REQUIRE_SHARED_FILE(gpt2, "gpt2");
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dir = temp_dir("ignored_settings");
  fs::create_directories(dir / "tok");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(gpt2 / f, dir / "tok" / f);
  std::string log;
  ::testing::internal::CaptureStderr();
  run_logged(tiny_config(corpus, dir / "run",
                         {"--model.tokenizer_path=" + (dir / "tok").string(), "--training.steps=1",
                          "--training.local_batch_size=2", "--validation.enable=false"}),
             log);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string note = "tokenizer: " + (dir / "tok" / "tokenizer.json").string() +
                           ": ignoring \"truncation\" (max_length 50)";
  EXPECT_NE(log.find(note), std::string::npos) << log;
  EXPECT_EQ(err.find("ignoring"), std::string::npos) << err;
}

// Binary data is not trained on as text: random bytes named data.h5 (not HDF5) or data.txt.
TEST(Trainer, ADatasetThatIsNeitherHdf5NorTextIsAnError) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dump = temp_dir("binary");
  std::mt19937 rng(26);
  std::string bytes(3000, '\0');
  for (char& c : bytes) c = char(rng() & 0xff);
  for (const std::string name : {"data.h5", "data.txt"}) {
    std::ofstream(dump / name, std::ios::binary) << bytes;
    const std::string e = error_of([&] {
      run(tiny_config(corpus, dump, {"--training.dataset_path=" + (dump / name).string()}));
    });
    EXPECT_NE(e.find(name == "data.h5" ? "is named as an HDF5 token file but is not HDF5"
                                       : "does not look like text"),
              std::string::npos)
        << e;
  }
}

// A batch that cannot fit is refused at once, naming the keys (it ended in std::bad_alloc).
TEST(Trainer, AStepThatCannotFitInMemoryIsRefusedUpFront) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const auto start = std::chrono::steady_clock::now();
  const std::string e = error_of([&] {
    run(tiny_config(corpus, temp_dir("huge_batch"),
                    {"--training.local_batch_size=18000000000000000"}));
  });
  EXPECT_NE(e.find("training.local_batch_size 18000000000000000 x training.seq_len 64 x vocab"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("GiB of memory"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Trainer, MissingDatasetSaysHowToMakeIt) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dump = temp_dir("missing");
  const fs::path missing = dump / "no_such_tokens.h5";
  TrainerOptions options;
  options.quiet = true;
  try {
    Trainer trainer(tiny_config(corpus, dump, {"--training.dataset_path=" + missing.string()}),
                    options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("training.dataset_path"), std::string::npos) << msg;
    EXPECT_NE(msg.find(missing.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mt_prepare_dataset"), std::string::npos) << msg;
  }
}

// The text a dump folder's token cache was made from is recorded: another file of the same name,
// or the same file changed (even to an older modification time), is tokenized again, not read
// from the other's cache; the same file unchanged reuses it.
TEST(Trainer, TextCacheHoldsTheTokensOfThisFileOnly) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const fs::path dir = temp_dir("text_cache");
  std::ifstream in(corpus, std::ios::binary);
  std::string text(60000, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  std::ofstream(dir / "a" / "corpus.txt", std::ios::binary) << text.substr(0, 30000);
  std::ofstream(dir / "b" / "corpus.txt", std::ios::binary) << text.substr(30000);
  const fs::path dump = dir / "dump", cache = dump / "corpus.tokens.h5";
  const auto start = [&](const fs::path& text_file) {
    std::ostringstream log;
    TrainerOptions options;
    options.log = &log;
    options.edit_model_args = testing::shrink_llama;
    options.write_files = false;
    Trainer(tiny_config(corpus, dump, {"--training.dataset_path=" + text_file.string()}),
            options);
    return log.str();
  };
  EXPECT_NE(start(dir / "a" / "corpus.txt").find("data: tokenizing"), std::string::npos);
  const int64_t tokens_of_a = data::TokenFileReader(cache).info().num_tokens;
  // b is older than the cache: it used to be read from a's tokens.
  fs::last_write_time(dir / "b" / "corpus.txt",
                      fs::last_write_time(cache) - std::chrono::hours(1));
  EXPECT_NE(start(dir / "b" / "corpus.txt").find("data: tokenizing"), std::string::npos);
  const data::TokenFileReader of_b(cache);
  EXPECT_NE(of_b.info().num_tokens, tokens_of_a);
  EXPECT_NE(of_b.info().source.find((dir / "b" / "corpus.txt").string()), std::string::npos)
      << of_b.info().source;
  EXPECT_NE(start(dir / "b" / "corpus.txt").find("data: reusing"), std::string::npos);
}

TEST(Trainer, TokenFileOfAnotherTokenizerIsAnError) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  REQUIRE_SHARED_FILE(gpt2, "gpt2/tokenizer.json");
  const fs::path dump = temp_dir("other_tokenizer");
  TrainerOptions options;
  options.quiet = true;
  options.edit_model_args = testing::shrink_llama;
  { Trainer first(tiny_config(corpus, dump), options); }  // makes the cached token file
  const fs::path tokens = dump / "tinyshakespeare.tokens.h5";
  ASSERT_TRUE(fs::exists(tokens));
  try {
    Trainer trainer(tiny_config(corpus, dump,
                                {"--training.dataset_path=" + tokens.string(),
                                 "--model.tokenizer_path=" + gpt2.string()}),
                    options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("was made with the tokenizer"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not with model.tokenizer_path"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mt_prepare_dataset"), std::string::npos) << msg;
  }
  // The same tokenizer path, its file changed since: said so (not "made with X, not with X").
  const fs::path dump2 = temp_dir("changed_tokenizer");
  const fs::path changed_dir = dump2 / "tokenizer", changed = changed_dir / "tokenizer.json";
  fs::copy(small_tokenizer(corpus), changed_dir, fs::copy_options::recursive);
  { Trainer first(tiny_config(corpus, dump2, {"--model.tokenizer_path=" + changed_dir.string()}),
                  options); }
  const fs::path tokens2 = dump2 / "tinyshakespeare.tokens.h5";
  ASSERT_TRUE(fs::exists(tokens2));
  fs::copy_file(gpt2, changed, fs::copy_options::overwrite_existing);
  const std::string msg = testing::error_of([&] {
    Trainer trainer(tiny_config(corpus, dump2,
                                {"--training.dataset_path=" + tokens2.string(),
                                 "--model.tokenizer_path=" + changed_dir.string()}),
                    options);
  });
  EXPECT_NE(msg.find("that file has changed since"), std::string::npos) << msg;
}

TEST(Trainer, DescribeModelNeedsNoMemoryAndCountsLikeThePublishedModels) {
  config::JobConfig job = config::load_config(
      "", {"--model.flavor=405B", "--model.tokenizer_path=", "--training.seq_len=8192"});
  EXPECT_NE(describe_model(job).find("405853388800 parameters"), std::string::npos)
      << describe_model(job);
  job.model.flavor = "8B";
  EXPECT_NE(describe_model(job).find("8030261248 parameters"), std::string::npos);
  EXPECT_NE(describe_model(job).find("at seq_len 8192"), std::string::npos);
  job.model.flavor = "9B";
  EXPECT_THROW(describe_model(job), Error);
}

}  // namespace
}  // namespace mt::train
