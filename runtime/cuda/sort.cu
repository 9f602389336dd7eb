// CUDA sort / top-k (runtime/kernels/sort.h) through cub's segmented radix sort, one segment per
// line along `dim`. Values become unsigned keys whose order is the kernel's total order: floats
// by their sign-flipped bits with -0 folded onto +0 and every NaN onto the largest key, integers
// with the sign bit flipped; descending sorts the complemented keys. Radix sort is stable, so
// equal values keep increasing positions in both directions, as the CPU's order requires. The
// first k of each sorted line are written out, values read back from x (bit for bit).
#include <cub/device/device_segmented_radix_sort.cuh>

#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/sort.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

template <class T>
using KeyOf = std::conditional_t<sizeof(T) == 8, unsigned long long, uint32_t>;

template <class T>
__device__ inline KeyOf<T> sort_key(T v, bool descending) {
  using K = KeyOf<T>;
  using C = acc_t<T>;
  K key;
  if constexpr (std::is_same_v<T, bool>) {
    key = v ? 1u : 0u;
  } else if constexpr (std::is_integral_v<T>) {
    key = K(v) ^ (K(1) << (8 * sizeof(K) - 1));
  } else {
    C c = C(v);
    if (c != c) {
      key = ~K(0);  // every NaN: above every number
    } else {
      if (c == C(0)) c = C(0);  // -0 sorts with +0
      K bits;
      if constexpr (sizeof(C) == 8) {
        bits = K(__double_as_longlong(c));
      } else {
        bits = K(__float_as_uint(c));
      }
      const K sign = K(1) << (8 * sizeof(K) - 1);
      key = (bits & sign) ? ~bits : (bits | sign);
    }
  }
  return descending ? ~key : key;
}

void sort(const Tensor& x, int64_t dim, int64_t k, bool descending, Tensor& values,
          Tensor& indices) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &values, &indices})
    check_on_current_device(*t, "sort");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < dim) outer *= x.size(d);
    if (d > dim) inner *= x.size(d);
  }
  const int64_t n = x.size(dim), lines = outer * inner;
  if (k == 0 || lines == 0) return;
  MT_CHECK(lines * n < (int64_t(1) << 31) && lines < (int64_t(1) << 31),
           "sort: the CUDA kernel sorts at most 2^31 - 1 elements, got shape ", x.shape());
  const TensorOptions i32 = x.options().with_dtype(DType::I32);
  const TensorOptions i64 = x.options().with_dtype(DType::I64);
  MT_CUDA_DISPATCH_ALL(x.dtype(), "sort", T, [&] {
    using K = KeyOf<T>;
    const DType key_dtype = sizeof(K) == 8 ? DType::I64 : DType::I32;
    Tensor keys_in = empty({lines * n}, x.options().with_dtype(key_dtype));
    Tensor keys_out = empty({lines * n}, x.options().with_dtype(key_dtype));
    Tensor pos_in = empty({lines * n}, i32), pos_out = empty({lines * n}, i32);
    Tensor offsets = empty({lines + 1}, i32);
    const T* xp = ptr<T>(x);
    K* kin = static_cast<K*>(keys_in.data_ptr());
    int32_t* pin = ptr<int32_t>(pos_in);
    int32_t* op = ptr<int32_t>(offsets);
    // Line l = (o, j) holds x[o, :, j] at keys[l * n + i].
    launch_linear(lines * n, [=] __device__(int64_t e) {
      const int64_t l = e / n, i = e % n, o = l / inner, j = l % inner;
      kin[e] = sort_key(xp[(o * n + i) * inner + j], descending);
      pin[e] = int32_t(i);
    });
    launch_linear(lines + 1, [=] __device__(int64_t l) { op[l] = int32_t(l * n); });
    K* kout = static_cast<K*>(keys_out.data_ptr());
    int32_t* pout = ptr<int32_t>(pos_out);
    size_t temp_bytes = 0;
    MT_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(
        nullptr, temp_bytes, kin, kout, pin, pout, int(lines * n), int(lines), op, op + 1, 0,
        int(8 * sizeof(K)), current_stream()));
    Tensor temp = empty({int64_t(temp_bytes / 8 + 1)}, i64);
    MT_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(
        temp.data_ptr(), temp_bytes, kin, kout, pin, pout, int(lines * n), int(lines), op, op + 1,
        0, int(8 * sizeof(K)), current_stream()));
    T* vp = ptr<T>(values);
    int64_t* ip = ptr<int64_t>(indices);
    launch_linear(lines * k, [=] __device__(int64_t e) {
      const int64_t l = e / k, i = e % k, o = l / inner, j = l % inner;
      const int64_t pos = pout[l * n + i];
      vp[(o * k + i) * inner + j] = xp[(o * n + pos) * inner + j];
      ip[(o * k + i) * inner + j] = pos;
    });
  });
}

MT_REGISTER_KERNEL(sort_kernel, DeviceType::CUDA, sort);

}  // namespace
}  // namespace mt::runtime::cuda
