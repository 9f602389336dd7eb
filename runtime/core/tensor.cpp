#include "runtime/core/tensor.h"

#include <algorithm>
#include <iomanip>

#include "runtime/autograd/engine.h"
#include "runtime/autograd/node.h"

namespace mt::runtime {

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage_, Shape shape_, Shape strides_,
                       int64_t offset_, DType dtype_)
    : storage(std::move(storage_)),
      shape(std::move(shape_)),
      strides(std::move(strides_)),
      offset(offset_),
      dtype(dtype_) {}

TensorImpl::~TensorImpl() = default;

namespace {
// Uninitialised contiguous memory from `allocator` on `device`; `op` names the caller in errors.
std::shared_ptr<TensorImpl> empty_impl(const Shape& shape, DType dtype, Device device,
                                       Allocator& allocator, const char* op) {
  for (int64_t s : shape) MT_CHECK(s >= 0, op, ": negative dimension in shape ", shape);
  const size_t nbytes = size_t(numel_of(shape)) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(nbytes, device, allocator);
  return std::make_shared<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0,
                                      dtype);
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, TensorOptions options) {
  Tensor t(empty_impl(shape, options.dtype, options.device, allocator_for(options.device.type),
                      "empty"));
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  PinnedHostAllocator* pinned = pinned_host_allocator();
  MT_CHECK(pinned != nullptr, "pinned host memory needs the CUDA backend and a GPU, ",
           cuda_backend_built() ? "and this machine has no usable GPU"
                                : "and this build has no CUDA backend");
  return Tensor(empty_impl(shape, dtype, Device::cpu(), *pinned, "empty_pinned"));
}

int64_t Tensor::size(int64_t dim) const { return shape()[wrap_dim(dim, this->dim(), "size")]; }
int64_t Tensor::stride(int64_t dim) const {
  return strides()[wrap_dim(dim, this->dim(), "stride")];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to walk: any strides will do (as in PyTorch)
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

void* Tensor::data_ptr() const {
  MT_CHECK(impl().storage->has_memory(), "tensor '", impl().name, "' of shape ", shape(),
           ": its memory is released (an FSDP parameter used outside its module's forward or "
           "backward?)");
  return static_cast<char*>(impl().storage->data()) + impl().offset * int64_t(element_size());
}

uint64_t Tensor::version() const { return impl().storage->version(); }
void Tensor::bump_version() const { impl().storage->bump_version(); }

AutogradMeta& Tensor::autograd_meta() const {
  auto& meta = impl().autograd;
  if (!meta) meta = std::make_unique<AutogradMeta>();
  return *meta;
}

bool Tensor::requires_grad() const {
  const auto& meta = impl().autograd;
  return meta && meta->requires_grad;
}

const Tensor& Tensor::set_requires_grad(bool requires_grad) const {
  MT_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can be marked (this tensor was made by ",
           "an op; use detach() for a new leaf)");
  MT_CHECK(!requires_grad || is_floating_point(), "set_requires_grad: only floating tensors can ",
           "require grad, this one is ", dtype());
  if (requires_grad || impl().autograd) autograd_meta().requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  const auto& meta = impl().autograd;
  return !meta || !meta->grad_fn;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  const auto& meta = impl().autograd;
  return meta ? meta->grad_fn : kNone;
}

uint32_t Tensor::output_nr() const {
  const auto& meta = impl().autograd;
  return meta ? meta->output_nr : 0;
}

Tensor Tensor::grad() const {
  const auto& meta = impl().autograd;
  return meta ? meta->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  MT_CHECK(!grad.defined() || grad.shape() == shape(), "set_grad: gradient of shape ",
           grad.shape(), " for a tensor of shape ", shape());
  autograd_meta().grad = grad;
}

Tensor Tensor::detach() const {
  const TensorImpl& i = impl();
  auto out = std::make_shared<TensorImpl>(i.storage, i.shape, i.strides, i.offset, i.dtype);
  out->name = i.name;
  return Tensor(std::move(out));
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward({*this}, {grad}, retain_graph);
}

void Tensor::register_hook(GradHook hook) const {
  MT_CHECK(requires_grad(), "register_hook: the tensor does not require grad");
  if (is_leaf()) {
    autograd_meta().leaf_grad_hooks.push_back(std::move(hook));
  } else {
    grad_fn()->add_grad_hook(output_nr(), std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  MT_CHECK(is_leaf() && requires_grad(),
           "register_post_accumulate_grad_hook: only for leaf tensors that require grad");
  autograd_meta().post_accumulate_hooks.push_back(std::move(hook));
}

const Tensor& Tensor::set_name(std::string name) const {
  impl().name = std::move(name);
  return *this;
}

namespace {
// Visits every element of a host tensor in row-major order with its value converted by `get`.
template <class Out, class Fn>
void read_host(const Tensor& t, Out* out, Fn get) {
  MT_CHECK(t.device().is_cpu(), "reading values of a ", t.device(),
           " tensor: copy it to the cpu first");
  const int64_t n = t.numel(), nd = t.dim();
  const char* base = static_cast<const char*>(t.data_ptr());
  const size_t es = t.element_size();
  std::vector<int64_t> idx(size_t(nd), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int64_t d = 0; d < nd; ++d) off += idx[d] * t.strides()[d];
    out[i] = get(base + off * int64_t(es));
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < t.shape()[d]) break;
      idx[d] = 0;
    }
  }
}

// Reads every element of `src` (any dtype, layout, device) as `Out` via convert<T>(value).
template <class Out, class Convert>
void copy_to_host(const Tensor& src, Out* out, Convert convert) {
  const Tensor t = src.device().is_cpu() ? src : src.to(Device::cpu());
  dispatch_dtype(t.dtype(), "to_vector", [&](auto tag) {
    using T = decltype(tag);
    read_host(t, out, [&](const char* p) {
      T v;
      std::memcpy(&v, p, sizeof(T));
      return convert(v);
    });
  });
}

}  // namespace

void copy_to_host_as_f64(const Tensor& src, double* out) {
  copy_to_host(src, out, [](auto v) { return double(compute_t<decltype(v)>(v)); });
}

void copy_to_host_as_i64(const Tensor& src, int64_t* out) {
  copy_to_host(src, out, [](auto v) {
    using T = decltype(v);
    if constexpr (std::is_integral_v<T>) {
      return int64_t(v);
    } else {
      const double d = double(compute_t<T>(v));
      MT_CHECK(d == d && d >= -9.2e18 && d <= 9.2e18, "to_vector: value ", d,
               " does not fit an integer");
      return int64_t(d);
    }
  });
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  os << "Tensor(shape=" << t.shape() << ", dtype=" << t.dtype() << ", device=" << t.device();
  if (t.device().is_cpu()) {
    const auto values = t.to_vector<double>();
    os << ", values=[";
    const size_t shown = std::min<size_t>(values.size(), 8);
    for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << std::setprecision(6) << values[i];
    if (values.size() > shown) os << ", ...";
    os << "]";
  }
  return os << ")";
}

}  // namespace mt::runtime
