// RecsysDataset: one interface over the recommendation datasets of data/recsys (MovieLens 100K,
// the synthetic Criteo-like generator), so the trainer reads batches, held-out batches and the
// resumable state without knowing which dataset it is.
//
//   auto data = make_recsys_dataset("movielens", "../shared/data/ml-100k", options);
//   RecsysBatch b = data->next();                      // this rank's rows of the next batch
//   for (int64_t k = 0; k < data->num_test_batches(); ++k) score(data->test_batch(k));
//
// Names: "movielens" (path: the ml-100k folder; its test split, MovieLens::test_batch) and
// "synthetic_criteo" (no path; the flavor's table sizes; held-out samples are a fixed range of
// kSyntheticTestSamples sample indices far beyond any training position, scored the same way on
// every world size). State: a map of integers, global (continues on another world size).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/recsys/batch.h"

namespace mt::data::recsys {

inline constexpr int64_t kSyntheticTestSamples = 16384;

struct RecsysDatasetOptions {
  int64_t local_batch_size = 256;
  uint64_t seed = 0;  // training order (MovieLens) or the whole synthetic dataset
  int64_t rank = 0;
  int64_t world_size = 1;
  // synthetic_criteo only: the rows of each sparse feature's table (26 for Criteo).
  std::vector<int64_t> table_sizes;
  int64_t num_dense = 13;
};

class RecsysDataset {
 public:
  virtual ~RecsysDataset() = default;
  virtual std::string describe() const = 0;  // one line for the log
  // Sparse features (KJT keys) in batch order, the rows of their tables, and the dense count.
  virtual std::vector<std::string> sparse_feature_names() const = 0;
  virtual std::vector<int64_t> table_sizes() const = 0;
  virtual int64_t num_dense() const = 0;
  virtual int64_t train_samples_per_epoch() const = 0;  // -1: endless
  virtual RecsysBatch next() = 0;
  virtual int64_t num_test_batches() const = 0;
  virtual RecsysBatch test_batch(int64_t k) const = 0;
  virtual std::map<std::string, int64_t> state() const = 0;
  // Throws mt::Error naming what does not match (seed, split sizes, a missing key).
  virtual void load_state(const std::map<std::string, int64_t>& state) = 0;
};

std::vector<std::string> recsys_dataset_names();
// Throws mt::Error listing the names for an unknown one, and naming the path when it is missing.
std::unique_ptr<RecsysDataset> make_recsys_dataset(const std::string& name,
                                                   const std::filesystem::path& path,
                                                   const RecsysDatasetOptions& options);

}  // namespace mt::data::recsys
