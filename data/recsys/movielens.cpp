#include "data/recsys/movielens.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

#include "runtime/core/error.h"
#include "runtime/core/rng.h"
#include "runtime/ops/factory.h"

namespace mt::data::recsys {
namespace {

namespace fs = std::filesystem;
using runtime::Tensor;

std::vector<std::string> split_line(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream is(line);
  while (std::getline(is, field, sep)) out.push_back(field);
  if (!line.empty() && line.back() == sep) out.push_back("");
  return out;
}

// Reads the non-empty lines of a file (a trailing '\r' is dropped); throws naming a missing file.
std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "MovieLens: cannot open ", path.string(),
           " (expected the ml-100k files u.data, u.user, u.item, u.occupation in ",
           path.parent_path().string(), ")");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

int64_t parse_int(const std::string& s, const fs::path& path, size_t line, const char* what) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MT_CHECK(used > 0 && used == s.size(), "MovieLens: ", path.string(), ":", line, ": ", what,
           " is not an integer: '", s, "'");
  return v;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int32_t age_bucket(int64_t age) {
  if (age < 18) return 0;
  if (age < 25) return 1;
  if (age < 35) return 2;
  if (age < 45) return 3;
  if (age < 50) return 4;
  if (age < 56) return 5;
  return 6;
}

std::vector<int64_t> philox_permutation(int64_t n, const runtime::RandomKey& key) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto r = runtime::philox(key, uint64_t(i));
    const uint64_t bits = (uint64_t(r[0]) << 32) | r[1];
    std::swap(perm[size_t(i)], perm[size_t(bits % uint64_t(i + 1))]);
  }
  return perm;
}

}  // namespace

const std::vector<std::string>& MovieLens::sparse_feature_names() {
  static const std::vector<std::string> names = {"user_id",    "item_id", "genres",
                                                 "age_bucket", "gender",  "occupation"};
  return names;
}

std::map<std::string, int64_t> MovieLensState::to_map() const {
  return {{"epoch", epoch},
          {"position", position},
          {"seed", seed},
          {"num_train", num_train},
          {"num_test", num_test}};
}

MovieLensState MovieLensState::from_map(const std::map<std::string, int64_t>& values) {
  auto get = [&](const char* key) {
    auto it = values.find(key);
    MT_CHECK(it != values.end(), "MovieLens state: missing key '", key, "'");
    return it->second;
  };
  MovieLensState s;
  s.epoch = get("epoch");
  s.position = get("position");
  s.seed = get("seed");
  s.num_train = get("num_train");
  s.num_test = get("num_test");
  return s;
}

