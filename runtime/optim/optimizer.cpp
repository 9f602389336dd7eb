#include "runtime/optim/optimizer.h"

#include <cmath>
#include <sstream>
#include <unordered_set>

#include "runtime/core/grad_mode.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::optim {

DType state_dtype_for(DType param) { return param == DType::F64 ? DType::F64 : DType::F32; }

ParamGroup make_group(const std::vector<std::pair<std::string, Tensor>>& named_params) {
  ParamGroup g;
  for (const auto& [name, t] : named_params) {
    g.names.push_back(name);
    g.params.push_back(t);
  }
  return g;
}

ParamGroup make_group(const std::vector<Tensor>& params) {
  ParamGroup g;
  g.params = params;
  return g;
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups,
                     std::vector<std::string> state_names)
    : name_(std::move(name)), groups_(std::move(groups)), state_names_(std::move(state_names)) {
  state_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) state_[g].resize(groups_[g].params.size());
}

void Optimizer::check_groups() const {
  MT_CHECK(!groups_.empty(), name_, ": no parameter groups");
  std::unordered_set<const TensorImpl*> seen;
  std::unordered_set<std::string> keys;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    MT_CHECK(group.names.empty() || group.names.size() == group.params.size(), name_, ": group ", g,
             " has ", group.params.size(), " params but ", group.names.size(), " names");
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      const std::string key = param_key(g, i);
      MT_CHECK(p.defined(), name_, ": parameter '", key, "' is undefined");
      MT_CHECK(p.is_floating_point(), name_, ": parameter '", key, "' has dtype ", p.dtype(),
               "; only floating parameters can be optimized");
      MT_CHECK(p.is_leaf(), name_, ": parameter '", key, "' is not a leaf tensor");
      MT_CHECK(seen.insert(&p.impl()).second, name_, ": parameter '", key,
               "' appears more than once");
      MT_CHECK(keys.insert(key).second, name_, ": two parameters share the name '", key, "'");
    }
    validate(group, g);
  }
}

void Optimizer::validate(const ParamGroup& group, size_t index) const {
  MT_CHECK(std::isfinite(group.lr) && group.lr >= 0, name_, ": group ", index,
           ": lr must be >= 0, got ", group.lr);
  MT_CHECK(std::isfinite(group.weight_decay) && group.weight_decay >= 0, name_, ": group ", index,
           ": weight_decay must be >= 0, got ", group.weight_decay);
}

std::string Optimizer::param_key(size_t group, size_t index) const {
  MT_CHECK(group < groups_.size() && index < groups_[group].params.size(), name_, ": no parameter ",
           index, " in group ", group);
  const ParamGroup& g = groups_[group];
  if (!g.names.empty()) return g.names[index];
  return std::to_string(group) + "." + std::to_string(index);
}

const ParamState& Optimizer::state(size_t group, size_t index) const {
  MT_CHECK(group < state_.size() && index < state_[group].size(), name_, ": no parameter ", index,
           " in group ", group);
  return state_[group][index];
}

void Optimizer::set_lr(double lr) {
  for (size_t g = 0; g < groups_.size(); ++g) set_lr(g, lr);
}

void Optimizer::set_lr(size_t group, double lr) {
  MT_CHECK(group < groups_.size(), name_, ": no parameter group ", group, " (have ", groups_.size(),
           ")");
  MT_CHECK(std::isfinite(lr) && lr >= 0, name_, ": lr must be >= 0, got ", lr);
  groups_[group].lr = lr;
}

double Optimizer::lr(size_t group) const {
  MT_CHECK(group < groups_.size(), name_, ": no parameter group ", group, " (have ", groups_.size(),
           ")");
  return groups_[group].lr;
}

std::vector<Tensor> Optimizer::init_state(const ParamGroup&, const Tensor& param) const {
  std::vector<Tensor> out;
  for (size_t k = 0; k < state_names_.size(); ++k) {
    out.push_back(
        zeros(param.shape(), TensorOptions{state_dtype_for(param.dtype()), param.device(), false}));
  }
  return out;
}

std::vector<std::pair<std::string, double*>> Optimizer::common_hyperparams(ParamGroup& group) {
  return {{"lr", &group.lr}, {"weight_decay", &group.weight_decay}};
}

std::vector<std::pair<std::string, double*>> Optimizer::hyperparams(ParamGroup& group) const {
  return common_hyperparams(group);
}

