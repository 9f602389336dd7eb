#include "runtime/ops/embedding.h"

#include "runtime/autograd/function.h"
#include "runtime/kernels/embedding.h"
#include "runtime/kernels/index.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  MT_CHECK(weight.dim() == 2 && is_floating(weight.dtype()),
           "embedding: expected a floating weight [V, D], got ", dtype_name(weight.dtype()),
           " of shape ", weight.shape());
  MT_CHECK(ids.dtype() == DType::I64 || ids.dtype() == DType::I32,
           "embedding: expected i64 or i32 ids, got ", dtype_name(ids.dtype()), " of shape ",
           ids.shape());
  MT_CHECK(weight.device() == ids.device(), "embedding: weight on ", weight.device(),
           " but ids on ", ids.device());
  const int64_t V = weight.size(0), D = weight.size(1), n = ids.numel();
  // The kernel reads rows in place when they are contiguous runs (any row stride).
  const Tensor w = weight.stride(1) == 1 || D == 1 ? weight.detach() : weight.detach().contiguous();
  const Tensor flat_ids = ids.reshape({n}).contiguous();
  Tensor out = Tensor::empty({n, D}, weight.options());
  // A bad id fails here on the CPU, and at the next host wait on a device.
  index_bounds_kernel(weight.device(), flat_ids, V,
                      [ids_shape = ids.shape(), wshape = weight.shape()](int64_t bad, int64_t id) {
                        return detail::concat("embedding: id ", id, " at position ",
                                              unravel_index(bad, ids_shape), " is outside [0, ",
                                              wshape[0], ") for a weight of shape ", wshape);
                      });
  embedding_forward_kernel(weight.device(), w, flat_ids, out);
  Shape out_shape = ids.shape();
  out_shape.push_back(D);
  out = out.view(out_shape);
  if (autograd::any_requires_grad({weight})) {
    autograd::record("embedding", {weight}, {out},
                     [sid = autograd::SavedTensor(flat_ids), wshape = weight.shape(),
                      n](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
                       const Tensor g = args.grad(0).reshape({n, wshape[1]}).contiguous();
                       Tensor gw = zeros(wshape, g.options());
                       embedding_backward_kernel(g.device(), g, sid.get(), gw);
                       return {gw};
                     });
  }
  return out;
}

}  // namespace mt::runtime
