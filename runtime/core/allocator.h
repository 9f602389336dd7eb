// Device memory: one Allocator per device type, with per-device accounting of bytes in use and
// peak, which the training metrics read. The CPU allocator (cpu_allocator.h) hands out 64-byte
// aligned blocks and caches the large ones.
// The CUDA backend registers its caching allocator with set_allocator(), and its page-locked host
// allocator with set_pinned_host_allocator().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "runtime/core/device.h"

namespace mt::runtime {

struct MemoryStats {
  int64_t bytes_in_use = 0;
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_reserved = 0;  // held from the system: in use, or cached for reuse
  int64_t num_allocs = 0;      // allocations served since start
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, Device device) = 0;
  virtual MemoryStats stats(Device device) const = 0;
  virtual void reset_peak(Device device) = 0;
  // Returns cached free memory to the system (a caching allocator); others hold none.
  virtual void empty_cache(Device) {}
};

Allocator& allocator_for(DeviceType type);  // throws when the backend is not built/registered
void set_allocator(DeviceType type, Allocator* allocator);

// Page-locked ("pinned") host memory, for host tensors a GPU copies from while the host goes on
// (Tensor::pin_memory, Tensor::to(device, non_blocking)). A block that a queued copy reads is not
// handed out again before that copy has run, however early its tensor is freed.
class PinnedHostAllocator : public Allocator {
 public:
  // A copy just queued on `device`'s current stream reads `block` (a pointer this allocator
  // returned): the block waits for that copy before it can be reused.
  virtual void record_use(void* block, Device device) = 0;
};
// Null without the CUDA backend or without a GPU.
PinnedHostAllocator* pinned_host_allocator();
void set_pinned_host_allocator(PinnedHostAllocator* allocator);

MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
// Hands the device's cached free blocks back to the driver, or to the system for the CPU
// (bytes_reserved falls to what is in use), as torch.cuda.empty_cache(): for another process on
// the same GPU, or before a large allocation outside the allocator. Waits for the device.
void empty_cache(Device device);

// Counters shared by allocators: lock-free in-use/peak tracking.
class MemoryCounter {
 public:
  void add(int64_t nbytes);
  void sub(int64_t nbytes);
  MemoryStats stats() const;
  void reset_peak();

 private:
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocs_{0};
};

}  // namespace mt::runtime
