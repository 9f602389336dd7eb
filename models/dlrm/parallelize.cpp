// DLRM parallelization: sharded tables copied from the unsharded ones, FSDP on the dense parts,
// the data-parallel loss and the clipping that adds the tables' row-sparse gradients.
#include "models/dlrm/parallelize.h"

#include <cmath>
#include <string>
#include <vector>

#include "models/dlrm/metrics.h"
#include "parallel/clip_grad.h"
#include "parallel/fsdp/fully_shard.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/sparse/row_sparse_grad.h"

namespace mt::models::dlrm {

namespace rt = mt::runtime;
namespace par = mt::parallel;

ShardedSparseArch::ShardedSparseArch(std::shared_ptr<par::ShardedEmbeddingBagCollection> collection)
    : SparseArch("ShardedSparseArch"), collection_(std::move(collection)) {
  MT_CHECK(collection_ != nullptr, "ShardedSparseArch: the collection is null");
  adopt_tables(*collection_);
}

rt::sparse::KeyedTensor ShardedSparseArch::operator()(const rt::sparse::KeyedJaggedTensor& features) {
  sync_mode(*collection_);
  return (*collection_)(features);
}

par::ShardingPlan parallelize_dlrm(Dlrm& model, const DlrmParallelOptions& options) {
  MT_CHECK(options.group != nullptr, "parallelize_dlrm: options.group (the tables' ranks) is null");
  auto* plain = dynamic_cast<EmbeddingBagSparseArch*>(&model.sparse_arch());
  MT_CHECK(plain != nullptr, "parallelize_dlrm: the model's tables are already ",
           model.sparse_arch().type_name(), ", not the unsharded EmbeddingBagSparseArch "
           "(parallelize a model once)");
  const rt::sparse::EmbeddingBagCollection& unsharded = plain->collection();
  // Copies: the unsharded collection is dropped by set_sparse_arch below.
  const std::vector<rt::sparse::EmbeddingBagConfig> tables = unsharded.table_configs();
  const std::vector<Tensor> full = unsharded.weights();
  const rt::DType dtype = full.empty() ? rt::DType::F32 : full.front().dtype();

  par::ShardingPlan plan;
  if (options.plan) {
    plan = *options.plan;
  } else {
    par::PlannerOptions planner = options.planner;
    planner.world_size = options.group->size();
    if (options.node_mesh) planner.local_size = int(options.node_mesh->size(1));
    planner.dtype = dtype;
    plan = par::plan_sharding(tables, planner);
  }
  MT_CHECK(plan.world_size == options.group->size(), "parallelize_dlrm: the plan is for ",
           plan.world_size, " ranks but the group has ", options.group->size());

  rt::sparse::CollectionOptions copts = unsharded.options();
  copts.dtype = dtype;
  const rt::Device device = options.device.value_or(model.device());
  copts.device = device;
  auto sharded = std::make_shared<par::ShardedEmbeddingBagCollection>(
      tables, plan, options.group, options.node_mesh, copts, options.output_group);
  {
    // Every shard takes its block of the unsharded table (so any init or loaded values carry
    // over exactly), and the table's init key: a kv shard draws its rows, and managed-collision
    // resets draw, as the unsharded table would.
    rt::NoGradGuard no_grad;
    for (size_t t = 0; t < tables.size(); ++t)
      sharded->set_init_context(tables[t].name, unsharded.table(t).init_context());
    for (const par::LocalShard& s : sharded->local_shards()) {
      size_t t = 0;
      while (t < tables.size() && tables[t].name != s.table) ++t;
      MT_CHECK(t < tables.size(), "parallelize_dlrm: shard of unknown table '", s.table, "'");
      if (s.kv) continue;  // the unsharded table holds no rows of it
      s.weight.copy_(full[t]
                         .narrow(0, s.placement.row_offset, s.placement.num_rows)
                         .narrow(1, s.placement.col_offset, s.placement.num_cols));
    }
  }
  model.set_sparse_arch(std::make_shared<ShardedSparseArch>(std::move(sharded)));
  model.to(device);  // the dense parts (the shards are there already)

  if (options.dp_mesh) {
    par::FullyShardOptions fsdp;
    fsdp.mp_policy = options.mp_policy;
    fsdp.gradient_divide_factor = 1.0;  // sum: see the loss convention
    fsdp.reshard_after_forward = options.reshard_after_forward;
    par::fully_shard(*model.bottom_mlp, options.dp_mesh, fsdp);
    if (model.cross_net) par::fully_shard(*model.cross_net, options.dp_mesh, fsdp);
    fsdp.reshard_after_forward = false;  // the first to run backward: keep it gathered
    par::fully_shard(*model.top_mlp, options.dp_mesh, fsdp);
  }
  return plan;
}

int64_t global_batch_size(par::ProcessGroup& group, int64_t local_batch_size) {
  Tensor n = rt::from_vector<int64_t>(
      {local_batch_size}, {1},
      rt::TensorOptions{}.with_dtype(rt::DType::I64).with_device(group.device()));
  group.all_reduce(n, par::ReduceOp::Sum, "dlrm.global_batch_size");
  return n.item<int64_t>();
}

Tensor data_parallel_bce_loss(const Tensor& logits, const Tensor& labels,
                              int64_t global_batch_size) {
  MT_CHECK(global_batch_size >= 1, "data_parallel_bce_loss: the global batch size must be >= 1, got ",
           global_batch_size);
  MT_CHECK(logits.numel() <= global_batch_size, "data_parallel_bce_loss: ", logits.numel(),
           " local samples but a global batch of ", global_batch_size);
  return rt::div(bce_with_logits(logits, labels, rt::Reduction::Sum), double(global_batch_size));
}

namespace {

// The dense parameters as the distributed clipping sees them (FSDP shards with their DTensors).
std::vector<par::DistributedParam> dense_params(Dlrm& model) {
  std::vector<par::DistributedParam> out;
  for (auto& p : par::distributed_parameters(model)) {
    if (p.fqn.rfind("sparse_arch.", 0) != 0) out.push_back(p);
  }
  return out;
}

// The tables' partial sum |g|^p (max for inf) over every rank, RowSparse only (else 0).
double sparse_norm_pow(Dlrm& model, double norm_type) {
  if (model.args().gradient_mode != rt::sparse::GradientMode::RowSparse) return 0.0;
  if (auto* sharded = dynamic_cast<ShardedSparseArch*>(&model.sparse_arch())) {
    par::ShardedEmbeddingBagCollection& c = sharded->collection();
    Tensor buf = rt::from_vector<double>(
        {c.sparse_grad_norm_pow(norm_type)}, {1},
        rt::TensorOptions{}.with_dtype(rt::DType::F64).with_device(c.group().device()));
    c.group().all_reduce(buf, std::isinf(norm_type) ? par::ReduceOp::Max : par::ReduceOp::Sum,
                         "dlrm.clip_grad_norm.tables");
    return buf.item<double>();
  }
  if (auto* plain = dynamic_cast<EmbeddingBagSparseArch*>(&model.sparse_arch())) {
    return rt::sparse::row_sparse_norm_pow(plain->collection().sparse_grads(), norm_type);
  }
  MT_FAIL("dlrm clipping: unknown sparse arch ", model.sparse_arch().type_name());
}

}  // namespace

double dlrm_total_grad_norm(Dlrm& model, double norm_type) {
  const double dense = par::total_grad_norm(dense_params(model), norm_type);
  // The dense total back to its partial (the p-th power) to add the tables' partial.
  const double dense_pow = std::isinf(norm_type) ? dense : std::pow(dense, norm_type);
  const double partials[2] = {dense_pow, sparse_norm_pow(model, norm_type)};
  return rt::optim::norm_from_pow(rt::optim::combine_norm_pows(partials, norm_type), norm_type);
}

Tensor dlrm_dense_grad_norm_tensor(Dlrm& model, double norm_type) {
  MT_CHECK(model.args().gradient_mode != rt::sparse::GradientMode::RowSparse,
           "dlrm_dense_grad_norm_tensor: the tables' row-sparse gradients count in the norm; use "
           "clip_dlrm_grad_norm_");
  return par::total_grad_norm_tensor(dense_params(model), norm_type);
}

double clip_dlrm_grad_norm_(Dlrm& model, double max_norm, double norm_type) {
  const double total = dlrm_total_grad_norm(model, norm_type);
  std::vector<Tensor> local;
  for (const auto& p : dense_params(model)) local.push_back(p.param);
  const double coef = rt::optim::clip_grads_with_norm_(local, max_norm, total);
  if (coef != 1.0 && model.args().gradient_mode == rt::sparse::GradientMode::RowSparse) {
    if (auto* sharded = dynamic_cast<ShardedSparseArch*>(&model.sparse_arch())) {
      sharded->collection().scale_sparse_grads_(coef);
    } else if (auto* plain = dynamic_cast<EmbeddingBagSparseArch*>(&model.sparse_arch())) {
      rt::sparse::scale_(plain->collection().mutable_sparse_grads(), coef);
    }
  }
  return total;
}

}  // namespace mt::models::dlrm
