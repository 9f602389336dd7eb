// A `train` process with kv-backed tables killed with SIGKILL mid-run (after its step-20
// checkpoint, its RocksDB stores open and ahead of that checkpoint), then started again with the
// same command: it resumes from its latest checkpoint and every later step's loss equals an
// uninterrupted run's bitwise.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 300;

std::string train_command(const fs::path& dump) {
  std::string c = std::string("OMP_NUM_THREADS=1 ") + MT_TRAIN_BIN + " --config " +
                  (fs::path(MT_SOURCE_DIR) / "configs" / "dlrm_criteo_synthetic.toml").string();
  for (const std::string& a :
       {"--job.dump_folder=" + dump.string(), std::string("--training.local_batch_size=128"),
        "--training.steps=" + std::to_string(kSteps), std::string("--validation.enable=false"),
        std::string("--metrics.log_freq=1"), std::string("--checkpoint.enable=true"),
        std::string("--checkpoint.interval=20"), std::string("--embedding.storage=kv"),
        std::string("--embedding.cache_fraction=0.05"), std::string("--embedding.prefetch=true")})
    c += " '" + a + "'";
  return c;
}

// step -> loss from <dump>/metrics.jsonl (the last line of each step: a resumed run's).
std::map<int, std::string> losses(const fs::path& dump) {
  std::map<int, std::string> out;
  std::ifstream in(dump / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const size_t s = line.find("\"step\": "), l = line.find("\"loss\": ");
    if (s == std::string::npos || l == std::string::npos) continue;
    const int step = std::stoi(line.substr(s + 8));
    out[step] = line.substr(l + 8, line.find(',', l) - l - 8);  // as printed: every digit
  }
  return out;
}

TEST(RecsysKvKill, KilledRunResumesWithTheSameLosses) {
  testing::ScratchDir dir;
  const fs::path straight = dir.path() / "straight", killed = dir.path() / "killed";
  testing::CommandResult r = testing::run_command(train_command(straight));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::map<int, std::string> expected = losses(straight);
  ASSERT_EQ(expected.size(), size_t(kSteps));

  // Killed once its step-20 checkpoint is complete (the step folder appears by a rename).
  const fs::path script = dir.path() / "kill.sh";
  std::ofstream(script) << train_command(killed) << " > " << (dir.path() / "killed.log").string()
                        << " 2>&1 &\npid=$!\nfor i in $(seq 3000); do [ -d "
                        << (killed / "checkpoint" / "step-20").string()
                        << " ] && break; sleep 0.05; done\nkill -9 $pid\nwait $pid\n"
                        << "echo \"status $?\"\n";
  r = testing::run_command("bash " + script.string());
  ASSERT_NE(r.output.find("status 137"), std::string::npos) << r.output;  // SIGKILL
  const std::map<int, std::string> before = losses(killed);
  ASSERT_FALSE(before.empty());
  ASSERT_LT(before.rbegin()->first, kSteps) << "the run ended before the kill";
  ASSERT_TRUE(fs::exists(killed / "kv" / "rank-0" / "CURRENT"));

  r = testing::run_command(train_command(killed));
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_NE(r.output.find("resum"), std::string::npos) << r.output;
  const std::map<int, std::string> after = losses(killed);
  ASSERT_EQ(after.rbegin()->first, kSteps);
  // It resumed from its latest complete checkpoint, at most the last multiple of 20 it logged:
  // every step after that is the resumed run's.
  const int resumed_from = before.rbegin()->first / 20 * 20;
  int compared = 0;
  for (int step = resumed_from + 1; step <= kSteps; ++step) {
    ASSERT_TRUE(after.count(step)) << "step " << step;
    EXPECT_EQ(after.at(step), expected.at(step)) << "step " << step;
    ++compared;
  }
  EXPECT_GT(compared, 0);
  std::printf("killed after step %d, resumed from step %d; %d steps equal the uninterrupted run\n",
              before.rbegin()->first, resumed_from, compared);
}

}  // namespace
}  // namespace mt::train
