#include "models/llama/spec.h"

#include <memory>

#include "models/llama/hf_checkpoint.h"
#include "models/llama/model.h"
#include "models/llama/parallelize.h"
#include "models/stage_spec.h"
#include "runtime/core/error.h"

namespace mt::models::llama {

namespace {

Transformer& as_llama(runtime::nn::Module& model) {
  auto* t = dynamic_cast<Transformer*>(&model);
  MT_CHECK(t != nullptr, "llama3 spec: expected a llama Transformer, got a module of type ",
           model.type_name());
  return *t;
}

ModelSpec spec_of(ModelArgs model_args, const std::string& flavor) {
  ModelSpec spec;
  spec.name = "llama3";
  spec.flavor = flavor;
  spec.args = std::make_shared<std::any>(std::move(model_args));
  auto args_ptr = spec.args;
  auto args = [args_ptr]() -> const ModelArgs& {
    const auto* a = std::any_cast<ModelArgs>(args_ptr.get());
    MT_CHECK(a != nullptr, "llama3 spec: ModelSpec::args must hold a llama::ModelArgs");
    return *a;
  };
  spec.build = [args](const BuildOptions& options) -> std::shared_ptr<runtime::nn::Module> {
    const auto ac = parse_activation_checkpointing(options.activation_checkpoint);
    auto model = std::make_shared<Transformer>(args(), options.seed,
                                               TensorOptions{}.with_dtype(options.dtype));
    model->set_activation_checkpointing(ac);
    return model;
  };
  spec.forward = [](runtime::nn::Module& model, const Tensor& tokens) {
    return as_llama(model)(tokens);
  };
  // The loss over the compute-dtype logits (see model.h).
  spec.loss_with_cross_entropy = [](runtime::nn::Module& model, const Tensor& tokens,
                                    const Tensor& targets, runtime::Reduction reduction,
                                    const ModelSpec::CrossEntropy& cross_entropy) {
    return cross_entropy(as_llama(model).loss_logits(tokens), targets, reduction);
  };
  spec.loss = [loss = spec.loss_with_cross_entropy](runtime::nn::Module& model,
                                                    const Tensor& tokens, const Tensor& targets,
                                                    runtime::Reduction reduction) {
    return loss(model, tokens, targets, reduction, default_cross_entropy);
  };
  spec.parallelize = parallelize;
  add_pipeline_stages<Transformer, ModelArgs>(spec, args);
  add_cached_decoding<Transformer>(spec);
  add_sequence_sharding<Transformer>(spec);
  spec.check_tensor_parallel = [args](int64_t tp) { check_tensor_parallel(args(), tp); };
  spec.num_params = [args]() { return count_parameters(args()).total; };
  spec.flops_per_token = [args](int64_t seq_len) { return flops_per_token(args(), seq_len); };
  spec.architecture = [args] { return hf_config_json(args(), "float32"); };
  spec.architecture_differences = [args](const std::string& saved, const std::string& where) {
    return architecture_differences(args(), "the model asked for",
                                    args_from_hf_config_text(saved, where), "the checkpoint");
  };
  return spec;
}

}  // namespace

ModelSpec make_model_spec(const std::string& flavor) { return spec_of(flavor_args(flavor), flavor); }

ModelSpec make_model_spec_from_architecture(const std::string& text, const std::string& where) {
  return spec_of(args_from_hf_config_text(text, where), kFlavorFromCheckpoint);
}

}  // namespace mt::models::llama
