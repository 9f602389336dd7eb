// CheckpointManager's background saves (checkpoint/manager.h): each save holds the values of its
// step although training changes the tensors at once; with reuse_staging the staging buffers are
// allocated once and reused by every later save of the same layout, and reallocated when it
// changes.
#include "checkpoint/manager.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "checkpoint/state.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/allocator.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/tensor_testing.h"

namespace mt::checkpoint {
namespace {

using runtime::Device;
using runtime::Tensor;

CheckpointState state_of(const Tensor& a, const Tensor& b) {
  CheckpointState s;
  s.tensors = {whole("a", a), whole("b", b)};
  return s;
}

// Loads step `step` into tensors shaped as `like_a` and `like_b` and checks their values.
void expect_saved(CheckpointManager& m, int64_t step, const Tensor& a, const Tensor& b) {
  CheckpointState dest = state_of(runtime::zeros(a.shape()), runtime::zeros(b.shape()));
  m.load(step, dest);
  EXPECT_TRUE(testing::all_close(dest.tensors[0].local, a, 0, 0)) << "step " << step;
  EXPECT_TRUE(testing::all_close(dest.tensors[1].local, b, 0, 0)) << "step " << step;
}

int64_t host_bytes() { return runtime::memory_stats(Device::cpu()).bytes_in_use; }

TEST(CheckpointManager, BackgroundSavesHoldTheirStepsValuesAndReuseTheirBuffers) {
  std::shared_ptr<parallel::ProcessGroup> world(parallel::MpiProcessGroup::world());
  const int64_t snapshot = (256 * 64 + 1000) * 4;  // f32 a and b
  for (const bool reuse : {false, true}) {
    SCOPED_TRACE(reuse);
    testing::ScratchDir dir;
    const Tensor a = runtime::full({256, 64}, 1.0), b = runtime::full({1000}, 2.0);
    const Tensor a1 = a.clone(), b1 = b.clone();
    const Tensor a3 = runtime::full({8, 8}, 5.0);
    {
      CheckpointManager m({dir.path(), 0, true, reuse}, world);
      const int64_t base = host_bytes();
      m.save(1, state_of(a, b));
      a.fill_(3.0);  // the next step changes the weights while step 1 is written
      b.fill_(4.0);
      m.wait();
      // Plain async frees its snapshot once written; reuse keeps its buffers.
      EXPECT_EQ(host_bytes() - base, reuse ? snapshot : 0);
      m.save(2, state_of(a, b));
      m.wait();
      EXPECT_EQ(host_bytes() - base, reuse ? snapshot : 0);  // the same buffers again
      // Another layout: new buffers in place of the old.
      m.save(3, state_of(a3, b));
      m.wait();
      EXPECT_EQ(host_bytes() - base, reuse ? (64 + 1000) * 4 : 0);
      expect_saved(m, 1, a1, b1);
      expect_saved(m, 2, a, b);
      expect_saved(m, 3, a3, b);
    }
  }
}

TEST(CheckpointManager, ReusingStagingNeedsAsyncSaves) {
  testing::ScratchDir dir;
  std::shared_ptr<parallel::ProcessGroup> world(parallel::MpiProcessGroup::world());
  const std::string m =
      testing::error_of([&] { CheckpointManager({dir.path(), 0, false, true}, world); });
  EXPECT_NE(m.find("reuse_staging needs async saves"), std::string::npos) << m;
}

}  // namespace
}  // namespace mt::checkpoint
