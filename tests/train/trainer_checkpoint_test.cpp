// Checkpoints through the Trainer on one process (train/checkpointer.h): a resumed run repeats
// the uninterrupted one bit for bit (blocking and background saves), a `train` process killed at
// several points of a save leaves the previous checkpoint loadable, a flipped byte refuses to
// load, keep_latest_k, strict shape errors, exclude_from_loading, and a bf16 model-only export
// that starts a new run. A shrunk Llama (tests/testing/trainer_fixtures.h) on tinyshakespeare,
// except where the `train` binary runs: it builds the debug model as configured, so the test's
// in-process runs that it is compared with build that one too.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <any>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/h5_file.h"
#include "checkpoint/h5_tensor.h"
#include "checkpoint/index.h"
#include "checkpoint/manager.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "models/llama/model_args.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"
#include "tests/testing/hdf5_corruption.h"
#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/shared_data.h"
#include "tests/testing/trainer_fixtures.h"
#include "train/config/load.h"
#include "train/token_data.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;
using EditArgs = std::function<void(std::any&)>;
using Steps = std::vector<int64_t>;
using Names = std::vector<std::string>;

// The small tokenizer and the corpus's token file, made once per process (ctest runs each test
// in its own process; running the binary directly shares them).
struct Inputs {
  fs::path dir, tokenizer, tokens;
  ~Inputs() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

const Inputs& inputs(const fs::path& corpus) {
  static const Inputs in = [&] {
    Inputs i;
    i.dir =
        fs::temp_directory_path() / ("mt_trainer_checkpoint_inputs_" + std::to_string(::getpid()));
    fs::remove_all(i.dir);
    i.tokenizer = i.dir / "tokenizer";
    fs::create_directories(i.tokenizer);
    testing::save_small_tokenizer(corpus, i.tokenizer);
    std::ostringstream log;
    i.tokens = resolve_token_file(corpus, data::BpeTokenizer::from_file(i.tokenizer), i.tokenizer,
                                  i.dir, log);
    return i;
  }();
  return in;
}

// The job: checkpoints every 10 steps in <dump>/checkpoint, all kept; `extra` overrides.
Names job_args(const Inputs& in, const fs::path& dump, const Names& extra = {}) {
  Names args = {
      "--job.dump_folder=" + dump.string(),
      "--model.tokenizer_path=" + in.tokenizer.string(),
      "--training.dataset_path=" + in.tokens.string(),
      "--training.local_batch_size=4",
      "--training.seq_len=32",
      "--training.steps=20",
      "--training.seed=7",
      "--training.deterministic=true",
      "--training.mixed_precision_param=float32",
      "--optimizer.lr=3e-3",
      "--lr_scheduler.warmup_steps=3",
      "--validation.enable=false",
      "--metrics.log_freq=1000",
      "--checkpoint.enable=true",
      "--checkpoint.interval=10",
      "--checkpoint.keep_latest_k=0",
  };
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TrainerOptions quiet_options(EditArgs edit) {
  return testing::quiet_trainer_options(std::move(edit));
}

// Trains the job in this process; `edit` shrinks the model (nullptr: the debug model as is).
TrainResult train(const Names& args, EditArgs edit = testing::shrink_llama) {
  Trainer trainer(config::load_config(fs::path(), args), quiet_options(std::move(edit)));
  return trainer.train();
}

// The message of the mt::Error that fn throws ("" and a failure when it throws none).
using mt::testing::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

Steps complete_steps(const fs::path& dump) {
  return checkpoint::complete_checkpoint_steps(dump / "checkpoint");
}

// The names in a folder, sorted.
Names entries(const fs::path& dir) {
  Names names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

fs::path step_dir(const fs::path& dump, int64_t step) {
  return dump / "checkpoint" / ("step-" + std::to_string(step));
}

checkpoint::Index index_of(const fs::path& step_folder) {
  return checkpoint::read_index(step_folder / checkpoint::kIndexFileName);
}

// Every tensor of a checkpoint, whole, read through the index's virtual datasets.
std::map<std::string, Tensor> read_tensors(const fs::path& step_folder) {
  std::map<std::string, Tensor> out;
  h5::File file = checkpoint::open_file(step_folder / checkpoint::kIndexFileName);
  for (const checkpoint::IndexChunk& c : index_of(step_folder).chunks) {
    if (out.count(c.meta.fqn)) continue;
    out[c.meta.fqn] =
        checkpoint::read_hyperslab(file.get(), checkpoint::tensor_view_path(c.meta.fqn),
                                   Shape(c.meta.global_shape.size(), 0), c.meta.global_shape);
  }
  return out;
}

// The stored checksum of every chunk (one per tensor on one rank), by tensor name.
std::map<std::string, uint64_t> checksums(const fs::path& step_folder) {
  std::map<std::string, uint64_t> out;
  for (const checkpoint::IndexChunk& c : index_of(step_folder).chunks) {
    h5::File file = checkpoint::open_file(step_folder / c.file);
    out[c.meta.fqn] = checkpoint::read_chunk_info(file.get(), c.dataset).checksum;
  }
  return out;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  return {p, p + c.nbytes()};
}

void copy_checkpoint(const fs::path& from_dump, int64_t step, const fs::path& to_dump) {
  fs::create_directories(to_dump / "checkpoint");
  fs::copy(step_dir(from_dump, step), step_dir(to_dump, step), fs::copy_options::recursive);
}

// Steps first..first+n-1 of `resumed` against the same steps of `straight` (which began at 1).
void expect_same_steps(const TrainResult& resumed, const TrainResult& straight) {
  ASSERT_GE(resumed.first_step, 1);
  ASSERT_EQ(size_t(resumed.first_step - 1) + resumed.losses.size(), straight.losses.size());
  for (size_t i = 0; i < resumed.losses.size(); ++i) {
    const size_t s = size_t(resumed.first_step - 1) + i;
    EXPECT_EQ(resumed.losses[i], straight.losses[s]) << "loss of step " << s + 1;
    EXPECT_EQ(resumed.grad_norms[i], straight.grad_norms[s]) << "grad norm of step " << s + 1;
  }
}

TEST(TrainerCheckpoint, ResumedRunRepeatsTheUninterruptedOneBitwise) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  // 20 steps straight, a checkpoint every 2; blocking saves, then background saves. Steps of 16
  // tokens are short next to a save (its fsyncs), so a background save still runs while the
  // next steps change the weights: only staging keeps them out of the checkpoint.
  const Names common = {"--checkpoint.interval=2", "--training.local_batch_size=1",
                        "--training.seq_len=16"};
  const TrainResult sync = train(job_args(in, dir / "sync", common));
  ASSERT_EQ(sync.losses.size(), 20u);
  const Steps every_2 = {2, 4, 6, 8, 10, 12, 14, 16, 18, 20};
  EXPECT_EQ(complete_steps(dir / "sync"), every_2);
  // async_with_pinned_mem: the same staging buffers for every save (page-locked on a GPU).
  for (const std::string mode : {"async", "async_with_pinned_mem"}) {
    SCOPED_TRACE(mode);
    Names async_args = job_args(in, dir / mode, common);
    async_args.push_back("--checkpoint.async_mode=" + mode);
    const TrainResult async = train(async_args);
    EXPECT_EQ(complete_steps(dir / mode), every_2);
    expect_same_steps(async, sync);  // saving in the background does not disturb training
    for (int64_t step : every_2) {
      EXPECT_EQ(checksums(step_dir(dir / mode, step)), checksums(step_dir(dir / "sync", step)))
          << "the background save of step " << step << " holds other tensors";
    }
  }
  // A new Trainer, in a new dump folder holding only the step-10 checkpoint, trains 11-20.
  for (const char* mode : {"sync", "async"}) {
    SCOPED_TRACE(mode);
    const fs::path resumed_dump = dir / (std::string("resumed_") + mode);
    copy_checkpoint(dir / mode, 10, resumed_dump);
    const TrainResult resumed = train(job_args(in, resumed_dump, common));
    EXPECT_EQ(resumed.first_step, 11);
    EXPECT_EQ(resumed.steps_done, 20);
    ASSERT_EQ(resumed.losses.size(), 10u);
    expect_same_steps(resumed, sync);
    EXPECT_EQ(checksums(step_dir(resumed_dump, 20)), checksums(step_dir(dir / "sync", 20)));
  }
}

#ifdef MT_TRAIN_BIN
std::string train_command(const Names& args) {
  std::string command = "OMP_NUM_THREADS=1 " MT_TRAIN_BIN;
  for (const std::string& a : args) command += " '" + a + "'";
  return command;
}
#endif

TEST(TrainerCheckpoint, CrashDuringASaveLeavesThePreviousCheckpointLoadable) {
#ifndef MT_TRAIN_BIN
  GTEST_SKIP() << "the train binary is not part of this build (tests/CMakeLists.txt)";
#else
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  // One thread here and in the `train` processes: on a busy machine, the threads of a model
  // this small mostly wait for each other (the losses are the same for any thread count).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  struct RestoreThreads {
    int n;
    ~RestoreThreads() { omp_set_num_threads(n); }
  } restore{threads};
  // The debug model as the binary builds it, on 16 tokens a step. A constant learning rate
  // after warmup, so a run of 2 steps and one of 4 share steps 1-2.
  auto args = [&](const fs::path& dump, int64_t steps) {
    return job_args(in, dump,
                    {"--training.steps=" + std::to_string(steps), "--checkpoint.interval=2",
                     "--training.local_batch_size=1", "--training.seq_len=16",
                     "--lr_scheduler.warmup_steps=1", "--lr_scheduler.decay_ratio=0"});
  };
  Names reference_args = args(dir / "reference", 4);
  reference_args.push_back("--checkpoint.enable=false");
  const TrainResult reference = train(reference_args, nullptr);
  ASSERT_EQ(reference.losses.size(), 4u);

  const fs::path dump = dir / "run", folder = dump / "checkpoint";
  testing::CommandResult r = testing::run_command(train_command(args(dump, 2)));
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(complete_steps(dump), (Steps{2}));
  for (const std::string point : {"mid_rank_file", "after_rank_files", "before_rename"}) {
    SCOPED_TRACE(point);
    // The save of step 4 (the first save of this process) dies at `point`.
    r = testing::run_command("MT_CHECKPOINT_CRASH_AT=" + point + " " +
                             train_command(args(dump, 4)));
    ASSERT_EQ(r.status, 86) << r.output;
    EXPECT_TRUE(contains(r.output, "step-2 at step 2")) << r.output;  // it resumed
    EXPECT_TRUE(contains(r.output, "MT_CHECKPOINT_CRASH_AT=" + point)) << r.output;
    EXPECT_EQ(complete_steps(dump), (Steps{2}));
    EXPECT_EQ(entries(folder), (Names{"step-2", "step-4.tmp"}));
    EXPECT_TRUE(fs::exists(folder / "step-4.tmp" / "rank-00000.h5"));
    EXPECT_EQ(fs::exists(folder / "step-4.tmp" / checkpoint::kIndexFileName),
              point == "before_rename");
    // Resumed here: step-2 loads, steps 3-4 repeat the uninterrupted run, and the leftover
    // step-4.tmp does not stop the new save of step 4.
    const TrainResult resumed = train(args(dump, 4), nullptr);
    EXPECT_EQ(resumed.first_step, 3);
    ASSERT_EQ(resumed.losses.size(), 2u);
    expect_same_steps(resumed, reference);
    EXPECT_EQ(complete_steps(dump), (Steps{2, 4}));
    EXPECT_EQ(entries(folder), (Names{"step-2", "step-4"}));
    fs::remove_all(folder / "step-4");  // the next crash is again in the save of step 4
  }
#endif
}

// A disk that fills during a save (here a file size limit: writes past it fail with EFBIG, as
// on a full disk): the run ends with the write error and exit 1 (it used to segfault in HDF5's
// exit handler), and the failed save's .tmp folder is removed. A start removes .tmp folders left
// by saves that never finished, saying so.
TEST(TrainerCheckpoint, ASaveThatFailsForSpaceEndsTheRunCleanly) {
#ifndef MT_TRAIN_BIN
  GTEST_SKIP() << "the train binary is not part of this build (tests/CMakeLists.txt)";
#else
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const fs::path dump = dir / "run", folder = dump / "checkpoint";
  const Names args = job_args(in, dump,
                              {"--training.steps=2", "--checkpoint.interval=1",
                               "--training.local_batch_size=1", "--training.seq_len=16"});
  // 2 MiB a file: config.toml and metrics.jsonl fit, the debug model's rank file does not.
  const testing::CommandResult r = testing::run_command(
      "bash -c \"trap '' XFSZ; ulimit -f 2048; exec env " + train_command(args) + "\"");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "failed on checkpoint file " + (folder / "step-1.tmp").string()))
      << r.output;
  EXPECT_EQ(entries(folder), Names{});

  // Leftovers of a save that died are removed at the next start, which logs it.
  fs::create_directories(folder / "step-7.tmp");
  std::ofstream(folder / "step-7.tmp" / "rank-00000.h5") << "partial";
  const testing::CommandResult again = testing::run_command(train_command(args));
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "checkpoint: removed " + (folder / "step-7.tmp").string() +
                                         ", a save that did not finish"))
      << again.output;
  EXPECT_EQ(entries(folder), (Names{"step-1", "step-2"}));
