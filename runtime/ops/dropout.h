// Dropout with a counter-based mask: element i (row-major index in x) is dropped when
// uniform_at(key, i) < p (runtime/core/rng.h), so the mask depends only on the key and x's shape,
// never on thread count or layout. Kept values are scaled by 1 / (1 - p). No mask is stored: the
// backward regenerates it from the key (one Philox draw per element) and applies it to dy.
#pragma once

#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// p in [0, 1). Returns x itself when !training or p == 0. Use a fresh key (e.g.
// key.with_offset(step)) for every call that should draw a new mask. Differentiable w.r.t. x.
Tensor dropout(const Tensor& x, double p, const RandomKey& key, bool training = true);

}  // namespace mt::runtime
