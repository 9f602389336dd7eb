#include "runtime/ops/swiglu.h"

#include "runtime/autograd/function.h"
#include "runtime/kernels/swiglu.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8_amax_notes.h"

namespace mt::runtime {

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  MT_CHECK(gate.defined() && up.defined(), "swiglu: gate and up must be defined tensors");
  MT_CHECK(gate.shape() == up.shape(), "swiglu: expected gate and up of the same shape, got ",
           gate.shape(), " and ", up.shape());
  MT_CHECK(gate.is_floating_point() && gate.dtype() == up.dtype(),
           "swiglu: expected gate and up of the same floating dtype, got ", gate.dtype(), " and ",
           up.dtype());
  MT_CHECK(gate.device() == up.device(), "swiglu: gate is on ", gate.device(), " but up on ",
           up.device());
  const Tensor gc = gate.detach().contiguous();
  const Tensor uc = up.detach().contiguous();
  Tensor out = empty(gate.shape(), gate.options());
  Tensor out_amax = float8_amax_slot(out);  // undefined unless float8 casts may want it
  swiglu_forward_kernel(gate.device(), gc, uc, out, out_amax);

  if (autograd::any_requires_grad({gate, up})) {
    autograd::record("swiglu", {gate, up}, {out},
                     [sg = autograd::SavedTensor(gc), su = autograd::SavedTensor(uc)](
                         const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor& g = sg.get();
                       const Tensor& u = su.get();
                       const Tensor dy = args.grad(0).to(g.dtype()).contiguous();
                       Tensor dgate = args.needs(0) ? empty(g.shape(), g.options()) : Tensor();
                       Tensor dup = args.needs(1) ? empty(u.shape(), u.options()) : Tensor();
                       Tensor dgate_amax = float8_amax_slot(dgate);
                       Tensor dup_amax = float8_amax_slot(dup);
                       swiglu_backward_kernel(g.device(), dy, g, u, dgate, dup, dgate_amax,
                                              dup_amax);
                       return {dgate, dup};
                     });
  }
  return out;
}

}  // namespace mt::runtime
