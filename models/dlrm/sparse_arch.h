// SparseArch: DLRM's sparse part (the embedding tables) behind one interface, so a Dlrm can hold
// the plain runtime::sparse::EmbeddingBagCollection (EmbeddingBagSparseArch, what the Dlrm
// constructor builds) or a sharded collection (models/dlrm/parallelize.h's ShardedSparseArch,
// set by parallelize_dlrm through Dlrm::set_sparse_arch).
//
// FQNs: a SparseArch adopts its collection's "embedding_bags" container as its own child, so its
// parameters are "embedding_bags.<table>.weight" (TorchRec's names, the same sharded or not) and
// the Dlrm's are "sparse_arch.embedding_bags.t_<feature>.weight". init_weights on the Dlrm draws
// the tables from (seed, those FQNs), so a shard holds the unsharded values.
//
// The wrapped collection itself is not a child (only its tables are): a SparseArch passes its
// train/eval mode on to the collection at every call.
#pragma once

#include <memory>
#include <string>

#include "runtime/nn/module.h"
#include "runtime/sparse/embedding_bag_collection.h"
#include "runtime/sparse/keyed_jagged_tensor.h"
#include "runtime/sparse/keyed_tensor.h"

namespace mt::models::dlrm {

class SparseArch : public runtime::nn::Module {
 public:
  // `features` holds B samples (every feature of the tables) -> KeyedTensor [B, F * d], the
  // features table by table (the tables' feature order).
  virtual runtime::sparse::KeyedTensor operator()(
      const runtime::sparse::KeyedJaggedTensor& features) = 0;

 protected:
  explicit SparseArch(std::string type_name) : Module(std::move(type_name)) {}
  // Registers `collection`'s child "embedding_bags" as this module's child of that name.
  void adopt_tables(runtime::nn::Module& collection);
  // Puts `collection` in this module's train/eval mode.
  void sync_mode(runtime::nn::Module& collection) const;
};

// The unsharded tables (one process, or every rank holding every table in full).
class EmbeddingBagSparseArch : public SparseArch {
 public:
  explicit EmbeddingBagSparseArch(
      std::shared_ptr<runtime::sparse::EmbeddingBagCollection> collection);
  runtime::sparse::KeyedTensor operator()(
      const runtime::sparse::KeyedJaggedTensor& features) override;
  runtime::sparse::EmbeddingBagCollection& collection() const { return *collection_; }

 private:
  std::shared_ptr<runtime::sparse::EmbeddingBagCollection> collection_;
};

}  // namespace mt::models::dlrm
