// Grouped matrix product for mixture-of-experts layers: the rows of x are grouped by expert
// (group g owns counts[g] consecutive rows, in group order), and each group is multiplied by its
// own matrix of a stacked weight w [G, ...]. One call replaces a loop of G matmuls over slices.
//
//   y = grouped_mm(x, w, counts);   // x [N, K], w [G, M, K] -> y [N, M], y_g = x_g @ w[g]^T
//
// The default layout is torchtitan's GroupedExperts layout ([experts, out, in], as nn.Linear
// stores a weight); transpose_w = false takes w [G, K, M] with y_g = x_g @ w[g] instead.
// counts: G non-negative integers summing to N (zeros allowed: an empty group contributes no
// rows and gets a zero weight gradient), as a host vector or a 1-D i64/i32 CPU tensor.
// dtypes f32, f64, bf16, f16 (16-bit operands multiply with f32 accumulation and round once).
// Differentiable w.r.t. x and w (first order); backward uses grouped_mm itself for x and
// grouped_mm_tn for w.
//
// Backends: CPU (runtime/cpu/grouped_matmul.cpp, OpenBLAS per group) and CUDA
// (runtime/cuda/grouped_matmul.cu, one cuBLAS GEMM per non-empty group; counts stay on the host).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime {

// x [N, K] grouped by rows, w [G, M, K] (transpose_w) or [G, K, M] -> [N, M].
Tensor grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                  bool transpose_w = true);
// As above with counts as a 1-D integer tensor on the CPU.
Tensor grouped_mm(const Tensor& x, const Tensor& w, const Tensor& counts, bool transpose_w = true);

// Throws naming `op` unless counts has `groups` non-negative entries summing to `rows`.
void check_group_counts(const char* op, const std::vector<int64_t>& counts, int64_t groups,
                        int64_t rows);

// The per-group products a_g^T @ b_g of row-grouped a [N, P] and b [N, Q]: out [G, P, Q] (zeros
// for an empty group). The weight gradient of grouped_mm; not differentiable itself.
Tensor grouped_mm_tn(const Tensor& a, const Tensor& b, const std::vector<int64_t>& counts);

}  // namespace mt::runtime
