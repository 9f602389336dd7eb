// Embedding lookup: rows of a [V, D] table gathered by integer ids. The gradient w.r.t. the table
// is a scatter-add done by a dedicated kernel whose result does not depend on the thread count
// (ids are sorted; each row's contributions are summed in id-position order by one thread).
#pragma once

#include "runtime/core/tensor.h"

namespace mt::runtime {

// weight [V, D] (floating), ids (i32 or i64) of any shape -> [ids..., D]. An id outside [0, V)
// throws naming the id, its position and V. Differentiable w.r.t. weight (a dense [V, D]
// gradient, zero in rows no id selected; 16-bit weights accumulate in f32).
Tensor embedding(const Tensor& weight, const Tensor& ids);

}  // namespace mt::runtime
