// Loader: windows, validation split, per-epoch shuffle, rank split, prefetch, state.
#include "data/dataset/loader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <utility>

#include "runtime/core/error.h"
#include "runtime/core/rng.h"

namespace mt::data {

using runtime::DType;
using runtime::Tensor;

namespace {

constexpr const char* kStateKeys[] = {
    "epoch", "position", "seed", "world_size", "seq_len", "num_train_windows", "num_val_windows"};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::map<std::string, int64_t> LoaderState::to_map() const {
  return {{"epoch", epoch},
          {"position", position},
          {"seed", seed},
          {"world_size", world_size},
          {"seq_len", seq_len},
          {"num_train_windows", num_train_windows},
          {"num_val_windows", num_val_windows}};
}

LoaderState LoaderState::from_map(const std::map<std::string, int64_t>& values) {
  for (const char* key : kStateKeys) {
    MT_CHECK(values.count(key), "loader state: key '", key, "' is missing");
  }
  LoaderState s;
  s.epoch = values.at("epoch");
  s.position = values.at("position");
  s.seed = values.at("seed");
  s.world_size = values.at("world_size");
  s.seq_len = values.at("seq_len");
  s.num_train_windows = values.at("num_train_windows");
  s.num_val_windows = values.at("num_val_windows");
  return s;
}

Loader::Loader(const std::filesystem::path& token_file, LoaderOptions options)
    : reader_(token_file), options_(options) {
  const std::string file = token_file.string();
  const LoaderOptions& o = options_;
  MT_CHECK(o.seq_len > 0, "loader: seq_len must be positive, got ", o.seq_len);
  MT_CHECK(o.local_batch_size > 0, "loader: local_batch_size must be positive, got ",
           o.local_batch_size);
  MT_CHECK(o.world_size > 0 && o.rank >= 0 && o.rank < o.world_size, "loader: rank ", o.rank,
           " is outside world size ", o.world_size);
  MT_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0,
           "loader: val_fraction must be in [0, 1), got ", o.val_fraction);
  MT_CHECK(o.prefetch >= 0, "loader: prefetch must be >= 0, got ", o.prefetch);
  const int64_t n_tokens = reader_.size();
  MT_CHECK(n_tokens >= o.seq_len + 1, "loader: token file ", file, " holds ", n_tokens,
           " tokens, fewer than one window of seq_len + 1 = ", o.seq_len + 1);
  const int64_t n_windows = (n_tokens - 1) / o.seq_len;
  num_val_ = 0;
  if (o.val_fraction > 0.0) {
    num_val_ = std::max<int64_t>(1, std::llround(double(n_windows) * o.val_fraction));
  }
  num_train_ = n_windows - num_val_;
  MT_CHECK(num_train_ > 0, "loader: token file ", file, " holds ", n_windows,
           " windows of seq_len + 1 = ", o.seq_len + 1, " tokens; with ", o.val_fraction * 100,
           "% of them held out for validation (validation.enable) none is left for training");
  start_prefetch();
}

Loader::~Loader() { stop_prefetch(); }

const std::vector<int64_t>& Loader::permutation(int64_t epoch) {
  auto it = permutations_.find(epoch);
  if (it != permutations_.end()) return it->second;
  std::vector<int64_t> perm(static_cast<size_t>(num_train_));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (options_.shuffle) {
    // Fisher-Yates; draw i is Philox at counter i under key (seed, stream, offset = epoch).
    const runtime::RandomKey key(options_.seed, "data.loader.shuffle", uint64_t(epoch));
    for (int64_t i = num_train_ - 1; i > 0; --i) {
      const auto r = runtime::philox(key, uint64_t(i));
      const uint64_t bits = (uint64_t(r[0]) << 32) | r[1];
      std::swap(perm[size_t(i)], perm[size_t(bits % uint64_t(i + 1))]);
    }
  }
  while (permutations_.size() >= 2) permutations_.erase(permutations_.begin());
  return permutations_.emplace(epoch, std::move(perm)).first->second;
}

Batch Loader::make_batch(const std::vector<int64_t>& windows,
                         const std::vector<int64_t>& epochs) const {
  const int64_t rows = int64_t(windows.size());
  const int64_t L = options_.seq_len;
  Batch batch;
  auto opts = runtime::TensorOptions{}.with_dtype(DType::I64);
  batch.inputs = Tensor::empty({rows, L}, opts);
  batch.labels = Tensor::empty({rows, L}, opts);
  int64_t* in = batch.inputs.data<int64_t>();
  int64_t* lab = batch.labels.data<int64_t>();
  std::vector<uint32_t> buf(static_cast<size_t>(L + 1));
  // The file promises ids below its tokenizer's vocab; one that is not (a damaged or hand-made
  // file) is named here, with where it is, not deep in the model's embedding.
  const uint32_t vocab = uint32_t(reader_.info().tokenizer.vocab_size);
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t start = windows[size_t(b)] * L;
    reader_.read(start, start + L + 1, buf.data());
    for (int64_t t = 0; t <= L; ++t) {
      MT_CHECK(vocab == 0 || buf[size_t(t)] < vocab, "loader: token file ",
               reader_.info().path.string(), " holds id ", buf[size_t(t)], " at token ", start + t,
               ", outside its tokenizer's vocab of ", vocab, " (a damaged token file? make it again "
               "with mt_prepare_dataset)");
    }
    for (int64_t t = 0; t < L; ++t) {
      in[b * L + t] = int64_t(buf[size_t(t)]);
      lab[b * L + t] = int64_t(buf[size_t(t + 1)]);
    }
  }
  batch.windows = windows;
  batch.epochs = epochs;
  return batch;
}