#endif
}

TEST(TrainerCheckpoint, FlippedByteRefusesToLoadAndLoadsNothing) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const fs::path dump = dir / "run";
  const Names args =
      job_args(in, dump,
               {"--training.steps=4", "--checkpoint.interval=4", "--validation.enable=true",
                "--validation.freq=100", "--validation.steps=1"});
  (void)train(args);
  // A tensor read after others (embeddings, layer 0): loading them first would show.
  const std::string tensor = "model.layers.1.attention.wq.weight";
  fs::path rank_file;
  std::string dataset;
  for (const checkpoint::IndexChunk& c : index_of(step_dir(dump, 4)).chunks) {
    if (c.meta.fqn == tensor) {
      rank_file = step_dir(dump, 4) / c.file;
      dataset = c.dataset;
    }
  }
  ASSERT_FALSE(dataset.empty()) << "no chunk of " << tensor << " in the index";
  EXPECT_EQ(dataset, "/tensors/" + tensor);
  testing::flip_dataset_byte(rank_file, dataset, 100);

  Names more = args;
  more.push_back("--training.steps=8");
  Trainer trainer(config::load_config(fs::path(), more), quiet_options(testing::shrink_llama));
  const std::optional<double> before = trainer.validation_loss(1);
  ASSERT_TRUE(before.has_value());
  const std::string e = error_of([&] { trainer.train(); });
  EXPECT_TRUE(contains(e, rank_file.string())) << e;
  EXPECT_TRUE(contains(e, "tensor " + tensor)) << e;
  EXPECT_TRUE(contains(e, "checksum mismatch")) << e;
  EXPECT_EQ(trainer.validation_loss(1), before) << "the model changed: something was loaded";

  testing::flip_dataset_byte(rank_file, dataset, 100);  // back: the same checkpoint loads
  const TrainResult resumed = train(more);
  EXPECT_EQ(resumed.first_step, 5);
}

