#include "runtime/sparse/embedding_bag_collection.h"

namespace mt::runtime::sparse {

EmbeddingBagCollection::EmbeddingBagCollection(std::vector<EmbeddingBagConfig> tables,
                                               CollectionOptions options)
    : TableCollection("EmbeddingBagCollection", "embedding_bags", "EmbeddingBag", std::move(tables),
                      options) {
  for (int64_t t : layout().feature_table) dims_.push_back(table_configs()[t].shard.num_cols);
}

KeyedTensor EmbeddingBagCollection::operator()(const KeyedJaggedTensor& features) {
  const KeyedJaggedTensor kjt = arrange(features);
  MT_CHECK(!is_weighted() || kjt.has_weights(),
           "EmbeddingBagCollection: is_weighted is set but the input has no weights");
  const Tensor out =
      embedding_bags_batched(weights(), kjt.values(), kjt.offsets(), kjt.stride(), layout(),
                             is_weighted() ? kjt.weights() : Tensor(), make_sink());
  return KeyedTensor{feature_names(), dims_, out};
}

}  // namespace mt::runtime::sparse
