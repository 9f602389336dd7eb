#include "runtime/ops/index.h"

#include <cmath>

#include "runtime/autograd/function.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/index.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {
namespace {

void check_index(const Tensor& x, const Tensor& index, const char* op) {
  MT_CHECK(x.defined() && index.defined(), op, ": expected defined tensors");
  MT_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, op,
           ": expected an i64 or i32 index, got ", index.dtype());
  MT_CHECK(x.device() == index.device(), op, ": x is on ", x.device(), " but index on ",
           index.device());
}

void check_values(const Tensor& x, const Tensor& src, const char* what, const char* op) {
  MT_CHECK(src.defined(), op, ": expected a defined ", what);
  MT_CHECK(src.dtype() == x.dtype(), op, ": expected ", what, " of x's dtype ", x.dtype(), ", got ",
           src.dtype());
  MT_CHECK(src.device() == x.device(), op, ": x is on ", x.device(), " but ", what, " on ",
           src.device());
}

// Fails when an element of `index` (contiguous) lies outside [0, size): at once on the CPU, at
// the next host wait on a device (runtime/core/deferred_errors.h).
void check_range(const Tensor& index, int64_t size, int64_t dim, const char* op) {
  auto message = [op = std::string(op), size, dim](int64_t pos, int64_t bad) {
    return detail::concat(op, ": index ", bad, " (at position ", pos, " of the index) is out of ",
                          "range for dim ", dim, " of size ", size);
  };
  index_bounds_kernel(index.device(), index, size, message);
}

// A 1-D contiguous view of the index of index_select / index_add (a 0-D index counts as [1]).
Tensor index_1d(const Tensor& index, const char* op) {
  MT_CHECK(index.dim() <= 1, op, ": expected a 1-D index, got shape ", index.shape());
  return index.detach().contiguous().reshape({index.numel()});
}

// Shape checks shared by index_add, index_add_ and index_copy_ (`adds`: bool is rejected);
// returns the wrapped dim.
int64_t check_index_rows(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                         bool adds, const char* op) {
  check_index(x, index, op);
  check_values(x, source, "source", op);
  MT_CHECK(!adds || x.dtype() != DType::Bool, op, ": bool tensors cannot be added");
  MT_CHECK(x.dim() >= 1, op, ": expected x with at least one dim, got shape ", x.shape());
  dim = wrap_dim(dim, x.dim(), op);
  Shape expected = x.shape();
  expected[size_t(dim)] = index.numel();
  MT_CHECK(source.shape() == expected, op, ": expected source of shape ", expected, " (x ",
           x.shape(), " with dim ", dim, " of the index's size ", index.numel(), "), got ",
           source.shape());
  return dim;
}

// Shape checks shared by gather, scatter and scatter_add (src undefined for gather); returns
// the wrapped dim.
int64_t check_gather_scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor* src,
                             const char* op) {
  check_index(x, index, op);
  MT_CHECK(x.dim() >= 1, op, ": expected x with at least one dim, got shape ", x.shape());
  dim = wrap_dim(dim, x.dim(), op);
  MT_CHECK(index.dim() == x.dim(), op, ": expected an index with x's ", x.dim(),
           " dims, got index shape ", index.shape(), " for x shape ", x.shape());
  for (int64_t d = 0; d < x.dim(); ++d) {
    MT_CHECK(d == dim || index.size(d) <= x.size(d), op, ": index shape ", index.shape(),
             " exceeds x shape ", x.shape(), " at dim ", d, " (only dim ", dim, " may differ)");
  }
  if (src) {
    check_values(x, *src, "src", op);
    MT_CHECK(src->dim() == x.dim(), op, ": expected src with x's ", x.dim(), " dims, got shape ",
             src->shape());
    for (int64_t d = 0; d < x.dim(); ++d) {
      MT_CHECK(index.size(d) <= src->size(d), op, ": index shape ", index.shape(),
               " exceeds src shape ", src->shape(), " at dim ", d);
    }
  }
  return dim;
}

// A fresh contiguous copy of x (no autograd history).
Tensor copy_of(const Tensor& x) {
  Tensor out = empty(x.shape(), x.options());
  out.copy_(x.detach());
  return out;
}

// gather without checks (index already validated): used by forward and backward code.
Tensor gather_unchecked(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = empty(index.shape(), x.options());
  gather_kernel(x.device(), x.detach(), dim, index, out);
  return out;
}

// `t` placed at the origin of zeros of `shape` (t's extent is <= shape in every dim).
Tensor zero_pad_to(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  Tensor out = zeros(shape, t.options());
  Tensor region = out;
  for (int64_t d = 0; d < t.dim(); ++d) region = region.narrow(d, 0, t.size(d));
  region.copy_(t);
  return out;
}

// Out-of-place scatter / scatter_add with autograd.
Tensor scatter_op(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                  bool accumulate, const char* op) {
  dim = check_gather_scatter(x, dim, index, &src, op);
  MT_CHECK(!accumulate || x.dtype() != DType::Bool, op, ": bool tensors cannot be added");
  const Tensor idx = index.detach().contiguous();
  check_range(idx, x.size(dim), dim, op);
  Tensor out = copy_of(x);
  scatter_kernel(x.device(), out, dim, idx, src.detach(), accumulate);
  if (autograd::any_requires_grad({x, src})) {
    autograd::record(op, {x, src}, {out},
                     [si = autograd::SavedTensor(idx), dim, accumulate, src_shape = src.shape()](
                         const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& g = args.grad(0);
                       const Tensor& index = si.get();
                       Tensor gx, gsrc;
                       if (args.needs(0)) {
                         if (accumulate) {
                           gx = g;
                         } else {  // overwritten elements of x do not reach the output
                           gx = copy_of(g);
                           Tensor zero = zeros(index.shape(), g.options());
                           scatter_kernel(g.device(), gx, dim, index, zero, false);
                         }
                       }
                       if (args.needs(1))
                         gsrc = zero_pad_to(gather_unchecked(g, dim, index), src_shape);
                       return {gx, gsrc};
                     });
  }
  return out;
}

