// DTensor view/reshape, cat and split: their sharding rules and local kernels.
#include <numeric>

#include "parallel/tensor/dtensor_ops.h"
#include "parallel/tensor/op_strategy.h"
#include "runtime/core/error.h"
#include "runtime/ops/join.h"

namespace mt::parallel::dtensor {

namespace {

using Shapes = std::vector<Shape>;
const Placement R = Replicate{};
const Placement P = Partial{ReduceOp::Sum};

int64_t product(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<int64_t>());
}

// The input dim each output dim's group starts at, for the groups of dims whose products match
// (e.g. [4, 6, 8] -> [4, 48]: {0 -> 0, 1 -> 1}); -1 for output dims that start no group.
std::vector<int64_t> group_starts(const Shape& from, const Shape& to) {
  std::vector<int64_t> start(to.size(), -1);
  size_t i = 0, j = 0;
  while (i < from.size() && j < to.size()) {
    const size_t i0 = i, j0 = j;
    int64_t a = from[i++], b = to[j++];
    while (a != b) {
      if (a < b && i < from.size()) {
        a *= from[i++];
      } else if (j < to.size()) {
        b *= to[j++];
      } else {
        break;
      }
    }
    start[j0] = int64_t(i0);
  }
  return start;
}

void register_rules() {
  // args: the target shape.
  OpRule view;
  view.strategies = [](const Shapes& s, const OpArgs& to) {
    std::vector<DimStrategy> out;
    const std::vector<int64_t> start = group_starts(s[0], Shape(to.begin(), to.end()));
    for (size_t b = 0; b < start.size(); ++b)
      if (start[b] >= 0) out.push_back({{Shard{start[b]}}, Shard{int64_t(b)}});
    out.push_back({{R}, R});
    out.push_back({{P}, P});
    return out;
  };
  view.output_shape = [](const Shapes&, const OpArgs& to) { return Shape(to.begin(), to.end()); };
  // A shard of a group's first input dim is the same elements as a shard of its first output dim
  // when the input dim splits evenly (then so does the output dim: the same chunks of the group).
  view.admits = [](const Shapes& s, const std::vector<std::vector<Placement>>& in,
                   const DeviceMesh& mesh) {
    for (size_t d = 0; d < in[0].size(); ++d) {
      const auto* sh = std::get_if<Shard>(&in[0][d]);
      if (sh == nullptr) continue;
      int64_t n = 1;
      for (size_t e = 0; e < in[0].size(); ++e)
        if (const auto* t = std::get_if<Shard>(&in[0][e]); t && t->dim == sh->dim)
          n *= mesh.size(int64_t(e));
      if (s[0][size_t(sh->dim)] % n != 0) return false;
    }
    return true;
  };
  register_op_rule("view", view);

  // args: {dim}. Every input must have the same placements.
  OpRule cat;
  cat.strategies = [](const Shapes& s, const OpArgs& a) {
    const size_t k = s.size();
    std::vector<DimStrategy> out{{std::vector<Placement>(k, R), R},
                                 {std::vector<Placement>(k, P), P}};
    for (int64_t d = 0; d < int64_t(s[0].size()); ++d)
      if (d != a[0]) out.push_back({std::vector<Placement>(k, Shard{d}), Shard{d}});
    return out;
  };
  cat.output_shape = [](const Shapes& s, const OpArgs& a) {
    Shape out = s[0];
    for (size_t i = 1; i < s.size(); ++i) out[size_t(a[0])] += s[i][size_t(a[0])];
    return out;
  };
  register_op_rule("cat", cat);

  // args: {dim, start, length}.
  OpRule narrow;
  narrow.strategies = [](const Shapes& s, const OpArgs& a) {
    std::vector<DimStrategy> out;
    for (int64_t d = 0; d < int64_t(s[0].size()); ++d)
      if (d != a[0]) out.push_back({{Shard{d}}, Shard{d}});
    out.push_back({{R}, R});
    out.push_back({{P}, P});
    return out;
  };
  narrow.output_shape = [](const Shapes& s, const OpArgs& a) {
    Shape out = s[0];
    out[size_t(a[0])] = a[2];
    return out;
  };
  register_op_rule("narrow", narrow);
}

void ensure_rules() {
  static const bool once = (register_rules(), true);
  (void)once;
}

}  // namespace

DTensor reshape(const DTensor& x, const Shape& shape) {
  ensure_rules();
  Shape to = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i] == -1) {
      MT_CHECK(infer < 0, "DTensor reshape: more than one -1 in ", shape);
      infer = int64_t(i);
    } else {
      known *= to[i];
    }
  }
  const int64_t total = product(x.global_shape);
  if (infer >= 0 && known > 0) to[size_t(infer)] = total / known;
  MT_CHECK(product(to) == total, "DTensor reshape: ", x.global_shape, " cannot become ", shape);
  const OpArgs args(to.begin(), to.end());
  return dispatch("view", {x}, args,
                  [mesh = x.mesh, to](const std::vector<Tensor>& l, const MeshStrategy& s) {
                    return l[0].reshape(local_piece(to, *mesh, s.output).shape);
                  });
}

DTensor cat(const std::vector<DTensor>& xs, int64_t dim) {
  ensure_rules();
  MT_CHECK(!xs.empty(), "DTensor cat: no tensors");
  const int64_t n = int64_t(xs[0].global_shape.size());
  const int64_t d = dim < 0 ? dim + n : dim;
  MT_CHECK(d >= 0 && d < n, "DTensor cat: dim ", dim, " out of range for ", n, "-D tensors");
  for (const DTensor& x : xs) {
    Shape a = x.global_shape, b = xs[0].global_shape;
    MT_CHECK(a.size() == b.size(), "DTensor cat: tensors of ", b, " and ", a);
    a[size_t(d)] = b[size_t(d)];
    MT_CHECK(a == b, "DTensor cat: tensors of ", xs[0].global_shape, " and ", x.global_shape,
             " differ outside dim ", d);
  }
  return dispatch("cat", xs, {d}, [d](const std::vector<Tensor>& l, const MeshStrategy&) {
    return runtime::cat(l, d);
  });
}

std::vector<DTensor> split(const DTensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  ensure_rules();
  const int64_t n = int64_t(x.global_shape.size());
  const int64_t d = dim < 0 ? dim + n : dim;
  MT_CHECK(d >= 0 && d < n, "DTensor split: dim ", dim, " out of range for a ", n, "-D tensor");
  MT_CHECK(std::accumulate(sizes.begin(), sizes.end(), int64_t(0)) == x.global_shape[size_t(d)],
           "DTensor split: sizes do not sum to dim ", d, " of ", x.global_shape);
  std::vector<DTensor> out;
  int64_t start = 0;
  for (int64_t len : sizes) {
    out.push_back(dispatch("narrow", {x}, {d, start, len},
                           [d, start, len](const std::vector<Tensor>& l, const MeshStrategy&) {
                             return l[0].narrow(d, start, len).contiguous();
                           }));
    start += len;
  }
  return out;
}

}  // namespace mt::parallel::dtensor
