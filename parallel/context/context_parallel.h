// Context parallelism (torchtitan's cp, Megatron's context parallel): the ranks of a cp group split
// every sequence between them, so activations per rank shrink by cp and long sequences fit.
// Everything but attention works on a rank's tokens alone; attention sees the other ranks' keys
// and values.
//
// Load balancing (torchtitan's default for causal attention): a sequence of S tokens is cut into
// 2 cp chunks of S / (2 cp); rank r holds chunks r and 2 cp - 1 - r, in that order. Under the
// causal mask a late chunk attends over many keys and an early one over few, so each rank gets
// one of each and the same work.
//
//   ContextParallel cp(cp_mesh);                        // a 1-D mesh over the cp ranks
//   Tensor local = cp.shard(tokens);                    // [B, S] -> [B, S / cp]
//   Tensor positions = cp.positions(S, device);         // their places in the sequence (RoPE)
//   out = cp.attention(q, k, v);                        // causal, over the whole sequence
//
// Attention, by one of torchtitan's rotate methods (ContextParallelRotate):
// "allgather" (the default): each rank all-gathers the keys and values of the whole sequence
// (backward: their gradients reduce-scattered back), and each of its two query chunks attends
// over the keys before it: chunk c of size n sees keys
// [0, (c + 1) n), with the causal mask aligned bottom-right (runtime/ops/attention.h), i.e. the
// same keys as in the whole sequence. Memory: each layer keeps its gathered keys and values for
// its backward (the whole sequence's, but of the k/v heads only: with grouped-query attention a
// fraction of the queries' size).
// "alltoall" (the ring): the ranks pass their key/value chunks around the ring (isend/irecv to
// the next rank, posted before each step's compute so the transfer overlaps it); each rank merges
// the blocks its queries see (runtime's attention_block_forward, merged by logsumexp). Backward
// passes the chunks around again with their key/value gradients, which arrive back at their
// owner after a full turn. Nothing of another rank's is kept for backward: memory per rank stays
// 1/cp of the sequence's. Host process groups only for now (NCCL would need grouped
// point-to-point calls to pair the ring's crossing messages).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/mesh/device_mesh.h"
#include "runtime/core/tensor.h"

namespace mt::parallel {

// The global chunks (of 2 cp) that rank `rank` holds, in its order: rank and 2 cp - 1 - rank.
std::array<int64_t, 2> load_balanced_chunks(int64_t rank, int64_t cp);
// The global positions of rank `rank`'s tokens when `seq_len` tokens are split over `cp` ranks
// (load balanced, as above). seq_len must be a multiple of 2 cp (throws naming the numbers).
std::vector<int64_t> load_balanced_positions(int64_t seq_len, int64_t cp, int64_t rank);

enum class ContextParallelRotate { AllGather, Ring };  // "allgather", "alltoall"

class ContextParallel {
 public:
  // `mesh`: 1-D, its ranks one sequence's (every rank of it holds the same batch).
  explicit ContextParallel(std::shared_ptr<DeviceMesh> mesh,
                           ContextParallelRotate rotate = ContextParallelRotate::AllGather);

  int64_t degree() const { return mesh_->size(); }
  int64_t rank() const { return mesh_->coordinate(0); }

  // This rank's tokens of `batch` [B, S, ...] (along dim 1; S a multiple of 2 cp): [B, S / cp,
  // ...], contiguous, not differentiable (data).
  runtime::Tensor shard(const runtime::Tensor& batch) const;
  // load_balanced_positions(seq_len, degree(), rank()) as an i64 tensor on `device`.
  runtime::Tensor positions(int64_t seq_len, runtime::Device device) const;
  // Sums `t` over the ranks that share the sequences, in place (collective; not
  // differentiable): per-sequence statistics, e.g. the MoE's routed-token counts.
  void sum_over_shards(runtime::Tensor& t) const;

  // Causal attention of this rank's queries over the whole sequence. q [B, Hq, T, D], k and v
  // [B, Hkv, T, D] with T = S / cp this rank's tokens (as shard() ordered them), laid out as
  // runtime::scaled_dot_product_attention takes them; -> [B, Hq, T, Dv]. Differentiable w.r.t.
  // q, k and v; collective over the mesh (every rank calls it, with the same shapes).
  runtime::Tensor attention(const runtime::Tensor& q, const runtime::Tensor& k,
                            const runtime::Tensor& v) const;

 private:
  // [B, T, H, D] of this rank -> the whole sequence's [B, S, H, D] in sequence order
  // (differentiable: its gradient is reduce-scattered back).
  runtime::Tensor gather_sequence(const runtime::Tensor& local, const char* what) const;
  runtime::Tensor allgather_attention(const runtime::Tensor& q, const runtime::Tensor& k,
                                      const runtime::Tensor& v) const;
  runtime::Tensor ring_attention(const runtime::Tensor& q, const runtime::Tensor& k,
                                 const runtime::Tensor& v) const;  // ring_attention.cpp

  std::shared_ptr<DeviceMesh> mesh_;
  ContextParallelRotate rotate_;
};

}  // namespace mt::parallel
