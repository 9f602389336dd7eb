#include "runtime/ops/matmul.h"

#include "runtime/autograd/function.h"
#include "runtime/autograd/selective_checkpoint.h"
#include "runtime/kernels/matmul.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"

namespace mt::runtime {
namespace {

Shape batch_of(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// `batch` left-padded with ones to `ndim` dims.
Shape pad_batch(const Shape& batch, size_t ndim) {
  Shape out(ndim - batch.size(), 1);
  out.insert(out.end(), batch.begin(), batch.end());
  return out;
}

// Gradient of the raw operand `a` of C = op(a) @ B (op = transpose when `ta`), where `a_l` and
// `b_l` are the logical operands and `g` = dC [batch..., M, N].
Tensor grad_left(const Tensor& g, const Tensor& a, bool ta, const Tensor& b_l) {
  const Shape batch = batch_of(g);
  const Shape a_batch = batch_of(a);
  if (batch.size() >= a_batch.size() && pad_batch(a_batch, batch.size()) == batch) {
    // a spans every batch: one batched product, no reduction.
    Tensor r = ta ? matmul(b_l, g, false, true) : matmul(g, b_l, false, true);
    return r.reshape(a.shape());
  }
  const int64_t M = g.size(-2), N = g.size(-1), K = b_l.size(-2);
  if (numel_of(a_batch) == 1) {
    // a is shared by every batch: sum_t dC_t B_t^T = [M, nb*N] @ [nb*N, K], one GEMM.
    const int64_t nb = numel_of(batch);
    Tensor gm = g.reshape({nb, M, N}).permute({1, 0, 2}).reshape({M, nb * N});
    Shape b_full = batch;
    b_full.push_back(K);
    b_full.push_back(N);
    Tensor bm = b_l.expand(b_full).reshape({nb, K, N}).transpose(1, 2).reshape({nb * N, K});
    Tensor r = ta ? matmul(bm, gm, true, true) : matmul(gm, bm);
    return r.reshape(a.shape());
  }
  // Partially broadcast batch dims: full batched product, then sum the broadcast dims.
  Tensor r = ta ? matmul(b_l, g, false, true) : matmul(g, b_l, false, true);
  return sum_to(r, a.shape());
}

// Gradient of the raw operand `b` of C = A @ op(b) (op = transpose when `tb`).
Tensor grad_right(const Tensor& g, const Tensor& a_l, const Tensor& b, bool tb) {
  const Shape batch = batch_of(g);
  const Shape b_batch = batch_of(b);
  if (batch.size() >= b_batch.size() && pad_batch(b_batch, batch.size()) == batch) {
    Tensor r = tb ? matmul(g, a_l, true, false) : matmul(a_l, g, true, false);
    return r.reshape(b.shape());
  }
  const int64_t M = g.size(-2), N = g.size(-1), K = a_l.size(-1);
  if (numel_of(b_batch) == 1) {
    // b is shared by every batch (x @ W): sum_t A_t^T dC_t = [nb*M, K]^T @ [nb*M, N], one GEMM
    // whose operands are views when a and dC are contiguous.
    const int64_t nb = numel_of(batch);
    Shape a_full = batch;
    a_full.push_back(M);
    a_full.push_back(K);
    Tensor am = a_l.expand(a_full).reshape({nb * M, K});
    Tensor gm = g.reshape({nb * M, N});
    Tensor r = tb ? matmul(gm, am, true, false) : matmul(am, gm, true, false);
    return r.reshape(b.shape());
  }
  Tensor r = tb ? matmul(g, a_l, true, false) : matmul(a_l, g, true, false);
  return sum_to(r, b.shape());
}

// matmul for operands with at least 2 dims.
Tensor matmul_2d_plus(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  MT_CHECK(a.dtype() == b.dtype(), "matmul: expected operands of the same dtype, got ",
           dtype_name(a.dtype()), " ", a.shape(), " and ", dtype_name(b.dtype()), " ", b.shape());
  MT_CHECK(is_floating(a.dtype()), "matmul: expected floating operands (f32, f64, bf16, f16), got ",
           dtype_name(a.dtype()));
  MT_CHECK(a.device() == b.device(), "matmul: operands on different devices: ", a.device(), " and ",
           b.device());
  // Logical operands: views without autograd history (the transposes cost nothing).
  Tensor a_l = ta ? a.detach().transpose(-2, -1) : a.detach();
  Tensor b_l = tb ? b.detach().transpose(-2, -1) : b.detach();
  const int64_t M = a_l.size(-2), K = a_l.size(-1), N = b_l.size(-1);
  MT_CHECK(b_l.size(-2) == K, "matmul: inner dimensions differ: a ", a.shape(),
           ta ? " (transposed)" : "", " has ", K, " columns, b ", b.shape(),
           tb ? " (transposed)" : "", " has ", b_l.size(-2), " rows");
  Shape out_shape = broadcast_shapes(batch_of(a), batch_of(b), "matmul");
  out_shape.push_back(M);
  out_shape.push_back(N);
  const Tensor out = autograd::reuse_or_compute("matmul", {a_l, b_l}, [&] {
    Tensor product = Tensor::empty(out_shape, a.options());
    matmul_kernel(a.device(), a_l, b_l, product);
    return product;
  });

  if (autograd::any_requires_grad({a, b})) {
    autograd::record("matmul", {a, b}, {out},
                     [a_saved = autograd::SavedTensor(a), b_saved = autograd::SavedTensor(b), ta,
                      tb](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& a = a_saved.get();
                       const Tensor& b = b_saved.get();
                       const Tensor& g = args.grad(0);
                       Tensor a_l = ta ? a.transpose(-2, -1) : a;
                       Tensor b_l = tb ? b.transpose(-2, -1) : b;
                       return {args.needs(0) ? grad_left(g, a, ta, b_l) : Tensor(),
                               args.needs(1) ? grad_right(g, a_l, b, tb) : Tensor()};
                     });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  MT_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: expected operands with at least 1 dim, got ",
           "shapes ", a.shape(), " and ", b.shape());
  if (a.dim() >= 2 && b.dim() >= 2) return matmul_2d_plus(a, b, transpose_a, transpose_b);
  // Vectors (numpy semantics) through differentiable views.
  const bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  MT_CHECK(!a_vec || !b_vec || a.size(0) == b.size(0), "matmul: inner dimensions differ: a ",
           a.shape(), " and b ", b.shape());
  Tensor out = matmul_2d_plus(a_vec ? a.unsqueeze(0) : a, b_vec ? b.unsqueeze(1) : b,
                              a_vec ? false : transpose_a, b_vec ? false : transpose_b);
  if (b_vec) out = out.squeeze(-1);  // [..., M]
  if (a_vec) out = out.squeeze(b_vec ? -1 : -2);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  MT_CHECK(weight.dim() == 2, "linear: expected a 2-D weight [out, in], got shape ",
           weight.shape());
  MT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", x.shape(),
           " does not end in the weight's in_features ", weight.size(1), " (weight ",
           weight.shape(), ")");
  MT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
           "linear: expected a bias of shape [", weight.size(0), "], got ", bias.shape());
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  Tensor x2 = x.dim() == 2 ? x : x.reshape({numel_of(lead), x.size(-1)});
  Tensor y = matmul(x2, weight, false, true);
  if (bias.defined()) y = add(y, bias);
  return x.dim() == 2 ? y : y.reshape(out_shape);
}

}  // namespace mt::runtime
