#include "runtime/nn/embedding.h"

#include "runtime/ops/embedding.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions options)
    : Module("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  MT_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: expected positive sizes, got ",
           num_embeddings, " x ", embedding_dim);
  MT_CHECK(is_floating(options.dtype), "Embedding: expected a floating dtype, got ", options.dtype);
  weight = empty({num_embeddings, embedding_dim}, options.with_requires_grad(false));
  register_parameter("weight", weight);
  reset_parameters(InitContext{});
}

void Embedding::reset_parameters(const InitContext& ctx) {
  init_normal_(weight, ctx.key("weight"), 0.0, 1.0);
}

Tensor Embedding::operator()(const Tensor& ids) {
  return call({ids}, [this](const std::vector<Tensor>& in) { return embedding(weight, in[0]); });
}

}  // namespace mt::runtime::nn
