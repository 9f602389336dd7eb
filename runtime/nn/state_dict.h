// StateDict: an insertion-ordered map from fully qualified names ("layers.0.attention.wq.weight")
// to tensors, the exchange format of Module::state_dict(), Optimizer::state_dict() and the
// LR scheduler (and, later, of checkpoints). Scalars (step counts, learning rates) are stored
// as 0-D tensors so that everything a checkpoint saves is a named tensor.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::nn {

class StateDict {
 public:
  using Item = std::pair<std::string, Tensor>;

  // Adds `key`; throws when it is already present.
  void insert(std::string key, Tensor value);
  // Adds `key` or replaces its value (keeping its position).
  void set(const std::string& key, Tensor value);
  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  // Throws naming the key when absent.
  const Tensor& at(const std::string& key) const;
  // nullptr when absent.
  const Tensor* find(const std::string& key) const;
  bool erase(const std::string& key);

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<std::string> keys() const;
  const std::vector<Item>& items() const { return items_; }
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }

  // Copies every entry of `other` (prefixing its keys with `prefix`); throws on duplicates.
  void merge(const StateDict& other, const std::string& prefix = "");

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace mt::runtime::nn
