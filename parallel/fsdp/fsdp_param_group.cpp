// FSDPParamGroup: flat-buffer all-gather and reduce-scatter of one fully_shard group.
#include "parallel/fsdp/fsdp_param_group.h"

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/copy.h"
#include "runtime/kernels/float8.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8.h"

namespace mt::parallel {

namespace {
// dsts[k] = srcs[k] converted: in a few launches where the device's backend has the multi-tensor
// copy (CUDA) and every tensor is contiguous, else pair by pair. The copy kernels themselves, not
// Tensor::copy_: new values of the same parameters, so saved tensors must not see a new version.
void copy_pairs(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts) {
  if (srcs.empty()) return;
  const runtime::Device device = dsts.front().device();
  bool fused = runtime::copy_multi_tensor_kernel.has(device.type);
  for (size_t k = 0; k < srcs.size() && fused; ++k)
    fused = srcs[k].is_contiguous() && dsts[k].is_contiguous();
  if (fused) {
    runtime::copy_multi_tensor_kernel(device, srcs, dsts);
    return;
  }
  for (size_t k = 0; k < srcs.size(); ++k) runtime::copy_kernel(device, srcs[k], dsts[k]);
}
}  // namespace

FSDPParamGroup::FSDPParamGroup(std::string module_type,
                               std::vector<std::unique_ptr<FSDPParam>> params,
                               std::shared_ptr<DeviceMesh> mesh, MixedPrecisionPolicy policy,
                               double gradient_divide_factor)
    : module_type_(std::move(module_type)),
      params_(std::move(params)),
      mesh_(std::move(mesh)),
      shard_group_(&mesh_->group(mesh_->ndim() - 1)),
      gradient_divide_factor_(gradient_divide_factor) {
  MT_CHECK(!params_.empty(), "FSDPParamGroup '", module_type_, "': no parameters");
  MT_CHECK(mesh_->ndim() <= 2, "fully_shard: expected a 1-D (shard) or 2-D (replicate, shard) "
           "mesh, got ", mesh_->describe());
  if (mesh_->ndim() == 2 && mesh_->size(0) > 1) replicate_group_ = &mesh_->group(0);
  compute_dtype_ = params_.front()->compute_dtype();
  device_ = params_.front()->sharded().device();  // the shard group's (FSDPParam moved it)
  for (const auto& p : params_) {
    MT_CHECK(p->sharded().device() == device_, "fully_shard on '", module_type_,
             "': parameters of one group must be on one device, but '", p->fqn(), "' is on ",
             p->sharded().device(), " and '", params_.front()->fqn(), "' on ", device_);
    MT_CHECK(p->compute_dtype() == compute_dtype_, "fully_shard on '", module_type_,
             "': parameters of one group must compute in one dtype, but '", p->fqn(), "' is ",
             p->compute_dtype(), " and '", params_.front()->fqn(), "' is ", compute_dtype_,
             " (set MixedPrecisionPolicy::param_dtype)");
    offsets_.push_back(shard_numel_);
    shard_numel_ += p->padded_shard_numel();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    int64_t& numel = gathers_float8(i) ? float8_numel_ : gather_numel_;
    gather_offsets_.push_back(numel);
    numel += params_[i]->padded_shard_numel();
  }
  reduce_dtype_ = policy.reduce_dtype.value_or(compute_dtype_);
  MT_CHECK(gradient_divide_factor_ > 0, "fully_shard on '", module_type_,
           "': gradient divide factor must be > 0, got ", gradient_divide_factor_);
}

FSDPParamGroup::~FSDPParamGroup() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (gathers_float8(i)) runtime::unregister_float8_weight_codes(params_[i]->unsharded());
  }
}

int64_t FSDPParamGroup::unsharded_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : params_) bytes += int64_t(p->unsharded().nbytes());
  return bytes;
}

