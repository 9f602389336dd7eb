#include "runtime/ops/dropout.h"

#include "runtime/autograd/function.h"
#include "runtime/kernels/dropout.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {

Tensor dropout(const Tensor& x, double p, const RandomKey& key, bool training) {
  MT_CHECK(x.defined(), "dropout: x must be a defined tensor");
  MT_CHECK(p >= 0.0 && p < 1.0, "dropout: expected p in [0, 1), got ", p);
  MT_CHECK(x.is_floating_point(), "dropout: expected a floating tensor, got ", x.dtype(),
           " of shape ", x.shape());
  if (!training || p == 0.0) return x;
  const Tensor xc = x.detach().contiguous();
  Tensor out = empty(x.shape(), x.options());
  dropout_kernel(x.device(), xc, p, key, out);
  if (autograd::any_requires_grad({x})) {
    autograd::record(
        "dropout", {x}, {out},
        [p, key, dtype = x.dtype()](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
          const Tensor dy = args.grad(0).to(dtype).contiguous();
          Tensor dx = empty(dy.shape(), dy.options());
          dropout_kernel(dy.device(), dy, p, key, dx);
          return {dx};
        });
  }
  return out;
}

}  // namespace mt::runtime
