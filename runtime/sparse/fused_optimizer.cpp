#include "runtime/sparse/fused_optimizer.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"

namespace mt::runtime::sparse {

const char* optimizer_name(EmbOptimType type) {
  switch (type) {
    case EmbOptimType::SGD:
      return "EXACT_SGD";
    case EmbOptimType::RowwiseAdagrad:
      return "EXACT_ROWWISE_ADAGRAD";
    case EmbOptimType::Adam:
      return "ADAM";
    case EmbOptimType::PartialRowwiseAdam:
      return "PARTIAL_ROWWISE_ADAM";
  }
  return "?";
}

EmbOptimType parse_optimizer(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "sgd" || n == "exact_sgd") return EmbOptimType::SGD;
  if (n == "rowwise_adagrad" || n == "exact_rowwise_adagrad") return EmbOptimType::RowwiseAdagrad;
  if (n == "adam") return EmbOptimType::Adam;
  if (n == "partial_rowwise_adam") return EmbOptimType::PartialRowwiseAdam;
  MT_FAIL("embedding optimizer: unknown name '", name,
          "' (expected exact_sgd, exact_rowwise_adagrad, adam or partial_rowwise_adam)");
}

std::vector<std::pair<std::string, int64_t>> row_state_fields(EmbOptimType type, int64_t dim) {
  switch (type) {
    case EmbOptimType::SGD:
      return {};
    case EmbOptimType::RowwiseAdagrad:
      return {{"momentum1", 1}};
    case EmbOptimType::Adam:
      return {{"momentum1", dim}, {"momentum2", dim}};
    case EmbOptimType::PartialRowwiseAdam:
      return {{"momentum1", dim}, {"momentum2", 1}};
  }
  return {};
}

void FusedEmbeddingOptimizer::add_table(const EmbeddingOptimizerConfig& config, int64_t rows,
                                        int64_t dim, DType dtype, std::string key) {
  MT_CHECK(rows >= 0 && dim > 0, "FusedEmbeddingOptimizer: table '", key, "' has shape [", rows,
           ", ", dim, "]");
  MT_CHECK(config.lr >= 0 && config.eps >= 0 && config.weight_decay >= 0 && config.beta1 >= 0 &&
               config.beta1 < 1 && config.beta2 >= 0 && config.beta2 < 1,
           "FusedEmbeddingOptimizer: table '", key, "': invalid settings (lr ", config.lr, ", eps ",
           config.eps, ", betas ", config.beta1, "/", config.beta2, ", weight_decay ",
           config.weight_decay, ")");
  Table t;
  t.config = config;
  t.rows = rows;
  t.dim = dim;
  t.key = std::move(key);
  const TensorOptions so =
      TensorOptions{}.with_dtype(dtype == DType::F64 ? DType::F64 : DType::F32);
  const auto fields = row_state_fields(config.type, dim);
  if (fields.size() > 0) t.momentum1 = zeros({rows, fields[0].second}, so);
  if (fields.size() > 1) t.momentum2 = zeros({rows, fields[1].second}, so);
  tables_.push_back(std::move(t));
}

void FusedEmbeddingOptimizer::step(const std::vector<Tensor>& weights,
                                   const std::vector<RowSparseGrad>& grads) {
  MT_CHECK(weights.size() == tables_.size(), "FusedEmbeddingOptimizer::step: ", weights.size(),
           " weights for ", tables_.size(), " tables");
  NoGradGuard ng;
  for (Table& t : tables_) ++t.step;
  for (const RowSparseGrad& g : grads) {
    MT_CHECK(g.table >= 0 && g.table < int64_t(tables_.size()),
             "FusedEmbeddingOptimizer::step: gradient for table ", g.table, " of ", tables_.size());
    Table& t = tables_[g.table];
    const Tensor& w = weights[g.table];
    MT_CHECK(w.is_contiguous() && w.dim() == 2 && w.size(0) == t.rows && w.size(1) == t.dim,
             "FusedEmbeddingOptimizer: weight of '", t.key, "' is ", w.shape(),
             (w.is_contiguous() ? "" : " (not contiguous)"), ", expected [", t.rows, ", ", t.dim,
             "]");
    MT_CHECK(g.values.dtype() == w.dtype() && g.values.dim() == 2 &&
                 g.values.size(0) == g.rows.numel() && g.values.size(1) == t.dim,
             "FusedEmbeddingOptimizer: gradient of '", t.key, "' is ", g.values.dtype(), " ",
             g.values.shape(), " for ", g.rows.numel(), " rows of a ", w.dtype(), " table");
    if (g.rows.numel() == 0) continue;
    // The state follows its table: allocated on the host, moved once to a CUDA table's device.
    for (Tensor* state : {&t.momentum1, &t.momentum2})
      if (state->defined() && state->device() != w.device()) *state = state->to(w.device());
    RowOptimizerHyper h;
    h.lr = t.config.lr;
    h.eps = t.config.eps;
    h.beta1 = t.config.beta1;
    h.beta2 = t.config.beta2;
    h.weight_decay = t.config.weight_decay;
    h.step = t.step;
    embedding_row_update_kernel(w.device(), t.config.type, h, w, g.rows.contiguous(),
                                g.values.contiguous(), t.momentum1, t.momentum2);
    w.bump_version();
  }
}

