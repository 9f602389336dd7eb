// A CUDA verdict on its way to the host: copied into pinned memory behind the kernels that wrote
// it, with an event the host polls (runtime/core/deferred_errors.h).
#include "runtime/cuda/deferred_verdict.cuh"

namespace mt::runtime::cuda {
namespace {

class CudaVerdict final : public PendingVerdict {
 public:
  explicit CudaVerdict(const Tensor& verdict) : host_(Tensor::empty_pinned({2}, DType::I64)) {
    const cudaStream_t stream = current_stream();
    // The event exists before the copy is queued, and defer_verdict queues the verdict before it
    // can raise, so the pinned block is freed only after the event says the copy into it has run
    // (short of a failing cudaEventRecord, which leaves the CUDA context unusable anyway).
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    // The device buffer may be freed when the op returns: the caching allocator hands it to
    // later work on this stream only, which runs after this copy.
    MT_CUDA_CHECK(cudaMemcpyAsync(host_.data_ptr(), verdict.data_ptr(), 2 * sizeof(uint64_t),
                                  cudaMemcpyDeviceToHost, stream));
    MT_CUDA_CHECK(cudaEventRecord(copied_, stream));
  }
  ~CudaVerdict() override {
    if (copied_ != nullptr) (void)cudaEventDestroy(copied_);
  }
  CudaVerdict(const CudaVerdict&) = delete;
  CudaVerdict& operator=(const CudaVerdict&) = delete;

  bool arrived() override {
    const cudaError_t st = cudaEventQuery(copied_);
    if (st == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not a failure: leave no error for the next launch check
      return false;
    }
    MT_CUDA_CHECK(st);
    return true;
  }

  std::optional<BadElement> bad_element() override {
    const auto* words = static_cast<const unsigned long long*>(host_.data_ptr());
    if (words[0] == kNoBadElement) return std::nullopt;
    return BadElement{static_cast<int64_t>(words[0]), static_cast<int64_t>(words[1])};
  }

 private:
  Tensor host_;  // pinned: the copy's destination, held until the host has read it
  cudaEvent_t copied_ = nullptr;
};

}  // namespace

Tensor new_verdict() {
  Tensor v = Tensor::empty({2}, TensorOptions().with_dtype(DType::I64).with_device(
                                    Device::cuda(current_device())));
  MT_CUDA_CHECK(cudaMemsetAsync(v.data_ptr(), 0xFF, 2 * sizeof(uint64_t), current_stream()));
  return v;
}

void queue_verdict(const Tensor& verdict, BadElementMessage message) {
  defer_verdict(std::make_unique<CudaVerdict>(verdict), std::move(message));
}

}  // namespace mt::runtime::cuda
