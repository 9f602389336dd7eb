// Tests of the recommendation datasets (data/recsys): MovieLens 100K counts, features, the
// train/test split, rank slices of the global batch, resume from a saved state and error messages;
// the synthetic Criteo-like generator's determinism, rank slices, id ranges and learnable labels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <vector>

#include "data/recsys/movielens.h"
#include "data/recsys/synthetic.h"
#include "runtime/core/error.h"
#include "tests/testing/errors.h"
#include "tests/testing/scratch_dir.h"
#include "tests/testing/shared_data.h"

namespace mt::data::recsys {
namespace {

namespace fs = std::filesystem;

std::vector<int64_t> ids_of(const RecsysBatch& b, const std::string& key) {
  return b.sparse[key].values.to_vector<int64_t>();
}

TEST(MovieLensTest, CountsFeaturesAndLabelShare) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  MovieLens ml(dir.parent_path(), {.local_batch_size = 64});
  EXPECT_EQ(ml.num_ratings(), 100000);
  EXPECT_EQ(ml.num_users(), 943);
  EXPECT_EQ(ml.num_items(), 1682);
  EXPECT_EQ(ml.num_occupations(), 21);
  EXPECT_EQ(ml.table_sizes(), (std::vector<int64_t>{943, 1682, 19, 7, 2, 21}));
  const double share = ml.positive_share();
  std::printf("MovieLens 100K: share of ratings >= 4: %.4f\n", share);
  EXPECT_NEAR(share, 0.553, 0.01);

  // The first line of u.data: user 196, item 242, rating 3.
  const RecsysBatch b = ml.make_batch({0});
  EXPECT_EQ(ids_of(b, "user_id"), std::vector<int64_t>{195});
  EXPECT_EQ(ids_of(b, "item_id"), std::vector<int64_t>{241});
  EXPECT_EQ(b.labels.item<float>(), 0.0f);
  // Item 242 (Kolya, 1996) is a Comedy (genre 5) only; user 196 is 49, M, writer.
  EXPECT_EQ(ids_of(b, "genres"), std::vector<int64_t>{5});
  EXPECT_EQ(ids_of(b, "age_bucket"), std::vector<int64_t>{4});
  EXPECT_EQ(ids_of(b, "gender"), std::vector<int64_t>{0});
  EXPECT_EQ(b.dense.shape(), (runtime::Shape{1, MovieLens::kDenseFeatures}));
  // Every id lies in its table.
  const RecsysBatch all = ml.make_batch(ml.train_indices());
  const auto sizes = ml.table_sizes();
  for (size_t f = 0; f < sizes.size(); ++f) {
    EXPECT_NO_THROW(all.sparse.validate_ids(MovieLens::sparse_feature_names()[f], sizes[f]));
  }
  // Dense features are standardised over the train split.
  const auto dense = all.dense.to_vector<double>();
  for (int64_t d = 0; d < MovieLens::kDenseFeatures; ++d) {
    double s = 0, s2 = 0;
    for (size_t i = size_t(d); i < dense.size(); i += MovieLens::kDenseFeatures) s += dense[i], s2 += dense[i] * dense[i];
    const double n = double(dense.size()) / MovieLens::kDenseFeatures;
    EXPECT_NEAR(s / n, 0.0, 1e-3) << "dense feature " << d;
    EXPECT_NEAR(s2 / n, 1.0, 1e-3) << "dense feature " << d;
  }
}

TEST(MovieLensTest, SplitIsDisjointCompleteAndSeeded) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  MovieLens ml(dir.parent_path(), {.test_fraction = 0.1, .split_seed = 3});
  EXPECT_EQ(ml.test_indices().size(), 10000u);
  EXPECT_EQ(ml.train_indices().size(), 90000u);
  std::vector<int64_t> all = ml.train_indices();
  all.insert(all.end(), ml.test_indices().begin(), ml.test_indices().end());
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < 100000; ++i) ASSERT_EQ(all[size_t(i)], i);
  // Same seed: same split, another seed: another split.
  MovieLens same(dir.parent_path(), {.test_fraction = 0.1, .split_seed = 3, .seed = 9});
  EXPECT_EQ(same.test_indices(), ml.test_indices());
  MovieLens other(dir.parent_path(), {.test_fraction = 0.1, .split_seed = 4});
  EXPECT_NE(other.test_indices(), ml.test_indices());
}

