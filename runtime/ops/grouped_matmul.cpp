#include "runtime/ops/grouped_matmul.h"

#include <string>

#include "runtime/autograd/function.h"
#include "runtime/autograd/selective_checkpoint.h"
#include "runtime/kernels/grouped_matmul.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {
namespace {

std::string counts_text(const std::vector<int64_t>& counts) {
  std::string s = "[";
  for (size_t i = 0; i < counts.size() && i < 16; ++i) {
    s += (i ? ", " : "") + std::to_string(counts[i]);
  }
  if (counts.size() > 16) s += ", ...";
  return s + "]";
}

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  MT_CHECK(a.defined() && b.defined(), op, ": operands must be defined tensors");
  MT_CHECK(a.is_floating_point() && a.dtype() == b.dtype(), op,
           ": expected operands of one floating dtype (f32, f64, bf16, f16), got ", a.dtype(),
           " and ", b.dtype());
  MT_CHECK(a.device() == b.device(), op, ": operands on different devices: ", a.device(), " and ",
           b.device());
}

}  // namespace

void check_group_counts(const char* op, const std::vector<int64_t>& counts, int64_t groups,
                        int64_t rows) {
  MT_CHECK(int64_t(counts.size()) == groups, op, ": expected ", groups,
           " group counts (one per matrix of w), got ", counts.size(), " ", counts_text(counts));
  int64_t total = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    MT_CHECK(counts[g] >= 0, op, ": group ", g, " has a negative row count ", counts[g]);
    total += counts[g];
  }
  MT_CHECK(total == rows, op, ": the group counts ", counts_text(counts), " sum to ", total,
           " but the input has ", rows, " rows");
}

Tensor grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                  bool transpose_w) {
  check_operands("grouped_mm", x, w);
  MT_CHECK(x.dim() == 2, "grouped_mm: expected x [N, K], got shape ", x.shape());
  MT_CHECK(w.dim() == 3, "grouped_mm: expected w [G, ", transpose_w ? "M, K" : "K, M",
           "], got shape ", w.shape());
  const int64_t k = x.size(1);
  const int64_t w_k = transpose_w ? w.size(2) : w.size(1);
  const int64_t m = transpose_w ? w.size(1) : w.size(2);
  MT_CHECK(w_k == k, "grouped_mm: x ", x.shape(), " has ", k, " columns but w ", w.shape(),
           transpose_w ? " (layout [G, M, K]) has K = " : " (layout [G, K, M]) has K = ", w_k);
  check_group_counts("grouped_mm", counts, w.size(0), x.size(0));

  const Tensor xc = x.detach().contiguous();
  const Tensor wc = w.detach().contiguous();
  const Tensor out = autograd::reuse_or_compute("grouped_mm", {xc, wc}, [&] {
    Tensor product = empty({x.size(0), m}, x.options());
    grouped_mm_kernel(x.device(), xc, wc, counts, transpose_w, product);
    return product;
  });

  if (autograd::any_requires_grad({x, w})) {
    autograd::record("grouped_mm", {x, w}, {out},
                     [sx = autograd::SavedTensor(xc), sw = autograd::SavedTensor(wc), counts,
                      transpose_w](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& xs = sx.get();
                       const Tensor& ws = sw.get();
                       const Tensor dy = args.grad(0).to(xs.dtype()).contiguous();
                       Tensor dx, dw;
                       // y_g = x_g W_g^T: dx_g = dy_g W_g, dW_g = dy_g^T x_g.
                       // y_g = x_g W_g:   dx_g = dy_g W_g^T, dW_g = x_g^T dy_g.
                       if (args.needs(0)) dx = grouped_mm(dy, ws, counts, !transpose_w);
                       if (args.needs(1))
                         dw = transpose_w ? grouped_mm_tn(dy, xs, counts)
                                          : grouped_mm_tn(xs, dy, counts);
                       return {dx, dw};
                     });
  }
  return out;
}

Tensor grouped_mm(const Tensor& x, const Tensor& w, const Tensor& counts, bool transpose_w) {
  MT_CHECK(counts.defined() && counts.dim() == 1 &&
               (counts.dtype() == DType::I64 || counts.dtype() == DType::I32),
           "grouped_mm: expected counts as a 1-D i64 or i32 tensor, got ",
           counts.defined() ? counts.shape() : Shape{}, " ",
           counts.defined() ? dtype_name(counts.dtype()) : "undefined");
  MT_CHECK(counts.device().is_cpu(),
           "grouped_mm: counts must be on the CPU (the group sizes "
           "shape the computation), got a tensor on ",
           counts.device());
  return grouped_mm(x, w, counts.to_vector<int64_t>(), transpose_w);
}

Tensor grouped_mm_tn(const Tensor& a, const Tensor& b, const std::vector<int64_t>& counts) {
  check_operands("grouped_mm_tn", a, b);
  MT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(0) == b.size(0),
           "grouped_mm_tn: expected a [N, P] and b [N, Q] with the same rows, got ", a.shape(),
           " and ", b.shape());
  int64_t groups = int64_t(counts.size());
  check_group_counts("grouped_mm_tn", counts, groups, a.size(0));
  Tensor out = empty({groups, a.size(1), b.size(1)}, a.options());
  grouped_mm_tn_kernel(a.device(), a.detach().contiguous(), b.detach().contiguous(), counts, out);
  return out;
}

}  // namespace mt::runtime
