#include "models/moe/router.h"

#include <utility>

#include "runtime/core/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/index.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/softmax.h"
#include "runtime/ops/sort.h"

namespace mt::models::moe {

using runtime::DType;

Router::Router(int64_t dim, int64_t num_experts, int64_t top_k, std::string score_func,
               bool route_norm, double route_scale, double init_std, TensorOptions options)
    : nn::Module("Router"),
      num_experts_(num_experts),
      top_k_(top_k),
      score_func_(std::move(score_func)),
      route_norm_(route_norm),
      route_scale_(route_scale) {
  MT_CHECK(top_k >= 1 && top_k <= num_experts, "Router: top_k ", top_k,
           " outside [1, num_experts = ", num_experts, "]");
  MT_CHECK(score_func_ == "softmax" || score_func_ == "sigmoid", "Router: score_func '",
           score_func_, "' is not one of softmax, sigmoid");
  gate = register_module(
      "gate", std::make_shared<llama::InitLinear>(dim, num_experts, init_std, -2.0, 2.0, options));
}

RouterOutput Router::operator()(const Tensor& x, const Tensor& expert_bias) {
  MT_CHECK(x.defined() && x.dim() == 2 && x.size(1) == gate->weight.size(1),
           "Router: expected x [N, ", gate->weight.size(1), "], got ",
           x.defined() ? x.shape() : runtime::Shape{});
  MT_CHECK(
      !expert_bias.defined() || (expert_bias.dim() == 1 && expert_bias.size(0) == num_experts_),
      "Router: expected expert_bias [", num_experts_, "], got ", expert_bias.shape());
  std::vector<Tensor> inputs{x};
  if (expert_bias.defined()) inputs.push_back(expert_bias);
  std::vector<Tensor> out = call_multi(inputs, [this](const std::vector<Tensor>& in) {
    const DType score_dtype = in[0].dtype() == DType::F64 ? DType::F64 : DType::F32;
    const Tensor logits = (*gate)(in[0]).to(score_dtype);
    const Tensor scores =
        score_func_ == "softmax" ? runtime::softmax(logits, 1) : runtime::sigmoid(logits);
    // The choice: no gradient flows through it.
    Tensor choice = scores.detach();
    if (in.size() > 1) choice = runtime::add(choice, in[1].detach().to(score_dtype));
    const Tensor indices = runtime::topk(choice, top_k_, 1).indices;
    Tensor weights = runtime::gather(scores, 1, indices);
    if (route_norm_) {
      weights = runtime::div(weights, runtime::add(runtime::sum(weights, {1}, true), 1e-20));
    }
    if (route_scale_ != 1.0) weights = runtime::mul(weights, route_scale_);
    return std::vector<Tensor>{weights, indices, scores};
  });
  return RouterOutput{out[0], out[1], out[2]};
}

}  // namespace mt::models::moe
