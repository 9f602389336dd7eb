// Token-choice top-k router of a MoE layer (DeepSeek-V3 / torchtitan TokenChoiceTopKRouter).
//
//   logits = gate(x)                          gate: Linear dim -> num_experts, no bias
//   scores = softmax(logits) | sigmoid(logits) in f32 (f64 when x is f64)
//   indices = topk(scores + expert_bias, k)   the bias steers the choice only (no gradient)
//   weights = scores[indices]                 the UNBIASED scores of the chosen experts
//   weights /= sum(weights) + 1e-20           when route_norm
//   weights *= route_scale
// Top-k order: largest biased score first, ties to the lower expert id (runtime topk).
// Init: gate.weight trunc_normal(0, init_std, [-2, 2]) (deepseek_v3: depth-scaled 0.02).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/llama/model.h"
#include "runtime/nn/module.h"

namespace mt::models::moe {

using runtime::Tensor;
using runtime::TensorOptions;
namespace nn = runtime::nn;

struct RouterOutput {
  Tensor weights;  // [N, top_k], f32 (f64 for f64 input); differentiable (gate weight and x)
  Tensor indices;  // [N, top_k] i64, the chosen experts
  Tensor scores;   // [N, num_experts], the full scores (for the auxiliary loss)
};

class Router : public nn::Module {
 public:
  Router(int64_t dim, int64_t num_experts, int64_t top_k, std::string score_func, bool route_norm,
         double route_scale, double init_std, TensorOptions options);
  // x [N, dim]; expert_bias [num_experts] or undefined (no bias).
  RouterOutput operator()(const Tensor& x, const Tensor& expert_bias = Tensor());

  int64_t num_experts() const { return num_experts_; }
  int64_t top_k() const { return top_k_; }

  std::shared_ptr<llama::InitLinear> gate;

 private:
  int64_t num_experts_, top_k_;
  std::string score_func_;
  bool route_norm_;
  double route_scale_;
};

}  // namespace mt::models::moe
