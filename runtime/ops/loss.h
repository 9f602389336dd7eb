// Losses. cross_entropy is fused: the forward keeps only the per-row logsumexp ([N] floats) and
// the backward rebuilds softmax from the logits on the fly, so no [N, V] probability tensor is
// ever stored. Computed in f32 for 16-bit logits, f64 for f64; the result has the logits' dtype
// unless `out_dtype` says otherwise (f32 for a training loss over bf16 logits: a 16-bit loss would
// round it).
#pragma once

#include <cstdint>
#include <optional>

#include "runtime/core/tensor.h"

namespace mt::runtime {

enum class Reduction : uint8_t { None, Mean, Sum };

// Negative log-likelihood of `targets` under softmax(logits) along the last dim.
// logits [..., V] (floating), targets [...] (i64 or i32) with the logits' leading shape. Targets
// equal to `ignore_index` contribute no loss and no gradient; any other target outside [0, V)
// throws (naming the value and its position). Reductions: None -> per-target losses [...] (0 at
// ignored targets); Sum -> 0-D sum; Mean -> 0-D sum / (number of non-ignored targets), and 0 (not
// NaN) when every target is ignored. Differentiable w.r.t. logits.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::Mean,
                     std::optional<DType> out_dtype = std::nullopt);

}  // namespace mt::runtime
