// Tests of the data loader on a token file whose token at position i is i, so a row's tokens say
// exactly which window it came from: window contents, per-epoch coverage across 2 and 3 ranks,
// the validation split, shuffles, state save/restore (same and different world size), prefetch.
#include "data/dataset/loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "data/dataset/token_file.h"
#include "runtime/core/error.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSeqLen = 8;
constexpr int64_t kWindows = 50;
constexpr int64_t kTokens = kSeqLen * kWindows + 1;  // 401 tokens: 50 windows, no tail

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mt_loader_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = dir_ / "tokens.h5";
    // One document 0..kTokens-2 followed by EOS = kTokens-1: token i is i.
    std::vector<int32_t> doc(kTokens - 1);
    std::iota(doc.begin(), doc.end(), 0);
    TokenFileWriter w(path_, {"tok.json", kTokens, "h", ""}, kTokens - 1, {64, 32});
    w.add_document(doc);
    w.finish();
  }
  void TearDown() override { fs::remove_all(dir_); }

  LoaderOptions options(int64_t rank, int64_t world, int64_t batch = 2, uint64_t seed = 1234,
                        int64_t prefetch = 2) const {
    LoaderOptions o;
    o.seq_len = kSeqLen;
    o.local_batch_size = batch;
    o.val_fraction = 0.1;  // 5 validation windows, 45 training windows
    o.seed = seed;
    o.rank = rank;
    o.world_size = world;
    o.prefetch = prefetch;
    return o;
  }
  fs::path dir_;
  fs::path path_;
};

// Checks a batch's rows against the windows it claims, and returns them.
std::vector<int64_t> checked_windows(const Batch& b) {
  const auto in = b.inputs.to_vector<int64_t>();
  const auto lab = b.labels.to_vector<int64_t>();
  EXPECT_EQ(b.inputs.shape(), (runtime::Shape{int64_t(b.windows.size()), kSeqLen}));
  EXPECT_EQ(b.inputs.dtype(), runtime::DType::I64);
  for (size_t r = 0; r < b.windows.size(); ++r) {
    for (int64_t t = 0; t < kSeqLen; ++t) {
      EXPECT_EQ(in[r * kSeqLen + t], b.windows[r] * kSeqLen + t);
      EXPECT_EQ(lab[r * kSeqLen + t], b.windows[r] * kSeqLen + t + 1);
    }
  }
  return b.windows;
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.inputs.to_vector<int64_t>() == b.inputs.to_vector<int64_t>() &&
         a.labels.to_vector<int64_t>() == b.labels.to_vector<int64_t>() && a.windows == b.windows &&
         a.epochs == b.epochs;
}

TEST_F(LoaderTest, WindowsInFileOrderWithoutShuffle) {
  LoaderOptions o = options(0, 1, 3);
  o.shuffle = false;
  Loader loader(path_, o);
  EXPECT_EQ(loader.num_windows(), kWindows);
  EXPECT_EQ(loader.num_train_windows(), 45);
  EXPECT_EQ(loader.num_val_windows(), 5);
  for (int64_t step = 0; step < 20; ++step) {  // 60 rows: crosses into epoch 1 at row 45
    Batch b = loader.next();
    checked_windows(b);
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t g = step * 3 + r;
      EXPECT_EQ(b.windows[r], g % 45);
      EXPECT_EQ(b.epochs[r], g / 45);
    }
  }
  EXPECT_EQ(loader.state().epoch, 1);
  EXPECT_EQ(loader.state().position, 15);
}

// Every training window exactly once per epoch across the ranks; no validation window.
void expect_coverage(const fs::path& path, const std::function<LoaderOptions(int64_t)>& opts,
                     int64_t world, int64_t steps) {
  std::map<int64_t, std::vector<int64_t>> per_epoch;  // epoch -> windows seen (all ranks)
  for (int64_t r = 0; r < world; ++r) {
    Loader loader(path, opts(r));
    for (int64_t s = 0; s < steps; ++s) {
      Batch b = loader.next();
      const auto w = checked_windows(b);
      for (size_t i = 0; i < w.size(); ++i) per_epoch[b.epochs[i]].push_back(w[i]);
    }
  }
  const int64_t consumed = steps * opts(0).local_batch_size * world;
  const int64_t full_epochs = consumed / 45;
  ASSERT_GE(full_epochs, 3);
  std::vector<int64_t> all(45);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t e = 0; e < full_epochs; ++e) {
    auto w = per_epoch[e];
    std::sort(w.begin(), w.end());
    EXPECT_EQ(w, all) << "epoch " << e << " with " << world << " ranks";
  }
  // The partial last epoch has no repeats and no validation window.
  auto last = per_epoch[full_epochs];
  std::set<int64_t> uniq(last.begin(), last.end());
  EXPECT_EQ(uniq.size(), last.size());
  EXPECT_EQ(int64_t(last.size()), consumed - full_epochs * 45);
  for (int64_t w : last) EXPECT_LT(w, 45);
}

