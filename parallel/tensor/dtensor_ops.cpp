// DTensor ops: their sharding rules (registered once) and local kernels.
#include "parallel/tensor/dtensor_ops.h"

#include <algorithm>

#include "parallel/tensor/op_strategy.h"
#include "parallel/tensor/redistribute.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/rms_norm.h"
#include "runtime/ops/softmax.h"
#include "runtime/ops/swiglu.h"

namespace mt::parallel::dtensor {

namespace {

using Shapes = std::vector<Shape>;
const Placement R = Replicate{};
const Placement P = Partial{ReduceOp::Sum};

int64_t rank_of(const Shape& s) { return int64_t(s.size()); }

Shape first_shape(const Shapes& shapes, const OpArgs&) { return shapes[0]; }

// Every input the same: R, or S(d) for each d not in `reduced`.
std::vector<DimStrategy> same_shard(size_t inputs, int64_t ndim, std::vector<int64_t> reduced = {}) {
  std::vector<DimStrategy> out{{std::vector<Placement>(inputs, R), R}};
  for (int64_t d = 0; d < ndim; ++d) {
    if (std::find(reduced.begin(), reduced.end(), d) != reduced.end()) continue;
    out.push_back({std::vector<Placement>(inputs, Shard{d}), Shard{d}});
  }
  return out;
}

// a and b, b broadcast over a's leading dims (trailing alignment).
std::vector<DimStrategy> broadcast_rule(const Shapes& s, bool linear_in_both) {
  const int64_t na = rank_of(s[0]), nb = rank_of(s[1]), lead = na - nb;
  std::vector<DimStrategy> out{{{R, R}, R}};
  for (int64_t d = 0; d < na; ++d) {
    if (d < lead || s[1][size_t(d - lead)] == 1) {
      out.push_back({{Shard{d}, R}, Shard{d}});
    } else {
      out.push_back({{Shard{d}, Shard{d - lead}}, Shard{d}});
    }
  }
  if (linear_in_both) {
    out.push_back({{P, P}, P});
  } else {
    out.push_back({{P, R}, P});
    out.push_back({{R, P}, P});
  }
  return out;
}

void check_broadcast(const char* op, const DTensor& a, const DTensor& b) {
  const Shape& sa = a.global_shape;
  const Shape& sb = b.global_shape;
  bool ok = sb.size() <= sa.size();
  for (size_t i = 0; ok && i < sb.size(); ++i) {
    const size_t j = sa.size() - sb.size() + i;
    ok = sb[i] == sa[j] || sb[i] == 1;
  }
  MT_CHECK(ok, "DTensor ", op, ": b of shape ", sb, " does not broadcast to a's ", sa);
}

int64_t wrap(int64_t dim, int64_t ndim) { return dim < 0 ? dim + ndim : dim; }

void register_rules() {
  register_op_rule(
      "linear", {[](const Shapes& s, const OpArgs&) {
                   const int64_t n = rank_of(s[0]);
                   std::vector<DimStrategy> out{{{R, R}, R}};
                   for (int64_t d = 0; d + 1 < n; ++d) out.push_back({{Shard{d}, R}, Shard{d}});
                   out.push_back({{R, Shard{0}}, Shard{n - 1}});
                   out.push_back({{Shard{n - 1}, Shard{1}}, P});
                   out.push_back({{P, R}, P});
                   return out;
                 },
                 [](const Shapes& s, const OpArgs&) {
                   Shape out = s[0];
                   out.back() = s[1][0];
                   return out;
                 }});
  register_op_rule("add", {[](const Shapes& s, const OpArgs&) { return broadcast_rule(s, true); },
                           first_shape});
  register_op_rule("mul", {[](const Shapes& s, const OpArgs&) { return broadcast_rule(s, false); },
                           first_shape});
  register_op_rule("swiglu", {[](const Shapes& s, const OpArgs&) {
                                return same_shard(2, rank_of(s[0]));
                              },
                              first_shape});
  register_op_rule("rms_norm", {[](const Shapes& s, const OpArgs&) {
                                  const int64_t n = rank_of(s[0]);
                                  std::vector<DimStrategy> out{{{R, R}, R}};
                                  for (int64_t d = 0; d + 1 < n; ++d)
                                    out.push_back({{Shard{d}, R}, Shard{d}});
                                  return out;
                                },
                                first_shape});
  register_op_rule("softmax", {[](const Shapes& s, const OpArgs& a) {
                                 return same_shard(1, rank_of(s[0]), {a[0]});
                               },
                               first_shape});
  register_op_rule("sum", {[](const Shapes& s, const OpArgs& a) {
                             // Shards first: a tie (a shard turned Partial costs no bytes
                             // but a whole-size tensor) goes to keeping the shard.
                             const int64_t n = rank_of(s[0]), k = a[0];
                             std::vector<DimStrategy> out;
                             for (int64_t d = 0; d < n; ++d)
                               if (d != k) out.push_back({{Shard{d}}, Shard{d < k ? d : d - 1}});
                             out.push_back({{Shard{k}}, P});
                             out.push_back({{R}, R});
                             out.push_back({{P}, P});
                             return out;
                           },
                           [](const Shapes& s, const OpArgs& a) {
                             Shape out = s[0];
                             out.erase(out.begin() + a[0]);
                             return out;
                           }});
  register_op_rule("transpose", {[](const Shapes& s, const OpArgs& a) {
                                   const int64_t n = rank_of(s[0]);
                                   std::vector<DimStrategy> out;
                                   for (int64_t d = 0; d < n; ++d) {
                                     const int64_t e = d == a[0] ? a[1] : d == a[1] ? a[0] : d;
                                     out.push_back({{Shard{d}}, Shard{e}});
                                   }
                                   out.push_back({{R}, R});
                                   out.push_back({{P}, P});
                                   return out;
                                 },
                                 [](const Shapes& s, const OpArgs& a) {
                                   Shape out = s[0];
                                   std::swap(out[size_t(a[0])], out[size_t(a[1])]);
                                   return out;
                                 }});
  register_op_rule("embedding", {[](const Shapes& s, const OpArgs&) {
                                   const int64_t n = rank_of(s[1]);
                                   std::vector<DimStrategy> out{{{R, R}, R},
                                                                {{Shard{1}, R}, Shard{n}},
                                                                {{Shard{0}, R}, P}};
                                   for (int64_t d = 0; d < n; ++d)
                                     out.push_back({{R, Shard{d}}, Shard{d}});
                                   return out;
                                 },
                                 [](const Shapes& s, const OpArgs&) {
                                   Shape out = s[1];
                                   out.push_back(s[0][1]);
                                   return out;
                                 }});
  register_op_rule("scaled_dot_product_attention",
                   {[](const Shapes&, const OpArgs&) {
                      return std::vector<DimStrategy>{{{R, R, R}, R},
                                                      {{Shard{0}, Shard{0}, Shard{0}}, Shard{0}},
                                                      {{Shard{1}, Shard{1}, Shard{1}}, Shard{1}}};
                    },
                    [](const Shapes& s, const OpArgs&) {
                      Shape out = s[0];
                      out.back() = s[2].back();
                      return out;
                    },
                    false,
                    // Every rank's query heads are exactly the ones its kv heads serve (with
                    // g = Hq / Hkv query heads per kv head): each cut of the heads, in order,
                    // must give g times as many query heads as kv heads per chunk.
                    [](const Shapes& s, const std::vector<std::vector<Placement>>& in,
                       const DeviceMesh& mesh) {
                      const int64_t hq = s[0][1], hkv = s[1][1];
                      if (hkv == 0 || hq % hkv != 0) return false;
                      int64_t cq = hq, ckv = hkv;
                      for (int64_t d : shard_order(mesh, in[0])) {
                        if (std::get<Shard>(in[0][size_t(d)]).dim != 1) continue;
                        cq = chunk_range(cq, mesh.size(d), 0).padded_length;
                        ckv = chunk_range(ckv, mesh.size(d), 0).padded_length;
                        if (cq != (hq / hkv) * ckv) return false;
                      }
                      return true;
                    }});
  // args: {reduction (0 none, 1 sum)}
  register_op_rule("cross_entropy",
                   {[](const Shapes&, const OpArgs& a) {
                      const bool summed = a[0] == 1;
                      return std::vector<DimStrategy>{{{R, R}, R},
                                                      {{Shard{0}, Shard{0}}, summed ? P : Shard{0}},
                                                      {{Shard{1}, R}, R}};
                    },
                    [](const Shapes& s, const OpArgs& a) { return a[0] == 1 ? Shape{} : Shape{s[1]}; },
                    /*whole_output_grad=*/true});
}

void ensure_rules() {
  static const bool once = (register_rules(), true);
  (void)once;
}

// Mesh dims on which input `k` of the strategy is Shard(dim).
std::vector<size_t> dims_sharding(const MeshStrategy& s, size_t k, int64_t dim) {
  std::vector<size_t> out;
  for (size_t d = 0; d < s.inputs[k].size(); ++d) {
    const auto* sh = std::get_if<Shard>(&s.inputs[k][d]);
    if (sh && sh->dim == dim) out.push_back(d);
  }
  return out;
}

// Sums a local tensor over the mesh dims in `dims` (differentiable; the gradient of the result
// is whole on every rank and goes back unchanged).
Tensor sum_over(const Tensor& local, const std::shared_ptr<DeviceMesh>& mesh,
                const std::vector<Placement>& others, const std::vector<size_t>& dims,
                const Shape& global) {
  std::vector<Placement> partial = others, whole = others;
  for (size_t d : dims) {
    partial[d] = P;
    whole[d] = R;
  }
  const DTensor x = from_local(local, mesh, partial, global);
  return to_local(redistribute(x, whole, whole_grad_placements(whole), "dtensor.loss_parallel"));
}

}  // namespace

DTensor linear(const DTensor& x, const DTensor& weight) {
  ensure_rules();
  MT_CHECK(weight.global_shape.size() == 2 && !x.global_shape.empty() &&
               x.global_shape.back() == weight.global_shape[1],
           "DTensor linear: x of shape ", x.global_shape, " and weight of shape ",
           weight.global_shape, " do not match ([..., in] and [out, in])");
  return dispatch("linear", {x, weight}, {}, [](const std::vector<Tensor>& l, const MeshStrategy&) {
    return runtime::linear(l[0], l[1]);
  });
}

DTensor add(const DTensor& a, const DTensor& b) {
  ensure_rules();
  check_broadcast("add", a, b);
  return dispatch("add", {a, b}, {}, [](const std::vector<Tensor>& l, const MeshStrategy&) {
    return runtime::add(l[0], l[1]);
  });
}

DTensor mul(const DTensor& a, const DTensor& b) {
  ensure_rules();
  check_broadcast("mul", a, b);
  return dispatch("mul", {a, b}, {}, [](const std::vector<Tensor>& l, const MeshStrategy&) {
    return runtime::mul(l[0], l[1]);
  });
}

DTensor swiglu(const DTensor& gate, const DTensor& up) {
  ensure_rules();
  MT_CHECK(gate.global_shape == up.global_shape, "DTensor swiglu: gate ", gate.global_shape,
           " and up ", up.global_shape, " differ");
  return dispatch("swiglu", {gate, up}, {}, [](const std::vector<Tensor>& l, const MeshStrategy&) {
    return runtime::swiglu(l[0], l[1]);
  });
}

DTensor rms_norm(const DTensor& x, const DTensor& weight, double eps) {
  ensure_rules();
  return dispatch("rms_norm", {x, weight}, {},
                  [eps](const std::vector<Tensor>& l, const MeshStrategy&) {
                    return runtime::rms_norm(l[0], l[1], eps);
                  });
}

DTensor softmax(const DTensor& x, int64_t dim) {
  ensure_rules();
  const int64_t d = wrap(dim, int64_t(x.global_shape.size()));
  return dispatch("softmax", {x}, {d}, [d](const std::vector<Tensor>& l, const MeshStrategy&) {
    return runtime::softmax(l[0], d);
  });
}

DTensor sum(const DTensor& x, int64_t dim) {
  ensure_rules();
  const int64_t d = wrap(dim, int64_t(x.global_shape.size()));
  return dispatch("sum", {x}, {d}, [d](const std::vector<Tensor>& l, const MeshStrategy&) {
    return runtime::sum(l[0], {d});
  });
}

DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1) {
  ensure_rules();
  const int64_t n = int64_t(x.global_shape.size());
  const int64_t a = wrap(dim0, n), b = wrap(dim1, n);
  return dispatch("transpose", {x}, {a, b}, [a, b](const std::vector<Tensor>& l, const MeshStrategy&) {
    return l[0].transpose(a, b).contiguous();
  });
}

