// Redistribution planning, its collectives, and the autograd around DTensor boundaries.
#include "parallel/tensor/redistribute.h"

#include <algorithm>

#include "runtime/autograd/function.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"

namespace mt::parallel {

namespace {

using Placements = std::vector<Placement>;

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// This rank's piece shape with every cut rounded up to the padded chunk: the same on all ranks,
// so that plans chosen by size agree everywhere.
Shape padded_piece_shape(const Shape& global, const DeviceMesh& mesh, const Placements& pl) {
  Shape shape = global;
  for (int64_t i : shard_order(mesh, pl)) {
    const size_t d = size_t(*sharded_dim(pl[size_t(i)]));
    shape[d] = chunk_range(shape[d], mesh.size(i), 0).padded_length;
  }
  return shape;
}

// The mesh dims cutting tensor dim `d`, in the order their cuts apply.
std::vector<int64_t> cuts_of(const DeviceMesh& mesh, const Placements& pl, int64_t d) {
  std::vector<int64_t> out;
  for (int64_t i : shard_order(mesh, pl))
    if (*sharded_dim(pl[size_t(i)]) == d) out.push_back(i);
  return out;
}

bool is_sum(const Placement& p) {
  const auto* q = std::get_if<Partial>(&p);
  return q != nullptr && q->op == ReduceOp::Sum;
}

class Planner {
 public:
  Planner(const Shape& global, int64_t element_size, const DeviceMesh& mesh, const Placements& from,
          const Placements& to)
      : global_(global), element_size_(element_size), mesh_(mesh), to_(to), cur_(from) {}

  void add(RedistributeKind kind, int64_t i, Placement next) {
    RedistributeStep step{kind, i, cur_, cur_, 0};
    step.after[size_t(i)] = std::move(next);
    const int64_t before = numel_of(padded_piece_shape(global_, mesh_, step.before));
    const int64_t after = numel_of(padded_piece_shape(global_, mesh_, step.after));
    switch (kind) {
      case RedistributeKind::AllGather: step.bytes = after * element_size_; break;
      case RedistributeKind::ReduceScatter:
      case RedistributeKind::AllReduce:
      case RedistributeKind::AllToAll: step.bytes = before * element_size_; break;
      default: step.bytes = 0;
    }
    cur_ = step.after;
    plan_.steps.push_back(std::move(step));
  }

  void all_reduces() {
    for (size_t i = 0; i < cur_.size(); ++i)
      if (is_partial(cur_[i]) && is_replicate(to_[i]))
        add(RedistributeKind::AllReduce, int64_t(i), Replicate{});
  }

  RedistributePlan finish() { return std::move(plan_); }
  const Placements& current() const { return cur_; }
  const Placements& target() const { return to_; }
  const DeviceMesh& mesh() const { return mesh_; }

