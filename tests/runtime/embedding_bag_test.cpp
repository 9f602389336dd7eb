// Table-batched embedding bags: pooled output equals a per-table loop of plain ops (embedding +
// sum / mean, per-sample weights, empty bags, MEAN of an empty bag = 0, shared tables), the
// unpooled lookup equals embedding(); dense gradients against finite differences in f64; the
// row-sparse gradient handed to a sink equals the plain-ops reference gradient; results are
// bitwise independent of the thread count; errors name feature, sample and table; the backward's
// host grouping (a radix sort by id) orders as a stable sort and gives every backend the same runs.
#include "runtime/ops/embedding_bag.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <random>

#include "runtime/autograd/gradcheck.h"
#include "runtime/kernels/embedding_bag_grad_entries.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::error_of;
using testing::randn_as;

const TensorOptions kI64 = TensorOptions{}.with_dtype(DType::I64);

// A random batch: F features over `tables`, lengths in [0, max_len] (some bags empty), ids with
// many duplicates (small tables).
struct Batch {
  std::vector<int64_t> values, offsets;
  std::vector<double> weights;
  int64_t B;
};

Batch random_batch(const std::vector<int64_t>& feature_rows, int64_t B, int64_t max_len,
                   uint64_t seed) {
  Batch b;
  b.B = B;
  b.offsets.push_back(0);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
  };
  for (int64_t rows : feature_rows) {
    for (int64_t i = 0; i < B; ++i) {
      const int64_t len = int64_t(next() % uint64_t(max_len + 1));
      for (int64_t k = 0; k < len; ++k) {
        b.values.push_back(int64_t(next() % uint64_t(rows)));
        b.weights.push_back(double(next() % 1024) / 512.0 - 1.0);  // exact in f32
      }
      b.offsets.push_back(int64_t(b.values.size()));
    }
  }
  return b;
}

// Plain-ops reference: for every feature and sample, embedding(table, ids) * w summed (or
// averaged) over the bag; features concatenated along dim 1.
Tensor reference_pooled(const std::vector<Tensor>& tables, const Batch& b,
                        const TableBatchLayout& layout, bool weighted) {
  std::vector<Tensor> per_feature;
  for (size_t f = 0; f < layout.feature_table.size(); ++f) {
    const Tensor& table = tables[layout.feature_table[f]];
    std::vector<Tensor> rows;
    for (int64_t i = 0; i < b.B; ++i) {
      const int64_t s = b.offsets[f * b.B + i], e = b.offsets[f * b.B + i + 1];
      if (s == e) {
        rows.push_back(zeros({1, table.size(1)}, table.options()));
        continue;
      }
      std::vector<int64_t> ids(b.values.begin() + s, b.values.begin() + e);
      Tensor g = embedding(table, from_vector(ids, {e - s}, kI64));
      if (weighted) {
        std::vector<double> w(b.weights.begin() + s, b.weights.begin() + e);
        g = mul(g, from_vector(w, {e - s, 1}, table.options()));
      }
      Tensor pooled = sum(g, {0}, true);
      if (!layout.feature_pooling.empty() && layout.feature_pooling[f] == PoolingMode::Mean)
        pooled = div(pooled, double(e - s));
      rows.push_back(pooled);
    }
    per_feature.push_back(cat(rows, 0));
  }
  return cat(per_feature, 1);
}

Tensor ids_of(const Batch& b) { return from_vector(b.values, {int64_t(b.values.size())}, kI64); }
Tensor offsets_of(const Batch& b) {
  return from_vector(b.offsets, {int64_t(b.offsets.size())}, kI64);
}
Tensor weights_of(const Batch& b) {
  return from_vector(b.weights, {int64_t(b.weights.size())}, TensorOptions{});
}

// Three tables, four features (table 1 read by two features, one SUM one MEAN).
struct Tables {
  std::vector<Tensor> tables;
  TableBatchLayout layout;
  std::vector<int64_t> feature_rows;
};

