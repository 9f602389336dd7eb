// Kernels behind copies, casts and fills (used by runtime/ops/view.cpp and factory.cpp).
#pragma once

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// dst[i] = convert(src[i]); same shape, any strides and dtypes; src and dst do not overlap.
inline constinit KernelTable<void(const Tensor& src, const Tensor& dst)> copy_kernel{"copy_"};
// dst[i] = value converted to dst's dtype; any strides.
inline constinit KernelTable<void(const Tensor& dst, double value)> fill_kernel{"fill_"};

}  // namespace mt::runtime
