#include "runtime/sparse/embedding_collection.h"

namespace mt::runtime::sparse {

const JaggedTensor& EmbeddingCollectionOutput::operator[](const std::string& key) const {
  for (size_t k = 0; k < keys.size(); ++k)
    if (keys[k] == key) return per_key[k];
  MT_FAIL("EmbeddingCollection output: no key '", key, "' (keys: ", keys, ")");
}

EmbeddingCollection::EmbeddingCollection(std::vector<EmbeddingConfig> tables,
                                         CollectionOptions options)
    : TableCollection("EmbeddingCollection", "embeddings", "Embedding", std::move(tables),
                      options) {
  MT_CHECK(!options.is_weighted, "EmbeddingCollection: per-value weights are not supported");
}

EmbeddingCollectionOutput EmbeddingCollection::operator()(const KeyedJaggedTensor& features) {
  const KeyedJaggedTensor kjt = arrange(features);
  EmbeddingCollectionOutput out;
  out.keys = feature_names();
  out.flat = embedding_lookup_batched(weights(), kjt.values(), kjt.offsets(), kjt.stride(),
                                      layout(), make_sink());
  int64_t start = 0;
  for (int64_t k = 0; k < kjt.num_keys(); ++k) {
    JaggedTensor jt = kjt.key_view(k);
    const int64_t n = jt.values.numel();
    const int64_t dim = table_configs()[layout().feature_table[k]].shard.num_cols;
    jt.values = out.flat.narrow(0, start, n * dim).view({n, dim});
    jt.weights = Tensor();
    start += n * dim;
    out.per_key.push_back(std::move(jt));
  }
  return out;
}

}  // namespace mt::runtime::sparse
