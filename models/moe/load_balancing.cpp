#include "models/moe/load_balancing.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"

namespace mt::models::moe {

using runtime::DType;

std::map<std::string, double> update_expert_bias(
    Transformer& model, const std::function<void(Tensor&)>& all_reduce_sum) {
  runtime::NoGradGuard no_grad;
  const auto moes = model.moe_layers();
  std::map<std::string, double> metrics;
  if (moes.empty()) return metrics;
  const int64_t e_count = model.args().n_routed_experts;
  const double coeff = model.args().load_balance_coeff;

  // One [n_moe_layers, E] f64 buffer, one collective.
  std::vector<Tensor> rows;
  for (const auto& m : moes) rows.push_back(m->tokens_per_expert.to(DType::F64));
  Tensor packed = runtime::stack(rows, 0).contiguous();
  if (all_reduce_sum) all_reduce_sum(packed);
  const std::vector<double> counts = packed.to_vector<double>();

  double ratio_sum = 0.0;
  int64_t measured = 0;
  size_t block = 0;
  for (size_t l = 0; l < moes.size(); ++l) {
    while (block < model.blocks.size() && model.blocks[block]->moe != moes[l]) ++block;
    const double* c = counts.data() + l * size_t(e_count);
    double total = 0.0, most = 0.0;
    for (int64_t e = 0; e < e_count; ++e) {
      total += c[e];
      most = std::max(most, c[e]);
    }
    if (total > 0) {
      const double mean = total / double(e_count);
      metrics["moe_load_imbalance_layer" + std::to_string(model.blocks[block]->layer_id)] =
          most / mean;
      ratio_sum += most / mean;
      ++measured;
      if (coeff > 0) {
        std::vector<double> delta(static_cast<size_t>(e_count), 0.0);
        double delta_mean = 0.0;
        for (int64_t e = 0; e < e_count; ++e) {
          const double err = mean - c[e];
          delta[size_t(e)] = coeff * double((err > 0) - (err < 0));
          delta_mean += delta[size_t(e)] / double(e_count);
        }
        for (double& d : delta) d -= delta_mean;
        const Tensor& bias = moes[l]->expert_bias;
        runtime::add_(bias, runtime::from_vector<double>(delta, {e_count}, bias.options()));
      }
    }
    moes[l]->reset_tokens_per_expert();
  }
  if (measured > 0) metrics["moe_load_imbalance"] = ratio_sum / double(measured);
  return metrics;
}

}  // namespace mt::models::moe
