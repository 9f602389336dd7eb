// Device memory: one Allocator per device type, with per-device accounting of bytes in use and
// peak, which the training metrics read. The CPU allocator hands out 64-byte aligned blocks.
// The CUDA backend registers its caching allocator with set_allocator().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "runtime/core/device.h"

namespace mt::runtime {

struct MemoryStats {
  int64_t bytes_in_use = 0;
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_reserved = 0;  // held by a caching allocator (== in use for the CPU)
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

MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
// Hands the device's cached free blocks back to the driver (bytes_reserved falls to what is in
// use), as torch.cuda.empty_cache(): for another process on the same GPU, or before a large
// allocation outside the allocator. Waits for the device.
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
