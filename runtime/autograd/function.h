// How an op records itself in the autograd graph.
//
//   Tensor mul(const Tensor& a, const Tensor& b) {
//     Tensor out = ...forward...;
//     if (autograd::any_requires_grad({a, b})) {
//       autograd::record("mul", {a, b}, {out},
//           [sa = autograd::SavedTensor(a), sb = autograd::SavedTensor(b)](
//               const autograd::BackwardArgs& args) -> std::vector<Tensor> {
//             return {args.needs(0) ? mul(args.grad(0), sb.get()) : Tensor(),
//                     args.needs(1) ? mul(args.grad(0), sa.get()) : Tensor()};
//           });
//     }
//     return out;
//   }
//
// The backward lambda returns one gradient per input (undefined where not needed), runs under
// no_grad, and is destroyed after backward (releasing what it captured). Gradients of outputs no
// gradient reached arrive as zeros.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/autograd/node.h"

namespace mt::runtime::autograd {

// A tensor kept for backward: no autograd history (no reference cycles), and a check that the
// tensor was not modified in place between forward and backward.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  const Tensor& get() const;  // throws if modified in place since it was saved
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
};

struct BackwardArgs {
  std::vector<Tensor> grads;           // one per forward output
  std::vector<bool> needs_input_grad;  // one per forward input
  const Tensor& grad(size_t i = 0) const { return grads.at(i); }
  bool needs(size_t i) const { return i < needs_input_grad.size() && needs_input_grad[i]; }
};

using BackwardFn = std::function<std::vector<Tensor>(const BackwardArgs& args)>;

// True when grad mode is on and any defined input requires grad.
bool any_requires_grad(std::initializer_list<Tensor> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Creates a node named `name` with edges to `inputs`, makes it the grad_fn of `outputs`
// (which become non-leaf tensors requiring grad), and returns it. Call only when
// any_requires_grad(inputs).
std::shared_ptr<Node> record(std::string name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, BackwardFn backward);

// Node for record(): its backward is a lambda.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
};

}  // namespace mt::runtime::autograd
