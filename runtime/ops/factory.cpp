#include "runtime/ops/factory.h"

#include <cmath>

#include "runtime/cpu/convert.h"
#include "runtime/cpu/loops.h"

namespace mt::runtime {

Tensor empty(const Shape& shape, TensorOptions options) { return Tensor::empty(shape, options); }

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }

Tensor full(const Shape& shape, double value, TensorOptions options) {
  const bool requires_grad = options.requires_grad;
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  t.fill_(value);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.options()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.options()); }

Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  MT_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
           "arange: invalid range start=", start, " end=", end, " step=", step);
  const int64_t n = std::max<int64_t>(0, int64_t(std::ceil((end - start) / step)));
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = start + double(i) * step;
  return from_f64(values, {n}, options);
}

Tensor arange(int64_t end, TensorOptions options) { return arange(0.0, double(end), 1.0, options); }

namespace {
// Writes values(i) for every element i (row-major) of a tensor staged on the host, then moved to
// options.device: staged in pinned memory where there is some, so the host-to-device copy is
// queued and the host goes on (the MoE router and the sampler make index tensors this way).
template <class Get>
Tensor build_host(const Shape& shape, TensorOptions options, Get get) {
  const bool on_host = options.device.is_cpu();
  const TensorOptions host = TensorOptions{}.with_dtype(options.dtype);
  Tensor t = !on_host && pinned_host_allocator() != nullptr
                 ? Tensor::empty_pinned(shape, options.dtype)
                 : Tensor::empty(shape, host);
  dispatch_dtype(t.dtype(), "from_vector", [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    cpu::parallel_for(t.numel(), cpu::kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = get(i, tag);
    });
  });
  if (!on_host) t = t.to(options.device, /*non_blocking=*/true);
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}
}  // namespace

Tensor from_f64(const std::vector<double>& values, const Shape& shape, TensorOptions options) {
  MT_CHECK(int64_t(values.size()) == numel_of(shape), "from_vector: ", values.size(),
           " values for shape ", shape);
  return build_host(shape, options, [&](int64_t i, auto tag) {
    return cpu::convert<decltype(tag)>(values[size_t(i)]);
  });
}

Tensor from_i64(const std::vector<int64_t>& values, const Shape& shape, TensorOptions options) {
  MT_CHECK(int64_t(values.size()) == numel_of(shape), "from_vector: ", values.size(),
           " values for shape ", shape);
  return build_host(shape, options, [&](int64_t i, auto tag) {
    return cpu::convert<decltype(tag)>(values[size_t(i)]);
  });
}

namespace {
template <class Draw>
void fill_random_slice(const Tensor& out, const Shape& full_shape, const Shape& block_offset,
                       const char* op, Draw draw) {
  MT_CHECK(out.device().is_cpu(), op, ": only cpu tensors for now");
  MT_CHECK(is_floating(out.dtype()), op, ": expected a floating tensor, got ", out.dtype());
  MT_CHECK(full_shape.size() == size_t(out.dim()) && block_offset.size() == full_shape.size(), op,
           ": block of shape ", out.shape(), " at ", block_offset, " does not match full shape ",
           full_shape);
  for (size_t d = 0; d < full_shape.size(); ++d)
    MT_CHECK(block_offset[d] >= 0 && block_offset[d] + out.shape()[d] <= full_shape[d], op,
             ": block of shape ", out.shape(), " at offset ", block_offset,
             " exceeds the full shape ", full_shape);
  const Shape full_strides = contiguous_strides(full_shape);
  const int64_t nd = out.dim();
  dispatch_floating(out.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    T* base = static_cast<T*>(out.data_ptr());
    cpu::parallel_for(out.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int64_t rem = i, global = 0, local = 0;
        for (int64_t d = nd - 1; d >= 0; --d) {
          const int64_t idx = rem % out.shape()[d];
          rem /= out.shape()[d];
          global += (idx + block_offset[d]) * full_strides[d];
          local += idx * out.strides()[d];
        }
        base[local] = cpu::convert<T>(draw(uint64_t(global)));
      }
    });
  });
  out.bump_version();
}
}  // namespace

void fill_slice_by_index(const Tensor& out, const Shape& full_shape, const Shape& block_offset,
                         const char* op, const std::function<double(uint64_t)>& draw) {
  fill_random_slice(out, full_shape, block_offset, op, draw);
}

void fill_normal_slice(const Tensor& out, const Shape& full_shape, const Shape& block_offset,
                       const RandomKey& key, double mean, double std) {
  fill_random_slice(out, full_shape, block_offset, "randn",
                    [&](uint64_t i) { return mean + std * normal_at(key, i); });
}

void fill_uniform_slice(const Tensor& out, const Shape& full_shape, const Shape& block_offset,
                        const RandomKey& key, double low, double high) {
  fill_random_slice(out, full_shape, block_offset, "rand",
                    [&](uint64_t i) { return low + (high - low) * uniform_at(key, i); });
}

Tensor randn(const Shape& shape, const RandomKey& key, TensorOptions options, double mean,
             double std) {
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  fill_normal_slice(t, shape, Shape(shape.size(), 0), key, mean, std);
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor rand(const Shape& shape, const RandomKey& key, TensorOptions options, double low,
            double high) {
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  fill_uniform_slice(t, shape, Shape(shape.size(), 0), key, low, high);
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

}  // namespace mt::runtime