TEST(TrainerCheckpoint, KeepLatestKRemovesOlderCheckpointsOnly) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  for (const char* mode : {"disabled", "async"}) {
    SCOPED_TRACE(mode);
    const fs::path dump = dir / mode;
    (void)train(
        job_args(in, dump,
                 {"--training.steps=8", "--checkpoint.interval=2", "--checkpoint.keep_latest_k=2",
                  std::string("--checkpoint.async_mode=") + mode}));
    EXPECT_EQ(entries(dump / "checkpoint"), (Names{"step-6", "step-8"}));
  }
}

EditArgs shrunk_with(std::function<void(models::llama::ModelArgs&)> change) {
  return [change](std::any& a) {
    testing::shrink_llama(a);
    change(std::any_cast<models::llama::ModelArgs&>(a));
  };
}

// Trains the shrunk model 4 steps, saving step 4 in `dump`; returns the args of a run to step 8.
Names saved_at_step_4(const Inputs& in, const fs::path& dump) {
  (void)train(job_args(in, dump, {"--training.steps=4", "--checkpoint.interval=4"}));
  return job_args(in, dump, {"--training.steps=8", "--checkpoint.interval=4"});
}

// A resume with another global batch than the checkpoint's (here local_batch_size 4 -> 2 on one
// rank; on a cluster, global_batch_size = -1 on another rank count) is an error naming both and
// the way out, before anything loads; allow_batch_change makes it a warning and resumes.
TEST(TrainerCheckpoint, ResumeWithAnotherGlobalBatchIsAnErrorUnlessAllowed) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const fs::path dump = dir / "run";
  Names args = saved_at_step_4(in, dump);
  args.push_back("--training.local_batch_size=2");
  const std::string e = error_of([&] { train(args); });
  for (const std::string& text : Names{
           "the checkpoint " + step_dir(dump, 4).string() + " was trained with a global batch of 4 ",
        "but this run's is 2 (sequences: local_batch_size 2 x 1 data-parallel rank(s) x 1 "
        "micro-batch(es))",
        "Set training.global_batch_size = 4", "training.allow_batch_change = true"}) {
    EXPECT_TRUE(contains(e, text)) << text << "\n" << e;
  }
  args.push_back("--training.allow_batch_change=true");
  std::ostringstream log;
  TrainerOptions options = quiet_options(testing::shrink_llama);
  options.quiet = false;
  options.log = &log;
  Trainer trainer(config::load_config(fs::path(), args), options);
  EXPECT_EQ(trainer.train().first_step, 5);
  EXPECT_TRUE(contains(log.str(), "warning: the checkpoint ")) << log.str();
  EXPECT_TRUE(contains(log.str(), "going on (training.allow_batch_change = true)")) << log.str();
  // The same batch resumes without a word about it.
  args = saved_at_step_4(in, dir / "same");
  std::ostringstream quiet_log;
  options.log = &quiet_log;
  Trainer same(config::load_config(fs::path(), args), options);
  EXPECT_EQ(same.train().first_step, 5);
  EXPECT_FALSE(contains(quiet_log.str(), "global batch of")) << quiet_log.str();
}

