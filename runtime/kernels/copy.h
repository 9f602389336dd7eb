// Kernels behind copies, casts and fills (used by runtime/ops/view.cpp and factory.cpp).
#pragma once

#include <vector>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// dst[i] = convert(src[i]); same shape, any strides and dtypes; src and dst do not overlap.
inline constinit KernelTable<void(const Tensor& src, const Tensor& dst)> copy_kernel{"copy_"};
// copy_kernel over many pairs in a few launches, for backends that provide it (CUDA; FSDP's casts
// of a block's parameters and gradients): srcs[k] into dsts[k], contiguous, floating, of equal
// sizes, on one device; dtypes may differ from pair to pair. The values copy_kernel writes.
inline constinit KernelTable<void(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts)>
    copy_multi_tensor_kernel{"copy_multi_tensor_"};
// dst[i] = value converted to dst's dtype; any strides.
inline constinit KernelTable<void(const Tensor& dst, double value)> fill_kernel{"fill_"};

}  // namespace mt::runtime
