// Block-wide reductions for the CUDA kernels (warp shuffles, then one value per warp through
// shared memory). Every thread of the block must call them; every thread gets the result.
#pragma once

#include <cuda_runtime.h>

namespace mt::runtime::cuda {

template <class A>
__device__ inline A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class A>
__device__ inline A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024).
template <class A>
__device__ inline A block_sum(A v) {
  __shared__ A partial[32];
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  A r = lane < warps ? partial[lane] : A(0);
  return warp_sum(r);
}

template <class A>
__device__ inline A block_max(A v, A lowest) {
  __shared__ A partial[32];
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  A r = lane < warps ? partial[lane] : lowest;
  return warp_max(r);
}

// NaN-propagating maximum (max() and fmax() drop a NaN operand).
template <class A>
__device__ inline A nan_max(A a, A b) {
  return (a > b || a != a) ? a : b;
}

// `op` over the block, `identity` its neutral value (blockDim.x a multiple of 32, at most 1024).
template <class A, class Op>
__device__ inline A block_reduce(A v, A identity, Op op) {
  __shared__ A partial[32];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  A r = lane < int(blockDim.x / 32) ? partial[lane] : identity;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) r = op(r, __shfl_xor_sync(0xffffffffu, r, o));
  return r;
}

}  // namespace mt::runtime::cuda
