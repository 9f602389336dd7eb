#include "runtime/ops/rms_norm.h"

#include <cmath>

#include "runtime/autograd/function.h"
#include "runtime/kernels/rms_norm.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8_amax_notes.h"

namespace mt::runtime {

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  MT_CHECK(x.defined() && weight.defined(), "rms_norm: x and weight must be defined tensors");
  MT_CHECK(x.dim() >= 1, "rms_norm: expected x of shape [..., D], got shape ", x.shape());
  const int64_t d = x.shape().back();
  MT_CHECK(d > 0, "rms_norm: expected a non-empty last dim, got shape ", x.shape());
  MT_CHECK(weight.dim() == 1 && weight.shape()[0] == d, "rms_norm: expected weight of shape [", d,
           "] (the last dim of x ", x.shape(), "), got shape ", weight.shape());
  MT_CHECK(x.is_floating_point() && x.dtype() == weight.dtype(),
           "rms_norm: expected x and weight of the same floating dtype, got ", x.dtype(), " and ",
           weight.dtype());
  MT_CHECK(x.device() == weight.device(), "rms_norm: x is on ", x.device(), " but weight on ",
           weight.device());
  MT_CHECK(std::isfinite(eps) && eps >= 0, "rms_norm: expected eps >= 0, got ", eps);

  const Tensor xc = x.detach().contiguous();
  const Tensor wc = weight.detach().contiguous();
  Tensor y = empty(x.shape(), x.options());
  const DType stat = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor rstd = empty({x.numel() / d}, x.options().with_dtype(stat));
  Tensor y_amax = float8_amax_slot(y);  // undefined unless float8 casts may want it
  rms_norm_forward_kernel(x.device(), xc, wc, eps, y, rstd, y_amax);

  if (autograd::any_requires_grad({x, weight})) {
    autograd::record("rms_norm", {x, weight}, {y},
                     [sx = autograd::SavedTensor(xc), sw = autograd::SavedTensor(wc),
                      sr = autograd::SavedTensor(rstd)](
                         const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& xs = sx.get();
                       const Tensor& ws = sw.get();
                       Tensor dx = args.needs(0) ? empty(xs.shape(), xs.options()) : Tensor();
                       Tensor dw = args.needs(1) ? empty(ws.shape(), ws.options()) : Tensor();
                       const Tensor dy = args.grad(0).to(xs.dtype()).contiguous();
                       rms_norm_backward_kernel(xs.device(), dy, xs, ws, sr.get(), dx, dw);
                       return {dx, dw};
                     });
  }
  return y;
}

}  // namespace mt::runtime
