// The CUDA caching allocator (registered as the runtime's allocator for DeviceType::CUDA).
//
// Freed blocks are kept and handed out again to allocations of the same rounded size on the
// same stream, so a training loop that repeats its shapes calls cudaMalloc only in its first
// steps and never cudaFree. Sizes round up to 512 bytes below 1 MiB and to 2 MiB above.
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
