// Device-side validation whose verdict the host reads later (runtime/core/deferred_errors.h).
// A verdict is a device buffer of two u64: the first bad position (kNoBadElement while none),
// then that element's value. Kernels mark bad positions with mark_bad; defer_verdict_of records
// the value and queues the verdict; the host never waits for it.
#pragma once

#include "runtime/core/deferred_errors.h"
#include "runtime/cuda/loops.cuh"

namespace mt::runtime::cuda {

inline constexpr unsigned long long kNoBadElement = ~0ull;

// A verdict on the current device and stream: no bad element yet.
Tensor new_verdict();

// Marks position i bad: the smallest marked position wins.
__device__ inline void mark_bad(unsigned long long* verdict, int64_t i) {
  atomicMin(verdict, static_cast<unsigned long long>(i));
}

// Queues the verdict for the host (a copy into pinned memory and an event on current_stream()).
void queue_verdict(const Tensor& verdict, BadElementMessage message);

template <class I>
__global__ void record_bad_value(const I* values, unsigned long long* verdict) {
  if (verdict[0] != kNoBadElement)
    verdict[1] = static_cast<unsigned long long>(static_cast<long long>(values[verdict[0]]));
}

// After the kernels that mark `verdict`: records the value of the first bad element of `values`
// (the tensor the positions index) and queues the verdict with `message`.
template <class I>
void defer_verdict_of(const Tensor& verdict, const I* values, BadElementMessage message) {
  record_bad_value<I><<<1, 1, 0, current_stream()>>>(values, ptr<unsigned long long>(verdict));
  MT_CUDA_CHECK_LAUNCH();
  queue_verdict(verdict, std::move(message));
}

}  // namespace mt::runtime::cuda