// kernel(target) on a contiguous tensor holding self's values: self itself (its version bumped),
// or a copy written back into a self of any layout.
template <class Kernel>
void update_in_place(const Tensor& self, Kernel&& kernel) {
  if (self.is_contiguous()) {
    Tensor target = self.detach();
    kernel(target);
    self.bump_version();
  } else {
    Tensor target = copy_of(self);
    kernel(target);
    self.copy_(target);
  }
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  constexpr const char* op = "index_select";
  check_index(x, index, op);
  MT_CHECK(x.dim() >= 1, op, ": expected x with at least one dim, got shape ", x.shape());
  dim = wrap_dim(dim, x.dim(), op);
  const Tensor idx = index_1d(index, op);
  check_range(idx, x.size(dim), dim, op);
  Shape out_shape = x.shape();
  out_shape[size_t(dim)] = idx.numel();
  Tensor out = empty(out_shape, x.options());
  index_select_kernel(x.device(), x.detach().contiguous(), dim, idx, out);
  if (autograd::any_requires_grad({x})) {
    autograd::record(op, {x}, {out},
                     [si = autograd::SavedTensor(idx), dim, shape = x.shape()](
                         const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& g = args.grad(0);
                       Tensor gx = zeros(shape, g.options());
                       index_add_kernel(g.device(), gx, dim, si.get(), g.contiguous(), 1.0);
                       return {gx};
                     });
  }
  return out;
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                 double alpha) {
  constexpr const char* op = "index_add";
  dim = check_index_rows(x, dim, index, source, /*adds=*/true, op);
  MT_CHECK(x.is_floating_point() || alpha == std::trunc(alpha), op,
           ": alpha must be a whole number for ", x.dtype(), " tensors, got ", alpha);
  const Tensor idx = index_1d(index, op);
  check_range(idx, x.size(dim), dim, op);
  Tensor out = copy_of(x);
  index_add_kernel(x.device(), out, dim, idx, source.detach().contiguous(), alpha);
  if (autograd::any_requires_grad({x, source})) {
    autograd::record(op, {x, source}, {out},
                     [si = autograd::SavedTensor(idx), dim,
                      alpha](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& g = args.grad(0);
                       Tensor gs;
                       if (args.needs(1)) {
                         gs = index_select(g, dim, si.get());
                         if (alpha != 1.0) gs = mul(gs, alpha);
                       }
                       return {args.needs(0) ? g : Tensor(), gs};
                     });
  }
  return out;
}

const Tensor& index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                         double alpha) {
  constexpr const char* op = "index_add_";
  dim = check_index_rows(self, dim, index, source, /*adds=*/true, op);
  MT_CHECK(!(GradMode::enabled() && self.requires_grad()), op,
           ": in-place update of a tensor that requires grad (use index_add, or no_grad)");
  MT_CHECK(self.is_floating_point() || alpha == std::trunc(alpha), op,
           ": alpha must be a whole number for ", self.dtype(), " tensors, got ", alpha);
  const Tensor idx = index_1d(index, op);
  check_range(idx, self.size(dim), dim, op);
  Tensor src = source.detach().contiguous();
  if (src.shares_storage_with(self)) src = copy_of(src);  // source aliasing self
  update_in_place(self, [&](Tensor& target) {
    index_add_kernel(self.device(), target, dim, idx, src, alpha);
  });
  return self;
}

const Tensor& index_copy_(const Tensor& self, int64_t dim, const Tensor& index,
                          const Tensor& source) {
  constexpr const char* op = "index_copy_";
  dim = check_index_rows(self, dim, index, source, /*adds=*/false, op);
  MT_CHECK(!(GradMode::enabled() && self.requires_grad()), op,
           ": in-place update of a tensor that requires grad (use no_grad)");
  const Tensor idx = index_1d(index, op);
  check_range(idx, self.size(dim), dim, op);
  Tensor src = source.detach().contiguous();
  if (src.shares_storage_with(self)) src = copy_of(src);
  update_in_place(self,
                  [&](Tensor& target) { index_copy_kernel(self.device(), target, dim, idx, src); });
  return self;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  constexpr const char* op = "gather";
  dim = check_gather_scatter(x, dim, index, nullptr, op);
  const Tensor idx = index.detach().contiguous();
  check_range(idx, x.size(dim), dim, op);
  Tensor out = gather_unchecked(x, dim, idx);
  if (autograd::any_requires_grad({x})) {
    autograd::record(op, {x}, {out},
                     [si = autograd::SavedTensor(idx), dim, shape = x.shape()](
                         const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& g = args.grad(0);
                       Tensor gx = zeros(shape, g.options());
                       scatter_kernel(g.device(), gx, dim, si.get(), g, true);
                       return {gx};
                     });
  }
  return out;
}

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_op(x, dim, index, src, false, "scatter");
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_op(x, dim, index, src, true, "scatter_add");
}

}  // namespace mt::runtime
