#include "runtime/core/allocator.h"

#include <cstdlib>
#include <new>

#include "runtime/core/cpu_allocator.h"
#include "runtime/core/error.h"

namespace mt::runtime {

void MemoryCounter::add(int64_t nbytes) {
  const int64_t now = in_use_.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  allocs_.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryCounter::sub(int64_t nbytes) { in_use_.fetch_sub(nbytes, std::memory_order_relaxed); }

MemoryStats MemoryCounter::stats() const {
  MemoryStats s;
  s.bytes_in_use = in_use_.load(std::memory_order_relaxed);
  s.peak_bytes_in_use = peak_.load(std::memory_order_relaxed);
  s.bytes_reserved = s.bytes_in_use;
  s.num_allocs = allocs_.load(std::memory_order_relaxed);
  return s;
}

void MemoryCounter::reset_peak() { peak_.store(in_use_.load(std::memory_order_relaxed)); }

namespace {

Allocator* g_allocators[kNumDeviceTypes] = {};

}  // namespace

Allocator& allocator_for(DeviceType type) {
  if (type == DeviceType::CPU) return cpu_allocator();
  Allocator* a = g_allocators[int(type)];
  MT_CHECK(a != nullptr, "no allocator for device type ", device_type_name(type),
           (cuda_backend_built() ? " (no GPU initialised)" : " (this build has no CUDA backend)"));
  return *a;
}

void set_allocator(DeviceType type, Allocator* allocator) { g_allocators[int(type)] = allocator; }

namespace {
PinnedHostAllocator* g_pinned_host_allocator = nullptr;
}  // namespace

PinnedHostAllocator* pinned_host_allocator() { return g_pinned_host_allocator; }
void set_pinned_host_allocator(PinnedHostAllocator* allocator) {
  g_pinned_host_allocator = allocator;
}

MemoryStats memory_stats(Device device) { return allocator_for(device.type).stats(device); }
void reset_peak_memory(Device device) { allocator_for(device.type).reset_peak(device); }
void empty_cache(Device device) { allocator_for(device.type).empty_cache(device); }

}  // namespace mt::runtime