LocalIds local_embedding_ids(const Tensor& ids, int64_t offset, int64_t rows, runtime::DType dtype) {
  runtime::NoGradGuard no_grad;
  const Tensor shifted = runtime::sub(ids.to(runtime::DType::I64), double(offset));
  const Tensor held = runtime::logical_and(runtime::ge(shifted, 0.0), runtime::lt(shifted, double(rows)));
  return {runtime::where(held, shifted, runtime::zeros_like(shifted)), held.to(dtype)};
}

DTensor embedding(const DTensor& weight, const DTensor& ids) {
  ensure_rules();
  MT_CHECK(weight.global_shape.size() == 2, "DTensor embedding: expected a [V, D] weight, got ",
           weight.global_shape);
  return dispatch("embedding", {weight, ids}, {},
                  [mesh = weight.mesh, global = weight.global_shape](const std::vector<Tensor>& l,
                                                                     const MeshStrategy& s) {
                    if (dims_sharding(s, 0, 0).empty()) return runtime::embedding(l[0], l[1]);
                    // Row-wise: this rank's rows only, zeros for the ids it does not hold.
                    const int64_t offset = local_piece(global, *mesh, s.inputs[0]).offset[0];
                    const LocalIds local = local_embedding_ids(l[1], offset, l[0].size(0), l[0].dtype());
                    return runtime::mul(runtime::embedding(l[0], local.ids),
                                        local.mask.unsqueeze(-1));
                  });
}

