// EmbeddingCollection (TorchRec's): unpooled lookups, every id's row, for many tables in one
// batched kernel call. Parameters "embeddings.<table>.weight"; pooling and per-value weights are
// not used. Forward returns per feature a JaggedTensor whose values are the [n, dim] rows (in the
// KJT's value order) and whose lengths/offsets are the feature's (see table_collection.h for
// features, init, gradient modes and the fused optimizer).
#pragma once

#include <string>
#include <vector>

#include "runtime/sparse/table_collection.h"

namespace mt::runtime::sparse {

struct EmbeddingCollectionOutput {
  std::vector<std::string> keys;
  std::vector<JaggedTensor> per_key;  // values [n_k, dim_k] (views of `flat`)
  Tensor flat;                        // every row, feature after feature
  const JaggedTensor& operator[](const std::string& key) const;
};

class EmbeddingCollection : public TableCollection {
 public:
  explicit EmbeddingCollection(std::vector<EmbeddingConfig> tables, CollectionOptions options = {});
  EmbeddingCollectionOutput operator()(const KeyedJaggedTensor& features);
};

}  // namespace mt::runtime::sparse
