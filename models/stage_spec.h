// ModelSpec's pipeline hooks (num_layers, build_stage, stage_forward, hidden_shape: registry.h)
// decoding hooks (make_kv_cache, forward_cached) and the context-parallel hook (shard_sequence)
// for a decoder whose Transformer takes a
// llama::LayerRange and has stage_forward and forward_cached, as llama's and the MoE model's do.
// Shared by their specs.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "models/llama/model.h"
#include "models/registry.h"
#include "runtime/core/error.h"

namespace mt::models {

// The model (or stage) as Model; `name` (the spec's) in the error when it is not one.
template <class Model>
Model& as_model(runtime::nn::Module& module, const std::string& name) {
  auto* model = dynamic_cast<Model*>(&module);
  MT_CHECK(model != nullptr, name, " spec: expected the model or a pipeline stage of it, got a ",
           "module of type ", module.type_name());
  return *model;
}

template <class Model, class Args>
void add_pipeline_stages(ModelSpec& spec, std::function<const Args&()> args) {
  spec.num_layers = [args] { return args().n_layers; };
  spec.build_stage = [args](const BuildOptions& options, int64_t begin,
                            int64_t end) -> std::shared_ptr<runtime::nn::Module> {
    const auto ac = llama::parse_activation_checkpointing(options.activation_checkpoint);
    auto stage = std::make_shared<Model>(args(), options.seed,
                                         runtime::TensorOptions{}.with_dtype(options.dtype),
                                         llama::LayerRange{begin, end});
    stage->set_activation_checkpointing(ac);
    return stage;
  };
  spec.stage_forward = [name = spec.name](runtime::nn::Module& stage, const Tensor& input) {
    auto out = as_model<Model>(stage, name).stage_forward(input);
    if constexpr (std::is_same_v<decltype(out), Tensor>)
      return ModelSpec::StageOutput{out, Tensor()};
    else
      return ModelSpec::StageOutput{out.logits, out.aux_loss};
  };
  spec.hidden_shape = [args](int64_t batch, int64_t seq) {
    return std::vector<int64_t>{batch, seq, args().dim};
  };
}

template <class Model>
void add_cached_decoding(ModelSpec& spec) {
  spec.make_kv_cache = [name = spec.name](runtime::nn::Module& model, runtime::DType dtype,
                                          int64_t kv_head_shards) {
    return as_model<Model>(model, name).make_kv_cache(1, 0, dtype, kv_head_shards);
  };
  spec.forward_cached = [name = spec.name](runtime::nn::Module& model, const Tensor& input,
                                           llama::KVCache& cache) {
    return as_model<Model>(model, name).forward_cached(input, cache);
  };
}

template <class Model>
void add_sequence_sharding(ModelSpec& spec) {
  spec.shard_sequence = [name = spec.name](runtime::nn::Module& model,
                                           const std::optional<SequenceShard>& shard) {
    as_model<Model>(model, name).set_sequence_shard(shard);
  };
}

}  // namespace mt::models