void FusedEmbeddingOptimizer::bind_rows(size_t table, int64_t rows, Tensor momentum1,
                                        Tensor momentum2) {
  Table& t = tables_.at(table);
  t.rows = rows;
  t.momentum1 = std::move(momentum1);
  t.momentum2 = std::move(momentum2);
}

void FusedEmbeddingOptimizer::set_lr(double lr) {
  for (Table& t : tables_) t.config.lr = lr;
}

void FusedEmbeddingOptimizer::set_lr(size_t table, double lr) { tables_.at(table).config.lr = lr; }

std::vector<std::pair<std::string, Tensor>> FusedEmbeddingOptimizer::table_state(
    size_t table) const {
  const Table& t = tables_.at(table);
  std::vector<std::pair<std::string, Tensor>> out;
  if (t.external) return out;
  if (t.momentum1.defined()) out.emplace_back("momentum1", t.momentum1);
  if (t.momentum2.defined()) out.emplace_back("momentum2", t.momentum2);
  return out;
}

void FusedEmbeddingOptimizer::zero_rows(size_t table, const std::vector<int64_t>& rows) const {
  if (rows.empty()) return;
  NoGradGuard no_grad;
  Tensor index;  // uploaded once, to the states' device
  for (const auto& [name, state] : table_state(table)) {
    const TensorOptions on = TensorOptions{}.with_dtype(DType::I64).with_device(state.device());
    if (!index.defined()) index = from_vector<int64_t>(rows, {int64_t(rows.size())}, on);
    Shape shape = state.shape();
    shape[0] = int64_t(rows.size());
    index_copy_(state, 0, index, zeros({}, state.options()).expand(shape));
  }
}

nn::StateDict FusedEmbeddingOptimizer::state_dict() const {
  nn::StateDict sd;
  for (size_t i = 0; i < tables_.size(); ++i) {
    for (auto& [name, tensor] : table_state(i)) sd.insert(tables_[i].key + "." + name, tensor);
    sd.insert(tables_[i].key + ".step",
              scalar_tensor(double(tables_[i].step), TensorOptions{}.with_dtype(DType::I64)));
  }
  return sd;
}

void FusedEmbeddingOptimizer::load_state_dict(const nn::StateDict& state) {
  std::ostringstream problems;
  size_t expected = 0;
  for (size_t i = 0; i < tables_.size(); ++i) {
    std::vector<std::pair<std::string, Tensor>> entries = table_state(i);
    entries.emplace_back("step", Tensor());
    for (auto& [name, mine] : entries) {
      const std::string key = tables_[i].key + "." + name;
      ++expected;
      const Tensor* t = state.find(key);
      if (!t) {
        problems << "\n  missing " << key;
      } else if (mine.defined() && (t->shape() != mine.shape() || t->dtype() != mine.dtype())) {
        problems << "\n  " << key << ": expected " << mine.dtype() << " " << mine.shape()
                 << ", got " << t->dtype() << " " << t->shape();
      } else if (!mine.defined() && t->numel() != 1) {
        problems << "\n  " << key << ": expected one step count, got shape " << t->shape();
      }
    }
  }
  if (state.size() > expected || problems.tellp() > 0) {
    for (const auto& [key, t] : state) {
      bool known = false;
      for (const Table& tab : tables_)
        known |= key.rfind(tab.key + ".", 0) == 0 &&
                 (key == tab.key + ".step" || key == tab.key + ".momentum1" ||
                  key == tab.key + ".momentum2");
      if (!known) problems << "\n  unexpected " << key;
    }
  }
  MT_CHECK(problems.tellp() == 0, "FusedEmbeddingOptimizer::load_state_dict:", problems.str());
  NoGradGuard ng;
  for (size_t i = 0; i < tables_.size(); ++i) {
    Table& t = tables_[i];
    if (!t.external && t.momentum1.defined()) t.momentum1.copy_(state.at(t.key + ".momentum1"));
    if (!t.external && t.momentum2.defined()) t.momentum2.copy_(state.at(t.key + ".momentum2"));
    t.step = state.at(t.key + ".step").item<int64_t>();
  }
}

}  // namespace mt::runtime::sparse
