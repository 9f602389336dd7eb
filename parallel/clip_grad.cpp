// Distributed gradient norm: per reduction set partials, all-reduced over the sharding groups.
#include "parallel/clip_grad.h"

#include <cmath>
#include <limits>

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/clip_grad.h"

namespace mt::parallel {

namespace {

// The groups over which a parameter's partial must be reduced: its Shard/Partial mesh dims.
std::vector<ProcessGroup*> reduction_groups(const DistributedParam& p) {
  std::vector<ProcessGroup*> groups;
  if (p.dtensor == nullptr) return groups;
  for (size_t d = 0; d < p.dtensor->placements.size(); ++d) {
    if (!std::holds_alternative<Replicate>(p.dtensor->placements[d]) &&
        p.dtensor->mesh->size(int64_t(d)) > 1) {
      groups.push_back(&p.dtensor->mesh->group(int64_t(d)));
    }
  }
  return groups;
}

std::vector<Tensor> local_tensors(const std::vector<DistributedParam>& params) {
  std::vector<Tensor> local;
  local.reserve(params.size());
  for (const auto& p : params) local.push_back(p.param);
  return local;
}

}  // namespace

Tensor total_grad_norm_tensor(const std::vector<DistributedParam>& params, double norm_type,
                              ProcessGroup* pipeline) {
  MT_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 (or inf), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  std::vector<std::vector<ProcessGroup*>> keys;
  std::vector<std::vector<Tensor>> members;
  for (const auto& p : params) {
    auto key = reduction_groups(p);
    size_t k = 0;
    while (k < keys.size() && keys[k] != key) ++k;
    if (k == keys.size()) {
      keys.push_back(key);
      members.emplace_back();
    }
    members[k].push_back(p.param);
  }
  runtime::NoGradGuard no_grad;
  Tensor total;  // the keys' partials combined in key order (sum; max for the inf-norm)
  for (size_t k = 0; k < keys.size(); ++k) {
    // On the parameters' device: the groups communicate tensors of that device (NCCL: CUDA).
    Tensor partial = runtime::optim::local_norm_pow_tensor(members[k], norm_type)
                         .reshape({1})
                         .to(members[k].front().device());
    for (ProcessGroup* g : keys[k])
      g->all_reduce(partial, inf ? ReduceOp::Max : ReduceOp::Sum, "clip_grad_norm");
    if (total.defined() && partial.device() != total.device()) partial = partial.to(total.device());
    total = !total.defined() ? partial
            : inf            ? runtime::maximum(total, partial)  // NaN propagates
                             : runtime::add(total, partial);
  }
  if (!total.defined())
    total = runtime::scalar_tensor(0.0, runtime::TensorOptions{}.with_dtype(runtime::DType::F64));
  if (pipeline != nullptr && pipeline->size() > 1) {
    // Every stage's total (on its parameters' device), combined like the keys' partials.
    const runtime::Device device = params.empty() ? pipeline->device() : params.front().param.device();
    total = total.reshape({1}).to(device).contiguous();
    pipeline->all_reduce(total, inf ? ReduceOp::Max : ReduceOp::Sum, "clip_grad_norm.pipeline");
  }
  return runtime::optim::norm_from_pow(total.reshape({}), norm_type);
}

double total_grad_norm(const std::vector<DistributedParam>& params, double norm_type,
                       ProcessGroup* pipeline) {
  return total_grad_norm_tensor(params, norm_type, pipeline).item<double>();
}

double clip_grad_norm_(const std::vector<DistributedParam>& params, double max_norm,
                       double norm_type, bool error_if_nonfinite, ProcessGroup* pipeline) {
  const double total = total_grad_norm(params, norm_type, pipeline);
  MT_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_: the total norm of order ",
           norm_type, " of the gradients is ", total,
           " (non-finite); error_if_nonfinite is set, gradients left as they were");
  runtime::optim::clip_grads_with_norm_(local_tensors(params), max_norm, total);
  return total;
}

Tensor clip_grad_norm_on_device_(const std::vector<DistributedParam>& params, double max_norm,
                                 double norm_type, ProcessGroup* pipeline) {
  const Tensor total = total_grad_norm_tensor(params, norm_type, pipeline);
  runtime::optim::clip_grads_with_norm_(local_tensors(params), max_norm, total);
  return total;
}

}  // namespace mt::parallel
