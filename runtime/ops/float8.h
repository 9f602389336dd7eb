// Float8 training ops (torchao's "tensorwise" and "rowwise" recipes): dynamic scales, FP8 codes
// (runtime/kernels/float8.h) and scaled FP8 GEMMs with f32 accumulation.
//
// float8_linear(x, W, b) computes x @ W^T + b with every GEMM in FP8. Tensorwise (one scale per
// tensor):
//   forward        y  = fp8(x, e4m3)  @ fp8(W, e4m3)^T       (fast accumulation)
//   grad input     dx = fp8(dy, e5m2) @ fp8(W, e4m3)
//   grad weight    dW = fp8(dy, e5m2)^T @ fp8(x, e4m3)
// Rowwise (torchao's recipe: every operand e4m3, scaled per row of the GEMM's K-contiguous
// operand, i.e. along the contracted dimension, scales rounded down to powers of two): forward
// x by token and W by output feature; dx = dy (by token) @ W (by input feature); dW = dy^T (by
// output feature, over tokens) @ x (by input feature, over tokens). Each operand is cast once per
// GEMM it enters, so an operand used along two axes is cast twice.
// The FP8 copies of x and W that backward needs (transposed: the tensor cores take K-contiguous
// operands) are made in forward and saved instead of x itself: a quarter of an f32 activation's
// bytes, half a bf16's. Outputs and gradients have x's and W's dtypes (f32 or bf16).
//
// On CUDA this needs FP8 tensor cores (compute capability 8.9 or newer) and in/out features that
// are multiples of 16 (a token count that is not is padded with zero rows); the CPU runs the
// exact reference (emulated codes, f32 GEMM on their values), which is what the tests and
// `emulate = true` use.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "runtime/core/tensor.h"
#include "runtime/kernels/float8.h"
#include "runtime/ops/float8_recipe.h"

namespace mt::runtime {

// FP8 GEMMs' rule: every dimension a multiple of this (float8_linear pads a token count that is
// not; in and out features must be).
inline constexpr int64_t kFloat8GemmMultiple = 16;

// A tensor cast to FP8: its codes (Bool-dtype bytes, see kernels/float8.h), the codes of its
// transpose, and the f32 inverse scale that turns codes back into values: [1] (tensorwise) or one
// per row of `codes` (rowwise).
struct Float8Tensor {
  Tensor codes;    // [rows, cols], or undefined when not asked for
  Tensor codes_t;  // [cols, rows], or undefined when not asked for
  Tensor scale_inv;
  Float8Format format = Float8Format::E4M3;
};

// Casts a 2-D f32/bf16 tensor with one dynamic scale (its amax, made the whole tensor's by
// `reduce` when given); `rows` / `transposed` say which layouts to write. Not differentiable (the
// op below owns the gradients).
Float8Tensor to_float8(const Tensor& x, Float8Format format, bool rows, bool transposed,
                       const Float8AmaxReduce& reduce = nullptr);

// Casts a 2-D f32/bf16 tensor with one dynamic scale per row (its amax, made the whole row's by
// `reduce` when given: the row amaxes [rows] of pieces along the columns; rounded down to a power
// of two when power_of_2): codes [rows, cols] and scale_inv [rows]. Not differentiable.
Float8Tensor to_float8_rowwise(const Tensor& x, Float8Format format, bool power_of_2,
                               const Float8AmaxReduce& reduce = nullptr);

// The row amaxes [rows] (f32) of a 2-D f32/bf16 tensor, and the rowwise cast by given ones: for
// callers that reduce several tensors' row amaxes in one collective.
Tensor float8_row_amax(const Tensor& x);
Float8Tensor to_float8_rowwise_with_amax(const Tensor& x, Float8Format format, bool power_of_2,
                                         const Tensor& row_amax);

// x as the rowwise casts above read it, for callers that cast or measure it more than once: a
// transposed view the device casts by column in place stays a view; anything else becomes one
// contiguous copy (detached either way).
Tensor float8_rowwise_operand(const Tensor& x);

// codes [rows, cols] transposed into new codes [cols, rows] (byte for byte).
Tensor float8_transpose(const Tensor& codes);

// The values the codes stand for, as an f32 [rows, cols] tensor (tests and debugging); scale_inv
// [1] or [rows].
Tensor float8_dequantize(const Tensor& codes, Float8Format format, const Tensor& scale_inv);

// a [M, K] @ b [N, K]^T on FP8 codes with their scales ([1], or [M] / [N] per row) -> [M, N] of
// `out_dtype`.
Tensor float8_mm(const Tensor& a, Float8Format a_format, const Tensor& a_scale_inv,
                 const Tensor& b, Float8Format b_format, const Tensor& b_scale_inv,
                 DType out_dtype, bool fast_accum);

// Why float8_linear cannot run x [..., in] @ weight [out, in]^T, or nullopt when it can: the
// device has no FP8 tensor cores, or a dimension is not a multiple of 16 (the FP8 GEMMs' rule,
// kept on the CPU too so that emulation converts the same layers a GPU would).
std::optional<std::string> float8_linear_unsupported(Device device, int64_t in_features,
                                                     int64_t out_features);

// x [..., in] @ weight [out, in]^T (+ bias [out]) with FP8 GEMMs; differentiable in all three.
// Tensorwise: when `weight` has codes registered below, they are used instead of casting it (its
// values are then not read at all). Rowwise casts the weight itself (registered codes are an
// error: FSDP's float8 all-gather is tensorwise only). reduce_amax (tensor parallelism: the
// weight is this rank's piece, split along `split_dim`, 0 = output features, 1 = input
// features): tensorwise, every cast's amax (x, weight, and the output gradient in backward) goes
// through it, so that pieces of a split weight or activation get the whole tensor's scale
// (registered weight codes already carry it); rowwise, the row amaxes of the operands whose
// contracted dimension is split (split_dim 1: x and W forward; 0: the output gradient and W for
// dx), so each row gets the whole row's scale; the others' rows are whole on every rank.
Tensor float8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                     Float8Recipe recipe = Float8Recipe::Tensorwise,
                     const Float8AmaxReduce& reduce_amax = nullptr, int64_t split_dim = -1);

// Within this scope (on this thread), float8_linear calls cast an input they share once: a later
// call of the same recipe on the same tensor, unchanged (the same storage, version and view),
// reuses the first call's FP8 codes and scales, which are what its own casts would make
// (tensorwise: the codes and their transpose; rowwise: by token, and by input feature for the
// weight gradient). For layers that read one input: attention's q, k and v projections, the
// FFN's w1 and w3. Casts whose amaxes a layer reduces (tensor parallelism) are the layer's own.
// Scopes nest; the codes are released at the end of the scope (backward keeps what it needs).
class Float8InputCastSharing {
 public:
  Float8InputCastSharing();
  ~Float8InputCastSharing();
  Float8InputCastSharing(const Float8InputCastSharing&) = delete;
  Float8InputCastSharing& operator=(const Float8InputCastSharing&) = delete;

  struct Memo;  // runtime/ops/float8.cpp

 private:
  Memo* previous_;
  std::unique_ptr<Memo> memo_;
};

// FSDP's float8 all-gather gathers a weight already cast (e4m3 codes of the whole [out, in]
// weight, or of this rank's tensor-parallel piece, and their scale: the whole weight's, its
// amax reduced over the pieces' ranks too) and registers them for the unsharded weight tensor,
// whose own values it does not gather; reshard unregisters them. Keyed by the weight's storage.
void register_float8_weight_codes(const Tensor& weight, Float8Tensor codes);
void unregister_float8_weight_codes(const Tensor& weight);

}  // namespace mt::runtime