 private:
  Shape global_;
  int64_t element_size_;
  const DeviceMesh& mesh_;
  Placements to_, cur_;
  RedistributePlan plan_;
};

void check_pair(const Shape& global, const DeviceMesh& mesh, const Placements& from,
                const Placements& to) {
  // Both lists must be valid for the shape and mesh (throws naming the problem).
  (void)local_piece(global, mesh, from);
  (void)local_piece(global, mesh, to);
  for (size_t i = 0; i < from.size(); ++i) {
    const auto* a = std::get_if<Partial>(&from[i]);
    const auto* b = std::get_if<Partial>(&to[i]);
    if (a && b && a->op != b->op) {
      MT_FAIL("redistribute ", placements_name(from), " -> ", placements_name(to), " on ",
              mesh.describe(), ": mesh dim ", i, " goes from ", placement_name(from[i]), " to ",
              placement_name(to[i]), ", which is not sound: partial sums and averages differ by "
              "the group size (each rank's value would have to be rescaled, which rounds), and "
              "partial maxima or minima have no sum; redistribute to Replicate first");
    }
    if (!a && b && b->op != ReduceOp::Sum && !is_replicate(from[i])) {
      MT_FAIL("redistribute ", placements_name(from), " -> ", placements_name(to), ": only a "
              "Replicate mesh dim can become ", placement_name(to[i]), " (mesh dim ", i, " is ",
              placement_name(from[i]), ")");
    }
  }
}

// The plan with all-reduces placed before the gathers (early) or after the chunks (late).
RedistributePlan make_plan(const Shape& global, int64_t element_size, const DeviceMesh& mesh,
                           const Placements& from, const Placements& to, bool early_all_reduce) {
  Planner p(global, element_size, mesh, from, to);
  if (early_all_reduce) p.all_reduces();
  const int64_t ndim = int64_t(global.size());
  std::vector<std::vector<int64_t>> undo(static_cast<size_t>(ndim)), apply(static_cast<size_t>(ndim));
  for (int64_t d = 0; d < ndim; ++d) {
    const std::vector<int64_t> a = cuts_of(mesh, from, d), b = cuts_of(mesh, to, d);
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    undo[size_t(d)].assign(a.rbegin(), a.rend() - int64_t(k));
    apply[size_t(d)].assign(b.begin() + int64_t(k), b.end());
  }
  // A shard that moves to another tensor dim on one mesh dim, nothing else changing on either
  // dim: one all-to-all.
  std::vector<bool> fused(from.size(), false);
  for (size_t i = 0; i < from.size(); ++i) {
    const auto* a = std::get_if<Shard>(&from[i]);
    const auto* b = std::get_if<Shard>(&to[i]);
    if (!a || !b || a->dim == b->dim) continue;
    // Only when nothing else moves on either dim: then i is the last cut of d before and of e
    // after, which is what one all-to-all does.
    if (undo[size_t(a->dim)] == std::vector<int64_t>{int64_t(i)} &&
        apply[size_t(b->dim)] == std::vector<int64_t>{int64_t(i)} && undo[size_t(b->dim)].empty() &&
        apply[size_t(a->dim)].empty()) {
      fused[i] = true;
      undo[size_t(a->dim)].clear();
      apply[size_t(b->dim)].clear();
    }
  }
  for (size_t i = 0; i < from.size(); ++i)
    if (fused[i]) p.add(RedistributeKind::AllToAll, int64_t(i), to[i]);
  for (int64_t d = 0; d < ndim; ++d) {
    for (int64_t i : undo[size_t(d)]) {
      if (is_sum(to[size_t(i)])) {
        p.add(RedistributeKind::PadToPartial, i, to[size_t(i)]);
      } else {
        p.add(RedistributeKind::AllGather, i, Replicate{});
      }
    }
  }
  for (int64_t d = 0; d < ndim; ++d) {
    for (int64_t i : apply[size_t(d)]) {
      const Placement& now = p.current()[size_t(i)];
      p.add(is_partial(now) ? RedistributeKind::ReduceScatter : RedistributeKind::Chunk, i,
            to[size_t(i)]);
    }
  }
  if (!early_all_reduce) p.all_reduces();
  for (size_t i = 0; i < to.size(); ++i) {
    if (is_partial(to[i]) && is_replicate(p.current()[i]))
      p.add(RedistributeKind::ToPartial, int64_t(i), to[i]);
  }
  MT_CHECK(p.current() == to, "redistribute: internal error planning ", placements_name(from),
           " -> ", placements_name(to), ": reached ", placements_name(p.current()));
  return p.finish();
}

// ---- the steps ------------------------------------------------------------------------------

Tensor chunk_of(const Tensor& local, int64_t dim, const DeviceMesh& mesh, int64_t i) {
  const ChunkRange r = chunk_range(local.size(dim), mesh.size(i), mesh.coordinate(i));
  return local.narrow(dim, r.offset, r.length).clone();
}

Tensor reduce_scatter_dim(ProcessGroup& group, const Tensor& local, int64_t dim, ReduceOp op,
                          int64_t coordinate, const std::string& name) {
  const int64_t n = group.size(), size = local.size(dim);
  const int64_t padded = chunk_range(size, n, 0).padded_length;
  Tensor rows = local.transpose(0, dim).contiguous();
  Shape shape = rows.shape();
  shape[0] = padded * n;
  Tensor in = runtime::zeros(shape, rows.options().with_requires_grad(false));
  if (size > 0) in.narrow(0, 0, size).copy_(rows);
  shape[0] = padded;
  Tensor out = runtime::empty(shape, in.options());
  group.reduce_scatter_into(out, in, op, name);
  const int64_t len = chunk_range(size, n, coordinate).length;
  return out.narrow(0, 0, len).transpose(0, dim).contiguous();
}

// Shard(d) -> Shard(e) on one mesh dim: rank j receives every rank's d-piece of its e-chunk.
Tensor all_to_all_dims(ProcessGroup& group, const Tensor& local, int64_t d, int64_t size_d,
                       int64_t e, int64_t coordinate, const std::string& name) {
  const int64_t n = group.size(), size_e = local.size(e);
  const int64_t pd = chunk_range(size_d, n, 0).padded_length;
  const int64_t pe = chunk_range(size_e, n, 0).padded_length;
  Shape block = local.shape();
  block[size_t(d)] = pd;
  block[size_t(e)] = pe;
  Shape stacked = block;
  stacked.insert(stacked.begin(), n);
  Tensor in = runtime::zeros(stacked, local.options().with_requires_grad(false));
  for (int64_t j = 0; j < n; ++j) {
    const ChunkRange r = chunk_range(size_e, n, j);
    if (r.length == 0 || local.size(d) == 0) continue;
    in.select(0, j).narrow(e, 0, r.length).narrow(d, 0, local.size(d)).copy_(local.narrow(e, r.offset, r.length));
  }
  Tensor out = runtime::empty(stacked, in.options());
  group.all_to_all_single(out, in, {}, {}, name);
  const int64_t my_e = chunk_range(size_e, n, coordinate).length;
  std::vector<Tensor> pieces;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t len = chunk_range(size_d, n, j).length;
    if (len > 0) pieces.push_back(out.select(0, j).narrow(d, 0, len).narrow(e, 0, my_e));
  }
  if (pieces.empty()) return out.select(0, 0).narrow(d, 0, 0).narrow(e, 0, my_e).contiguous();
  return runtime::cat(pieces, d).contiguous();
}

Tensor run_step(const Tensor& local, const Shape& global, const DeviceMesh& mesh,
                const RedistributeStep& step, const std::string& name) {
  const int64_t i = step.mesh_dim;
  ProcessGroup& group = mesh.group(i);
  const Placement& before = step.before[size_t(i)];
  const Placement& after = step.after[size_t(i)];
  switch (step.kind) {
    case RedistributeKind::AllGather: {
      const int64_t d = *sharded_dim(before);
      return gather_shards(group, local, d, sizes_before_cut(global, mesh, step.before)[size_t(i)],
                           name);
    }
    case RedistributeKind::Chunk: return chunk_of(local, *sharded_dim(after), mesh, i);
    case RedistributeKind::ReduceScatter:
      return reduce_scatter_dim(group, local, *sharded_dim(after), std::get<Partial>(before).op,
                                mesh.coordinate(i), name);
    case RedistributeKind::AllReduce: {
      Tensor out = local.contiguous().clone();
      group.all_reduce(out, std::get<Partial>(before).op, name);
      return out;
    }
    case RedistributeKind::AllToAll:
      return all_to_all_dims(group, local, *sharded_dim(before),
                             sizes_before_cut(global, mesh, step.before)[size_t(i)],
                             *sharded_dim(after), mesh.coordinate(i), name);
    case RedistributeKind::PadToPartial: {
      const int64_t d = *sharded_dim(before);
      const int64_t size = sizes_before_cut(global, mesh, step.before)[size_t(i)];
      const ChunkRange r = chunk_range(size, mesh.size(i), mesh.coordinate(i));
      Shape shape = local.shape();
      shape[size_t(d)] = size;
      Tensor out = runtime::zeros(shape, local.options().with_requires_grad(false));
      if (r.length > 0) out.narrow(d, r.offset, r.length).copy_(local);
      return out;
    }
    case RedistributeKind::ToPartial: {
      Tensor out = local.contiguous().clone();
      if (std::get<Partial>(after).op == ReduceOp::Sum && mesh.coordinate(i) != 0) out.zero_();
      return out;
    }
  }
  MT_FAIL("redistribute: unknown step");
}

void check_differentiable(const Placements& grad, const char* what, const Placements& forward) {
  for (const Placement& p : forward) {
    const auto* q = std::get_if<Partial>(&p);
    MT_CHECK(q == nullptr || q->op == ReduceOp::Sum, "redistribute: no gradient through ",
             placement_name(p), " (", what, " ", placements_name(forward),
             "): only Partial(sum) has one; detach the tensor or reduce it first");
  }
  for (const Placement& p : grad) {
    const auto* q = std::get_if<Partial>(&p);
    MT_CHECK(q == nullptr || q->op == ReduceOp::Sum, "redistribute: no gradient through ",
             placement_name(p), " (", what, " ", placements_name(forward),
             "): only Partial(sum) has one; detach the tensor or reduce it first");
  }
}

const Placements& grad_form(const DTensor& x, Placements& scratch) {
  if (!x.grad_placements.empty()) return x.grad_placements;
  scratch = op_grad_placements(x.placements);
  return scratch;
}

// An identity on `local` whose backward turns gradients from `from` into `to`.
Tensor with_grad_conversion(const Tensor& local, const DTensor& x, const Placements& from,
                            const Placements& to, const std::string& name) {
  const RedistributePlan plan =
      plan_redistribute(x.global_shape, int64_t(runtime::dtype_size(local.dtype())), *x.mesh, from, to);
  Tensor out = local.detach();
  runtime::autograd::record(
      "dtensor.grad_conversion", {local}, {out},
      [plan, global = x.global_shape, mesh = x.mesh, name](const runtime::autograd::BackwardArgs& a) {
        return std::vector<Tensor>{run_redistribute_plan(a.grad(0), global, *mesh, plan, name)};
      });
  return out;
}

}  // namespace

