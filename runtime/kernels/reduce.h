// Kernel tables of the reduction family (runtime/ops/reduce.h), implemented per backend
// (runtime/cpu/reduce.cpp).
//
// `dims` are sorted, unique and in range. Outputs are contiguous and hold the kept dims of x in
// order (with or without keepdim's size-1 dims: the memory layout is the same). Inputs have any
// strides.
#pragma once

#include <vector>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// out = sum of x over dims / divisor. Floating x: out has x's dtype and accumulates in f64.
// Integer and bool x: out is i64 (wrapping on overflow) and divisor must be 1.
// The summation order is fixed by the shape alone (see runtime/cpu/reduce.cpp), never by the
// thread count.
inline constinit KernelTable<void(const Tensor& x, const std::vector<int64_t>& dims, double divisor,
                                  const Tensor& out)>
    sum_kernel{"sum"};

// Maximum of x over dims (at least one element per output; NaN wins): `values` (x's dtype) and
// `indices` (i64: the first maximum's row-major index within the reduced dims). Either output
// may be undefined.
inline constinit KernelTable<void(const Tensor& x, const std::vector<int64_t>& dims,
                                  const Tensor& values, const Tensor& indices)>
    max_kernel{"max"};

}  // namespace mt::runtime
