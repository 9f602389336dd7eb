// MovieLens 100K (GroupLens ml-100k: u.data, u.user, u.item, u.occupation) as a binary
// click-through-style dataset for DLRM: one sample per rating, label = rating >= 4.
//
// Sparse features (KJT keys, in this order; ids are 0-based rows of a table of the given size):
//   user_id     943   (u.data user id - 1)
//   item_id     1682  (u.data item id - 1)
//   genres      19    multi-hot: the item's genre ids (u.item's 19 flags), a bag of 0..19 ids
//   age_bucket  7     <18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+ (the MovieLens-1M buckets)
//   gender      2     M = 0, F = 1
//   occupation  21    line index in u.occupation
// (the sizes are those of ml-100k; table_sizes() returns what the files hold.)
// Dense features (f32, kDenseFeatures = 4), standardised with train-split statistics:
//   0 age, 1 item release year (a missing date counts as the mean year),
//   2 log(1 + the user's number of TRAIN ratings), 3 log(1 + the item's number of TRAIN ratings).
//
// Split: a seeded random hold-out: the ratings (u.data line order) are shuffled by a Philox
// Fisher-Yates permutation keyed by (split_seed, "movielens.split") and the first
// round(test_fraction * N) of that order are the test set, the rest the train set. No rating is in
// both. The split does not depend on world size or batch size.
//
// Training batches follow data/dataset/loader.h: an endless stream of epochs, epoch e visits the
// train samples in a permutation drawn from (seed, e); global stream position g is epoch g / T,
// index g % T (T = train samples). Step s uses positions [s*B*w, (s+1)*B*w) (B = local batch,
// w = world size) and rank r takes positions s*B*w + b*w + r, b = 0..B-1 (rank_rows in batch.h).
// The state (epoch, position inside the epoch, seed, sizes) is global, so a state saved with one
// world size continues with another.
// Test batches: the test samples in split order, global batch k = test positions
// [k*B*w, min((k+1)*B*w, test size)), rank r taking rows b*w + r of it; the last batch may be
// short (every test sample is in exactly one batch of one rank).
//
// Errors (mt::Error) name the file and line: a missing file, a line with the wrong number of
// fields, a non-number, an id out of range, an unknown occupation or gender.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data/recsys/batch.h"

namespace mt::data::recsys {

struct MovieLensOptions {
  int64_t local_batch_size = 256;
  double test_fraction = 0.1;  // in (0, 1)
  uint64_t split_seed = 0;     // the train/test split
  uint64_t seed = 0;           // the training order
  bool shuffle = true;         // false: train samples in split order every epoch
  int64_t rank = 0;
  int64_t world_size = 1;
};

struct MovieLensState {
  int64_t epoch = 0;
  int64_t position = 0;  // train samples consumed in `epoch`, all ranks together
  int64_t seed = 0;      // the uint64 seed's bits
  int64_t num_train = 0;
  int64_t num_test = 0;
  std::map<std::string, int64_t> to_map() const;
  static MovieLensState from_map(const std::map<std::string, int64_t>& values);  // names a missing key
  bool operator==(const MovieLensState&) const = default;
};

// One line of u.data, decoded.
struct Rating {
  int32_t user = 0;  // 0-based
  int32_t item = 0;  // 0-based
  int8_t rating = 0;
  int64_t timestamp = 0;
};

class MovieLens {
 public:
  static constexpr int64_t kDenseFeatures = 4;
  static constexpr int64_t kGenres = 19;
  static constexpr int64_t kAgeBuckets = 7;
  // The sparse feature names (KJT keys) in batch order.
  static const std::vector<std::string>& sparse_feature_names();

  // `dir` holds u.data, u.user, u.item and u.occupation.
  MovieLens(const std::filesystem::path& dir, MovieLensOptions options);

  int64_t num_ratings() const { return int64_t(ratings_.size()); }
  int64_t num_users() const { return int64_t(user_age_.size()); }
  int64_t num_items() const { return int64_t(item_genres_.size()); }
  int64_t num_occupations() const { return int64_t(occupations_.size()); }
  // Rows of each sparse feature's table, in sparse_feature_names() order.
  std::vector<int64_t> table_sizes() const;
  const std::vector<Rating>& ratings() const { return ratings_; }
  // Rating indices (u.data line order) of each split, in split order.
  const std::vector<int64_t>& train_indices() const { return train_; }
  const std::vector<int64_t>& test_indices() const { return test_; }
  double positive_share() const;  // share of all ratings with label 1

  // The next training batch of this rank (samples: rating indices).
  RecsysBatch next();
  MovieLensState state() const;
  // Continues from `state`; throws when the seed or the split sizes differ.
  void load_state(const MovieLensState& state);

  int64_t num_test_batches() const;   // global test batches (the last may be short)
  RecsysBatch test_batch(int64_t k) const;  // this rank's rows of global test batch k
  // A batch of the given rating indices (any order, any split).
  RecsysBatch make_batch(const std::vector<int64_t>& rating_indices) const;

  const MovieLensOptions& options() const { return options_; }

 private:
  const std::vector<int64_t>& permutation(int64_t epoch);

  MovieLensOptions options_;
  std::vector<Rating> ratings_;
  std::vector<int32_t> user_age_;
  std::vector<int8_t> user_gender_;
  std::vector<int32_t> user_occupation_;
  std::vector<std::vector<int64_t>> item_genres_;
  std::vector<double> item_year_;  // NaN when missing
  std::vector<std::string> occupations_;
  std::vector<int64_t> train_, test_;
  // Train-split statistics for the dense features.
  std::vector<int64_t> user_train_count_, item_train_count_;
  std::array<double, kDenseFeatures> dense_mean_{}, dense_std_{};
  double mean_year_ = 0.0;
  int64_t consumed_ = 0;  // global train stream position after the last next()
  std::map<int64_t, std::vector<int64_t>> permutations_;
};

}  // namespace mt::data::recsys
