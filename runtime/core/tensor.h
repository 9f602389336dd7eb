// Tensor: a handle (shared_ptr) to a TensorImpl = storage + shape + strides + offset + dtype,
// plus optional autograd metadata.
//
// Conventions
// - Strides and offsets are in elements. Views share storage; `contiguous()` copies only when
//   needed. Copying a Tensor handle never copies data (use clone()).
// - Autograd is first-order: ops record a graph when an input requires grad and grad mode is on
//   (see runtime/autograd). Backward formulas run under no_grad.
// - In-place ops (names ending in `_`) bump the storage's version counter; a tensor saved for
//   backward and modified afterwards makes backward throw instead of computing wrong gradients.
// - View ops, casts and copies are declared here and defined in runtime/ops/view.cpp; the
//   arithmetic and nn ops are free functions in runtime/ops/*.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/core/storage.h"

namespace mt::runtime {

namespace autograd {
class Node;
}
class Tensor;
struct AutogradMeta;

// Called with the gradient flowing into a tensor; returns a replacement or an undefined tensor to
// keep the gradient as is.
using GradHook = std::function<Tensor(const Tensor& grad)>;
// Called with a leaf after its .grad has been accumulated (FSDP's reduce-scatter trigger).
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

struct TensorOptions {
  DType dtype = DType::F32;
  Device device = Device::cpu();
  bool requires_grad = false;

  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r) const { auto o = *this; o.requires_grad = r; return o; }
};

class TensorImpl {
 public:
  TensorImpl(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
             DType dtype);
  ~TensorImpl();

  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype;
  std::unique_ptr<AutogradMeta> autograd;  // null until autograd needs it
  std::string name;                        // optional, for error messages and debugging
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Allocates uninitialised contiguous memory.
  static Tensor empty(const Shape& shape, TensorOptions options = {});
  // Uninitialised contiguous host memory, page-locked (pinned): needs the CUDA backend and a GPU.
  static Tensor empty_pinned(const Shape& shape, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int64_t size(int64_t dim) const;
  int64_t dim() const { return int64_t(impl().shape.size()); }
  int64_t numel() const { return numel_of(impl().shape); }
  const Shape& strides() const { return impl().strides; }
  int64_t stride(int64_t dim) const;
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const;
  bool is_floating_point() const { return is_floating(dtype()); }
  TensorOptions options() const { return {dtype(), device(), false}; }

  // Raw pointer to the first element (storage + offset), on the tensor's device: kernels and
  // collectives take it. data<T>() is for host code: it checks that T matches the dtype and
  // that the tensor is on the CPU (a device pointer read on the host would crash or read junk;
  // copy with .to(Device::cpu()) first).
  void* data_ptr() const;
  template <class T>
  T* data() const {
    MT_CHECK(dtype_v<T> == dtype(), "data<", dtype_name(dtype_v<T>), ">() on a ",
             dtype_name(dtype()), " tensor");
    MT_CHECK(device().is_cpu(), "data<", dtype_name(dtype_v<T>), ">() on a tensor on ", device(),
             ": host code reads host tensors (copy with .to(Device::cpu()) first)");
    return static_cast<T*>(data_ptr());
  }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  bool shares_storage_with(const Tensor& other) const { return storage() == other.storage(); }
  uint64_t version() const;  // storage version, bumped by in-place ops
  void bump_version() const;

  // Values on the host, converted to T (any dtype). Copies.
  template <class T>
  std::vector<T> to_vector() const;
  template <class T>
  T item() const;  // single-element tensors only

  // ---- views (share storage; differentiable) -----------------------------------------------
  Tensor view(const Shape& shape) const;     // requires compatible strides; -1 infers one dim
  Tensor reshape(const Shape& shape) const;  // view when possible, else a contiguous copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // 2-D transpose
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  Tensor expand(const Shape& shape) const;          // -1 keeps a dim; size-1 dims broadcast
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor unsqueeze(int64_t dim) const;
  // Non-differentiable view with explicit geometry (for kernels and parallel code).
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;

  // ---- copies and conversions (differentiable unless noted) --------------------------------
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;   // no copy when already that dtype
  // A copy into a device's memory returns once queued, and a copy to the host once done. A copy
  // from pageable host memory also waits for the work queued on the stream, except with
  // non_blocking: a host tensor is then copied into pinned memory first (unless it is pinned)
  // and the host goes on while the GPU copies (writing to an already pinned source before the
  // copy has run changes what it copies).
  Tensor to(Device device, bool non_blocking = false) const;
  // A contiguous copy of this host tensor in pinned memory (this tensor when already pinned and
  // contiguous); not differentiable. Throws without the CUDA backend or a GPU.
  Tensor pin_memory() const;
  bool is_pinned() const { return storage()->is_pinned(); }
  const Tensor& copy_(const Tensor& src) const;  // broadcasts src; casts; not differentiable
  const Tensor& fill_(double value) const;       // not differentiable
  const Tensor& zero_() const { return fill_(0.0); }

  // ---- autograd -------------------------------------------------------------------------------
  bool requires_grad() const;
  const Tensor& set_requires_grad(bool requires_grad) const;  // leaves only
  bool is_leaf() const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  uint32_t output_nr() const;
  Tensor grad() const;  // undefined until backward reaches this leaf
  void set_grad(const Tensor& grad) const;
  Tensor detach() const;  // shares storage, no autograd history
  // Backpropagates from this tensor (a scalar unless `grad` is given).
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  void register_hook(GradHook hook) const;
  void register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;  // leaves only

  const std::string& name() const { return impl().name; }
  const Tensor& set_name(std::string name) const;

  TensorImpl& impl() const {
    MT_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  AutogradMeta& autograd_meta() const;  // creates it on first use
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: the AccumulateGrad node, if any
  std::vector<GradHook> leaf_grad_hooks;           // leaves (non-leaf hooks live on grad_fn)
  std::vector<PostAccumulateGradHook> post_accumulate_hooks;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);  // shape, dtype and a few values

// Converts values to and from the host; the tensor helpers below use them.
void copy_to_host_as_f64(const Tensor& t, double* out);  // any dtype, any layout
void copy_to_host_as_i64(const Tensor& t, int64_t* out);

template <class T>
std::vector<T> Tensor::to_vector() const {
  std::vector<T> out(static_cast<size_t>(numel()));
  if constexpr (std::is_integral_v<T>) {
    std::vector<int64_t> tmp(out.size());
    copy_to_host_as_i64(*this, tmp.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = T(tmp[i]);
  } else {
    std::vector<double> tmp(out.size());
    copy_to_host_as_f64(*this, tmp.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = T(tmp[i]);
  }
  return out;
}

template <class T>
T Tensor::item() const {
  MT_CHECK(numel() == 1, "item(): expected a tensor with one element, got shape ", shape());
  return to_vector<T>()[0];
}

}  // namespace mt::runtime
