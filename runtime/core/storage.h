// Storage: one allocation of device memory, shared (by shared_ptr) among a tensor and its views.
//
// FSDP frees an unsharded parameter's memory between its uses while tensors saved for backward
// still refer to it: release_memory() returns the bytes to the allocator (data() is null until
// restore_memory() allocates them again; the contents are then undefined until written).
// Host memory comes from the CPU allocator, or page-locked from the pinned host allocator.
// Each storage has an id unique in the process (traces name tensors by it: an address may be
// reused by the allocator, an id never is).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/core/allocator.h"
#include "runtime/core/device.h"

namespace mt::runtime {

class Storage {
 public:
  Storage(size_t nbytes, Device device) : Storage(nbytes, device, allocator_for(device.type)) {}
  Storage(size_t nbytes, Device device, Allocator& allocator)
      : allocator_(&allocator),
        data_(allocator.allocate(nbytes, device)),
        nbytes_(nbytes),
        device_(device),
        id_(next_id()) {}
  ~Storage() { release_memory(); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint64_t id() const { return id_; }
  bool has_memory() const { return data_ != nullptr; }
  bool is_pinned() const { return allocator_ == pinned_host_allocator(); }
  void release_memory() {
    if (data_ != nullptr) allocator_->deallocate(data_, nbytes_, device_);
    data_ = nullptr;
  }
  void restore_memory() {
    if (data_ == nullptr) data_ = allocator_->allocate(nbytes_, device_);
  }
  // Bumped by every in-place write through any tensor on this storage (see SavedTensor).
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  Allocator* allocator_;
  void* data_;
  size_t nbytes_;
  Device device_;
  uint64_t version_ = 0;
  uint64_t id_;

  static uint64_t next_id() {
    static std::atomic<uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }
};

}  // namespace mt::runtime