#ifdef MT_TRAIN_BIN
// `train` in the background; once its log shows a step, signal `sig` reaches it (its handler is
// in place by then), and the command waits for it and prints the log. `env` goes before the
// binary. A script in `dir`, so that the arguments keep their quotes.
std::string signal_after_first_step(const std::string& env, const Names& args,
                                    const std::string& sig, const fs::path& dir) {
  const fs::path script = dir / ("signal_" + sig + ".sh"), log = dir / ("signal_" + sig + ".log");
  std::ofstream out(script);
  out << "env " << env << " " << train_command(args) << " > " << log.string() << " 2>&1 &\n"
      << "pid=$!\n"
      << "for i in $(seq 600); do grep -q '^step' " << log.string()
      << " && break; sleep 0.1; done\n"
      << "kill -" << sig << " $pid\nwait $pid\nstatus=$?\ncat " << log.string()
      << "\nexit $status\n";
  return "bash " + script.string();
}
#endif

// SLURM's warning before a time limit or preemption (sbatch --signal=USR1@SECONDS): the run stops
// at the end of the step, saves, and with [job] requeue_on_preemption rank 0 runs `scontrol
// requeue $SLURM_JOB_ID` (a stand-in scontrol on PATH records its arguments); the job resumes
// from that checkpoint. SIGTERM (scancel) saves without a requeue.
TEST(TrainerCheckpoint, PreemptionWarningSavesAndRequeuesTheSlurmJob) {
#ifndef MT_TRAIN_BIN
  GTEST_SKIP() << "the train binary is not part of this build (tests/CMakeLists.txt)";
#else
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const fs::path bin = dir / "bin", calls = dir / "scontrol_calls";
  fs::create_directories(bin);
  {
    std::ofstream fake(bin / "scontrol");
    fake << "#!/bin/sh\necho \"$@\" >> " << calls.string() << "\n";
  }
  fs::permissions(bin / "scontrol", fs::perms::owner_all);
  const std::string env = "SLURM_JOB_ID=4242 PATH=" + bin.string() + ":$PATH";
  const auto args = [&](const fs::path& dump) {
    return job_args(in, dump,
                    {"--training.steps=100000", "--checkpoint.interval=100000",
                     "--metrics.log_freq=1", "--job.requeue_on_preemption=true",
                     "--training.local_batch_size=1", "--training.seq_len=16"});
  };
  const fs::path dump = dir / "run";
  testing::CommandResult r =
      testing::run_command(signal_after_first_step(env, args(dump), "USR1", dir.path()));
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* text : {"SIGUSR1 received", "stopped by SIGUSR1 at the end of step",
                           "checkpoint: saved", "job: requeued SLURM job 4242"}) {
    EXPECT_TRUE(contains(r.output, text)) << text << "\n" << r.output;
  }
  std::ifstream recorded(calls);
  std::string call;
  std::getline(recorded, call);
  EXPECT_EQ(call, "requeue 4242");
  const Steps saved = complete_steps(dump);
  ASSERT_EQ(saved.size(), 1u);
  // The requeued job: the same command resumes from the stop's checkpoint.
  Names resume = args(dump);
  resume.push_back("--training.steps=" + std::to_string(saved[0] + 1));
  r = testing::run_command("env " + env + " " + train_command(resume));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "at step " + std::to_string(saved[0]))) << r.output;
  EXPECT_FALSE(contains(r.output, "requeued")) << r.output;  // a normal end is not requeued

  // SIGTERM: saved, not requeued.
  fs::remove(calls);
  r = testing::run_command(signal_after_first_step(env, args(dir / "term"), "TERM", dir.path()));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "stopped by SIGTERM at the end of step")) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint: saved")) << r.output;
  EXPECT_FALSE(fs::exists(calls));