TEST(MovieLensTest, RankSlicesCoverTheGlobalBatch) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  MovieLens one(dir.parent_path(), {.local_batch_size = 12, .seed = 5});
  std::vector<std::unique_ptr<MovieLens>> ranks;
  for (int64_t r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<MovieLens>(
        dir.parent_path(),
        MovieLensOptions{.local_batch_size = 4, .seed = 5, .rank = r, .world_size = 3}));
  }
  for (int step = 0; step < 5; ++step) {
    const RecsysBatch global = one.next();
    std::vector<int64_t> rows(12, -1);
    for (int64_t r = 0; r < 3; ++r) {
      const RecsysBatch local = ranks[size_t(r)]->next();
      ASSERT_EQ(local.size(), 4);
      for (int64_t b = 0; b < 4; ++b) rows[size_t(b * 3 + r)] = local.samples[size_t(b)];
      // The features of a sample do not depend on the batch it is in.
      EXPECT_EQ(ids_of(local, "item_id"), ids_of(one.make_batch(local.samples), "item_id"));
    }
    EXPECT_EQ(rows, global.samples) << "step " << step;
  }
  // Test batches: every test sample exactly once over the ranks, the last batch short.
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t k = 0; k < ranks[size_t(r)]->num_test_batches(); ++k) {
      for (int64_t s : ranks[size_t(r)]->test_batch(k).samples) seen.insert(s);
    }
  }
  EXPECT_EQ(seen.size(), one.test_indices().size());
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()),
            std::set<int64_t>(one.test_indices().begin(), one.test_indices().end()));
}

TEST(MovieLensTest, EpochVisitsEveryTrainSampleOnce) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  MovieLens ml(dir.parent_path(), {.local_batch_size = 1000, .test_fraction = 0.2});
  std::set<int64_t> seen;
  for (int i = 0; i < 80; ++i) {
    for (int64_t s : ml.next().samples) seen.insert(s);
  }
  EXPECT_EQ(seen, std::set<int64_t>(ml.train_indices().begin(), ml.train_indices().end()));
  EXPECT_EQ(ml.state().epoch, 1);
  EXPECT_EQ(ml.state().position, 0);
}

TEST(MovieLensTest, ResumeFromSavedStateAcrossWorldSizes) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  const fs::path d = dir.parent_path();
  MovieLens a(d, {.local_batch_size = 4000, .seed = 11});
  for (int i = 0; i < 30; ++i) a.next();  // crosses the epoch boundary (90,000 train samples)
  const MovieLensState saved = a.state();
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(MovieLensState::from_map(saved.to_map()), saved);
  const RecsysBatch expected = a.next();

  MovieLens b(d, {.local_batch_size = 4000, .seed = 11});
  b.load_state(saved);
  EXPECT_EQ(b.next().samples, expected.samples);
  // Two ranks of 2,000 rows continue the same global stream.
  std::vector<int64_t> rows(4000);
  for (int64_t r = 0; r < 2; ++r) {
    MovieLens c(d, {.local_batch_size = 2000, .seed = 11, .rank = r, .world_size = 2});
    c.load_state(saved);
    const auto s = c.next().samples;
    for (int64_t i = 0; i < 2000; ++i) rows[size_t(i * 2 + r)] = s[size_t(i)];
  }
  EXPECT_EQ(rows, expected.samples);
  MovieLens wrong(d, {.local_batch_size = 4000, .seed = 12});
  EXPECT_NE(testing::error_of([&] { wrong.load_state(saved); }).find("seed"), std::string::npos);
}

TEST(MovieLensTest, ErrorsNameFileAndLine) {
  REQUIRE_SHARED_FILE(dir, "ml-100k/u.data");
  testing::ScratchDir tmp;
  for (const char* f : {"u.user", "u.item", "u.occupation"}) fs::copy_file(dir.parent_path() / f, tmp / f);
  std::string msg = testing::error_of([&] { MovieLens(tmp.path(), {}); });
  EXPECT_NE(msg.find("u.data"), std::string::npos) << msg;
  {
    std::ofstream out(tmp / "u.data");
    out << "1\t2\t3\t881250949\n1\t2\tx\t881250949\n";
  }
  msg = testing::error_of([&] { MovieLens(tmp.path(), {}); });
  EXPECT_NE(msg.find("u.data:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rating"), std::string::npos) << msg;
  {
    std::ofstream out(tmp / "u.data");
    out << "1\t2\t3\t881250949\n1\t99999\t3\t881250949\n";
  }
  msg = testing::error_of([&] { MovieLens(tmp.path(), {}); });
  EXPECT_NE(msg.find("u.data:2: item id 99999"), std::string::npos) << msg;
  {
    std::ofstream out(tmp / "u.data");
    out << "1\t2\t3\n";
  }
  msg = testing::error_of([&] { MovieLens(tmp.path(), {}); });
  EXPECT_NE(msg.find("u.data:1: expected 4"), std::string::npos) << msg;
}

