// DLRM (Naumov et al. 2019, as TorchRec builds it; the architecture and flavors are described in
// models/dlrm/model_args.h): bottom MLP over the dense features, an EmbeddingBagCollection over
// the sparse ones (runtime/sparse), a dot or DCN-v2 interaction (models/dlrm/interaction.h) and a
// top MLP giving one logit per sample. Loss and AUC: models/dlrm/metrics.h.
//
// Parameters (FQNs): "bottom_mlp.<i>.weight/bias", "sparse_arch.embedding_bags.t_<feature>.weight",
// "cross_net.layers.<l>.{w,u,v}.*" (dcn only), "top_mlp.<i>.weight/bias". The constructor
// initialises with seed 0; init_weights(seed) redraws every parameter keyed by (seed, FQN), so
// the values do not depend on world size or sharding (tables: uniform +-sqrt(1/rows) like
// TorchRec; Linear layers: torch.nn.Linear's default).
// With GradientMode::Fused (the default), backward updates the touched table rows with the
// tables' optimizer (row-wise Adagrad unless configured) and the table weights are not among the
// parameters a dense optimizer should step: use dense_parameters() for that.
// The tables sit behind a SparseArch (models/dlrm/sparse_arch.h): the unsharded collection by
// default; parallelize_dlrm (models/dlrm/parallelize.h) swaps in sharded tables with
// set_sparse_arch, keeping the FQNs. The Mlp and CrossNet forwards run through Module::call, so
// hooks (FSDP's) fire around them.
//
//   auto model = std::make_shared<Dlrm>(flavor_args("movielens_small"));
//   model->init_weights(42);
//   Tensor logits = (*model)(batch.dense, batch.sparse);          // [B]
//   Tensor loss = bce_with_logits(logits, batch.labels);  loss.backward();
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/dlrm/interaction.h"
#include "models/dlrm/model_args.h"
#include "models/dlrm/sparse_arch.h"
#include "runtime/nn/linear.h"
#include "runtime/nn/module.h"
#include "runtime/sparse/embedding_bag_collection.h"

namespace mt::models::dlrm {

// Linear layers of the given widths, ReLU after each (after all but the last when !relu_last).
class Mlp : public runtime::nn::Module {
 public:
  Mlp(int64_t in_features, const std::vector<int64_t>& widths, bool relu_last);
  Tensor operator()(const Tensor& x);

 private:
  std::vector<std::shared_ptr<runtime::nn::Linear>> layers_;
  bool relu_last_;
};

class Dlrm : public runtime::nn::Module {
 public:
  explicit Dlrm(ModelArgs args);  // validates args

  // dense [B, num_dense] (the parameters' dtype; on the host or the model's device), sparse: a
  // host KJT holding every feature (B samples) -> logits [B], on the model's device.
  Tensor operator()(const Tensor& dense, const runtime::sparse::KeyedJaggedTensor& sparse);

  const ModelArgs& args() const { return args_; }
  SparseArch& sparse_arch() const { return *sparse_arch_; }
  // Replaces the tables (child "sparse_arch", FQNs kept). Its tables must be the model's
  // (args().table_configs()' names); the new arch is put in this model's train/eval mode.
  void set_sparse_arch(std::shared_ptr<SparseArch> arch);
  // Every parameter but the embedding tables (what a dense optimizer / FSDP handles), by FQN.
  // In GradientMode::Dense the tables need a dense optimizer too: use named_parameters().
  std::vector<std::pair<std::string, Tensor>> dense_parameters() const;
  // Where the model runs: its dense parameters' device (parallelize_dlrm puts the tables there).
  runtime::Device device() const;

  std::shared_ptr<Mlp> bottom_mlp, top_mlp;
  std::shared_ptr<CrossNet> cross_net;  // dcn only

 private:
  ModelArgs args_;
  std::shared_ptr<SparseArch> sparse_arch_;
};

}  // namespace mt::models::dlrm
