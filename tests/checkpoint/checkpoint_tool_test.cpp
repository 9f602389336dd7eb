// The offline checkpoint views and the mt_checkpoint tool: inspect lists every tensor and verifies
// checksums (a flipped byte makes it fail, naming the file), consolidate writes whole tensors equal
// to the saved ones (optionally cast), and h5py reads the index's virtual datasets and the
// consolidated file to the same numbers without minititan code.
#include <gtest/gtest.h>

#include <fstream>

#include "checkpoint/consolidate.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/h5_file.h"
#include "checkpoint/h5_tensor.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"
#include "tests/testing/hdf5_corruption.h"
#include "tests/testing/python_env.h"
#include "tests/testing/run_command.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/trainer_fixtures.h"

#ifndef MT_CHECKPOINT_TOOL
#define MT_CHECKPOINT_TOOL ""
#endif

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::Tensor;

// A one-process checkpoint of three tensors (f32 matrix, bf16 vector, i64 scalar) plus values.
fs::path save_sample(const testing::ScratchDir& scratch) {
  auto world = parallel::MpiProcessGroup::world();
  CheckpointState state;
  state.tensors.push_back(whole("model.w", runtime::arange(0, 12, 1, {DType::F32}).reshape({3, 4})));
  state.tensors.push_back(whole("model.b", runtime::arange(0, 5, 0.5, {DType::BF16})));
  state.tensors.push_back(whole("optimizer.step", runtime::full({}, 7, {DType::I64})));
  state.values["step"] = int64_t(12);
  const fs::path dir = scratch / "step-12";
  save_checkpoint(dir, state, *world);
  return dir;
}

TEST(CheckpointTool, InspectListsTensorsAndVerifiesChecksums) {
  testing::ScratchDir scratch;
  const fs::path dir = save_sample(scratch);
  const CheckpointSummary s = inspect_checkpoint(dir);
  ASSERT_EQ(s.tensors.size(), 3u);
  EXPECT_EQ(s.tensors[0].fqn, "model.b");
  EXPECT_EQ(s.tensors[0].dtype, DType::BF16);
  EXPECT_EQ(s.tensors[1].shape, (runtime::Shape{3, 4}));
  EXPECT_EQ(s.total_bytes, 48 + 20 + 8);
  EXPECT_TRUE(s.checksum_errors.empty());
  if (std::string(MT_CHECKPOINT_TOOL).empty()) GTEST_SKIP() << "mt_checkpoint not built";
  testing::CommandResult r = testing::run_command(std::string(MT_CHECKPOINT_TOOL) + " inspect " +
                                                  scratch.path().string());  // latest step
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("model.w"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step = 12"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checksums: all 3 chunks verified"), std::string::npos) << r.output;

  testing::flip_dataset_byte(dir / "rank-00000.h5", "/tensors/model.w", 20);
  r = testing::run_command(std::string(MT_CHECKPOINT_TOOL) + " inspect " + dir.string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("1 of 3 chunks FAILED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank-00000.h5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.w"), std::string::npos) << r.output;
  EXPECT_THROW(consolidate_checkpoint(dir, scratch / "out.h5"), Error);
  EXPECT_FALSE(fs::exists(scratch / "out.h5"));
}

// Consolidating onto a path that exists is refused before any work (it used to fail at the end,
// leaving the whole OUT.tmp behind); a failed write leaves no OUT.tmp either.
TEST(CheckpointTool, ConsolidateOntoAnExistingPathWritesNothing) {
  testing::ScratchDir scratch;
  const fs::path dir = save_sample(scratch);
  fs::create_directories(scratch / "taken");
  EXPECT_NE(testing::error_of([&] { consolidate_checkpoint(dir, scratch / "taken"); })
                .find("already exists"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(scratch / "taken.tmp"));
  EXPECT_ANY_THROW(consolidate_checkpoint(dir, scratch / "no_such_folder" / "out.h5"));
  EXPECT_FALSE(fs::exists(scratch / "no_such_folder" / "out.h5.tmp"));
}

// import-hf into a bare relative folder name (no parent in the path) works: the save's final
// fsync of the parent folder used to get an empty path ("cannot open  to fsync it").
TEST(CheckpointTool, ImportHfIntoABareRelativeFolder) {
  if (std::string(MT_CHECKPOINT_TOOL).empty()) GTEST_SKIP() << "mt_checkpoint not built";
  testing::ScratchDir scratch;
  models::llama::ModelArgs args = testing::unusual_llama_args(300);
  args.n_layers = 1;
  testing::save_random_hf_llama(args, 3, scratch / "hf");
  const testing::CommandResult r = testing::run_command(
      "cd '" + scratch.path().string() + "' && " + MT_CHECKPOINT_TOOL + " import-hf hf out");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(scratch / "out" / kIndexFileName)) << r.output;
}

TEST(CheckpointTool, ConsolidateWritesWholeTensors) {
  testing::ScratchDir scratch;
  const fs::path dir = save_sample(scratch);
  consolidate_checkpoint(dir, scratch / "whole.h5", DType::BF16);
  h5::File f = open_file(scratch / "whole.h5");
  const Tensor w = read_tensor(f.get(), "/tensors/model.w");
  EXPECT_EQ(w.dtype(), DType::BF16);  // cast on request
  const Tensor want = runtime::arange(0, 12, 1, {DType::F32}).reshape({3, 4});
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(w.to(DType::F32).contiguous().data<float>()[i], want.data<float>()[i]);
  }
  EXPECT_EQ(read_tensor(f.get(), "/tensors/optimizer.step").item<int64_t>(), 7);  // not cast
  const Tensor b = read_whole_tensor(dir, "model.b");
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.to(DType::F32).data<float>()[9], 4.5f);
  EXPECT_THROW(read_whole_tensor(dir, "nope"), Error);
}

TEST(CheckpointTool, H5pyReadsVirtualDatasetsAndConsolidatedFile) {
  const auto python = testing::python_with("h5py");
  if (!python) GTEST_SKIP() << "no Python with h5py (apt-get install python3-h5py)";
  testing::ScratchDir scratch;
  const fs::path dir = save_sample(scratch);
  consolidate_checkpoint(dir, scratch / "whole.h5");
  const std::string script =
      "import h5py, numpy as np, sys\n"
      "idx = h5py.File(sys.argv[1] + '/index.h5', 'r')\n"
      "one = h5py.File(sys.argv[2], 'r')\n"
      "for name in ['model.w', 'model.b', 'optimizer.step']:\n"
      "    a = idx['tensors'][name][()]\n"
      "    b = one['tensors'][name][()]\n"
      "    assert np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)), name\n"
      "assert idx['tensors']['model.b'].attrs['dtype'] == 'bfloat16'\n"
      "assert abs(float(idx['tensors']['model.b'][9]) - 4.5) < 1e-6\n"
      "assert float(idx['tensors']['model.w'][2, 3]) == 11.0\n"
      "assert int(idx['state']['step'][()]) == 12\n"
      "print('h5py ok', list(idx['chunks']['fqn'].asstr()[()]))\n";
  const fs::path py = scratch / "check.py";
  std::ofstream(py) << script;
  const testing::CommandResult r = testing::run_command(*python + " " + py.string() + " " +
                                                        dir.string() + " " +
                                                        (scratch / "whole.h5").string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("h5py ok"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mt::checkpoint
