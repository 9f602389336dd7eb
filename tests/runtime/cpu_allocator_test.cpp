// The CPU allocator (runtime/core/cpu_allocator.h): large freed blocks are handed out again for a
// request of their size class, small ones and other classes are not mixed up, idle bytes show in
// bytes_reserved until empty_cache returns them, and blocks stay 64-byte aligned.
#include "runtime/core/cpu_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "runtime/core/error.h"

namespace mt::runtime {
namespace {

const Device kCpu = Device::cpu();

TEST(CpuAllocator, BlocksAreAlignedAndWritable) {
  Allocator& a = cpu_allocator();
  for (size_t n : {size_t(1), size_t(63), size_t(4096), size_t(65537), size_t(3) << 20}) {
    void* p = a.allocate(n, kCpu);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
    std::memset(p, 0xAB, n);
    a.deallocate(p, n, kCpu);
  }
}

// A request the host cannot hold (a petabyte) is an OutOfMemoryError, which train turns into a
// message saying what to lower.
TEST(CpuAllocator, ARequestTheHostCannotHoldIsAnOutOfMemoryError) {
  if (!cpu_allocator_caches_blocks()) GTEST_SKIP() << "AddressSanitizer's allocator aborts instead";
  EXPECT_THROW(cpu_allocator().allocate(size_t(1) << 50, kCpu), ::mt::OutOfMemoryError);
}

TEST(CpuAllocator, LargeFreedBlocksAreReusedWithinTheirSizeClass) {
  if (!cpu_allocator_caches_blocks()) GTEST_SKIP() << "no block cache under AddressSanitizer";
  Allocator& a = cpu_allocator();
  a.empty_cache(kCpu);
  const size_t n = size_t(5) << 20, smaller = n - 100000;
  void* first = a.allocate(smaller, kCpu);
  a.deallocate(first, smaller, kCpu);
  // Same class: classes are 512 KiB apart between 4 and 8 MiB, so both round up to 5 MiB.
  void* again = a.allocate(n, kCpu);
  EXPECT_EQ(again, first);
  // Another class while the block is taken, then after it is idle again: never that block.
  void* other = a.allocate(n + (size_t(1) << 20), kCpu);
  EXPECT_NE(other, first);
  a.deallocate(again, n, kCpu);
  a.deallocate(other, n + (size_t(1) << 20), kCpu);
  a.empty_cache(kCpu);
}

TEST(CpuAllocator, IdleBytesAreReservedUntilEmptyCache) {
  if (!cpu_allocator_caches_blocks()) GTEST_SKIP() << "no block cache under AddressSanitizer";
  Allocator& a = cpu_allocator();
  a.empty_cache(kCpu);
  const MemoryStats start = a.stats(kCpu);
  const size_t n = size_t(2) << 20;
  void* p = a.allocate(n, kCpu);
  const MemoryStats held = a.stats(kCpu);
  EXPECT_EQ(held.bytes_in_use - start.bytes_in_use, int64_t(n));
  EXPECT_EQ(held.bytes_reserved - start.bytes_reserved, int64_t(n));
  a.deallocate(p, n, kCpu);
  const MemoryStats idle = a.stats(kCpu);
  EXPECT_EQ(idle.bytes_in_use, start.bytes_in_use);
  EXPECT_EQ(idle.bytes_reserved - start.bytes_reserved, int64_t(n)) << "the block is cached";
  a.empty_cache(kCpu);
  EXPECT_EQ(a.stats(kCpu).bytes_reserved, start.bytes_reserved);
}

TEST(CpuAllocator, SmallBlocksAreNotCached) {
  Allocator& a = cpu_allocator();
  a.empty_cache(kCpu);
  const int64_t reserved = a.stats(kCpu).bytes_reserved;
  void* p = a.allocate(1000, kCpu);
  EXPECT_EQ(a.stats(kCpu).bytes_reserved, reserved + 1024);  // 64-byte multiple
  a.deallocate(p, 1000, kCpu);
  EXPECT_EQ(a.stats(kCpu).bytes_reserved, reserved);
}

}  // namespace
}  // namespace mt::runtime
