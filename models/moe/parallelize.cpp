// Expert parallelism + per-parameter-mesh FSDP for the MoE transformer.
#include "models/moe/parallelize.h"

#include <algorithm>
#include <optional>

#include "models/llama/parallelize.h"
#include "models/moe/model.h"
#include "parallel/comm/comm_trace.h"
#include "parallel/expert/token_exchange.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/tensor/redistribute.h"
#include "parallel/tensor/tp_style.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"

namespace mt::models::moe {

namespace {

// The models/ seam (TokenDispatcher) served by parallel/'s all-to-all exchange; its collectives
// say which MoE layer they serve (communication traces).
class ExpertParallelDispatcher final : public TokenDispatcher {
 public:
  ExpertParallelDispatcher(std::shared_ptr<parallel::ProcessGroup> ep_group, int64_t num_experts,
                           std::string purpose)
      : exchange_(std::move(ep_group), num_experts), purpose_(std::move(purpose)) {}
  std::pair<Tensor, std::vector<int64_t>> dispatch(const Tensor& x,
                                                   const std::vector<int64_t>& counts) override {
    parallel::ScopedCommPurpose serves(purpose_);
    return exchange_.dispatch(x, counts);
  }
  Tensor combine(const Tensor& y) override {
    parallel::ScopedCommPurpose serves(purpose_);
    return exchange_.combine(y);
  }

