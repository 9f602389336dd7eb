#include "train/pipeline_setup.h"

#include <sstream>

#include "data/tokenizer/bpe_tokenizer.h"
#include "runtime/core/error.h"
#include "train/model_spec.h"

namespace mt::train {

namespace pp = parallel::pipeline;

PipelinePlan plan_pipeline(const config::JobConfig& job, const config::WorldLayout& layout,
                           const models::ModelSpec& spec) {
  const auto& p = job.parallelism;
  MT_CHECK(spec.build_stage && spec.num_layers && spec.stage_forward && spec.hidden_shape,
           "train: model ", spec.name, " cannot be split into pipeline stages yet; set "
           "parallelism.pipeline_parallel_degree = 1");
  const pp::ScheduleKind kind = pp::parse_schedule_kind(p.pipeline_parallel_schedule);
  const int64_t n_layers = spec.num_layers();
  int64_t num_stages = 0;
  if (p.pipeline_parallel_layers_per_stage > 0) {
    MT_CHECK(n_layers % p.pipeline_parallel_layers_per_stage == 0, "train: the model's ",
             n_layers, " layers do not split into stages of "
             "parallelism.pipeline_parallel_layers_per_stage = ",
             p.pipeline_parallel_layers_per_stage, " layers");
    num_stages = n_layers / p.pipeline_parallel_layers_per_stage;
  } else if (!p.pipeline_parallel_split_points.empty()) {
    num_stages = int64_t(p.pipeline_parallel_split_points.size()) + 1;
  } else {
    const int64_t v = p.pipeline_parallel_stages_per_rank > 0 ? p.pipeline_parallel_stages_per_rank
                      : pp::is_interleaved(kind)              ? 2
                                                              : 1;
    num_stages = layout.pp * v;
  }
  MT_CHECK(num_stages % layout.pp == 0, "train: ", num_stages, " pipeline stages (from ",
           p.pipeline_parallel_layers_per_stage > 0 ? "pipeline_parallel_layers_per_stage"
                                                    : "pipeline_parallel_split_points",
           ") do not divide over parallelism.pipeline_parallel_degree = ", layout.pp,
           " ranks: each rank holds the same number of stages");
  const int64_t v = num_stages / layout.pp;
  MT_CHECK(p.pipeline_parallel_stages_per_rank < 0 || p.pipeline_parallel_stages_per_rank == v,
           "train: parallelism.pipeline_parallel_stages_per_rank = ",
           p.pipeline_parallel_stages_per_rank, " but the stage settings make ", num_stages,
           " stages over pp = ", layout.pp, " (", v, " per rank)");
  PipelinePlan plan;
  plan.stages = pp::stage_layer_ranges(n_layers, num_stages, p.pipeline_parallel_layers_per_stage,
                                       p.pipeline_parallel_split_points);
  try {
    plan.schedule = pp::make_schedule(kind, layout.pp, v, layout.microbatches);
  } catch (const Error& e) {
    MT_FAIL("train: the pipeline cannot run: ", e.what(), " (", layout.microbatches,
            " micro-batches = training.local_batch_size ", job.training.local_batch_size,
            " / parallelism.pipeline_parallel_microbatch_size ",
            p.pipeline_parallel_microbatch_size, "; pp ", layout.pp, ", ", v,
            " stage(s) per rank)");
  }
  return plan;
}

std::string describe_pipeline_schedule(const config::JobConfig& job) {
  const auto& p = job.parallelism;
  MT_CHECK(p.pipeline_parallel_degree > 1, "train --print-pipeline-schedule: "
           "parallelism.pipeline_parallel_degree is 1: there is no pipeline");
  const int64_t other = p.data_parallel_replicate_degree * p.context_parallel_degree *
                        p.tensor_parallel_degree *
                        (p.data_parallel_shard_degree > 0 ? p.data_parallel_shard_degree : 1);
  const config::WorldLayout layout =
      config::validate_for_world(job, p.pipeline_parallel_degree * other);
  std::optional<int64_t> vocab;
  if (!job.model.tokenizer_path.empty())
    vocab = data::BpeTokenizer::from_file(job.model.tokenizer_path).vocab_size();
  const models::ModelSpec spec = model_spec_for(job, vocab, architecture_to_load(job));
  const PipelinePlan plan = plan_pipeline(job, layout, spec);
  std::ostringstream os;
  os << pp::render_schedule(plan.schedule);
  os << "stages (" << spec.name << " " << spec.flavor << ", " << spec.num_layers()
     << " layers):\n";
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    os << "  stage " << s << " on pp rank " << pp::stage_rank(int64_t(s), layout.pp)
       << ": layers " << plan.stages[s].begin << ".." << plan.stages[s].end - 1
       << (s == 0 ? " + embeddings" : "")
       << (s + 1 == plan.stages.size() ? " + final norm, output and loss" : "") << "\n";
  }
  return os.str();
}

}  // namespace mt::train
