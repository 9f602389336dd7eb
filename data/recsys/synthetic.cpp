#include "data/recsys/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/core/error.h"
#include "runtime/core/rng.h"
#include "runtime/ops/factory.h"

namespace mt::data::recsys {
namespace {

using runtime::RandomKey;

// Zipf-like id in [0, n): inverse CDF of the continuous density ~ x^-s on [1, n + 1).
int64_t power_law_id(double u, int64_t n, double s) {
  const double top = double(n) + 1.0;
  double x;
  if (std::abs(s - 1.0) < 1e-9) {
    x = std::pow(top, u);
  } else {
    const double a = 1.0 - s;
    x = std::pow(1.0 + u * (std::pow(top, a) - 1.0), 1.0 / a);
  }
  return std::clamp<int64_t>(int64_t(std::floor(x)) - 1, 0, n - 1);
}

// A bijection of [0, n): k -> (k * mult + add) mod n with mult coprime to n.
int64_t scramble(int64_t k, int64_t n, int64_t table) {
  if (n <= 2) return k;
  uint64_t mult = (0x9E3779B97F4A7C15ull >> 11) % uint64_t(n);
  while (std::gcd(mult, uint64_t(n)) != 1 || mult == 0) mult = (mult + 1) % uint64_t(n);
  const uint64_t add = (uint64_t(table) * 0x632BE59BD9B4E019ull) % uint64_t(n);
  return int64_t((__uint128_t(k) * mult + add) % uint64_t(n));
}

}  // namespace

std::vector<int64_t> criteo_table_sizes(int64_t max_rows) {
  MT_CHECK(max_rows >= 4, "criteo_table_sizes: max_rows must be >= 4, got ", max_rows);
  // Relative sizes shaped like Criteo Kaggle's 26 cardinalities (largest first 1.0).
  static const double rel[26] = {1.0,   0.6,   0.3,  0.2,   0.1,   0.05,  0.03,  0.02,  0.01,
                                 0.008, 0.005, 0.003, 0.002, 0.001, 5e-4, 3e-4, 2e-4, 1e-4,
                                 5e-5,  3e-5,  1e-5, 5e-6,  3e-6,  2e-6,  1e-6,  5e-7};
  std::vector<int64_t> sizes;
  for (double r : rel) sizes.push_back(std::max<int64_t>(4, int64_t(std::llround(r * double(max_rows)))));
  return sizes;
}

SyntheticCriteo::SyntheticCriteo(SyntheticOptions options) : options_(std::move(options)) {
  if (options_.table_sizes.empty()) options_.table_sizes = criteo_table_sizes(10000);
  MT_CHECK(options_.num_dense >= 0, "SyntheticCriteo: num_dense must be >= 0, got ",
           options_.num_dense);
  for (size_t t = 0; t < options_.table_sizes.size(); ++t) {
    MT_CHECK(options_.table_sizes[t] >= 1, "SyntheticCriteo: table_sizes[", t,
             "] must be >= 1, got ", options_.table_sizes[t]);
  }
  MT_CHECK(options_.pooling_factor >= 1, "SyntheticCriteo: pooling_factor must be >= 1, got ",
           options_.pooling_factor);
  MT_CHECK(options_.zipf_exponent > 0.0, "SyntheticCriteo: zipf_exponent must be > 0, got ",
           options_.zipf_exponent);
  MT_CHECK(options_.local_batch_size > 0, "SyntheticCriteo: local_batch_size must be > 0, got ",
           options_.local_batch_size);
  MT_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
           "SyntheticCriteo: rank ", options_.rank, " is not in [0, world_size = ",
           options_.world_size, ")");
  for (size_t t = 0; t < options_.table_sizes.size(); ++t) names_.push_back("cat_" + std::to_string(t));
  const RandomKey wkey(options_.seed, "synthetic.dense_weights");
  for (int64_t d = 0; d < options_.num_dense; ++d) dense_weights_.push_back(runtime::normal_at(wkey, uint64_t(d)));
}

