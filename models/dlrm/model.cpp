#include "models/dlrm/model.h"

#include "runtime/core/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/join.h"

namespace mt::models::dlrm {

namespace rt = mt::runtime;

Mlp::Mlp(int64_t in_features, const std::vector<int64_t>& widths, bool relu_last)
    : Module("Mlp"), relu_last_(relu_last) {
  int64_t in = in_features;
  for (size_t i = 0; i < widths.size(); ++i) {
    layers_.push_back(register_module(std::to_string(i),
                                      std::make_shared<rt::nn::Linear>(in, widths[i], true)));
    in = widths[i];
  }
}

Tensor Mlp::operator()(const Tensor& x) {
  return call({x}, [this](const std::vector<Tensor>& in) {
    Tensor h = in[0];
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = (*layers_[i])(h);
      if (relu_last_ || i + 1 < layers_.size()) h = rt::relu(h);
    }
    return h;
  });
}

Dlrm::Dlrm(ModelArgs args) : Module("Dlrm"), args_(std::move(args)) {
  args_.validate();
  bottom_mlp = register_module("bottom_mlp",
                               std::make_shared<Mlp>(args_.num_dense, args_.bottom_mlp, true));
  sparse_arch_ = register_module(
      "sparse_arch",
      std::static_pointer_cast<SparseArch>(std::make_shared<EmbeddingBagSparseArch>(
          std::make_shared<rt::sparse::EmbeddingBagCollection>(
              args_.table_configs(),
              rt::sparse::CollectionOptions{.gradient_mode = args_.gradient_mode,
                                            .kv = args_.kv}))));
  const int64_t inter = args_.interaction_dim();
  if (args_.interaction == InteractionType::Dcn) {
    cross_net = register_module(
        "cross_net", std::make_shared<CrossNet>(inter, args_.dcn_num_layers, args_.dcn_low_rank));
  }
  top_mlp = register_module("top_mlp", std::make_shared<Mlp>(inter, args_.top_mlp, false));
}

Tensor Dlrm::operator()(const Tensor& dense, const rt::sparse::KeyedJaggedTensor& sparse) {
  MT_CHECK(dense.dim() == 2 && dense.size(1) == args_.num_dense, "Dlrm: dense features must be [B, ",
           args_.num_dense, "], got shape ", dense.shape());
  MT_CHECK(sparse.stride() == dense.size(0), "Dlrm: the sparse features hold ", sparse.stride(),
           " samples but the dense features ", dense.size(0));
  const Tensor x = (*bottom_mlp)(dense.to(device(), /*non_blocking=*/true));  // [B, d]
  const rt::sparse::KeyedTensor emb = (*sparse_arch_)(sparse);  // [B, F * d]
  Tensor features;
  if (args_.interaction == InteractionType::Dot) {
    features = dot_interaction(x, emb.values, args_.num_features());
  } else {
    features = (*cross_net)(rt::cat({x, emb.values}, 1));
  }
  return (*top_mlp)(features).reshape({dense.size(0)});
}

void Dlrm::set_sparse_arch(std::shared_ptr<SparseArch> arch) {
  MT_CHECK(arch != nullptr, "Dlrm::set_sparse_arch: the sparse arch is null");
  // A rank may hold no shard of some tables: the names present must be the model's.
  for (const auto& [name, t] : arch->named_parameters()) {
    bool known = false;
    for (const auto& table : args_.table_configs()) {
      known = known || name == "embedding_bags." + table.name + ".weight";
    }
    MT_CHECK(known, "Dlrm::set_sparse_arch: parameter '", name,
             "' is not one of the model's tables (expected embedding_bags.t_<feature>.weight)");
  }
  arch->train(is_training());
  sparse_arch_ = arch;
  replace_module("sparse_arch", std::move(arch));
}

rt::Device Dlrm::device() const {
  const auto params = bottom_mlp->parameters();
  return params.empty() ? rt::Device::cpu() : params.front().device();
}

std::vector<std::pair<std::string, Tensor>> Dlrm::dense_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : named_parameters()) {
    if (name.rfind("sparse_arch.", 0) != 0) out.emplace_back(name, t);
  }
  return out;
}

}  // namespace mt::models::dlrm
