// Kernel tables of grouped_mm (the op is runtime/ops/grouped_matmul.h). Operands are contiguous
// and of one floating dtype; counts has one entry per group, non-negative, summing to the number
// of rows (the op validated everything). CPU: runtime/cpu/grouped_matmul.cpp; CUDA: one cuBLAS
// GEMM per group, runtime/cuda/grouped_matmul.cu.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// out [N, M]: out_g = x_g @ w[g]^T for w [G, M, K] (transpose_w), or x_g @ w[g] for w [G, K, M].
// out is fully overwritten (K == 0 gives zeros).
inline constinit KernelTable<void(const Tensor& x, const Tensor& w,
                                  const std::vector<int64_t>& counts, bool transpose_w,
                                  Tensor& out)>
    grouped_mm_kernel{"grouped_mm"};

// out [G, P, Q]: out[g] = a_g^T @ b_g for a [N, P], b [N, Q]; zeros for empty groups.
inline constinit KernelTable<void(const Tensor& a, const Tensor& b,
                                  const std::vector<int64_t>& counts, Tensor& out)>
    grouped_mm_tn_kernel{"grouped_mm_tn"};

}  // namespace mt::runtime
