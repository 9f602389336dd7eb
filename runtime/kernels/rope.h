// Kernel table of the rope family (the op is in runtime/ops/rope.h).
#pragma once

#include <cstdint>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// x [B, T, H, head_dim] contiguous; cos, sin [L, head_dim / 2] contiguous, f32 (f64 when x is
// f64), with position_offset + T <= L. Writes out (like x): each pair (x[2i], x[2i+1]) of token t
// rotated by angle (position_offset + t) * freq_i, or by minus that angle when `inverse` (the
// backward).
inline constinit KernelTable<void(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                  int64_t position_offset, bool inverse, Tensor& out)>
    rope_kernel{"apply_rope"};

}  // namespace mt::runtime
