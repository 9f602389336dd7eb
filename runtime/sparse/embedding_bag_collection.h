// EmbeddingBagCollection (TorchRec's): pooled lookups of many tables in one batched kernel call
// (runtime/ops/embedding_bag.h). Parameters "embedding_bags.<table>.weight". Forward takes a
// KeyedJaggedTensor and returns a KeyedTensor [B, sum of the features' dims], features table by
// table (see table_collection.h for features, init, gradient modes and the fused optimizer).
//
//   EmbeddingBagCollection ebc({{.name = "t_user", .num_embeddings = 1000, .embedding_dim = 16,
//                                .feature_names = {"user"}}, ...});
//   KeyedTensor out = ebc(kjt);   // out["user"] is [B, 16]
//   loss.backward();              // Fused mode: the touched rows are updated here
#pragma once

#include <vector>

#include "runtime/sparse/keyed_tensor.h"
#include "runtime/sparse/table_collection.h"

namespace mt::runtime::sparse {

class EmbeddingBagCollection : public TableCollection {
 public:
  explicit EmbeddingBagCollection(std::vector<EmbeddingBagConfig> tables,
                                  CollectionOptions options = {});
  KeyedTensor operator()(const KeyedJaggedTensor& features);
  // The output dim of each feature (local columns of its table), in output order.
  const std::vector<int64_t>& feature_dims() const { return dims_; }
  bool is_weighted() const { return options().is_weighted; }

 private:
  std::vector<int64_t> dims_;
};

}  // namespace mt::runtime::sparse
