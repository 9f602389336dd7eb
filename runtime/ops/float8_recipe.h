// The float8 training recipes (torchao's names), apart from the op (runtime/ops/float8.h) so that
// nn::Linear can name one: how float8_linear scales its operands; and the amax reduction a layer
// split by tensor parallelism casts with.
#pragma once

#include <functional>

namespace mt::runtime {

class Tensor;

// Makes local amaxes (an f32 tensor, in place: [1] for a tensor, or one per row, or per (group,
// row)) the whole tensor's: e.g. an all-reduce (max) over the tensor-parallel ranks that each
// hold a piece of it, so each piece is scaled as the whole tensor. Every rank of that group calls
// it for the same casts in the same order.
using Float8AmaxReduce = std::function<void(Tensor& amax)>;

enum class Float8Recipe {
  Tensorwise,  // one dynamic scale per tensor; gradients in e5m2
  Rowwise,     // one scale per row along the contracted dimension, powers of two; all e4m3
};
const char* float8_recipe_name(Float8Recipe recipe);  // "tensorwise" / "rowwise"

}  // namespace mt::runtime
