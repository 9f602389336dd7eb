#include "runtime/ops/float8_grouped.h"

#include <utility>

#include "runtime/autograd/function.h"
#include "runtime/core/error.h"
#include "runtime/kernels/float8.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8.h"
#include "runtime/ops/grouped_matmul.h"
#include "runtime/ops/join.h"

namespace mt::runtime {

namespace {

constexpr Float8Format kE4M3 = Float8Format::E4M3;
constexpr bool kPow2 = true;  // torchao's rowwise scales are powers of two

// Row offsets of the groups (offsets[g] .. offsets[g] + counts[g]).
std::vector<int64_t> group_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t g = 1; g < counts.size(); ++g) offsets[g] = offsets[g - 1] + counts[g - 1];
  return offsets;
}

// Rows [begin, begin + n) of a cast tensor: its codes and their scales.
std::pair<Tensor, Tensor> rows_of(const Float8Tensor& t, int64_t begin, int64_t n) {
  return {t.codes.narrow(0, begin, n), t.scale_inv.narrow(0, begin, n)};
}

// For each non-empty group g: its rows of `out` = its token rows of `a` [n_g, C] @ rows
// [g * block, (g + 1) * block) of `b`^T (expert g's matrix, [block, C]).
void grouped_products(const std::vector<int64_t>& counts, const Float8Tensor& a,
                      const Float8Tensor& b, int64_t block, bool fast_accum, Tensor& out) {
  const std::vector<int64_t> offsets = group_offsets(counts);
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] == 0) continue;
    const auto [ac, as] = rows_of(a, offsets[g], counts[g]);
    const auto [bc, bs] = rows_of(b, int64_t(g) * block, block);
    out.narrow(0, offsets[g], counts[g])
        .copy_(float8_mm(ac, kE4M3, as, bc, kE4M3, bs, out.dtype(), fast_accum));
  }
}

// Per group g, x_g [n_g, C] transposed to [C, n_g] and cast per row: each feature scaled over the
// group's tokens alone (undefined codes for an empty group). With `reduce`, the amaxes [G, C]
// (zero for a group without tokens here) go through it at once, on every rank alike, before the
// casts.
std::vector<Float8Tensor> jagged_transposed(const Tensor& x, const std::vector<int64_t>& counts,
                                            const Float8AmaxReduce& reduce) {
  const std::vector<int64_t> offsets = group_offsets(counts);
  const int64_t groups = int64_t(counts.size()), features = x.size(1);
  std::vector<Tensor> xt(counts.size());
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) xt[g] = x.narrow(0, offsets[g], counts[g]).transpose(0, 1).contiguous();
  }
  Tensor amax;  // [G, C], or undefined: each group's own
  if (reduce) {
    amax = zeros({groups, features}, TensorOptions().with_device(x.device()));
    for (int64_t g = 0; g < groups; ++g) {
      if (xt[g].defined()) amax.select(0, g).copy_(float8_row_amax(xt[g]));
    }
    reduce(amax);
  }
  std::vector<Float8Tensor> out(counts.size());
  for (int64_t g = 0; g < groups; ++g) {
    if (!xt[g].defined()) continue;
    out[g] = to_float8_rowwise_with_amax(xt[g], kE4M3, kPow2,
                                         amax.defined() ? amax.select(0, g) : Tensor());
  }
  return out;
}

// The op on groups whose counts are all multiples of kFloat8GemmMultiple (float8_grouped_mm pads).
Tensor grouped_aligned(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts) {
  const int64_t groups = w.size(0), m = w.size(1), k = w.size(2);
  const Tensor x2 = x.detach().contiguous();
  const Tensor wd = w.detach().contiguous();
  const Float8Tensor xq = to_float8_rowwise(x2, kE4M3, kPow2);                    // by token
  const Float8Tensor wq = to_float8_rowwise(wd.reshape({groups * m, k}), kE4M3, kPow2);  // (g, m)
  Tensor y = zeros({x.size(0), m}, x.options().with_requires_grad(false));
  grouped_products(counts, xq, wq, m, /*fast_accum=*/true, y);
  return y;
}

}  // namespace

std::optional<std::string> float8_grouped_mm_unsupported(Device device, int64_t k, int64_t m) {
  return float8_linear_unsupported(device, k, m);
}

