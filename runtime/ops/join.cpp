#include "runtime/ops/join.h"

#include "runtime/autograd/function.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  MT_CHECK(!tensors.empty(), "cat: expected at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) {
    MT_CHECK(tensors[i].defined(), "cat: tensor ", i, " is undefined");
    MT_CHECK(tensors[i].dim() > 0, "cat: tensor ", i, " is 0-D (shape [])");
  }
  const Tensor& first = tensors[0];
  dim = wrap_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[size_t(dim)] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MT_CHECK(t.dtype() == first.dtype(), "cat: tensor ", i, " has dtype ", t.dtype(),
             " but tensor 0 has ", first.dtype());
    MT_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device(),
             " but tensor 0 on ", first.device());
    bool match = t.dim() == first.dim();
    for (int64_t d = 0; match && d < t.dim(); ++d) match = d == dim || t.size(d) == first.size(d);
    MT_CHECK(match, "cat: tensor ", i, " has shape ", t.shape(), " but tensor 0 has shape ",
             first.shape(), " (all dims but ", dim, " must match)");
    out_shape[size_t(dim)] += t.size(dim);
  }
  Tensor out = empty(out_shape, first.options());
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    out.narrow(dim, offset, t.size(dim)).copy_(t.detach());
    sizes.push_back(t.size(dim));
    offset += t.size(dim);
  }
  if (autograd::any_requires_grad(tensors)) {
    autograd::record(
        "cat", tensors, {out},
        [sizes = std::move(sizes), dim](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
          std::vector<Tensor> grads(sizes.size());
          int64_t start = 0;
          for (size_t i = 0; i < sizes.size(); ++i) {
            if (args.needs(i)) grads[i] = args.grad(0).narrow(dim, start, sizes[i]);
            start += sizes[i];
          }
          return grads;
        });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  MT_CHECK(!tensors.empty(), "stack: expected at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) {
    MT_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    MT_CHECK(tensors[i].dtype() == tensors[0].dtype(), "stack: tensor ", i, " has dtype ",
             tensors[i].dtype(), " but tensor 0 has ", tensors[0].dtype());
    MT_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " has shape ",
             tensors[i].shape(), " but tensor 0 has shape ", tensors[0].shape(),
             " (all must be equal)");
  }
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(t.unsqueeze(dim));
  return cat(parts, dim);
}

namespace {

// Views of x of `sizes` along `dim` (which add up to x.size(dim)), recorded as one node: its
// backward writes the views' gradients into one tensor shaped as x (zeros where a view got none),
// where a node per view would each fill a whole x-shaped tensor and the engine add them up.
std::vector<Tensor> split_views(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const Tensor base = x.detach();
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(base.narrow(dim, start, s));
    start += s;
  }
  if (autograd::any_requires_grad({x})) {
    autograd::record("split", {x}, out,
                     [dim](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       return {cat(args.grads, dim)};
                     });
  }
  return out;
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  MT_CHECK(x.defined() && x.dim() > 0, "split: expected a tensor with at least one dim");
  dim = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.size(dim);
  MT_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be > 0, got ",
           split_size, " for shape ", x.shape());
  if (n == 0) return {x.narrow(dim, 0, 0)};
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size)
    sizes.push_back(std::min(split_size, n - start));
  return split_views(x, sizes, dim);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  MT_CHECK(x.defined() && x.dim() > 0, "split: expected a tensor with at least one dim");
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    MT_CHECK(s >= 0, "split: sizes must be >= 0, got ", Shape(sizes));
    total += s;
  }
  MT_CHECK(total == x.size(dim), "split: sizes ", Shape(sizes), " add up to ", total,
           ", expected the size ", x.size(dim), " of dim ", dim, " of shape ", x.shape());
  return split_views(x, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  MT_CHECK(chunks > 0, "chunk: chunks must be > 0, got ", chunks);
  MT_CHECK(x.defined() && x.dim() > 0, "chunk: expected a tensor with at least one dim");
  dim = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.size(dim);
  if (n == 0) return split(x, std::vector<int64_t>(size_t(chunks), 0), dim);
  return split(x, (n + chunks - 1) / chunks, dim);
}

}  // namespace mt::runtime
