#include "runtime/ops/float8_grouped.h"

#include <utility>

#include "runtime/autograd/function.h"
#include "runtime/core/error.h"
#include "runtime/kernels/float8.h"
#include "runtime/ops/elementwise.h"
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

// Per group g, x_g [n_g, C] transposed to [C, n_g] (a view, where the device casts by column in
// place) and cast per row: each feature scaled over the group's tokens alone (undefined codes for
// an empty group). With `reduce`, the amaxes [G, C] (zero for a group without tokens here) go
// through it at once, on every rank alike, before the casts.
std::vector<Float8Tensor> jagged_transposed(const Tensor& x, const std::vector<int64_t>& counts,
                                            const Float8AmaxReduce& reduce) {
  const std::vector<int64_t> offsets = group_offsets(counts);
  const int64_t groups = int64_t(counts.size()), features = x.size(1);
  std::vector<Tensor> xt(counts.size());
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) {
      xt[g] = float8_rowwise_operand(x.narrow(0, offsets[g], counts[g]).transpose(0, 1));
    }
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

// Checks x [N, K] and each weight [G, M_i, K] (one dtype, f32 or bf16; one device; K and every
// M_i multiples of kFloat8GemmMultiple) and the group counts.
void check_operands(const Tensor& x, const std::vector<Tensor>& weights,
                    const std::vector<int64_t>& counts) {
  MT_CHECK(!weights.empty(), "float8_grouped_mm: no weights");
  for (const Tensor& w : weights) {
    MT_CHECK(x.defined() && w.defined() && x.dim() == 2 && w.dim() == 3 &&
                 x.size(1) == w.size(2) && w.size(0) == weights[0].size(0),
             "float8_grouped_mm: expected x [N, K] and w [G, M, K] (every weight with the same G), "
             "got ",
             x.defined() ? x.shape() : Shape{}, " and ", w.defined() ? w.shape() : Shape{});
    MT_CHECK(x.dtype() == w.dtype() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
             "float8_grouped_mm: expected an f32 or bf16 x and w of one dtype, got ",
             dtype_name(x.dtype()), " and ", dtype_name(w.dtype()));
    MT_CHECK(x.device() == w.device(), "float8_grouped_mm: x on ", x.device(), " and w on ",
             w.device());
    const int64_t k = w.size(2), m = w.size(1);
    if (k % kFloat8GemmMultiple != 0 || m % kFloat8GemmMultiple != 0) {
      MT_FAIL("float8_grouped_mm: cannot run x ", x.shape(), " @ w ", w.shape(),
              "^T in FP8: K = ", k, " and M = ", m, " must be multiples of ",
              kFloat8GemmMultiple);
    }
  }
  check_group_counts("float8_grouped_mm", counts, weights[0].size(0), x.size(0));
}

