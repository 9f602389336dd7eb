// SparseArch: adopting a collection's tables, and the unsharded implementation.
#include "models/dlrm/sparse_arch.h"

#include "runtime/core/error.h"

namespace mt::models::dlrm {

namespace rt = mt::runtime;

void SparseArch::adopt_tables(rt::nn::Module& collection) {
  for (const auto& [name, child] : collection.named_children()) {
    if (name == "embedding_bags") {
      register_module(name, child);
      return;
    }
  }
  MT_FAIL(type_name(), ": the collection (", collection.type_name(),
          ") has no 'embedding_bags' child to adopt");
}

void SparseArch::sync_mode(rt::nn::Module& collection) const {
  if (collection.is_training() != is_training()) collection.train(is_training());
}

EmbeddingBagSparseArch::EmbeddingBagSparseArch(
    std::shared_ptr<rt::sparse::EmbeddingBagCollection> collection)
    : SparseArch("EmbeddingBagSparseArch"), collection_(std::move(collection)) {
  MT_CHECK(collection_ != nullptr, "EmbeddingBagSparseArch: the collection is null");
  adopt_tables(*collection_);
}

rt::sparse::KeyedTensor EmbeddingBagSparseArch::operator()(
    const rt::sparse::KeyedJaggedTensor& features) {
  sync_mode(*collection_);
  return (*collection_)(features);
}

}  // namespace mt::models::dlrm
