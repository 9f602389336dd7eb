// RecsysBatch: one rank's slice of a recommendation-model batch (what the MovieLens loader and the
// synthetic Criteo-like generator produce): dense features, sparse features as a
// KeyedJaggedTensor (runtime/sparse/keyed_jagged_tensor.h), binary labels, and which samples the
// rows are (for tests and for checking rank slices).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/sparse/keyed_jagged_tensor.h"

namespace mt::data::recsys {

struct RecsysBatch {
  runtime::Tensor dense;                      // [B, D] f32
  runtime::sparse::KeyedJaggedTensor sparse;  // stride B, one key per sparse feature
  runtime::Tensor labels;                     // [B] f32, 0 or 1
  std::vector<int64_t> samples;               // dataset index of each row (see the producer)
  int64_t size() const { return int64_t(samples.size()); }
};

// Rank r of w takes rows b*w + r (b = 0, 1, ...) of a global batch of `global_size` rows: the
// positions of its rows inside the global batch (it may get one row fewer than others when the
// global batch does not divide, e.g. the last evaluation batch).
std::vector<int64_t> rank_rows(int64_t global_size, int64_t rank, int64_t world_size);

}  // namespace mt::data::recsys
