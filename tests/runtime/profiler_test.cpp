// The op profiler (runtime/core/profiler.h): a session records the kernels its thread dispatches,
// with their nesting and host times, and nothing from other threads or outside the session; the
// totals and summary sum the top-level ops; the Chrome trace holds one event per op; misuse and
// unwritable trace paths are errors.
#include "runtime/core/profiler.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "runtime/core/dispatch.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"

namespace mt::runtime {
namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Profiler, RecordsTheKernelsOfItsThreadInsideTheSession) {
  const Tensor a = full({64, 64}, 1.0), b = full({64, 64}, 2.0);
  (void)matmul(a, b);  // before the session: not recorded
  Profiler::start(Device::cpu());
  EXPECT_TRUE(Profiler::recording());
  (void)matmul(a, b);
  (void)add(a, b);
  (void)matmul(a, b);
  std::thread([&] { (void)add(a, b); }).join();  // another thread: not recorded
  const ProfileReport report = Profiler::stop();
  EXPECT_FALSE(Profiler::recording());
  (void)matmul(a, b);  // after: not recorded

  ASSERT_EQ(report.ops.size(), 3u);
  EXPECT_EQ(std::string(report.ops[0].name), "matmul");
  EXPECT_EQ(std::string(report.ops[2].name), "matmul");
  double last_end = 0;
  for (const ProfiledOp& op : report.ops) {
    EXPECT_EQ(op.depth, 0);
    EXPECT_EQ(op.device, Device::cpu());
    EXPECT_GE(op.host_begin_us, last_end);  // in dispatch order, one after another
    EXPECT_GE(op.host_end_us, op.host_begin_us);
    EXPECT_EQ(op.device_begin_us, -1);  // the CPU has no device clock
    last_end = op.host_end_us;
  }
  EXPECT_GE(report.wall_ms * 1e3, last_end);
  EXPECT_FALSE(report.device_timed);

  const std::vector<OpTotal> totals = report.totals();
  ASSERT_EQ(totals.size(), 2u);
  const OpTotal& mm = totals[0].name == "matmul" ? totals[0] : totals[1];
  EXPECT_EQ(mm.name, "matmul");
  EXPECT_EQ(mm.calls, 2);
  EXPECT_NEAR(mm.host_ms,
              (report.ops[0].host_end_us - report.ops[0].host_begin_us + report.ops[2].host_end_us -
               report.ops[2].host_begin_us) /
                  1e3,
              1e-9);
  EXPECT_GE(totals[0].host_ms, totals[1].host_ms);  // most time first
}

// Two kernel tables of the test's own, the outer kernel dispatching the inner one twice.
constinit KernelTable<void(Device)> g_inner{"inner"};
constinit KernelTable<void(Device)> g_outer{"outer"};
void inner_kernel(Device) {}
void outer_kernel(Device d) {
  g_inner(d, d);
  g_inner(d, d);
}

TEST(Profiler, KernelsInsideKernelsAreNestedAndLeftOutOfTheTotals) {
  g_inner.set(DeviceType::CPU, inner_kernel);
  g_outer.set(DeviceType::CPU, outer_kernel);
  Profiler::start(Device::cpu());
  g_outer(Device::cpu(), Device::cpu());
  g_inner(Device::cpu(), Device::cpu());
  const ProfileReport report = Profiler::stop();
  ASSERT_EQ(report.ops.size(), 4u);
  const std::vector<std::pair<std::string, int>> expected = {
      {"outer", 0}, {"inner", 1}, {"inner", 1}, {"inner", 0}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(report.ops[i].name, expected[i].first) << i;
    EXPECT_EQ(report.ops[i].depth, expected[i].second) << i;
  }
  EXPECT_LE(report.ops[0].host_begin_us, report.ops[1].host_begin_us);  // inside its parent
  EXPECT_GE(report.ops[0].host_end_us, report.ops[2].host_end_us);
  for (const OpTotal& t : report.totals()) EXPECT_EQ(t.calls, 1) << t.name;  // top level only
}

TEST(Profiler, SummaryAndTraceCoverEveryOp) {
  const Tensor x = full({32, 32}, 0.5);
  Profiler::start(Device::cpu());
  for (int i = 0; i < 3; ++i) (void)sum(mul(exp(x), x));
  const ProfileReport report = Profiler::stop();
  ASSERT_GE(report.ops.size(), 9u);

  const std::string brief = report.summary(/*top=*/1);
  EXPECT_NE(brief.find("ms wall"), std::string::npos) << brief;
  EXPECT_NE(brief.find("calls"), std::string::npos) << brief;
  EXPECT_NE(brief.find("more ops in the trace"), std::string::npos) << brief;
  const std::string full_summary = report.summary();
  for (const OpTotal& t : report.totals())
    EXPECT_NE(full_summary.find(t.name), std::string::npos) << t.name;

  testing::ScratchDir dir;
  const std::string path = (dir.path() / "trace.json").string();
  report.write_chrome_trace(path);
  std::ifstream f(path);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [", 0), 0u) << text;
  EXPECT_EQ(count_of(text, "\"ph\": \"X\""), report.ops.size());  // host events only on a CPU
  EXPECT_EQ(text.substr(text.size() - 3), "]}\n");

  const std::string bad = (dir.path() / "missing" / "trace.json").string();
  EXPECT_NE(testing::error_of([&] { report.write_chrome_trace(bad); }).find(bad),
            std::string::npos);
}

TEST(Profiler, OneSessionAtATime) {
  EXPECT_NE(testing::error_of([] { (void)Profiler::stop(); }).find("no session is open"),
            std::string::npos);
  Profiler::start(Device::cpu());
  EXPECT_NE(testing::error_of([] { Profiler::start(Device::cpu()); }).find("already open"),
            std::string::npos);
  std::string other_thread;
  std::thread([&] { other_thread = testing::error_of([] { (void)Profiler::stop(); }); }).join();
  EXPECT_NE(other_thread.find("no session is open on this thread"), std::string::npos);
  EXPECT_TRUE(Profiler::stop().ops.empty());
  Profiler::start(Device::cpu());  // a new session after the last one stopped
  EXPECT_TRUE(Profiler::stop().ops.empty());
}

}  // namespace
}  // namespace mt::runtime
