// The CUDA caching allocator (registered as the runtime's allocator for DeviceType::CUDA).
//
// Freed blocks are kept and handed out again on the same stream to allocations they fit (the
// smallest free block of at least the rounded size, wasting at most a quarter of it or 2 MiB;
// below 1 MiB at most the size again),
// so a training loop calls cudaMalloc only in its first steps and never cudaFree, even when some
// sizes change every step (MoE routing). Sizes round up to 512 bytes below 1 MiB and to 2 MiB
// above. Memory stats count a block's whole size.
//
// Streams: a block belongs to the stream that was current when it was allocated, and work on that
// stream is ordered, so it can be reused as soon as it is freed. A block that another stream also
// used (an NCCL buffer, say) must be marked with record_stream(); when it is freed, it waits for
// that stream's work (an event) before it can be handed out again.
//
// When cudaMalloc fails, the cached free blocks are released and the allocation retried once;
// then it throws an out-of-memory error with the device's numbers.
#pragma once

#include <cuda_runtime.h>

#include "runtime/core/tensor.h"

namespace mt::runtime::cuda {

// Marks t's memory as used by `stream` (see above).
void record_stream(const Tensor& t, cudaStream_t stream);
// Returns the cached free blocks of the current device to the driver.
void empty_cache();

}  // namespace mt::runtime::cuda