Tables make_setup(DType dtype, bool requires_grad = false) {
  Tables s;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{5, 3}, {7, 4}, {3, 2}};
  for (size_t t = 0; t < shapes.size(); ++t) {
    Tensor w = randn_as({shapes[t].first, shapes[t].second}, dtype, 10 + t);
    if (requires_grad) w.set_requires_grad(true);
    s.tables.push_back(w);
  }
  s.layout.feature_table = {0, 1, 2, 1};
  s.layout.feature_pooling = {PoolingMode::Sum, PoolingMode::Mean, PoolingMode::Mean,
                              PoolingMode::Sum};
  s.layout.feature_names = {"f0", "f1", "f2", "f3"};
  for (int64_t t : s.layout.feature_table) s.feature_rows.push_back(s.tables[t].size(0));
  return s;
}

TEST(EmbeddingBagsBatched, PooledMatchesPerTablePlainOps) {
  for (bool weighted : {false, true}) {
    const Tables s = make_setup(DType::F32);
    const Batch b = random_batch(s.feature_rows, 6, 4, weighted ? 2 : 1);
    const Tensor out = embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), b.B, s.layout,
                                              weighted ? weights_of(b) : Tensor());
    EXPECT_EQ(out.shape(), (Shape{6, 3 + 4 + 2 + 4}));
    EXPECT_TRUE(all_close(out, reference_pooled(s.tables, b, s.layout, weighted), 1e-6, 1e-5))
        << "weighted " << weighted;
  }
}

TEST(EmbeddingBagsBatched, EmptyBagsAndEmptyBatch) {
  const Tables s = make_setup(DType::F32);
  // Feature 1 (MEAN) has only empty bags: its columns are 0, as SUM's are.
  Batch b;
  b.B = 2;
  b.values = {4, 4, 1, 2, 0};
  b.offsets = {0, 2, 2, 2, 2, 3, 3, 4, 5};
  const Tensor out = embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), 2, s.layout);
  EXPECT_TRUE(all_close(out, reference_pooled(s.tables, b, s.layout, false)));
  EXPECT_EQ(out.narrow(1, 3, 4).to_vector<double>(), std::vector<double>(8, 0.0));
  const Tensor empty = embedding_bags_batched(s.tables, from_vector<int64_t>({}, {0}, kI64),
                                              from_vector<int64_t>({0}, {1}, kI64), 0, s.layout);
  EXPECT_EQ(empty.shape(), (Shape{0, 13}));
}

TEST(EmbeddingBagsBatched, UnpooledMatchesEmbedding) {
  const Tables s = make_setup(DType::F32);
  const Batch b = random_batch(s.feature_rows, 5, 3, 3);
  const Tensor flat = embedding_lookup_batched(s.tables, ids_of(b), offsets_of(b), b.B, s.layout);
  int64_t pos = 0;
  for (size_t f = 0; f < 4; ++f) {
    const Tensor& table = s.tables[s.layout.feature_table[f]];
    const int64_t begin = b.offsets[f * b.B], end = b.offsets[(f + 1) * b.B];
    std::vector<int64_t> ids(b.values.begin() + begin, b.values.begin() + end);
    const Tensor expected = embedding(table, from_vector(ids, {end - begin}, kI64));
    EXPECT_EQ(flat.narrow(0, pos, expected.numel()).to_vector<double>(),
              expected.to_vector<double>());
    pos += expected.numel();
  }
  EXPECT_EQ(pos, flat.numel());
}

TEST(EmbeddingBagsBatched, DenseGradientMatchesFiniteDifferences) {
  for (bool weighted : {false, true}) {
    const Tables s = make_setup(DType::F64, true);
    const Batch b = random_batch(s.feature_rows, 4, 3, 5);
    auto fn = [&](const std::vector<Tensor>& in) {
      return embedding_bags_batched(in, ids_of(b), offsets_of(b), b.B, s.layout,
                                    weighted ? weights_of(b) : Tensor());
    };
    const auto r = autograd::gradcheck(fn, s.tables);
    EXPECT_TRUE(r.ok) << r.message;
    auto fn_unpooled = [&](const std::vector<Tensor>& in) {
      return embedding_lookup_batched(in, ids_of(b), offsets_of(b), b.B, s.layout);
    };
    const auto ru = autograd::gradcheck(fn_unpooled, s.tables);
    EXPECT_TRUE(ru.ok) << ru.message;
  }
}

