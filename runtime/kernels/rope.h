// Kernel table of the rope family (the op is in runtime/ops/rope.h).
#pragma once

#include <cstdint>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// Whether the rope kernels read x [B, T, H, D] where it is: each token's H * D elements
// contiguous, and token (b, t) at b * T * stride(1) + t * stride(1).
inline bool rope_reads_in_place(const Tensor& x) {
  return x.stride(3) == 1 && x.stride(2) == x.size(3) && x.stride(1) >= x.size(2) * x.size(3) &&
         x.stride(0) == x.size(1) * x.stride(1);
}

// x [B, T, H, head_dim] with each token's H * head_dim elements contiguous and the tokens evenly
// spaced (rope_reads_in_place(x): contiguous, or e.g. the q or k columns of a joined q/k/v
// projection); cos, sin [L, head_dim / 2] contiguous, f32 (f64 when x is f64), with
// position_offset + T <= L. Writes out (contiguous, x's shape): each pair (x[2i], x[2i+1]) of
// token t rotated by angle (position_offset + t) * freq_i, or by minus that angle when `inverse`
// (the backward).
inline constinit KernelTable<void(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                  int64_t position_offset, bool inverse, Tensor& out)>
    rope_kernel{"apply_rope"};

}  // namespace mt::runtime