void FSDPParamGroup::unshard(bool async) {
  if (state_ != State::Sharded) return;
  runtime::NoGradGuard no_grad;
  const int64_t n = shard_group_->size();
  if (n == 1) {  // the all-gather would be a copy: cast the shards straight into place
    std::vector<Tensor> shards, unsharded;
    for (const auto& p : params_) {
      p->alloc_unsharded();
      shards.push_back(p->sharded());
      unsharded.push_back(p->unsharded());
    }
    copy_pairs(shards, unsharded);
    state_ = State::Unsharded;
    return;
  }
  ScopedCommPurpose purpose(comm_purpose());
  if (gather_numel_ > 0) {
    const auto opts = runtime::TensorOptions{}.with_dtype(compute_dtype_).with_device(device_);
    all_gather_in_ = runtime::empty({gather_numel_}, opts);
    all_gather_out_ = runtime::empty({n * gather_numel_}, opts);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (gathers_float8(i)) continue;
      params_[i]->alloc_unsharded();
      params_[i]->copy_in(
          all_gather_in_.narrow(0, gather_offsets_[i], params_[i]->padded_shard_numel()));
    }
    all_gather_work_ =
        shard_group_->all_gather_into(all_gather_out_, all_gather_in_, "fsdp.all_gather", async);
  }
  if (float8_numel_ > 0) start_float8_all_gather(async);
  state_ = State::Unsharding;
  if (!async) wait_for_unshard();
}

int64_t FSDPParamGroup::float8_gathered_count() const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i) n += gathers_float8(i);
  return n;
}

std::vector<Tensor> FSDPParamGroup::float8_shard_values() const {
  std::vector<Tensor> values;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (gathers_float8(i)) values.push_back(params_[i]->sharded().to(compute_dtype_).contiguous());
  }
  return values;
}

namespace {
// out[k] = amax of values[k] (f32).
void amaxes_into(const std::vector<Tensor>& values, const Tensor& out) {
  for (size_t k = 0; k < values.size(); ++k) {
    Tensor amax = out.narrow(0, int64_t(k), 1);
    runtime::float8_amax_kernel(out.device(), values[k], amax);
  }
}
}  // namespace

void FSDPParamGroup::float8_shard_amaxes(const Tensor& out) const {
  MT_CHECK(out.numel() == float8_gathered_count(), "float8_shard_amaxes: expected ",
           float8_gathered_count(), " slots, got ", out.numel());
  amaxes_into(float8_shard_values(), out);
}

void FSDPParamGroup::reduce_float8_amaxes(const Tensor& amaxes, const std::string& name) const {
  shard_group_->all_reduce(amaxes, ReduceOp::Max, name);
  if (float8_amax_group_) float8_amax_group_->all_reduce(amaxes, ReduceOp::Max, name + ".tp");
}

void FSDPParamGroup::start_float8_all_gather(bool async) {
  const auto f32 = runtime::TensorOptions{}.with_dtype(runtime::DType::F32).with_device(device_);
  const auto bytes = f32.with_dtype(runtime::DType::Bool);
  std::vector<size_t> float8;
  for (size_t i = 0; i < params_.size(); ++i)
    if (gathers_float8(i)) float8.push_back(i);
  // The whole weights' amaxes: each shard's over its compute-dtype values, then one max over the
  // shard group (and tp: reduce_float8_amaxes; every rank holds the same amaxes: same scales,
  // same codes as one process), unless precomputed for every group at once.
  const std::vector<Tensor> values = float8_shard_values();
  Tensor amaxes = float8_amaxes_;
  if (!amaxes.defined()) {
    amaxes = runtime::empty({int64_t(float8.size())}, f32);
    amaxes_into(values, amaxes);
    reduce_float8_amaxes(amaxes, "fsdp.float8_amax");
  }
  float8_in_ = runtime::empty({float8_numel_}, bytes);
  float8_out_ = runtime::empty({shard_group_->size() * float8_numel_}, bytes);
  float8_scale_inv_ = runtime::empty({int64_t(float8.size())}, f32);
  for (size_t k = 0; k < float8.size(); ++k) {
    const FSDPParam& p = *params_[float8[k]];
    Tensor codes = p.shard_view(float8_in_.narrow(0, gather_offsets_[float8[k]],
                                                  p.padded_shard_numel()));
    Tensor no_transpose, scale_inv = float8_scale_inv_.narrow(0, int64_t(k), 1);
    runtime::float8_cast_kernel(device_, values[k], amaxes.narrow(0, int64_t(k), 1),
                                runtime::Float8Format::E4M3, codes, no_transpose, scale_inv);
  }
  float8_work_ = shard_group_->all_gather_into(float8_out_, float8_in_, "fsdp.float8_all_gather",
                                               async);
}