MovieLens::MovieLens(const fs::path& dir, MovieLensOptions options) : options_(options) {
  MT_CHECK(options_.local_batch_size > 0, "MovieLens: local_batch_size must be > 0, got ",
           options_.local_batch_size);
  MT_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
           "MovieLens: rank ", options_.rank, " is not in [0, world_size = ", options_.world_size,
           ")");
  MT_CHECK(options_.test_fraction > 0.0 && options_.test_fraction < 1.0,
           "MovieLens: test_fraction must be in (0, 1), got ", options_.test_fraction);

  // u.occupation: one name per line.
  {
    const fs::path path = dir / "u.occupation";
    const auto lines = read_lines(path);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      occupations_.push_back(lower(lines[i]));
    }
    MT_CHECK(!occupations_.empty(), "MovieLens: ", path.string(), " lists no occupation");
  }
  // u.user: id|age|gender|occupation|zip, ids 1..n in order.
  {
    const fs::path path = dir / "u.user";
    const auto lines = read_lines(path);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      const size_t ln = i + 1;
      const auto f = split_line(lines[i], '|');
      MT_CHECK(f.size() == 5, "MovieLens: ", path.string(), ":", ln,
               ": expected 5 fields (id|age|gender|occupation|zip), found ", f.size());
      const int64_t id = parse_int(f[0], path, ln, "user id");
      MT_CHECK(id == int64_t(user_age_.size()) + 1, "MovieLens: ", path.string(), ":", ln,
               ": expected user id ", user_age_.size() + 1, " (ids in order from 1), found ", id);
      const int64_t age = parse_int(f[1], path, ln, "age");
      MT_CHECK(age >= 0 && age < 200, "MovieLens: ", path.string(), ":", ln, ": age ", age,
               " is out of range");
      MT_CHECK(f[2] == "M" || f[2] == "F", "MovieLens: ", path.string(), ":", ln,
               ": gender must be M or F, found '", f[2], "'");
      const auto occ = std::find(occupations_.begin(), occupations_.end(), lower(f[3]));
      MT_CHECK(occ != occupations_.end(), "MovieLens: ", path.string(), ":", ln,
               ": occupation '", f[3], "' is not listed in u.occupation");
      user_age_.push_back(int32_t(age));
      user_gender_.push_back(f[2] == "M" ? 0 : 1);
      user_occupation_.push_back(int32_t(occ - occupations_.begin()));
    }
  }
  // u.item: id|title|release date|video date|url|19 genre flags.
  {
    const fs::path path = dir / "u.item";
    const auto lines = read_lines(path);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      const size_t ln = i + 1;
      const auto f = split_line(lines[i], '|');
      MT_CHECK(f.size() == 5 + kGenres, "MovieLens: ", path.string(), ":", ln, ": expected ",
               5 + kGenres, " fields (id|title|release date|video date|url|19 genre flags), found ",
               f.size());
      const int64_t id = parse_int(f[0], path, ln, "item id");
      MT_CHECK(id == int64_t(item_genres_.size()) + 1, "MovieLens: ", path.string(), ":", ln,
               ": expected item id ", item_genres_.size() + 1, " (ids in order from 1), found ",
               id);
      double year = std::numeric_limits<double>::quiet_NaN();
      if (!f[2].empty()) {  // dd-Mon-yyyy
        const std::string y = f[2].size() >= 4 ? f[2].substr(f[2].size() - 4) : f[2];
        year = double(parse_int(y, path, ln, "release year"));
      }
      std::vector<int64_t> genres;
      for (int64_t g = 0; g < kGenres; ++g) {
        const int64_t flag = parse_int(f[size_t(5 + g)], path, ln, "genre flag");
        MT_CHECK(flag == 0 || flag == 1, "MovieLens: ", path.string(), ":", ln, ": genre flag ",
                 g, " must be 0 or 1, found ", flag);
        if (flag) genres.push_back(g);
      }
      item_genres_.push_back(std::move(genres));
      item_year_.push_back(year);
    }
  }
  // u.data: user \t item \t rating \t timestamp.
  {
    const fs::path path = dir / "u.data";
    const auto lines = read_lines(path);
    ratings_.reserve(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      const size_t ln = i + 1;
      const auto f = split_line(lines[i], '\t');
      MT_CHECK(f.size() == 4, "MovieLens: ", path.string(), ":", ln,
               ": expected 4 tab-separated fields (user item rating timestamp), found ", f.size());
      Rating r;
      const int64_t user = parse_int(f[0], path, ln, "user id");
      const int64_t item = parse_int(f[1], path, ln, "item id");
      const int64_t rating = parse_int(f[2], path, ln, "rating");
      MT_CHECK(user >= 1 && user <= num_users(), "MovieLens: ", path.string(), ":", ln,
               ": user id ", user, " is not in u.user (1..", num_users(), ")");
      MT_CHECK(item >= 1 && item <= num_items(), "MovieLens: ", path.string(), ":", ln,
               ": item id ", item, " is not in u.item (1..", num_items(), ")");
      MT_CHECK(rating >= 1 && rating <= 5, "MovieLens: ", path.string(), ":", ln, ": rating ",
               rating, " is not in 1..5");
      r.user = int32_t(user - 1);
      r.item = int32_t(item - 1);
      r.rating = int8_t(rating);
      r.timestamp = parse_int(f[3], path, ln, "timestamp");
      ratings_.push_back(r);
    }
    MT_CHECK(ratings_.size() >= 2, "MovieLens: ", path.string(), " holds fewer than 2 ratings");
  }

  // Split.
  const int64_t n = num_ratings();
  const auto perm = philox_permutation(n, runtime::RandomKey(options_.split_seed, "movielens.split"));
  int64_t num_test = int64_t(std::llround(options_.test_fraction * double(n)));
  num_test = std::clamp<int64_t>(num_test, 1, n - 1);
  test_.assign(perm.begin(), perm.begin() + num_test);
  train_.assign(perm.begin() + num_test, perm.end());

  // Train statistics.
  user_train_count_.assign(size_t(num_users()), 0);
  item_train_count_.assign(size_t(num_items()), 0);
  for (int64_t i : train_) {
    ++user_train_count_[size_t(ratings_[size_t(i)].user)];
    ++item_train_count_[size_t(ratings_[size_t(i)].item)];
  }
  double year_sum = 0.0;
  int64_t year_n = 0;
  for (double y : item_year_) {
    if (!std::isnan(y)) year_sum += y, ++year_n;
  }
  mean_year_ = year_n ? year_sum / double(year_n) : 0.0;
  // Mean and std of the raw dense features over the train samples.
  std::array<double, kDenseFeatures> s{}, s2{};
  dense_mean_.fill(0.0);
  dense_std_.fill(1.0);
  for (int64_t i : train_) {
    const Rating& r = ratings_[size_t(i)];
    const double y = item_year_[size_t(r.item)];
    const std::array<double, kDenseFeatures> v = {
        double(user_age_[size_t(r.user)]), std::isnan(y) ? mean_year_ : y,
        std::log1p(double(user_train_count_[size_t(r.user)])),
        std::log1p(double(item_train_count_[size_t(r.item)]))};
    for (int64_t d = 0; d < kDenseFeatures; ++d) s[size_t(d)] += v[size_t(d)], s2[size_t(d)] += v[size_t(d)] * v[size_t(d)];
  }
  const double nt = double(train_.size());
  for (size_t d = 0; d < size_t(kDenseFeatures); ++d) {
    dense_mean_[d] = s[d] / nt;
    const double var = std::max(0.0, s2[d] / nt - dense_mean_[d] * dense_mean_[d]);
    dense_std_[d] = var > 1e-12 ? std::sqrt(var) : 1.0;
  }
}