#endif
}

// The checkpoint's saved architecture is checked before any tensor: one error names every field
// in which the configured model differs (train/model_spec.h).
TEST(TrainerCheckpoint, CheckpointOfAnotherArchitectureIsOneErrorListingEveryField) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const fs::path dump = dir / "run";
  const Names args = saved_at_step_4(in, dump);
  const std::string e = error_of([&] {
    train(args, shrunk_with([](models::llama::ModelArgs& a) {
            a.dim = 96;
            a.n_layers = 3;
          }));
  });
  for (const char* text : {"is not the model saved in checkpoint ", "(3 fields differ)",
                           "dim (hidden_size): 96 in the model asked for, 64 in the checkpoint",
                           "n_layers (num_hidden_layers): 3 in the model asked for, 2 in",
                           "ffn hidden size (intermediate_size): 256 in the model asked for, 192"}) {
    EXPECT_TRUE(contains(e, text)) << text << "\n" << e;
  }
  EXPECT_TRUE(contains(e, step_dir(dump, 4).string())) << e;
  EXPECT_EQ(train(args).first_step, 5);
}

// A checkpoint of a padded vocab (model.vocab_size_multiple_of) resumes only with the same
// padding: another one is the architecture error, naming the vocab sizes.
TEST(TrainerCheckpoint, PaddedVocabResumesOnlyWithItsPadding) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const fs::path dump = dir / "run";
  const std::string padding = "--model.vocab_size_multiple_of=96";  // 512 -> 576
  (void)train(job_args(in, dump, {padding, "--training.steps=4", "--checkpoint.interval=4"}));
  const Names resume = job_args(in, dump, {padding, "--training.steps=6"});
  const std::string e = error_of([&] { train(job_args(in, dump, {"--training.steps=6"})); });
  for (const char* text : {"with the tokenizer's vocab (512) is not the model saved in checkpoint",
                           "vocab_size: 512 in the model asked for, 576 in the checkpoint"}) {
    EXPECT_TRUE(contains(e, text)) << text << "\n" << e;
  }
  EXPECT_EQ(train(resume).first_step, 5);
}

