// KeyedJaggedTensor: layout (offsets, per-key views), validation errors naming key and sample,
// split and permute against hand-written expectations, empty batches and keys without ids.
#include "runtime/sparse/keyed_jagged_tensor.h"

#include <gtest/gtest.h>

#include "runtime/ops/factory.h"
#include "tests/testing/errors.h"

namespace mt::runtime::sparse {
namespace {

using testing::error_of;

// keys a, b; B = 3: a = [[1, 2], [], [3]], b = [[4], [5, 6, 7], []]; weights 0.1 * (i + 1).
KeyedJaggedTensor sample() {
  return KeyedJaggedTensor::from_lengths({"a", "b"}, {1, 2, 3, 4, 5, 6, 7}, {2, 0, 1, 1, 3, 0},
                                         {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f});
}

TEST(KeyedJaggedTensor, LayoutAndKeyViews) {
  const KeyedJaggedTensor kjt = sample();
  kjt.validate();
  EXPECT_EQ(kjt.stride(), 3);
  EXPECT_EQ(kjt.num_keys(), 2);
  EXPECT_EQ(kjt.offsets().to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 2, 3, 4, 7, 7}));
  EXPECT_EQ(kjt.length_per_key(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(kjt.offset_per_key(), (std::vector<int64_t>{0, 3, 7}));
  const JaggedTensor b = kjt["b"];
  EXPECT_EQ(b.values.to_vector<int64_t>(), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(b.lengths.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 0}));
  EXPECT_EQ(b.offsets.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 4, 4}));
  EXPECT_EQ(b.weights.to_vector<float>(), (std::vector<float>{0.4f, 0.5f, 0.6f, 0.7f}));
  EXPECT_EQ(kjt.key_index("a"), 0);
  EXPECT_NE(error_of([&] { kjt["zzz"]; }).find("no key 'zzz'"), std::string::npos);
}

TEST(KeyedJaggedTensor, FromOffsetsMatchesFromLengths) {
  const KeyedJaggedTensor a = sample();
  const KeyedJaggedTensor b = KeyedJaggedTensor::from_offsets(
      {"a", "b"}, a.values(),
      from_vector<int64_t>({0, 2, 2, 3, 4, 7, 7}, {7}, TensorOptions{}.with_dtype(DType::I32)));
  b.validate();
  EXPECT_EQ(b.lengths().to_vector<int64_t>(), a.lengths().to_vector<int64_t>());
  EXPECT_FALSE(b.has_weights());
}

TEST(KeyedJaggedTensor, ValidationErrors) {
  EXPECT_NE(error_of([] {
              KeyedJaggedTensor::from_lengths({"a", "b"}, {1, 2}, {1, -1, 2, 0}).validate();
            }).find("negative length -1 for key 'a', sample 1"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              KeyedJaggedTensor::from_lengths({"a"}, {1, 2, 3}, {1, 1}).validate();
            }).find("the lengths sum to 2 but there are 3 values"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              KeyedJaggedTensor::from_lengths({"a"}, {1, 2}, {1, 1}, {0.5f}).validate();
            }).find("1 weights for 2 values"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              KeyedJaggedTensor::from_lengths({"a", "b"}, {1, 2}, {1, 1, 0});
            }).find("not a multiple of the 2 keys"),
            std::string::npos);
  const KeyedJaggedTensor kjt = sample();
  kjt.validate_ids("a", 4, "t_a");
  EXPECT_NE(error_of([&] {
              kjt.validate_ids("b", 7, "t_b");
            }).find("id 7 of key 'b', sample 1 is outside [0, 7) of table 't_b'"),
            std::string::npos);
  const KeyedJaggedTensor neg = KeyedJaggedTensor::from_lengths({"a"}, {-3}, {1});
  EXPECT_NE(error_of([&] { neg.validate_ids("a", 10); }).find("id -3"), std::string::npos);
}

TEST(KeyedJaggedTensor, EmptyBatchAndEmptyKeysAreValid) {
  const KeyedJaggedTensor empty_batch = KeyedJaggedTensor::from_lengths(
      {"a", "b"}, std::vector<int64_t>{}, std::vector<int64_t>{}, std::vector<float>{}, 0);
  empty_batch.validate();
  EXPECT_EQ(empty_batch.stride(), 0);
  EXPECT_EQ(empty_batch.offsets().to_vector<int64_t>(), (std::vector<int64_t>{0}));
  EXPECT_EQ(empty_batch["b"].values.numel(), 0);
  const KeyedJaggedTensor no_ids = KeyedJaggedTensor::from_lengths({"a", "b"}, {9}, {0, 0, 1, 0});
  no_ids.validate();
  EXPECT_EQ(no_ids["a"].values.numel(), 0);
  EXPECT_EQ(no_ids.split({1, 1})[0].num_values(), 0);
  EXPECT_EQ(no_ids.split({0, 2})[0].num_keys(), 0);
}

TEST(KeyedJaggedTensor, SplitAndPermute) {
  const KeyedJaggedTensor kjt = KeyedJaggedTensor::from_lengths(
      {"a", "b", "c"}, {1, 2, 3, 4, 5, 6}, {2, 0, 1, 1, 0, 2}, {1, 2, 3, 4, 5, 6});
  const std::vector<KeyedJaggedTensor> parts = kjt.split({1, 2});
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].keys(), (std::vector<std::string>{"a"}));
  EXPECT_EQ(parts[0].values().to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(parts[1].keys(), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(parts[1].values().to_vector<int64_t>(), (std::vector<int64_t>{3, 4, 5, 6}));
  EXPECT_EQ(parts[1].lengths().to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0, 2}));
  EXPECT_EQ(parts[1].weights().to_vector<float>(), (std::vector<float>{3, 4, 5, 6}));
  EXPECT_EQ(parts[1].stride(), 2);

  const KeyedJaggedTensor p = kjt.permute({2, 0, 2});
  p.validate();
  EXPECT_EQ(p.keys(), (std::vector<std::string>{"c", "a", "c"}));
  EXPECT_EQ(p.values().to_vector<int64_t>(), (std::vector<int64_t>{5, 6, 1, 2, 5, 6}));
  EXPECT_EQ(p.lengths().to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 2, 0, 0, 2}));
  EXPECT_EQ(p.weights().to_vector<float>(), (std::vector<float>{5, 6, 1, 2, 5, 6}));
  EXPECT_EQ(kjt.select_keys({"b"}).values().to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
  EXPECT_NE(error_of([&] {
              kjt.split({1, 1});
            }).find("sum to 2 but there are 3 keys"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kjt.permute({3}); }).find("key index 3 outside [0, 3)"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::runtime::sparse
