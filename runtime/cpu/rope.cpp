// CPU kernel of rope: OpenMP over (batch, token) rows; each row rotates H * head_dim / 2 pairs.
// f32 and bf16 rows go through vec_math.h's vectorised row_rope (bf16 widened to f32, one
// rounding per output: f32_rows.h), f64 through a plain loop.
#include "runtime/kernels/rope.h"

#include "runtime/cpu/f32_rows.h"
#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {
namespace {

template <class T>
void rope_impl(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset,
               bool inverse, Tensor& out) {
  using C = compute_t<T>;
  const int64_t seq = x.shape()[1], heads = x.shape()[2], half = x.shape()[3] / 2;
  const int64_t rows = x.shape()[0] * seq, row_size = heads * half * 2;
  const int64_t x_row_stride = x.stride(1);  // >= row_size (rope_reads_in_place)
  const T* xp = x.data<T>();
  T* op = out.data<T>();
  const C* cp = cos.data<C>();
  const C* sp = sin.data<C>();
  const C sign = inverse ? C(-1) : C(1);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(row_size, 1));
  if constexpr (kF32Rows<T>) {
    parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> x32 = row_buffer<T>(row_size), out32 = row_buffer<T>(row_size);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t pos = position_offset + r % seq;
        const float* xr = f32_row(xp + r * x_row_stride, row_size, x32);
        float* orow = f32_out(op + r * row_size, out32);
        for (int64_t h = 0; h < heads; ++h)
          row_rope(xr + h * half * 2, cp + pos * half, sp + pos * half, half, sign,
                   orow + h * half * 2);
        store_row(orow, row_size, op + r * row_size);
      }
    });
    return;
  }
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t pos = position_offset + r % seq;
      const C* cr = cp + pos * half;
      const C* sr = sp + pos * half;
      for (int64_t h = 0; h < heads; ++h) {
        const T* xr = xp + r * x_row_stride + h * half * 2;
        T* orow = op + r * row_size + h * half * 2;
        for (int64_t i = 0; i < half; ++i) {
          const C x0 = C(xr[2 * i]), x1 = C(xr[2 * i + 1]);
          const C c = cr[i], s = sign * sr[i];
          orow[2 * i] = T(x0 * c - x1 * s);
          orow[2 * i + 1] = T(x0 * s + x1 * c);
        }
      }
    }
  });
}

void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset,
          bool inverse, Tensor& out) {
  dispatch_floating(x.dtype(), "apply_rope", [&](auto tag) {
    rope_impl<decltype(tag)>(x, cos, sin, position_offset, inverse, out);
  });
}

}  // namespace

MT_REGISTER_KERNEL(rope_kernel, DeviceType::CPU, rope);

}  // namespace mt::runtime::cpu
