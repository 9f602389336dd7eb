// Activation checkpointing: trade compute for memory by not keeping a region's activations.
//
//   Tensor y = autograd::checkpoint([blk](const std::vector<Tensor>& in) { return (*blk)(in[0]); },
//                                   {x});
//
// Forward runs `fn` under no_grad (nothing inside is saved) and records ONE node whose inputs are
// `inputs`. Its backward re-runs `fn` with grad enabled on detached copies of the inputs (each
// requiring grad where the original did), backpropagates the incoming gradients through the
// recomputed graph with autograd::backward (parameters used inside `fn` receive their gradients
// there, as leaves), and returns the inputs' gradients.
//
// Requirements on `fn`: it must compute the same thing when run again (randomness keyed
// explicitly, as runtime ops do), use only the inputs it is given plus state that outlives
// backward (capture by value), and not modify its inputs in place. The inputs are saved and
// checked for in-place modification before the recompute.
//
// With a SavePolicy (runtime/autograd/selective_checkpoint.h), the forward keeps the outputs of
// the ops the policy names and the recompute reuses them (op-level selective checkpointing).
//
// When grad mode is on, the outputs always require grad (parameters inside `fn` may need
// gradients even when no input does); under no_grad `fn` simply runs.
#pragma once

#include <functional>
#include <vector>

#include "runtime/autograd/selective_checkpoint.h"
#include "runtime/core/tensor.h"

namespace mt::runtime::autograd {

using CheckpointFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;
using CheckpointMultiFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                  const SavePolicy& policy = nullptr);

// Where the calling thread stands relative to checkpointed regions: outside them (None), in a
// region's first run during forward (Forward, under no_grad), or in its re-run during backward
// (Recompute; a region nested in a re-run region reports Recompute too). Modules that update
// their own state in forward (e.g. MoE token counts) use it to do so once per training forward.
enum class CheckpointPhase { None, Forward, Recompute };
CheckpointPhase checkpoint_phase();
// As checkpoint(), for a region with several (floating) outputs.
std::vector<Tensor> checkpoint_multi(const CheckpointMultiFn& fn, const std::vector<Tensor>& inputs,
                                     const SavePolicy& policy = nullptr);

}  // namespace mt::runtime::autograd
