// Ops on DTensors: each runs the runtime op of the same name on the local pieces after the
// dispatcher (op_strategy.h) has picked a sharding strategy and redistributed the inputs.
// Differentiable; the strategies per op are listed beside each function (one mesh dim; R =
// Replicate, S(d) = Shard(d), P = Partial(sum); "batch" = any dim the op does not reduce or
// contract). The rules are registered under the op's name the first time any of these is called.
//
// The tensor-parallel styles (tp_style.h) run the model's own ops on local pieces; these are
// for code that computes on DTensors directly (tests, tools, future styles).
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/mesh/dtensor.h"
#include "runtime/ops/loss.h"

namespace mt::parallel::dtensor {

// x [..., in], W [out, in] -> [..., out]. (R, R) -> R; (S(batch), R) -> S(batch);
// (R, S(0)) -> S(-1) (column-wise); (S(-1), S(1)) -> P (row-wise); (P, R) -> P.
DTensor linear(const DTensor& x, const DTensor& weight);

// Elementwise, b the same shape as a or broadcast over a's leading dims. All R -> R; S(d) on
// both (or on a, for a dim b lacks) -> S(d); add: (P, P) -> P; mul: (P, R), (R, P) -> P.
DTensor add(const DTensor& a, const DTensor& b);
DTensor mul(const DTensor& a, const DTensor& b);
// gate, up of one shape: S(d) on both -> S(d); R -> R.
DTensor swiglu(const DTensor& gate, const DTensor& up);

// Over the last dim: x S(batch), w R -> S(batch); R -> R.
DTensor rms_norm(const DTensor& x, const DTensor& weight, double eps);
DTensor softmax(const DTensor& x, int64_t dim);  // S(d != dim) -> S(d); R -> R

// Reductions and layout.
DTensor sum(const DTensor& x, int64_t dim);  // S(d != dim) -> S(d'), S(dim) -> P, P -> P, R -> R
DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1);  // shard dims follow the swap
// To `shape` (one -1 inferred), grouping dims whose products match ([B, T, H*D] <-> [B, T, H,
// D]): S(first input dim of a group) -> S(first output dim of it) when the mesh dims splitting it
// divide it evenly; R -> R; P -> P (dtensor_layout_ops.cpp).
DTensor reshape(const DTensor& x, const Shape& shape);
// Along `dim`; every input with the same placements: S(d != dim) -> S(d), R -> R, P -> P.
DTensor cat(const std::vector<DTensor>& xs, int64_t dim);
// Pieces of `sizes` along `dim` (each a narrow): S(d != dim) -> S(d), R -> R, P -> P.
std::vector<DTensor> split(const DTensor& x, const std::vector<int64_t>& sizes, int64_t dim);

// weight [V, D], ids [...] (integer) -> [..., D]. (R, R) -> R; (S(1), R) -> S(-1);
// (R, S(batch)) -> S(batch); (S(0), R) -> P (row-wise: each rank looks up the ids in its rows and
// gives zeros for the others).
DTensor embedding(const DTensor& weight, const DTensor& ids);

// q [B, H, T, D], k/v [B, Hkv, T, D]: S(0) or S(1) (heads) on all three -> the same; R -> R.
DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                     bool causal);

// x [B, T, H, head_dim] with the RoPE tables (plain tensors, the same on every rank): S0, S1
// (a sequence shard rotates at its own positions), S2 (heads) -> the same; R -> R; P -> P
// (dtensor_transformer_ops.cpp).
DTensor apply_rope(const DTensor& x, const Tensor& cos, const Tensor& sin,
                   int64_t position_offset = 0);
// Experts' grouped matmul: x [N, K] rows grouped by `counts`, w [G, M, K] -> [N, M]. (R, R) -> R;
// (R, S1) -> S1 (column-wise experts); (S1, S2) -> P (row-wise); (P, R) -> P. Rows are never
// split (the groups are).
DTensor grouped_mm(const DTensor& x, const DTensor& w, const std::vector<int64_t>& counts);

// logits [N, V], targets [N]; reduction Sum or None. (R, R) -> R; (S(0), S(0)) -> P (Sum) or S(0)
// (None); (S(1), R) -> R: loss parallel — the vocab stays sharded: each rank's max, sum of
// exponentials and target logit over its columns are reduced over the mesh dims that shard V
// (all-reduces of [N] floats), never gathering [N, V]. Computed in f32 (f64 for f64 logits). The
// loss's gradient is expected whole on every rank, as a training loop's backward() seeds it.
DTensor cross_entropy(const DTensor& logits, const DTensor& targets, int64_t ignore_index,
                      runtime::Reduction reduction);

// Loss parallel for a trainer: `local_logits` [..., V / n] is this rank's column block of the
// [..., V] logits, split over `vocab_mesh` (1-D, torch.chunk blocks), and `targets` [...] are
// every rank's same targets. The loss, the same on every rank, in f32 (f64 for f64 logits).
Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    std::shared_ptr<DeviceMesh> vocab_mesh, int64_t vocab_size,
                                    int64_t ignore_index, runtime::Reduction reduction);

// Row-wise embedding on local pieces: ids mapped into this rank's rows [offset, offset + rows)
// (others clamped to 0) and the mask of the ids it holds (the lookup's dtype, 1 or 0).
struct LocalIds {
  Tensor ids, mask;
};
LocalIds local_embedding_ids(const Tensor& ids, int64_t offset, int64_t rows, runtime::DType dtype);

}  // namespace mt::parallel::dtensor
