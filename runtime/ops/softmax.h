// softmax and log_softmax along one dim: numerically stable (the row maximum is subtracted), with
// 16-bit inputs computed in f32 and f64 in f64. Differentiable; backward uses the saved output
// and a fused kernel, so no intermediate is kept besides the output.
#pragma once

#include <cstdint>

#include "runtime/core/tensor.h"

namespace mt::runtime {

// exp(x - max) / sum(exp(x - max)) along `dim` (negative dims count from the end).
Tensor softmax(const Tensor& x, int64_t dim);
// x - max - log(sum(exp(x - max))) along `dim`.
Tensor log_softmax(const Tensor& x, int64_t dim);

}  // namespace mt::runtime
