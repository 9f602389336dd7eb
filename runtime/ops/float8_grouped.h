// Float8 grouped GEMMs for mixture-of-experts layers (torchao's float8 rowwise MoE training,
// torchtitan's [quantize.grouped_mm.float8]): grouped_mm (runtime/ops/grouped_matmul.h) with
// its forward and both backward GEMMs in FP8, every operand e4m3 with power-of-two scales per row
// along the GEMM's contracted dimension:
//   forward       y_g  = x_g (by token, over K)  @ W_g^T (by (expert, output), over K)
//   grad input    dx_g = dy_g (by token, over M) @ W_g   (by (expert, input), over M)
//   grad weight   dW_g = dy_g^T @ x_g, both scaled per (expert, feature) over that expert's
//                 tokens alone ("jagged" scales: another expert's tokens never set them)
// A token's scale depends on its own row only and an expert's on its own tokens only, so the
// result does not depend on how the other groups are filled: with expert parallelism the experts
// see the tokens one process would. The FP8 copies backward needs are made in forward and saved
// instead of x (a quarter of an f32 activation's bytes).
//
// On CUDA each group is one FP8 GEMM (float8_mm), whose dimensions must be multiples of 16:
// groups whose token count is not are padded with zero rows (they change no scale and no sum,
// and are dropped from the result), on every device alike; K and M must be multiples of 16
// (float8_grouped_mm_unsupported). The CPU runs the exact reference (emulated codes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/ops/float8_recipe.h"

namespace mt::runtime {

// Why x [N, k] @ w [G, m, k]^T cannot run in FP8 on `device`, or nullopt when it can (the same
// rule as float8_linear_unsupported).
std::optional<std::string> float8_grouped_mm_unsupported(Device device, int64_t k, int64_t m);

// x [N, K] (rows grouped by expert: counts[g] rows for group g, in order), w [G, M, K] -> y [N, M]
// in x's dtype (f32 or bf16, x and w alike); differentiable in x and w.
// token_amax_reduce: for ranks that hold the same experts' weights and each a share of their
// tokens (tensor parallelism: each tp rank routes its own sequence shard). The weight gradient's
// per-(expert, feature) amaxes over the tokens ([G, K] for x in forward, [G, M] for the output
// gradient in backward, zero where this rank has no tokens) go through it, a collective every
// rank calls alike, so each expert is scaled over all its tokens as in one process and the
// ranks' weight gradients add up to one process's.
Tensor float8_grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                         const Float8AmaxReduce& token_amax_reduce = nullptr);

// Several weights [G, M_i, K] reading one x (a SwiGLU's w1 and w3): the same results, bit for
// bit, as one call per weight, with x cast once for all of them (by token for the forward, per
// (expert, feature) for the weight gradients, one token_amax_reduce call for it) -> y_i [N, M_i].
std::vector<Tensor> float8_grouped_mm(const Tensor& x, const std::vector<Tensor>& weights,
                                      const std::vector<int64_t>& counts,
                                      const Float8AmaxReduce& token_amax_reduce = nullptr);

}  // namespace mt::runtime
