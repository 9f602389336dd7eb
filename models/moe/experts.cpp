#include "models/moe/experts.h"

#include <utility>

#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/kernels/float8.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8_grouped.h"
#include "runtime/ops/grouped_matmul.h"
#include "runtime/ops/swiglu.h"

namespace mt::models::moe {

namespace {
constexpr double kInitStd = 0.02;
constexpr double kTruncBound = 2.0;  // torch.nn.init.trunc_normal_'s default absolute [-2, 2]
}  // namespace

GroupedExperts::GroupedExperts(int64_t dim, int64_t hidden_dim, int64_t num_experts,
                               double out_init_std, TensorOptions options)
    : nn::Module("GroupedExperts"),
      dim_(dim),
      hidden_dim_(hidden_dim),
      num_experts_(num_experts),
      out_init_std_(out_init_std) {
  MT_CHECK(dim > 0 && hidden_dim > 0 && num_experts > 0,
           "GroupedExperts: expected positive dim, hidden_dim and num_experts, got ", dim, ", ",
           hidden_dim, ", ", num_experts);
  options.requires_grad = false;
  w1 = runtime::zeros({num_experts, hidden_dim, dim}, options);
  w2 = runtime::zeros({num_experts, dim, hidden_dim}, options);
  w3 = runtime::zeros({num_experts, hidden_dim, dim}, options);
  register_parameter("w1", w1);
  register_parameter("w2", w2);
  register_parameter("w3", w3);
}

void GroupedExperts::reset_parameters(const nn::InitContext& ctx) {
  auto init = [&](const Tensor& w, const char* name, double std) {
    runtime::Shape full = w.shape(), offset(size_t(w.dim()), 0);
    full[0] = num_experts_;
    offset[0] = expert_begin;
    MT_CHECK(expert_begin >= 0 && expert_begin + w.size(0) <= num_experts_,
             "GroupedExperts: ", name, " holds experts [", expert_begin, ", ",
             expert_begin + w.size(0), ") outside [0, ", num_experts_, ")");
    nn::init_trunc_normal_(w, ctx.key(name), 0.0, std, -kTruncBound, kTruncBound, full, offset);
  };
  init(w1, "w1", kInitStd);
  init(w2, "w2", out_init_std_);
  init(w3, "w3", out_init_std_);
}

Tensor GroupedExperts::run_local(const Tensor& x, const std::vector<int64_t>& counts) {
  MT_CHECK(
      int64_t(counts.size()) == w1.size(0), "GroupedExperts: ", counts.size(),
      " expert counts for weights holding ", w1.size(0), " experts",
      dispatcher ? " (the dispatcher returned counts for another number of local experts)" : "");
  if (float8) {  // w1 and w3 read x: one cast of it for both
    const std::vector<Tensor> h =
        runtime::float8_grouped_mm(x, {w1, w3}, counts, float8_token_amax_reduce);
    return runtime::float8_grouped_mm(runtime::swiglu(h[0], h[1]), w2, counts,
                                      float8_token_amax_reduce);
  }
  return runtime::grouped_mm(
      runtime::swiglu(runtime::grouped_mm(x, w1, counts), runtime::grouped_mm(x, w3, counts)), w2,
      counts);
}

Tensor GroupedExperts::operator()(const Tensor& x, const std::vector<int64_t>& counts) {
  MT_CHECK(x.defined() && x.dim() == 2 && x.size(1) == dim_, "GroupedExperts: expected x [N, ",
           dim_, "], got ", x.defined() ? x.shape() : runtime::Shape{});
  MT_CHECK(int64_t(counts.size()) == num_experts_, "GroupedExperts: expected ", num_experts_,
           " counts (one per global expert), got ", counts.size());
  MT_CHECK(dispatcher || w1.size(0) == num_experts_, "GroupedExperts: the weights hold ",
           w1.size(0), " of ", num_experts_, " experts but no TokenDispatcher is set");
  return call({x}, [this, counts](const std::vector<Tensor>& in) {
    if (!dispatcher) return run_local(in[0], counts);
    auto [local_x, local_counts] = dispatcher->dispatch(in[0], counts);
    return dispatcher->combine(run_local(local_x, local_counts));
  });
}

runtime::nn::Float8Conversion convert_experts_to_float8(nn::Module& root, runtime::Device device,
                                                        const std::vector<std::string>& fqns) {
  if (auto why = runtime::float8_gemm_unsupported_kernel(device)) {
    MT_FAIL("float8 grouped GEMMs: ", runtime::device_description(device),
            " cannot run FP8 GEMMs: ", *why);
  }
  runtime::nn::Float8Conversion result;
  for (auto& [fqn, module] : root.named_modules()) {
    auto* experts = dynamic_cast<GroupedExperts*>(module);
    if (experts == nullptr) continue;
    bool selected = false;
    for (const std::string& f : fqns) selected |= !f.empty() && fqn.find(f) != fqn.npos;
    if (!selected) continue;
    const std::string name = fqn.empty() ? "(root)" : fqn;
    // The GEMMs contract over dim (w1, w3) and hidden_dim (w2), producing the other.
    if (auto why = runtime::float8_grouped_mm_unsupported(device, experts->dim(),
                                                          experts->hidden_dim())) {
      result.skipped.emplace_back(name, *why);
      continue;
    }
    experts->float8 = true;
    result.converted.push_back(name);
  }
  return result;
}

}  // namespace mt::models::moe
