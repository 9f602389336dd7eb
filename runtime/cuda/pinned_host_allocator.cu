// Page-locked host memory (runtime::PinnedHostAllocator, see runtime/core/allocator.h) from
// cudaHostAlloc, cached: pinning pages is slow (it maps them for the device), so freed blocks are
// kept and handed out again, as PyTorch's CachingHostAllocator does.
//
// Sizes round up to a power of two (at least 4 KiB) and a request takes a free block of exactly
// its rounded size. A block that queued copies read (record_use: an event on the copy's stream)
// goes back to the free list only when those events have completed; freeing its tensor earlier
// is safe. When cudaHostAlloc fails, the free blocks are released and the allocation is retried
// once. Memory stats count requested bytes in use and the blocks' sizes reserved.
#include <bit>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/cuda/context.h"

namespace mt::runtime::cuda {
namespace {

constexpr size_t kMinBlock = size_t(4) << 10;

class CachingPinnedHostAllocator final : public PinnedHostAllocator {
 public:
  void* allocate(size_t nbytes, Device) override {
    const size_t size = std::bit_ceil(std::max(nbytes, kMinBlock));
    std::lock_guard lock(mutex_);
    collect_finished_uses();
    void* ptr = nullptr;
    if (auto it = free_.find(size); it != free_.end()) {
      ptr = it->second;
      free_.erase(it);
    } else {
      ptr = host_alloc_or_retry(size, nbytes);
    }
    Block& b = blocks_[ptr];
    b.size = size;
    b.live = true;
    counter_.add(int64_t(nbytes));
    return ptr;
  }

  // From ~Storage (noexcept): nothing here throws.
  void deallocate(void* ptr, size_t nbytes, Device) override {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) return;  // not ours: never happens unless memory is corrupt
    counter_.sub(int64_t(nbytes));
    it->second.live = false;
    if (it->second.uses.empty()) {
      free_.emplace(it->second.size, ptr);
    } else {
      awaiting_.push_back(ptr);
    }
  }

  void record_use(void* block, Device device) override {
    MT_CHECK(device.is_cuda() && device.index == current_device(), "record_use: a copy on ",
             device, " while the current device is cuda:", current_device());
    cudaStream_t stream = current_stream();  // before our lock: it takes the context's
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(block);
    MT_CHECK(it != blocks_.end() && it->second.live,
             "record_use: not a live block of the pinned host allocator");
    cudaEvent_t e = nullptr;
    if (!spare_events_.empty()) {
      e = spare_events_.back();
      spare_events_.pop_back();
    } else {
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    it->second.uses.push_back(e);  // before the record: a failed record still returns e below
    MT_CUDA_CHECK(cudaEventRecord(e, stream));
  }

  MemoryStats stats(Device) const override {
    std::lock_guard lock(mutex_);
    MemoryStats s = counter_.stats();
    s.bytes_reserved = reserved_;
    return s;
  }
  void reset_peak(Device) override { counter_.reset_peak(); }

  void empty_cache(Device) override {
    std::lock_guard lock(mutex_);
    collect_finished_uses();
    release_free_blocks();
  }

 private:
  struct Block {
    size_t size = 0;
    bool live = false;               // a tensor holds it
    std::vector<cudaEvent_t> uses;   // copies queued from it that may not have run yet
  };

  // Drops the completed uses of every block; freed blocks with none left become free.
  void collect_finished_uses() {
    for (auto& [ptr, b] : blocks_) {
      for (size_t i = 0; i < b.uses.size();) {
        const cudaError_t st = cudaEventQuery(b.uses[i]);
        if (st == cudaErrorNotReady) {
          (void)cudaGetLastError();  // not a failure: leave no error for the next launch check
          ++i;
          continue;
        }
        MT_CUDA_CHECK(st);
        spare_events_.push_back(b.uses[i]);
        b.uses[i] = b.uses.back();
        b.uses.pop_back();
      }
    }
    for (size_t i = 0; i < awaiting_.size();) {
      Block& b = blocks_.at(awaiting_[i]);
      if (!b.uses.empty()) {
        ++i;
        continue;
      }
      free_.emplace(b.size, awaiting_[i]);
      awaiting_[i] = awaiting_.back();
      awaiting_.pop_back();
    }
  }

  void* host_alloc_or_retry(size_t size, size_t requested) {
    void* ptr = nullptr;
    if (cudaHostAlloc(&ptr, size, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      release_free_blocks();
      if (cudaHostAlloc(&ptr, size, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        MT_FAIL("pinned host memory: cudaHostAlloc of ", size, " bytes (for ", requested,
                ") failed with ", reserved_, " bytes already pinned; the host may be out of "
                "memory or limit locked pages (ulimit -l)");
      }
    }
    reserved_ += int64_t(size);
    return ptr;
  }

  void release_free_blocks() {
    for (auto& [size, ptr] : free_) {
      MT_CUDA_CHECK(cudaFreeHost(ptr));
      reserved_ -= int64_t(size);
      blocks_.erase(ptr);
    }
    free_.clear();
  }

  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;  // every block, live, awaiting or free
  std::multimap<size_t, void*> free_;        // by size
  std::vector<void*> awaiting_;              // freed, with copies from them still queued
  std::vector<cudaEvent_t> spare_events_;
  MemoryCounter counter_;
  int64_t reserved_ = 0;
};

const bool g_registered = [] {
  if (device_count() > 0) {
    static auto* allocator = new CachingPinnedHostAllocator();  // outlives static tensors
    set_pinned_host_allocator(allocator);
  }
  return true;
}();

}  // namespace
}  // namespace mt::runtime::cuda
