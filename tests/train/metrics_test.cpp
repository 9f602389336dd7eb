// Training metrics (train/metrics): the peak-FLOPs table and MFU, the one-line step format
// (values, fixed widths so columns align, thousands separators, memory units, durations), the ETA
// estimator (warmup skipped, moving window), and metrics.jsonl (escaping, NaN -> null, append,
// one flushed line per write, valid JSON per python3's json module when python3 exists).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "train/metrics/eta.h"
#include "train/metrics/jsonl_writer.h"
#include "train/metrics/peak_flops.h"
#include "train/metrics/step_metrics.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// ---- peak FLOPs and MFU ------------------------------------------------------------------------

TEST(PeakFlops, GpuTable) {
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 80GB HBM3", PeakDType::BF16), 989e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 80GB HBM3", PeakDType::F32), 67e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 PCIe", PeakDType::BF16), 756e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 NVL", PeakDType::BF16), 835e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H200", PeakDType::BF16), 989e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA A100-SXM4-80GB", PeakDType::BF16), 312e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA GeForce GTX 1080", PeakDType::BF16), std::nullopt);
  EXPECT_EQ(peak_flops(runtime::DeviceType::CUDA, "NVIDIA H200", PeakDType::BF16), 989e12);
}

TEST(PeakFlops, CpuFromEnvironment) {
  unsetenv("MT_CPU_PEAK_FLOPS");
  EXPECT_EQ(cpu_peak_flops(), std::nullopt);
  EXPECT_EQ(peak_flops(runtime::DeviceType::CPU, "anything", PeakDType::F32), std::nullopt);
  setenv("MT_CPU_PEAK_FLOPS", "2.5e11", 1);
  EXPECT_EQ(cpu_peak_flops(), 2.5e11);
  EXPECT_EQ(peak_flops(runtime::DeviceType::CPU, "", PeakDType::BF16), 2.5e11);
  setenv("MT_CPU_PEAK_FLOPS", "fast", 1);
  try {
    cpu_peak_flops();
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("MT_CPU_PEAK_FLOPS"));
    EXPECT_THAT(e.what(), HasSubstr("'fast'"));
  }
  setenv("MT_CPU_PEAK_FLOPS", "-1", 1);
  EXPECT_THROW(cpu_peak_flops(), Error);
  unsetenv("MT_CPU_PEAK_FLOPS");
}

TEST(PeakFlops, Mfu) {
  // 6 * 8e9 FLOPs/token at 1,000 tok/s on a 989 TFLOP/s device.
  const auto m = mfu(6 * 8e9, 1000.0, 989e12);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(*m, 48e12 / 989e12);
  EXPECT_EQ(mfu(1e9, 1000.0, std::nullopt), std::nullopt);
  EXPECT_EQ(mfu(1e9, 1000.0, 0.0), std::nullopt);
}

// ---- the step line -----------------------------------------------------------------------------

StepMetrics example() {
  StepMetrics m;
  m.step = 120;
  m.loss = 3.45213;
  m.grad_norm = 1.234;
  m.lr = 3e-4;
  m.tokens_per_sec = 12345.4;
  m.mem_in_use_bytes = int64_t(1.2 * 1073741824.0);
  m.mem_peak_bytes = int64_t(1.5 * 1073741824.0);
  m.data_wait_fraction = 0.021;
  m.elapsed_sec = 30;
  m.eta_sec = 192;
  return m;
}

TEST(StepLine, Format) {
  EXPECT_EQ(format_step_line(example()),
            "step  120  loss  3.4521  grad_norm     1.23  lr 3.0e-04  tok/s/rank    12,345  "
            "mfu    n/a  mem   1.2/1.5 GiB  data   2%  eta 3m12s");
  StepMetrics m = example();
  m.mfu = 0.4123;
  m.mem_in_use_bytes = 512LL << 20;
  m.mem_peak_bytes = 768LL << 20;
  m.eta_sec.reset();
  m.loss = std::nan("");
  m.grad_norm = 0.00123;
  EXPECT_EQ(format_step_line(m, 6),
            "step    120  loss     nan  grad_norm 1.23e-03  lr 3.0e-04  tok/s/rank    12,345  "
            "mfu  41.2%  mem   512/768 MiB  data   2%  eta n/a");
}

