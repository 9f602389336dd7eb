// TensorBoard event files (train/metrics/tensorboard_writer.h): CRC-32C against its published
// check value, records that read back with their CRCs, TensorBoard's own reader (when installed)
// seeing every scalar, a step's metrics as scalars, and a clear error for a folder it cannot use.
#include "train/metrics/tensorboard_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/errors.h"
#include "tests/testing/python_env.h"
#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/tensorboard_events.h"

namespace mt::train {
namespace {

TEST(TensorBoard, Crc32cOfTheCheckString) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoard, ScalarsReadBackWithTheirSteps) {
  testing::ScratchDir dir;
  std::string path;
  {
    TensorBoardWriter w((dir / "tb").string());
    path = w.path();
    w.add_scalars(1, {{"loss", 2.5}, {"lr", 3e-4}});
    w.add_scalars(10, {{"loss", 1.25}, {"val_loss", std::nan("")}});
  }
  EXPECT_EQ(testing::only_event_file(dir / "tb").string(), path);
  const testing::EventFile f = testing::read_event_file(path);
  EXPECT_EQ(f.file_version, "brain.Event:2");
  ASSERT_EQ(f.scalars.size(), 4u);
  EXPECT_EQ(f.scalars[0].step, 1);
  EXPECT_EQ(f.scalars[0].tag, "loss");
  EXPECT_EQ(f.scalars[0].value, 2.5f);
  EXPECT_EQ(f.scalars[1].tag, "lr");
  EXPECT_EQ(f.scalars[1].value, 3e-4f);
  EXPECT_EQ(f.scalars[2].step, 10);
  EXPECT_EQ(f.scalars[2].value, 1.25f);
  EXPECT_TRUE(std::isnan(f.scalars[3].value));
}

TEST(TensorBoard, TensorBoardsOwnReaderSeesEveryScalar) {
  const auto python =
      testing::python_with("tensorboard.backend.event_processing.event_accumulator");
  if (!python) GTEST_SKIP() << "no Python with tensorboard (pip install tensorboard)";
  testing::ScratchDir dir;
  {
    TensorBoardWriter w((dir / "tb").string());
    for (int64_t step = 1; step <= 3; ++step)
      w.add_scalars(step, {{"loss", 4.0 / double(step)}, {"grad_norm", 0.5 * double(step)}});
    w.add_scalars(3, {{"val_loss", 1.5}});
  }
  std::ofstream(dir / "check.py") << R"PY(
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1])
ea.Reload()
assert sorted(ea.Tags()["scalars"]) == ["grad_norm", "loss", "val_loss"], ea.Tags()
got = {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
assert [s for s, _ in got["loss"]] == [1, 2, 3], got
assert got["loss"][:2] == [(1, 4.0), (2, 2.0)], got
assert abs(got["loss"][2][1] - 4.0 / 3.0) < 1e-6, got  # stored as a float
assert got["grad_norm"] == [(1, 0.5), (2, 1.0), (3, 1.5)], got
assert got["val_loss"] == [(3, 1.5)], got
print("tensorboard reads it")
)PY";
  const testing::CommandResult r = testing::run_command(
      *python + " " + (dir / "check.py").string() + " " + (dir / "tb").string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tensorboard reads it"), std::string::npos) << r.output;
}

TEST(TensorBoard, StepMetricsBecomeScalarsNamedAsInTheJsonl) {
  StepMetrics m;
  m.loss = 3.0;
  m.grad_norm = 0.5;
  m.lr = 1e-3;
  m.tokens_per_sec = 1000;
  m.mem_peak_bytes = int64_t(3) << 30;
  m.model_metrics = {{"moe_load_imbalance", 1.25}};
  const auto s = tensorboard_scalars(m);
  std::vector<std::string> tags;
  for (const auto& [tag, value] : s) tags.push_back(tag);
  EXPECT_EQ(tags, (std::vector<std::string>{"loss", "grad_norm", "lr", "tokens_per_sec",
                                            "tokens_per_sec_total", "mem_peak_gib",
                                            "data_wait_fraction", "moe_load_imbalance"}));
  EXPECT_EQ(s[5].second, 3.0);
  m.rate_in_samples = true;
  m.ranks = 3;
  m.mfu = 0.4;
  EXPECT_EQ(tensorboard_scalars(m)[3].first, "samples_per_sec");
  EXPECT_EQ(tensorboard_scalars(m)[4],
            (std::pair<std::string, double>{"samples_per_sec_total", 3000.0}));
  EXPECT_EQ(tensorboard_scalars(m)[5], (std::pair<std::string, double>{"mfu", 0.4}));
}

TEST(TensorBoard, AFolderItCannotCreateIsAnErrorNamingIt) {
  testing::ScratchDir dir;
  std::ofstream(dir / "file") << "x";
  const std::string m =
      testing::error_of([&] { TensorBoardWriter((dir / "file" / "tb").string()); });
  EXPECT_NE(m.find("tensorboard: cannot create the folder"), std::string::npos) << m;
}

}  // namespace
}  // namespace mt::train
