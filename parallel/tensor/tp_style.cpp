// Tensor-parallel styles as module hooks.
#include "parallel/tensor/tp_style.h"

#include <algorithm>
#include <optional>

#include "parallel/tensor/dtensor_ops.h"
#include "parallel/tensor/redistribute.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/nn/embedding.h"
#include "runtime/nn/linear.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8.h"

namespace mt::parallel {

namespace {

using runtime::Tensor;
using runtime::nn::Module;
using Placements = std::vector<Placement>;

// A Shard(-1) made concrete for a tensor of `ndim` dims.
Placement resolved(const Placement& p, int64_t ndim) {
  if (const auto* s = std::get_if<Shard>(&p); s && s->dim < 0) return Shard{s->dim + ndim};
  return p;
}

// The global shape of an activation whose local piece on tp (layout `p`) has shape `local`.
// `sharded_size`: the global length of the split dim where a weight fixes it (a column-wise
// layer's output features, which need not divide by tp); else the split is even (the sequence
// and head dims divide by tp, checked by the model's parallelize).
Shape activation_shape(const Tensor& local, const Placement& p, const DeviceMesh& mesh,
                       const std::string& where, std::optional<int64_t> sharded_size) {
  Shape global = local.shape();
  const auto d = sharded_dim(p);
  if (!d) return global;
  global[size_t(*d)] = sharded_size.value_or(global[size_t(*d)] * mesh.size());
  MT_CHECK(local_piece(global, mesh, {p}).shape == local.shape(), where, ": a ",
           placement_name(p), " activation of local shape ", local.shape(), " is not this rank's ",
           "piece of ", global, " over ", mesh.describe());
  return global;
}

// x (local, layout `from`) laid out as `to`, for code whose gradient is in `local_grad` form.
Tensor relayout(const Tensor& x, const std::shared_ptr<DeviceMesh>& mesh, const Placement& from,
                const Placement& to, const Placements& local_grad, const std::string& where,
                std::optional<int64_t> sharded_size = std::nullopt) {
  const Placement a = resolved(from, x.dim()), b = resolved(to, x.dim());
  const DTensor dt = from_local(x, mesh, {a}, activation_shape(x, a, *mesh, where, sharded_size));
  return to_local(redistribute(dt, {b}, local_grad, where), local_grad);
}

template <class M>
M& module_as(Module& root, const std::string& fqn, const char* style) {
  auto* m = dynamic_cast<M*>(&root.submodule(fqn));
  MT_CHECK(m != nullptr, "tensor parallel: ", style, " does not apply to '", fqn, "' (a ",
           root.submodule(fqn).type_name(), ")");
  return *m;
}

}  // namespace

namespace {

// A float8 Linear whose weight tp splits along `split_dim` (0: column-wise, 1: row-wise): its
// casts' amaxes are all-reduced (max) over the tp ranks (tensorwise: every cast's; rowwise: the
// row amaxes of the operands whose contracted dim is split, runtime/ops/float8.h), so each rank's
// piece of the weight, and of a split input or output gradient, is scaled as the whole tensor
// (or row) is in one process. The local piece must still fit FP8 GEMMs.
void split_float8_linear(runtime::nn::Linear& lin, const std::shared_ptr<DeviceMesh>& mesh,
                         const std::string& where, int64_t split_dim) {
  if (!lin.float8) return;
  const int64_t in = lin.weight.size(1), out = lin.weight.size(0);
  if (auto why = runtime::float8_linear_unsupported(lin.weight.device(), in, out)) {
    MT_FAIL(where, ": this rank's piece of the float8 layer's weight cannot run FP8 GEMMs (",
            *why, "); leave the layer out of float8 with quantize.linear.float8.filter_fqns");
  }
  lin.float8_amax_reduce = [group = mesh->group_ptr(0)](Tensor& amax) {
    group->all_reduce(amax, ReduceOp::Max, "tp.float8_amax");
  };
  lin.float8_split_dim = split_dim;
}

}  // namespace

TensorParallel::TensorParallel(std::shared_ptr<DeviceMesh> tp_mesh) : mesh_(std::move(tp_mesh)) {
  MT_CHECK(mesh_ != nullptr && mesh_->ndim() == 1, "TensorParallel: expected a 1-D tp mesh");
}

Tensor TensorParallel::split(const std::string& fqn, Tensor& slot, Placement placement) {
  placement = resolved(placement, slot.dim());
  for (const SplitParam& s : split_) {
    if (!s.original.same(slot)) continue;
    MT_CHECK(s.placement == placement, "tensor parallel: '", fqn, "' is tied to '", s.fqn,
             "', which is split as ", placement_name(s.placement), ", not ",
             placement_name(placement), "; tied parameters must be split the same way");
    slot = s.local;
    return slot;
  }
  runtime::NoGradGuard no_grad;
  const LocalPiece piece = local_piece(slot.shape(), *mesh_, {placement});
  Tensor view = slot;
  for (size_t d = 0; d < piece.shape.size(); ++d)
    view = view.narrow(int64_t(d), piece.offset[d], piece.shape[d]);
  Tensor local = runtime::empty(piece.shape, slot.options().with_requires_grad(false));
  if (slot.storage()->has_memory()) {
    local.copy_(view);
  } else {
    local.storage()->release_memory();  // built without values (nn::DeferredInitGuard)
  }
  local.set_requires_grad(slot.requires_grad());
  local.set_name(slot.name());
  split_.push_back({fqn, slot, local, placement, slot.shape()});
  slot = local;
  return local;
}

void TensorParallel::apply(Module& root, const std::string& fqn, const ParallelStyle& style) {
  const auto mesh = mesh_;
  const std::string where = "tensor parallel '" + fqn + "'";
  if (const auto* col = std::get_if<ColwiseParallel>(&style)) {
    Module& m = root.submodule(fqn);
    int64_t features = 0;  // the output's last dim, whole: the weight's split dim
    if (auto* lin = dynamic_cast<runtime::nn::Linear*>(&m)) {
      MT_CHECK(!lin->bias.defined(), where, ": a column-wise Linear with a bias is not supported");
      split(fqn + ".weight", lin->weight, Shard{0});
      features = split_.back().global_shape[0];
      split_float8_linear(*lin, mesh, where, 0);
    } else {
      split(fqn + ".weight", module_as<runtime::nn::Embedding>(root, fqn, "ColwiseParallel").weight,
            Shard{1});
      features = split_.back().global_shape[1];
    }
    const bool embedding = dynamic_cast<runtime::nn::Embedding*>(&m) != nullptr;
    if (col->input && !embedding) {
      const Placement in = *col->input;
      m.register_forward_pre_hook([=](Module&, std::vector<Tensor>& inputs) {
        inputs[0] = relayout(inputs[0], mesh, in, Replicate{}, {Partial{}}, where + " input");
      });
    }
    const Placement out = col->output;
    if (!(std::holds_alternative<Shard>(out) && std::get<Shard>(out).dim == -1)) {
      m.register_forward_hook([=](Module&, const std::vector<Tensor>&, std::vector<Tensor>& outs) {
        const int64_t last = outs[0].dim() - 1;
        outs[0] = relayout(outs[0], mesh, Shard{last}, out, whole_grad_placements({out}),
                           where + " output", features);
      });
    }
  } else if (const auto* row = std::get_if<RowwiseParallel>(&style)) {
    Module& m = root.submodule(fqn);
    const Placement out = row->output;
    if (auto* lin = dynamic_cast<runtime::nn::Linear*>(&m)) {
      MT_CHECK(!lin->bias.defined(), where, ": a row-wise Linear with a bias is not supported");
      split(fqn + ".weight", lin->weight, Shard{1});
      split_float8_linear(*lin, mesh, where, 1);
      const Placement in = row->input;
      if (!(std::holds_alternative<Shard>(in) && std::get<Shard>(in).dim == -1)) {
        m.register_forward_pre_hook([=](Module&, std::vector<Tensor>& inputs) {
          const int64_t last = inputs[0].dim() - 1;
          inputs[0] = relayout(inputs[0], mesh, in, Shard{last}, {Shard{last}}, where + " input");
        });
      }
    } else {
      auto& emb = module_as<runtime::nn::Embedding>(root, fqn, "RowwiseParallel");
      const Tensor local = split(fqn + ".weight", emb.weight, Shard{0});
      const int64_t offset = local_piece(split_.back().global_shape, *mesh, {Shard{0}}).offset[0];
      const int64_t rows = local.size(0);
      auto mask = std::make_shared<Tensor>();
      m.register_forward_pre_hook([=](Module&, std::vector<Tensor>& inputs) {
        const dtensor::LocalIds ids =
            dtensor::local_embedding_ids(inputs[0], offset, rows, runtime::DType::F32);
        inputs[0] = ids.ids;
        *mask = ids.mask;
      });
      m.register_forward_hook([=](Module&, const std::vector<Tensor>&, std::vector<Tensor>& outs) {
        // In the lookup's dtype: under mixed precision, the compute dtype, not the shard's.
        outs[0] = runtime::mul(outs[0], mask->unsqueeze(-1).to(outs[0].dtype()));
        *mask = Tensor();
      });
    }
    m.register_forward_hook([=](Module&, const std::vector<Tensor>&, std::vector<Tensor>& outs) {
      const Placement want = resolved(out, outs[0].dim());
      const DTensor partial = from_local(outs[0], mesh, {Partial{}}, outs[0].shape());
      outs[0] = to_local(redistribute(partial, {want}, whole_grad_placements({want}), where + " output"));
    });
  } else if (std::holds_alternative<SequenceParallel>(style)) {
    Module& m = root.submodule(fqn);
    MT_CHECK(!m.named_parameter_slots().empty(), where, ": SequenceParallel on a module without "
             "parameters");
    // The parameters compute beside this rank's part of the sequence: the gradient reaching
    // each is partial, summed over tp (all-reduce) before it accumulates. The hook goes on the
    // leaf the module computes with (FSDP's gathered parameter, the same tensor every step),
    // once; it runs as the gradient reaches the leaf, so before FSDP reduces the gradient after
    // the module's backward.
    auto hooked = std::make_shared<std::vector<Tensor>>();
    m.register_forward_pre_hook([=, &m](Module&, std::vector<Tensor>&) {
      for (const auto& slot : m.named_parameter_slots()) {
        const Tensor& p = *slot.slot;
        if (!p.requires_grad()) continue;
        MT_CHECK(p.is_leaf(), where, ": parameter '", slot.fqn, "' is not a leaf here");
        const bool seen = std::any_of(hooked->begin(), hooked->end(),
                                      [&](const Tensor& h) { return h.same(p); });
        if (seen) continue;
        hooked->push_back(p);
        const std::string name = where + " " + slot.fqn + ".grad";
        p.register_hook([mesh, name](const Tensor& grad) {
          Tensor whole = grad.contiguous().clone();
          mesh->group(0).all_reduce(whole, ReduceOp::Sum, name);
          return whole;
        });
      }
    });
  } else if (const auto* out = std::get_if<PrepareModuleOutput>(&style)) {
    const Placement from = out->output, desired = out->desired;
    root.submodule(fqn).register_forward_hook(
        [=](Module&, const std::vector<Tensor>&, std::vector<Tensor>& outs) {
          outs[0] = relayout(outs[0], mesh, from, desired,
                             whole_grad_placements({resolved(desired, outs[0].dim())}),
                             where + " output");
        });
  } else {
    const auto& prep = std::get<PrepareModuleInput>(style);
    const Placement in = prep.input, desired = prep.desired;
    root.submodule(fqn).register_forward_pre_hook([=](Module&, std::vector<Tensor>& inputs) {
      inputs[0] = relayout(inputs[0], mesh, in, desired,
                           op_grad_placements({resolved(desired, inputs[0].dim())}), where + " input");
    });
  }
}

std::function<std::optional<OuterSharding>(const Tensor&)> TensorParallel::outer_sharding(
    std::shared_ptr<DeviceMesh> mesh) const {
  MT_CHECK(mesh != nullptr && mesh->has_dim("tp") && mesh->size("tp") == mesh_->size(),
           "TensorParallel::outer_sharding: ", mesh ? mesh->describe() : "null",
           " has no tp dim of size ", mesh_->size());
  const int64_t tp = mesh->dim_index("tp");
  return [mesh, tp, split = split_](const Tensor& t) -> std::optional<OuterSharding> {
    for (const SplitParam& s : split) {
      if (!s.local.same(t)) continue;
      OuterSharding outer{mesh, Placements(size_t(mesh->ndim()), Replicate{}), s.global_shape};
      outer.placements[size_t(tp)] = s.placement;
      return outer;
    }
    return std::nullopt;
  };
}

}  // namespace mt::parallel
