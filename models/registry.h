// The model registry: model name + flavor -> ModelSpec, everything the trainer and the tools need
// to build a model, run it, compute its loss, describe its size and cost, and parallelize it,
// without knowing which model it is.
//
//   ModelSpec spec = models::get_model_spec("llama3", "debugmodel");
//   std::any_cast<llama::ModelArgs&>(*spec.args).vocab_size = tokenizer.vocab_size();
//   auto model = spec.build({.seed = 42, .activation_checkpoint = "full"});
//   Tensor loss = spec.loss(*model, tokens, targets);
//
// Registered: "llama3" (models/llama) with flavors debugmodel, 1B, 3B, 8B, 70B, 405B, and any
// Llama 3 shape from a saved architecture (model_spec_from_architecture); "deepseek_v3"
// (models/moe, MoE) with flavors moe_debug, 16B, 671B.
// Unknown names or flavors throw mt::Error listing the valid ones.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/llama/kv_cache.h"
#include "models/sequence_shard.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"
#include "runtime/ops/loss.h"

namespace mt::models {

using runtime::Tensor;

// The parallel layout (device mesh, FSDP settings): models/parallel_context.h.
struct ParallelContext;

struct BuildOptions {
  uint64_t seed = 0;                           // init: every parameter keyed by (seed, FQN)
  runtime::DType dtype = runtime::DType::F32;  // parameter dtype
  // Per transformer block: "none" | "full" | "selective:N" (every N-th block) | "selective:op"
  // (every block, keeping attention and every other matmul output).
  std::string activation_checkpoint = "none";
};

struct ModelSpec {
  std::string name;
  std::string flavor;
  // The model's hyper-parameters (llama::ModelArgs for "llama3"), editable before build() (e.g.
  // vocab_size from the tokenizer, max_seq_len from the training seq_len): build, num_params and
  // flops_per_token read the args held here at call time.
  std::shared_ptr<std::any> args;

