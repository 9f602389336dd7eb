#include "train/embedding_setup.h"

#include <algorithm>
#include <filesystem>

#include "runtime/core/error.h"

namespace mt::train {

namespace dlrm = models::dlrm;
using runtime::sparse::TableStorage;
using runtime::sparse::TableUpdate;

namespace {

// "<feature>:<mode>" entries of `key` -> (feature index, mode), the feature checked against args.
std::vector<std::pair<size_t, std::string>> parse_overrides(const config::JobConfig& config,
                                                            const std::string& key,
                                                            const std::vector<std::string>& entries,
                                                            const dlrm::ModelArgs& args) {
  std::vector<std::pair<size_t, std::string>> out;
  for (const std::string& e : entries) {
    const size_t colon = e.find(':');
    MT_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < e.size(), "train: ", key,
             " entry \"", e, "\" is not \"<feature>:<mode>\" (", config.where(key), ")");
    const std::string feature = e.substr(0, colon);
    size_t f = 0;
    while (f < args.features.size() && args.features[f].name != feature) ++f;
    std::string names;
    for (const auto& s : args.features) names += (names.empty() ? "" : ", ") + s.name;
    MT_CHECK(f < args.features.size(), "train: ", key, " names '", feature,
             "', not a sparse feature of this model (", names, "; ", config.where(key), ")");
    const bool again =
        std::any_of(out.begin(), out.end(), [f](const auto& o) { return o.first == f; });
    MT_CHECK(!again, "train: ", key, " names '", feature, "' twice: give each feature one mode (",
             config.where(key), ")");
    out.emplace_back(f, e.substr(colon + 1));
  }
  return out;
}

}  // namespace

void apply_table_settings(const config::JobConfig& config, dlrm::ModelArgs& args) {
  const auto& e = config.embedding;
  for (const auto& [key, names] : {std::pair{"embedding.raw_ids", &e.raw_ids},
                                   std::pair{"embedding.managed_collision", &e.managed_collision},
                                   std::pair{"embedding.lookup_only", &e.lookup_only}}) {
    for (size_t i = 0; i < names->size(); ++i) {
      MT_CHECK(std::find(names->begin(), names->begin() + long(i), (*names)[i]) ==
                   names->begin() + long(i),
               "train: ", key, " names '", (*names)[i], "' twice (", config.where(key), ")");
    }
  }
  for (auto& f : args.features) f.storage = runtime::sparse::parse_table_storage(e.storage);
  for (const auto& [f, mode] :
       parse_overrides(config, "embedding.storage_override", e.storage_override, args)) {
    MT_CHECK(mode == "memory" || mode == "kv", "train: embedding.storage_override gives '",
             args.features[f].name, "' the storage '", mode, "' (expected memory or kv; ",
             config.where("embedding.storage_override"), ")");
    args.features[f].storage = runtime::sparse::parse_table_storage(mode);
  }
  for (const auto& [f, mode] :
       parse_overrides(config, "embedding.update_override", e.update_override, args)) {
    MT_CHECK(mode == "train" || mode == "frozen", "train: embedding.update_override gives '",
             args.features[f].name, "' the update mode '", mode,
             "' (expected train or frozen; writeback takes its values from a custom step, not "
             "this trainer's loss; ",
             config.where("embedding.update_override"), ")");
    args.features[f].update = runtime::sparse::parse_table_update(mode);
  }
  for (const std::string& name : e.raw_ids) {
    size_t f = 0;
    while (f < args.features.size() && args.features[f].name != name) ++f;
    MT_CHECK(f < args.features.size(), "train: embedding.raw_ids names '", name,
             "', not a sparse feature of this model (", config.where("embedding.raw_ids"), ")");
    MT_CHECK(args.features[f].storage == TableStorage::Kv, "train: embedding.raw_ids names '",
             name, "', whose table is not kv-backed: raw ids need embedding.storage = \"kv\" ",
             "(or storage_override = [\"", name, ":kv\"]; ", config.where("embedding.raw_ids"),
             ")");
    MT_CHECK(std::find(e.managed_collision.begin(), e.managed_collision.end(), name) ==
                 e.managed_collision.end(),
             "train: '", name, "' is in both embedding.raw_ids and embedding.managed_collision: ",
             "a raw-id table keys rows by the ids themselves, with no remapping to bound (",
             config.where("embedding.raw_ids"), ")");
    args.features[f].raw_ids = true;
  }
  args.kv.path = e.kv_path.empty()
                     ? (std::filesystem::path(config.job.dump_folder) / "kv").string()
                     : e.kv_path;
  args.kv_cache.rows = e.cache_rows;
  args.kv_cache.fraction = e.cache_fraction;
  args.kv.policy = runtime::sparse::parse_cache_policy(e.cache_policy);
}

bool has_kv_tables(const dlrm::ModelArgs& args) {
  return std::any_of(args.features.begin(), args.features.end(),
                     [](const dlrm::SparseFeature& f) { return f.storage == TableStorage::Kv; });
}

std::vector<std::pair<std::string, double>> kv_step_metrics(const runtime::sparse::KvStats& now,
                                                            const runtime::sparse::KvStats& before,
                                                            int64_t steps) {
  const runtime::sparse::KvStats d = now - before;
  const double rows = double(d.rows_requested);
  const double hits = double(d.cache_hits + d.prefetch_hits);
  const double n = double(std::max<int64_t>(steps, 1));
  return {{"kv_hit", rows > 0 ? hits / rows : 1.0},
          {"kv_read_rows", double(d.store_reads) / n},
          {"kv_prefetch_rows", double(d.prefetch_hits) / n},
          {"kv_write_rows", double(d.rows_written) / n}};
}

}  // namespace mt::train
