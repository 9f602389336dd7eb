// CPU copy (with dtype conversion) and fill kernels.
#include <cstring>

#include "runtime/cpu/convert.h"
#include "runtime/cpu/loops.h"
#include "runtime/kernels/copy.h"

namespace mt::runtime::cpu {
namespace {

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
      strided_loop<2>(dst.shape(), {dst.strides(), src.strides()},
                      [&](const std::array<int64_t, 2>& off, int64_t n,
                          const std::array<int64_t, 2>& st) {
                        D* dp = d + off[0];
                        const S* sp = s + off[1];
                        for (int64_t j = 0; j < n; ++j) dp[j * st[0]] = convert<D>(sp[j * st[1]]);
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
