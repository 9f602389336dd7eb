// MixedPrecisionPolicy: the dtypes FSDP computes and reduces in (torch FSDP2's policy).
//
// Sharded parameters keep their own dtype (the f32 master weights the optimizer steps). Before a
// module runs, its parameters are all-gathered in `param_dtype` (e.g. bf16): the forward and
// backward compute in it, and the unsharded gradients come out in it. Gradients are then
// converted to `reduce_dtype` (e.g. f32), reduce-scattered in it, and stored on the shards in the
// parameters' own dtype. Unset fields mean "the parameter's own dtype" (reduce_dtype: param_dtype).
#pragma once

#include <optional>

#include "runtime/core/dtype.h"

namespace mt::parallel {

struct MixedPrecisionPolicy {
  std::optional<runtime::DType> param_dtype;
  std::optional<runtime::DType> reduce_dtype;
};

}  // namespace mt::parallel