SyntheticCriteo::Sample SyntheticCriteo::draw(int64_t sample) const {
  const int64_t nd = options_.num_dense;
  const int64_t nf = int64_t(options_.table_sizes.size());
  const uint64_t s = uint64_t(sample);
  Sample out;
  const RandomKey dkey(options_.seed, "synthetic.dense", s);
  double z = options_.bias;
  for (int64_t d = 0; d < nd; ++d) {
    const double u = runtime::uniform_at(dkey, uint64_t(d));
    const double v = std::log1p(100.0 * u) / std::log(101.0);
    out.dense.push_back(float(v));
    z += dense_weights_[size_t(d)] * (v - 0.5);
  }
  const RandomKey skey(options_.seed, "synthetic.sparse", s);
  const int64_t max_ids = options_.variable_pooling ? 2 * options_.pooling_factor - 1 : options_.pooling_factor;
  for (int64_t f = 0; f < nf; ++f) {
    const int64_t rows = options_.table_sizes[size_t(f)];
    int64_t n = options_.pooling_factor;
    if (options_.variable_pooling) {
      const double u = runtime::uniform_at(skey, uint64_t(f * (max_ids + 1)));
      n = 1 + std::min<int64_t>(int64_t(u * double(max_ids)), max_ids - 1);
    }
    std::vector<int64_t> ids;
    const RandomKey hkey(options_.seed, "synthetic.hidden." + std::to_string(f));
    double h = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const double u = runtime::uniform_at(skey, uint64_t(f * (max_ids + 1) + 1 + j));
      int64_t id = power_law_id(u, rows, options_.zipf_exponent);
      if (options_.scramble_ids) id = scramble(id, rows, f);
      ids.push_back(id);
      h += runtime::normal_at(hkey, uint64_t(id));
    }
    z += options_.signal * h / double(n) / std::sqrt(double(std::max<int64_t>(nf, 1)) / 4.0);
    out.ids.push_back(std::move(ids));
  }
  out.logit = z;
  const double p = 1.0 / (1.0 + std::exp(-z));
  const double u = runtime::uniform_at(RandomKey(options_.seed, "synthetic.label"), s);
  out.label = u < p ? 1.0f : 0.0f;
  return out;
}

double SyntheticCriteo::true_logit(int64_t sample) const { return draw(sample).logit; }

RecsysBatch SyntheticCriteo::make_batch(const std::vector<int64_t>& samples) const {
  const int64_t b = int64_t(samples.size());
  const int64_t nd = options_.num_dense;
  const int64_t nf = int64_t(options_.table_sizes.size());
  std::vector<float> dense(static_cast<size_t>(b * nd)), labels(static_cast<size_t>(b));
  std::vector<int64_t> lengths(static_cast<size_t>(nf * b));
  std::vector<std::vector<int64_t>> values(static_cast<size_t>(nf));
  for (int64_t row = 0; row < b; ++row) {
    MT_CHECK(samples[size_t(row)] >= 0, "SyntheticCriteo: negative sample index ",
             samples[size_t(row)]);
    Sample s = draw(samples[size_t(row)]);
    std::copy(s.dense.begin(), s.dense.end(), dense.begin() + row * nd);
    labels[size_t(row)] = s.label;
    for (int64_t f = 0; f < nf; ++f) {
      lengths[size_t(f * b + row)] = int64_t(s.ids[size_t(f)].size());
      values[size_t(f)].insert(values[size_t(f)].end(), s.ids[size_t(f)].begin(), s.ids[size_t(f)].end());
    }
  }
  std::vector<int64_t> flat;
  for (auto& v : values) flat.insert(flat.end(), v.begin(), v.end());
  RecsysBatch batch;
  batch.dense = runtime::from_vector<float>(dense, {b, nd});
  batch.labels = runtime::from_vector<float>(labels, {b});
  batch.sparse = runtime::sparse::KeyedJaggedTensor::from_lengths(names_, flat, lengths, {}, b);
  batch.samples = samples;
  return batch;
}

RecsysBatch SyntheticCriteo::next() {
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < options_.local_batch_size; ++b) {
    idx.push_back(position_ + b * options_.world_size + options_.rank);
  }
  position_ += options_.local_batch_size * options_.world_size;
  return make_batch(idx);
}

void SyntheticCriteo::set_position(int64_t position) {
  MT_CHECK(position >= 0, "SyntheticCriteo::set_position: negative position ", position);
  position_ = position;
}

}  // namespace mt::data::recsys