Tensor float8_grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                         const Float8AmaxReduce& token_amax_reduce) {
  MT_CHECK(x.defined() && w.defined() && x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(2),
           "float8_grouped_mm: expected x [N, K] and w [G, M, K], got ",
           x.defined() ? x.shape() : Shape{}, " and ", w.defined() ? w.shape() : Shape{});
  MT_CHECK(x.dtype() == w.dtype() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
           "float8_grouped_mm: expected an f32 or bf16 x and w of one dtype, got ",
           dtype_name(x.dtype()), " and ", dtype_name(w.dtype()));
  MT_CHECK(x.device() == w.device(), "float8_grouped_mm: x on ", x.device(), " and w on ",
           w.device());
  check_group_counts("float8_grouped_mm", counts, w.size(0), x.size(0));
  const int64_t k = w.size(2), m = w.size(1);
  if (k % kFloat8GemmMultiple != 0 || m % kFloat8GemmMultiple != 0) {
    MT_FAIL("float8_grouped_mm: cannot run x ", x.shape(), " @ w ", w.shape(),
            "^T in FP8: K = ", k, " and M = ", m, " must be multiples of ", kFloat8GemmMultiple);
  }
  bool aligned = true;
  for (int64_t c : counts) aligned = aligned && c % kFloat8GemmMultiple == 0;
  if (!aligned) {
    // Each group padded with zero rows to a multiple (differentiable: cat and narrow carry the
    // gradients of the real rows), computed, and its real rows taken back.
    std::vector<Tensor> parts;
    std::vector<int64_t> padded_counts;
    int64_t offset = 0;
    for (int64_t c : counts) {
      const int64_t pad = (kFloat8GemmMultiple - c % kFloat8GemmMultiple) % kFloat8GemmMultiple;
      if (c > 0) parts.push_back(x.narrow(0, offset, c));
      if (pad > 0) parts.push_back(zeros({pad, k}, x.options().with_requires_grad(false)));
      padded_counts.push_back(c + pad);
      offset += c;
    }
    const Tensor padded = parts.empty() ? x : cat(parts, 0);
    const Tensor y = float8_grouped_mm(padded, w, padded_counts, token_amax_reduce);
    std::vector<Tensor> rows;
    offset = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      if (counts[g] > 0) rows.push_back(y.narrow(0, offset, counts[g]));
      offset += padded_counts[g];
    }
    return rows.empty() ? y.narrow(0, 0, 0) : cat(rows, 0);
  }

  const bool need_dx = autograd::any_requires_grad({x});
  const bool need_dw = autograd::any_requires_grad({w});
  Tensor y = grouped_aligned(x, w, counts);
  if (!need_dx && !need_dw) return y;
  // Backward's operands, cast now so that x itself is not kept: W per (expert, input feature)
  // over M (for dx), x per (expert, input feature) over the expert's tokens (for dW).
  const int64_t groups = w.size(0);
  Float8Tensor wt;
  std::vector<Float8Tensor> xt;
  if (need_dx) {
    wt = to_float8_rowwise(w.detach().transpose(1, 2).contiguous().reshape({groups * k, m}),
                           kE4M3, kPow2);
  }
  if (need_dw) xt = jagged_transposed(x.detach(), counts, token_amax_reduce);
  autograd::record(
      "float8_grouped_mm", {x, w}, {y},
      [wt, xt = std::move(xt), counts, groups, k, m, dtype = x.dtype(),
       token_amax_reduce](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
        const Tensor g = args.grad(0).to(dtype).contiguous();
        Tensor dx, dw;
        if (args.needs(0)) {
          const Float8Tensor gq = to_float8_rowwise(g, kE4M3, kPow2);  // by token, over M
          dx = zeros({g.size(0), k}, g.options().with_requires_grad(false));
          grouped_products(counts, gq, wt, k, /*fast_accum=*/false, dx);
        }
        if (args.needs(1)) {
          const std::vector<Float8Tensor> gt = jagged_transposed(g, counts, token_amax_reduce);  // [M, n_g] each
          dw = zeros({groups, m, k}, g.options().with_requires_grad(false));
          for (size_t e = 0; e < counts.size(); ++e) {
            if (counts[e] == 0) continue;  // no tokens: a zero gradient
            dw.select(0, int64_t(e))
                .copy_(float8_mm(gt[e].codes, kE4M3, gt[e].scale_inv, xt[e].codes, kE4M3,
                                 xt[e].scale_inv, dtype, /*fast_accum=*/false));
          }
        }
        return {dx, dw};
      });
  return y;
}

}  // namespace mt::runtime