  // Allocates and initialises the model.
  std::function<std::shared_ptr<runtime::nn::Module>(const BuildOptions&)> build;
  // tokens [B, T] -> logits [B, T, V].
  std::function<Tensor(runtime::nn::Module& model, const Tensor& tokens)> forward;
  // Token cross-entropy of forward(tokens) against targets [B, T] (ignore_index -100): Mean is the
  // mean over valid tokens, Sum the sum (for gradient accumulation over micro-batches); plus what
  // else the model's objective holds (deepseek_v3: its auxiliary loss, while training).
  std::function<Tensor(runtime::nn::Module& model, const Tensor& tokens, const Tensor& targets,
                       runtime::Reduction reduction)>
      loss;
  // Optional: `loss` with another cross-entropy over the logits: the trainer's loss-parallel one
  // under tensor parallelism, whose plan leaves the logits split over the vocabulary (this rank's
  // columns). `loss` is this with default_cross_entropy.
  using CrossEntropy = std::function<Tensor(const Tensor& logits, const Tensor& targets,
                                            runtime::Reduction reduction)>;
  std::function<Tensor(runtime::nn::Module& model, const Tensor& tokens, const Tensor& targets,
                       runtime::Reduction reduction, const CrossEntropy& cross_entropy)>
      loss_with_cross_entropy;
  // From the args alone (nothing allocated): unique parameter count, training FLOPs per token.
  std::function<int64_t()> num_params;
  std::function<double(int64_t seq_len)> flops_per_token;
  // Applies FSDP (and, later, expert parallelism / sharded embeddings) to a built model
  // (torchtitan's parallelize_fn); build the optimizer after it.
  std::function<void(runtime::nn::Module& model, const ParallelContext& context)> parallelize;
  // Optional: the model has a tensor-parallel plan; throws, naming the numbers, when it cannot be
  // split over `tp` ranks. Null: no plan (tensor_parallel_degree > 1 is an error).
  std::function<void(int64_t tp)> check_tensor_parallel;
  // Optional (llama3): the model's architecture as text (a Hugging Face config.json), saved with
  // checkpoints so that tools and later runs build the same model, and the fields in which these
  // args differ from a saved one (one line each; empty: the same model).
  std::function<std::string()> architecture;
  std::function<std::vector<std::string>(const std::string& saved, const std::string& where)>
      architecture_differences;
  // Optional (pipeline parallelism, parallel/pipeline): the model's layer count, and the
  // pipeline stage holding layers [begin, end) (the embeddings on the first stage, the final norm
  // and output on the last), built alone with the whole model's FQNs and initial values.
  // stage_forward maps the previous stage's output (the tokens, on the first stage) to the next
  // stage's input, or on the last stage to the logits `loss` computes its cross-entropy from;
  // stages pass tensors of hidden_shape(batch, seq) in the parameters' (compute) dtype. A stage
  // whose layers have an auxiliary loss (MoE load balancing) returns it beside (0-D, the sum of
  // its layers' terms, as the whole model's forward adds them): the trainer adds it to the
  // micro-batch's loss as `loss` does, and backpropagates it from that stage.
  struct StageOutput {
    Tensor hidden;
    Tensor aux_loss;  // undefined: none
  };
  std::function<int64_t()> num_layers;
  std::function<std::shared_ptr<runtime::nn::Module>(const BuildOptions&, int64_t begin,
                                                     int64_t end)>
      build_stage;
  std::function<StageOutput(runtime::nn::Module& stage, const Tensor& input)> stage_forward;
  std::function<std::vector<int64_t>(int64_t batch, int64_t seq)> hidden_shape;
  // Optional (the end-of-run text sample: llama3, deepseek_v3): incremental decoding of the model
  // or a pipeline stage. make_kv_cache: an empty KV cache of its layers for one sequence, in
  // `dtype` (the compute dtype), holding kv_heads / kv_head_shards heads (a tensor-parallel
  // rank's); forward_cached: its output (hidden states, or f32 logits [1, T, V] where it holds the
  // output) for the next tokens (or the previous stage's hidden states) at the cache's position,
  // appending to the cache.
  std::function<llama::KVCache(runtime::nn::Module& model, runtime::DType dtype,
                               int64_t kv_head_shards)>
      make_kv_cache;
  std::function<Tensor(runtime::nn::Module& model, const Tensor& input, llama::KVCache& cache)>
      forward_cached;
  // Optional (llama3, deepseek_v3: context parallelism): makes `model` (or a pipeline stage)
  // compute on a rank's share of each sequence as SequenceShard says (its forwards, not its
  // decoding), until called with nullopt. Null shard_sequence: context_parallel_degree > 1 is an
  // error.
  std::function<void(runtime::nn::Module& model, const std::optional<SequenceShard>& shard)>
      shard_sequence;
  // Optional: after each optimizer step (MoE load balancing). all_reduce_sum sums a tensor over
  // the data-parallel ranks. Returns metrics to log (name -> value). A metric that is a mean
  // over layers also reports each layer as <name>_layer<i>: under pipeline parallelism the hook
  // runs on each stage, and the trainer recomputes <name> from every stage's layer values.
  std::function<std::map<std::string, double>(runtime::nn::Module&,
                                              const std::function<void(Tensor&)>& all_reduce_sum)>
      after_optimizer_step;
};

// The flavor that builds a model from the architecture a checkpoint saved.
inline constexpr const char* kFlavorFromCheckpoint = "from_checkpoint";

// runtime::cross_entropy with ignore_index -100, accumulated in f32 for 16-bit logits (the
// models' loss; with 16-bit logits, the values of the f32 logits' loss).
Tensor default_cross_entropy(const Tensor& logits, const Tensor& targets,
                             runtime::Reduction reduction);

std::vector<std::string> model_names();
// Throws mt::Error listing the valid names when `name` is unknown.
std::vector<std::string> model_flavors(const std::string& name);
// Throws mt::Error listing the valid names (or flavors of `name`) when either is unknown.
ModelSpec get_model_spec(const std::string& name, const std::string& flavor);
// The spec of a saved architecture (text ModelSpec::architecture wrote; `where` names its origin
// in errors), flavor "from_checkpoint". Throws when model `name` saves no architecture.
ModelSpec model_spec_from_architecture(const std::string& name, const std::string& architecture,
                                       const std::string& where);

}  // namespace mt::models