const char* redistribute_kind_name(RedistributeKind kind) {
  switch (kind) {
    case RedistributeKind::AllGather: return "all_gather";
    case RedistributeKind::ReduceScatter: return "reduce_scatter";
    case RedistributeKind::AllReduce: return "all_reduce";
    case RedistributeKind::AllToAll: return "all_to_all";
    case RedistributeKind::Chunk: return "chunk";
    case RedistributeKind::PadToPartial: return "pad_to_partial";
    case RedistributeKind::ToPartial: return "to_partial";
  }
  return "?";
}

int64_t RedistributePlan::bytes() const {
  int64_t total = 0;
  for (const RedistributeStep& s : steps) total += s.bytes;
  return total;
}

std::string RedistributePlan::describe() const {
  if (steps.empty()) return "nothing";
  std::string out;
  for (const RedistributeStep& s : steps) {
    out += (out.empty() ? "" : " -> ") + std::string(redistribute_kind_name(s.kind)) +
           "(mesh dim " + std::to_string(s.mesh_dim) + ")";
  }
  return out;
}

RedistributePlan plan_redistribute(const Shape& global, int64_t element_size,
                                   const DeviceMesh& mesh, const Placements& from,
                                   const Placements& to) {
  check_pair(global, mesh, from, to);
  if (from == to) return {};
  RedistributePlan early = make_plan(global, element_size, mesh, from, to, true);
  RedistributePlan late = make_plan(global, element_size, mesh, from, to, false);
  return late.bytes() < early.bytes() ? late : early;
}

