// The CPU allocator behind Tensor::empty on the host: 64-byte aligned blocks. Blocks of 64 KiB
// and more are cached by size class (eight classes per doubling, so at most 12.5% rounding) and
// handed out again rather than returned to the system. A large block from malloc is freshly
// mapped memory that the kernel faults in, zeroing it page by page, on first touch, in every step
// that allocates it again; a cached block is already mapped. Idle cached bytes are capped at the
// peak bytes in use (at least 64 MiB), and runtime::empty_cache(Device::cpu()) returns them all.
// Under AddressSanitizer nothing is cached, so a use after free stays visible.
#pragma once

#include "runtime/core/allocator.h"

namespace mt::runtime {

Allocator& cpu_allocator();

// Whether freed large blocks are kept for reuse (false under AddressSanitizer).
bool cpu_allocator_caches_blocks();

}  // namespace mt::runtime