TEST_F(LoaderTest, EveryTrainingWindowOncePerEpochTwoRanks) {
  expect_coverage(
      path_, [&](int64_t r) { return options(r, 2, 2); }, 2, 40);  // 160 windows
}

TEST_F(LoaderTest, EveryTrainingWindowOncePerEpochThreeRanks) {
  expect_coverage(
      path_, [&](int64_t r) { return options(r, 3, 2, 99, 0); }, 3, 25);  // 150
}

TEST_F(LoaderTest, ValidationHeldOut) {
  // Training labels never reach the validation windows' labels.
  Loader train(path_, options(0, 1, 5));
  int64_t max_label = 0;
  for (int s = 0; s < 27; ++s) {  // 3 epochs
    for (int64_t v : train.next().labels.to_vector<int64_t>()) max_label = std::max(max_label, v);
  }
  EXPECT_EQ(max_label, 45 * kSeqLen);  // the last training window's last label
  // Validation batches, two ranks of 2 rows: one full global batch of windows 45..48.
  std::vector<int64_t> val;
  for (int64_t r = 0; r < 2; ++r) {
    Loader loader(path_, options(r, 2, 2));
    ASSERT_EQ(loader.num_val_batches(), 1);
    Batch b = loader.val_batch(0);
    for (int64_t w : checked_windows(b)) val.push_back(w);
    for (int64_t v : b.labels.to_vector<int64_t>()) EXPECT_GT(v, 45 * kSeqLen);
    EXPECT_THROW(loader.val_batch(1), mt::Error);
  }
  EXPECT_EQ(val, (std::vector<int64_t>{45, 47, 46, 48}));
}

std::vector<int64_t> window_stream(Loader& loader, int64_t steps) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t w : loader.next().windows) out.push_back(w);
  }
  return out;
}

TEST_F(LoaderTest, ShufflesDifferAcrossEpochsAndSeedsAndAreReproducible) {
  Loader a(path_, options(0, 1, 5, 1));
  Loader a2(path_, options(0, 1, 5, 1));
  Loader b(path_, options(0, 1, 5, 2));
  const auto sa = window_stream(a, 18);  // two epochs of 45
  EXPECT_EQ(sa, window_stream(a2, 18));
  const auto sb = window_stream(b, 18);
  const std::vector<int64_t> a0(sa.begin(), sa.begin() + 45), a1(sa.begin() + 45, sa.end());
  const std::vector<int64_t> b0(sb.begin(), sb.begin() + 45);
  EXPECT_NE(a0, a1);
  EXPECT_NE(a0, b0);
  std::vector<int64_t> identity(45);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a0, identity);
  for (auto v : {a0, a1, b0}) {
    std::sort(v.begin(), v.end());
    EXPECT_EQ(v, identity);
  }
}

TEST_F(LoaderTest, RestoredLoaderContinuesExactly) {
  // 4 windows per step (2 ranks x 2 rows); after 9 steps: epoch 0, position 36. The next 10 steps
  // cross into epoch 1 (at position 45) and reach position 31 of epoch 1.
  for (int64_t rank = 0; rank < 2; ++rank) {
    for (int64_t prefetch : {0, 3}) {
      Loader a(path_, options(rank, 2, 2, 7, 2));
      for (int i = 0; i < 9; ++i) a.next();
      const LoaderState saved = a.state();
      EXPECT_EQ(saved.epoch, 0);
      EXPECT_EQ(saved.position, 36);
      EXPECT_EQ(saved.world_size, 2);
      const auto as_map = saved.to_map();
      EXPECT_EQ(as_map.at("position"), 36);

      Loader b(path_, options(rank, 2, 2, 7, prefetch));
      b.next();  // b has moved on; load_state rewinds it (and drops what it prefetched)
      b.load_state(LoaderState::from_map(as_map));
      EXPECT_EQ(b.state(), saved);
      bool crossed = false;
      for (int i = 0; i < 10; ++i) {
        Batch x = a.next(), y = b.next();
        ASSERT_TRUE(same_batch(x, y))
            << "rank " << rank << " prefetch " << prefetch << " batch " << i;
        crossed = crossed || x.epochs.back() == 1;
      }
      EXPECT_TRUE(crossed);
      EXPECT_EQ(a.state(), b.state());
      EXPECT_EQ(b.state().epoch, 1);
      EXPECT_EQ(b.state().position, 31);
    }
  }
}

