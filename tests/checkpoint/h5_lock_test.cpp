// The process-wide HDF5 lock (runtime/io/hdf5.h) is one lock for the whole process: held by the
// test, it stops token-file reads and writes (mt_data) and checkpoint reads and writes
// (mt_checkpoint) on other threads until released. And a checkpoint save on one thread beside
// token-file reads on another gives correct data on both sides.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "checkpoint/h5_tensor.h"
#include "data/dataset/token_file.h"
#include "runtime/io/hdf5.h"
#include "tests/testing/scratch_dir.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::TensorOptions;

fs::path write_token_file(const fs::path& path, int64_t n) {
  data::TokenFileWriter w(path, {"tokenizer.json", 1000, "0123456789abcdef", ""}, 0,
                          {.block_tokens = 256, .chunk_tokens = 128});
  std::vector<int32_t> doc(size_t(n - 1));
  std::iota(doc.begin(), doc.end(), 1);
  for (auto& t : doc) t %= 1000;
  w.add_document(doc);
  w.finish();
  return path;
}

std::string name_of(int i) { return std::string("t").append(std::to_string(i)); }

Tensor iota_tensor(const Shape& shape, float start) {
  Tensor t = Tensor::empty(shape, TensorOptions{}.with_dtype(DType::F32));
  std::iota(t.data<float>(), t.data<float>() + t.numel(), start);
  return t;
}

// Runs `work` on a thread while this thread holds the HDF5 lock: it must not finish before the
// lock is released, and must finish after.
void expect_blocked_by_lock(const std::function<void()>& work) {
  std::unique_lock<std::recursive_mutex> held(h5::hdf5_mutex());
  std::atomic<bool> done{false};
  std::thread worker([&] {
    work();
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done.load()) << "the HDF5 work ran while the lock was held";
  held.unlock();
  worker.join();
  EXPECT_TRUE(done.load());
}

TEST(H5LockTest, OneLockForTokenFilesAndCheckpoints) {
  testing::ScratchDir dir;
  const fs::path tokens = write_token_file(dir / "tokens.h5", 1000);
  data::TokenFileReader reader(tokens);
  expect_blocked_by_lock([&] { data::TokenFileReader again(tokens); });
  expect_blocked_by_lock([&] { EXPECT_EQ(reader.read(10, 20).at(0), 11u); });
  expect_blocked_by_lock([&] { write_token_file(dir / "more.h5", 100); });

  h5::File file = create_file(dir / "ckpt.h5");
  Tensor t = iota_tensor({4, 4}, 0.0f);
  expect_blocked_by_lock([&] { write_tensor(file.get(), "w", t, ChunkInfo{"w", {4, 4}, {0, 0}}); });
  expect_blocked_by_lock([&] { EXPECT_EQ(read_tensor(file.get(), "w").data<float>()[5], 5.0f); });
  expect_blocked_by_lock([&] { read_hyperslab(file.get(), "w", {1, 1}, {2, 2}); });
}

TEST(H5LockTest, SaveOnAThreadBesideTokenReads) {
  testing::ScratchDir dir;
  const int64_t n = 100000;
  data::TokenFileReader reader(write_token_file(dir / "tokens.h5", n));
  std::atomic<bool> saving{true};
  std::thread saver([&] {
    h5::File file = create_file(dir / "ckpt.h5");
    for (int i = 0; i < 40; ++i) {
      // Small slices: many lock hand-overs per tensor.
      write_tensor(file.get(), name_of(i), iota_tensor({256, 64}, float(i)),
                   ChunkInfo{name_of(i), {256, 64}, {0, 0}}, /*slice_bytes=*/4096);
    }
    saving = false;
  });
  int64_t reads = 0;
  for (int64_t start = 0; saving || reads < 100; start = (start + 7919) % (n - 64), ++reads) {
    const std::vector<uint32_t> window = reader.read(start, start + 64);
    for (int64_t k = 0; k < 64; ++k) {
      ASSERT_EQ(window[size_t(k)], uint32_t((start + k + 1) % 1000)) << start + k;
    }
  }
  saver.join();
  h5::File file = open_file(dir / "ckpt.h5");
  for (int i = 0; i < 40; ++i) {
    Tensor back = read_tensor(file.get(), name_of(i));
    ASSERT_EQ(back.data<float>()[777], float(i + 777));
  }
}

}  // namespace
}  // namespace mt::checkpoint
