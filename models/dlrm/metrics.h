// DLRM's loss and metric: binary cross-entropy with logits, and the exact ROC AUC.
//
// bce_with_logits(x, y) = max(x, 0) - x y + log(1 + exp(-|x|)) elementwise, the numerically
// stable form (no overflow for any |x|), computed with runtime ops; its backward is recorded in
// closed form, (sigmoid(x) - y) * grad (/ N for the mean), also with runtime ops: the composed
// max/abs ops would give a one-sided subgradient at x = 0 exactly. Not differentiated w.r.t. y.
//
// roc_auc: the exact area under the ROC curve, P(score of a random positive > score of a random
// negative) + 0.5 P(equal), computed by sorting the scores (Mann-Whitney U): positives' ranks
// summed with tied scores given their average rank. Needs at least one positive and one negative
// (throws otherwise); labels must be 0 or 1.
#pragma once

#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/ops/loss.h"

namespace mt::models::dlrm {

using runtime::Tensor;

// logits and labels of one shape (labels in [0, 1], the logits' dtype). Reduction::Mean by default.
Tensor bce_with_logits(const Tensor& logits, const Tensor& labels,
                       runtime::Reduction reduction = runtime::Reduction::Mean);

double roc_auc(const std::vector<double>& scores, const std::vector<double>& labels);
double roc_auc(const Tensor& scores, const Tensor& labels);  // any shapes of equal numel

}  // namespace mt::models::dlrm
