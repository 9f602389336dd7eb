#include "runtime/ops/sort.h"

#include "runtime/autograd/function.h"
#include "runtime/kernels/sort.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"

namespace mt::runtime {
namespace {

// The first k of x sorted along dim, with autograd on the values. A 0-D x counts as [1].
// k < 0 means the full sort; `differentiable` false skips the graph (argsort).
ValuesIndices sorted_prefix(const Tensor& x, int64_t dim, int64_t k, bool descending,
                            bool differentiable, const char* op) {
  MT_CHECK(x.defined(), op, ": expected a defined tensor");
  const Tensor xc = x.dim() == 0 ? x.detach().reshape({1}) : x.detach().contiguous();
  dim = wrap_dim(dim, xc.dim(), op);
  const int64_t n = xc.size(dim);
  if (k < 0) k = n;  // full sort
  MT_CHECK(k <= n, op, ": k = ", k, " must be in [0, ", n, "] (the size of dim ", dim, " of shape ",
           x.shape(), ")");
  Shape out_shape = xc.shape();
  out_shape[size_t(dim)] = k;
  Tensor values = empty(out_shape, x.options());
  Tensor indices = empty(out_shape, x.options().with_dtype(DType::I64));
  sort_kernel(x.device(), xc, dim, k, descending, values, indices);
  if (x.dim() == 0) {
    values = values.reshape({});
    indices = indices.reshape({});
  }
  if (differentiable && autograd::any_requires_grad({x})) {
    autograd::record(op, {x}, {values},
                     [si = autograd::SavedTensor(indices), dim, shape = x.shape()](
                         const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& g = args.grad(0);
                       if (shape.empty()) return {g};
                       return {scatter(zeros(shape, g.options()), dim, si.get(), g)};
                     });
  }
  return {values, indices};
}

}  // namespace

ValuesIndices sort(const Tensor& x, int64_t dim, bool descending, bool /*stable*/) {
  return sorted_prefix(x, dim, -1, descending, true, "sort");
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  return sorted_prefix(x, dim, -1, descending, false, "argsort").indices;
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool /*sorted*/) {
  MT_CHECK(k >= 0, "topk: k = ", k, " must be >= 0");
  return sorted_prefix(x, dim, k, largest, true, "topk");
}

}  // namespace mt::runtime
