// SequenceShard: what a decoder needs to compute on one rank's share of each sequence (context
// parallelism, parallel/context): where its tokens sit in the sequence and how its attention
// layers see the rest of it. The model stays free of parallel code: the trainer builds this from
// parallel::ContextParallel and hands it to ModelSpec::shard_sequence.
#pragma once

#include <functional>

#include "runtime/core/tensor.h"

namespace mt::models {

struct SequenceShard {
  // [T] i64 on the model's device: the position in the sequence of each token of the module's
  // input (RoPE turns each token by its own position).
  runtime::Tensor positions;
  // Causal attention of the shard's queries q [B, Hq, T, D] over the whole sequence, given the
  // shard's keys and values k, v [B, Hkv, T, D] -> [B, Hq, T, Dv] (collective across the ranks
  // that share the sequence).
  std::function<runtime::Tensor(const runtime::Tensor& q, const runtime::Tensor& k,
                                const runtime::Tensor& v)>
      attention;
  // How many ranks share each sequence, and the sum of a tensor over them (in place; collective
  // across those ranks): what per-sequence statistics need (the MoE's sequence-wise auxiliary
  // loss counts each sequence's routed tokens over all of them).
  int64_t shards = 1;
  std::function<void(runtime::Tensor&)> sum_over_shards;
};

}  // namespace mt::models
