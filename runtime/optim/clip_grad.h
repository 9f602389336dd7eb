// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_ semantics).
//
// The total norm is taken over the gradients of all given parameters together, as if they were
// one flat vector: (sum_i |g_i|^p)^(1/p), or max_i |g_i| for p = inf. Parameters without a
// gradient are skipped. Partial sums are computed in f64 (whatever the gradient dtype) and
// combined in the order of `params` (device by device), so the result does not depend on the
// thread count. On a backend with multi-tensor kernels (CUDA; runtime/kernels/optim.h) a device's
// contiguous gradients are reduced, and scaled, in a few launches; their f64 sum is then taken in
// a fixed order of its own, equal to the tensor-by-tensor one to f64 rounding.
//
// The work is split so the distributed case can reuse it (the FSDP issue, in parallel/):
//   partial = local_norm_pow(local_shards, p)           // sum |g|^p (max |g| for inf) of a shard
//   partial = all-reduce(partial, SUM, or MAX for inf)   // across every mesh holding shards
//   total   = norm_from_pow(partial, p)                  // the p-th root (identity for inf)
//   clip_grads_with_norm_(local_shards, max_norm, total) // same coefficient on every rank
// Partials of different meshes (dense vs expert) are combined with combine_norm_pows() before the
// root. The runtime itself knows nothing of ranks: clip_grad_norm_ below is the one-process case.
//
// Scaling: when total > max_norm every gradient is multiplied in place (no_grad, mul_) by
// max_norm / (total + 1e-6). Unlike torch, which always multiplies by min(1, coef), gradients are
// left untouched when total <= max_norm. A NaN total never scales; an infinite total scales by 0
// (non-finite entries become NaN, as in torch) unless error_if_nonfinite is set.
#pragma once

#include <span>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::optim {

// sum |g|^p over the gradients of `params` (max |g| when norm_type is +inf), in f64.
// 0 when no parameter has a gradient. norm_type must be > 0 (or +inf).
double local_norm_pow(const std::vector<Tensor>& params, double norm_type = 2.0);

// Combines partials of several shards/meshes: their sum, or their max for norm_type = +inf.
double combine_norm_pows(std::span<const double> partials, double norm_type = 2.0);

// A (combined) partial -> the norm: partial^(1/p), or the partial itself for +inf.
double norm_from_pow(double partial, double norm_type = 2.0);

// The total norm of the gradients of `params`, without clipping.
double total_grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);

// Scales the gradients in place by max_norm / (total_norm + 1e-6) when total_norm > max_norm.
// Returns the coefficient applied (1.0 when nothing was scaled).
double clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm, double total_norm);

// The same steps without a host synchronisation (for CUDA, where reading a value waits for the
// GPU): the partial and the norm stay 0-D f64 tensors on the gradients' device (CPU when there
// is no gradient), and the coefficient is computed there from the total and applied to every
// gradient (a multiply by 1 when total <= max_norm or NaN). Scaled gradients equal the host
// path's bitwise.
Tensor local_norm_pow_tensor(const std::vector<Tensor>& params, double norm_type = 2.0);
Tensor norm_from_pow(const Tensor& partial, double norm_type = 2.0);
void clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm,
                           const Tensor& total_norm);
// The coefficient those apply, a 0-D f64 tensor where total_norm is: for Optimizer::step's
// grad_scale, which folds the scaling into the update instead of writing every gradient.
Tensor clip_coefficient(const Tensor& total_norm, double max_norm);
// A gradient multiplied by such a coefficient, as a new tensor with the values the in-place
// scaling writes: the product in f32 (f64 for f64) rounded once to the gradient's dtype.
Tensor scaled_by(const Tensor& grad, const Tensor& coef);

// Computes the total norm, clips (see above) and returns the total norm (before clipping).
// With error_if_nonfinite, a NaN or infinite total throws mt::Error and leaves the grads as they
// were.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace mt::runtime::optim
