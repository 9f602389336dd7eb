// CPU kernel of dropout: OpenMP over element ranges; the mask bit of element i is a function of
// (key, i) only.
#include "runtime/kernels/dropout.h"

#include "runtime/cpu/loops.h"

namespace mt::runtime::cpu {
namespace {

template <class T>
void dropout_impl(const Tensor& x, double p, const RandomKey& key, Tensor& out) {
  using C = compute_t<T>;
  const T* xp = x.data<T>();
  T* op = out.data<T>();
  const C keep_scale = C(1.0 / (1.0 - p));
  parallel_for(x.numel(), kParallelGrain / 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      op[i] = uniform_at(key, uint64_t(i)) < p ? T(C(0)) : T(C(xp[i]) * keep_scale);
  });
}

void dropout(const Tensor& x, double p, const RandomKey& key, Tensor& out) {
  dispatch_floating(x.dtype(), "dropout",
                    [&](auto tag) { dropout_impl<decltype(tag)>(x, p, key, out); });
}

}  // namespace

MT_REGISTER_KERNEL(dropout_kernel, DeviceType::CPU, dropout);

}  // namespace mt::runtime::cpu
