// nn::Embedding: a [num_embeddings, embedding_dim] table looked up by integer ids (ops
// embedding()). Default initialisation: normal(0, 1) like torch.nn.Embedding, drawn from
// RandomKey(seed, "<fqn>.weight"); the constructor uses seed 0 (see nn/linear.h).
#pragma once

#include <cstdint>

#include "runtime/nn/module.h"

namespace mt::runtime::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions options = {});

  // ids (i32/i64) of any shape -> [ids..., embedding_dim].
  Tensor operator()(const Tensor& ids);
  void reset_parameters(const InitContext& ctx) override;

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }

  Tensor weight;  // [num_embeddings, embedding_dim]

 private:
  int64_t num_embeddings_, embedding_dim_;
};

}  // namespace mt::runtime::nn