void Optimizer::step(const Tensor& grad_scale) {
  NoGradGuard no_grad;
  MT_CHECK(!grad_scale.defined() || (grad_scale.numel() == 1 && grad_scale.dtype() == DType::F64),
           name_, ": grad_scale must be one f64 value, got ",
           grad_scale.defined() ? grad_scale.shape() : Shape{}, " ",
           grad_scale.defined() ? dtype_name(grad_scale.dtype()) : "undefined");
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    std::vector<UpdateItem> items;
    std::vector<size_t> indices;  // of items' parameters in the group
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      MT_CHECK(grad.shape() == p.shape(), name_, ": gradient of shape ", grad.shape(),
               " for parameter '", param_key(g, i), "' of shape ", p.shape());
      MT_CHECK(grad.device() == p.device(), name_, ": gradient on ", grad.device(),
               " for parameter '", param_key(g, i), "' on ", p.device());
      ParamState& st = state_[g][i];
      if (!st.initialized) {
        st.tensors = init_state(group, p);
        st.step = 0;
        st.initialized = true;
      }
      st.step += 1;
      items.push_back({p.is_contiguous() ? p : p.contiguous(), grad.to(p.dtype()).contiguous(), &st});
      indices.push_back(i);
    }
    if (items.empty()) continue;
    update_group(group, items, grad_scale);
    for (size_t k = 0; k < items.size(); ++k) {
      const Tensor& p = group.params[indices[k]];
      if (items[k].param.same(p)) {
        p.bump_version();
      } else {
        p.copy_(items[k].param);  // a non-contiguous parameter updated through a copy
      }
      for (const Tensor& s : items[k].state->tensors) s.bump_version();
    }
  }
}

void Optimizer::update_group(const ParamGroup& group, std::vector<UpdateItem>& items,
                             const Tensor& grad_scale) {
  for (UpdateItem& item : items) {
    const Tensor grad =
        grad_scale.defined() ? scaled_by(item.grad, grad_scale.to(item.grad.device())) : item.grad;
    update(group, item.param, grad, *item.state);
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        g.zero_();
      }
    }
  }
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const ParamState& st = state_[g][i];
      if (!st.initialized) continue;
      const std::string prefix = "state." + param_key(g, i) + ".";
      out.insert(prefix + "step",
                 scalar_tensor(double(st.step), TensorOptions{}.with_dtype(DType::I64)));
      for (size_t k = 0; k < state_names_.size(); ++k)
        out.insert(prefix + state_names_[k], st.tensors[k]);
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto& group = const_cast<ParamGroup&>(groups_[g]);
    for (const auto& [hname, value] : hyperparams(group)) {
      out.insert("param_groups." + std::to_string(g) + "." + hname,
                 scalar_tensor(*value, TensorOptions{}.with_dtype(DType::F64)));
    }
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  std::vector<std::string> missing, problems;
  std::unordered_set<std::string> known;
  std::vector<std::vector<ParamState>> fresh(groups_.size());

  for (size_t g = 0; g < groups_.size(); ++g) {
    fresh[g].resize(groups_[g].params.size());
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      const std::string prefix = "state." + param_key(g, i) + ".";
      std::vector<std::string> fields{"step"};
      fields.insert(fields.end(), state_names_.begin(), state_names_.end());
      std::vector<std::string> absent;
      for (const std::string& f : fields) {
        known.insert(prefix + f);
        if (!state.contains(prefix + f)) absent.push_back(prefix + f);
      }
      if (absent.size() == fields.size()) continue;  // no state for this parameter
      if (!absent.empty()) {
        missing.insert(missing.end(), absent.begin(), absent.end());
        continue;
      }
      ParamState& st = fresh[g][i];
      st.initialized = true;
      const Tensor& step = state.at(prefix + "step");
      if (!step.defined() || step.numel() != 1 || !is_integral(step.dtype())) {
        problems.push_back("'" + prefix + "step' must be a one-element integer tensor");
      } else {
        st.step = step.item<int64_t>();
        if (st.step < 0) problems.push_back("'" + prefix + "step' is negative");
      }
      const DType sd = state_dtype_for(p.dtype());
      for (const std::string& f : state_names_) {
        const Tensor& t = state.at(prefix + f);
        if (!t.defined() || t.shape() != p.shape() || t.dtype() != sd) {
          std::ostringstream os;
          os << "'" << prefix << f << "': expected shape " << p.shape() << " " << sd << ", found ";
          if (t.defined()) {
            os << "shape " << t.shape() << " " << t.dtype();
          } else {
            os << "an undefined tensor";
          }
          problems.push_back(os.str());
          continue;
        }
        NoGradGuard no_grad;
        st.tensors.push_back(t.to(p.device()).clone());
      }
    }
  }
  std::vector<std::pair<double*, double>> hyper_values;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& [hname, ptr] : hyperparams(groups_[g])) {
      const std::string key = "param_groups." + std::to_string(g) + "." + hname;
      known.insert(key);
      const Tensor* t = state.find(key);
      if (t == nullptr) {
        missing.push_back(key);
      } else if (!t->defined() || t->numel() != 1) {
        problems.push_back("'" + key + "' must be a one-element tensor");
      } else {
        hyper_values.emplace_back(ptr, t->item<double>());
      }
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [key, t] : state)
    if (!known.count(key)) unexpected.push_back(key);

  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + ("'" + v[i] + "'");
    return s;
  };
  std::string err;
  if (!missing.empty()) err += "\n  missing keys: " + join(missing);
  if (!unexpected.empty()) err += "\n  unexpected keys: " + join(unexpected);
  for (const std::string& p : problems) err += "\n  " + p;
  MT_CHECK(err.empty(), name_, ".load_state_dict: the state does not match the optimizer:", err);

  state_ = std::move(fresh);
  for (auto& [ptr, value] : hyper_values) *ptr = value;
}

}  // namespace mt::runtime::optim
