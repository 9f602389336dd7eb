#include "runtime/nn/state_dict.h"

namespace mt::runtime::nn {

void StateDict::insert(std::string key, Tensor value) {
  MT_CHECK(!contains(key), "StateDict: duplicate key '", key, "'");
  index_.emplace(key, items_.size());
  items_.emplace_back(std::move(key), std::move(value));
}

void StateDict::set(const std::string& key, Tensor value) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    insert(key, std::move(value));
  } else {
    items_[it->second].second = std::move(value);
  }
}

const Tensor& StateDict::at(const std::string& key) const {
  const Tensor* t = find(key);
  MT_CHECK(t != nullptr, "StateDict: no entry named '", key, "'");
  return *t;
}

const Tensor* StateDict::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

bool StateDict::erase(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const size_t pos = it->second;
  items_.erase(items_.begin() + int64_t(pos));
  index_.erase(it);
  for (auto& [k, i] : index_)
    if (i > pos) --i;
  return true;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const auto& [k, v] : items_) out.push_back(k);
  return out;
}

void StateDict::merge(const StateDict& other, const std::string& prefix) {
  for (const auto& [k, v] : other.items_) insert(prefix + k, v);
}

}  // namespace mt::runtime::nn
