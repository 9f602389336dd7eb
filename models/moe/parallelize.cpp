// Expert parallelism + per-parameter-mesh FSDP for the MoE transformer.
#include "models/moe/parallelize.h"

#include "models/moe/model.h"
#include "parallel/expert/token_exchange.h"
#include "parallel/fsdp/fully_shard.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"

namespace mt::models::moe {

namespace {

// The models/ seam (TokenDispatcher) served by parallel/'s all-to-all exchange.
class ExpertParallelDispatcher final : public TokenDispatcher {
 public:
  ExpertParallelDispatcher(std::shared_ptr<parallel::ProcessGroup> ep_group, int64_t num_experts)
      : exchange_(std::move(ep_group), num_experts) {}
  std::pair<Tensor, std::vector<int64_t>> dispatch(const Tensor& x,
                                                   const std::vector<int64_t>& counts) override {
    return exchange_.dispatch(x, counts);
  }
  Tensor combine(const Tensor& y) override { return exchange_.combine(y); }

 private:
  parallel::ExpertTokenExchange exchange_;
};

// Rows [begin, begin + count) of a weight as a new leaf (the rest of the memory goes). A weight
// without values yet (nn::DeferredInitGuard) gives rows without values.
Tensor own_rows(const Tensor& w, int64_t begin, int64_t count) {
  runtime::NoGradGuard no_grad;
  const Tensor rows = w.narrow(0, begin, count);
  Tensor out = runtime::empty(rows.shape(), w.options().with_requires_grad(false));
  if (w.storage()->has_memory()) {
    out.copy_(rows);
  } else {
    out.storage()->release_memory();
  }
  out.set_requires_grad(w.requires_grad());
  out.set_name(w.name());
  return out;
}

void split_experts(GroupedExperts& experts, const parallel::DeviceMesh& expert_mesh) {
  const int64_t ep = expert_mesh.size("ep"), num = experts.num_experts();
  MT_CHECK(num % ep == 0, "expert parallelism: ", num, " routed experts cannot be split evenly ",
           "over parallelism.expert_parallel_degree = ", ep, "; choose a degree that divides ",
           num);
  MT_CHECK(experts.w1.size(0) == num, "expert parallelism: the experts are already split (",
           experts.w1.size(0), " of ", num, " held); parallelize a model once");
  const int64_t local = num / ep, begin = expert_mesh.coordinate("ep") * local;
  experts.w1 = own_rows(experts.w1, begin, local);
  experts.w2 = own_rows(experts.w2, begin, local);
  experts.w3 = own_rows(experts.w3, begin, local);
  experts.expert_begin = begin;
  experts.dispatcher =
      std::make_shared<ExpertParallelDispatcher>(expert_mesh.group_ptr(expert_mesh.dim_index("ep")), num);
}

}  // namespace

void parallelize(runtime::nn::Module& model, const ParallelContext& context) {
  if (!context.dp_mesh) return;
  auto* moe = dynamic_cast<Transformer*>(&model);
  MT_CHECK(moe != nullptr, "deepseek_v3 parallelize: expected a MoE Transformer, got ",
           model.type_name());
  parallel::FullyShardOptions options;
  options.reshard_after_forward = context.reshard_after_forward;
  options.mp_policy = context.mp_policy;
  options.gradient_divide_factor = context.gradient_divide_factor;

  if (context.expert_mesh) {
    const auto& mesh = context.expert_mesh;
    MT_CHECK(mesh->dim_names() == (std::vector<std::string>{"dp_replicate", "ep", "efsdp"}),
             "deepseek_v3 parallelize: expected an expert mesh (dp_replicate, ep, efsdp), got ",
             mesh->describe());
    const auto efsdp_mesh = mesh->submesh({"dp_replicate", "efsdp"});  // collective: once
    parallel::FullyShardOptions expert_options = options;
    expert_options.outer =
        parallel::OuterSharding{mesh, {parallel::Replicate{}, parallel::Shard{0}, parallel::Replicate{}}};
    for (const auto& layer : moe->moe_layers()) {
      split_experts(*layer->experts, *mesh);
      // Fewer local experts than efsdp ranks: shard each expert's rows instead (dim 1).
      expert_options.shard_dim = layer->experts->w1.size(0) < mesh->size("efsdp") ? 1 : 0;
      parallel::fully_shard(*layer->experts, efsdp_mesh, expert_options);
    }
  }
  for (const auto& block : moe->blocks) parallel::fully_shard(*block, context.dp_mesh, options);
  options.reshard_after_forward = context.reshard_root_after_forward;
  parallel::fully_shard(model, context.dp_mesh, options);
}

}  // namespace mt::models::moe
