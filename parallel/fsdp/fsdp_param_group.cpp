// FSDPParamGroup: flat-buffer all-gather and reduce-scatter of one fully_shard group.
#include "parallel/fsdp/fsdp_param_group.h"

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/kernels/copy.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"

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

FSDPParamGroup::FSDPParamGroup(std::string module_fqn,
                               std::vector<std::unique_ptr<FSDPParam>> params,
                               std::shared_ptr<DeviceMesh> mesh, MixedPrecisionPolicy policy,
                               double gradient_divide_factor)
    : module_fqn_(std::move(module_fqn)),
      params_(std::move(params)),
      mesh_(std::move(mesh)),
      shard_group_(&mesh_->group(mesh_->ndim() - 1)),
      gradient_divide_factor_(gradient_divide_factor) {
  MT_CHECK(!params_.empty(), "FSDPParamGroup '", module_fqn_, "': no parameters");
  MT_CHECK(mesh_->ndim() <= 2, "fully_shard: expected a 1-D (shard) or 2-D (replicate, shard) "
           "mesh, got ", mesh_->describe());
  if (mesh_->ndim() == 2 && mesh_->size(0) > 1) replicate_group_ = &mesh_->group(0);
  compute_dtype_ = params_.front()->compute_dtype();
  device_ = params_.front()->sharded().device();  // the shard group's (FSDPParam moved it)
  for (const auto& p : params_) {
    MT_CHECK(p->sharded().device() == device_, "fully_shard on '", module_fqn_,
             "': parameters of one group must be on one device, but '", p->fqn(), "' is on ",
             p->sharded().device(), " and '", params_.front()->fqn(), "' on ", device_);
    MT_CHECK(p->compute_dtype() == compute_dtype_, "fully_shard on '", module_fqn_,
             "': parameters of one group must compute in one dtype, but '", p->fqn(), "' is ",
             p->compute_dtype(), " and '", params_.front()->fqn(), "' is ", compute_dtype_,
             " (set MixedPrecisionPolicy::param_dtype)");
    offsets_.push_back(shard_numel_);
    shard_numel_ += p->padded_shard_numel();
  }
  reduce_dtype_ = policy.reduce_dtype.value_or(compute_dtype_);
  MT_CHECK(gradient_divide_factor_ > 0, "fully_shard on '", module_fqn_,
           "': gradient divide factor must be > 0, got ", gradient_divide_factor_);
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
  const auto opts = runtime::TensorOptions{}.with_dtype(compute_dtype_).with_device(device_);
  all_gather_in_ = runtime::empty({shard_numel_}, opts);
  all_gather_out_ = runtime::empty({n * shard_numel_}, opts);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->alloc_unsharded();
    params_[i]->copy_in(all_gather_in_.narrow(0, offsets_[i], params_[i]->padded_shard_numel()));
  }
  ScopedCommPurpose purpose(comm_purpose());
  all_gather_work_ =
      shard_group_->all_gather_into(all_gather_out_, all_gather_in_, "fsdp.all_gather", async);
  state_ = State::Unsharding;
  if (!async) wait_for_unshard();
}

void FSDPParamGroup::wait_for_unshard() {
  if (state_ != State::Unsharding) return;
  all_gather_work_.wait();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->copy_out(all_gather_out_, shard_numel_, offsets_[i]);
  }
  all_gather_in_ = Tensor();
  all_gather_out_ = Tensor();
  all_gather_work_ = Work();
  state_ = State::Unsharded;
}

void FSDPParamGroup::reshard() {
  wait_for_unshard();
  for (const auto& p : params_) p->free_unsharded();
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
