// Kernel replay (runtime/core/kernel_replay.h): kernels recorded in a with_tensors profile re-run
// by name from their recorded arguments give bit for bit the outputs the step computed (given the
// same input values): rms_norm (a double), sum (a list of dims), cross_entropy (an integer and an
// error-message callback), AdamW's multi-tensor step (its operand lists); codes that do not fit
// the kernel's signature are errors naming the argument.
#include "runtime/core/kernel_replay.h"

#include <gtest/gtest.h>

#include <map>

#include "runtime/core/profiler.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/rms_norm.h"
#include "runtime/optim/adamw.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::randn_as;

// Runs fn in a with_tensors profile and returns its top-level kernels.
template <class Fn>
std::vector<ProfiledOp> record(Fn fn) {
  Profiler::start(Device::cpu(), /*with_tensors=*/true);
  try {
    fn();
  } catch (...) {
    Profiler::stop();
    throw;
  }
  std::vector<ProfiledOp> ops;
  for (ProfiledOp& op : Profiler::stop().ops)
    if (op.depth == 0) ops.push_back(std::move(op));
  return ops;
}

// Replays `op` with the tensors the step used as inputs (by storage id: `inputs`), fresh outputs
// of the recorded shapes, and returns the outputs.
std::vector<Tensor> replay(const ProfiledOp& op, const std::map<uint64_t, Tensor>& inputs) {
  const KernelReplayer* replayer = find_kernel_replayer(op.name);
  EXPECT_NE(replayer, nullptr) << op.name;
  if (replayer == nullptr) return {};
  KernelCall call;
  call.device = Device::cpu();
  call.args = op.args;
  for (const TensorMeta& m : op.inputs) call.inputs.push_back(inputs.at(m.storage));
  for (const TensorMeta& m : op.outputs)
    call.outputs.push_back(empty(m.shape, TensorOptions{}.with_dtype(dtype_from_name(m.dtype))));
  (*replayer)(call);
  return call.outputs;
}

void expect_bitwise(const Tensor& got, const Tensor& want) {
  EXPECT_TRUE(testing::all_close(got, want, 0, 0));
}

TEST(KernelReplay, RmsNormAndSumReRunBitwise) {
  const Tensor x = randn_as({6, 16}, DType::F32, 1), w = randn_as({16}, DType::F32, 2);
  Tensor y, s;
  const auto ops = record([&] {
    y = rms_norm(x, w, 1e-3);
    s = sum(y, {1});
  });
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(std::string(ops[0].name), "rms_norm");
  // x, weight, eps, y, rstd, and the float8 amax slot: undefined outside a Float8AmaxNotes scope.
  const std::vector<std::string> rms_args = {"T", "T", "f0.001", "T", "T", "T-"};
  EXPECT_EQ(ops[0].args, rms_args);
  EXPECT_EQ(std::string(ops[1].name), "sum");
  EXPECT_EQ(ops[1].args[1], "L1");
  const std::map<uint64_t, Tensor> inputs = {
      {x.storage()->id(), x}, {w.storage()->id(), w}, {y.storage()->id(), y}};
  const std::vector<Tensor> norm = replay(ops[0], inputs);
  ASSERT_EQ(norm.size(), 2u);  // y, rstd
  expect_bitwise(norm[0], y);
  // sum writes into the `const Tensor& out` it is given: an input of the record.
  Tensor out = zeros({6});
  std::map<uint64_t, Tensor> sum_inputs = inputs;
  sum_inputs[ops[1].inputs.back().storage] = out;
  replay(ops[1], sum_inputs);
  expect_bitwise(out, s);
}

TEST(KernelReplay, CrossEntropyTakesItsIgnoreIndexAndCallback) {
  const Tensor logits = randn_as({5, 7}, DType::F32, 3);
  const Tensor targets =
      from_vector<int64_t>({1, 6, 3, 3, 0}, {5}, TensorOptions{}.with_dtype(DType::I64));
  Tensor loss;
  const auto ops = record([&] { loss = cross_entropy(logits, targets, 3); });
  const ProfiledOp* ce = nullptr;
  for (const ProfiledOp& op : ops)
    if (std::string(op.name) == "cross_entropy") ce = &op;
  ASSERT_NE(ce, nullptr);
  EXPECT_EQ(ce->args[2], "i3");  // ignore_index
  EXPECT_EQ(ce->args[3], "F");   // the bad-target message
  const std::vector<Tensor> out =
      replay(*ce, {{logits.storage()->id(), logits}, {targets.storage()->id(), targets}});
  ASSERT_EQ(out.size(), 2u);                      // per-row losses, lse
  EXPECT_EQ(out[0].to_vector<double>()[2], 0.0);  // rows 2 and 3 are ignored
  EXPECT_NEAR(sum(out[0]).item<double>() / 3.0, loss.item<double>(), 1e-6);
}

TEST(KernelReplay, AdamWMultiTensorStepReRunsOnItsOperands) {
  Tensor p = randn_as({33}, DType::F32, 4).set_requires_grad(true);
  p.set_grad(randn_as({33}, DType::F32, 5));
  optim::AdamW opt(std::vector<Tensor>{p}, optim::AdamWOptions{0.01});
  const Tensor before = p.detach().clone();
  const auto ops = record([&] { opt.step(); });
  const ProfiledOp* step = nullptr;
  for (const ProfiledOp& op : ops)
    if (std::string(op.name) == "adamw_multi_tensor_step") step = &op;
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->args[0], "A1");      // one parameter, at step 1
  ASSERT_EQ(step->inputs.size(), 4u);  // param, grad, exp_avg, exp_avg_sq
  EXPECT_EQ(step->args.back(), "T-");  // no grad_scale
  // The same step again from the values before it: the same parameter bits.
  const Tensor param = before.clone();
  std::map<uint64_t, Tensor> inputs;
  inputs[step->inputs[0].storage] = param;
  inputs[step->inputs[1].storage] = p.grad();
  inputs[step->inputs[2].storage] = zeros({33});
  inputs[step->inputs[3].storage] = zeros({33});
  replay(*step, inputs);
  expect_bitwise(param, p.detach());
}

TEST(KernelReplay, CodesThatDoNotFitAreErrors) {
  const KernelReplayer* replayer = find_kernel_replayer("rms_norm");
  ASSERT_NE(replayer, nullptr);
  KernelCall call;
  call.device = Device::cpu();
  call.inputs = {zeros({2, 4}), zeros({4})};
  call.outputs = {zeros({2, 4}), zeros({2})};
  call.args = {"T", "T", "i3", "T", "T"};  // eps recorded as an integer
  try {
    (*replayer)(call);
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 3 was recorded as 'i3'"), std::string::npos)
        << e.what();
  }
  call.args = {"T", "T", "f0.1", "T"};  // one argument short
  EXPECT_THROW((*replayer)(call), Error);
  call.args = {"T", "T", "f0.1", "T", "T"};
  call.outputs.pop_back();  // one output short
  EXPECT_THROW((*replayer)(call), Error);
  EXPECT_EQ(find_kernel_replayer("no_such_kernel"), nullptr);
}

}  // namespace
}  // namespace mt::runtime