// With [comm] trace the exposed communication share follows the data wait.
TEST(StepLine, CommTraceAddsTheExposedShare) {
  StepMetrics m = example();
  m.comm_exposed_fraction = 0.123;
  EXPECT_EQ(format_step_line(m),
            "step  120  loss  3.4521  grad_norm     1.23  lr 3.0e-04  tok/s/rank    12,345  "
            "mfu    n/a  mem   1.2/1.5 GiB  data   2%  comm  12%  eta 3m12s");
}

// On several ranks the per-rank rate (as torchtitan's tps) is followed by the job's total.
TEST(StepLine, SeveralRanksAddTheJobsTotal) {
  StepMetrics m = example();
  m.ranks = 4;
  EXPECT_EQ(format_step_line(m),
            "step  120  loss  3.4521  grad_norm     1.23  lr 3.0e-04  tok/s/rank    12,345  "
            "total     49,382  mfu    n/a  mem   1.2/1.5 GiB  data   2%  eta 3m12s");
  m.rate_in_samples = true;
  EXPECT_NE(format_step_line(m).find("  samples/s/rank    12,345  total     49,382  "),
            std::string::npos)
      << format_step_line(m);
}

TEST(StepLine, ColumnsAlign) {
  // Lines with very different values have their labels at the same columns.
  StepMetrics a = example(), b = example();
  b.step = 9;
  b.loss = 10.5;
  b.grad_norm = 250.0;
  b.tokens_per_sec = 987;
  b.mfu = 0.05;
  b.mem_in_use_bytes = 3LL << 20;
  b.mem_peak_bytes = 900LL << 20;
  b.data_wait_fraction = 0.5;
  const std::string la = format_step_line(a), lb = format_step_line(b);
  for (const char* label :
       {"  loss", "  grad_norm", "  lr", "  tok/s/rank", "  mfu", "  mem", "  data", "  eta"}) {
    EXPECT_EQ(la.find(label), lb.find(label)) << label << "\n" << la << "\n" << lb;
  }
  EXPECT_EQ(step_width_for(100), 4);
  EXPECT_EQ(step_width_for(100000), 6);
}

