#include "models/dlrm/interaction.h"

#include "runtime/core/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "runtime/ops/join.h"
#include "runtime/ops/matmul.h"

namespace mt::models::dlrm {

namespace rt = mt::runtime;

std::vector<std::pair<int64_t, int64_t>> interaction_pairs(int64_t num_vectors) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t i = 0; i < num_vectors; ++i) {
    for (int64_t j = i + 1; j < num_vectors; ++j) pairs.emplace_back(i, j);
  }
  return pairs;
}

Tensor dot_interaction(const Tensor& dense, const Tensor& embeddings, int64_t num_features) {
  MT_CHECK(dense.dim() == 2, "dot_interaction: dense must be [B, d], got shape ", dense.shape());
  const int64_t b = dense.size(0), d = dense.size(1);
  MT_CHECK(num_features >= 0 && embeddings.dim() == 2 && embeddings.size(0) == b &&
               embeddings.size(1) == num_features * d,
           "dot_interaction: embeddings must be [B, F * d] = [", b, ", ", num_features * d,
           "] for ", num_features, " features of dim ", d, ", got shape ", embeddings.shape());
  MT_CHECK(dense.dtype() == embeddings.dtype(), "dot_interaction: dense is ", dense.dtype(),
           " but embeddings ", embeddings.dtype());
  const int64_t n = num_features + 1;
  // v [B, n, d]: the dense vector then the embeddings.
  const Tensor v = rt::cat({dense.unsqueeze(1), embeddings.reshape({b, num_features, d})}, 1);
  const Tensor z = rt::matmul(v, v, false, true).reshape({b, n * n});  // [B, n * n]
  std::vector<int64_t> idx;
  for (auto [i, j] : interaction_pairs(n)) idx.push_back(i * n + j);
  if (idx.empty()) return dense;
  const Tensor index = rt::from_vector<int64_t>(
      idx, {int64_t(idx.size())},
      rt::TensorOptions{}.with_dtype(rt::DType::I64).with_device(z.device()));
  return rt::cat({dense, rt::index_select(z, 1, index)}, 1);
}

CrossNet::Layer::Layer(int64_t dim, int64_t low_rank) : Module("CrossLayer") {
  if (low_rank == 0) {
    w = register_module("w", std::make_shared<runtime::nn::Linear>(dim, dim, true));
  } else {
    v = register_module("v", std::make_shared<runtime::nn::Linear>(dim, low_rank, false));
    u = register_module("u", std::make_shared<runtime::nn::Linear>(low_rank, dim, true));
  }
}

CrossNet::CrossNet(int64_t dim, int64_t num_layers, int64_t low_rank)
    : Module("CrossNet"), dim_(dim) {
  MT_CHECK(dim >= 1 && num_layers >= 1 && low_rank >= 0, "CrossNet: expected dim >= 1, ",
           "num_layers >= 1 and low_rank >= 0, got ", dim, ", ", num_layers, ", ", low_rank);
  auto list = register_module("layers", std::make_shared<runtime::nn::ModuleList>());
  for (int64_t l = 0; l < num_layers; ++l) {
    layers_.push_back(list->push_back(std::make_shared<Layer>(dim, low_rank)));
  }
}

Tensor CrossNet::operator()(const Tensor& x0) {
  MT_CHECK(x0.dim() == 2 && x0.size(1) == dim_, "CrossNet: expected input [B, ", dim_,
           "], got shape ", x0.shape());
  return call({x0}, [this](const std::vector<Tensor>& in) {
    const Tensor& base = in[0];
    Tensor x = base;
    for (const auto& layer : layers_) {
      const Tensor wx = layer->w ? (*layer->w)(x) : (*layer->u)((*layer->v)(x));
      x = rt::add(rt::mul(base, wx), x);
    }
    return x;
  });
}

}  // namespace mt::models::dlrm
