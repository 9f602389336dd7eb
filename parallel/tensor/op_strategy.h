// Sharding strategies of DTensor ops and the dispatcher that picks one (torch's DTensor op
// dispatch, simplified).
//
// An op registers, under its name, what it can do on ONE mesh dimension: a list of strategies,
// each the placements its inputs must have there and the placement its output then has, e.g.
// linear(x, W): (Replicate, Shard(0)) -> Shard(-1) (column-wise), (Shard(-1), Shard(1)) ->
// Partial(sum) (row-wise), (Shard(batch), Replicate) -> Shard(batch), ... On an N-D mesh every
// mesh dim picks one of them independently (the product). dispatch() costs each combination by
// the bytes its inputs' redistributions move (plan_redistribute; a shard turned Partial counts
// the whole tensor, which a later reduction will move), takes the cheapest (ties: the fewest
// steps, then the earlier listed), redistributes the inputs (differentiably), and runs the op's local kernel on
// the local pieces: the result is a DTensor with the strategy's output placements, whose gradient
// is expected in the DTensor-op form (redistribute.h), in which the local kernels' own backward
// formulas are exact. No strategy at all is an error naming the op and the placements: nothing
// is ever gathered silently.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/mesh/dtensor.h"

namespace mt::parallel {

// Integer arguments an op's strategies and kernel depend on (dims, reduction, ...).
using OpArgs = std::vector<int64_t>;

struct DimStrategy {
  std::vector<Placement> inputs;  // one per input
  Placement output;
};

struct OpRule {
  // The strategies on one mesh dim, from the inputs' global shapes and the op's arguments.
  std::function<std::vector<DimStrategy>(const std::vector<Shape>& shapes, const OpArgs& args)>
      strategies;
  // The output's global shape.
  std::function<Shape(const std::vector<Shape>& shapes, const OpArgs& args)> output_shape;
  // The kernel's backward needs the output's gradient whole on every rank (a loss whose kernel
  // reduces over ranks itself), not in the DTensor-op form.
  // With it, the kernel's backward also gives whole gradients for its Replicate inputs.
  bool whole_output_grad = false;
  // Optional: whether a whole-mesh strategy suits these shapes on `mesh` (e.g. attention's heads
  // split so that every rank holds whole groups of query heads with their kv heads).
  std::function<bool(const std::vector<Shape>& shapes, const std::vector<std::vector<Placement>>& inputs,
                     const DeviceMesh& mesh)>
      admits = nullptr;
};

void register_op_rule(const std::string& op, OpRule rule);
const OpRule& op_rule(const std::string& op);  // throws naming the op when none is registered

// A strategy for the whole mesh: placements per input, and the output's.
struct MeshStrategy {
  std::vector<std::vector<Placement>> inputs;
  std::vector<Placement> output;
  int64_t bytes = 0;  // moved by the inputs' redistributions
  int64_t steps = 0;  // their steps, local ones included: ties go to the fewest
};

// The cheapest strategy for inputs with these placements (all on `mesh`).
MeshStrategy choose_strategy(const std::string& op, const std::vector<const DTensor*>& inputs,
                             const OpArgs& args = {});

// Runs `op`: redistributes the inputs to the chosen strategy and calls `kernel` on their local
// pieces (it also receives the strategy, for kernels that differ by placement).
using LocalKernel =
    std::function<Tensor(const std::vector<Tensor>& locals, const MeshStrategy& strategy)>;
DTensor dispatch(const std::string& op, const std::vector<DTensor>& inputs, const OpArgs& args,
                 const LocalKernel& kernel);

}  // namespace mt::parallel
