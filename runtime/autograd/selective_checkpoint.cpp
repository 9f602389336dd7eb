#include "runtime/autograd/selective_checkpoint.h"

#include <sstream>

#include "runtime/core/error.h"

namespace mt::runtime::autograd {

namespace {

thread_local KeptOutputs* current_kept = nullptr;
thread_local KeptOutputs::Mode current_mode = KeptOutputs::Mode::Keep;

std::string describe(const std::vector<Tensor>& inputs) {
  std::ostringstream os;
  for (const Tensor& t : inputs) {
    if (t.defined()) os << dtype_name(t.dtype()) << t.shape() << " ";
    else os << "undefined ";
  }
  return os.str();
}

}  // namespace

SavePolicy matmul_and_attention_policy() {
  return [](const std::string& op, int64_t nth) {
    if (op == "attention") return true;
    return (op == "matmul" || op == "grouped_mm") && nth % 2 == 0;
  };
}

KeptOutputs::Scope::Scope(KeptOutputs* kept, Mode mode)
    : prev_kept_(current_kept), prev_mode_(current_mode) {
  current_kept = kept;
  current_mode = mode;
  if (kept != nullptr) kept->calls_.clear();
}

KeptOutputs::Scope::~Scope() {
  current_kept = prev_kept_;
  current_mode = prev_mode_;
}

std::vector<Tensor> KeptOutputs::run(const char* op, Mode mode, const std::vector<Tensor>& inputs,
                                     const std::function<std::vector<Tensor>()>& compute) {
  const std::string name(op);
  const int64_t nth = calls_[name]++;
  const auto key = std::make_pair(name, nth);
  if (mode == Mode::Reuse) {
    const auto it = kept_.find(key);
    if (it == kept_.end()) return compute();
    const Entry& entry = it->second;
    MT_CHECK(entry.inputs == describe(inputs), "checkpoint: call ", nth, " of ", name,
             " in the recompute takes ", describe(inputs), "but the forward's took ",
             entry.inputs, "(the checkpointed function is not deterministic)");
    for (size_t i = 0; i < entry.outputs.size(); ++i) {
      // Modified in place since the forward kept it: its values are no longer the op's.
      if (entry.outputs[i].version() != entry.versions[i]) return compute();
    }
    std::vector<Tensor> outputs;
    for (const Tensor& t : entry.outputs) outputs.push_back(t.detach());
    return outputs;
  }
  std::vector<Tensor> outputs = compute();
  if (policy_ && policy_(name, nth)) {
    Entry entry;
    entry.inputs = describe(inputs);
    for (const Tensor& t : outputs) {
      entry.outputs.push_back(t.detach());
      entry.versions.push_back(t.version());
    }
    kept_[key] = std::move(entry);
  }
  return outputs;
}

std::vector<Tensor> reuse_or_compute(const char* op, const std::vector<Tensor>& inputs,
                                     const std::function<std::vector<Tensor>()>& compute) {
  if (current_kept == nullptr) return compute();
  return current_kept->run(op, current_mode, inputs, compute);
}

Tensor reuse_or_compute(const char* op, const std::vector<Tensor>& inputs,
                        const std::function<Tensor()>& compute) {
  if (current_kept == nullptr) return compute();
  return current_kept
      ->run(op, current_mode, inputs, [&compute] { return std::vector<Tensor>{compute()}; })
      .at(0);
}

}  // namespace mt::runtime::autograd
