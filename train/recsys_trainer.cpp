// RecsysTrainer (see recsys_trainer.h).
#include "train/recsys_trainer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>

#include "checkpoint/distributed_checkpoint.h"
#include "data/recsys/dataset.h"
#include "models/dlrm/metrics.h"
#include "models/dlrm/model.h"
#include "models/dlrm/parallelize.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/nccl_process_group.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/embedding/row_stream.h"
#include "parallel/embedding/sharded_managed_collision.h"
#include "parallel/embedding/shared_log.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/core/allocator.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/lr_scheduler.h"
#include "runtime/optim/optimizer.h"
#include "train/checkpointer.h"
#include "train/config_agreement.h"
#include "train/launch_layout.h"
#include "train/config/render.h"
#include "train/config/validate.h"
#include "train/embedding_checkpoint.h"
#include "train/embedding_setup.h"
#include "train/metrics/eta.h"
#include "train/metrics/step_metrics.h"
#include "train/model_spec.h"
#include "train/optimizer_setup.h"
#include "train/run_scaffold.h"

namespace mt::train {

namespace fs = std::filesystem;
namespace dlrm = models::dlrm;
using runtime::Tensor;
using Clock = std::chrono::steady_clock;

namespace {

// The flavor's args with the dataset's tables and the [embedding] settings.
dlrm::ModelArgs model_args_for(const config::JobConfig& c, const data::recsys::RecsysDataset& d) {
  dlrm::ModelArgs args = dlrm::flavor_args(c.model.flavor);
  const auto names = d.sparse_feature_names();
  const auto sizes = d.table_sizes();
  MT_CHECK(names.size() == args.features.size(), "train: model.flavor ", c.model.flavor, " has ",
           args.features.size(), " sparse features but training.dataset ", c.training.dataset,
           " has ", names.size());
  for (size_t f = 0; f < names.size(); ++f) {
    MT_CHECK(names[f] == args.features[f].name, "train: sparse feature ", f, " of model.flavor ",
             c.model.flavor, " is '", args.features[f].name, "' but training.dataset ",
             c.training.dataset, " gives '", names[f], "'");
    args.features[f].num_embeddings = sizes[f];
  }
  MT_CHECK(d.num_dense() == args.num_dense, "train: model.flavor ", c.model.flavor, " takes ",
           args.num_dense, " dense features but training.dataset ", c.training.dataset, " has ",
           d.num_dense());
  const auto& e = c.embedding;
  args.table_optimizer.type = runtime::sparse::parse_optimizer(e.optimizer);
  args.table_optimizer.lr = e.lr;
  args.table_optimizer.eps = e.eps;
  args.table_optimizer.weight_decay = e.weight_decay;
  args.table_optimizer.beta1 = e.beta1;
  args.table_optimizer.beta2 = e.beta2;
  args.gradient_mode = e.gradient_mode == "row_sparse" ? runtime::sparse::GradientMode::RowSparse
                                                       : runtime::sparse::GradientMode::Fused;
  apply_table_settings(c, args);
  return args;
}

// The sharded tables in checkpoints: weights as "model.sparse_arch.embedding_bags.<table>.weight"
// (the model's FQNs), their row optimizer's state as "table_optimizer.state.<...>"
// (train/embedding_checkpoint.h: global rows, any plan and world size on load).
constexpr const char* kTablesPrefix = "sparse_arch.";
constexpr const char* kTableWeights = "model.sparse_arch.";
constexpr const char* kTableOptimizer = "table_optimizer.";

constexpr const char* kMappingPrefix = "model.managed_collision.";

// mc may be null (no managed features).
CheckpointExtension table_checkpoint_extension(parallel::ShardedEmbeddingBagCollection& tables,
                                               parallel::ShardedManagedCollisionCollection* mc) {
  auto plan = std::make_shared<EmbeddingLoadPlan>();
  auto mapping = std::make_shared<std::vector<runtime::sparse::McStatePiece>>();
  CheckpointExtension e;
  e.owns_parameter = [](const std::string& fqn) { return fqn.starts_with(kTablesPrefix); };
  e.add_pieces = [&tables, mc](checkpoint::CheckpointState& state, bool model_only) {
    checkpoint::CheckpointState mine;
    add_embedding_pieces(tables, kTableWeights, kTableOptimizer, mine);
    for (checkpoint::TensorPiece& p : mine.tensors)
      if (!model_only || p.fqn.starts_with(kTableWeights)) state.tensors.push_back(std::move(p));
    if (!model_only) {
      state.values.insert(mine.values.begin(), mine.values.end());
      add_kv_row_counts(tables, kTableOptimizer, state);
    }
    if (mc) add_mc_pieces(mc->state(), kMappingPrefix, state);
  };
  e.add_load_pieces = [&tables, mc, plan, mapping](
                          const checkpoint::Index& saved, checkpoint::CheckpointState& dest,
                          bool model_only, const std::vector<std::string>& exclude) {
    if (mc) *mapping = mc_load_pieces(mc->state(), kMappingPrefix, dest);
    checkpoint::CheckpointState wanted;
    *plan = embedding_load_template(tables, saved, kTableWeights, kTableOptimizer, wanted);
    auto skipped = [&](const std::string& name) {
      return checkpoint::is_excluded(name, exclude) ||
             (model_only && !name.starts_with(kTableWeights));
    };
    std::erase_if(plan->items, [&](const EmbeddingLoadPlan::Item& i) { return skipped(i.name); });
    for (checkpoint::TensorPiece& p : wanted.tensors)
      if (!skipped(p.fqn)) dest.tensors.push_back(std::move(p));
  };
  e.apply_loaded = [&tables, mc, plan, mapping](const checkpoint::CheckpointState& loaded) {
    apply_loaded_embeddings(tables, *plan, loaded);
    if (mc) mc->load_state(*mapping);
  };
  return e;
}

void check_recsys_config(const config::JobConfig& c) {
  MT_CHECK(c.training.mixed_precision_param == "float32", "train: model.name = \"dlrm\" trains in ",
           "float32; set training.mixed_precision_param = \"float32\" (it is \"",
           c.training.mixed_precision_param, "\", ", c.where("training.mixed_precision_param"),
           ")");
  MT_CHECK(c.training.global_batch_size == -1, "train: model.name = \"dlrm\" takes no gradient ",
           "accumulation; leave training.global_batch_size at -1 (",
           c.where("training.global_batch_size"), ")");
  MT_CHECK(c.parallelism.expert_parallel_degree == 1 &&
               c.parallelism.data_parallel_replicate_degree == 1 &&
               c.parallelism.tensor_parallel_degree == 1 &&
               c.parallelism.pipeline_parallel_degree == 1 &&
               c.parallelism.context_parallel_degree == 1,
           "train: model.name = \"dlrm\" shards its tables over every rank and FSDP-shards the "
           "dense layers over all of them (it has no tensor-parallel plan, pipeline stages or "
           "sequences); parallelism.expert_parallel_degree, data_parallel_replicate_degree, "
           "tensor_parallel_degree, pipeline_parallel_degree and context_parallel_degree must "
           "be 1");
  // DLRM's MLPs are narrow (Criteo's 13 dense features in, one logit out) and its time goes to
  // the tables: FP8 GEMMs would buy little there, so float8 is for the transformer models only.
  MT_CHECK(!c.float8.enable,
           "train: float8 training is built for the transformer models "
           "(llama3, deepseek_v3), not model.name = \"dlrm\", which trains in float32; set "
           "quantize.linear.float8.enable = false (it is true, ",
           c.where("quantize.linear.float8.enable"), ")");
  MT_CHECK(c.float8_grouped_mm.fqns.empty(),
           "train: model.name = \"dlrm\" has no MoE experts for float8 grouped GEMMs; set "
           "quantize.grouped_mm.float8.fqns = [] (",
           c.where("quantize.grouped_mm.float8.fqns"), ")");
  for (const auto& [key, value] : moe_balancing_overrides(c)) {
    MT_FAIL("train: ", key, " = ", value, " (", c.where(key), ") applies to MoE models ",
            "(deepseek_v3); model.name = \"dlrm\" has no routed experts");
  }
}

}  // namespace

std::vector<std::string> recsys_model_names() { return {"dlrm"}; }

bool is_recsys_model(const std::string& model_name) {
  const std::vector<std::string> names = recsys_model_names();
  return std::find(names.begin(), names.end(), model_name) != names.end();
}

namespace {

struct RecsysParamCounts {
  int64_t dense = 0, tables = 0;
};

RecsysParamCounts count_parameters(const dlrm::Dlrm& model) {
  RecsysParamCounts c;
  for (const auto& [name, p] : model.dense_parameters()) c.dense += p.numel();
  for (const auto& t : model.args().table_configs()) c.tables += t.num_embeddings * t.embedding_dim;
  return c;
}

}  // namespace

std::string describe_recsys_model(const config::JobConfig& job) {
  const dlrm::Dlrm model(dlrm::flavor_args(job.model.flavor));
  const RecsysParamCounts c = count_parameters(model);
  return "model dlrm " + job.model.flavor + ": " + std::to_string(c.dense) + " dense + " +
         std::to_string(c.tables) + " table parameters in " +
         std::to_string(model.args().num_features()) +
         " tables (the flavor's table sizes; training uses the dataset's)\n";
}

RecsysTrainer::RecsysTrainer(config::JobConfig config, TrainerOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  const auto& tc = config_.training;
  check_recsys_config(config_);
  parallel::set_collective_timeout(std::chrono::seconds(config_.comm.timeout_seconds));
  world_ = options_.world
               ? options_.world
               : std::shared_ptr<parallel::ProcessGroup>(parallel::MpiProcessGroup::world());
  if (rank() != 0) options_.write_files = false;
  check_same_config_on_every_rank(config_, *world_);
  config::validate_for_world(config_, world_size());
  const RankPlacement placement =
      place_ranks(*world_, tc.device, config_.where("training.device"));
  device_ = placement.device;
  placement_text_ = placement.text;
  if (rank() == 0) remove_incomplete_saves(config_, log());
  if (options_.write_files)
    config::write_config(config_, fs::path(config_.job.dump_folder) / "config.toml");

  data::recsys::RecsysDatasetOptions dopt;
  dopt.local_batch_size = tc.local_batch_size;
  dopt.seed = uint64_t(tc.seed);
  dopt.rank = rank();
  dopt.world_size = world_size();
  if (tc.dataset == "synthetic_criteo") {
    if (!tc.dataset_path.empty())
      log() << "note: training.dataset_path = \"" << tc.dataset_path << "\" ("
            << config_.where("training.dataset_path")
            << ") is not read: dataset synthetic_criteo generates its batches\n";
    const dlrm::ModelArgs flavor = dlrm::flavor_args(config_.model.flavor);
    dopt.num_dense = flavor.num_dense;
    for (const auto& f : flavor.features) dopt.table_sizes.push_back(f.num_embeddings);
  }
  data_ = data::recsys::make_recsys_dataset(tc.dataset, tc.dataset_path, dopt);

  std::any args = model_args_for(config_, *data_);
  if (options_.edit_model_args) options_.edit_model_args(args);
  model_ = std::make_shared<dlrm::Dlrm>(std::any_cast<dlrm::ModelArgs>(args));
  model_->init_weights(uint64_t(tc.seed));

  // Tables sharded over every rank (one rank: all of them table-wise on it, the same code path,
  // so checkpoints reshard between any world sizes); FSDP for the dense layers on > 1 rank.
  // On GPUs the ids are routed over the host world (MPI); the tables' outputs and FSDP go over
  // NCCL.
  dlrm::DlrmParallelOptions popt;
  popt.group = world_;
  popt.device = device_;
  if (world_size() > 1) {
    const std::shared_ptr<parallel::ProcessGroup> device_world =
        device_.is_cpu() ? world_
                         : std::shared_ptr<parallel::ProcessGroup>(
                               parallel::make_nccl_process_group(world_));
    popt.output_group = device_world;
    dp_mesh_ = parallel::DeviceMesh::create(device_world, {world_size()}, {"dp_shard"});
    popt.dp_mesh = dp_mesh_;
    // table_row_wise spreads a table's rows over the ranks of one node (and the planner picks it
    // for big tables on several nodes): the job's real nodes, or one node where they are
    // irregular (the same results, with more traffic).
    const int64_t per_node = placement.nodes.ranks_per_node > 0 ? placement.nodes.ranks_per_node
                                                                : world_size();
    popt.node_mesh = parallel::DeviceMesh::create(
        device_world, {world_size() / per_node, per_node}, {"node", "local"});
    popt.reshard_after_forward = config_.parallelism.fsdp_reshard_after_forward != "never";
  }
  popt.planner.memory_budget_bytes = config_.embedding.memory_budget_mb << 20;
  popt.planner.batch_size_per_rank = tc.local_batch_size;
  const std::string& sharding = config_.embedding.sharding;
  for (const auto& t : model_->args().table_configs()) {
    // Refused on any world size, so that a config tried on one rank fails there, not on many.
    MT_CHECK(t.storage != runtime::sparse::TableStorage::Kv || sharding != "data_parallel",
             "train: embedding.sharding = \"data_parallel\" (", config_.where("embedding.sharding"),
             ") cannot hold kv-backed tables (each replica would keep its own store); use another "
             "sharding or storage = \"memory\"");
  }
  if (sharding != "auto" && world_size() == 1) {
    log() << "note: embedding.sharding = \"" << sharding << "\" ("
          << config_.where("embedding.sharding")
          << ") takes effect on more than one rank; one rank holds every table whole\n";
  }
  if (sharding != "auto" && world_size() > 1) {
    const parallel::ShardingType type = parallel::parse_sharding_type(sharding);
    for (const auto& t : model_->args().table_configs())
      popt.planner.constraints[t.name].type = type;
  }
  for (const auto& t : model_->args().table_configs()) {
    if (t.storage != runtime::sparse::TableStorage::Kv) continue;
    popt.planner.constraints[t.name].allowed = {
        parallel::ShardingType::TableWise, parallel::ShardingType::ColumnWise,
        parallel::ShardingType::RowWise, parallel::ShardingType::TableRowWise};
  }
  const parallel::ShardingPlan plan = dlrm::parallelize_dlrm(*model_, popt);
  plan_text_ = plan.describe(model_->args().table_configs());

  setup_managed_collision();
  if (!config_.embedding.stream_to.empty()) {
    // Every rank streams the rows it owns; ranks other than 0 warn on stderr (their outages are
    // their own). Rank 0's warnings reach log() through stream_log_: the stream's thread must not
    // write the stream the training thread writes.
    if (!options_.quiet && rank() == 0) stream_log_ = std::make_unique<parallel::SharedLog>();
    std::ostream* warnings =
        options_.quiet ? nullptr : rank() == 0 ? stream_log_.get() : &std::cerr;
    parallel::StreamAddress address;
    try {
      address = parallel::parse_stream_address(config_.embedding.stream_to);
    } catch (const Error& e) {
      MT_FAIL("train: embedding.stream_to (", config_.where("embedding.stream_to"), "): ",
              e.what());
    }
    stream_ = std::make_unique<parallel::RowStreamClient>(
        address,
        config_.embedding.stream_queue_mb << 20, config_.embedding.stream_state, warnings);
    tables().set_row_update_listener(stream_->listener(), config_.embedding.stream_state);
  }
  optimizer_ = make_optimizer(config_.optimizer, model_->dense_parameters());
  scheduler_ = make_lr_scheduler(config_.lr_scheduler, *optimizer_, tc.steps, &log());
  if (config_.checkpoint.enable || !config_.checkpoint.initial_load_path.empty()) {
    // With prefetch the loader is one batch ahead: the checkpoint holds the state before it.
    CheckpointedData data{
        [this] { return lookahead_ ? state_before_lookahead_ : data_->state(); },
        [this](const std::map<std::string, int64_t>& s) {
          lookahead_.reset();
          data_->load_state(s);
        }};
    checkpointer_ = std::make_unique<TrainCheckpointer>(
        config_, world_, *model_, *optimizer_, *scheduler_, std::move(data),
        table_checkpoint_extension(tables(), mc_.get()));
    checkpointer_->set_global_batch(tc.local_batch_size * world_size(),
                                    "samples: local_batch_size " +
                                        std::to_string(tc.local_batch_size) + " x " +
                                        std::to_string(world_size()) + " rank(s)");
  }
}

RecsysTrainer::~RecsysTrainer() = default;

parallel::ShardedEmbeddingBagCollection& RecsysTrainer::tables() const {
  return dynamic_cast<dlrm::ShardedSparseArch&>(model_->sparse_arch()).collection();
}

int64_t RecsysTrainer::rank() const { return world_->rank(); }
int64_t RecsysTrainer::world_size() const { return world_->size(); }

std::ostream& RecsysTrainer::log() const {
  if (options_.quiet || rank() != 0) return null_log_;
  return options_.log ? *options_.log : std::cout;
}

void RecsysTrainer::setup_managed_collision() {
  const auto& e = config_.embedding;
  for (const std::string& f : e.lookup_only) {
    MT_CHECK(std::find(e.managed_collision.begin(), e.managed_collision.end(), f) !=
                 e.managed_collision.end(),
             "train: embedding.lookup_only names '", f,
             "', which is not in embedding.managed_collision (",
             config_.where("embedding.lookup_only"), ")");
  }
  if (e.managed_collision.empty()) return;
  std::vector<runtime::sparse::ManagedCollisionConfig> configs;
  for (const std::string& f : e.managed_collision) {
    const auto& features = model_->args().features;
    auto it = std::find_if(features.begin(), features.end(),
                           [&](const dlrm::SparseFeature& s) { return s.name == f; });
    std::string names;
    for (const auto& s : features) names += (names.empty() ? "" : ", ") + s.name;
    MT_CHECK(it != features.end(), "train: embedding.managed_collision names '", f,
             "', not a sparse feature of model.flavor ", config_.model.flavor, " (", names, ")");
    runtime::sparse::ManagedCollisionConfig c;
    c.name = "t_" + f;
    c.num_embeddings = it->num_embeddings;
    c.eviction = runtime::sparse::parse_eviction_policy(e.eviction);
    c.seed = uint64_t(config_.training.seed);
    c.feature_names = {f};
    configs.push_back(std::move(c));
  }
  mc_ = std::make_unique<parallel::ShardedManagedCollisionCollection>(std::move(configs), world_);
  for (const std::string& f : e.lookup_only) mc_->set_lookup_only(f);
}

runtime::sparse::KeyedJaggedTensor RecsysTrainer::map_ids(
    const runtime::sparse::KeyedJaggedTensor& features, int64_t step) const {
  if (!mc_) return features;
  runtime::sparse::McCollectionResult r = mc_->remap(features, step);
  for (const auto& evicted : r.evicted) tables().reset_rows(evicted.table, evicted.rows, step);
  return std::move(r.features);
}

void RecsysTrainer::forward_stream_log(std::ostream& out) const {
  if (!stream_log_) return;
  const std::string text = stream_log_->take();
  if (!text.empty()) out << text << std::flush;
}

void RecsysTrainer::finish_stream(std::ostream& out) const {
  const bool flushed = stream_->flush(std::chrono::seconds(30));
  forward_stream_log(out);
  const parallel::RowStreamStats st = stream_->stats();
  out << "embedding stream to " << config_.embedding.stream_to << " (rank " << rank()
      << "): " << st.rows_sent << " rows in " << st.frames_sent << " updates acknowledged";
  if (st.frames_dropped > 0)
    out << "; the replica missed " << st.frames_dropped << " updates (" << st.rows_dropped
        << " rows) of steps " << st.first_dropped_step << ".." << st.last_dropped_step
        << " (those rows stay stale there until trained again)";
  if (!flushed) out << "; " << st.queued_bytes << " bytes still unacknowledged after 30 s";
  out << "\n" << std::flush;
}

struct RecsysTrainer::StepValues {
  Tensor loss;                 // this rank's share of the global mean loss, on the device
  Tensor grad_norm;            // on the device; undefined where the norm was read at once
  double host_grad_norm = 0.0;
};

RecsysTrainer::StepValues RecsysTrainer::train_step(int64_t step) {
  const data::recsys::RecsysBatch batch = lookahead_ ? std::move(*lookahead_) : data_->next();
  lookahead_.reset();
  const int64_t global = world_size() * config_.training.local_batch_size;
  optimizer_->zero_grad();
  const Tensor logits = (*model_)(batch.dense, map_ids(batch.sparse, step));
  if (config_.embedding.prefetch && step < config_.training.steps) {
    // The next batch's kv rows are read while this step's backward runs (collective: its ids
    // are routed to their shards first).
    state_before_lookahead_ = data_->state();
    lookahead_ = data_->next();
    // Managed-collision ids: the rows they have now (the next step's remap may still move some;
    // those rows are read again then).
    tables().prefetch(mc_ ? mc_->peek(lookahead_->sparse) : lookahead_->sparse);
  }
  StepValues values;
  values.loss =
      dlrm::data_parallel_bce_loss(logits, batch.labels.to(logits.device(), true), global);
  values.loss.backward();
  values.loss = values.loss.detach();
  // On a GPU with fused tables the norm stays on the device and the clipping coefficient goes to
  // the optimizer (as in Trainer); row-sparse tables' norm is summed on the host.
  const bool row_sparse =
      model_->args().gradient_mode == runtime::sparse::GradientMode::RowSparse;
  Tensor clip_scale;
  if (device_.is_cpu() || row_sparse) {
    values.host_grad_norm = dlrm::clip_dlrm_grad_norm_(*model_, config_.training.max_norm);
  } else {
    values.grad_norm = dlrm::dlrm_dense_grad_norm_tensor(*model_);
    clip_scale = runtime::optim::clip_coefficient(values.grad_norm, config_.training.max_norm);
  }
  optimizer_->step(clip_scale);
  if (row_sparse) tables().apply_sparse_grads();  // fused tables were stepped inside backward
  scheduler_->step();
  return values;
}

void RecsysTrainer::read_steps(std::vector<StepValues>& unread, TrainResult& result) const {
  for (const StepValues& v : unread) {
    result.losses.push_back(sum_over_ranks(*world_, v.loss.item<double>(), "train.loss"));
    result.grad_norms.push_back(v.grad_norm.defined() ? v.grad_norm.item<double>()
                                                      : v.host_grad_norm);
  }
  unread.clear();
}

HeldOutMetrics RecsysTrainer::evaluate(int64_t max_batches) const {
  const int64_t available = data_->num_test_batches();
  const int64_t n = max_batches < 0 ? available : std::min(available, max_batches);
  runtime::NoGradGuard no_grad;
  model_->eval();
  // Held-out ids only read the mapping: every managed feature lookup-only, and the use counts
  // they touch restored afterwards.
  std::vector<runtime::sparse::McStatePiece> mapping;
  if (mc_) {
    mapping = mc_->state();
    for (const std::string& f : config_.embedding.managed_collision) mc_->set_lookup_only(f);
  }
  std::vector<double> scores, labels;
  for (int64_t k = 0; k < n; ++k) {
    const data::recsys::RecsysBatch b = data_->test_batch(k);
    const auto s = (*model_)(b.dense, map_ids(b.sparse, 0)).to_vector<double>();
    const auto l = b.labels.to_vector<double>();
    scores.insert(scores.end(), s.begin(), s.end());
    labels.insert(labels.end(), l.begin(), l.end());
  }
  model_->train();
  if (mc_) {
    mc_->load_state(mapping);
    for (const std::string& f : config_.embedding.managed_collision) {
      const auto& lookup = config_.embedding.lookup_only;
      mc_->set_lookup_only(f, std::find(lookup.begin(), lookup.end(), f) != lookup.end());
    }
  }
  // Every rank's scores to every rank (uneven counts): the AUC needs them all.
  const std::vector<double> all_scores =
      parallel::all_gather_values(*world_, scores, "eval.scores");
  const std::vector<double> all_labels =
      parallel::all_gather_values(*world_, labels, "eval.labels");
  HeldOutMetrics m;
  m.samples = int64_t(all_scores.size());
  MT_CHECK(m.samples > 0, "train: the held-out split of ", config_.training.dataset, " is empty");
  const Tensor st = runtime::from_vector<double>(all_scores, {m.samples}, {runtime::DType::F64});
  const Tensor lt = runtime::from_vector<double>(all_labels, {m.samples}, {runtime::DType::F64});
  m.loss = dlrm::bce_with_logits(st, lt).item<double>();
  // A held-out set of one class (a tiny split, few validation steps) has no AUC: said, not fatal.
  const auto positives = std::count(all_labels.begin(), all_labels.end(), 1.0);
  if (positives > 0 && positives < m.samples) m.auc = dlrm::roc_auc(all_scores, all_labels);
  return m;
}

TrainResult RecsysTrainer::train() {
  const auto& tc = config_.training;
  const fs::path dump(config_.job.dump_folder);
  std::ostream& out = log();
  RunScaffold run(config_, options_, *world_, checkpointer_.get(), out);
  const RecsysParamCounts params = count_parameters(*model_);
  const int64_t samples_per_step = tc.local_batch_size * world_size();
  const bool fused = config_.embedding.gradient_mode == "fused";
  out << "job: " << config_.job.description << " -> " << dump.string() << "\n"
      << "model: dlrm " << config_.model.flavor << ", " << params.dense << " dense + "
      << params.tables << " table parameters (" << model_->args().num_features() << " tables)\n"
      << "data: " << data_->describe() << "\n"
      << "steps: " << tc.steps << " of " << tc.local_batch_size << " samples per rank ("
      << samples_per_step << " per step on " << world_size() << " rank"
      << (world_size() > 1 ? "s" : "") << "); dense " << config_.optimizer.name << " lr "
      << config_.optimizer.lr << "; tables " << config_.embedding.optimizer << " lr "
      << config_.embedding.lr << ", "
      << (fused ? "fused into backward (not clipped)" : "row-sparse gradients (clipped)")
      << "; seed " << tc.seed << "; " << cpu_threads_text() << "\n"
      << placement_text_ << "tables sharded over " << world_size() << " rank" << (world_size() > 1 ? "s" : "")
      << (dp_mesh_ ? ", dense layers FSDP over " + dp_mesh_->describe() : std::string()) << ":\n"
      << plan_text_ << "device: " << runtime::device_description(device_) << "\n"
      << std::flush;

  TrainResult result;
  EtaEstimator eta(tc.steps);
  const int width = step_width_for(tc.steps);
  double window_seconds = 0.0;
  int64_t window_steps = 0;
  auto run_validation = [&](int64_t step) {
    const HeldOutMetrics m = evaluate(config_.validation.steps);
    result.val_losses.emplace_back(step, m.loss);
    if (m.auc) result.val_aucs.emplace_back(step, *m.auc);
    out << "validate step " << std::setw(width) << step << "  val_loss " << std::fixed
        << std::setprecision(4) << m.loss << "  auc ";
    if (m.auc) {
      out << *m.auc;
    } else {
      out << "n/a (the held-out samples are all of one class)";
    }
    out << "  (" << m.samples << " held-out samples)\n" << std::defaultfloat << std::flush;
    std::vector<std::pair<std::string, double>> values = {{"val_loss", m.loss}};
    if (m.auc) values.emplace_back("auc", *m.auc);
    run.log_values(step, values);
  };

  const ResumePoint resumed = checkpointer_ ? checkpointer_->resume(out) : ResumePoint{};
  int64_t samples_seen = resumed.tokens_seen;
  result.first_step = resumed.step + 1;
  std::vector<StepValues> unread;  // steps whose loss the host has not read yet
  for (int64_t step = resumed.step + 1; step <= tc.steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = optimizer_->lr();
    run.profile_begin(step, device_);
    unread.push_back(train_step(step));
    run.profile_end(step);
    forward_stream_log(out);
    const bool log_line = step == 1 || step % config_.metrics.log_freq == 0 || step == tc.steps;
    // The wait for the device, at a logged step: the window's time is the steps' wall time.
    if (log_line) read_steps(unread, result);
    const double dt = seconds_since(t0);
    window_seconds += dt;
    ++window_steps;
    eta.record(dt);
    result.steps_done = step;
    samples_seen += samples_per_step;
    if (log_line) {
      StepMetrics m;
      m.step = step;
      m.loss = result.losses.back();
      m.grad_norm = result.grad_norms.back();
      m.lr = lr;
      m.rate_in_samples = true;
      m.tokens_per_sec =
          double(window_steps * tc.local_batch_size) / std::max(window_seconds, 1e-9);
      m.ranks = world_size();
      m.comm_exposed_fraction = run.take_comm_exposed_fraction();
      const runtime::MemoryStats mem = runtime::memory_stats(device_);
      m.mem_in_use_bytes = mem.bytes_in_use;
      m.mem_peak_bytes = mem.peak_bytes_in_use;
      m.elapsed_sec = run.elapsed_seconds();
      m.eta_sec = eta.eta(step);
      if (mc_) {  // collective: every rank logs at the same steps
        const runtime::sparse::McStats st = mc_->global_stats();
        m.model_metrics = {{"mc_inserts", double(st.inserts)},
                           {"mc_evictions", double(st.evictions)},
                           {"mc_dropped", double(st.misses + st.overflow)}};
      }
      if (has_kv_tables(model_->args())) {  // this rank's shards
        const runtime::sparse::KvStats now = tables().kv_stats();
        for (const auto& [key, value] : kv_step_metrics(now, kv_logged_, window_steps))
          m.model_metrics[key] = value;
        kv_logged_ = now;
      }
      out << format_step_line(m, width) << "\n" << std::flush;
      run.log_step(m);
      window_seconds = 0.0;
      window_steps = 0;
    }
    if (config_.validation.enable && (step % config_.validation.freq == 0 || step == tc.steps))
      run_validation(step);
    if (run.end_of_step(step, samples_seen, result)) break;
  }
  read_steps(unread, result);  // a stop between logged steps
  if (stream_) finish_stream(out);
  run.finish(result);
  if (!result.val_aucs.empty())
    out << "; held-out AUC " << std::fixed << std::setprecision(4) << result.val_aucs.back().second
        << std::defaultfloat;
  out << "\n" << std::flush;
  return result;
}

}  // namespace mt::train
