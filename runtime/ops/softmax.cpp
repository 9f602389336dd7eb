#include "runtime/ops/softmax.h"

#include "runtime/autograd/function.h"
#include "runtime/kernels/softmax.h"

namespace mt::runtime {
namespace {

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  MT_CHECK(is_floating(x.dtype()), op, ": expected a floating tensor (f32, f64, bf16, f16), got ",
           dtype_name(x.dtype()), " of shape ", x.shape());
  if (x.dim() == 0) {  // a 0-D tensor is one row of one element
    wrap_dim(dim, 1, op);
    return softmax_impl(x.unsqueeze(0), 0, log).squeeze(0);
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const Tensor xc = x.detach().contiguous();
  Tensor out = Tensor::empty(x.shape(), x.options());
  softmax_forward_kernel(x.device(), xc, d, log, out);
  if (autograd::any_requires_grad({x})) {
    autograd::record(op, {x}, {out},
                     [saved = autograd::SavedTensor(out), d,
                      log](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& y = saved.get();
                       const Tensor g = args.grad(0).to(y.dtype()).contiguous();
                       Tensor gi = Tensor::empty(y.shape(), y.options());
                       softmax_backward_kernel(y.device(), y, g, d, log, gi);
                       return {gi};
                     });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }

Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

}  // namespace mt::runtime