TEST(StepLine, Helpers) {
  EXPECT_EQ(format_thousands(0), "0");
  EXPECT_EQ(format_thousands(999), "999");
  EXPECT_EQ(format_thousands(1000), "1,000");
  EXPECT_EQ(format_thousands(1234567), "1,234,567");
  EXPECT_EQ(format_thousands(-1234567), "-1,234,567");
  EXPECT_EQ(format_thousands(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(192), "3m12s");
  EXPECT_EQ(format_duration(3600 + 5 * 60 + 10), "1h05m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600), "3d04h");
  EXPECT_EQ(format_duration(-1), "n/a");
  EXPECT_EQ(format_duration(std::nan("")), "n/a");
  EXPECT_EQ(format_memory(100LL << 20, 200LL << 20), "100/200 MiB");
  EXPECT_EQ(format_memory(1LL << 30, 2LL << 30), "1.0/2.0 GiB");
}

// ---- ETA ---------------------------------------------------------------------------------------

TEST(Eta, IgnoresWarmupAndAveragesWindow) {
  EtaEstimator eta(/*total_steps=*/100, /*warmup_steps=*/2, /*window=*/3);
  EXPECT_EQ(eta.eta(0), std::nullopt);
  eta.record(50.0);  // warmup: ignored
  eta.record(40.0);  // warmup: ignored
  EXPECT_EQ(eta.eta(2), std::nullopt);
  eta.record(1.0);
  EXPECT_DOUBLE_EQ(*eta.eta(3), 97.0);
  eta.record(2.0);
  eta.record(3.0);
  EXPECT_DOUBLE_EQ(*eta.mean_step_seconds(), 2.0);
  eta.record(4.0);  // window of 3: {2, 3, 4}
  EXPECT_DOUBLE_EQ(*eta.mean_step_seconds(), 3.0);
  EXPECT_DOUBLE_EQ(*eta.eta(6), 3.0 * 94);
  eta.record(std::nan(""));  // ignored
  eta.record(-1.0);          // ignored
  EXPECT_DOUBLE_EQ(*eta.mean_step_seconds(), 3.0);
  for (int i = 0; i < 10; ++i) eta.record(0.5);
  EXPECT_DOUBLE_EQ(*eta.mean_step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(*eta.eta(100), 0.0);
  EXPECT_DOUBLE_EQ(*eta.eta(150), 0.0);
  EXPECT_THROW(EtaEstimator(10, 0, 0), Error);
}

// ---- metrics.jsonl -----------------------------------------------------------------------------

class JsonlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mt_metrics_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<std::string> lines(const fs::path& p) {
    std::ifstream f(p);
    std::vector<std::string> out;
    for (std::string l; std::getline(f, l);) out.push_back(l);
    return out;
  }
  fs::path dir_;
};

TEST(Json, QuoteAndNumbers) {
  EXPECT_EQ(json_quote("plain"), "\"plain\"");
  EXPECT_EQ(json_quote("a\"b\\c\n\t\x01"), "\"a\\\"b\\\\c\\n\\t\\u0001\"");
  EXPECT_EQ(json_quote("h\xc3\xa9llo \xe2\x82\xac"),
            "\"h\xc3\xa9llo \xe2\x82\xac\"");  // UTF-8 kept
  EXPECT_EQ(json_quote("bad \xff \xc3"), "\"bad \\ufffd \\ufffd\"");
  EXPECT_EQ(json_quote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate
  EXPECT_EQ(json_number(0.1), "0.1");
  EXPECT_EQ(json_number(3e-4), "3e-04");  // shortest round trip (valid JSON)
  EXPECT_EQ(json_number(1e300), "1e+300");
  EXPECT_EQ(json_number(std::nan("")), "null");
  EXPECT_EQ(json_number(-std::numeric_limits<double>::infinity()), "null");
  JsonObject o;
  o.add("i", int64_t(-3))
      .add("s", "x")
      .add("b", true)
      .add_null("n")
      .add("o", std::optional<double>());
  EXPECT_EQ(o.str(), R"({"i": -3, "s": "x", "b": true, "n": null, "o": null})");
  EXPECT_EQ(JsonObject().str(), "{}");
}

TEST_F(JsonlTest, WritesOneFlushedLinePerStepAndAppends) {
  const fs::path path = dir_ / "metrics.jsonl";
  {
    JsonlWriter w(path.string());
    StepMetrics m = example();
    w.write(m);
    // Flushed: readable before the writer closes.
    ASSERT_EQ(lines(path).size(), 1u);
    EXPECT_EQ(lines(path)[0],
              R"({"step": 120, "loss": 3.45213, "grad_norm": 1.234, "lr": 3e-04, )"
              R"("tokens_per_sec": 12345.4, "tokens_per_sec_total": 12345.4, "mfu": null, )"
              R"("mem_in_use_bytes": 1288490188, )"
              R"("mem_peak_bytes": 1610612736, "data_wait_fraction": 0.021, "comm_exposed_fraction": null, "elapsed_sec": 30, )"
              R"("eta_sec": 192})");
    m.step = 121;
    m.loss = std::numeric_limits<double>::infinity();
    m.mfu = 0.25;
    m.eta_sec.reset();
    w.write(to_json(m).add("val_loss", 2.5).add("note", "q\"uote"));
  }
  {
    JsonlWriter again(path.string());  // a resumed run appends
    again.write(JsonObject().add("step", 122));
  }
  const std::vector<std::string> l = lines(path);
  ASSERT_EQ(l.size(), 3u);
  EXPECT_THAT(l[1], HasSubstr(R"("step": 121, "loss": null,)"));
  EXPECT_THAT(l[1], HasSubstr(R"("mfu": 0.25,)"));
  EXPECT_THAT(l[1], HasSubstr(R"("eta_sec": null, "val_loss": 2.5, "note": "q\"uote"})"));
  EXPECT_EQ(l[2], R"({"step": 122})");

  if (std::system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
    const std::string cmd =
        "python3 -c 'import json,sys\nfor l in open(sys.argv[1]): json.loads(l)' " + path.string();
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "python3's json rejected " << path;
  }
}

TEST_F(JsonlTest, OpenErrorNamesThePath) {
  const std::string bad = (dir_ / "missing_dir" / "metrics.jsonl").string();
  try {
    JsonlWriter w(bad);
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(bad));
    EXPECT_THAT(e.what(), HasSubstr("No such file"));
  }
}

}  // namespace
}  // namespace mt::train
