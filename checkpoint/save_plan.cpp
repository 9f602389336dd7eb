// Save planning: validation of the gathered pieces and the writer assignment (see save_plan.h).
#include "checkpoint/save_plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

#include "runtime/core/error.h"

namespace mt::checkpoint {

using runtime::DType;
using runtime::Shape;

namespace {

std::string join(const Shape& s) {
  std::ostringstream o;
  for (size_t i = 0; i < s.size(); ++i) o << (i ? "," : "") << s[i];
  return o.str();
}

Shape split_shape(const std::string& text) {
  Shape s;
  std::istringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) s.push_back(std::stoll(part));
  return s;
}

bool overlaps(const ChunkMeta& a, const ChunkMeta& b) {
  for (size_t d = 0; d < a.offset.size(); ++d) {
    if (a.offset[d] + a.sizes[d] <= b.offset[d] || b.offset[d] + b.sizes[d] <= a.offset[d]) {
      return false;
    }
  }
  return true;
}

using ChunkKey = std::tuple<std::string, Shape, Shape>;  // fqn, offset, sizes

// Checks one tensor's distinct chunks (all with the same fqn) tile it exactly.
void check_tiling(const std::vector<const ChunkMeta*>& chunks) {
  const ChunkMeta& first = *chunks.front();
  const int64_t numel = runtime::numel_of(first.global_shape);
  int64_t covered = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkMeta& c = *chunks[i];
    bool inside = c.offset.size() == c.global_shape.size() && c.sizes.size() == c.offset.size();
    for (size_t d = 0; inside && d < c.offset.size(); ++d) {
      inside = c.offset[d] >= 0 && c.sizes[d] >= 0 && c.offset[d] + c.sizes[d] <= c.global_shape[d];
    }
    MT_CHECK(inside, "checkpoint save: tensor ", c.fqn, ": a piece at offset [", join(c.offset),
             "] of shape [", join(c.sizes), "] lies outside its global shape [",
             join(c.global_shape), "]");
    covered += runtime::numel_of(c.sizes);
    for (size_t j = 0; j < i; ++j) {
      if (runtime::numel_of(c.sizes) == 0 || runtime::numel_of(chunks[j]->sizes) == 0) continue;
      MT_CHECK(!overlaps(c, *chunks[j]), "checkpoint save: tensor ", c.fqn,
               ": pieces at offsets [", join(c.offset), "] and [", join(chunks[j]->offset),
               "] overlap without being the same piece");
    }
  }
  MT_CHECK(covered == numel, "checkpoint save: tensor ", first.fqn, ": the ranks' pieces cover ",
           covered, " of its ", numel, " elements (global shape [", join(first.global_shape),
           "])");
}

}  // namespace

int64_t ChunkMeta::bytes() const {
  return runtime::numel_of(sizes) * int64_t(runtime::dtype_size(dtype));
}

std::string encode_chunks(const std::vector<ChunkMeta>& chunks) {
  std::ostringstream out;
  for (const ChunkMeta& c : chunks) {
    MT_CHECK(c.fqn.find_first_of("\t\n") == std::string::npos && !c.fqn.empty(),
             "checkpoint: tensor names must be non-empty without tabs or newlines, got '", c.fqn,
             "'");
    out << c.fqn << '\t' << int(c.dtype) << '\t' << c.global_shape.size() << '\t'
        << join(c.global_shape) << '\t' << join(c.offset) << '\t' << join(c.sizes) << '\n';
  }
  return out.str();
}

std::vector<ChunkMeta> decode_chunks(const std::string& text) {
  std::vector<ChunkMeta> chunks;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    std::string part;
    while (std::getline(fields, part, '\t')) f.push_back(part);
    f.resize(6);  // trailing empty fields (0-d tensors) are dropped by getline
    ChunkMeta c;
    c.fqn = f[0];
    c.dtype = DType(std::stoi(f[1]));
    const size_t rank = std::stoul(f[2]);
    c.global_shape = split_shape(f[3]);
    c.offset = split_shape(f[4]);
    c.sizes = split_shape(f[5]);
    MT_CHECK(c.global_shape.size() == rank && c.offset.size() == rank && c.sizes.size() == rank,
             "checkpoint save: malformed piece description of ", c.fqn);
    chunks.push_back(std::move(c));
  }
  return chunks;
}

