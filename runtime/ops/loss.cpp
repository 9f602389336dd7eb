#include "runtime/ops/loss.h"

#include "runtime/autograd/function.h"
#include "runtime/kernels/loss.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"

namespace mt::runtime {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     Reduction reduction) {
  MT_CHECK(is_floating(logits.dtype()) && logits.dim() >= 1,
           "cross_entropy: expected floating logits [..., V], got ", dtype_name(logits.dtype()),
           " of shape ", logits.shape());
  MT_CHECK(targets.dtype() == DType::I64 || targets.dtype() == DType::I32,
           "cross_entropy: expected i64 or i32 targets, got ", dtype_name(targets.dtype()));
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  MT_CHECK(targets.shape() == lead, "cross_entropy: targets of shape ", targets.shape(),
           " do not match logits of shape ", logits.shape(), " (expected targets ", lead, ")");
  MT_CHECK(logits.device() == targets.device(), "cross_entropy: logits on ", logits.device(),
           " but targets on ", targets.device());
  const int64_t N = numel_of(lead), V = logits.size(-1);
  const DType acc = logits.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const TensorOptions acc_options = logits.options().with_dtype(acc);

  const Tensor x = logits.detach().reshape({N, V}).contiguous();
  const Tensor t = targets.reshape({N}).contiguous();
  Tensor losses = Tensor::empty({N}, acc_options);
  Tensor lse = Tensor::empty({N}, acc_options);
  const CrossEntropyForwardStatus status =
      cross_entropy_forward_kernel(logits.device(), x, t, ignore_index, losses, lse);
  if (status.bad_position >= 0) {
    Shape pos(lead.size());
    for (int64_t i = int64_t(lead.size()) - 1, rem = status.bad_position; i >= 0; --i) {
      pos[i] = rem % lead[i];
      rem /= lead[i];
    }
    MT_FAIL("cross_entropy: target ", t.select(0, status.bad_position).item<int64_t>(),
            " at position ", pos, " is outside [0, ", V, ") and is not ignore_index (",
            ignore_index, ")");
  }

  Tensor out;
  double scale = 1.0;
  switch (reduction) {
    case Reduction::None:
      out = losses.reshape(targets.shape()).to(logits.dtype());
      break;
    case Reduction::Sum:
      out = sum(losses).to(logits.dtype());
      break;
    case Reduction::Mean:
      // No valid target: the sum is 0 and so is the mean (not 0/0).
      scale = status.count > 0 ? 1.0 / double(status.count) : 0.0;
      out = mul(sum(losses), scale).to(logits.dtype());
      break;
  }
  if (autograd::any_requires_grad({logits})) {
    autograd::record(
        "cross_entropy", {logits}, {out},
        [sx = autograd::SavedTensor(x), st = autograd::SavedTensor(t),
         slse = autograd::SavedTensor(lse), shape = logits.shape(), scale, ignore_index,
         N](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
          const Tensor& x = sx.get();
          const Tensor& lse = slse.get();
          const Tensor g = args.grad(0).to(lse.dtype()).reshape({-1}).contiguous();
          MT_CHECK(g.numel() == 1 || g.numel() == N, "cross_entropy backward: gradient of ",
                   g.numel(), " elements for ", N, " targets");
          Tensor gx = Tensor::empty(x.shape(), x.options());
          cross_entropy_backward_kernel(x.device(), x, st.get(), lse, g, scale, ignore_index, gx);
          return {gx.reshape(shape)};
        });
  }
  return out;
}

}  // namespace mt::runtime
