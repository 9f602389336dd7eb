// The float8 training recipes (torchao's names), apart from the op (runtime/ops/float8.h) so that
// nn::Linear can name one: how float8_linear scales its operands.
#pragma once

namespace mt::runtime {

enum class Float8Recipe {
  Tensorwise,  // one dynamic scale per tensor; gradients in e5m2
  Rowwise,     // one scale per row along the contracted dimension, powers of two; all e4m3
};
const char* float8_recipe_name(Float8Recipe recipe);  // "tensorwise" / "rowwise"

}  // namespace mt::runtime
