// A synthetic Criteo-like click dataset for scale tests of DLRM and the sharded embeddings:
// 13 dense features and 26 sparse features by default (Criteo's counts), power-law (Zipf) ids,
// configurable table sizes and ids per feature, and labels drawn from a hidden logistic model so
// that a model can learn them.
//
// Everything about sample i is a pure function of (seed, i), drawn with the counter-based Philox
// generator (runtime/core/rng.h), so a sample is the same whatever the batch size, rank or world
// size:
//   dense d     log(1 + 100 u) / log(101) (u uniform in [0, 1)): Criteo's dense counts, log-scaled
//   sparse f    n_f ids, n_f = pooling_factor, or uniform in [1, 2*pooling_factor - 1] when
//               variable_pooling (mean pooling_factor); each id from a Zipf-like power law over
//               [0, rows_f): P(id = k) ~ (k + 1)^-zipf_exponent (continuous inverse-CDF
//               approximation), then permuted by a fixed per-table multiplicative hash when
//               scramble_ids, so hot ids are spread over the table.
//   label       Bernoulli(sigmoid(z)), z = bias + sum_d a_d dense_d + sum_f mean over the bag's
//               ids of h_f(id), with a_d ~ N(0, 1), h_f(id) ~ N(0, signal^2) (hidden, keyed by
//               (seed, table, id)), the sparse sum scaled by 1 / sqrt(F / 4); `bias` sets the
//               positive share (0.36 measured at the defaults; lower it for Criteo's ~0.26).
// Batches: step s, rank r of w take samples s*B*w + b*w + r (b = 0..B-1), as the other loaders;
// state() is the global sample position.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/recsys/batch.h"

namespace mt::data::recsys {

struct SyntheticOptions {
  int64_t num_dense = 13;
  // Rows of each sparse feature's table (its size is the number of sparse features). Empty: 26
  // tables, criteo_table_sizes(10000).
  std::vector<int64_t> table_sizes;
  int64_t pooling_factor = 1;  // ids per feature (Criteo: 1)
  bool variable_pooling = false;
  double zipf_exponent = 1.05;
  bool scramble_ids = true;
  double signal = 1.0;  // std of the hidden per-id logit terms
  double bias = -1.0;
  uint64_t seed = 0;
  int64_t local_batch_size = 256;
  int64_t rank = 0;
  int64_t world_size = 1;
};

// 26 table sizes between 4 and max_rows, spread like Criteo's (a few huge, many small).
std::vector<int64_t> criteo_table_sizes(int64_t max_rows);

class SyntheticCriteo {
 public:
  explicit SyntheticCriteo(SyntheticOptions options);

  // "cat_0" .. "cat_{n-1}" (KJT keys) and the table sizes.
  const std::vector<std::string>& sparse_feature_names() const { return names_; }
  const std::vector<int64_t>& table_sizes() const { return options_.table_sizes; }
  int64_t num_dense() const { return options_.num_dense; }

  RecsysBatch next();  // this rank's rows of the next global batch (samples: sample indices)
  int64_t position() const { return position_; }  // global samples consumed
  void set_position(int64_t position);
  // The batch of the given sample indices.
  RecsysBatch make_batch(const std::vector<int64_t>& samples) const;
  // The hidden model's logit of a sample (for tests: the best achievable AUC).
  double true_logit(int64_t sample) const;

  const SyntheticOptions& options() const { return options_; }

 private:
  struct Sample {
    std::vector<float> dense;
    std::vector<std::vector<int64_t>> ids;
    double logit = 0.0;
    float label = 0.0f;
  };
  Sample draw(int64_t sample) const;

  SyntheticOptions options_;
  std::vector<std::string> names_;
  std::vector<double> dense_weights_;
  int64_t position_ = 0;
};

}  // namespace mt::data::recsys
