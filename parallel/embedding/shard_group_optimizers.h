// The row-optimizer plumbing both sharded collections (sharded_embedding_bag_collection.h,
// sharded_embedding_collection.h) share, written once: each keeps one sharding group per kind of
// placement, and every group holds `optimizer` (a FusedEmbeddingOptimizer over this rank's shards
// of the group) and `sparse_grads` (the RowSparse mode's kept gradients, optimizer-indexed).
// `groups` is the collection's std::vector<std::unique_ptr<Group>>.
#pragma once

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/nn/module.h"
#include "runtime/sparse/row_sparse_grad.h"

namespace mt::parallel {

// Every group's optimizer state, keyed "<weight fqn>.<field>".
template <class Groups>
runtime::nn::StateDict merged_optimizer_state(const Groups& groups) {
  runtime::nn::StateDict out;
  for (const auto& g : groups) out.merge(g->optimizer.state_dict());
  return out;
}

// Hands each group's optimizer the keys of its own shards (it checks them all itself); a key of
// no group is an error naming `who` and `rank`.
template <class Groups>
void load_optimizer_state_by_group(Groups& groups, const runtime::nn::StateDict& state,
                                   std::string_view who, int rank) {
  std::vector<runtime::nn::StateDict> own(groups.size()), parts(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) own[k] = groups[k]->optimizer.state_dict();
  for (const auto& [key, value] : state) {
    size_t k = 0;
    while (k < groups.size() && !own[k].contains(key)) ++k;
    MT_CHECK(k < groups.size(), who, ": optimizer state key '", key,
             "' is not one of this rank's shards (rank ", rank, ")");
    parts[k].insert(key, value);
  }
  for (size_t k = 0; k < groups.size(); ++k)
    if (groups[k]->optimizer.num_tables() > 0) groups[k]->optimizer.load_state_dict(parts[k]);
}

template <class Groups>
void set_groups_lr(Groups& groups, double lr) {
  for (const auto& g : groups) g->optimizer.set_lr(lr);
}

// sum |g|^p (max for p = inf) over the kept gradients of the groups for which
// counted(group index) is true (replicated groups count on one rank only).
template <class Groups, class Counted>
double groups_sparse_norm_pow(const Groups& groups, double norm_type, Counted counted) {
  double total = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    if (!counted(k)) continue;
    const double part = runtime::sparse::row_sparse_norm_pow(groups[k]->sparse_grads, norm_type);
    total = std::isinf(norm_type) ? std::max(total, part) : total + part;
  }
  return total;
}

template <class Groups>
void scale_groups_sparse_grads(Groups& groups, double coef) {
  for (const auto& g : groups) runtime::sparse::scale_(g->sparse_grads, coef);
}

// One optimizer step of every present group that holds tables (weights_of(group) gives its
// optimizer-ordered weights), then drops every kept gradient.
template <class Groups, class WeightsOf>
void apply_groups_sparse_grads(Groups& groups, WeightsOf weights_of) {
  for (const auto& g : groups) {
    if (g->present && g->optimizer.num_tables() > 0)
      g->optimizer.step(weights_of(*g), g->sparse_grads);
    g->sparse_grads.clear();
  }
}

template <class Groups>
void zero_groups_sparse_grads(Groups& groups) {
  for (const auto& g : groups) g->sparse_grads.clear();
}

}  // namespace mt::parallel
