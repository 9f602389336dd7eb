// View ops, copies and casts: the Tensor methods declared in runtime/core/tensor.h.
// Views share storage and record a backward that maps the gradient back to the input's shape.
#include <algorithm>
#include <numeric>
#include <optional>

#include "runtime/autograd/function.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/copy.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"

namespace mt::runtime {

namespace {

using autograd::BackwardArgs;

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>(base.storage(), std::move(shape), std::move(strides),
                                           offset, base.dtype());
  impl->name = base.name();
  return Tensor(std::move(impl));
}

// Records a view whose backward is `grad_fn(grad)`.
Tensor record_view(const char* name, const Tensor& input, Tensor out,
                   std::function<Tensor(const Tensor&)> backward) {
  if (autograd::any_requires_grad({input})) {
    autograd::record(name, {input}, {out},
                     [backward = std::move(backward)](const BackwardArgs& args) {
                       return std::vector<Tensor>{backward(args.grad(0))};
                     });
  }
  return out;
}

// Fills a -1 entry of `shape` so that it holds `numel` elements.
Shape infer_shape(Shape shape, int64_t numel, const Shape& from) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MT_CHECK(infer < 0, "view: only one dimension can be -1, got ", shape);
      infer = int64_t(i);
    } else {
      MT_CHECK(shape[i] >= 0, "view: invalid size in shape ", shape);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MT_CHECK(known > 0 && numel % known == 0, "view: shape ", shape, " is invalid for input of ",
             "shape ", from, " (", numel, " elements)");
    shape[infer] = numel / known;
  }
  MT_CHECK(numel_of(shape) == numel, "view: shape ", shape, " is invalid for input of shape ", from,
           " (", numel, " elements)");
  return shape;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible (the algorithm
// of PyTorch's computeStride: split the old dims into contiguous chunks and map them over).
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides,
                                  const Shape& new_shape) {
  if (numel_of(shape) == 0 || shape.empty()) return contiguous_strides(new_shape);
  Shape out(new_shape.size());
  int64_t view_d = int64_t(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

void check_inplace_allowed(const Tensor& self, const char* op) {
  MT_CHECK(!(GradMode::enabled() && self.requires_grad()), op,
           ": in-place write to a tensor that requires grad (shape ", self.shape(),
           "); do it under NoGradGuard or on a detached tensor");
}

bool ranges_overlap(const Tensor& a, const Tensor& b) {
  if (!a.shares_storage_with(b) || a.numel() == 0 || b.numel() == 0) return false;
  auto extent = [](const Tensor& t) {
    int64_t lo = t.offset(), hi = t.offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t span = (t.shape()[d] - 1) * t.strides()[d];
      (span < 0 ? lo : hi) += span;
    }
    return std::pair{lo, hi};
  };
  auto [alo, ahi] = extent(a);
  auto [blo, bhi] = extent(b);
  return alo <= bhi && blo <= ahi;
}

}  // namespace

Tensor Tensor::view(const Shape& shape_in) const {
  const Shape shape = infer_shape(shape_in, numel(), this->shape());
  auto strides = view_strides(this->shape(), this->strides(), shape);
  MT_CHECK(strides.has_value(), "view: cannot view a tensor of shape ", this->shape(),
           " and strides ", this->strides(), " as ", shape, " without a copy; use reshape()");
  const Shape in_shape = this->shape();
  return record_view("ViewBackward", *this, make_view(*this, shape, *strides, offset()),
                     [in_shape](const Tensor& g) { return g.reshape(in_shape); });
}

