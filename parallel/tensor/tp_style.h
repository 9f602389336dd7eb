// Tensor-parallel styles (torch.distributed.tensor.parallel): how a module's parameters are split
// over a 1-D tp mesh and how its inputs and outputs are laid out. They work through the module's
// hooks, so the module's own forward runs unchanged on local pieces (torch's
// use_local_output=True): model files stay free of parallel code.
//
//   TensorParallel tp(tp_mesh);
//   tp.apply(*model, "tok_embeddings", RowwiseParallel{.input = Replicate{}, .output = Shard{1}});
//   tp.apply(*model, "layers.0.attention", PrepareModuleInput{Shard{1}, Replicate{}});
//   tp.apply(*model, "layers.0.attention.wq", ColwiseParallel{});
//   ...
//   fully_shard(*block, dp_mesh, {.outer_of = tp.outer_sharding(world_mesh)});  // 2-D
//
// Styles (activations are local tensors between modules; "layout" = their placement on tp):
// - ColwiseParallel: Linear weight [out, in] split on dim 0 (Embedding: on dim 1). The input
//   (layout `input`; nullopt: a parent's PrepareModuleInput already made it Replicate) is made
//   Replicate; the output stays Shard(-1) unless `output` asks for another layout.
// - RowwiseParallel: Linear weight split on dim 1, input Shard(-1) (or `input` chunked to it),
//   output Partial(sum) reduced to `output` (Replicate: all-reduce; Shard(1): reduce-scatter).
//   Embedding: weight split on dim 0; each rank looks up the ids in its rows, zeros elsewhere.
// - SequenceParallel: a module (a norm; a MoE layer's router and experts) computing on
//   sequence-sharded activations (Shard(1)) with parameters replicated over tp: their gradients
//   are summed over tp (each rank saw its part of the sequence), by a hook on the parameter
//   leaves the module computes with (FSDP's gathered ones). Apply it after fully_shard when the
//   module is an FSDP group of its own, so that its hook runs after FSDP's gather.
// - PrepareModuleInput: the module's first input from layout `input` to `desired`, for children
//   that compute with it split (column-wise), whose gradients therefore come partial: an
//   all-gather forward is a reduce-scatter backward (Megatron's sequence parallelism), and
//   Replicate -> Replicate is Megatron's "f" (identity forward, all-reduce backward).
// - PrepareModuleOutput: the module's first output from layout `output` to `desired` (e.g. a
//   MoE layer run on sequence shards without sequence parallelism elsewhere: Shard(1) ->
//   Replicate, an all-gather).
//
// Gradient forms follow parallel/tensor/redistribute.h. Tied parameters (one tensor in two
// slots) must be split the same way by both styles, and then stay one tensor.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "parallel/fsdp/fsdp_param.h"
#include "parallel/mesh/dtensor.h"
#include "runtime/nn/module.h"

namespace mt::parallel {

struct ColwiseParallel {
  std::optional<Placement> input = Replicate{};
  Placement output = Shard{-1};
};
struct RowwiseParallel {
  Placement input = Shard{-1};
  Placement output = Replicate{};
};
struct SequenceParallel {};
struct PrepareModuleInput {
  Placement input;
  Placement desired;
};
struct PrepareModuleOutput {
  Placement output;
  Placement desired;
};
using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel,
                                   PrepareModuleInput, PrepareModuleOutput>;

class TensorParallel {
 public:
  explicit TensorParallel(std::shared_ptr<DeviceMesh> tp_mesh);

  // Applies `style` to the module at `fqn` under `root` (throws naming the FQN when it is not a
  // module the style knows: Linear, Embedding, RMSNorm; PrepareModuleInput fits any).
  void apply(runtime::nn::Module& root, const std::string& fqn, const ParallelStyle& style);

  // For FSDP over the data-parallel dims of `mesh` (which holds a "tp" dim of this mesh's size):
  // each split parameter's placement there (Replicate on the other dims) and global shape; null
  // for parameters no style split.
  std::function<std::optional<OuterSharding>(const runtime::Tensor&)> outer_sharding(
      std::shared_ptr<DeviceMesh> mesh) const;

  // The split parameters: the local piece, its placement on tp and the whole tensor's shape.
  struct SplitParam {
    std::string fqn;
    runtime::Tensor original, local;
    Placement placement;
    Shape global_shape;
  };
  const std::vector<SplitParam>& split_params() const { return split_; }
  const std::shared_ptr<DeviceMesh>& mesh() const { return mesh_; }

 private:
  runtime::Tensor split(const std::string& fqn, runtime::Tensor& slot, Placement placement);
  std::shared_ptr<DeviceMesh> mesh_;
  std::vector<SplitParam> split_;
};

}  // namespace mt::parallel
