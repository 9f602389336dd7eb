// Op-level selective activation checkpointing (torchtitan's "op" option, PyTorch's SAC): a
// checkpointed region keeps the outputs of chosen expensive ops from its forward, and its
// recompute in backward reuses them instead of running those ops again; everything else is
// recomputed as in plain checkpointing.
//
//   autograd::checkpoint_multi(fn, inputs, autograd::matmul_and_attention_policy());
//
// Ops that may be kept route their computation through reuse_or_compute() under a stable name
// ("matmul", "grouped_mm", "attention"). In a region's forward, the policy sees each call as
// (op, nth): its name and its 0-based count among that op's calls in this run of the region, and
// decides whether the outputs are kept. The recompute counts the same calls in the same order
// (the region's function must be deterministic, as checkpointing already requires) and returns
// the kept outputs, as fresh handles on the same storage, in place of running the op. A kept
// output modified in place after the forward kept it (its version moved) is not reused: the op
// runs again, so a policy can cost memory but never correctness.
//
// Outside a region with a policy, and inside any region nested in one (checkpointed or run
// directly under no_grad), reuse_or_compute just computes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime::autograd {

// Whether the output of call `nth` (0-based, per op name, per run of the region) of `op` is kept.
using SavePolicy = std::function<bool(const std::string& op, int64_t nth)>;

// torchtitan's op-level policy: keep every attention output and every other matmul output (the
// 1st, 3rd, 5th, ... of each kind, "matmul" and "grouped_mm" counted apart); recompute the rest
// (norms, RoPE, SwiGLU, and the other matmuls). Unlike torchtitan, the count restarts with each
// run of the region, so the same matmuls are kept at every step.
SavePolicy matmul_and_attention_policy();

// Runs `compute` (which returns the op's outputs), or, in a recompute, returns the outputs the
// region's forward kept for this call. `inputs` identify the call: a recompute whose call has
// other input shapes or dtypes than the kept one's throws (the region is not deterministic).
// Called by the ops named above.
std::vector<Tensor> reuse_or_compute(const char* op, const std::vector<Tensor>& inputs,
                                     const std::function<std::vector<Tensor>()>& compute);
// The one-output form.
Tensor reuse_or_compute(const char* op, const std::vector<Tensor>& inputs,
                        const std::function<Tensor()>& compute);

// The outputs one region's forward kept (used by checkpoint_multi; one per recorded region).
class KeptOutputs {
 public:
  explicit KeptOutputs(SavePolicy policy) : policy_(std::move(policy)) {}

  enum class Mode { Keep, Reuse };
  // Makes this region the one reuse_or_compute serves on this thread for the guard's lifetime,
  // in `mode`, with the per-op counts restarted. A null `kept` suspends any enclosing region's.
  class Scope {
   public:
    Scope(KeptOutputs* kept, Mode mode);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    KeptOutputs* prev_kept_;
    Mode prev_mode_;
  };

  // reuse_or_compute for this region, in `mode`.
  std::vector<Tensor> run(const char* op, Mode mode, const std::vector<Tensor>& inputs,
                          const std::function<std::vector<Tensor>()>& compute);

 private:
  struct Entry {
    std::vector<Tensor> outputs;
    std::vector<uint64_t> versions;
    std::string inputs;  // the call's input shapes and dtypes
  };
  SavePolicy policy_;
  std::map<std::string, int64_t> calls_;  // this run's calls so far, per op
  std::map<std::pair<std::string, int64_t>, Entry> kept_;
  int64_t reused_ = 0;
};

}  // namespace mt::runtime::autograd
