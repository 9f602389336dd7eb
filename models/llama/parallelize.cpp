// Tensor parallelism, then FSDP, for llama: the plan in parallelize.h.
#include "models/llama/parallelize.h"

#include <string>
#include <vector>

#include "models/llama/model.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/tensor/tp_style.h"
#include "runtime/core/error.h"

namespace mt::models::llama {

using parallel::Placement;

namespace {

bool has_child(runtime::nn::Module& model, const std::string& name) {
  for (const auto& [child, module] : model.named_children())
    if (child == name) return true;
  return false;
}

}  // namespace

void apply_tensor_parallel_plan(runtime::nn::Module& model, const std::vector<int64_t>& layers,
                                const std::function<bool(int64_t)>& dense,
                                const ParallelContext& context, parallel::TensorParallel& tp) {
  const bool sp = context.sequence_parallel;
  const Placement residual = sp ? Placement(parallel::Shard{1}) : Placement(parallel::Replicate{});
  // A pipeline stage holds the embeddings (first), the final norm and output (last) or neither.
  if (has_child(model, "tok_embeddings")) {
    tp.apply(model, "tok_embeddings",
             parallel::RowwiseParallel{.input = parallel::Replicate{}, .output = residual});
  }
  for (const int64_t i : layers) {
    const std::string b = "layers." + std::to_string(i) + ".";
    if (sp) {
      tp.apply(model, b + "attention_norm", parallel::SequenceParallel{});
      tp.apply(model, b + "ffn_norm", parallel::SequenceParallel{});
    }
    tp.apply(model, b + "attention", parallel::PrepareModuleInput{residual, parallel::Replicate{}});
    for (const char* w : {"wq", "wk", "wv"})
      tp.apply(model, b + "attention." + w, parallel::ColwiseParallel{.input = std::nullopt});
    tp.apply(model, b + "attention.wo", parallel::RowwiseParallel{.output = residual});
    if (!dense(i)) continue;
    tp.apply(model, b + "feed_forward", parallel::PrepareModuleInput{residual, parallel::Replicate{}});
    for (const char* w : {"w1", "w3"})
      tp.apply(model, b + "feed_forward." + w, parallel::ColwiseParallel{.input = std::nullopt});
    tp.apply(model, b + "feed_forward.w2", parallel::RowwiseParallel{.output = residual});
  }
  if (!has_child(model, "output")) return;
  if (sp) tp.apply(model, "norm", parallel::SequenceParallel{});
  tp.apply(model, "output",
           parallel::ColwiseParallel{.input = residual,
                                     .output = context.loss_parallel
                                                   ? Placement(parallel::Shard{-1})
                                                   : Placement(parallel::Replicate{})});
}

void check_tensor_parallel_heads(int64_t n_heads, int64_t n_kv_heads, int64_t tp) {
  MT_CHECK(tp >= 1 && n_heads % tp == 0 && n_kv_heads % tp == 0,
           "tensor parallelism: the model's ", n_heads, " attention heads and ", n_kv_heads,
           " kv heads must both divide by parallelism.tensor_parallel_degree = ", tp,
           "; choose a degree that divides ", n_kv_heads);
}

void check_tensor_parallel(const ModelArgs& args, int64_t tp) {
  check_tensor_parallel_heads(args.n_heads, args.kv_heads(), tp);
}

void parallelize(runtime::nn::Module& model, const ParallelContext& context) {
  if (!context.dp_mesh) return;
  auto* llama = dynamic_cast<Transformer*>(&model);
  MT_CHECK(llama != nullptr, "llama parallelize: expected a llama Transformer, got ",
           model.type_name());
  MT_CHECK(context.expert_mesh == nullptr, "llama has no routed experts: "
           "parallelism.expert_parallel_degree must be 1 for it");
  parallel::FullyShardOptions options;
  options.reshard_after_forward = context.reshard_after_forward;
  options.mp_policy = context.mp_policy;
  options.float8_all_gather = context.float8_all_gather;
  options.gradient_divide_factor = context.gradient_divide_factor;
  if (context.tp_mesh) {
    check_tensor_parallel(llama->args(), context.tp_mesh->size());
    parallel::TensorParallel tp(context.tp_mesh);
    std::vector<int64_t> layers;
    for (const auto& block : llama->blocks) layers.push_back(block->layer_id);
    apply_tensor_parallel_plan(*llama, layers, [](int64_t) { return true; }, context, tp);
    options.outer_of = tp.outer_sharding(context.world_mesh);
    if (context.float8_all_gather) options.float8_amax_group = context.tp_mesh->group_ptr(0);
  }
  // The last block's parameters are the first the backward needs: like the root's, they stay
  // unsharded after the forward unless resharding is "always" (torchtitan's default policy).
  for (const auto& block : llama->blocks) {
    if (block == llama->blocks.back())
      options.reshard_after_forward = context.reshard_root_after_forward;
    parallel::fully_shard(*block, context.dp_mesh, options);
  }
  options.reshard_after_forward = context.reshard_root_after_forward;
  parallel::fully_shard(model, context.dp_mesh, options);
}

}  // namespace mt::models::llama
