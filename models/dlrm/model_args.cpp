#include "models/dlrm/model_args.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "runtime/core/error.h"

namespace mt::models::dlrm {

const char* interaction_name(InteractionType type) {
  return type == InteractionType::Dot ? "dot" : "dcn";
}

InteractionType parse_interaction(const std::string& name) {
  if (name == "dot") return InteractionType::Dot;
  if (name == "dcn") return InteractionType::Dcn;
  MT_FAIL("dlrm: unknown interaction '", name, "' (expected \"dot\" or \"dcn\")");
}

int64_t ModelArgs::interaction_dim() const {
  const int64_t f = num_features();
  if (interaction == InteractionType::Dot) return embedding_dim + (f + 1) * f / 2;
  return (f + 1) * embedding_dim;
}

std::vector<runtime::sparse::EmbeddingBagConfig> ModelArgs::table_configs() const {
  std::vector<runtime::sparse::EmbeddingBagConfig> out;
  for (const SparseFeature& f : features) {
    runtime::sparse::EmbeddingBagConfig c;
    c.name = "t_" + f.name;
    c.num_embeddings = f.num_embeddings;
    c.embedding_dim = embedding_dim;
    c.feature_names = {f.name};
    c.pooling = pooling;
    c.optimizer = table_optimizer;
    c.storage = f.storage;
    c.kv_cache = kv_cache;
    c.update = f.update;
    c.raw_ids = f.raw_ids;
    out.push_back(std::move(c));
  }
  return out;
}

void ModelArgs::validate() const {
  MT_CHECK(num_dense >= 1, "dlrm: num_dense must be >= 1, got ", num_dense);
  MT_CHECK(embedding_dim >= 1, "dlrm: embedding_dim must be >= 1, got ", embedding_dim);
  MT_CHECK(!features.empty(), "dlrm: features is empty (at least one sparse feature is needed)");
  std::set<std::string> names;
  for (size_t i = 0; i < features.size(); ++i) {
    MT_CHECK(!features[i].name.empty(), "dlrm: features[", i, "] has an empty name");
    MT_CHECK(names.insert(features[i].name).second, "dlrm: feature '", features[i].name,
             "' is listed twice");
    MT_CHECK(features[i].num_embeddings >= 1, "dlrm: feature '", features[i].name,
             "' has num_embeddings ", features[i].num_embeddings, " (must be >= 1)");
  }
  MT_CHECK(!bottom_mlp.empty(), "dlrm: bottom_mlp is empty (it must end in embedding_dim = ",
           embedding_dim, ")");
  MT_CHECK(bottom_mlp.back() == embedding_dim, "dlrm: bottom_mlp must end in embedding_dim = ",
           embedding_dim, " (the dense vector takes part in the interaction), got ", bottom_mlp);
  MT_CHECK(!top_mlp.empty() && top_mlp.back() == 1,
           "dlrm: top_mlp must end in 1 (one logit per sample), got ", top_mlp);
  for (int64_t w : bottom_mlp) MT_CHECK(w >= 1, "dlrm: bottom_mlp widths must be >= 1, got ", bottom_mlp);
  for (int64_t w : top_mlp) MT_CHECK(w >= 1, "dlrm: top_mlp widths must be >= 1, got ", top_mlp);
  if (interaction == InteractionType::Dcn) {
    MT_CHECK(dcn_num_layers >= 1, "dlrm: dcn_num_layers must be >= 1 with the dcn interaction, got ",
             dcn_num_layers);
    MT_CHECK(dcn_low_rank >= 0, "dlrm: dcn_low_rank must be >= 0 (0 = full rank), got ",
             dcn_low_rank);
  }
  MT_CHECK(table_optimizer.lr >= 0.0, "dlrm: table_optimizer.lr must be >= 0, got ",
           table_optimizer.lr);
}

std::vector<std::string> flavor_names() { return {"movielens_small", "criteo_small"}; }

ModelArgs flavor_args(const std::string& flavor) {
  ModelArgs a;
  if (flavor == "movielens_small") {
    a.num_dense = 4;
    a.features = {{"user_id", 943}, {"item_id", 1682}, {"genres", 19},
                  {"age_bucket", 7}, {"gender", 2},     {"occupation", 21}};
    a.embedding_dim = 16;
    a.bottom_mlp = {32, 16};
    a.top_mlp = {64, 32, 1};
    a.table_optimizer.lr = 0.05;
    return a;
  }
  if (flavor == "criteo_small") {
    // criteo_table_sizes(10000) of data/recsys/synthetic.h (models do not depend on data/).
    static const double rel[26] = {1.0,   0.6,   0.3,   0.2,   0.1,  0.05, 0.03, 0.02,  0.01,
                                   0.008, 0.005, 0.003, 0.002, 0.001, 5e-4, 3e-4, 2e-4,  1e-4,
                                   5e-5,  3e-5,  1e-5,  5e-6,  3e-6,  2e-6, 1e-6, 5e-7};
    a.num_dense = 13;
    for (int i = 0; i < 26; ++i) {
      a.features.push_back({"cat_" + std::to_string(i),
                            std::max<int64_t>(4, int64_t(std::llround(rel[i] * 10000.0)))});
    }
    a.embedding_dim = 16;
    a.bottom_mlp = {64, 32, 16};
    a.top_mlp = {128, 64, 1};
    return a;
  }
  std::string names;
  for (const auto& n : flavor_names()) names += (names.empty() ? "" : ", ") + n;
  MT_FAIL("dlrm: unknown flavor '", flavor, "' (valid: ", names, ")");
}

}  // namespace mt::models::dlrm