std::vector<int64_t> MovieLens::table_sizes() const {
  return {num_users(), num_items(), kGenres, kAgeBuckets, 2, num_occupations()};
}

double MovieLens::positive_share() const {
  int64_t pos = 0;
  for (const Rating& r : ratings_) pos += r.rating >= 4;
  return double(pos) / double(ratings_.size());
}

RecsysBatch MovieLens::make_batch(const std::vector<int64_t>& rating_indices) const {
  const int64_t b = int64_t(rating_indices.size());
  const int64_t nf = int64_t(sparse_feature_names().size());
  std::vector<float> dense(static_cast<size_t>(b * kDenseFeatures));
  std::vector<float> labels(static_cast<size_t>(b));
  std::vector<int64_t> lengths(static_cast<size_t>(nf * b));
  std::vector<std::vector<int64_t>> values(static_cast<size_t>(nf));
  for (int64_t row = 0; row < b; ++row) {
    const int64_t idx = rating_indices[size_t(row)];
    MT_CHECK(idx >= 0 && idx < num_ratings(), "MovieLens: rating index ", idx, " is not in [0, ",
             num_ratings(), ")");
    const Rating& r = ratings_[size_t(idx)];
    const double y = item_year_[size_t(r.item)];
    const std::array<double, kDenseFeatures> v = {
        double(user_age_[size_t(r.user)]), std::isnan(y) ? mean_year_ : y,
        std::log1p(double(user_train_count_[size_t(r.user)])),
        std::log1p(double(item_train_count_[size_t(r.item)]))};
    for (int64_t d = 0; d < kDenseFeatures; ++d) {
      dense[size_t(row * kDenseFeatures + d)] =
          float((v[size_t(d)] - dense_mean_[size_t(d)]) / dense_std_[size_t(d)]);
    }
    labels[size_t(row)] = r.rating >= 4 ? 1.0f : 0.0f;
    const std::vector<int64_t>& genres = item_genres_[size_t(r.item)];
    const std::array<std::vector<int64_t>, 6> ids = {
        std::vector<int64_t>{r.user},
        std::vector<int64_t>{r.item},
        genres,
        std::vector<int64_t>{age_bucket(user_age_[size_t(r.user)])},
        std::vector<int64_t>{user_gender_[size_t(r.user)]},
        std::vector<int64_t>{user_occupation_[size_t(r.user)]}};
    for (int64_t f = 0; f < nf; ++f) {
      lengths[size_t(f * b + row)] = int64_t(ids[size_t(f)].size());
      values[size_t(f)].insert(values[size_t(f)].end(), ids[size_t(f)].begin(),
                               ids[size_t(f)].end());
    }
  }
  std::vector<int64_t> flat;
  for (auto& v : values) flat.insert(flat.end(), v.begin(), v.end());
  RecsysBatch batch;
  batch.dense = runtime::from_vector<float>(dense, {b, kDenseFeatures},
                                            runtime::TensorOptions{}.with_dtype(runtime::DType::F32));
  batch.labels = runtime::from_vector<float>(labels, {b},
                                             runtime::TensorOptions{}.with_dtype(runtime::DType::F32));
  batch.sparse = runtime::sparse::KeyedJaggedTensor::from_lengths(sparse_feature_names(), flat,
                                                                  lengths, {}, b);
  batch.samples = rating_indices;
  return batch;
}