TEST_F(LoaderTest, StateRestoresOnAnotherWorldSize) {
  // Reference: the global stream, read by one rank taking one window per step.
  Loader ref(path_, options(0, 1, 1, 5));
  const auto stream = window_stream(ref, 90);  // two epochs
  Loader two(path_, options(0, 2, 2, 5));
  for (int i = 0; i < 5; ++i) two.next();  // 20 windows consumed
  const LoaderState saved = two.state();
  ASSERT_EQ(saved.position, 20);
  std::vector<int64_t> seen;  // next 3 steps of 3 ranks x 2 rows = stream[20, 38)
  for (int64_t r = 0; r < 3; ++r) {
    Loader three(path_, options(r, 3, 2, 5));
    three.load_state(saved);
    for (int s = 0; s < 3; ++s) {
      Batch b = three.next();
      for (int64_t row = 0; row < 2; ++row) {
        EXPECT_EQ(b.windows[row], stream[20 + s * 6 + row * 3 + r]);
      }
    }
    EXPECT_EQ(three.state().position, 38);
    EXPECT_EQ(three.state().world_size, 3);
  }
}

TEST_F(LoaderTest, PrefetchOnAndOffGiveTheSameBatches) {
  for (int64_t rank = 0; rank < 3; ++rank) {
    Loader on(path_, options(rank, 3, 2, 11, 4));
    Loader off(path_, options(rank, 3, 2, 11, 0));
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(same_batch(on.next(), off.next())) << i;
    EXPECT_GT(off.data_wait_seconds(), 0.0);  // reading on the caller's thread is waiting
    EXPECT_GE(on.data_wait_seconds(), 0.0);
  }
}

TEST_F(LoaderTest, DestroyWithFullQueue) {
  // The prefetcher is blocked on a full queue; the destructor must still stop it promptly.
  Loader loader(path_, options(0, 1, 1, 3, 2));
  loader.next();
}

TEST_F(LoaderTest, Errors) {
  auto msg_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const mt::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string msg = msg_of([&] { Loader l(dir_ / "missing.h5", options(0, 1)); });
  EXPECT_NE(msg.find("missing.h5"), std::string::npos) << msg;

  LoaderOptions big = options(0, 1);
  big.seq_len = 400;  // 401 tokens: one window, none left for training after validation
  msg = msg_of([&] { Loader l(path_, big); });
  EXPECT_NE(msg.find("none is left for training"), std::string::npos) << msg;
  big.seq_len = 401;
  msg = msg_of([&] { Loader l(path_, big); });
  EXPECT_NE(msg.find("fewer than one window"), std::string::npos) << msg;

  EXPECT_THROW(Loader(path_, options(2, 2)), mt::Error);

  Loader l(path_, options(0, 1, 2, 1));
  LoaderState s = l.state();
  s.seed = 2;
  msg = msg_of([&] { l.load_state(s); });
  EXPECT_NE(msg.find("seed 2"), std::string::npos) << msg;
  s = l.state();
  s.seq_len = 16;
  msg = msg_of([&] { l.load_state(s); });
  EXPECT_NE(msg.find("seq_len 16"), std::string::npos) << msg;
  s = l.state();
  s.position = 45;
  EXPECT_THROW(l.load_state(s), mt::Error);

  auto m = l.state().to_map();
  m.erase("position");
  msg = msg_of([&] { LoaderState::from_map(m); });
  EXPECT_NE(msg.find("'position' is missing"), std::string::npos) << msg;
  // The loader still works after the rejected states.
  EXPECT_EQ(l.next().windows.size(), 2u);
}

}  // namespace
}  // namespace mt::data
