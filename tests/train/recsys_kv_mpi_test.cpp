// Kv-backed embedding tables in the recsys `train` loop (mpirun -np 2): DLRM on synthetic Criteo
// and MovieLens trains BITWISE like the same model with in-memory tables, on one rank and on two
// (row_wise, table_wise, table_row_wise, column_wise), for caches from 1% to 100% of the rows,
// with and without prefetch;
// a run resumed from a checkpoint continues with the same losses, also on another rank count and
// into memory tables (and memory checkpoints into kv tables); frozen tables keep their initial
// values; raw-id kv tables train and resume like memory tables; bad settings are errors naming
// the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/consolidate.h"
#include "models/dlrm/parallelize.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/mpi_fixtures.h"
#include "tests/testing/shared_data.h"
#include "train/config/load.h"
#include "train/recsys_trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using parallel::ProcessGroup;
using runtime::Tensor;

constexpr int64_t kGlobalBatch = 256;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg(parallel::MpiProcessGroup::world());
  return pg;
}

// This rank alone. Collective the first time: call it on every rank before any rank-only use.
std::shared_ptr<ProcessGroup> self() {
  static std::shared_ptr<ProcessGroup> pg(world()->split(int(world()->rank()), 0));
  return pg;
}

enum class Data { Criteo, MovieLens };

config::JobConfig job(Data data, int64_t ranks, const fs::path& dump,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "--job.dump_folder=" + dump.string(),
      "--training.local_batch_size=" + std::to_string(kGlobalBatch / ranks),
      "--training.steps=16",
      "--lr_scheduler.warmup_steps=4",
      "--validation.freq=16",
      "--validation.steps=4",
      "--metrics.log_freq=1000",
  };
  // MovieLens: `extra` gives --training.dataset_path.
  const std::string file =
      data == Data::MovieLens ? "dlrm_movielens.toml" : "dlrm_criteo_synthetic.toml";
  args.insert(args.end(), extra.begin(), extra.end());
  return config::load_config(fs::path(MT_SOURCE_DIR) / "configs" / file, args);
}

TrainerOptions quiet(std::shared_ptr<ProcessGroup> group) {
  TrainerOptions o;
  o.quiet = true;
  o.handle_signals = false;
  o.write_files = false;
  o.world = std::move(group);
  return o;
}

TrainResult run(const config::JobConfig& c, std::shared_ptr<ProcessGroup> group) {
  return RecsysTrainer(c, quiet(std::move(group))).train();
}

void expect_bitwise(const TrainResult& kv, const TrainResult& memory) {
  ASSERT_EQ(kv.losses.size(), memory.losses.size());
  for (size_t i = 0; i < memory.losses.size(); ++i) {
    EXPECT_EQ(kv.losses[i], memory.losses[i]) << "step " << kv.first_step + int64_t(i);
    EXPECT_EQ(kv.grad_norms[i], memory.grad_norms[i]) << "step " << kv.first_step + int64_t(i);
  }
  ASSERT_EQ(kv.val_aucs.size(), memory.val_aucs.size());
  for (size_t i = 0; i < memory.val_aucs.size(); ++i) {
    EXPECT_EQ(kv.val_aucs[i].second, memory.val_aucs[i].second);
    EXPECT_EQ(kv.val_losses[i].second, memory.val_losses[i].second);
  }
}

std::string tag(int64_t ranks, const std::string& what) {
  return what + "_np" + std::to_string(ranks) + "_r" + std::to_string(world()->rank());
}

class RecsysKvMpi : public ::testing::TestWithParam<Data> {};

