// Multi-tensor launches (apex's multi_tensor_apply idea): one kernel launch covers up to
// kMaxTensors tensors, whose sizes (and, in the kernel's own table, pointers) travel in the
// kernel's parameter space (__grid_constant__, so indexing them by tensor does not copy the table
// to local memory). Each block works on `elems_per_block` consecutive elements of one tensor,
// found from the cumulative block counts; launch_blocks runs the kernel by packs of V
// (packed.cuh) when every pointer of the table is aligned for them.
#pragma once

#include <cstdint>
#include <type_traits>

namespace mt::runtime::cuda {

inline constexpr int kMaxTensorsPerLaunch = 48;

struct TensorBlocks {
  int64_t numel[kMaxTensorsPerLaunch];
  int64_t blocks_end[kMaxTensorsPerLaunch];  // cumulative block count through tensor t
  int count = 0;
  int64_t blocks = 0;   // the launch's grid
  bool packed = true;   // every pointer added is aligned for the launch's packs

  // Appends a tensor of n > 0 elements whose pointers are `aligned` for packs; returns its slot.
  int add(int64_t n, int64_t elems_per_block, bool aligned) {
    packed = packed && aligned;
    numel[count] = n;
    blocks += (n + elems_per_block - 1) / elems_per_block;
    blocks_end[count] = blocks;
    return count++;
  }
  // Full table, or a grid near the launch limit (2^31 - 1 blocks): time to launch.
  bool full() const { return count == kMaxTensorsPerLaunch || blocks > (int64_t(1) << 30); }
  void clear() { count = 0, blocks = 0, packed = true; }

  // The tensor of block b and its element range [begin, end).
  __device__ int locate(int64_t b, int64_t elems_per_block, int64_t& begin, int64_t& end) const {
    int lo = 0, hi = count - 1;  // the first t with b < blocks_end[t]
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (b < blocks_end[mid]) hi = mid; else lo = mid + 1;
    }
    begin = (b - (lo == 0 ? 0 : blocks_end[lo - 1])) * elems_per_block;
    end = begin + elems_per_block < numel[lo] ? begin + elems_per_block : numel[lo];
    return lo;
  }
};

// launch(std::integral_constant<int, W>{}) with W = V when every pointer of the table was aligned
// for packs of V, else W = 1; then clears the table. Nothing when it is empty.
template <int V, class Launch>
void launch_blocks(TensorBlocks& blocks, Launch&& launch) {
  if (blocks.count == 0) return;
  if (blocks.packed) {
    launch(std::integral_constant<int, V>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
  blocks.clear();
}

}  // namespace mt::runtime::cuda
