// DTensor RoPE and grouped matmul: their sharding rules and local kernels.
#include "parallel/tensor/dtensor_ops.h"
#include "parallel/tensor/op_strategy.h"
#include "runtime/core/error.h"
#include "runtime/ops/grouped_matmul.h"
#include "runtime/ops/rope.h"

namespace mt::parallel::dtensor {

namespace {

using Shapes = std::vector<Shape>;
const Placement R = Replicate{};
const Placement P = Partial{ReduceOp::Sum};

void register_rules() {
  OpRule rope;
  rope.strategies = [](const Shapes&, const OpArgs&) {
    return std::vector<DimStrategy>{{{Shard{0}}, Shard{0}}, {{Shard{1}}, Shard{1}},
                                    {{Shard{2}}, Shard{2}}, {{R}, R}, {{P}, P}};
  };
  rope.output_shape = [](const Shapes& s, const OpArgs&) { return s[0]; };
  register_op_rule("apply_rope", rope);

  OpRule gmm;
  gmm.strategies = [](const Shapes&, const OpArgs&) {
    return std::vector<DimStrategy>{{{R, R}, R},
                                    {{R, Shard{1}}, Shard{1}},         // column-wise experts
                                    {{Shard{1}, Shard{2}}, P},          // row-wise experts
                                    {{P, R}, P}};
  };
  gmm.output_shape = [](const Shapes& s, const OpArgs&) { return Shape{s[0][0], s[1][1]}; };
  register_op_rule("grouped_mm", gmm);
}

void ensure_rules() {
  static const bool once = (register_rules(), true);
  (void)once;
}

}  // namespace

DTensor apply_rope(const DTensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset) {
  ensure_rules();
  MT_CHECK(x.global_shape.size() == 4, "DTensor apply_rope: expected x [B, T, H, head_dim], got ",
           x.global_shape);
  return dispatch("apply_rope", {x}, {},
                  [mesh = x.mesh, global = x.global_shape, cos, sin, position_offset](
                      const std::vector<Tensor>& l, const MeshStrategy& s) {
                    // A sequence shard starts at its own position.
                    const int64_t first = local_piece(global, *mesh, s.inputs[0]).offset[1];
                    return runtime::apply_rope(l[0], cos, sin, position_offset + first);
                  });
}

DTensor grouped_mm(const DTensor& x, const DTensor& w, const std::vector<int64_t>& counts) {
  ensure_rules();
  MT_CHECK(x.global_shape.size() == 2 && w.global_shape.size() == 3 &&
               x.global_shape[1] == w.global_shape[2],
           "DTensor grouped_mm: expected x [N, K] and w [G, M, K], got ", x.global_shape, " and ",
           w.global_shape);
  return dispatch("grouped_mm", {x, w}, {}, [counts](const std::vector<Tensor>& l, const MeshStrategy&) {
    return runtime::grouped_mm(l[0], l[1], counts);
  });
}

}  // namespace mt::parallel::dtensor
