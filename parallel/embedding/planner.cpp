#include "parallel/embedding/planner.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>
#include <sstream>

#include "runtime/core/error.h"

namespace mt::parallel {

namespace {

std::string fmt_bytes(int64_t b) {
  char buf[48];
  if (b >= (int64_t(1) << 20))
    std::snprintf(buf, sizeof(buf), "%lld B (%.2f MiB)", static_cast<long long>(b),
                  double(b) / (1 << 20));
  else
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(b));
  return buf;
}

// The per-rank byte increments of a placement.
std::vector<int64_t> increments(const EmbeddingBagConfig& t, const ParameterSharding& p, int world,
                                runtime::DType dtype) {
  std::vector<int64_t> inc(size_t(world), 0);
  for (const ShardMetadata& s : p.shards)
    inc[size_t(s.rank)] += shard_bytes(t, s.num_rows, s.num_cols, dtype);
  return inc;
}

bool fits(const std::vector<int64_t>& used, const std::vector<int64_t>& inc, int64_t budget) {
  for (size_t r = 0; r < used.size(); ++r)
    if (used[r] + inc[r] > budget) return false;
  return true;
}

int64_t peak(const std::vector<int64_t>& used, const std::vector<int64_t>& inc) {
  int64_t m = 0;
  for (size_t r = 0; r < used.size(); ++r) m = std::max(m, used[r] + inc[r]);
  return m;
}

// Ranks by bytes used so far (ties: lower rank first).
std::vector<int> least_loaded(const std::vector<int64_t>& used) {
  std::vector<int> order(used.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return used[size_t(a)] < used[size_t(b)]; });
  return order;
}

}  // namespace

