// CUDA copy (with dtype conversion, any strides) and fill kernels.
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/copy.h"

namespace mt::runtime::cuda {
namespace {

void copy(const Tensor& src, const Tensor& dst) {
  check_on_current_device(src, "copy_");
  check_on_current_device(dst, "copy_");
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (dst.nbytes() > 0)
      MT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                    cudaMemcpyDeviceToDevice, current_stream()));
    return;
  }
  MT_CUDA_DISPATCH_ALL(src.dtype(), "copy_", S, [&] {
    MT_CUDA_DISPATCH_ALL(dst.dtype(), "copy_", D, [&] {
      const S* s = ptr<S>(src);
      D* d = ptr<D>(dst);
      launch_elementwise<2>(dst.shape(), {dst.strides(), src.strides()},
                            [=] __device__(const int64_t* off) { d[off[0]] = convert<D>(s[off[1]]); });
    });
  });
}

void fill(const Tensor& dst, double value) {
  check_on_current_device(dst, "fill_");
  MT_CUDA_DISPATCH_ALL(dst.dtype(), "fill_", D, [&] {
    const D v = convert<D>(value);
    D* d = ptr<D>(dst);
    launch_elementwise<1>(dst.shape(), {dst.strides()},
                          [=] __device__(const int64_t* off) { d[off[0]] = v; });
  });
}

MT_REGISTER_KERNEL(copy_kernel, DeviceType::CUDA, copy);
MT_REGISTER_KERNEL(fill_kernel, DeviceType::CUDA, fill);

}  // namespace
}  // namespace mt::runtime::cuda