// Checkpoints written before the architecture was saved: the tensors' shapes are checked, all in
// one error.
TEST(TrainerCheckpoint, CheckpointOfAnotherModelShapeIsOneErrorListingEveryTensor) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const fs::path dump = dir / "run";
  const Names args = saved_at_step_4(in, dump);
  checkpoint::Index old = index_of(step_dir(dump, 4));
  ASSERT_EQ(old.values.erase("architecture"), 1u);
  checkpoint::write_index(step_dir(dump, 4) / checkpoint::kIndexFileName, old);
  const std::string wider =
      error_of([&] { train(args, shrunk_with([](models::llama::ModelArgs& a) { a.dim = 96; })); });
  EXPECT_TRUE(contains(wider, step_dir(dump, 4).string())) << wider;
  for (const std::string& t :
       {std::string("model.layers.0.attention.wq.weight"),
        std::string("model.layers.1.attention.wq.weight"),
        std::string("optimizer.state.layers.0.attention.wq.weight.exp_avg")}) {
    EXPECT_TRUE(contains(wider, "tensor " + t + ": saved with shape [64, 64], wanted [96, 96]"))
        << t << "\n"
        << wider;
  }
  EXPECT_TRUE(contains(wider, "tensor model.tok_embeddings.weight: saved with shape")) << wider;

  const std::string deeper = error_of(
      [&] { train(args, shrunk_with([](models::llama::ModelArgs& a) { a.n_layers = 3; })); });
  EXPECT_TRUE(contains(deeper, "tensor model.layers.2.attention.wq.weight: not in the checkpoint"))
      << deeper;
  EXPECT_TRUE(
      contains(deeper, "tensor model.layers.2.feed_forward.w2.weight: not in the checkpoint"))
      << deeper;
  const std::string shallower = error_of(
      [&] { train(args, shrunk_with([](models::llama::ModelArgs& a) { a.n_layers = 1; })); });
  EXPECT_TRUE(contains(shallower,
                       "tensor model.layers.1.attention.wq.weight: in the checkpoint but not in "
                       "this job"))
      << shallower;
  // Nothing was saved by the failed runs; the right model still resumes.
  EXPECT_EQ(complete_steps(dump), (Steps{4}));
  EXPECT_EQ(train(args).first_step, 5);
}

