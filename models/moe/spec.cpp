#include "models/moe/spec.h"

#include <memory>

#include "models/moe/load_balancing.h"
#include "models/moe/model.h"
#include "models/moe/parallelize.h"
#include "models/stage_spec.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/reduce.h"

namespace mt::models::moe {

namespace {

Transformer& as_moe(runtime::nn::Module& model) {
  auto* t = dynamic_cast<Transformer*>(&model);
  MT_CHECK(t != nullptr, "deepseek_v3 spec: expected a moe Transformer, got a module of type ",
           model.type_name());
  return *t;
}

}  // namespace

ModelSpec make_model_spec(const std::string& flavor) {
  ModelSpec spec;
  spec.name = "deepseek_v3";
  spec.flavor = flavor;
  spec.args = std::make_shared<std::any>(flavor_args(flavor));
  auto args_ptr = spec.args;
  auto args = [args_ptr]() -> const ModelArgs& {
    const auto* a = std::any_cast<ModelArgs>(args_ptr.get());
    MT_CHECK(a != nullptr, "deepseek_v3 spec: ModelSpec::args must hold a moe::ModelArgs");
    return *a;
  };
  spec.build = [args](const BuildOptions& options) -> std::shared_ptr<runtime::nn::Module> {
    const auto ac = llama::parse_activation_checkpointing(options.activation_checkpoint);
    auto model = std::make_shared<Transformer>(args(), options.seed,
                                               TensorOptions{}.with_dtype(options.dtype));
    model->set_activation_checkpointing(ac);
    return model;
  };
  spec.forward = [](runtime::nn::Module& model, const Tensor& tokens) {
    return as_moe(model)(tokens);
  };
  // The cross-entropy over the compute-dtype logits plus, while training, the auxiliary loss
  // (0-dim; with Sum, times the valid tokens, as the cross-entropy counts them).
  spec.loss_with_cross_entropy = [](runtime::nn::Module& model, const Tensor& tokens,
                                    const Tensor& targets, runtime::Reduction reduction,
                                    const ModelSpec::CrossEntropy& cross_entropy) {
    const Transformer::Output out = as_moe(model).forward_with_aux(tokens, false);
    Tensor loss = cross_entropy(out.logits, targets, reduction);
    if (out.aux_loss.defined() && runtime::GradMode::enabled() &&
        reduction != runtime::Reduction::None) {
      Tensor aux = out.aux_loss.to(loss.dtype());
      if (reduction == runtime::Reduction::Sum) {
        // The count stays a tensor: on a GPU, reading it would sync the host every micro-batch.
        const Tensor valid = runtime::sum(runtime::ne(targets, -100.0));
        aux = runtime::mul(aux, valid.to(aux.dtype()));
      }
      loss = runtime::add(loss, aux);
    }
    return loss;
  };
  spec.loss = [loss = spec.loss_with_cross_entropy](runtime::nn::Module& model,
                                                    const Tensor& tokens, const Tensor& targets,
                                                    runtime::Reduction reduction) {
    return loss(model, tokens, targets, reduction, default_cross_entropy);
  };
  spec.num_params = [args]() { return count_parameters(args()).total; };
  spec.flops_per_token = [args](int64_t seq_len) { return flops_per_token(args(), seq_len); };
  spec.parallelize = &parallelize;
  add_pipeline_stages<Transformer, ModelArgs>(spec, args);
  add_cached_decoding<Transformer>(spec);
  add_sequence_sharding<Transformer>(spec);
  spec.check_tensor_parallel = [args](int64_t tp) { check_tensor_parallel(args(), tp); };
  spec.after_optimizer_step = [](runtime::nn::Module& model,
                                 const std::function<void(Tensor&)>& all_reduce_sum) {
    return update_expert_bias(as_moe(model), all_reduce_sum);
  };
  return spec;
}

}  // namespace mt::models::moe