// The gradient the sink receives equals the plain-ops reference's dense gradient on the rows the
// batch touched (and the reference is zero elsewhere).
TEST(EmbeddingBagsBatched, RowSparseGradientEqualsReferenceGradient) {
  const Tables s = make_setup(DType::F64);
  const Batch b = random_batch(s.feature_rows, 7, 4, 7);
  const Tensor upstream = randn_as({7, 13}, DType::F64, 99);
  std::vector<RowSparseGrad> got;
  int calls = 0;
  const Tensor out = embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), b.B, s.layout,
                                            weights_of(b), [&](std::vector<RowSparseGrad>& g) {
                                              got = g;
                                              ++calls;
                                            });
  ASSERT_TRUE(out.requires_grad());
  sum(mul(out, upstream)).backward();
  EXPECT_EQ(calls, 1);

  std::vector<Tensor> ref_tables;
  for (const Tensor& t : s.tables) ref_tables.push_back(t.clone().set_requires_grad(true));
  sum(mul(reference_pooled(ref_tables, b, s.layout, true), upstream)).backward();

  ASSERT_EQ(got.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(got[t].table, int64_t(t));
    const std::vector<int64_t> rows = got[t].rows.to_vector<int64_t>();
    for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1], rows[i]);
    // Every touched row is listed.
    for (size_t f = 0; f < 4; ++f) {
      if (s.layout.feature_table[f] != int64_t(t)) continue;
      for (int64_t i = b.offsets[f * b.B]; i < b.offsets[(f + 1) * b.B]; ++i)
        EXPECT_TRUE(std::binary_search(rows.begin(), rows.end(), b.values[i]));
    }
    EXPECT_TRUE(all_close(got[t].to_dense(), ref_tables[t].grad(), 1e-12, 1e-12)) << "table " << t;
  }
}

TEST(EmbeddingBagsBatched, BitwiseIndependentOfThreadCount) {
  const Tables s = make_setup(DType::F32);
  const Batch b = random_batch(s.feature_rows, 64, 30, 11);
  const Tensor upstream = randn_as({64, 13}, DType::F32, 5);
  auto run = [&](int threads) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<RowSparseGrad> got;
    const Tensor out =
        embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), b.B, s.layout, weights_of(b),
                               [&](std::vector<RowSparseGrad>& g) { got = g; });
    sum(mul(out, upstream)).backward();
    omp_set_num_threads(prev);
    std::vector<double> all = out.to_vector<double>();
    for (const RowSparseGrad& g : got) {
      const std::vector<double> v = g.values.to_vector<double>();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  EXPECT_EQ(run(1), run(4));
}

// bf16 tables accumulate in f32 and round once: the f32 lookup of the same (rounded) values,
// rounded to bf16.
TEST(EmbeddingBagsBatched, Bf16TablesAccumulateInF32) {
  const Tables s = make_setup(DType::BF16);
  std::vector<Tensor> f32;
  for (const Tensor& t : s.tables) f32.push_back(t.to(DType::F32));
  const Batch b = random_batch(s.feature_rows, 5, 6, 13);
  const Tensor out =
      embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), b.B, s.layout, weights_of(b));
  EXPECT_EQ(out.dtype(), DType::BF16);
  const Tensor expected =
      embedding_bags_batched(f32, ids_of(b), offsets_of(b), b.B, s.layout, weights_of(b));
  EXPECT_TRUE(all_close(out, expected.to(DType::BF16), 0, 0));
}

// The radix sort keeps equal ids in their order, as stable_sort, for ids of every width (one
// digit, several, digits shared by every id, ids past 2^32) and for unchecked negative ids.
TEST(EmbeddingBagsBatched, GradEntrySortOrdersAsAStableSort) {
  struct Ids {
    int64_t distinct, step, first;  // ids first + step * [0, distinct)
  };
  std::mt19937_64 rng(7);
  for (const Ids ids : {Ids{1, 1, 0}, Ids{41, 1, 0}, Ids{41, 100, 0}, Ids{41, 1 << 11, 0},
                        Ids{41, int64_t(1) << 30, 3}, Ids{9, 1, -4}}) {
    SCOPED_TRACE(::testing::Message()
                 << ids.first << " + " << ids.step << " x [0, " << ids.distinct << ")");
    std::vector<TbeGradEntry<float>> entries;
    for (int64_t k = 0; k < 5000; ++k)
      entries.push_back(
          {ids.first + ids.step * int64_t(rng() % uint64_t(ids.distinct)), k, float(k % 7)});
    std::vector<TbeGradEntry<float>> expected = entries;
    std::stable_sort(expected.begin(), expected.end(),
                     [](const auto& a, const auto& b) { return a.id < b.id; });
    tbe_sort_by_id(entries);
    ASSERT_EQ(entries.size(), expected.size());
    for (size_t k = 0; k < entries.size(); ++k) {
      ASSERT_EQ(entries[k].id, expected[k].id) << k;
      ASSERT_EQ(entries[k].src, expected[k].src) << k;
      ASSERT_EQ(entries[k].scale, expected[k].scale) << k;
    }
  }
}