void FSDPParamGroup::finish_float8_all_gather() {
  float8_work_.wait();
  const auto bytes = runtime::TensorOptions{}.with_dtype(runtime::DType::Bool).with_device(device_);
  for (size_t i = 0, k = 0; i < params_.size(); ++i) {
    if (!gathers_float8(i)) continue;
    const FSDPParam& p = *params_[i];
    const Tensor codes = runtime::empty(p.unsharded().shape(), bytes);
    // Dim-0 pieces: contiguous rows on both sides, moved byte for byte.
    p.copy_out_into(float8_out_, float8_numel_, gather_offsets_[i], codes,
                    [](const Tensor& src, Tensor& dst) {
                      runtime::float8_copy_kernel(dst.device(), src, dst);
                    });
    runtime::register_float8_weight_codes(
        p.unsharded(), runtime::Float8Tensor{codes, Tensor(),
                                             float8_scale_inv_.narrow(0, int64_t(k++), 1),
                                             runtime::Float8Format::E4M3});
  }
  float8_in_ = Tensor();
  float8_out_ = Tensor();
  float8_work_ = Work();
}

void FSDPParamGroup::wait_for_unshard() {
  if (state_ != State::Unsharding) return;
  all_gather_work_.wait();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (gathers_float8(i)) continue;
    params_[i]->copy_out(all_gather_out_, gather_numel_, gather_offsets_[i]);
  }
  if (float8_numel_ > 0) finish_float8_all_gather();
  all_gather_in_ = Tensor();
  all_gather_out_ = Tensor();
  all_gather_work_ = Work();
  state_ = State::Unsharded;
}

void FSDPParamGroup::reshard() {
  wait_for_unshard();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (gathers_float8(i)) runtime::unregister_float8_weight_codes(params_[i]->unsharded());
    params_[i]->free_unsharded();
  }
  state_ = State::Sharded;
}

void FSDPParamGroup::use_unsharded_params() const {
  for (const auto& p : params_) p->use_unsharded();
}

void FSDPParamGroup::use_sharded_params() const {
  for (const auto& p : params_) p->use_sharded();
}

bool FSDPParamGroup::start_reduce_scatter() {
  wait_for_reduce_scatter();
  runtime::NoGradGuard no_grad;
  has_grad_.assign(params_.size(), false);
  bool any = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    has_grad_[i] = params_[i]->unsharded().grad().defined();
    any = any || has_grad_[i];
  }
  if (!any) return false;
  const int64_t n = shard_group_->size();
  if (n == 1 && replicate_group_ == nullptr) {  // nothing to reduce: no flat buffers, no wait
    std::vector<Tensor> grads, reduced;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!has_grad_[i]) continue;
      const Tensor grad = params_[i]->unsharded().grad();
      grads.push_back(grad);
      reduced.push_back(runtime::empty(grad.shape(), grad.options().with_dtype(reduce_dtype_)));
      params_[i]->unsharded().set_grad(Tensor());
    }
    copy_pairs(grads, reduced);
    const double scale = 1.0 / gradient_divide_factor_;
    for (size_t i = 0, k = 0; i < params_.size(); ++i)
      if (has_grad_[i]) params_[i]->accumulate_whole_grad(reduced[k++], scale);
    return true;
  }
  const auto opts = runtime::TensorOptions{}.with_dtype(reduce_dtype_).with_device(device_);
  reduce_in_ = runtime::zeros({n * shard_numel_}, opts);
  reduce_out_ = runtime::empty({shard_numel_}, opts);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!has_grad_[i]) continue;
    params_[i]->copy_grad_in(params_[i]->unsharded().grad(), reduce_in_, shard_numel_, offsets_[i]);
    params_[i]->unsharded().set_grad(Tensor());
  }
  ScopedCommPurpose purpose(comm_purpose());
  reduce_scatter_work_ = shard_group_->reduce_scatter_into(reduce_out_, reduce_in_, ReduceOp::Sum,
                                                           "fsdp.reduce_scatter", true);
  reduce_pending_ = true;
  return true;
}

void FSDPParamGroup::wait_for_reduce_scatter() {
  if (!reduce_pending_) return;
  reduce_pending_ = false;
  reduce_scatter_work_.wait();
  reduce_scatter_work_ = Work();
  reduce_in_ = Tensor();
  runtime::NoGradGuard no_grad;
  if (replicate_group_ != nullptr) {
    ScopedCommPurpose purpose(comm_purpose());
    replicate_group_->all_reduce(reduce_out_, ReduceOp::Sum, "fsdp.all_reduce");
  }
  if (gradient_divide_factor_ != 1.0) runtime::mul_(reduce_out_, 1.0 / gradient_divide_factor_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (has_grad_[i]) params_[i]->accumulate_sharded_grad(reduce_out_, offsets_[i]);
  }
  reduce_out_ = Tensor();
}

}  // namespace mt::parallel
