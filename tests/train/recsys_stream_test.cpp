// `train` with [embedding] stream_to (one process, loopback TCP): after N steps the serving
// replica (RowStreamServer, what mt_embedding_server runs) holds every table's trained rows
// bitwise, for memory and kv tables, and no row the trainer never updated; a replica that is down
// makes the trainer warn and train on, saying what the replica missed; a bad address is an error.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "models/dlrm/parallelize.h"
#include "parallel/embedding/row_stream_server.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"
#include "train/config/load.h"
#include "train/recsys_trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using runtime::Tensor;

config::JobConfig job(const fs::path& dump, std::vector<std::string> extra) {
  std::vector<std::string> args = {"--job.dump_folder=" + dump.string(),
                                   "--training.local_batch_size=128", "--training.steps=12",
                                   "--validation.enable=false", "--metrics.log_freq=1000"};
  args.insert(args.end(), extra.begin(), extra.end());
  return config::load_config(fs::path(MT_SOURCE_DIR) / "configs" / "dlrm_criteo_synthetic.toml",
                             args);
}

TrainerOptions options(std::ostream* log) {
  TrainerOptions o;
  o.quiet = log == nullptr;
  o.log = log;
  o.handle_signals = false;
  o.write_files = false;
  return o;
}

// Every shard of the trainer's tables: (table, [rows, cols] values).
std::vector<std::pair<std::string, Tensor>> tables_of(RecsysTrainer& trainer) {
  auto& ebc = dynamic_cast<models::dlrm::ShardedSparseArch&>(trainer.model().sparse_arch())
                  .collection();
  ebc.flush_kv();
  std::vector<std::pair<std::string, Tensor>> out;
  for (const parallel::LocalShard& s : ebc.local_shards()) {
    Tensor w = s.weight.defined() ? s.weight.clone()
                                  : runtime::empty({s.placement.num_rows, s.placement.num_cols});
    if (s.kv) {
      std::vector<Tensor> state;
      for (const auto& [name, width] : s.kv->state_fields())
        state.push_back(runtime::empty({s.placement.num_rows, width}));
      s.kv->read_rows(0, s.placement.num_rows, w, state, nullptr);
    }
    out.emplace_back(s.table, w);
  }
  return out;
}

class RecsysStream : public ::testing::TestWithParam<std::string> {};

TEST_P(RecsysStream, ReplicaHoldsTheTrainedRowsBitwise) {
  testing::ScratchDir dir;
  parallel::RowStreamServer server({.db = dir.path() / "replica"});
  const std::vector<std::string> extra = {
      "--embedding.storage=" + GetParam(),
      "--embedding.stream_to=127.0.0.1:" + std::to_string(server.port())};
  std::ostringstream log;
  RecsysTrainer trained(job(dir.path() / "run", extra), options(&log));
  trained.train();
  RecsysTrainer fresh(job(dir.path() / "fresh", {"--embedding.storage=" + GetParam()}),
                      options(nullptr));
  const auto initial = tables_of(fresh);
  const auto now = tables_of(trained);
  int64_t streamed = 0, changed = 0;
  for (size_t t = 0; t < now.size(); ++t) {
    const auto& [name, values] = now[t];
    const int64_t rows = values.size(0);
    std::vector<int64_t> ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) ids[size_t(r)] = r;
    const parallel::row_stream::LookupResult got = server.lookup(name, ids);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> mine = values.narrow(0, r, 1).to_vector<float>();
      const bool moved = mine != initial[t].second.narrow(0, r, 1).to_vector<float>();
      changed += moved;
      if (!got.found[size_t(r)]) {
        EXPECT_FALSE(moved) << name << " row " << r << " was trained but never streamed";
        continue;
      }
      ++streamed;
      EXPECT_EQ(got.values.narrow(0, r, 1).to_vector<float>(), mine) << name << " row " << r;
    }
  }
  EXPECT_GT(changed, 1000);  // the check covers real training
  EXPECT_GE(streamed, changed);
  EXPECT_NE(log.str().find("updates acknowledged"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("missed"), std::string::npos) << log.str();
}

INSTANTIATE_TEST_SUITE_P(Storage, RecsysStream, ::testing::Values("memory", "kv"));

TEST(RecsysStreamDown, TrainerWarnsAndTrainsOn) {
  testing::ScratchDir dir;
  int port = 0;
  {
    parallel::RowStreamServer gone({.db = dir.path() / "gone"});
    port = gone.port();
  }  // closed: nothing listens there now
  std::ostringstream log;
  const config::JobConfig c =
      job(dir.path() / "run", {"--embedding.stream_to=127.0.0.1:" + std::to_string(port)});
  const TrainResult r = RecsysTrainer(c, options(&log)).train();
  EXPECT_EQ(r.losses.size(), 12u);
  const TrainResult alone = RecsysTrainer(job(dir.path() / "alone", {}), options(nullptr)).train();
  EXPECT_EQ(r.losses, alone.losses);  // nothing lost in the trainer
  EXPECT_NE(log.str().find("127.0.0.1:" + std::to_string(port)), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("the replica missed "), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("of steps 1..12"), std::string::npos) << log.str();
  // The stream's own warning, logged by its connection thread, reaches the trainer's log (which
  // only the training thread writes).
  EXPECT_NE(log.str().find("WARNING: the replica at 127.0.0.1:" + std::to_string(port) +
                           " is unreachable"),
            std::string::npos)
      << log.str();
}

TEST(RecsysStreamErrors, BadAddressIsAnError) {
  testing::ScratchDir dir;
  EXPECT_NE(testing::error_of([&] {
              RecsysTrainer(job(dir.path(), {"--embedding.stream_to=localhost"}),
                            options(nullptr));
            }).find("localhost"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::train