// 6 steps straight into dir/straight, saving every `interval`; then steps 5 and 6 again in
// dir/excluded from its step-4 checkpoint, loaded without `exclude`.
struct ExcludedResume {
  TrainResult straight, resumed;
  fs::path dump;  // the resumed run's
};
ExcludedResume resume_step_4_excluding(const Inputs& in, const fs::path& dir, int interval,
                                       const std::string& exclude) {
  const Names common = {"--training.steps=6",
                        "--checkpoint.interval=" + std::to_string(interval)};
  ExcludedResume r{train(job_args(in, dir / "straight", common)), {}, dir / "excluded"};
  copy_checkpoint(dir / "straight", 4, r.dump);
  Names args = job_args(in, r.dump, common);
  args.push_back("--checkpoint.exclude_from_loading=" + exclude);
  r.resumed = train(args);
  return r;
}

TEST(TrainerCheckpoint, ExcludeOptimizerLoadsTheModelAndStartsAFreshOptimizer) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const auto [straight, resumed, dump] = resume_step_4_excluding(in, dir.path(), 4, "optimizer.");
  EXPECT_EQ(resumed.first_step, 5);
  ASSERT_EQ(resumed.losses.size(), 2u);
  // Step 5 computes its loss and gradients from the loaded weights (and data position) alone...
  EXPECT_EQ(resumed.losses[0], straight.losses[4]);
  EXPECT_EQ(resumed.grad_norms[0], straight.grad_norms[4]);
  // ... and its update starts the optimizer afresh, so step 6 differs.
  EXPECT_NE(resumed.losses[1], straight.losses[5]);
  // Every parameter's optimizer has taken 2 steps (5 and 6), not 6.
  int64_t counted = 0;
  for (const auto& [name, t] : read_tensors(step_dir(dump, 6))) {
    if (!name.starts_with("optimizer.state.") || !name.ends_with(".step")) continue;
    EXPECT_EQ(t.item<int64_t>(), 2) << name;
    ++counted;
  }
  EXPECT_GT(counted, 0);
  for (const auto& [name, t] : read_tensors(step_dir(dir / "straight", 6))) {
    if (name.starts_with("optimizer.state.") && name.ends_with(".step")) {
      EXPECT_EQ(t.item<int64_t>(), 6) << name;
    }
  }
}

// The data loader's saved values ("dataloader/rank_<r>/<key>" in the index), by key.
checkpoint::Values loader_values(const fs::path& step_folder) {
  checkpoint::Values out;
  for (const auto& [key, value] : index_of(step_folder).values)
    if (key.starts_with("dataloader/")) out[key] = value;
  return out;
}