Batch Loader::make_train_batch(int64_t global) {
  const int64_t B = options_.local_batch_size;
  std::vector<int64_t> windows(static_cast<size_t>(B));
  std::vector<int64_t> epochs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t g = global + b * options_.world_size + options_.rank;
    const int64_t epoch = g / num_train_;
    windows[size_t(b)] = permutation(epoch)[size_t(g % num_train_)];
    epochs[size_t(b)] = epoch;
  }
  return make_batch(windows, epochs);
}

Batch Loader::next() {
  const auto t0 = std::chrono::steady_clock::now();
  Batch batch;
  if (options_.prefetch == 0) {
    batch = make_train_batch(consumed_);
  } else {
    std::unique_lock lock(mutex_);
    cv_data_.wait(lock, [&] { return !queue_.empty() || error_; });
    if (queue_.empty()) std::rethrow_exception(error_);
    batch = std::move(queue_.front());
    queue_.pop_front();
    cv_space_.notify_one();
  }
  wait_seconds_ += seconds_since(t0);
  consumed_ += step_windows();
  return batch;
}

LoaderState Loader::state() const {
  LoaderState s;
  s.epoch = consumed_ / num_train_;
  s.position = consumed_ % num_train_;
  s.seed = int64_t(options_.seed);
  s.world_size = options_.world_size;
  s.seq_len = options_.seq_len;
  s.num_train_windows = num_train_;
  s.num_val_windows = num_val_;
  return s;
}

void Loader::load_state(const LoaderState& s) {
  const std::string file = reader_.info().path.string();
  MT_CHECK(s.seq_len == options_.seq_len, "loader state: saved with seq_len ", s.seq_len,
           ", this loader has seq_len ", options_.seq_len);
  MT_CHECK(s.num_train_windows == num_train_ && s.num_val_windows == num_val_,
           "loader state: saved for ", s.num_train_windows, " training and ", s.num_val_windows,
           " validation windows, but ", file, " with these options gives ", num_train_, " and ",
           num_val_, " (a different dataset or val_fraction?)");
  MT_CHECK(uint64_t(s.seed) == options_.seed, "loader state: saved with seed ", uint64_t(s.seed),
           ", this loader has seed ", options_.seed);
  MT_CHECK(s.epoch >= 0 && s.position >= 0 && s.position < num_train_, "loader state: epoch ",
           s.epoch, " / position ", s.position, " is out of range (", num_train_,
           " training windows)");
  // world_size may differ: the position counts global windows, so any world size continues it.
  stop_prefetch();
  consumed_ = s.epoch * num_train_ + s.position;
  start_prefetch();
}

int64_t Loader::num_val_batches() const { return num_val_ / step_windows(); }

Batch Loader::val_batch(int64_t k) const {
  MT_CHECK(k >= 0 && k < num_val_batches(), "loader: validation batch ", k, " is out of range [0, ",
           num_val_batches(), ")");
  const int64_t B = options_.local_batch_size;
  std::vector<int64_t> windows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    windows[size_t(b)] = num_train_ + k * step_windows() + b * options_.world_size + options_.rank;
  }
  return make_batch(windows, std::vector<int64_t>(size_t(B), -1));
}

void Loader::start_prefetch() {
  if (options_.prefetch == 0) return;
  {
    std::lock_guard lock(mutex_);
    queue_.clear();
    produced_ = consumed_;
    stop_ = false;
    error_ = nullptr;
  }
  thread_ = std::thread([this] { prefetch_loop(); });
}

void Loader::stop_prefetch() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_space_.notify_all();
  thread_.join();
  std::lock_guard lock(mutex_);
  queue_.clear();
}

void Loader::prefetch_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    cv_space_.wait(lock, [&] { return stop_ || int64_t(queue_.size()) < options_.prefetch; });
    if (stop_) return;
    const int64_t global = produced_;
    produced_ += step_windows();
    lock.unlock();
    Batch batch;
    try {
      batch = make_train_batch(global);
    } catch (...) {
      lock.lock();
      error_ = std::current_exception();
      cv_data_.notify_all();
      return;
    }
    lock.lock();
    queue_.push_back(std::move(batch));
    cv_data_.notify_one();
  }
}

}  // namespace mt::data