namespace {

// Cross-entropy rows over logits whose columns are split over `vocab_dims` of the mesh (this
// rank's columns start at `offset`); `rows` places the [N] row values on the other mesh dims.
Tensor vocab_split_cross_entropy(const Tensor& logits, const Tensor& targets,
                                 const std::shared_ptr<DeviceMesh>& mesh,
                                 const std::vector<Placement>& rows,
                                 const std::vector<size_t>& vocab_dims, int64_t offset,
                                 int64_t global_rows, int64_t ignore_index,
                                 runtime::Reduction reduction) {
  const runtime::DType acc = runtime::accumulation_dtype(logits.dtype());
  const Tensor z = logits.to(acc);
  Tensor m;
  {
    runtime::NoGradGuard no_grad;
    m = runtime::amax(z.detach(), {1}, /*keepdim=*/true).contiguous();
    for (size_t d : vocab_dims) mesh->group(int64_t(d)).all_reduce(m, ReduceOp::Max, "loss_parallel.max");
  }
  const Tensor e = runtime::exp(runtime::sub(z, m));
  const LocalIds local = local_embedding_ids(targets, offset, logits.size(1), acc);
  const Tensor valid = runtime::ne(targets.to(runtime::DType::I64), double(ignore_index)).to(acc);
  const Tensor picked = runtime::gather(z, 1, local.ids.unsqueeze(1)).select(1, 0);
  const Shape n{global_rows};
  const Tensor sum_exp = sum_over(runtime::sum(e, {1}), mesh, rows, vocab_dims, n);
  const Tensor target = sum_over(runtime::mul(picked, local.mask), mesh, rows, vocab_dims, n);
  const Tensor per_row = runtime::mul(
      runtime::sub(runtime::add(runtime::log(sum_exp), m.select(1, 0)), target), valid);
  return reduction == runtime::Reduction::Sum ? runtime::sum(per_row) : per_row;
}

void check_targets(const Tensor& targets, int64_t vocab, int64_t ignore_index) {
  if (!targets.device().is_cpu()) return;  // checked on the host only: no device sync
  for (int64_t t : targets.to(runtime::DType::I64).contiguous().to_vector<int64_t>()) {
    MT_CHECK(t == ignore_index || (t >= 0 && t < vocab), "loss parallel cross_entropy: target ",
             t, " outside [0, ", vocab, ") (ignore_index ", ignore_index, ")");
  }
}

}  // namespace

