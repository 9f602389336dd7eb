#include "runtime/core/cpu_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "runtime/core/error.h"

namespace mt::runtime {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheBlocks = false;
#else
constexpr bool kCacheBlocks = true;
#endif

class CachingCpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kMinCachedBytes = size_t(64) << 10;
  static constexpr int64_t kMinIdleLimit = int64_t(64) << 20;

  void* allocate(size_t nbytes, Device) override {
    const size_t size = block_size(nbytes);
    void* p = kCacheBlocks && size >= kMinCachedBytes ? take_idle(size) : nullptr;
    if (p == nullptr) p = fresh_block(size, nbytes);
    counter_.add(int64_t(nbytes));
    return p;
  }

  void deallocate(void* ptr, size_t nbytes, Device) override {
    counter_.sub(int64_t(nbytes));
    const size_t size = block_size(nbytes);
    if (kCacheBlocks && size >= kMinCachedBytes) {
      std::lock_guard lock(mutex_);
      const int64_t limit = std::max(kMinIdleLimit, counter_.stats().peak_bytes_in_use);
      if (idle_bytes_ + int64_t(size) <= limit) {
        try {
          idle_[size].push_back(ptr);
          idle_bytes_ += int64_t(size);
          return;
        } catch (const std::bad_alloc&) {  // no room to remember it: free it (never throw here)
        }
      }
    }
    release(ptr, size);
  }

  MemoryStats stats(Device) const override {
    MemoryStats s = counter_.stats();
    std::lock_guard lock(mutex_);
    s.bytes_reserved = reserved_bytes_;
    return s;
  }
  void reset_peak(Device) override { counter_.reset_peak(); }

  void empty_cache(Device) override {
    std::lock_guard lock(mutex_);
    release_idle_locked();
  }

 private:
  // 64-byte multiples; from 64 KiB up, eight size classes per power of two.
  static size_t block_size(size_t nbytes) {
    const size_t aligned = (std::max<size_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    if (aligned < kMinCachedBytes) return aligned;
    const size_t step = std::bit_floor(aligned) / 8;
    return (aligned + step - 1) / step * step;
  }

  void* take_idle(size_t size) {
    std::lock_guard lock(mutex_);
    auto it = idle_.find(size);
    if (it == idle_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    idle_bytes_ -= int64_t(size);
    return p;
  }

  void* fresh_block(size_t size, size_t nbytes) {
    void* p = std::aligned_alloc(kAlignment, size);
    if (p == nullptr) {  // idle blocks of other sizes may be what stands in the way
      empty_cache(Device::cpu());
      p = std::aligned_alloc(kAlignment, size);
    }
    if (p == nullptr) {
      throw ::mt::OutOfMemoryError(
          ::mt::detail::concat("cpu allocator: out of memory allocating ", nbytes, " bytes"));
    }
    std::lock_guard lock(mutex_);
    reserved_bytes_ += int64_t(size);
    return p;
  }

  void release(void* ptr, size_t size) {
    std::free(ptr);
    std::lock_guard lock(mutex_);
    reserved_bytes_ -= int64_t(size);
  }

  void release_idle_locked() {
    for (auto& [size, blocks] : idle_) {
      for (void* p : blocks) std::free(p);
      reserved_bytes_ -= int64_t(size * blocks.size());
    }
    idle_.clear();
    idle_bytes_ = 0;
  }

  MemoryCounter counter_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> idle_;  // by block size
  int64_t idle_bytes_ = 0;
  int64_t reserved_bytes_ = 0;  // blocks from the system, in use or idle
};

}  // namespace

Allocator& cpu_allocator() {
  static auto* a = new CachingCpuAllocator();  // never destroyed: tensors may outlive statics
  return *a;
}

bool cpu_allocator_caches_blocks() { return kCacheBlocks; }

}  // namespace mt::runtime
