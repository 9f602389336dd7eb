// CUDA caching allocator: see caching_allocator.h.
#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/context.h"

namespace mt::runtime::cuda {
namespace {

constexpr size_t kSmallLimit = size_t(1) << 20;
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t(2) << 20;

size_t round_size(size_t n) {
  if (n == 0) n = 1;
  const size_t r = n < kSmallLimit ? kSmallRound : kLargeRound;
  return (n + r - 1) / r * r;
}

struct Block {
  size_t size = 0;
  cudaStream_t stream = nullptr;
  std::vector<cudaStream_t> other_streams;  // from record_stream
  std::vector<cudaEvent_t> pending;         // events on other_streams recorded at free
};

class CachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override {
    const size_t size = round_size(nbytes);
    cudaStream_t stream = current_stream();
    std::lock_guard lock(mutex_);
    check_device(device);
    release_completed_pending();
    size_t block_size = size;
    void* ptr = take_cached(size, stream, &block_size);
    if (ptr == nullptr) ptr = malloc_or_retry(size, nbytes, device);
    Block& b = live_[ptr];
    b.size = block_size;
    b.stream = stream;
    b.other_streams.clear();
    counter_.add(int64_t(block_size));  // deallocate subtracts the whole block, maybe > size
    return ptr;
  }

  void deallocate(void* ptr, size_t, Device) override {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours: never happens unless memory is corrupt
    Block b = std::move(it->second);
    live_.erase(it);
    counter_.sub(int64_t(b.size));
    if (b.other_streams.empty()) {
      free_[b.stream].emplace(b.size, ptr);
      return;
    }
    // Called from ~Storage (noexcept): no throwing here. Should an event fail (e.g. a recorded
    // stream already destroyed), wait for the whole device instead and reuse the block at once.
    bool events_ok = true;
    for (cudaStream_t s : b.other_streams) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventRecord(e, s) != cudaSuccess) {
        if (e != nullptr) (void)cudaEventDestroy(e);
        events_ok = false;
        break;
      }
      b.pending.push_back(e);
    }
    b.other_streams.clear();
    if (!events_ok) {
      (void)cudaGetLastError();
      (void)cudaDeviceSynchronize();
      for (cudaEvent_t e : b.pending) (void)cudaEventDestroy(e);
      free_[b.stream].emplace(b.size, ptr);
      return;
    }
    pending_.emplace(ptr, std::move(b));
  }

  MemoryStats stats(Device) const override {
    std::lock_guard lock(mutex_);
    return stats_locked();
  }
  MemoryStats stats_locked() const {
    MemoryStats s = counter_.stats();
    s.bytes_reserved = reserved_;
    return s;
  }
  void reset_peak(Device) override { counter_.reset_peak(); }

  void record_stream(void* ptr, cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    MT_CHECK(it != live_.end(), "record_stream: memory not from the CUDA caching allocator");
    Block& b = it->second;
    if (stream == b.stream) return;
    for (cudaStream_t s : b.other_streams)
      if (s == stream) return;
    b.other_streams.push_back(stream);
  }

  void empty_cache(Device) override {
    std::lock_guard lock(mutex_);
    // Freed blocks may still be read by queued kernels of their stream: wait for the device.
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    release_completed_pending();
    release_free_blocks();
  }

 private:
  void check_device(Device device) {
    const int current = current_device();
    MT_CHECK(device.index == current, "allocating on ", device, " while the current device is cuda:",
             current, " (runtime::set_current_device picks it)");
  }

  // The smallest free block on `stream` of at least `size` (rounded) bytes that wastes at most a
  // quarter of it or one large rounding unit, or null; *block_size gets its size. Sizes that
  // change every step (MoE routing) reuse blocks instead of growing the cache until cudaMalloc
  // fails (which costs a device synchronisation and a flush of the cache). A small request
  // (< 1 MiB) takes a block at most twice its size: a 0-D loss must not hold a 2 MiB block
  // that the next large request then has to cudaMalloc again.
  void* take_cached(size_t size, cudaStream_t stream, size_t* block_size) {
    auto pool = free_.find(stream);
    if (pool == free_.end()) return nullptr;
    auto it = pool->second.lower_bound(size);
    const size_t limit =
        size < kSmallLimit ? 2 * size : std::max(size + size / 4, size + kLargeRound);
    if (it == pool->second.end() || it->first > limit) return nullptr;
    void* ptr = it->second;
    *block_size = it->first;
    pool->second.erase(it);
    return ptr;
  }

  void* malloc_or_retry(size_t size, size_t requested, Device device) {
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, size) != cudaSuccess) {
      (void)cudaGetLastError();
      MT_CUDA_CHECK(cudaDeviceSynchronize());
      release_completed_pending();
      release_free_blocks();
      if (cudaMalloc(&ptr, size) != cudaSuccess) {
        (void)cudaGetLastError();
        size_t free_bytes = 0, total_bytes = 0;
        (void)cudaMemGetInfo(&free_bytes, &total_bytes);
        const MemoryStats s = stats_locked();
        throw ::mt::OutOfMemoryError(::mt::detail::concat(
            "CUDA out of memory on ", device, ": tried to allocate ", mib(requested),
            " MiB; in use by tensors ", mib(size_t(s.bytes_in_use)), " MiB, reserved ",
            mib(size_t(reserved_)), " MiB, free on the device ", mib(free_bytes), " of ",
            mib(total_bytes), " MiB"));
      }
    }
    reserved_ += int64_t(size);
    return ptr;
  }

  // "4194304", "12.50": whole MiB from 10 MiB up, two decimals below.
  static std::string mib(size_t b) {
    const double m = double(b) / double(1 << 20);
    char text[32];
    std::snprintf(text, sizeof text, "%.*f", m >= 10 ? 0 : 2, m);
    return text;
  }

  void release_completed_pending() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      Block& b = it->second;
      bool done = true;
      for (cudaEvent_t e : b.pending) {
        const cudaError_t st = cudaEventQuery(e);
        if (st == cudaErrorNotReady) {
          (void)cudaGetLastError();
          done = false;
          break;
        }
        MT_CUDA_CHECK(st);
      }
      if (!done) {
        ++it;
        continue;
      }
      for (cudaEvent_t e : b.pending) MT_CUDA_CHECK(cudaEventDestroy(e));
      free_[b.stream].emplace(b.size, it->first);
      it = pending_.erase(it);
    }
  }

  void release_free_blocks() {
    for (auto& [stream, pool] : free_) {
      for (auto& [size, ptr] : pool) {
        MT_CUDA_CHECK(cudaFree(ptr));
        reserved_ -= int64_t(size);
      }
      pool.clear();
    }
  }

  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::unordered_map<void*, Block> pending_;
  std::unordered_map<cudaStream_t, std::multimap<size_t, void*>> free_;
  MemoryCounter counter_;
  int64_t reserved_ = 0;
};

CachingAllocator& caching_allocator() {
  static CachingAllocator* a = new CachingAllocator();  // outlives static tensors
  return *a;
}

const bool g_registered = [] {
  set_allocator(DeviceType::CUDA, &caching_allocator());
  return true;
}();

}  // namespace

void record_stream(const Tensor& t, cudaStream_t stream) {
  caching_allocator().record_stream(t.storage()->data(), stream);
}

void empty_cache() { caching_allocator().empty_cache(Device::cuda(current_device())); }

}  // namespace mt::runtime::cuda
