// The strategy registry and the dispatcher.
#include "parallel/tensor/op_strategy.h"

#include <map>
#include <mutex>

#include "parallel/tensor/redistribute.h"
#include "runtime/core/error.h"

namespace mt::parallel {

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, OpRule>& registry() {
  static std::map<std::string, OpRule> rules;
  return rules;
}

std::string inputs_text(const std::vector<const DTensor*>& inputs) {
  std::string out;
  for (const DTensor* x : inputs) {
    out += (out.empty() ? "" : ", ") + placements_name(x->placements) + " of " +
           detail::concat(x->global_shape);
  }
  return out;
}

}  // namespace

void register_op_rule(const std::string& op, OpRule rule) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[op] = std::move(rule);
}

const OpRule& op_rule(const std::string& op) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto it = registry().find(op);
  MT_CHECK(it != registry().end(), "DTensor: no sharding rule is registered for op '", op, "'");
  return it->second;
}

MeshStrategy choose_strategy(const std::string& op, const std::vector<const DTensor*>& inputs,
                             const OpArgs& args) {
  MT_CHECK(!inputs.empty(), "DTensor op '", op, "': no inputs");
  const DeviceMesh& mesh = *inputs[0]->mesh;
  for (const DTensor* x : inputs) {
    MT_CHECK(x->mesh.get() == &mesh, "DTensor op '", op, "': inputs on different meshes (",
             mesh.describe(), " and ", x->mesh->describe(), ")");
  }
  std::vector<Shape> shapes;
  for (const DTensor* x : inputs) shapes.push_back(x->global_shape);
  const OpRule& rule = op_rule(op);
  const std::vector<DimStrategy> per_dim = rule.strategies(shapes, args);
  const size_t ndim = size_t(mesh.ndim());
  MeshStrategy best;
  bool found = false;
  // Every combination of per-dim strategies, in order (the first listed wins ties).
  std::vector<size_t> pick(ndim, 0);
  while (!per_dim.empty()) {
    MeshStrategy s;
    s.inputs.assign(inputs.size(), std::vector<Placement>(ndim));
    s.output.resize(ndim);
    for (size_t d = 0; d < ndim; ++d) {
      const DimStrategy& ds = per_dim[pick[d]];
      for (size_t k = 0; k < inputs.size(); ++k) s.inputs[k][d] = ds.inputs[k];
      s.output[d] = ds.output;
    }
    bool valid = !rule.admits || rule.admits(shapes, s.inputs, mesh);
    for (size_t k = 0; k < inputs.size() && valid; ++k) {
      try {
        const int64_t esize = int64_t(runtime::dtype_size(inputs[k]->local.dtype()));
        const RedistributePlan plan =
            plan_redistribute(shapes[k], esize, mesh, inputs[k]->placements, s.inputs[k]);
        s.bytes += plan.bytes();
        s.steps += int64_t(plan.steps.size());
        // A shard turned Partial moves nothing now but leaves a whole-size tensor to reduce
        // later: cost it as that reduction's bytes, so the dispatcher does not defer a gather.
        int64_t whole = esize;
        for (int64_t d : shapes[k]) whole *= d;
        for (const RedistributeStep& step : plan.steps)
          if (step.kind == RedistributeKind::PadToPartial) s.bytes += whole;
      } catch (const Error&) {
        valid = false;  // e.g. two mesh dims sharding one tensor dim in an order it cannot have
      }
    }
    if (valid && (!found || s.bytes < best.bytes ||
                  (s.bytes == best.bytes && s.steps < best.steps))) {
      best = std::move(s);
      found = true;
    }
    size_t d = 0;
    while (d < ndim && ++pick[d] == per_dim.size()) pick[d++] = 0;
    if (d == ndim) break;
  }
  MT_CHECK(found, "DTensor op '", op, "' has no sharding strategy for inputs ", inputs_text(inputs),
           " on ", mesh.describe());
  return best;
}

DTensor dispatch(const std::string& op, const std::vector<DTensor>& inputs, const OpArgs& args,
                 const LocalKernel& kernel) {
  std::vector<const DTensor*> ptrs;
  for (const DTensor& x : inputs) ptrs.push_back(&x);
  const MeshStrategy s = choose_strategy(op, ptrs, args);
  const OpRule& rule = op_rule(op);
  std::vector<Tensor> locals;
  std::vector<Shape> shapes;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const DTensor& x = inputs[k];
    shapes.push_back(x.global_shape);
    // The form the kernel's backward gives this input's gradient in.
    const std::vector<Placement> kernel_grad = rule.whole_output_grad
                                                   ? whole_grad_placements(s.inputs[k])
                                                   : op_grad_placements(s.inputs[k]);
    const std::vector<Placement> x_grad =
        x.grad_placements.empty() ? op_grad_placements(x.placements) : x.grad_placements;
    if (x.placements == s.inputs[k] && x_grad == kernel_grad) {
      locals.push_back(x.local);
    } else {
      locals.push_back(redistribute(x, s.inputs[k], kernel_grad, "dtensor." + op).local);
    }
  }
  Tensor out = kernel(locals, s);
  const DeviceMesh& mesh = *inputs[0].mesh;
  const Shape global = rule.output_shape(shapes, args);
  const LocalPiece piece = local_piece(global, mesh, s.output);
  MT_CHECK(piece.shape == out.shape(), "DTensor op '", op, "': the local kernel returned ",
           out.shape(), " but ", placements_name(s.output), " of ", global, " is ", piece.shape,
           " on this rank");
  std::vector<Placement> grad =
      rule.whole_output_grad ? whole_grad_placements(s.output) : op_grad_placements(s.output);
  return DTensor{out, inputs[0].mesh, s.output, global, piece.offset, std::move(grad)};
}

}  // namespace mt::parallel
