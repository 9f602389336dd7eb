// CPU copy (with dtype conversion; bf16 <-> f32 runs vectorised) and fill kernels.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "runtime/cpu/convert.h"
#include "runtime/cpu/loops.h"
#include "runtime/cpu/vec_math.h"
#include "runtime/kernels/copy.h"

namespace mt::runtime::cpu {
namespace {

// d[j * ds] = s[j * ss] for j in [0, n): bf16 <-> f32 runs with unit strides through the
// vectorised row conversions (the same values as convert<D>), the rest element by element.
template <class S, class D>
void convert_run(const S* s, int64_t ss, D* d, int64_t ds, int64_t n) {
  if constexpr (std::is_same_v<S, bfloat16> && std::is_same_v<D, float>) {
    if (ss == 1 && ds == 1) return row_bf16_to_f32(&s->bits, n, d);
  } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bfloat16>) {
    if (ss == 1 && ds == 1) return row_f32_to_bf16(s, n, &d->bits);
  }
  for (int64_t j = 0; j < n; ++j) d[j * ds] = convert<D>(s[j * ss]);
}

// A copy that is a transpose in its last two (coalesced) dims: one operand is contiguous along
// the innermost dim and the other along the one before it. The element loop would step across
// memory at every element on one side (a cache miss each: 13-67x slower than a contiguous copy
// of the same size), so this copies 64 x 64 tiles, whose rows stay in the cache on both sides.
// Returns false, copying nothing, for other layouts.
template <class S, class D>
bool copy_by_tiles(const S* s, D* d, const Shape& shape, const Shape& src_strides,
                   const Shape& dst_strides) {
  if (numel_of(shape) == 0) return false;
  const CoalescedLoop<2> loop = coalesce<2>(shape, {dst_strides, src_strides});
  const int64_t nd = int64_t(loop.shape.size());
  if (nd < 2) return false;
  const Shape& ds = loop.strides[0];
  const Shape& ss = loop.strides[1];
  const int64_t a = nd - 2, b = nd - 1;
  const int64_t dsa = ds[a], dsb = ds[b], ssa = ss[a], ssb = ss[b];  // in registers: d may alias
  // (a broadcast along the inner dim, stride 0, is a fast element loop already)
  const bool transposed = (dsb != 1 && dsb != 0 && dsa == 1) || (ssb != 1 && ssb != 0 && ssa == 1);
  if (!transposed) return false;
  constexpr int64_t kTile = 64;
  const int64_t rows = loop.shape[a], cols = loop.shape[b];
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t outer = numel_of(loop.shape) / (rows * cols);
  const int64_t tiles = outer * row_tiles * col_tiles;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (kTile * kTile));
  parallel_for(tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t ct = tile % col_tiles, rt = tile / col_tiles % row_tiles;
      int64_t rem = tile / col_tiles / row_tiles, d_off = 0, s_off = 0;
      for (int64_t k = a - 1; k >= 0; --k) {
        const int64_t idx = rem % loop.shape[k];
        rem /= loop.shape[k];
        d_off += idx * ds[k];
        s_off += idx * ss[k];
      }
      const int64_t r_end = std::min(rows, (rt + 1) * kTile);
      const int64_t c_end = std::min(cols, (ct + 1) * kTile);
      for (int64_t r = rt * kTile; r < r_end; ++r) {
        D* dr = d + d_off + r * dsa;
        const S* sr = s + s_off + r * ssa;
        for (int64_t c = ct * kTile; c < c_end; ++c) dr[c * dsb] = convert<D>(sr[c * ssb]);
      }
    }
  });
  return true;
}

void copy(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    const size_t nbytes = dst.nbytes();
    char* d = static_cast<char*>(dst.data_ptr());
    const char* s = static_cast<const char*>(src.data_ptr());
    parallel_for(int64_t(nbytes), kParallelGrain * 8, [&](int64_t b, int64_t e) {
      std::memcpy(d + b, s + b, size_t(e - b));
    });
    return;
  }
  dispatch_dtype(src.dtype(), "copy_", [&](auto src_tag) {
    using S = decltype(src_tag);
    dispatch_dtype(dst.dtype(), "copy_", [&](auto dst_tag) {
      using D = decltype(dst_tag);
      const S* s = static_cast<const S*>(src.data_ptr());
      D* d = static_cast<D*>(dst.data_ptr());
      if (copy_by_tiles(s, d, dst.shape(), src.strides(), dst.strides())) return;
      strided_loop<2>(dst.shape(), {dst.strides(), src.strides()},
                      [&](const std::array<int64_t, 2>& off, int64_t n,
                          const std::array<int64_t, 2>& st) {
                        convert_run(s + off[1], st[1], d + off[0], st[0], n);
                      });
    });
  });
}

void fill(const Tensor& dst, double value) {
  dispatch_dtype(dst.dtype(), "fill_", [&](auto tag) {
    using D = decltype(tag);
    const D v = convert<D>(value);
    D* d = static_cast<D*>(dst.data_ptr());
    strided_loop<1>(dst.shape(), {dst.strides()},
                    [&](const std::array<int64_t, 1>& off, int64_t n,
                        const std::array<int64_t, 1>& st) {
                      D* dp = d + off[0];
                      for (int64_t j = 0; j < n; ++j) dp[j * st[0]] = v;
                    });
  });
}

MT_REGISTER_KERNEL(copy_kernel, DeviceType::CPU, copy);
MT_REGISTER_KERNEL(fill_kernel, DeviceType::CPU, fill);

}  // namespace
}  // namespace mt::runtime::cpu