const std::vector<int64_t>& MovieLens::permutation(int64_t epoch) {
  auto it = permutations_.find(epoch);
  if (it != permutations_.end()) return it->second;
  std::vector<int64_t> perm;
  if (options_.shuffle) {
    perm = philox_permutation(int64_t(train_.size()),
                              runtime::RandomKey(options_.seed, "movielens.shuffle", uint64_t(epoch)));
  } else {
    perm.resize(train_.size());
    std::iota(perm.begin(), perm.end(), 0);
  }
  while (permutations_.size() >= 2) permutations_.erase(permutations_.begin());
  return permutations_.emplace(epoch, std::move(perm)).first->second;
}

RecsysBatch MovieLens::next() {
  const int64_t t = int64_t(train_.size());
  const int64_t global = options_.local_batch_size * options_.world_size;
  std::vector<int64_t> idx;
  idx.reserve(size_t(options_.local_batch_size));
  for (int64_t b = 0; b < options_.local_batch_size; ++b) {
    const int64_t g = consumed_ + b * options_.world_size + options_.rank;
    idx.push_back(train_[size_t(permutation(g / t)[size_t(g % t)])]);
  }
  consumed_ += global;
  return make_batch(idx);
}

MovieLensState MovieLens::state() const {
  const int64_t t = int64_t(train_.size());
  MovieLensState s;
  s.epoch = consumed_ / t;
  s.position = consumed_ % t;
  s.seed = int64_t(options_.seed);
  s.num_train = t;
  s.num_test = int64_t(test_.size());
  return s;
}

void MovieLens::load_state(const MovieLensState& s) {
  MT_CHECK(s.seed == int64_t(options_.seed), "MovieLens::load_state: the state was saved with seed ",
           uint64_t(s.seed), " but this loader uses seed ", options_.seed);
  MT_CHECK(s.num_train == int64_t(train_.size()) && s.num_test == int64_t(test_.size()),
           "MovieLens::load_state: the state's split has ", s.num_train, " train / ", s.num_test,
           " test samples, this loader's ", train_.size(), " / ", test_.size(),
           " (a different test_fraction or dataset)");
  MT_CHECK(s.epoch >= 0 && s.position >= 0 && s.position < s.num_train,
           "MovieLens::load_state: invalid position (epoch ", s.epoch, ", position ", s.position,
           ")");
  consumed_ = s.epoch * s.num_train + s.position;
}

int64_t MovieLens::num_test_batches() const {
  const int64_t global = options_.local_batch_size * options_.world_size;
  return (int64_t(test_.size()) + global - 1) / global;
}

RecsysBatch MovieLens::test_batch(int64_t k) const {
  MT_CHECK(k >= 0 && k < num_test_batches(), "MovieLens::test_batch: batch ", k,
           " is not in [0, ", num_test_batches(), ")");
  const int64_t global = options_.local_batch_size * options_.world_size;
  const int64_t start = k * global;
  const int64_t size = std::min(global, int64_t(test_.size()) - start);
  std::vector<int64_t> idx;
  for (int64_t p : rank_rows(size, options_.rank, options_.world_size)) {
    idx.push_back(test_[size_t(start + p)]);
  }
  return make_batch(idx);
}

}  // namespace mt::data::recsys
