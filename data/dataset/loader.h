// Loader: training and validation batches [local_batch_size, seq_len] (i64) from a token file.
//
// Windows. Window i holds tokens [i*seq_len, i*seq_len + seq_len + 1): inputs = window[:-1],
//   labels = window[1:]. Consecutive windows overlap by one token (torchtitan cuts disjoint
//   seq_len+1 windows and so never uses one token in seq_len+1 as a label; here every token but
//   the first is a label exactly once per epoch). Windows cross document boundaries: documents
//   are packed, separated by EOS, as in torchtitan and llm.c. A tail shorter than a window is
//   not used.
// Validation split. The last `val_fraction` of the windows (at least one when val_fraction > 0)
//   are held out: never in a training batch. The first validation window's first input is the
//   last training window's last label (the one shared token of the overlap); no validation label
//   is ever a training label. Validation batches are read in file order (no shuffle), rank r
//   taking validation windows r, r+w, ...; only full global batches are formed.
// Training order. An endless stream of epochs; epoch e visits the training windows in a
//   permutation drawn from (seed, e) with the counter-based Philox generator (Fisher-Yates), so it
//   depends on nothing else. Global position g of the stream is epoch g / T, index g % T (T =
//   training windows). Step s uses positions [s*B*w, (s+1)*B*w) (B = local batch, w = world
//   size); rank r takes positions s*B*w + b*w + r for rows b = 0..B-1, i.e. windows r, r+w, r+2w,
//   ... of the shuffled order. A batch may span an epoch boundary: nothing is dropped, every
//   training window is used exactly once per epoch across the ranks.
// State. (epoch, position = global windows consumed in that epoch by all ranks together, seed,
//   world size, plus seq_len and the window counts to detect a different dataset). Because the
//   position is global, a state saved with one world size continues correctly with another: rank
//   r' of w' simply takes positions P + b*w' + r'.
// Prefetch. With prefetch > 0 a background thread reads up to `prefetch` batches ahead into a
//   bounded queue; the batches are the same as without it. The destructor stops the thread.
//   data_wait_seconds() is the time next() spent blocked on data (or reading, without prefetch).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset/token_file.h"
#include "runtime/core/tensor.h"

namespace mt::data {

struct LoaderOptions {
  int64_t seq_len = 0;           // tokens per input row
  int64_t local_batch_size = 0;  // rows per batch on this rank
  double val_fraction = 0.0;     // share of windows held out for validation, in [0, 1)
  uint64_t seed = 0;
  bool shuffle = true;  // false: training windows in file order (still split across ranks)
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t prefetch = 2;  // batches read ahead by a background thread; 0: read in next()
};

struct LoaderState {
  int64_t epoch = 0;
  int64_t position = 0;  // training windows consumed in `epoch`, all ranks together
  int64_t seed = 0;      // the uint64 seed's bits
  int64_t world_size = 1;
  int64_t seq_len = 0;
  int64_t num_train_windows = 0;
  int64_t num_val_windows = 0;

  // Integer key-value form for checkpoints; from_map names a missing key.
  std::map<std::string, int64_t> to_map() const;
  static LoaderState from_map(const std::map<std::string, int64_t>& values);
  bool operator==(const LoaderState&) const = default;
};

struct Batch {
  runtime::Tensor inputs;        // [local_batch_size, seq_len] i64
  runtime::Tensor labels;        // [local_batch_size, seq_len] i64, inputs shifted by one token
  std::vector<int64_t> windows;  // window index (in the file) of each row
  std::vector<int64_t> epochs;   // epoch of each row (-1 for validation)
};

class Loader {
 public:
  Loader(const std::filesystem::path& token_file, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next training batch of this rank.
  Batch next();

  // State after the last batch returned by next() (not what the prefetcher has read ahead).
  LoaderState state() const;
  // Continues from `state`: the next batches are those the saved loader would have produced
  // (for this loader's rank and world size). Errors when seq_len, the window counts or the seed
  // differ from this loader's.
  void load_state(const LoaderState& state);

  int64_t num_windows() const { return num_train_ + num_val_; }
  int64_t num_train_windows() const { return num_train_; }
  int64_t num_val_windows() const { return num_val_; }
  // Full global validation batches, and batch k of them for this rank.
  int64_t num_val_batches() const;
  Batch val_batch(int64_t k) const;

  double data_wait_seconds() const { return wait_seconds_; }  // total, since construction
  const TokenFileInfo& info() const { return reader_.info(); }
  const LoaderOptions& options() const { return options_; }

 private:
  int64_t step_windows() const { return options_.local_batch_size * options_.world_size; }
  // Training batch whose first global position is `global` (all ranks' rows start there).
  Batch make_train_batch(int64_t global);
  Batch make_batch(const std::vector<int64_t>& windows, const std::vector<int64_t>& epochs) const;
  const std::vector<int64_t>& permutation(int64_t epoch);  // producer side only
  void start_prefetch();
  void stop_prefetch();
  void prefetch_loop();

  TokenFileReader reader_;
  LoaderOptions options_;
  int64_t num_train_ = 0;
  int64_t num_val_ = 0;
  int64_t consumed_ = 0;  // global stream position after the last batch returned by next()
  double wait_seconds_ = 0.0;

  // Permutations of the last two epochs used (a batch may span an epoch boundary).
  std::map<int64_t, std::vector<int64_t>> permutations_;

  // Prefetch (guarded by mutex_).
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_space_;
  std::condition_variable cv_data_;
  std::deque<Batch> queue_;
  int64_t produced_ = 0;  // global position of the next batch to read ahead
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace mt::data
