#include "runtime/ops/loss.h"

#include "runtime/autograd/function.h"
#include "runtime/kernels/loss.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/float8_amax_notes.h"
#include "runtime/ops/reduce.h"

namespace mt::runtime {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     Reduction reduction, std::optional<DType> out_dtype) {
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
  const DType acc = accumulation_dtype(logits.dtype());
  const TensorOptions acc_options = logits.options().with_dtype(acc);
  const DType result = out_dtype.value_or(logits.dtype());
  MT_CHECK(is_floating(result), "cross_entropy: expected a floating out_dtype, got ",
           dtype_name(result));

  const Tensor x = logits.detach().reshape({N, V}).contiguous();
  const Tensor t = targets.reshape({N}).contiguous();
  Tensor losses = Tensor::empty({N}, acc_options);
  Tensor lse = Tensor::empty({N}, acc_options);
  // A bad target fails here on the CPU, and at the next host wait on a device.
  cross_entropy_forward_kernel(
      logits.device(), x, t, ignore_index,
      [lead, V, ignore_index](int64_t position, int64_t target) {
        return detail::concat("cross_entropy: target ", target, " at position ",
                              unravel_index(position, lead), " is outside [0, ", V,
                              ") and is not ignore_index (", ignore_index, ")");
      },
      losses, lse);

  Tensor out;
  Tensor mean_divisor;  // Mean: the count of valid targets (at least 1), kept on the device
  switch (reduction) {
    case Reduction::None:
      out = losses.reshape(targets.shape()).to(result);
      break;
    case Reduction::Sum:
      out = sum(losses).to(result);
      break;
    case Reduction::Mean:
      // No valid target: the sum is 0 and so is the mean (not 0/0).
      mean_divisor =
          clamp(sum(ne(t, double(ignore_index)).to(DType::I64)).to(acc), 1.0, std::nullopt);
      out = div(sum(losses), mean_divisor).to(result);
      break;
  }
  if (autograd::any_requires_grad({logits})) {
    autograd::record(
        "cross_entropy", {logits}, {out},
        [sx = autograd::SavedTensor(x), st = autograd::SavedTensor(t),
         slse = autograd::SavedTensor(lse), shape = logits.shape(), mean_divisor, ignore_index,
         N](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
          const Tensor& x = sx.get();
          const Tensor& lse = slse.get();
          Tensor g = args.grad(0).to(lse.dtype()).reshape({-1});
          if (mean_divisor.defined()) g = div(g, mean_divisor);
          g = g.contiguous();
          MT_CHECK(g.numel() == 1 || g.numel() == N, "cross_entropy backward: gradient of ",
                   g.numel(), " elements for ", N, " targets");
          Tensor gx = Tensor::empty(x.shape(), x.options());
          Tensor gx_amax = float8_amax_slot(gx);  // for a float8 output projection
          cross_entropy_backward_kernel(x.device(), x, st.get(), lse, g, ignore_index, gx,
                                        gx_amax);
          return {gx.reshape(shape)};
        });
  }
  return out;
}

}  // namespace mt::runtime
