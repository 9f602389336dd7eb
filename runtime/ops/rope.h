// Rotary position embeddings (RoPE) in the Llama 3 convention: frequency tables (with the optional
// Llama 3.1 long-context scaling) and the rotation of interleaved pairs (x[2i], x[2i+1]) of each
// head, i.e. Meta's complex multiplication of adjacent pairs, NOT Hugging Face's rotate_half
// layout.
//
// For head_dim d, pair i in [0, d/2) has frequency freq_i = theta^(-2i/d); token at position p
// (= position_offset + t) is rotated by angle a = p * freq_i:
//   out[2i]   = x[2i] * cos(a) - x[2i+1] * sin(a)
//   out[2i+1] = x[2i] * sin(a) + x[2i+1] * cos(a)
// (Hugging Face checkpoints store wq/wk rows permuted for rotate_half; converting weights between
// the two layouts is the checkpoint exporter's job, not this op's.)
#pragma once

#include <cstdint>
#include <optional>

#include "runtime/core/tensor.h"

namespace mt::runtime {

// Llama 3.1 frequency scaling ("rope_type": "llama3"), as in Meta's reference apply_scaling:
// with wavelen = 2*pi / freq, low_wavelen = original / low_freq_factor and
// high_wavelen = original / high_freq_factor:
//   wavelen < high_wavelen -> freq;  wavelen > low_wavelen -> freq / factor;
//   otherwise (1 - s) * freq / factor + s * freq, s = (original / wavelen - low) / (high - low).
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct RopeTables {
  Tensor cos;  // [max_seq_len, head_dim / 2], f32: cos(p * freq_i)
  Tensor sin;  // [max_seq_len, head_dim / 2], f32: sin(p * freq_i)
};

// Tables for positions [0, max_seq_len); computed in f64, stored as f32.
RopeTables rope_frequencies(int64_t head_dim, int64_t max_seq_len, double theta = 500000.0,
                            std::optional<RopeScaling> scaling = std::nullopt);

// x [B, T, H, head_dim] (floating; 16-bit computes in f32). cos/sin from rope_frequencies with
// position_offset + T <= max_seq_len. Differentiable w.r.t. x (the backward rotates by the
// opposite angle); the tables are constants and get no gradient.
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin,
                  int64_t position_offset = 0);

}  // namespace mt::runtime
