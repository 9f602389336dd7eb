// CUDA copy (with dtype conversion, any strides) and fill kernels; contiguous tensors take the
// vectorized loop (launch_map).
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/copy.h"

namespace mt::runtime::cuda {
namespace {

void copy(const Tensor& src, const Tensor& dst) {
  check_on_current_device(src, "copy_");
  check_on_current_device(dst, "copy_");
  if (dst.numel() == 0) return;
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