DTensor cross_entropy(const DTensor& logits, const DTensor& targets, int64_t ignore_index,
                      runtime::Reduction reduction) {
  ensure_rules();
  MT_CHECK(logits.global_shape.size() == 2 && targets.global_shape.size() == 1 &&
               targets.global_shape[0] == logits.global_shape[0],
           "DTensor cross_entropy: expected logits [N, V] and targets [N], got ",
           logits.global_shape, " and ", targets.global_shape);
  MT_CHECK(reduction != runtime::Reduction::Mean,
           "DTensor cross_entropy: reduction Mean is not supported (use Sum and divide by the "
           "global count of valid targets)");
  const int64_t summed = reduction == runtime::Reduction::Sum ? 1 : 0;
  return dispatch(
      "cross_entropy", {logits, targets}, {summed},
      [mesh = logits.mesh, global = logits.global_shape, ignore_index, reduction](
          const std::vector<Tensor>& l, const MeshStrategy& s) {
        const std::vector<size_t> vocab = dims_sharding(s, 0, 1);
        if (vocab.empty()) {
          return runtime::cross_entropy(l[0], l[1], ignore_index, reduction,
                                        runtime::accumulation_dtype(l[0].dtype()));
        }
        check_targets(l[1], global[1], ignore_index);
        std::vector<Placement> rows(s.inputs[0].size(), R);
        for (size_t d : dims_sharding(s, 0, 0)) rows[d] = Shard{0};
        const int64_t offset = local_piece(global, *mesh, s.inputs[0]).offset[1];
        return vocab_split_cross_entropy(l[0], l[1], mesh, rows, vocab, offset, global[0],
                                         ignore_index, reduction);
      });
}

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& targets,
                                    std::shared_ptr<DeviceMesh> vocab_mesh, int64_t vocab_size,
                                    int64_t ignore_index, runtime::Reduction reduction) {
  MT_CHECK(vocab_mesh != nullptr && vocab_mesh->ndim() == 1,
           "vocab_parallel_cross_entropy: expected a 1-D mesh");
  MT_CHECK(local_logits.dim() >= 1 && targets.numel() * local_logits.size(-1) == local_logits.numel(),
           "vocab_parallel_cross_entropy: logits of shape ", local_logits.shape(),
           " do not match targets of shape ", targets.shape());
  const int64_t n = targets.numel();
  const DTensor logits = from_local(local_logits.reshape({n, local_logits.size(-1)}), vocab_mesh,
                                    {Shard{1}}, Shape{n, vocab_size});
  const DTensor t = from_local(targets.reshape({n}), vocab_mesh, {R});
  Tensor loss = to_local(cross_entropy(logits, t, ignore_index, reduction));
  return reduction == runtime::Reduction::None ? loss.reshape(targets.shape()) : loss;
}

DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                     bool causal) {
  ensure_rules();
  return dispatch("scaled_dot_product_attention", {q, k, v}, {},
                  [causal](const std::vector<Tensor>& l, const MeshStrategy&) {
                    if (l[0].numel() == 0 || l[1].numel() == 0) {
                      // This rank holds no heads (or rows): an empty piece, with (empty)
                      // gradients for its inputs.
                      Shape shape = l[0].shape();
                      shape.back() = l[2].size(-1);
                      Tensor zero = runtime::mul(
                          runtime::add(runtime::add(runtime::sum(l[0]), runtime::sum(l[1])),
                                       runtime::sum(l[2])),
                          0.0);
                      return runtime::add(runtime::zeros(shape, l[0].options().with_requires_grad(false)),
                                          zero);
                    }
                    return runtime::scaled_dot_product_attention(l[0], l[1], l[2], causal);
                  });
}

}  // namespace mt::parallel::dtensor