TEST_P(RecsysKvMpi, KvTablesTrainBitwiseLikeMemoryTables) {
  const Data data = GetParam();
  std::vector<std::string> dataset;
  if (data == Data::MovieLens) {
    REQUIRE_SHARED_FILE(ml, "ml-100k/u.data");
    dataset.push_back("--training.dataset_path=" + ml.parent_path().string());
  }
  const fs::path dir = testing::shared_dir(
      *world(), "mt_recsys_kv_mpi", data == Data::Criteo ? "criteo" : "movielens");
  struct Setting {
    std::string cache_fraction;
    bool prefetch;
  };
  const std::vector<Setting> settings = {
      {"0.01", false}, {"0.01", true}, {"0.25", true}, {"1.0", false}};
  for (const int64_t ranks : {int64_t(1), int64_t(world()->size())}) {
    const auto group = ranks == 1 ? self() : world();
    for (const std::string sharding : {"row_wise", "table_wise", "table_row_wise", "column_wise"}) {
      if (ranks == 1 && sharding != "row_wise") continue;  // one rank holds every table whole
      SCOPED_TRACE(std::to_string(ranks) + " rank(s), " + sharding);
      std::vector<std::string> base = dataset;
      base.push_back("--embedding.sharding=" + sharding);
      const TrainResult memory = run(job(data, ranks, dir / tag(ranks, sharding), base), group);
      for (const Setting& s : settings) {
        if (sharding != "row_wise" && (s.cache_fraction != "0.01" || !s.prefetch)) continue;
        SCOPED_TRACE("cache " + s.cache_fraction + (s.prefetch ? ", prefetch" : ""));
        std::vector<std::string> extra = base;
        extra.push_back("--embedding.storage=kv");
        extra.push_back("--embedding.cache_fraction=" + s.cache_fraction);
        extra.push_back(std::string("--embedding.prefetch=") + (s.prefetch ? "true" : "false"));
        const fs::path dump = dir / tag(ranks, sharding + "_kv" + s.cache_fraction +
                                                   (s.prefetch ? "_prefetch" : ""));
        expect_bitwise(run(job(data, ranks, dump, extra), group), memory);
      }
      if (sharding == "table_wise") {  // one kv table: the other rank holds no kv shard
        SCOPED_TRACE("one kv table, prefetch");
        std::vector<std::string> extra = base;
        const std::string feature = data == Data::Criteo ? "cat_0" : "user_id";
        extra.push_back("--embedding.storage_override=[\"" + feature + ":kv\"]");
        extra.push_back("--embedding.prefetch=true");
        expect_bitwise(run(job(data, ranks, dir / tag(ranks, "one_kv"), extra), group), memory);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Datasets, RecsysKvMpi, ::testing::Values(Data::Criteo, Data::MovieLens),
                         [](const auto& info) {
                           return info.param == Data::Criteo ? "SyntheticCriteo" : "MovieLens";
                         });

// A new run folder holding only `from`'s step-8 checkpoint (rank 0 copies; every rank waits).
fs::path resume_folder(const fs::path& from, const fs::path& dump) {
  if (world()->rank() == 0) {
    fs::create_directories(dump / "checkpoint");
    fs::copy(from / "checkpoint" / "step-8", dump / "checkpoint" / "step-8",
             fs::copy_options::recursive);
  }
  world()->barrier("copied");
  return dump;
}

void expect_continues(const TrainResult& resumed, const TrainResult& straight, double rel) {
  ASSERT_EQ(resumed.first_step, 9);
  ASSERT_EQ(resumed.losses.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    if (rel == 0)
      EXPECT_EQ(resumed.losses[i], straight.losses[8 + i]) << "step " << 9 + i;
    else
      EXPECT_NEAR(resumed.losses[i], straight.losses[8 + i], rel * straight.losses[8 + i])
          << "step " << 9 + i;
  }
}

// Stopped after step 8 and resumed (in a new folder, and in the run's own folder whose stores hold
// later rows): the same ranks continue bitwise; one rank (other plan) and
// memory tables continue to float tolerance (the dense gradients are summed in another order);
// a memory-table checkpoint resumed with kv tables continues bitwise.
TEST(RecsysKvMpiCheckpoint, ResumesAndReshards) {
  const int64_t n = world()->size();
  const std::shared_ptr<ProcessGroup> alone = self();
  const fs::path dir = testing::shared_dir(*world(), "mt_recsys_kv_mpi", "checkpoint");
  const std::vector<std::string> ckpt = {
      "--checkpoint.enable=true", "--checkpoint.interval=8", "--validation.enable=false",
      "--embedding.sharding=row_wise"};
  std::vector<std::string> kv = ckpt;
  kv.insert(kv.end(), {"--embedding.storage=kv", "--embedding.cache_fraction=0.05",
                       "--embedding.prefetch=true"});
  const TrainResult straight = run(job(Data::Criteo, n, dir / "straight", kv), world());
  ASSERT_EQ(straight.losses.size(), 16u);
  // The checkpoint counts each kv table's stored rows (mt_checkpoint inspect prints them): some,
  // not all, of the big table's rows after 8 steps of 256 samples; every row of a 4-row table.
  const checkpoint::CheckpointSummary summary =
      checkpoint::inspect_checkpoint(dir / "straight" / "checkpoint" / "step-8");
  const auto count = [&](const std::string& table) {
    return std::get<int64_t>(summary.index.values.at("table_optimizer.kv_rows." + table));
  };
  EXPECT_GT(count("t_cat_0"), 256);
  EXPECT_LT(count("t_cat_0"), 10000);
  EXPECT_EQ(count("t_cat_25"), 4);
  expect_continues(run(job(Data::Criteo, n, resume_folder(dir / "straight", dir / "same"), kv),
                       world()),
                   straight, 0.0);
  // What a crash after step 16 leaves, minus the step-16 save: the run's own folder, its stores
  // holding step 16's rows. The resume wipes them and refills them from step 8.
  if (world()->rank() == 0) fs::remove_all(dir / "straight" / "checkpoint" / "step-16");
  world()->barrier("removed");
  ASSERT_TRUE(fs::exists(dir / "straight" / "kv" / "rank-0" / "CURRENT"));
  expect_continues(run(job(Data::Criteo, n, dir / "straight", kv), world()), straight, 0.0);

  const TrainResult memory = run(job(Data::Criteo, n, dir / "memory", ckpt), world());
  expect_continues(
      run(job(Data::Criteo, n, resume_folder(dir / "memory", dir / "memory_to_kv"), kv), world()),
      memory, 0.0);

  for (const bool kv_tables : {true, false}) {
    SCOPED_TRACE(kv_tables ? "one rank, kv" : "one rank, memory");
    const fs::path dump =
        resume_folder(dir / "straight", dir / (kv_tables ? "one_kv" : "one_memory"));
    if (world()->rank() != 0) continue;
    expect_continues(run(job(Data::Criteo, 1, dump, kv_tables ? kv : ckpt), alone), straight,
                     1e-5);
  }
  world()->barrier("done");
}

// Raw-id kv tables (--embedding.raw_ids) train bitwise like memory tables where the ids route
// alike (one rank; table_wise on two), and resume from their sparse checkpoints: bitwise on the
// same ranks, to float tolerance on one rank.
TEST(RecsysKvMpiRawIds, TrainAndResumeLikeMemoryTables) {
  const int64_t n = world()->size();
  const std::shared_ptr<ProcessGroup> alone = self();
  const fs::path dir = testing::shared_dir(*world(), "mt_recsys_kv_mpi", "raw_ids");
  const std::vector<std::string> raw = {"--embedding.storage=kv", "--embedding.cache_fraction=0.05",
                                        "--embedding.prefetch=true",
                                        "--embedding.raw_ids=[\"cat_0\", \"cat_3\", \"cat_25\"]"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  if (world()->rank() == 0) {
    const std::vector<std::string> rw = {"--embedding.sharding=row_wise"};
    expect_bitwise(run(job(Data::Criteo, 1, dir / "raw1", with(rw, raw)), alone),
                   run(job(Data::Criteo, 1, dir / "memory1", rw), alone));
  }
  world()->barrier("one rank");
  const std::vector<std::string> tw = {"--embedding.sharding=table_wise", "--checkpoint.enable=true",
                                       "--checkpoint.interval=8", "--validation.enable=false"};
  const TrainResult memory = run(job(Data::Criteo, n, dir / "memory", tw), world());
  const TrainResult straight = run(job(Data::Criteo, n, dir / "straight", with(tw, raw)), world());
  expect_bitwise(straight, memory);
  // The raw-id tables were saved sparse (their ids beside their rows), the others dense.
  const checkpoint::CheckpointSummary summary =
      checkpoint::inspect_checkpoint(dir / "straight" / "checkpoint" / "step-8");
  std::map<std::string, runtime::Shape> shapes;
  for (const auto& c : summary.index.chunks) shapes[c.meta.fqn] = c.meta.global_shape;
  const std::string tables = "model.sparse_arch.embedding_bags.";
  ASSERT_TRUE(shapes.count(tables + "t_cat_0.ids"));
  EXPECT_EQ(shapes.at(tables + "t_cat_0.weight")[0], shapes.at(tables + "t_cat_0.ids")[0]);
  EXPECT_LT(shapes.at(tables + "t_cat_0.ids")[0], 10000);  // the rows trained, not the table
  EXPECT_EQ(shapes.at(tables + "t_cat_25.ids"), runtime::Shape{4});
  EXPECT_FALSE(shapes.count(tables + "t_cat_1.ids"));
  expect_continues(run(job(Data::Criteo, n, resume_folder(dir / "straight", dir / "same"),
                           with(tw, raw)),
                       world()),
                   straight, 0.0);
  const fs::path one = resume_folder(dir / "straight", dir / "one");
  if (world()->rank() == 0)
    expect_continues(
        run(job(Data::Criteo, 1, one,
                with({"--embedding.sharding=row_wise", "--checkpoint.enable=true",
                      "--checkpoint.interval=8", "--validation.enable=false"},
                     raw)),
            alone),
        straight, 1e-5);
  world()->barrier("done");
}

// Managed-collision ids (with evictions) in front of kv tables, with prefetch: the next batch's
// ids are read ahead at the rows they have then (ShardedManagedCollisionCollection::peek); rows
// the next step's remap moves or resets are read again. Bitwise as without prefetch and as memory
// tables, on 1 and 2 ranks.
TEST(RecsysKvMpiManagedCollision, PrefetchTrainsBitwise) {
  const std::shared_ptr<ProcessGroup> alone = self();
  const fs::path dir = testing::shared_dir(*world(), "mt_recsys_kv_mpi", "mc_prefetch");
  const std::vector<std::string> mc = {"--embedding.managed_collision=[\"cat_0\", \"cat_5\"]",
                                       "--embedding.sharding=row_wise"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), mc.begin(), mc.end());
    return more;
  };
  const std::vector<std::string> kv = {"--embedding.storage=kv", "--embedding.cache_fraction=0.05"};
  for (const int64_t ranks : {int64_t(1), int64_t(world()->size())}) {
    SCOPED_TRACE(std::to_string(ranks) + " rank(s)");
    const auto group = ranks == 1 ? alone : world();
    if (ranks == 1 && world()->rank() != 0) continue;
    const TrainResult memory = run(job(Data::Criteo, ranks, dir / tag(ranks, "memory"), mc), group);
    std::vector<std::string> prefetch = kv;
    prefetch.push_back("--embedding.prefetch=true");
    {
      SCOPED_TRACE("kv");
      expect_bitwise(run(job(Data::Criteo, ranks, dir / tag(ranks, "kv"), with(kv)), group),
                     memory);
    }
    SCOPED_TRACE("kv, prefetch");
    expect_bitwise(run(job(Data::Criteo, ranks, dir / tag(ranks, "prefetch"), with(prefetch)), group),
                   memory);
  }
  world()->barrier("done");
}

// This rank's shard of `table` ([rows, cols]; a kv shard read from its store).
Tensor shard_values(RecsysTrainer& trainer, const std::string& table) {
  auto& ebc = dynamic_cast<models::dlrm::ShardedSparseArch&>(trainer.model().sparse_arch())
                  .collection();
  ebc.flush_kv();
  for (const parallel::LocalShard& s : ebc.local_shards()) {
    if (s.table != table) continue;
    if (!s.kv) return s.weight.clone();
    const Tensor w = runtime::empty({s.placement.num_rows, s.placement.num_cols});
    std::vector<Tensor> state;
    for (const auto& [name, width] : s.kv->state_fields())
      state.push_back(runtime::empty({s.placement.num_rows, width}));
    s.kv->read_rows(0, s.placement.num_rows, w, state, nullptr);
    return w;
  }
  return Tensor();
}

TEST(RecsysKvMpiUpdate, FrozenTablesKeepTheirInitialValues) {
  const int64_t n = world()->size();
  const fs::path dir = testing::shared_dir(*world(), "mt_recsys_kv_mpi", "frozen");
  for (const std::string storage : {"memory", "kv"}) {
    SCOPED_TRACE(storage);
    const std::vector<std::string> extra = {
        "--embedding.sharding=row_wise", "--embedding.storage=" + storage,
        "--embedding.update_override=[\"cat_0:frozen\", \"cat_3:frozen\"]"};
    RecsysTrainer fresh(job(Data::Criteo, n, dir / (storage + "_fresh"), extra), quiet(world()));
    RecsysTrainer trained(job(Data::Criteo, n, dir / (storage + "_trained"), extra),
                          quiet(world()));
    trained.train();
    for (const std::string table : {"t_cat_0", "t_cat_3"})
      EXPECT_EQ(shard_values(trained, table).to_vector<float>(),
                shard_values(fresh, table).to_vector<float>())
          << table;
    EXPECT_NE(shard_values(trained, "t_cat_1").to_vector<float>(),
              shard_values(fresh, "t_cat_1").to_vector<float>());  // trained tables move
  }
}

// The planner counts a kv table's cache, not its rows, against memory_budget_mb: tables that do
// not fit one rank's 1 MiB in memory (1.5 MiB) fit as kv tables with a 10% cache.
TEST(RecsysKvMpiPlanner, KvTablesCountOnlyTheirCacheAgainstTheBudget) {
  const std::shared_ptr<ProcessGroup> alone = self();
  const fs::path dir = testing::shared_dir(*world(), "mt_recsys_kv_mpi", "planner");
  const fs::path dump = dir / ("r" + std::to_string(world()->rank()));
  const std::vector<std::string> budget = {"--embedding.memory_budget_mb=1"};
  EXPECT_NE(testing::error_of([&] { RecsysTrainer(job(Data::Criteo, 1, dump, budget), quiet(alone)); })
                .find("fits no sharding"),
            std::string::npos);
  std::vector<std::string> kv = budget;
  kv.insert(kv.end(), {"--embedding.storage=kv", "--embedding.cache_fraction=0.1"});
  EXPECT_EQ(run(job(Data::Criteo, 1, dump, kv), alone).losses.size(), 16u);
}

TEST(RecsysKvMpiErrors, BadSettingsNameTheKey) {
  const fs::path dir = testing::shared_dir(*world(), "mt_recsys_kv_mpi", "errors");
  auto error = [&](std::vector<std::string> extra) {
    return testing::error_of([&] {
      RecsysTrainer t(job(Data::Criteo, world()->size(), dir / "run", std::move(extra)),
                      quiet(world()));
    });
  };
  if (world()->rank() == 0) std::ofstream(dir / "a_file") << "x";
  world()->barrier("file");
  EXPECT_NE(error({"--embedding.storage=kv", "--embedding.kv_path=" + (dir / "a_file").string()})
                .find("cannot create the folder"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.storage_override=[\"cat_0\"]"}).find("<feature>:<mode>"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.storage_override=[\"nope:kv\"]"}).find("not a sparse feature"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.update_override=[\"cat_0:writeback\"]"}).find("train or frozen"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.update_override=[\"cat_0:frozen\", \"cat_0:train\"]"})
                .find("names 'cat_0' twice"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.storage=kv",
                   "--embedding.managed_collision=[\"cat_0\", \"cat_0\"]"})
                .find("embedding.managed_collision names 'cat_0' twice"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.storage=kv", "--embedding.sharding=data_parallel"})
                .find("cannot hold kv-backed tables"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.raw_ids=[\"cat_0\"]"}).find("not kv-backed"), std::string::npos);
  EXPECT_NE(error({"--embedding.storage=kv", "--embedding.raw_ids=[\"nope\"]"})
                .find("not a sparse feature"),
            std::string::npos);
  EXPECT_NE(error({"--embedding.storage=kv", "--embedding.raw_ids=[\"cat_0\"]",
                   "--embedding.managed_collision=[\"cat_0\"]"})
                .find("both embedding.raw_ids and embedding.managed_collision"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::train
