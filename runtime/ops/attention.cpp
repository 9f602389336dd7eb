#include "runtime/ops/attention.h"

#include <cmath>

#include "runtime/autograd/function.h"
#include "runtime/autograd/selective_checkpoint.h"
#include "runtime/kernels/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {

namespace {
constexpr const char* kOp = "scaled_dot_product_attention";

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  MT_CHECK(q.defined() && k.defined() && v.defined(), kOp, ": q, k and v must be defined tensors");
  const auto shapes = [&] {
    return ::mt::detail::concat("q ", q.shape(), ", k ", k.shape(), ", v ", v.shape());
  };
  MT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, kOp,
           ": expected q [B, Hq, T, D], k [B, Hkv, S, D] and v [B, Hkv, S, Dv], got ", shapes());
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  MT_CHECK(qs[0] == ks[0] && qs[0] == vs[0], kOp, ": batch sizes differ: ", shapes());
  MT_CHECK(ks[1] == vs[1] && ks[2] == vs[2], kOp,
           ": k and v must agree on kv heads and key length: ", shapes());
  MT_CHECK(qs[3] == ks[3], kOp, ": q and k must have the same head dim: ", shapes());
  MT_CHECK(qs[3] > 0, kOp, ": expected a positive head dim: ", shapes());
  MT_CHECK(ks[1] > 0 && qs[1] % ks[1] == 0, kOp,
           ": the query heads must be a multiple of the kv heads (grouped-query attention), "
           "got Hq = ",
           qs[1], " and Hkv = ", ks[1], ": ", shapes());
  MT_CHECK(q.is_floating_point() && q.dtype() == k.dtype() && q.dtype() == v.dtype(), kOp,
           ": expected q, k and v of one floating dtype, got ", q.dtype(), ", ", k.dtype(), ", ",
           v.dtype());
  MT_CHECK(q.device() == k.device() && q.device() == v.device(), kOp,
           ": q, k and v must be on one device, got ", q.device(), ", ", k.device(), ", ",
           v.device());
}

double scale_for(const Tensor& q, std::optional<double> scale) {
  const double sc = scale.value_or(1.0 / std::sqrt(double(q.shape()[3])));
  MT_CHECK(std::isfinite(sc), kOp, ": expected a finite scale, got ", sc);
  return sc;
}

// Whether the view kernels can read `t` [B, H, T, D] in place: each row of D elements dense, rows
// at least a row apart (a BLAS leading dimension; a gradient broadcast over T has row stride 0),
// and no broadcast head or batch (the cuDNN graphs take no zero strides). Else it is copied.
bool takes_as_view(const Tensor& t) {
  if (t.stride(3) != 1) return false;
  if (t.size(2) > 1 && t.stride(2) < t.size(3)) return false;
  return (t.size(1) <= 1 || t.stride(1) != 0) && (t.size(0) <= 1 || t.stride(0) != 0);
}

// The dtype of lse, and of the blocks' compute: f64 for f64, else f32.
DType stats_dtype(const Tensor& q) { return q.dtype() == DType::F64 ? DType::F64 : DType::F32; }

}  // namespace

AttentionBlock attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                       bool causal, std::optional<double> scale) {
  check_inputs(q, k, v);
  const double sc = scale_for(q, scale);
  const DType work = stats_dtype(q);
  const Shape& qs = q.shape();
  AttentionBlock block{empty({qs[0], qs[1], qs[2], v.shape()[3]}, q.options().with_dtype(work)),
                       empty({qs[0], qs[1], qs[2]}, q.options().with_dtype(work))};
  attention_forward_kernel(q.device(), q.detach().to(work).contiguous(),
                           k.detach().to(work).contiguous(), v.detach().to(work).contiguous(),
                           causal, sc, block.out, block.lse);
  return block;
}

void merge_attention_blocks(AttentionBlock& into, const AttentionBlock& block) {
  MT_CHECK(into.out.shape() == block.out.shape() && into.lse.shape() == block.lse.shape(),
           "merge_attention_blocks: blocks of other queries: out ", into.out.shape(), " and ",
           block.out.shape());
  // lse = m + log(exp(a - m) + exp(b - m)), m = max(a, b): finite for rows that see a key.
  const Tensor m = maximum(into.lse, block.lse);
  const Tensor wa = exp(sub(into.lse, m)), wb = exp(sub(block.lse, m));
  const Tensor total = add(wa, wb);
  into.out = div(add(mul(into.out, wa.unsqueeze(-1)), mul(block.out, wb.unsqueeze(-1))),
                 total.unsqueeze(-1));
  into.lse = add(m, log(total));
}