SavePlan plan_save(const std::vector<std::vector<ChunkMeta>>& per_rank) {
  // Distinct chunks and who holds each.
  std::map<ChunkKey, std::vector<std::pair<int, int>>> holders;  // -> (rank, local index)
  std::map<std::string, const ChunkMeta*> tensor_of;              // fqn -> first description
  for (size_t r = 0; r < per_rank.size(); ++r) {
    std::map<std::string, int> seen;
    for (size_t i = 0; i < per_rank[r].size(); ++i) {
      const ChunkMeta& c = per_rank[r][i];
      MT_CHECK(seen.emplace(c.fqn, 0).second, "checkpoint save: rank ", r,
               " holds two pieces of tensor ", c.fqn);
      auto [it, fresh] = tensor_of.emplace(c.fqn, &c);
      const ChunkMeta& t = *it->second;
      MT_CHECK(fresh || (t.dtype == c.dtype && t.global_shape == c.global_shape),
               "checkpoint save: tensor ", c.fqn, " is ", runtime::dtype_name(t.dtype), " [",
               join(t.global_shape), "] on one rank and ", runtime::dtype_name(c.dtype), " [",
               join(c.global_shape), "] on rank ", r);
      holders[{c.fqn, c.offset, c.sizes}].emplace_back(int(r), int(i));
    }
  }
  std::map<std::string, std::vector<const ChunkMeta*>> by_tensor;
  for (const auto& [key, who] : holders) {
    by_tensor[std::get<0>(key)].push_back(&per_rank[size_t(who[0].first)][size_t(who[0].second)]);
  }
  for (const auto& [fqn, chunks] : by_tensor) check_tiling(chunks);

  // Writers: single holders first, then shared chunks largest first to the least loaded holder.
  std::vector<int64_t> load(per_rank.size(), 0);
  SavePlan plan;
  plan.writes.resize(per_rank.size());
  std::vector<std::pair<const ChunkKey*, const std::vector<std::pair<int, int>>*>> shared;
  std::map<ChunkKey, std::pair<int, int>> writer;
  for (const auto& [key, who] : holders) {
    if (who.size() == 1) {
      writer[key] = who[0];
      load[size_t(who[0].first)] += per_rank[size_t(who[0].first)][size_t(who[0].second)].bytes();
    } else {
      shared.emplace_back(&key, &who);
    }
  }
  auto bytes_of = [&](const std::vector<std::pair<int, int>>& who) {
    return per_rank[size_t(who[0].first)][size_t(who[0].second)].bytes();
  };
  std::stable_sort(shared.begin(), shared.end(),
                   [&](const auto& a, const auto& b) { return bytes_of(*a.second) > bytes_of(*b.second); });
  for (const auto& [key, who] : shared) {
    std::pair<int, int> best = (*who)[0];
    for (const auto& h : *who) {
      if (load[size_t(h.first)] < load[size_t(best.first)]) best = h;
    }
    writer[*key] = best;
    load[size_t(best.first)] += bytes_of(*who);
  }
  for (const auto& [key, w] : writer) {  // map order: fqn, then offset
    plan.chunks.push_back({per_rank[size_t(w.first)][size_t(w.second)], w.first, w.second});
    plan.writes[size_t(w.first)].push_back(w.second);
  }
  for (auto& w : plan.writes) std::sort(w.begin(), w.end());
  return plan;
}

std::string rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.h5", rank);
  return name;
}

std::string chunk_dataset_path(const std::string& fqn) { return "/tensors/" + fqn; }

}  // namespace mt::checkpoint