// The op on groups whose counts are all multiples of kFloat8GemmMultiple (float8_grouped_mm
// pads): x is cast once, by token for the forward and per (group, feature) for the weight
// gradients, whichever weights read it.
std::vector<Tensor> grouped_aligned(const Tensor& x, const std::vector<Tensor>& weights,
                                    const std::vector<int64_t>& counts,
                                    const Float8AmaxReduce& token_amax_reduce) {
  const int64_t groups = weights[0].size(0), k = x.size(1);
  const Float8Tensor xq = to_float8_rowwise(x.detach().contiguous(), kE4M3, kPow2);  // by token
  std::vector<Tensor> ys;
  for (const Tensor& w : weights) {
    const int64_t m = w.size(1);
    const Tensor wd = w.detach().contiguous().reshape({groups * m, k});
    Tensor y = zeros({x.size(0), m}, x.options().with_requires_grad(false));
    grouped_products(counts, xq, to_float8_rowwise(wd, kE4M3, kPow2), m, /*fast_accum=*/true,
                     y);  // W per (group, output feature)
    ys.push_back(y);
  }
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  const bool need_dx = autograd::any_requires_grad({x});
  if (!autograd::any_requires_grad(inputs)) return ys;
  // Backward's operands, cast now so that x itself is not kept: each W per (group, input
  // feature) over its M (for dx), x per (group, input feature) over the group's tokens (for dW).
  std::vector<Float8Tensor> wts;
  if (need_dx) {
    for (const Tensor& w : weights) {
      const int64_t m = w.size(1);
      wts.push_back(to_float8_rowwise(
          w.detach().transpose(1, 2).contiguous().reshape({groups * k, m}), kE4M3, kPow2));
    }
  }
  std::vector<Float8Tensor> xt;
  if (autograd::any_requires_grad(weights)) {
    xt = jagged_transposed(x.detach(), counts, token_amax_reduce);
  }
  autograd::record(
      "float8_grouped_mm", inputs, ys,
      [wts = std::move(wts), xt = std::move(xt), counts, groups, k, dtype = x.dtype(),
       token_amax_reduce](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
        std::vector<Tensor> grads(args.grads.size() + 1);  // dx, then each dW
        for (size_t i = 0; i < args.grads.size(); ++i) {
          const Tensor g = args.grad(i).to(dtype).contiguous();
          const int64_t m = g.size(1);
          if (args.needs(0)) {
            const Float8Tensor gq = to_float8_rowwise(g, kE4M3, kPow2);  // by token, over M
            Tensor dx = zeros({g.size(0), k}, g.options().with_requires_grad(false));
            grouped_products(counts, gq, wts[i], k, /*fast_accum=*/false, dx);
            grads[0] = grads[0].defined() ? add(grads[0], dx) : dx;
          }
          if (args.needs(i + 1)) {
            const std::vector<Float8Tensor> gt = jagged_transposed(g, counts, token_amax_reduce);
            Tensor dw = zeros({groups, m, k}, g.options().with_requires_grad(false));
            for (size_t e = 0; e < counts.size(); ++e) {
              if (counts[e] == 0) continue;  // no tokens: a zero gradient
              dw.select(0, int64_t(e))
                  .copy_(float8_mm(gt[e].codes, kE4M3, gt[e].scale_inv, xt[e].codes, kE4M3,
                                   xt[e].scale_inv, dtype, /*fast_accum=*/false));
            }
            grads[i + 1] = dw;
          }
        }
        return grads;
      });
  return ys;
}

}  // namespace

std::optional<std::string> float8_grouped_mm_unsupported(Device device, int64_t k, int64_t m) {
  return float8_linear_unsupported(device, k, m);
}

std::vector<Tensor> float8_grouped_mm(const Tensor& x, const std::vector<Tensor>& weights,
                                      const std::vector<int64_t>& counts,
                                      const Float8AmaxReduce& token_amax_reduce) {
  check_operands(x, weights, counts);
  bool aligned = true;
  for (int64_t c : counts) aligned = aligned && c % kFloat8GemmMultiple == 0;
  if (aligned) return grouped_aligned(x, weights, counts, token_amax_reduce);
  // Each group padded with zero rows to a multiple (differentiable: cat and narrow carry the
  // gradients of the real rows), computed, and its real rows taken back.
  const int64_t k = x.size(1);
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
  std::vector<Tensor> ys = grouped_aligned(padded, weights, padded_counts, token_amax_reduce);
  for (Tensor& y : ys) {
    std::vector<Tensor> rows;
    offset = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      if (counts[g] > 0) rows.push_back(y.narrow(0, offset, counts[g]));
      offset += padded_counts[g];
    }
    y = rows.empty() ? y.narrow(0, 0, 0) : cat(rows, 0);
  }
  return ys;
}

Tensor float8_grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                         const Float8AmaxReduce& token_amax_reduce) {
  return float8_grouped_mm(x, std::vector<Tensor>{w}, counts, token_amax_reduce)[0];
}

}  // namespace mt::runtime