Tensor Tensor::reshape(const Shape& shape_in) const {
  const Shape shape = infer_shape(shape_in, numel(), this->shape());
  if (view_strides(this->shape(), strides(), shape)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  MT_CHECK(s <= e, "flatten: start_dim ", start_dim, " after end_dim ", end_dim);
  Shape out(shape().begin(), shape().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= shape()[d];
  out.push_back(n);
  out.insert(out.end(), shape().begin() + e + 1, shape().end());
  return reshape(out);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int64_t a = wrap_dim(dim0, dim(), "transpose"), b = wrap_dim(dim1, dim(), "transpose");
  Shape shape = this->shape(), strides = this->strides();
  std::swap(shape[a], shape[b]);
  std::swap(strides[a], strides[b]);
  return record_view("TransposeBackward", *this, make_view(*this, shape, strides, offset()),
                     [a, b](const Tensor& g) { return g.transpose(a, b); });
}

Tensor Tensor::t() const {
  MT_CHECK(dim() == 2, "t: expected a 2-D tensor, got shape ", shape());
  return transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  MT_CHECK(int64_t(dims.size()) == dim(), "permute: ", dims.size(), " dims given for a ", dim(),
           "-D tensor");
  Shape shape(dims.size()), strides(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    MT_CHECK(inverse[d] < 0, "permute: dim ", d, " repeated in ", Shape(dims));
    inverse[d] = int64_t(i);
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
  }
  return record_view("PermuteBackward", *this, make_view(*this, shape, strides, offset()),
                     [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::slice(int64_t dim_in, int64_t start, int64_t end, int64_t step) const {
  const int64_t d = wrap_dim(dim_in, dim(), "slice");
  const int64_t n = shape()[d];
  MT_CHECK(step > 0, "slice: step must be positive, got ", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = this->shape(), strides = this->strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  const int64_t off = offset() + start * this->strides()[d];
  const Shape in_shape = this->shape();
  const DType dt = dtype();
  return record_view("SliceBackward", *this, make_view(*this, shape, strides, off),
                     [=](const Tensor& g) {
                       Tensor full = zeros(in_shape, g.options().with_dtype(dt));
                       full.slice(d, start, end, step).copy_(g);
                       return full;
                     });
}

Tensor Tensor::narrow(int64_t dim_in, int64_t start, int64_t length) const {
  const int64_t d = wrap_dim(dim_in, dim(), "narrow");
  MT_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], "narrow: range [", start,
           ", ", start + length, ") out of bounds for dim ", d, " of size ", shape()[d], " (shape ",
           shape(), ")");
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t dim_in, int64_t index) const {
  const int64_t d = wrap_dim(dim_in, dim(), "select");
  const int64_t n = shape()[d];
  MT_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dim ", d,
           " of size ", n);
  if (index < 0) index += n;
  Shape shape = this->shape(), strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  const int64_t off = offset() + index * this->strides()[d];
  const Shape in_shape = this->shape();
  return record_view("SelectBackward", *this, make_view(*this, shape, strides, off),
                     [=](const Tensor& g) {
                       Tensor full = zeros(in_shape, g.options());
                       full.select(d, index).copy_(g);
                       return full;
                     });
}

Tensor Tensor::expand(const Shape& shape_in) const {
  MT_CHECK(shape_in.size() >= size_t(dim()), "expand: cannot expand shape ", shape(), " to ",
           shape_in, " (fewer dims)");
  const size_t lead = shape_in.size() - size_t(dim());
  Shape shape(shape_in.size()), strides(shape_in.size());
  for (size_t i = 0; i < shape_in.size(); ++i) {
    if (i < lead) {
      MT_CHECK(shape_in[i] >= 0, "expand: -1 not allowed for new leading dims in ", shape_in);
      shape[i] = shape_in[i];
      strides[i] = 0;
      continue;
    }
    const int64_t have = this->shape()[i - lead];
    const int64_t want = shape_in[i] == -1 ? have : shape_in[i];
    MT_CHECK(have == want || have == 1, "expand: cannot expand shape ", this->shape(), " to ",
             shape_in, " (dim ", i, ": ", have, " -> ", want, ")");
    shape[i] = want;
    strides[i] = have == want ? this->strides()[i - lead] : 0;
  }
  const Shape in_shape = this->shape();
  return record_view("ExpandBackward", *this, make_view(*this, shape, strides, offset()),
                     [in_shape](const Tensor& g) { return sum_to(g, in_shape); });
}

Tensor Tensor::squeeze(int64_t dim_in) const {
  if (dim() == 0) return *this;
  const int64_t d = wrap_dim(dim_in, dim(), "squeeze");
  if (shape()[d] != 1) return view(shape());
  Shape shape = this->shape();
  shape.erase(shape.begin() + d);
  return view(shape);
}

Tensor Tensor::squeeze() const {
  Shape shape;
  for (int64_t s : this->shape())
    if (s != 1) shape.push_back(s);
  return view(shape);
}

Tensor Tensor::unsqueeze(int64_t dim_in) const {
  const int64_t d = wrap_dim(dim_in, dim() + 1, "unsqueeze");
  Shape shape = this->shape();
  shape.insert(shape.begin() + d, 1);
  return view(shape);
}

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t offset) const {
  MT_CHECK(shape.size() == strides.size(), "as_strided: shape ", shape, " and strides ", strides,
           " differ in length");
  const int64_t capacity = int64_t(storage()->nbytes() / element_size());
  int64_t hi = offset, lo = offset;
  for (size_t d = 0; d < shape.size(); ++d) {
    MT_CHECK(shape[d] >= 0, "as_strided: negative size in ", shape);
    if (shape[d] == 0) {
      hi = lo = offset;
      break;
    }
    const int64_t span = (shape[d] - 1) * strides[d];
    (span < 0 ? lo : hi) += span;
  }
  MT_CHECK(lo >= 0 && (numel_of(shape) == 0 || hi < capacity), "as_strided: shape ", shape,
           " strides ", strides, " offset ", offset, " reaches outside the storage of ", capacity,
           " elements");
  return make_view(*this, shape, strides, offset);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape(), options());
  {
    NoGradGuard no_grad;
    copy_kernel(device(), *this, out);
  }
  return record_view("CloneBackward", *this, out, [](const Tensor& g) { return g; });
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  Tensor out = Tensor::empty(shape(), options().with_dtype(dtype));
  copy_kernel(device(), *this, out);
  if (!is_floating(dtype)) return out;  // no gradient through casts to integers
  const DType in = this->dtype();
  return record_view("ToDTypeBackward", *this, out, [in](const Tensor& g) { return g.to(in); });
}

namespace {
// The backend that moves bytes between two devices: the non-CPU one's.
DeviceRuntime& transfer_runtime(Device from, Device to) {
  const Device accel = from.is_cpu() ? to : from;
  DeviceRuntime* rt = device_runtime(accel.type);
  MT_CHECK(rt != nullptr, "to(", to, "): copies between ", from, " and ", to, " need the ",
           device_type_name(accel.type), " backend, which ",
           cuda_backend_built() ? "found no usable device" : "this build does not provide");
  return *rt;
}
}  // namespace

Tensor Tensor::to(Device device, bool non_blocking) const {
  if (device == this->device()) return *this;
  DeviceRuntime& rt = transfer_runtime(this->device(), device);
  Tensor out = Tensor::empty(shape(), options().with_device(device));
  {
    NoGradGuard no_grad;
    // A pageable host source is staged in pinned memory so that the copy can be queued.
    const bool stage = non_blocking && this->device().is_cpu() && !device.is_cpu() &&
                       !(is_pinned() && is_contiguous());
    std::optional<ProfiledKernelScope> recorded;  // the profiler shows copies, and host waits
    if (t_profiler_records_this_thread) {
      recorded.emplace(device.is_cpu() ? "copy_to_host" : "copy_to_device",
                       device.is_cpu() ? this->device() : device);
      if (Profiler::records_tensors()) {  // execution traces replay the transfer (mt_replay)
        Profiler::add_tensor(recorded->index(), *this, false);
        Profiler::add_tensor(recorded->index(), out, true);
      }
    }
    rt.copy_between_devices(stage ? pin_memory() : contiguous(), out, non_blocking);
  }
  const Device from = this->device();
  return record_view("ToDeviceBackward", *this, out,
                     [from](const Tensor& g) { return g.to(from); });
}

Tensor Tensor::pin_memory() const {
  MT_CHECK(device().is_cpu(), "pin_memory: expected a host tensor, got one on ", device());
  if (is_pinned() && is_contiguous()) return *this;
  Tensor out = Tensor::empty_pinned(shape(), dtype());
  NoGradGuard no_grad;
  copy_kernel(Device::cpu(), *this, out);
  return out;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  check_inplace_allowed(*this, "copy_");
  Tensor from;
  {
    NoGradGuard no_grad;
    from = src.device() == device() ? src : src.to(device());  // then cast and broadcast here
    from = from.shape() == shape() ? from : from.expand(shape());
    if (ranges_overlap(from, *this)) from = from.clone();
  }
  copy_kernel(device(), from, *this);
  bump_version();
  return *this;
}

const Tensor& Tensor::fill_(double value) const {
  check_inplace_allowed(*this, "fill_");
  fill_kernel(device(), *this, value);
  bump_version();
  return *this;
}

}  // namespace mt::runtime