Tensor run_redistribute_plan(const Tensor& local, const Shape& global, const DeviceMesh& mesh,
                             const RedistributePlan& plan, const std::string& name) {
  runtime::NoGradGuard no_grad;
  Tensor cur = local.detach();
  for (const RedistributeStep& step : plan.steps) cur = run_step(cur, global, mesh, step, name);
  return cur;
}

std::vector<Placement> op_grad_placements(const Placements& placements) {
  Placements out = placements;
  for (Placement& p : out) {
    if (is_replicate(p)) {
      p = Partial{ReduceOp::Sum};
    } else if (is_sum(p)) {
      p = Replicate{};
    }
  }
  return out;
}

std::vector<Placement> whole_grad_placements(const Placements& placements) {
  Placements out = placements;
  for (Placement& p : out)
    if (is_partial(p)) p = Replicate{};
  return out;
}

DTensor redistribute(const DTensor& x, Placements to, std::optional<Placements> grad_placements,
                     const std::string& name) {
  MT_CHECK(x.mesh != nullptr && x.local.defined(), "redistribute: undefined DTensor");
  const int64_t esize = int64_t(runtime::dtype_size(x.local.dtype()));
  const RedistributePlan plan = plan_redistribute(x.global_shape, esize, *x.mesh, x.placements, to);
  Placements out_grad = grad_placements ? *grad_placements : op_grad_placements(to);
  Tensor out = run_redistribute_plan(x.local, x.global_shape, *x.mesh, plan, name);
  if (runtime::autograd::any_requires_grad({x.local})) {
    Placements scratch;
    const Placements& in_grad = grad_form(x, scratch);
    check_differentiable(out_grad, "the gradient of", to);
    check_differentiable(in_grad, "the gradient of", x.placements);
    const RedistributePlan back = plan_redistribute(x.global_shape, esize, *x.mesh, out_grad, in_grad);
    runtime::autograd::record(
        "dtensor.redistribute", {x.local}, {out},
        [back, global = x.global_shape, mesh = x.mesh, name](const runtime::autograd::BackwardArgs& a) {
          return std::vector<Tensor>{
              run_redistribute_plan(a.grad(0), global, *mesh, back, name + ".backward")};
        });
  }
  const LocalPiece piece = local_piece(x.global_shape, *x.mesh, to);
  return DTensor{out, x.mesh, std::move(to), x.global_shape, piece.offset, std::move(out_grad)};
}

