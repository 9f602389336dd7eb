#include "models/dlrm/metrics.h"

#include <algorithm>
#include <numeric>

#include "runtime/autograd/function.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"

namespace mt::models::dlrm {

namespace rt = mt::runtime;

Tensor bce_with_logits(const Tensor& logits, const Tensor& labels, rt::Reduction reduction) {
  MT_CHECK(logits.defined() && labels.defined(), "bce_with_logits: undefined input");
  MT_CHECK(logits.shape() == labels.shape(), "bce_with_logits: logits ", logits.shape(),
           " and labels ", labels.shape(), " must have the same shape");
  MT_CHECK(logits.is_floating_point() && labels.dtype() == logits.dtype(),
           "bce_with_logits: expected labels of the logits' floating dtype, got logits ",
           logits.dtype(), " and labels ", labels.dtype());
  const Tensor x = logits.detach();
  const Tensor y = labels.detach();
  Tensor out;
  {
    rt::NoGradGuard no_grad;
    const Tensor per = rt::add(rt::sub(rt::relu(x), rt::mul(x, y)),
                               rt::log(rt::add(rt::exp(rt::neg(rt::abs(x))), 1.0)));
    out = reduction == rt::Reduction::None  ? per.contiguous()
          : reduction == rt::Reduction::Sum ? rt::sum(per)
                                            : rt::mean(per);
  }
  if (rt::autograd::any_requires_grad({logits})) {
    const double scale = reduction == rt::Reduction::Mean && x.numel() > 0 ? 1.0 / double(x.numel()) : 1.0;
    rt::autograd::record(
        "bce_with_logits", {logits}, {out},
        [sx = rt::autograd::SavedTensor(x), sy = rt::autograd::SavedTensor(y), scale](
            const rt::autograd::BackwardArgs& args) -> std::vector<Tensor> {
          Tensor g = rt::sub(rt::sigmoid(sx.get()), sy.get());
          g = rt::mul(g, args.grad(0).to(g.dtype()));  // broadcasts a 0-D gradient
          if (scale != 1.0) g = rt::mul(g, scale);
          return {g};
        });
  }
  return out;
}

double roc_auc(const std::vector<double>& scores, const std::vector<double>& labels) {
  MT_CHECK(scores.size() == labels.size(), "roc_auc: ", scores.size(), " scores but ",
           labels.size(), " labels");
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double rank_sum = 0.0;  // of positives, 1-based ranks, ties averaged
  double pos = 0.0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double avg_rank = 0.5 * double(i + 1 + j);  // mean of ranks i+1 .. j
    for (size_t k = i; k < j; ++k) {
      const double l = labels[order[k]];
      MT_CHECK(l == 0.0 || l == 1.0, "roc_auc: labels must be 0 or 1, found ", l, " at ",
               order[k]);
      if (l == 1.0) rank_sum += avg_rank, pos += 1.0;
    }
    i = j;
  }
  const double neg = double(n) - pos;
  MT_CHECK(pos > 0 && neg > 0, "roc_auc: needs at least one positive and one negative label, got ",
           int64_t(pos), " positives and ", int64_t(neg), " negatives");
  return (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg);
}

double roc_auc(const Tensor& scores, const Tensor& labels) {
  return roc_auc(scores.to_vector<double>(), labels.to_vector<double>());
}

}  // namespace mt::models::dlrm
