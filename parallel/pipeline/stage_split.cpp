#include "parallel/pipeline/stage_split.h"

#include <charconv>

#include "runtime/core/error.h"

namespace mt::parallel::pipeline {

namespace {

// "layers.N" -> N; anything else throws naming the point.
int64_t split_point_layer(const std::string& point, int64_t n_layers) {
  const std::string prefix = "layers.";
  int64_t layer = -1;
  const char* digits = point.data() + prefix.size();
  const char* end = point.data() + point.size();
  const bool named = point.rfind(prefix, 0) == 0 && digits != end &&
                     std::from_chars(digits, end, layer).ptr == end;
  MT_CHECK(named && layer > 0 && layer < n_layers, "pipeline: split point '", point,
           "' must be \"layers.N\" with 0 < N < ", n_layers, " (the model's layers): the first ",
           "block of a stage after the first");
  return layer;
}

}  // namespace

std::vector<LayerSplit> stage_layer_ranges(int64_t n_layers, int64_t num_stages,
                                           int64_t layers_per_stage,
                                           const std::vector<std::string>& split_points) {
  MT_CHECK(n_layers >= 1 && num_stages >= 1, "pipeline: ", n_layers, " layers and ", num_stages,
           " stages: both must be >= 1");
  MT_CHECK(num_stages <= n_layers, "pipeline: ", num_stages, " stages for a model of ", n_layers,
           " layers: each stage needs at least one block");
  std::vector<int64_t> starts;
  if (!split_points.empty()) {
    MT_CHECK(int64_t(split_points.size()) == num_stages - 1, "pipeline: ", split_points.size(),
             " split points make ", split_points.size() + 1, " stages, but the pipeline has ",
             num_stages, " (pipeline_parallel_degree x stages per rank)");
    starts.push_back(0);
    for (const std::string& p : split_points) {
      const int64_t layer = split_point_layer(p, n_layers);
      MT_CHECK(layer > starts.back(), "pipeline: split points must increase, got '", p,
               "' after layer ", starts.back());
      starts.push_back(layer);
    }
  } else {
    const int64_t per = layers_per_stage > 0 ? layers_per_stage : n_layers / num_stages;
    MT_CHECK(per * num_stages == n_layers, "pipeline: ", n_layers, " layers do not split into ",
             num_stages, " stages of ",
             layers_per_stage > 0 ? std::to_string(layers_per_stage) + " layers"
                                  : std::string("equal size"),
             "; choose pipeline_parallel_layers_per_stage (or stages) that divide ", n_layers,
             ", or give pipeline_parallel_split_points");
    for (int64_t s = 0; s < num_stages; ++s) starts.push_back(s * per);
  }
  std::vector<LayerSplit> ranges;
  for (size_t s = 0; s < starts.size(); ++s) {
    ranges.push_back({starts[s], s + 1 < starts.size() ? starts[s + 1] : n_layers});
  }
  return ranges;
}

namespace {

// A container for the children of one name found in several stages.
class MergedModule : public runtime::nn::Module {
 public:
  MergedModule() : Module("PipelineStages") {}
};

void merge_into(runtime::nn::Module& into, runtime::nn::Module& from) {
  for (const auto& [name, param] : from.named_parameters(/*recurse=*/false)) {
    MT_FAIL("pipeline: stage module ", from.type_name(), " holds parameter '", name,
            "' directly; only its submodules can be merged across stages");
  }
  for (const auto& [name, child] : from.named_children()) {
    std::shared_ptr<runtime::nn::Module> existing;
    for (const auto& [have, module] : into.named_children())
      if (have == name) existing = module;
    if (!existing) {
      into.register_module(name, child);
      continue;
    }
    // Both stages hold `name` (e.g. "layers"): a container of both's children.
    auto merged = std::dynamic_pointer_cast<MergedModule>(existing);
    MT_CHECK(merged != nullptr || existing->named_parameters(false).empty(),
             "pipeline: two stages both hold '", name, "' with parameters of its own");
    if (!merged) {
      merged = std::make_shared<MergedModule>();
      merge_into(*merged, *existing);
      into.replace_module(name, merged);
    }
    merge_into(*merged, *child);
  }
}

}  // namespace

std::shared_ptr<runtime::nn::Module> merge_stage_modules(
    const std::vector<std::shared_ptr<runtime::nn::Module>>& stages) {
  MT_CHECK(!stages.empty(), "pipeline: no stage modules to merge");
  if (stages.size() == 1) return stages.front();
  auto merged = std::make_shared<MergedModule>();
  for (const auto& stage : stages) merge_into(*merged, *stage);
  return merged;
}

}  // namespace mt::parallel::pipeline