DTensor from_local(Tensor local, std::shared_ptr<DeviceMesh> mesh, Placements placements,
                   std::optional<Shape> global_shape, std::optional<Placements> local_grad) {
  MT_CHECK(mesh != nullptr && local.defined(), "from_local: undefined tensor or mesh");
  MT_CHECK(int64_t(placements.size()) == mesh->ndim(), "from_local: ", mesh->describe(),
           " needs ", mesh->ndim(), " placements, got ", placements_name(placements));
  Shape global = local.shape();
  if (global_shape) {
    global = *global_shape;
  } else {
    for (size_t i = 0; i < placements.size(); ++i) {
      if (const auto d = sharded_dim(placements[i])) {
        MT_CHECK(*d >= 0 && *d < local.dim(), "from_local: ", placement_name(placements[i]),
                 " of a ", local.dim(), "-D tensor");
        global[size_t(*d)] *= mesh->size(int64_t(i));
      }
    }
  }
  const LocalPiece piece = local_piece(global, *mesh, placements);
  MT_CHECK(piece.shape == local.shape(), "from_local: a ", placements_name(placements),
           " piece of a ", global, " tensor on ", mesh->describe(), " has shape ", piece.shape,
           " on this rank, but the local tensor has shape ", local.shape());
  Placements grad = local_grad ? *local_grad : whole_grad_placements(placements);
  return DTensor{std::move(local), std::move(mesh), std::move(placements), std::move(global),
                 piece.offset, std::move(grad)};
}

Tensor to_local(const DTensor& x, std::optional<Placements> local_grad) {
  MT_CHECK(x.mesh != nullptr && x.local.defined(), "to_local: undefined DTensor");
  const Placements given = local_grad ? *local_grad : whole_grad_placements(x.placements);
  Placements scratch;
  const Placements& wanted = grad_form(x, scratch);
  if (given == wanted || !runtime::autograd::any_requires_grad({x.local})) return x.local;
  check_differentiable(given, "the local gradient of", x.placements);
  check_differentiable(wanted, "the gradient of", x.placements);
  return with_grad_conversion(x.local, x, given, wanted, "dtensor.to_local");
}

}  // namespace mt::parallel