 private:
  parallel::ExpertTokenExchange exchange_;
  std::string purpose_;
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

void split_experts(GroupedExperts& experts, const parallel::DeviceMesh& expert_mesh,
                   const std::string& purpose) {
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
  experts.dispatcher = std::make_shared<ExpertParallelDispatcher>(
      expert_mesh.group_ptr(expert_mesh.dim_index("ep")), num, purpose);
}

}  // namespace

void check_tensor_parallel(const ModelArgs& args, int64_t tp) {
  llama::check_tensor_parallel_heads(args.n_heads, args.kv_heads(), tp);
}

namespace {

// The sequence-wise auxiliary loss of a layer whose tp ranks each route a share of every
// sequence: the routed counts add up over tp (each sequence's f counts all of it), and the ranks'
// losses (each the mean score over its own tokens) are averaged into one the tp ranks share, by
// an all-reduce whose backward hands each rank the whole gradient (DTensor Partial -> Replicate):
// the same loss and, summed over tp, the same gradients as one process.
void share_aux_loss_over_tp(MoE& layer, const std::shared_ptr<parallel::DeviceMesh>& tp_mesh) {
  const std::shared_ptr<parallel::ProcessGroup> group = tp_mesh->group_ptr(0);
  layer.set_input_shards(tp_mesh->size(), [group](Tensor& counts) {
    group->all_reduce(counts, parallel::ReduceOp::Sum, "tp.moe_aux_counts");
  });
  layer.register_forward_hook([tp_mesh](nn::Module&, const std::vector<Tensor>&,
                                        std::vector<Tensor>& out) {
    if (out.size() < 2) return;  // {out, aux_loss}
    const std::vector<parallel::Placement> whole{parallel::Replicate{}};
    const parallel::DTensor partial = parallel::from_local(
        runtime::mul(out[1], 1.0 / double(tp_mesh->size())), tp_mesh, {parallel::Partial{}});
    out[1] = parallel::to_local(
        parallel::redistribute(partial, whole, whole, "tp.moe_aux_loss"), whole);
  });
}

// The MoE layers under tensor parallelism: each tp rank routes its own tokens (sequence shards;
// without sequence parallelism elsewhere, the layer's input is chunked and its output gathered),
// the shared experts are split column- and row-wise over tp, the router and routed experts are
// whole on each tp rank with their gradients summed over it (no TP inside routed experts yet).
// Routed experts keep expert parallelism over ep.
void apply_moe_tensor_parallel_io(Transformer& moe, const ParallelContext& context,
                                  parallel::TensorParallel& tp) {
  for (const auto& block : moe.blocks) {
    const auto& layer = block->moe;
    if (!layer) continue;
    const std::string m = "layers." + std::to_string(block->layer_id) + ".moe";
    if (layer->has_aux_loss()) share_aux_loss_over_tp(*layer, context.tp_mesh);
    if (!context.sequence_parallel) {  // with it, the input is already Shard(1)
      tp.apply(moe, m, parallel::PrepareModuleInput{parallel::Replicate{}, parallel::Shard{1}});
      tp.apply(moe, m, parallel::PrepareModuleOutput{parallel::Shard{1}, parallel::Replicate{}});
    }
    if (!layer->shared_experts) continue;
    // The shared experts are a feed-forward over this rank's tokens [N, dim]: all-gathered
    // (rank-major: a token-wise MLP does not mind the order), split column- then row-wise, and
    // reduce-scattered back to the same rows.
    const std::string se = m + ".shared_experts";
    tp.apply(moe, se, parallel::PrepareModuleInput{parallel::Shard{0}, parallel::Replicate{}});
    for (const char* w : {"w1", "w3"})
      tp.apply(moe, se + "." + w, parallel::ColwiseParallel{.input = std::nullopt});
    tp.apply(moe, se + ".w2", parallel::RowwiseParallel{.output = parallel::Shard{0}});
  }
}

// After fully_shard: the routed experts are an FSDP group of their own, whose gathered
// parameters the gradient sums must wrap. Float8 experts scale their weight gradients over the
// tokens of all tp ranks (runtime::float8_grouped_mm), so the sums equal one process's.
void sum_moe_gradients_over_tp(Transformer& moe, parallel::TensorParallel& tp,
                               const std::shared_ptr<parallel::ProcessGroup>& tp_group) {
  for (const auto& block : moe.blocks) {
    const auto& layer = block->moe;
    if (!layer) continue;
    const std::string m = "layers." + std::to_string(block->layer_id) + ".moe.";
    tp.apply(moe, m + "router", parallel::SequenceParallel{});
    tp.apply(moe, m + "experts", parallel::SequenceParallel{});
    layer->experts->float8_token_amax_reduce = [tp_group](Tensor& amax) {
      tp_group->all_reduce(amax, parallel::ReduceOp::Max, "tp.float8_expert_token_amax");
    };
  }
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
  options.float8_all_gather = context.float8_all_gather;
  options.gradient_divide_factor = context.gradient_divide_factor;
  std::optional<parallel::TensorParallel> tp;
  if (context.tp_mesh) {
    check_tensor_parallel(moe->args(), context.tp_mesh->size());
    tp.emplace(context.tp_mesh);
    std::vector<int64_t> layers, dense;
    for (const auto& block : moe->blocks) {
      layers.push_back(block->layer_id);
      if (block->feed_forward) dense.push_back(block->layer_id);
    }
    llama::apply_tensor_parallel_plan(
        *moe, layers,
        [&dense](int64_t i) { return std::find(dense.begin(), dense.end(), i) != dense.end(); },
        context, *tp);
    apply_moe_tensor_parallel_io(*moe, context, *tp);
    options.outer_of = tp->outer_sharding(context.world_mesh);
    if (context.float8_all_gather) options.float8_amax_group = context.tp_mesh->group_ptr(0);
  }

  if (context.expert_mesh) {
    const auto& mesh = context.expert_mesh;
    const bool with_tp = mesh->ndim() == 4;
    MT_CHECK(mesh->dim_names() == (std::vector<std::string>{"dp_replicate", "ep", "efsdp"}) ||
                 mesh->dim_names() ==
                     (std::vector<std::string>{"dp_replicate", "ep", "efsdp", "tp"}),
             "deepseek_v3 parallelize: expected an expert mesh (dp_replicate, ep, efsdp[, tp]), "
             "got ", mesh->describe());
    const auto efsdp_mesh = mesh->submesh({"dp_replicate", "efsdp"});  // collective: once
    parallel::FullyShardOptions expert_options = options;
    std::vector<parallel::Placement> placements{parallel::Replicate{}, parallel::Shard{0},
                                                parallel::Replicate{}};
    if (with_tp) placements.push_back(parallel::Replicate{});  // experts whole on each tp rank
    expert_options.outer = parallel::OuterSharding{mesh, placements};
    int64_t moe_layer = 0;
    for (const auto& layer : moe->moe_layers()) {
      split_experts(*layer->experts, *mesh, "experts of MoE layer " + std::to_string(moe_layer++));
      // Fewer local experts than efsdp ranks: shard each expert's rows instead (dim 1).
      expert_options.shard_dim = layer->experts->w1.size(0) < mesh->size("efsdp") ? 1 : 0;
      parallel::fully_shard(*layer->experts, efsdp_mesh, expert_options);
    }
  }
  for (const auto& block : moe->blocks) parallel::fully_shard(*block, context.dp_mesh, options);
  options.reshard_after_forward = context.reshard_root_after_forward;
  parallel::fully_shard(model, context.dp_mesh, options);
  if (tp) sum_moe_gradients_over_tp(*moe, *tp, context.tp_mesh->group_ptr(0));
}

}  // namespace mt::models::moe
