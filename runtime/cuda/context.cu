// The CUDA backend's process state (see context.h) and its DeviceRuntime: device queries,
// synchronisation and host <-> device copies.
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/core/deferred_errors.h"
#include "runtime/core/device_runtime.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/context.h"

namespace mt::runtime::cuda {
namespace {

struct DeviceState {
  cudaDeviceProp properties{};
  cudaStream_t compute = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  cublasHandle_t cublas = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct Process {
  std::once_flag init;
  int count = 0;
  std::vector<std::unique_ptr<DeviceState>> devices;
  std::mutex mutex;  // creation of streams and handles
};

Process& process() {
  static Process p;
  std::call_once(p.init, [] {
    if (cudaGetDeviceCount(&p.count) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no GPU: a CPU-only process
      p.count = 0;
    }
    for (int i = 0; i < p.count; ++i) {
      auto s = std::make_unique<DeviceState>();
      MT_CUDA_CHECK(cudaGetDeviceProperties(&s->properties, i));
      p.devices.push_back(std::move(s));
    }
  });
  return p;
}

DeviceState& state(int device) {
  Process& p = process();
  MT_CHECK(device >= 0 && device < p.count, "cuda:", device, " does not exist: ", p.count,
           " CUDA device(s) visible");
  return *p.devices[size_t(device)];
}

thread_local cudaStream_t t_stream_override = nullptr;
thread_local bool t_has_override = false;

}  // namespace

int device_count() { return process().count; }

int current_device() {
  int d = 0;
  MT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

const cudaDeviceProp& device_properties(int device) { return state(device).properties; }

cudaStream_t compute_stream(int device) {
  DeviceState& s = state(device);
  std::lock_guard lock(process().mutex);
  if (s.compute == nullptr) {
    int previous = 0;
    MT_CUDA_CHECK(cudaGetDevice(&previous));
    MT_CUDA_CHECK(cudaSetDevice(device));
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
    MT_CUDA_CHECK(cudaSetDevice(previous));
  }
  return s.compute;
}

cudaStream_t current_stream() {
  return t_has_override ? t_stream_override : compute_stream(current_device());
}

StreamGuard::StreamGuard(cudaStream_t stream)
    : previous_(t_stream_override), previous_active_(t_has_override) {
  t_stream_override = stream;
  t_has_override = true;
}
// Restores the previous override, or none: without one, current_stream() follows the current
// device again (a guard must not pin the thread to the device it was made on).
StreamGuard::~StreamGuard() {
  t_stream_override = previous_;
  t_has_override = previous_active_;
}

cublasLtHandle_t cublaslt_handle() {
  DeviceState& s = state(current_device());
  std::lock_guard lock(process().mutex);
  if (s.cublaslt == nullptr) MT_CUBLAS_CHECK(cublasLtCreate(&s.cublaslt));
  return s.cublaslt;
}

cublasHandle_t cublas_handle() {
  DeviceState& s = state(current_device());
  {
    std::lock_guard lock(process().mutex);
    if (s.cublas == nullptr) {
      MT_CUBLAS_CHECK(cublasCreate(&s.cublas));
      // 16-bit GEMMs keep f32 accumulation through split-K reductions too (see matmul.cu).
      const auto math =
          cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
      MT_CUBLAS_CHECK(cublasSetMathMode(s.cublas, math));
    }
  }
  MT_CUBLAS_CHECK(cublasSetStream(s.cublas, current_stream()));
  MT_CUBLAS_CHECK(cublasSetWorkspace(s.cublas, workspace(kCublasWorkspaceBytes), kCublasWorkspaceBytes));
  return s.cublas;
}

void* workspace(size_t bytes) {
  DeviceState& s = state(current_device());
  std::lock_guard lock(process().mutex);  // (nothing below may call current_stream(): it locks)
  if (s.workspace_bytes < bytes) {
    // The old buffer may still be read by queued work, on this stream or (under a StreamGuard)
    // on the compute stream: wait for the whole device before freeing it (growth is rare).
    if (s.workspace != nullptr) {
      MT_CUDA_CHECK(cudaDeviceSynchronize());
      MT_CUDA_CHECK(cudaFree(s.workspace));
      s.workspace = nullptr;
      s.workspace_bytes = 0;
    }
    // cuDNN's deterministic attention backward can ask for GiBs (B x H x T x S x 2 bytes). The
    // caching allocator may hold most of the device in freed blocks: hand those back, then retry.
    if (cudaMalloc(&s.workspace, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      empty_cache();
      if (cudaMalloc(&s.workspace, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        s.workspace = nullptr;
        MT_FAIL("CUDA out of memory on cuda:", current_device(), ": the cuBLAS/cuDNN workspace "
                "needs ", bytes >> 20, " MiB (cuDNN's attention backward grows with batch x "
                "heads x seq^2); use a smaller local_batch_size or seq_len");
      }
    }
    s.workspace_bytes = bytes;
  }
  return s.workspace;
}

void check_on_current_device(const Tensor& t, const char* op) {
  if (!t.defined()) return;
  MT_CHECK(t.device().is_cuda(), op, ": expected a CUDA tensor, got one on ", t.device());
  MT_CHECK(t.device().index == current_device(), op, ": tensor on ", t.device(),
           " but the current device is cuda:", current_device(),
           " (runtime::set_current_device picks it)");
}

namespace {

// The profiler's clock: one timing event per marker on the current stream (default flags keep
// timing on). Resolving synchronises every event, so markers on other streams are read too.
class CudaTimeline final : public DeviceTimeline {
 public:
  explicit CudaTimeline(int device) : device_(device) {}
  ~CudaTimeline() override {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  int64_t mark() override {
    MT_CHECK(current_device() == device_, "profiler: markers of cuda:", device_,
             " recorded while cuda:", current_device(), " is current");
    cudaEvent_t e = nullptr;
    MT_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    MT_CUDA_CHECK(cudaEventRecord(e, current_stream()));
    return int64_t(events_.size()) - 1;
  }
  std::vector<double> resolve_us() override {
    std::vector<double> at;
    for (cudaEvent_t e : events_) {
      MT_CUDA_CHECK(cudaEventSynchronize(e));
      float ms = 0;
      MT_CUDA_CHECK(cudaEventElapsedTime(&ms, events_.front(), e));
      at.push_back(double(ms) * 1e3);
    }
    return at;
  }

 private:
  int device_;
  std::vector<cudaEvent_t> events_;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  int device_count() const override { return cuda::device_count(); }
  std::string device_name(int index) const override { return device_properties(index).name; }
  void set_device(int index) override {
    state(index);  // validates
    MT_CUDA_CHECK(cudaSetDevice(index));
  }
  void synchronize(int index) override {
    MT_CHECK(index == current_device(), "synchronize(cuda:", index,
             "): not the current device cuda:", current_device());
    MT_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    raise_arrived_errors();  // every verdict has arrived: bad input queued before fails here
  }
  std::unique_ptr<DeviceTimeline> timeline(int index) override {
    state(index);  // validates
    return std::make_unique<CudaTimeline>(index);
  }
  void copy_between_devices(const Tensor& src, const Tensor& dst, bool non_blocking) override {
    MT_CHECK(src.is_contiguous() && dst.is_contiguous() && src.dtype() == dst.dtype() &&
                 src.shape() == dst.shape(),
             "copy between devices: expected contiguous tensors of one dtype and shape");
    if (src.device().is_cuda()) check_on_current_device(src, "copy between devices");
    if (dst.device().is_cuda()) check_on_current_device(dst, "copy between devices");
    const size_t bytes = dst.nbytes();
    if (bytes == 0) return;
    cudaStream_t stream = current_stream();
    MT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDefault, stream));
    if (non_blocking && src.device().is_cpu() && src.is_pinned()) {
      // The pinned block waits for this copy before it is reused; the host goes on.
      pinned_host_allocator()->record_use(src.storage()->data(), dst.device());
      return;
    }
    // The host may read (or free, or write) its side as soon as we return.
    if (dst.device().is_cpu() || src.device().is_cpu()) {
      MT_CUDA_CHECK(cudaStreamSynchronize(stream));
      // The host waited anyway: values read from a step whose input was bad are not returned.
      raise_arrived_errors();
    }
  }
  std::function<void()> queue_copy_to_host(const Tensor& src, const Tensor& dst) override {
    MT_CHECK(src.is_contiguous() && dst.is_contiguous() && src.dtype() == dst.dtype() &&
                 src.shape() == dst.shape() && dst.device().is_cpu() && dst.is_pinned(),
             "queue_copy_to_host: expected contiguous tensors of one dtype and shape, the "
             "destination in page-locked host memory");
    check_on_current_device(src, "queue_copy_to_host");
    if (dst.nbytes() == 0) return [] {};
    cudaStream_t stream = current_stream();
    MT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                  cudaMemcpyDeviceToHost, stream));
    // dst's block is not reused before the copy ran, even if nobody waits for it.
    pinned_host_allocator()->record_use(dst.storage()->data(), src.device());
    cudaEvent_t done = nullptr;
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    MT_CUDA_CHECK(cudaEventRecord(done, stream));
    // The event outlives a waiter that is dropped unused (std::function needs a copyable one).
    auto event = std::shared_ptr<CUevent_st>(done, [](cudaEvent_t e) { (void)cudaEventDestroy(e); });
    return [event] {
      MT_CUDA_CHECK(cudaEventSynchronize(event.get()));
      raise_arrived_errors();
    };
  }
};

CudaRuntime g_runtime;
const bool g_registered = [] {
  if (device_count() > 0) set_device_runtime(DeviceType::CUDA, &g_runtime);
  return true;
}();

}  // namespace
}  // namespace mt::runtime::cuda
