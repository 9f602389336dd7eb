// Reductions: dim validation, output allocation, kernel calls (runtime/kernels/reduce.h) and
// backward formulas written with runtime ops.
#include "runtime/ops/reduce.h"

#include <algorithm>

#include "runtime/autograd/function.h"
#include "runtime/kernels/reduce.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {

namespace {

using autograd::BackwardArgs;
using autograd::SavedTensor;

// Wrapped, sorted, unique dims; an empty list means every dim.
std::vector<int64_t> normalize_dims(const char* op, const Tensor& x,
                                    const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, x.dim(), op);
    if (x.dim() > 0) out.push_back(w);  // a 0-D tensor has nothing to reduce
  }
  std::sort(out.begin(), out.end());
  MT_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op, ": a dim appears twice in ",
           Shape(dims), " for a tensor of shape ", x.shape());
  return out;
}

// x's shape with the reduced dims set to 1 (keepdim) or removed.
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    const bool reduced = std::binary_search(dims.begin(), dims.end(), d);
    if (!reduced)
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

// Sum (or mean) over normalized dims.
Tensor sum_impl(const char* op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
                bool mean) {
  if (mean)
    MT_CHECK(x.is_floating_point(), op, ": expected a floating dtype (f32, f64, bf16, f16), got ",
             x.dtype(), " (shape ", x.shape(), ")");
  const DType out_dtype = x.is_floating_point() ? x.dtype() : DType::I64;
  const int64_t count = reduced_count(x.shape(), dims);
  Tensor out = Tensor::empty(reduced_shape(x.shape(), dims, keepdim), {out_dtype, x.device()});
  sum_kernel(x.device(), x, dims, mean ? double(count) : 1.0, out);
  if (autograd::any_requires_grad({x})) {
    autograd::record(op, {x}, {out},
                     [x_shape = x.shape(), dims, keepdim, mean,
                      count](const BackwardArgs& args) -> std::vector<Tensor> {
                       Tensor g = args.grad(0);
                       if (!keepdim) g = g.reshape(reduced_shape(x_shape, dims, true));
                       if (mean) g = div(g, double(count));
                       return {g.expand(x_shape)};
                     });
  }
  return out;
}

// Max over normalized dims; records the backward that sends the gradient to the first maximum.
ValuesIndices max_impl(const char* op, const Tensor& x, const std::vector<int64_t>& dims,
                       bool keepdim) {
  for (int64_t d : dims)
    MT_CHECK(x.size(d) > 0, op, ": cannot reduce over dim ", d, " of size 0 (shape ", x.shape(),
             ")");
  const Shape shape = reduced_shape(x.shape(), dims, keepdim);
  ValuesIndices r{Tensor::empty(shape, {x.dtype(), x.device()}),
                  Tensor::empty(shape, {DType::I64, x.device()})};
  max_kernel(x.device(), x, dims, r.values, r.indices);
  if (autograd::any_requires_grad({x})) {
    autograd::record(op, {x}, {r.values},
                     [x_shape = x.shape(), dims, keepdim, si = SavedTensor(r.indices)](
                         const BackwardArgs& args) -> std::vector<Tensor> {
                       Tensor g = args.grad(0);
                       Tensor idx = si.get();
                       const Shape kshape = reduced_shape(x_shape, dims, true);
                       if (!keepdim) g = g.reshape(kshape), idx = idx.reshape(kshape);
                       // pos holds each element's row-major index within the reduced dims.
                       Shape rshape(x_shape.size(), 1);
                       for (int64_t d : dims) rshape[d] = x_shape[d];
                       const Tensor pos =
                           arange(reduced_count(x_shape, dims),
                                  TensorOptions{}.with_dtype(DType::I64).with_device(g.device()))
                               .reshape(rshape);
                       return {where(eq(pos, idx), g, scalar_tensor(0.0, g.options()))};
                     });
  }
  return r;
}

}  // namespace

Tensor sum(const Tensor& x) {
  return sum_impl("sum", x, normalize_dims("sum", x, {}), false, false);
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_impl("sum", x, normalize_dims("sum", x, dims), keepdim, false);
}

Tensor mean(const Tensor& x) {
  return sum_impl("mean", x, normalize_dims("mean", x, {}), false, true);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_impl("mean", x, normalize_dims("mean", x, dims), keepdim, true);
}

Tensor max(const Tensor& x) {
  MT_CHECK(x.numel() > 0, "max: expected a non-empty tensor, got shape ", x.shape());
  return max_impl("max", x, normalize_dims("max", x, {}), false).values;
}

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  return max_impl("max", x, normalize_dims("max", x, {dim}), keepdim);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  const std::vector<int64_t> dims = normalize_dims("argmax", x, {dim});
  for (int64_t d : dims)
    MT_CHECK(x.size(d) > 0, "argmax: cannot reduce over dim ", d, " of size 0 (shape ", x.shape(),
             ")");
  Tensor indices = Tensor::empty(reduced_shape(x.shape(), dims, keepdim), {DType::I64, x.device()});
  max_kernel(x.device(), x, dims, Tensor(), indices);
  return indices;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  const std::vector<int64_t> dims = normalize_dims("amax", x, dims_in);
  for (int64_t d : dims)
    MT_CHECK(x.size(d) > 0, "amax: cannot reduce over dim ", d, " of size 0 (shape ", x.shape(),
             ")");
  Tensor values = Tensor::empty(reduced_shape(x.shape(), dims, keepdim), {x.dtype(), x.device()});
  max_kernel(x.device(), x, dims, values, Tensor());
  if (autograd::any_requires_grad({x})) {
    // The gradient is shared evenly among tied maxima (as PyTorch's amax does).
    autograd::record("amax", {x}, {values},
                     [dims, keepdim, sx = SavedTensor(x),
                      sv = SavedTensor(values)](const BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& x = sx.get();
                       const Shape kshape = reduced_shape(x.shape(), dims, true);
                       Tensor g = args.grad(0), v = sv.get();
                       if (!keepdim) g = g.reshape(kshape), v = v.reshape(kshape);
                       const Tensor one = scalar_tensor(1.0, g.options());
                       const Tensor zero = scalar_tensor(0.0, g.options());
                       const Tensor hits = where(eq(x, v), one, zero);
                       return {mul(hits, div(g, sum(hits, dims, true)))};
                     });
  }
  return values;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - int64_t(shape.size());
  bool ok = lead >= 0;
  std::vector<int64_t> dims;
  for (int64_t d = 0; ok && d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] != x.size(d)) {
      ok = shape[d - lead] == 1;
      dims.push_back(d);
    }
  }
  MT_CHECK(ok, "sum_to: cannot sum a tensor of shape ", x.shape(), " to shape ", shape,
           " (the target must broadcast to the tensor's shape)");
  const Tensor summed = dims.empty() ? x : sum_impl("sum", x, dims, true, false);
  return summed.reshape(shape);
}

}  // namespace mt::runtime