TEST(SyntheticTest, DeterministicPerSampleAndRankAware) {
  SyntheticOptions o{.table_sizes = {100, 5000, 7}, .pooling_factor = 2, .variable_pooling = true,
                     .seed = 7, .local_batch_size = 8};
  SyntheticCriteo a(o), b(o);
  const RecsysBatch x = a.next(), y = b.next();
  EXPECT_EQ(x.samples, y.samples);
  EXPECT_EQ(x.dense.to_vector<float>(), y.dense.to_vector<float>());
  EXPECT_EQ(x.sparse.values().to_vector<int64_t>(), y.sparse.values().to_vector<int64_t>());
  EXPECT_EQ(x.sparse.lengths().to_vector<int64_t>(), y.sparse.lengths().to_vector<int64_t>());
  EXPECT_EQ(x.labels.to_vector<float>(), y.labels.to_vector<float>());
  EXPECT_EQ(x.dense.shape(), (runtime::Shape{8, 13}));
  EXPECT_EQ(x.sparse.keys(), (std::vector<std::string>{"cat_0", "cat_1", "cat_2"}));
  for (int64_t len : x.sparse.lengths().to_vector<int64_t>()) EXPECT_TRUE(len >= 1 && len <= 3);
  // Another seed gives other data.
  o.seed = 8;
  EXPECT_NE(SyntheticCriteo(o).next().sparse.values().to_vector<int64_t>(),
            x.sparse.values().to_vector<int64_t>());
  o.seed = 7;
  // Rank r of 2 (batch 4) gets rows r, r + 2, ... of the global batch.
  for (int64_t r = 0; r < 2; ++r) {
    SyntheticOptions ro = o;
    ro.local_batch_size = 4, ro.rank = r, ro.world_size = 2;
    SyntheticCriteo s(ro);
    const RecsysBatch local = s.next();
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(local.samples[size_t(i)], x.samples[size_t(2 * i + r)]);
    EXPECT_EQ(local.dense.to_vector<float>(), a.make_batch(local.samples).dense.to_vector<float>());
  }
}

TEST(SyntheticTest, PowerLawIdsInRangeAndLearnableLabels) {
  SyntheticCriteo s({.table_sizes = {1000, 1000}, .scramble_ids = false, .local_batch_size = 20000});
  EXPECT_EQ(SyntheticCriteo({}).table_sizes().size(), 26u);
  const RecsysBatch b = s.next();
  const auto ids = b.sparse["cat_0"].values.to_vector<int64_t>();
  std::vector<int64_t> count(1000);
  for (int64_t id : ids) {
    ASSERT_TRUE(id >= 0 && id < 1000);
    ++count[size_t(id)];
  }
  // Zipf: the head dominates (id 0 ~ 12% at s = 1.05 over 1000 ids, id 1 about half of that).
  EXPECT_GT(count[0], 1500);
  EXPECT_GT(count[0], count[1]);
  EXPECT_GT(count[1], count[10]);
  EXPECT_GT(count[10], count[500]);
  // Labels follow the hidden logits: positives have larger true logits.
  const auto labels = b.labels.to_vector<float>();
  double pos = 0, np = 0, neg = 0, nn = 0;
  for (int64_t i = 0; i < b.size(); ++i) {
    const double z = s.true_logit(b.samples[size_t(i)]);
    if (labels[size_t(i)] > 0.5f) pos += z, ++np; else neg += z, ++nn;
  }
  EXPECT_GT(pos / np - neg / nn, 0.5);
  EXPECT_GT(np / double(b.size()), 0.1);
  EXPECT_LT(np / double(b.size()), 0.6);
}

}  // namespace
}  // namespace mt::data::recsys
