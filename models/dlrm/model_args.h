// Hyper-parameters of DLRM (models/dlrm; Naumov et al. 2019, TorchRec's DLRM and DLRM_DCN), the
// named flavors, and validation with errors naming the field.
//
//   dense [B, num_dense] -> bottom MLP (Linear + ReLU each) -> x [B, d]   (d = embedding_dim)
//   sparse KJT -> EmbeddingBagCollection, one table "t_<feature>" per feature, dim d -> e_f [B, d]
//   interaction:
//     Dot  pairwise dot products of {x, e_1..e_F} (upper triangle, no diagonal), concatenated
//          after x: [B, d + (F + 1) F / 2]                                  (TorchRec's DLRM)
//     Dcn  DCN-v2 cross layers over cat(x, e_1..e_F) [B, (F + 1) d]:
//          x_{l+1} = x_0 * (W_l x_l + b_l) + x_l, W_l full or low rank U_l V_l  (DLRM_DCN)
//   -> top MLP (Linear + ReLU, the last Linear without) -> one logit per sample [B].
// bottom_mlp lists the layer widths and must end in embedding_dim; top_mlp must end in 1.
//
// Flavors (tables sized for the datasets of data/recsys; feature names are their KJT keys):
//   movielens_small  4 dense, 6 features (user_id 943, item_id 1682, genres 19 multi-hot,
//                    age_bucket 7, gender 2, occupation 21), d = 16, bottom [32, 16], top [64, 32, 1]
//   criteo_small     13 dense, 26 features cat_0..cat_25 sized criteo_table_sizes(10000)
//                    (data/recsys/synthetic.h), d = 16, bottom [64, 32, 16], top [128, 64, 1]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/sparse/embedding_config.h"
#include "runtime/sparse/table_collection.h"

namespace mt::models::dlrm {

struct SparseFeature {
  std::string name;            // the KJT key
  int64_t num_embeddings = 0;  // rows of its table "t_<name>"
  runtime::sparse::TableStorage storage = runtime::sparse::TableStorage::Memory;
  runtime::sparse::TableUpdate update = runtime::sparse::TableUpdate::Train;
  bool raw_ids = false;  // kv tables only: rows keyed by the raw ids (EmbeddingBagConfig::raw_ids)
};

enum class InteractionType { Dot, Dcn };
const char* interaction_name(InteractionType type);               // "dot", "dcn"
InteractionType parse_interaction(const std::string& name);       // throws listing the names

struct ModelArgs {
  int64_t num_dense = 13;
  std::vector<SparseFeature> features;
  int64_t embedding_dim = 16;
  std::vector<int64_t> bottom_mlp = {64, 16};      // last == embedding_dim
  std::vector<int64_t> top_mlp = {64, 32, 1};      // last == 1
  InteractionType interaction = InteractionType::Dot;
  int64_t dcn_num_layers = 3;  // Dcn only
  int64_t dcn_low_rank = 0;    // Dcn only: 0 = full [D, D] weights, else rank r (U [D, r], V [r, D])
  runtime::PoolingMode pooling = runtime::PoolingMode::Sum;
  // The tables' fused optimizer (runtime/sparse/embedding_config.h) and gradient mode.
  runtime::sparse::EmbeddingOptimizerConfig table_optimizer;
  runtime::sparse::GradientMode gradient_mode = runtime::sparse::GradientMode::Fused;
  // Where kv-backed tables (SparseFeature::storage) keep their rows, and their caches' size.
  runtime::sparse::KvSettings kv;
  runtime::sparse::KvCacheSize kv_cache;

  int64_t num_features() const { return int64_t(features.size()); }
  // Width of the interaction output (the top MLP's input).
  int64_t interaction_dim() const;
  // The EmbeddingBagCollection's table configs ("t_<feature>", dim embedding_dim).
  std::vector<runtime::sparse::EmbeddingBagConfig> table_configs() const;
  // Throws mt::Error naming the first invalid field.
  void validate() const;
};

std::vector<std::string> flavor_names();
// Throws mt::Error listing the valid names when `flavor` is unknown.
ModelArgs flavor_args(const std::string& flavor);

}  // namespace mt::models::dlrm
