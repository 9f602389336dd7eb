// Gradient clipping over parameters that live on different meshes (FSDP groups on the data-
// parallel mesh, experts on an expert mesh, plain replicated tensors), returning the total norm.
//
// Each parameter contributes its local gradient's |g|^p; partials are then reduced over exactly
// the mesh dimensions that split the tensor (Shard or Partial placements) and never over
// Replicate dimensions, so each distinct shard counts once and replicated copies are not double
// counted. Parameters are grouped by that set of groups (in first-appearance order, identical on
// every rank), one f64 all-reduce per group and mesh dimension, and the groups' totals are
// combined (sum, or max for the inf-norm). Plain tensors (dtensor == null) are the same on every
// rank and count once. Every rank gets the same total and applies the same coefficient
// (runtime/optim/clip_grad.h has the scaling rules). Collective over every mesh involved.
//
// Pipeline parallelism: each stage holds other parameters, so the stages' totals are combined
// once more over `pipeline` (the pp group; null: no pipeline), as torchtitan passes its pp mesh.
#pragma once

#include <vector>

#include "parallel/fsdp/fully_shard.h"

namespace mt::parallel {

// The total norm of the gradients of `params` across all ranks, without clipping.
double total_grad_norm(const std::vector<DistributedParam>& params, double norm_type = 2.0,
                       ProcessGroup* pipeline = nullptr);

// Computes the total norm, scales every local gradient when it exceeds max_norm, and returns it.
// With error_if_nonfinite, a NaN or infinite total throws mt::Error on every rank (gradients
// untouched).
double clip_grad_norm_(const std::vector<DistributedParam>& params, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false,
                       ProcessGroup* pipeline = nullptr);

// The same without reading anything on the host (a training step on CUDA stays free of host
// synchronisations): the total norm is a 0-D f64 tensor on the parameters' device, all-reduced
// there, and the coefficient is applied from it (runtime/optim/clip_grad.h). Same gradients and
// norm as clip_grad_norm_, bitwise. No error_if_nonfinite: checking needs the host.
Tensor total_grad_norm_tensor(const std::vector<DistributedParam>& params, double norm_type = 2.0,
                              ProcessGroup* pipeline = nullptr);
Tensor clip_grad_norm_on_device_(const std::vector<DistributedParam>& params, double max_norm,
                                 double norm_type = 2.0, ProcessGroup* pipeline = nullptr);

}  // namespace mt::parallel
