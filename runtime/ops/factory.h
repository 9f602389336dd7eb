// Tensor factories: empty, zeros, ones, full, arange, from host values, and counter-based random
// normal/uniform (see runtime/core/rng.h). `*_slice` variants draw just a sub-block of a larger
// tensor and produce exactly the values the full draw holds there.
#pragma once

#include <functional>
#include <vector>

#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// [start, end) with `step`; default dtype i64.
Tensor arange(double start, double end, double step = 1.0,
              TensorOptions options = TensorOptions{}.with_dtype(DType::I64));
Tensor arange(int64_t end, TensorOptions options = TensorOptions{}.with_dtype(DType::I64));
Tensor scalar_tensor(double value, TensorOptions options = {});  // 0-D

// Tensor holding `values` (converted to options.dtype), e.g. from_vector<float>({1, 2}, {2}).
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options = {});

// Random tensors from a counter-based generator: element i of the full tensor = f(key, i).
Tensor randn(const Shape& shape, const RandomKey& key, TensorOptions options = {},
             double mean = 0.0, double std = 1.0);
Tensor rand(const Shape& shape, const RandomKey& key, TensorOptions options = {},
            double low = 0.0, double high = 1.0);
// Fill `out` with the block of a `full_shape` draw that starts at `block_offset` (one start
// index per dim; out.shape() is the block's extent).
void fill_normal_slice(const Tensor& out, const Shape& full_shape, const Shape& block_offset,
                       const RandomKey& key, double mean = 0.0, double std = 1.0);
void fill_uniform_slice(const Tensor& out, const Shape& full_shape, const Shape& block_offset,
                        const RandomKey& key, double low = 0.0, double high = 1.0);

// Fill the host tensor `out` with draw(i), i being each element's index in the full_shape tensor
// whose block at block_offset `out` is (on every thread): for draws this file does not offer,
// such as nn's truncated normal. op names the caller in errors.
void fill_slice_by_index(const Tensor& out, const Shape& full_shape, const Shape& block_offset,
                         const char* op, const std::function<double(uint64_t)>& draw);

// Internal: builds a tensor from f64 values (the from_vector implementation).
Tensor from_f64(const std::vector<double>& values, const Shape& shape, TensorOptions options);
Tensor from_i64(const std::vector<int64_t>& values, const Shape& shape, TensorOptions options);

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options) {
  if constexpr (std::is_integral_v<T>) {
    return from_i64(std::vector<int64_t>(values.begin(), values.end()), shape, options);
  } else {
    return from_f64(std::vector<double>(values.begin(), values.end()), shape, options);
  }
}

}  // namespace mt::runtime
