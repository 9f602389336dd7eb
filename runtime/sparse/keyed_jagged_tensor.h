// KeyedJaggedTensor (KJT): the sparse-feature batch of recommendation models, laid out as
// TorchRec lays it out.
//
// For K keys (feature names) and a batch of B samples (the "stride"):
//   values   i64 [N]        ids, key by key, and within a key sample by sample
//   lengths  i64 [K * B]    lengths[k * B + b] = number of ids of key k in sample b
//   offsets  i64 [K * B + 1] exclusive prefix sum of lengths (offsets[0] = 0, offsets[K*B] = N)
//   weights  f32 [N]        optional, one per value (per-sample weights of weighted pooling)
// so the ids of (key k, sample b) are values[offsets[k*B + b] .. offsets[k*B + b + 1]).
// Empty batches (B = 0) and keys or samples without ids are valid. All tensors live on the CPU
// (ids are read on the host to plan lookups and the all-to-alls of the sharded modules).
//
// Construction (from_lengths / from_offsets) checks dtypes and shapes; the contents (negative
// lengths, lengths not summing to the number of values, non-monotone offsets) are checked by
// validate(), and ids against a table's size by validate_ids(). Errors name the key and sample.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::sparse {

// The ids (and weights) of one key: a jagged [B, *] tensor.
struct JaggedTensor {
  Tensor values;   // i64 [n]
  Tensor lengths;  // i64 [B]
  Tensor offsets;  // i64 [B + 1], starting at 0
  Tensor weights;  // f32 [n] or undefined
};

class KeyedJaggedTensor {
 public:
  KeyedJaggedTensor() = default;

  // lengths: [K * B] (i32 or i64); values: [N] (i32 or i64, stored as i64); weights: [N]
  // floating (stored as f32) or undefined. stride = B; -1 infers lengths.numel() / K (with K = 0
  // keys, give the stride). Checks shapes and dtypes; call validate() for the contents.
  static KeyedJaggedTensor from_lengths(std::vector<std::string> keys, const Tensor& values,
                                        const Tensor& lengths, const Tensor& weights = Tensor(),
                                        int64_t stride = -1);
  // offsets: [K * B + 1] (i32 or i64), starting at 0.
  static KeyedJaggedTensor from_offsets(std::vector<std::string> keys, const Tensor& values,
                                        const Tensor& offsets, const Tensor& weights = Tensor(),
                                        int64_t stride = -1);
  // Host-vector convenience (tests, data loaders).
  static KeyedJaggedTensor from_lengths(std::vector<std::string> keys,
                                        const std::vector<int64_t>& values,
                                        const std::vector<int64_t>& lengths,
                                        const std::vector<float>& weights = {},
                                        int64_t stride = -1);

  const std::vector<std::string>& keys() const { return keys_; }
  int64_t num_keys() const { return int64_t(keys_.size()); }
  int64_t stride() const { return stride_; }  // batch size B
  const Tensor& values() const { return values_; }
  const Tensor& lengths() const { return lengths_; }
  const Tensor& offsets() const { return offsets_; }
  const Tensor& weights() const { return weights_; }  // undefined when unweighted
  bool has_weights() const { return weights_.defined(); }
  int64_t num_values() const { return values_.numel(); }

  // Index of `key` in keys(); throws naming the key and the keys present.
  int64_t key_index(const std::string& key) const;
  // Number of values per key [K], and their offsets into values() [K + 1].
  std::vector<int64_t> length_per_key() const;
  std::vector<int64_t> offset_per_key() const;

  // The ids of one key (views of values/weights; lengths is a view, offsets rebased to 0).
  JaggedTensor operator[](const std::string& key) const;
  JaggedTensor key_view(int64_t key) const;

  // Throws mt::Error naming the key and sample for: a negative length, offsets that do not start
  // at 0 or decrease, lengths that do not sum to values().numel(), a weights size mismatch.
  void validate() const;
  // Throws when an id of `key` is outside [0, num_rows) (naming key, sample, id and table).
  void validate_ids(const std::string& key, int64_t num_rows, const std::string& table = "") const;

  // Splits by consecutive key groups of the given sizes (summing to K): TorchRec's split().
  std::vector<KeyedJaggedTensor> split(const std::vector<int64_t>& segments) const;
  // A KJT whose key i is this one's key indices[i] (keys may repeat or be left out): TorchRec's
  // permute(). Values, lengths and weights move with their keys.
  KeyedJaggedTensor permute(const std::vector<int64_t>& indices) const;
  // permute() by key names.
  KeyedJaggedTensor select_keys(const std::vector<std::string>& keys) const;

 private:
  std::vector<std::string> keys_;
  int64_t stride_ = 0;
  Tensor values_, lengths_, offsets_, weights_;
};

std::ostream& operator<<(std::ostream& os, const KeyedJaggedTensor& kjt);

}  // namespace mt::runtime::sparse
