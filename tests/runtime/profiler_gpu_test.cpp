// The op profiler on a GPU: kernels dispatched on the session's CUDA device are timed between
// events on the stream (begin <= end, one after another, busy time within the span, matmul's
// total > 0); a CPU kernel in the same session has host times only; copies between the host and
// the GPU and synchronize() are recorded as ops. Skips without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/core/profiler.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"
#include "tests/testing/gpu.h"

namespace mt::runtime {
namespace {

TEST(ProfilerGpu, KernelsAreTimedOnTheDevice) {
  MT_REQUIRE_CUDA();
  const Tensor a = randn({1024, 1024}, RandomKey(1, "a")).to(Device::cuda());
  const Tensor b = randn({1024, 1024}, RandomKey(1, "b")).to(Device::cuda());
  const Tensor host = full({8}, 1.0);
  (void)matmul(a, b);  // warm-up: cuBLAS handles and workspaces outside the session
  synchronize(Device::cuda());

  Profiler::start(Device::cuda());
  Tensor c = matmul(a, b);
  c = add(c, a);
  c = matmul(c, b);
  (void)add(host, host);  // a CPU kernel: host times only
  const ProfileReport report = Profiler::stop();

  ASSERT_TRUE(report.device_timed);
  ASSERT_EQ(report.ops.size(), 4u);
  double previous_end = 0;
  for (size_t i = 0; i < 3; ++i) {
    const ProfiledOp& op = report.ops[i];
    SCOPED_TRACE(std::string(op.name) + " #" + std::to_string(i));
    EXPECT_TRUE(op.device.is_cuda());
    EXPECT_GE(op.device_begin_us, previous_end - 1.0);  // one stream: in order (event rounding)
    EXPECT_GT(op.device_end_us, op.device_begin_us);
    previous_end = op.device_end_us;
  }
  EXPECT_EQ(report.ops[3].device_begin_us, -1);
  EXPECT_GT(report.device_busy_ms, 0);
  EXPECT_LE(report.device_busy_ms, report.device_span_ms + 1e-3);
  // Two 1024^3 products take at least their arithmetic at any rate under 1 PFLOP/s.
  double matmul_ms = 0;
  for (const OpTotal& t : report.totals())
    if (t.name == "matmul") matmul_ms = t.device_ms;
  EXPECT_GT(matmul_ms, 2 * 2.0 * 1024 * 1024 * 1024 / 1e15 * 1e3);
  const std::string summary = report.summary();
  EXPECT_NE(summary.find("idle between them"), std::string::npos) << summary;
}

// Copies between the host and the GPU and synchronize() are ops too: the host's waits show.
TEST(ProfilerGpu, CopiesAndSynchronizeAreRecorded) {
  MT_REQUIRE_CUDA();
  const Tensor host = randn({256, 256}, RandomKey(2, "x"));
  Profiler::start(Device::cuda());
  const Tensor on_gpu = host.to(Device::cuda());
  (void)on_gpu.to(Device::cpu());
  synchronize(Device::cuda());
  const ProfileReport report = Profiler::stop();
  std::vector<std::string> top_level;
  for (const ProfiledOp& op : report.ops)
    if (op.depth == 0) top_level.push_back(op.name);
  EXPECT_EQ(top_level, (std::vector<std::string>{"copy_to_device", "copy_to_host", "synchronize"}));
  for (const ProfiledOp& op : report.ops) {
    if (op.depth != 0) continue;
    EXPECT_TRUE(op.device.is_cuda()) << op.name;
    EXPECT_GE(op.device_end_us, op.device_begin_us) << op.name;
  }
}

}  // namespace
}  // namespace mt::runtime
