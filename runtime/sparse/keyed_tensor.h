// KeyedTensor: the pooled output of an EmbeddingBagCollection, as TorchRec lays it out: one dense
// [B, sum of dims] tensor whose columns hold the features one after another (feature k in
// columns [offset_per_key()[k], offset_per_key()[k + 1])), with the feature names and dims.
// operator[] returns one key's [B, dim] slice (a differentiable view of values).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::sparse {

struct KeyedTensor {
  std::vector<std::string> keys;
  std::vector<int64_t> length_per_key;  // the dim of each key
  Tensor values;                        // [B, sum(length_per_key)]

  std::vector<int64_t> offset_per_key() const;      // [K + 1]
  int64_t key_index(const std::string& key) const;  // throws naming the keys present
  Tensor operator[](const std::string& key) const;  // [B, dim] view
  Tensor key_values(int64_t k) const;
};

}  // namespace mt::runtime::sparse
