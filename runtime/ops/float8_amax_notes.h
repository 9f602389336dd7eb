// Amaxes measured where a float8 linear's operand is written, so that its tensorwise cast need not
// read the tensor once more for the scale (the pass torch.compile can fuse into the producer).
//
// Within a Float8AmaxNotes scope (on this thread), the ops that write most of a Llama block's
// float8 operands measure max |value| of what they store, in the same pass, and note it for
// their output: rms_norm's forward (the attention and FFN inputs), swiglu's forward (w2's input)
// and backward (w1's and w3's output gradients), and cross_entropy's backward (the logits'
// gradient: an FP8 output projection's). A tensorwise cast of such a tensor,
// unchanged since (the same storage, offset, element count and version, contiguous), takes the
// noted amax: bit for bit the one its own pass would find (the maximum of the stored values'
// |bits|, NaN winning). Everything else measures its own, as outside a scope. Scopes nest; the
// notes go with their scope.
#pragma once

#include <memory>

#include "runtime/core/tensor.h"

namespace mt::runtime {

class Float8AmaxNotes {
 public:
  Float8AmaxNotes();
  ~Float8AmaxNotes();
  Float8AmaxNotes(const Float8AmaxNotes&) = delete;
  Float8AmaxNotes& operator=(const Float8AmaxNotes&) = delete;

  struct Notes;  // runtime/ops/float8_amax_notes.cpp

 private:
  Notes* previous_;
  std::unique_ptr<Notes> notes_;
};

// For a producer about to write `out` (contiguous, new): a zeroed f32 [1] tensor on out's device
// for its kernel to raise to max |value| (as the bits of the maximum |bits|), noted for `out`; an
// undefined tensor when no scope is open on this thread or out is not f32 or bf16 (the kernel
// then measures nothing).
Tensor float8_amax_slot(const Tensor& out);

// The amax noted for x (see above), or an undefined tensor. Read it, do not write it.
Tensor noted_float8_amax(const Tensor& x);

}  // namespace mt::runtime