ShardingPlan plan_sharding(const std::vector<EmbeddingBagConfig>& tables, const PlannerOptions& o) {
  const int W = o.world_size;
  const int L = o.local_size > 0 ? o.local_size : W;
  MT_CHECK(W >= 1, "embedding planner: world_size must be >= 1, got ", W);
  MT_CHECK(L >= 1 && W % L == 0, "embedding planner: local_size ", o.local_size,
           " must divide the world size ", W);
  MT_CHECK(o.memory_budget_bytes > 0, "embedding planner: memory_budget_bytes must be > 0, got ",
           o.memory_budget_bytes);
  std::set<std::string> names;
  for (const EmbeddingBagConfig& t : tables) {
    MT_CHECK(t.num_embeddings > 0 && t.embedding_dim > 0 && !t.feature_names.empty(),
             "embedding planner: table '", t.name, "' needs rows, columns and features, got ",
             t.num_embeddings, " x ", t.embedding_dim, " with ", t.feature_names.size(),
             " features");
    MT_CHECK(names.insert(t.name).second, "embedding planner: two tables are named '", t.name, "'");
  }
  for (const auto& [name, c] : o.constraints)
    MT_CHECK(names.count(name), "embedding planner: a constraint names table '", name,
             "', which is not one of the tables");

  ShardingPlan plan;
  plan.world_size = W;
  plan.local_size = o.local_size;
  std::vector<int64_t> used(size_t(W), 0);
  const int64_t elem = int64_t(runtime::dtype_size(o.dtype));

  std::vector<size_t> order(tables.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::vector<int64_t> full(tables.size());
  for (size_t i = 0; i < tables.size(); ++i)
    full[i] = shard_bytes(tables[i], tables[i].num_embeddings, tables[i].embedding_dim, o.dtype);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return full[a] > full[b]; });

  for (size_t i : order) {
    const EmbeddingBagConfig& t = tables[i];
    const int64_t bytes = full[i];
    const auto cit = o.constraints.find(t.name);
    const PlannerTableConstraint* c = cit == o.constraints.end() ? nullptr : &cit->second;

    // Rule 2's traffic estimate, per step.
    const double dp_traffic = 2.0 * double(t.num_embeddings * t.embedding_dim * elem);
    const double tw_traffic =
        double(W) * double(o.batch_size_per_rank) * double(t.feature_names.size()) *
        (8.0 * (o.pooling_factor + 1.0) + 2.0 * double(t.embedding_dim * elem));
    const bool tiny = W > 1 && dp_traffic < tw_traffic &&
                      double(bytes) <= o.data_parallel_max_fraction * double(o.memory_budget_bytes);
    const bool big =
        W > 1 && double(bytes) > o.row_wise_min_fraction * double(o.memory_budget_bytes);
    using ST = ShardingType;
    std::vector<ST> prefs;
    std::string why;
    if (W == 1) {
      prefs = {ST::TableWise, ST::DataParallel, ST::RowWise, ST::ColumnWise, ST::TableRowWise};
      why = "one rank";
    } else if (tiny) {
      prefs = {ST::DataParallel, ST::TableWise, ST::ColumnWise, ST::RowWise, ST::TableRowWise};
      char buf[160];
      std::snprintf(buf, sizeof(buf),
                    "tiny: grad all-reduce ~%.0f B < table_wise exchange ~%.0f B per step",
                    dp_traffic, tw_traffic);
      why = buf;
    } else if (big) {
      if (L < W)
        prefs = {ST::TableRowWise, ST::RowWise, ST::ColumnWise, ST::TableWise, ST::DataParallel};
      else
        prefs = {ST::RowWise, ST::TableRowWise, ST::ColumnWise, ST::TableWise, ST::DataParallel};
      char buf[160];
      std::snprintf(buf, sizeof(buf), "big: > %.0f%% of the budget",
                    100.0 * o.row_wise_min_fraction);
      why = buf;
    } else {
      prefs = {ST::TableWise, ST::ColumnWise, ST::RowWise, ST::TableRowWise, ST::DataParallel};
      why = "fits a rank: least loaded";
    }
    if (c && c->type) {
      prefs = {*c->type};
      why = "fixed by constraint";
    } else if (c && !c->allowed.empty()) {
      std::vector<ST> kept;
      for (ST s : prefs)
        if (std::find(c->allowed.begin(), c->allowed.end(), s) != c->allowed.end())
          kept.push_back(s);
      if (kept.empty() || kept.front() != prefs.front()) why += "; constrained";
      prefs = kept;
    }

    std::optional<ParameterSharding> chosen;
    std::string tried;
    for (size_t k = 0; k < prefs.size() && !chosen; ++k) {
      const ST type = prefs[k];
      if (!tried.empty()) tried += ", ";
      tried += sharding_type_name(type);
      std::vector<ParameterSharding> candidates;
      switch (type) {
        case ST::DataParallel:
          candidates.push_back(data_parallel_sharding(t, W));
          break;
        case ST::TableWise:
          candidates.push_back(table_wise_sharding(t, least_loaded(used)[0]));
          break;
        case ST::ColumnWise: {
          const std::vector<int> ranks = least_loaded(used);
          for (int n = 2; n <= std::min<int64_t>(W, t.embedding_dim); ++n) {
            std::vector<int> pick(ranks.begin(), ranks.begin() + n);
            std::sort(pick.begin(), pick.end());
            candidates.push_back(column_wise_sharding(t, pick));
          }
          break;
        }
        case ST::RowWise:
          candidates.push_back(row_wise_sharding(t, W));
          break;
        case ST::TableRowWise: {
          // The node whose fullest rank stays lowest.
          std::vector<std::pair<int64_t, int>> nodes;
          for (int n = 0; n < W / L; ++n)
            nodes.push_back(
                {peak(used, increments(t, table_row_wise_sharding(t, n, L), W, o.dtype)), n});
          std::stable_sort(nodes.begin(), nodes.end());
          for (const auto& [p, n] : nodes) candidates.push_back(table_row_wise_sharding(t, n, L));
          break;
        }
      }
      for (ParameterSharding& p : candidates) {
        if (!fits(used, increments(t, p, W, o.dtype), o.memory_budget_bytes)) continue;
        p.reason = k == 0 ? why : why + "; " + sharding_type_name(prefs[0]) + " did not fit";
        chosen = std::move(p);
        break;
      }
    }
    if (!chosen) {
      std::ostringstream os;
      os << "embedding planner: table '" << t.name << "' [" << t.num_embeddings << " x "
         << t.embedding_dim << "] needs " << fmt_bytes(bytes) << " (weights + "
         << runtime::sparse::optimizer_name(t.optimizer.type) << " state) and fits no "
         << (c ? "allowed " : "") << "sharding (tried: " << (tried.empty() ? "none" : tried)
         << ") within the per-rank budget of " << fmt_bytes(o.memory_budget_bytes)
         << "; bytes already placed per rank:";
      for (int r = 0; r < W; ++r) os << " r" << r << " " << used[size_t(r)];
      os << ". Raise the budget, use more ranks, or allow row_wise / column_wise for it";
      throw Error(os.str());
    }
    const std::vector<int64_t> inc = increments(t, *chosen, W, o.dtype);
    for (int r = 0; r < W; ++r) used[size_t(r)] += inc[size_t(r)];
    plan.tables[t.name] = std::move(*chosen);
  }
  plan.validate(tables);
  return plan;
}

}  // namespace mt::parallel
