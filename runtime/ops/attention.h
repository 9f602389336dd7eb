// Scaled dot-product attention, memory-efficient (flash-attention style) and grouped-query:
//   out = softmax(q @ k^T * scale + mask) @ v,  never materialising the [T, S] score matrix.
// The forward keeps a running max and sum per query row over blocks of keys (online softmax) and
// saves only out and the row logsumexp; the backward recomputes the probabilities from q, k and
// the logsumexp (with delta = rowsum(dout * out)).
//
// Shapes: q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] -> out [B, Hq, T, Dv].
// Layout (CPU and CUDA): q, k and v with stride 1 in their last dim, such as the model's
// transposed [B, T, H, D] activations, are read where they are, and out and the gradients are
// laid out [B, T, H, D] in memory (out.transpose(1, 2) is contiguous).
// Grouped-query attention: Hq % Hkv == 0 and query head h uses kv head h / (Hq / Hkv) (Hkv == Hq
// is multi-head attention, Hkv == 1 multi-query attention).
// Causal mask, aligned bottom-right as in flash-attn: query i attends keys j <= i + (S - T). This
// is the usual top-left mask when S == T, and when S > T (a KV cache) the last query sees every
// key. A query that sees no key (possible only when S < T) gets out = 0 and no gradient.
// Precision: f32 and f64 compute in their own type; bf16/f16 are computed in f32 and the output
// rounded once (on CUDA by cuDNN's flash attention, which accumulates in f32 but rounds the
// probabilities to the input dtype for p @ v). The saved logsumexp is f32 (f64 for f64 inputs).
#pragma once

#include <optional>
#include <vector>

#include "runtime/core/tensor.h"

namespace mt::runtime {

// scale defaults to 1 / sqrt(D). Differentiable w.r.t. q, k and v; dk and dv sum over the query
// heads that share each kv head. Results do not depend on the thread count.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = true, std::optional<double> scale = std::nullopt);

// Attention split over blocks of keys, for code that holds the keys in pieces (context
// parallelism's ring, parallel/context): the same kernels, without autograd, in f32 (f64 for f64
// inputs; 16-bit inputs are widened). Shapes and masks as above; scale as above when not given.
// A block's forward: its out [B, Hq, T, Dv] and the logsumexp lse [B, Hq, T] of each row's
// scaled scores over the block's keys. Blocks merge exactly: with lse = logaddexp(lse1, lse2),
// out = exp(lse1 - lse) out1 + exp(lse2 - lse) out2 (merge_attention_blocks).
struct AttentionBlock {
  Tensor out, lse;
};
AttentionBlock attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                       bool causal, std::optional<double> scale = std::nullopt);
// `into` merged with `block` (both over the same queries, different keys), in place of `into`.
void merge_attention_blocks(AttentionBlock& into, const AttentionBlock& block);
// A block's gradients given the WHOLE attention's out and lse (merged over every block) and the
// gradient dout of out: {dq, dk, dv}, in f32 (f64); dq summed over the blocks is q's gradient,
// dk and dv are the block's keys' and values'.
std::vector<Tensor> attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                             const Tensor& v, const AttentionBlock& whole,
                                             bool causal,
                                             std::optional<double> scale = std::nullopt);

}  // namespace mt::runtime