std::vector<Tensor> attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                             const Tensor& v, const AttentionBlock& whole,
                                             bool causal, std::optional<double> scale) {
  check_inputs(q, k, v);
  const double sc = scale_for(q, scale);
  const DType work = stats_dtype(q);
  const Tensor qw = q.detach().to(work).contiguous(), kw = k.detach().to(work).contiguous(),
               vw = v.detach().to(work).contiguous();
  Tensor dq = empty(qw.shape(), qw.options()), dk = empty(kw.shape(), kw.options()),
         dv = empty(vw.shape(), vw.options());
  attention_backward_kernel(q.device(), dout.detach().to(work).contiguous(), qw, kw, vw,
                            whole.out.to(work).contiguous(), whole.lse.to(work).contiguous(),
                            causal, sc, dq, dk, dv);
  return {dq, dk, dv};
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    std::optional<double> scale) {
  check_inputs(q, k, v);
  const double sc = scale_for(q, scale);
  const DType dtype = q.dtype();
  // The kernels' operand dtype (16-bit kept where the device's kernels take it) and lse's.
  const DType stats = stats_dtype(q);
  const bool native = (dtype == DType::BF16 || dtype == DType::F16) &&
                      attention_takes_16bit_kernel.has(q.device().type) &&
                      attention_takes_16bit_kernel(q.device(), dtype);
  const DType work = native ? dtype : stats;
  // Where the kernels take views, q, k, v (usually transposed [B, T, H, D] activations) are not
  // copied, and out and the gradients are laid out as [B, T, H, D] in memory: the layout the
  // caller's transpose(1, 2) and reshape to [B, T, H * D] read without a copy.
  const bool views = attention_takes_views_kernel.has(q.device().type) &&
                     attention_takes_views_kernel(q.device());
  const auto operand = [views](const Tensor& t) {
    return views && takes_as_view(t) ? t : t.contiguous();
  };
  const auto empty_bhtd = [views](const Shape& s, TensorOptions options) {
    return views ? empty({s[0], s[2], s[1], s[3]}, options).transpose(1, 2) : empty(s, options);
  };

  const Tensor qc = operand(q.detach()), kc = operand(k.detach()), vc = operand(v.detach());
  const Shape& qs = q.shape();
  const std::vector<Tensor> out_lse = autograd::reuse_or_compute("attention", {qc, kc, vc}, [&] {
    Tensor out_w = empty_bhtd({qs[0], qs[1], qs[2], v.shape()[3]}, q.options().with_dtype(work));
    Tensor lse = empty({qs[0], qs[1], qs[2]}, q.options().with_dtype(stats));
    attention_forward_kernel(q.device(), qc.to(work), kc.to(work), vc.to(work), causal, sc, out_w,
                             lse);
    return std::vector<Tensor>{out_w.to(dtype), lse};
  });
  const Tensor& out = out_lse[0];
  const Tensor& lse = out_lse[1];

  if (autograd::any_requires_grad({q, k, v})) {
    // Saved in the inputs' dtype (no extra copies for 16-bit inputs); upcast again in backward
    // where the kernels need it.
    autograd::record(
        kOp, {q, k, v}, {out},
        [sq = autograd::SavedTensor(qc), sk = autograd::SavedTensor(kc),
         sv = autograd::SavedTensor(vc), so = autograd::SavedTensor(out),
         sl = autograd::SavedTensor(lse), causal, sc, dtype,
         work, operand, empty_bhtd](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
          const Tensor qw = sq.get().to(work), kw = sk.get().to(work), vw = sv.get().to(work);
          const Tensor dout = operand(args.grad(0).to(work));
          Tensor dq = args.needs(0) ? empty_bhtd(qw.shape(), qw.options()) : Tensor();
          Tensor dk, dv;
          if (args.needs(1) || args.needs(2)) {
            dk = empty_bhtd(kw.shape(), kw.options());
            dv = empty_bhtd(vw.shape(), vw.options());
          }
          attention_backward_kernel(qw.device(), dout, qw, kw, vw, so.get().to(work), sl.get(),
                                    causal, sc, dq, dk, dv);
          return {dq.defined() ? dq.to(dtype) : Tensor(), args.needs(1) ? dk.to(dtype) : Tensor(),
                  args.needs(2) ? dv.to(dtype) : Tensor()};
        });
  }
  return out;
}

}  // namespace mt::runtime
