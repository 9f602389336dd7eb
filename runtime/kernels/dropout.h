// Kernel table of the dropout family (the op is in runtime/ops/dropout.h).
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// x contiguous, 0 <= p < 1. out[i] = 0 where uniform_at(key, i) < p, else x[i] / (1 - p), with i
// the row-major element index. The forward and the backward (applied to dy) are this one kernel.
inline constinit KernelTable<void(const Tensor& x, double p, const RandomKey& key, Tensor& out)>
    dropout_kernel{"dropout"};

}  // namespace mt::runtime
