// CUDA copy (with dtype conversion, any strides) and fill kernels; contiguous tensors take the
// vectorized loop (launch_map), transposed views a tiled kernel (transposed_copy).
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/copy.h"

namespace mt::runtime::cuda {
namespace {

constexpr int kTile = 32;     // a transposed copy's tile: kTile x kTile elements
constexpr int kTileRows = 8;  // threads per block: kTile x kTileRows

// dst [batch, rows, cols] (contiguous) = the transpose of each [cols, rows] matrix of src
// (contiguous): through a shared-memory tile, so that the reads and the writes are both
// coalesced. The strided loop reads a transposed view a column at a time, one cache line per
// element (a float8 rowwise cast's transposed operands spent 45 ms of a 194 ms step in it).
template <class D, class S>
__global__ void transposed_copy(const S* __restrict__ src, D* __restrict__ dst, int64_t rows,
                                int64_t cols) {
  __shared__ S tile[kTile][kTile + 1];  // +1: no bank conflicts on the column reads
  const int64_t matrix = int64_t(blockIdx.z) * rows * cols;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c < cols && r < rows) tile[i][threadIdx.x] = src[matrix + c * rows + r];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) dst[matrix + r * cols + c] = convert<D>(tile[threadIdx.x][i]);
  }
}

// Whether src is the transpose (last two dims swapped) of a contiguous tensor and dst is
// contiguous, with a grid the tiled kernel can launch: [batch, rows, cols] of the copy.
bool is_transposed_copy(const Tensor& src, const Tensor& dst, int64_t& batch, int64_t& rows,
                        int64_t& cols) {
  if (src.dim() < 2 || !dst.is_contiguous() || src.shape() != dst.shape()) return false;
  rows = src.size(-2);
  cols = src.size(-1);
  if (rows < 2 || cols < 2 || src.stride(-2) != 1 || src.stride(-1) != rows) return false;
  batch = 1;
  int64_t expected = rows * cols;
  for (int64_t d = src.dim() - 3; d >= 0; --d) {
    if (src.size(d) != 1 && src.stride(d) != expected) return false;
    expected *= src.size(d);
    batch *= src.size(d);
  }
  return (rows + kTile - 1) / kTile <= 65535 && batch <= 65535;
}

void copy(const Tensor& src, const Tensor& dst) {
  check_on_current_device(src, "copy_");
  check_on_current_device(dst, "copy_");
  if (dst.numel() == 0) return;
  int64_t batch = 0, rows = 0, cols = 0;
  if (is_transposed_copy(src, dst, batch, rows, cols)) {
    const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile),
                    unsigned(batch));
    MT_CUDA_DISPATCH_ALL(src.dtype(), "copy_", S, [&] {
      MT_CUDA_DISPATCH_ALL(dst.dtype(), "copy_", D, [&] {
        transposed_copy<D, S><<<grid, dim3(kTile, kTileRows), 0, current_stream()>>>(
            ptr<const S>(src), ptr<D>(dst), rows, cols);
        MT_CUDA_CHECK_LAUNCH();
      });
    });
    return;
  }
  // Contiguous copies, same dtype included, run launch_packed's kernel: 16-byte accesses from the
  // SMs are faster than cudaMemcpyAsync's copy engines.
  MT_CUDA_DISPATCH_ALL(src.dtype(), "copy_", S, [&] {
    MT_CUDA_DISPATCH_ALL(dst.dtype(), "copy_", D, [&] {
      launch_map<D, S>(dst, [] __device__(S v) { return convert<D>(v); }, src);
    });
  });
}

void fill(const Tensor& dst, double value) {
  check_on_current_device(dst, "fill_");
  MT_CUDA_DISPATCH_ALL(dst.dtype(), "fill_", D, [&] {
    const D v = convert<D>(value);
    launch_map<D>(dst, [=] __device__() { return v; });
  });
}

MT_REGISTER_KERNEL(copy_kernel, DeviceType::CUDA, copy);
MT_REGISTER_KERNEL(fill_kernel, DeviceType::CUDA, fill);

}  // namespace
}  // namespace mt::runtime::cuda