// tbe_table_counts (what sizes the CUDA backward's gradients) counts, per table, the entries and
// the runs of tbe_grad_entries: ids outside their table left out, small tables counted with a
// bitmap and a large one (few ids for its rows) by sorting.
TEST(EmbeddingBagsBatched, TableCountsAreTheGroupingsEntriesAndRuns) {
  TbePlan plan;
  plan.batch_size = 5;
  plan.feature_table = {0, 2, 0, 1};  // table 0 read by two features; table 3 by none
  plan.feature_mean = {0, 1, 1, 0};
  plan.feature_out = {0, 4, 12, 16};
  plan.out_width = 19;
  const std::vector<int64_t> dims = {4, 3, 8, 2}, rows = {6, 5, int64_t(1) << 20, 6};
  std::mt19937_64 rng(3);
  std::vector<int64_t> values, offsets{0};
  for (int64_t bag = 0; bag < 4 * plan.batch_size; ++bag) {
    for (int64_t i = int64_t(rng() % 4); i > 0; --i) values.push_back(int64_t(rng() % 7) - 1);
    offsets.push_back(int64_t(values.size()));
  }
  const std::vector<TbeTableCounts> counts =
      tbe_table_counts(rows, plan, values.data(), offsets.data());
  ASSERT_EQ(counts.size(), rows.size());
  ASSERT_NE(std::count(values.begin(), values.end(), -1), 0);  // outside every table
  int64_t counted = 0;
  for (int64_t t = 0; t < int64_t(rows.size()); ++t) {
    SCOPED_TRACE(t);
    std::vector<TbeGradEntry<float>> entries =
        tbe_grad_entries<float>(t, dims[size_t(t)], plan, values.data(), offsets.data(), nullptr);
    std::erase_if(entries, [&](const auto& e) { return e.id < 0 || e.id >= rows[size_t(t)]; });
    EXPECT_EQ(counts[size_t(t)].entries, int64_t(entries.size()));
    EXPECT_EQ(counts[size_t(t)].rows,
              entries.empty() ? 0 : int64_t(tbe_run_starts(entries).size()) - 1);
    counted += counts[size_t(t)].entries;
  }
  EXPECT_EQ(counts[3].entries, 0);
  EXPECT_GT(counts[2].rows, 0);
  EXPECT_LT(counted, int64_t(values.size()));  // the -1s left out
}

TEST(EmbeddingBagsBatched, Errors) {
  const Tables s = make_setup(DType::F32);
  Batch b;
  b.B = 2;
  b.values = {4, 4, 1, 7, 0};  // 7 is outside feature f1's table (7 rows)
  b.offsets = {0, 2, 2, 2, 4, 4, 4, 5, 5};
  EXPECT_NE(error_of([&] {
              embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), 2, s.layout);
            }).find("id 7 of feature 'f1', sample 1 (value 3) is outside [0, 7) of table 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), 3, s.layout);
            }).find("expected 13 offsets for 4 features and batch 3, got 9"),
            std::string::npos);
  b.offsets = {0, 2, 1, 2, 4, 4, 4, 5, 5};
  b.values[3] = 0;
  EXPECT_NE(error_of([&] {
              embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), 2, s.layout);
            }).find("offsets decrease at feature 'f0', sample 1"),
            std::string::npos);
  TableBatchLayout bad = s.layout;
  bad.feature_table[2] = 3;
  EXPECT_NE(error_of([&] {
              embedding_bags_batched(s.tables, ids_of(b), offsets_of(b), 2, bad);
            }).find("feature 'f2' reads table 3 but there are 3 tables"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::runtime