// exclude_from_loading = ["dataloader"] (torchtitan's name): the model and optimizer are loaded,
// and the loader starts from the beginning of the data, as a fresh run's does.
TEST(TrainerCheckpoint, ExcludeDataloaderStartsTheDataAgain) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const auto [straight, resumed, dump] = resume_step_4_excluding(in, dir.path(), 2, "dataloader");
  EXPECT_EQ(resumed.first_step, 5);
  ASSERT_EQ(resumed.losses.size(), 2u);
  // Steps 5 and 6 read the data of steps 1 and 2: the loader saved after them is the one saved
  // at step 2, and their losses are not the straight run's.
  const checkpoint::Values at_2 = loader_values(step_dir(dir / "straight", 2));
  ASSERT_FALSE(at_2.empty());
  EXPECT_EQ(loader_values(step_dir(dump, 6)), at_2);
  EXPECT_NE(loader_values(step_dir(dir / "straight", 6)), at_2);
  EXPECT_NE(resumed.losses[0], straight.losses[4]);
}

TEST(TrainerCheckpoint, ModelOnlyBf16ExportStartsANewRun) {
  REQUIRE_SHARED_FILE(corpus, "tinyshakespeare.txt");
  const Inputs& in = inputs(corpus);
  testing::ScratchDir dir;
  const Names common = {"--training.steps=4", "--checkpoint.interval=4"};
  const TrainResult full = train(job_args(in, dir / "full", common));
  Names export_args = job_args(in, dir / "export", common);
  export_args.insert(export_args.end(),
                     {"--checkpoint.model_only=true", "--checkpoint.export_dtype=bfloat16"});
  const TrainResult exported = train(export_args);
  expect_same_steps(exported, full);

  // The export holds the model's tensors only, as bf16: the full run's weights, rounded.
  const fs::path export_dir = step_dir(dir / "export", 4);
  const checkpoint::Index index = index_of(export_dir);
  EXPECT_EQ(std::get<int64_t>(index.values.at("model_only")), 1);
  std::set<std::string> exported_names, model_names;
  for (const checkpoint::IndexChunk& c : index.chunks) {
    exported_names.insert(c.meta.fqn);
    EXPECT_TRUE(c.meta.fqn.starts_with("model.")) << c.meta.fqn;
    EXPECT_EQ(c.meta.dtype, DType::BF16) << c.meta.fqn;
  }
  const std::map<std::string, Tensor> full_tensors = read_tensors(step_dir(dir / "full", 4));
  for (const auto& [name, t] : full_tensors) {
    if (name.starts_with("model.")) model_names.insert(name);
  }
  EXPECT_EQ(exported_names, model_names);
  const std::map<std::string, Tensor> bf16 = read_tensors(export_dir);
  for (const auto& [name, t] : bf16) {
    ASSERT_EQ(t.dtype(), DType::BF16) << name;
    EXPECT_EQ(bytes_of(t), bytes_of(full_tensors.at(name).to(DType::BF16))) << name;
  }

  // A new run from the export's weights: it starts at step 1 with them, converted to f32. Its
  // learning rate is too small to move any weight, so its float32 model-only save of step 1
  // holds exactly the weights it loaded.
  Names fresh_args = job_args(
      in, dir / "fresh",
      {"--training.steps=1", "--checkpoint.interval=1", "--lr_scheduler.warmup_steps=1",
       "--checkpoint.initial_load_path=" + export_dir.string(), "--checkpoint.model_only=true",
       "--optimizer.lr=1e-30", "--optimizer.weight_decay=0"});
  const TrainResult fresh = train(fresh_args);
  EXPECT_EQ(fresh.first_step, 1);
  ASSERT_EQ(fresh.losses.size(), 1u);
  EXPECT_LT(fresh.losses[0], full.losses[0]);  // trained weights on the same first batch
  const std::map<std::string, Tensor> loaded = read_tensors(step_dir(dir / "fresh", 1));
  ASSERT_EQ(loaded.size(), bf16.size());
  for (const auto& [name, t] : loaded) {
    ASSERT_EQ(t.dtype(), DType::F32) << name;
    EXPECT_EQ(bytes_of(t), bytes_of(bf16.at(name).to(DType::F32))) << name;
  }
}

}  // namespace
}  // namespace mt::train
