// CheckpointManager's async saves of GPU tensors (checkpoint/manager.h), with fresh staging
// buffers and with reused page-locked ones (async_with_pinned_mem): each save holds its step's
// values although the tensors change on the GPU right after save() returns. Skips without a GPU.
#include <gtest/gtest.h>

#include <memory>

#include "checkpoint/manager.h"
#include "checkpoint/state.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"
#include "tests/testing/gpu.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/tensor_testing.h"

namespace mt::checkpoint {
namespace {

using runtime::Tensor;

TEST(CheckpointManagerGpu, AsyncSavesOfGpuTensorsHoldTheirSteps) {
  MT_REQUIRE_CUDA();
  const runtime::Device gpu = runtime::Device::cuda(0);
  std::shared_ptr<parallel::ProcessGroup> world(parallel::MpiProcessGroup::world());
  for (const bool reuse : {false, true}) {
    SCOPED_TRACE(reuse);
    testing::ScratchDir dir;
    CheckpointManager m({dir.path(), 0, true, reuse}, world);
    const Tensor host = testing::randn64({300, 70}, 1, false).to(runtime::DType::F32);
    const Tensor weights = host.to(gpu);
    std::vector<Tensor> expected;
    for (int64_t step = 1; step <= 3; ++step) {
      CheckpointState s;
      s.tensors = {whole("w", weights)};
      m.save(step, s);
      expected.push_back(weights.to(runtime::Device::cpu()));
      weights.fill_(double(step));  // queued on the GPU while the step is written
    }
    m.wait();
    for (int64_t step = 1; step <= 3; ++step) {
      CheckpointState dest;
      dest.tensors = {whole("w", runtime::zeros({300, 70}))};
      m.load(step, dest);
      EXPECT_TRUE(testing::all_close(dest.tensors[0].local, expected[size_t(step - 1)], 0, 0))
          << "step " << step;
    }
  }
}

}  // namespace
}  // namespace mt::checkpoint
