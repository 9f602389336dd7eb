// RecsysDataset adapters (see dataset.h).
#include "data/recsys/dataset.h"

#include <algorithm>

#include "data/recsys/movielens.h"
#include "data/recsys/synthetic.h"
#include "runtime/core/error.h"

namespace mt::data::recsys {

namespace fs = std::filesystem;

namespace {

class MovieLensDataset final : public RecsysDataset {
 public:
  MovieLensDataset(const fs::path& dir, const RecsysDatasetOptions& o)
      : ml_(dir, MovieLensOptions{.local_batch_size = o.local_batch_size,
                                  .seed = o.seed,
                                  .rank = o.rank,
                                  .world_size = o.world_size}),
        dir_(dir) {}
  std::string describe() const override {
    return "movielens " + dir_.string() + ": " + std::to_string(ml_.train_indices().size()) +
           " train / " + std::to_string(ml_.test_indices().size()) + " test ratings";
  }
  std::vector<std::string> sparse_feature_names() const override {
    return MovieLens::sparse_feature_names();
  }
  std::vector<int64_t> table_sizes() const override { return ml_.table_sizes(); }
  int64_t num_dense() const override { return MovieLens::kDenseFeatures; }
  int64_t train_samples_per_epoch() const override { return int64_t(ml_.train_indices().size()); }
  RecsysBatch next() override { return ml_.next(); }
  int64_t num_test_batches() const override { return ml_.num_test_batches(); }
  RecsysBatch test_batch(int64_t k) const override { return ml_.test_batch(k); }
  std::map<std::string, int64_t> state() const override { return ml_.state().to_map(); }
  void load_state(const std::map<std::string, int64_t>& state) override {
    ml_.load_state(MovieLensState::from_map(state));
  }

 private:
  MovieLens ml_;
  fs::path dir_;
};

class SyntheticCriteoDataset final : public RecsysDataset {
 public:
  explicit SyntheticCriteoDataset(const RecsysDatasetOptions& o)
      : gen_(SyntheticOptions{.num_dense = o.num_dense,
                              .table_sizes = o.table_sizes,
                              .seed = o.seed,
                              .local_batch_size = o.local_batch_size,
                              .rank = o.rank,
                              .world_size = o.world_size}),
        options_(o) {}
  std::string describe() const override {
    return "synthetic_criteo: " + std::to_string(gen_.table_sizes().size()) + " sparse, " +
           std::to_string(gen_.num_dense()) + " dense features, seed " +
           std::to_string(options_.seed) + "; " + std::to_string(kSyntheticTestSamples) +
           " held-out samples";
  }
  std::vector<std::string> sparse_feature_names() const override {
    return gen_.sparse_feature_names();
  }
  std::vector<int64_t> table_sizes() const override { return gen_.table_sizes(); }
  int64_t num_dense() const override { return gen_.num_dense(); }
  int64_t train_samples_per_epoch() const override { return -1; }
  RecsysBatch next() override { return gen_.next(); }
  int64_t num_test_batches() const override {
    const int64_t global = options_.local_batch_size * options_.world_size;
    return (kSyntheticTestSamples + global - 1) / global;
  }
  // Global test batch k holds test samples [k G, min((k + 1) G, total)); rank r takes b w + r.
  RecsysBatch test_batch(int64_t k) const override {
    MT_CHECK(k >= 0 && k < num_test_batches(), "synthetic_criteo: test batch ", k,
             " out of range [0, ", num_test_batches(), ")");
    const int64_t w = options_.world_size, global = options_.local_batch_size * w;
    const int64_t end = std::min((k + 1) * global, kSyntheticTestSamples);
    std::vector<int64_t> samples;
    for (int64_t i = k * global + options_.rank; i < end; i += w) samples.push_back(kTestBase + i);
    return gen_.make_batch(samples);
  }
  std::map<std::string, int64_t> state() const override {
    return {{"position", gen_.position()}, {"seed", int64_t(options_.seed)}};
  }
  void load_state(const std::map<std::string, int64_t>& state) override {
    auto get = [&](const char* key) {
      auto it = state.find(key);
      MT_CHECK(it != state.end(), "synthetic_criteo state: missing key '", key, "'");
      return it->second;
    };
    MT_CHECK(get("seed") == int64_t(options_.seed), "synthetic_criteo state: saved with seed ",
             get("seed"), ", this run has seed ", options_.seed);
    gen_.set_position(get("position"));
  }

 private:
  // Held-out sample indices start here: no training run reaches them (2^50 samples).
  static constexpr int64_t kTestBase = int64_t(1) << 50;
  SyntheticCriteo gen_;
  RecsysDatasetOptions options_;
};

}  // namespace

std::vector<std::string> recsys_dataset_names() { return {"movielens", "synthetic_criteo"}; }

std::unique_ptr<RecsysDataset> make_recsys_dataset(const std::string& name, const fs::path& path,
                                                   const RecsysDatasetOptions& options) {
  if (name == "movielens") {
    MT_CHECK(!path.empty(), "recsys dataset movielens: the path to the ml-100k folder is empty");
    MT_CHECK(fs::is_directory(path), "recsys dataset movielens: ", path.string(),
             " is not a folder (expected the ml-100k folder with u.data, u.user, u.item, "
             "u.occupation)");
    return std::make_unique<MovieLensDataset>(path, options);
  }
  if (name == "synthetic_criteo") return std::make_unique<SyntheticCriteoDataset>(options);
  MT_FAIL("unknown recsys dataset '", name, "'; expected one of: movielens, synthetic_criteo");
}

}  // namespace mt::data::recsys
