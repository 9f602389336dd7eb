"""Llama 3 in PyTorch, written to match minititan's models/llama exactly (the GPU benchmark's peer):
pre-norm blocks with RMSNorm (eps 1e-5), grouped-query attention with RoPE on interleaved pairs
(Meta's layout, theta 500000, Llama 3.1 frequency scaling), SwiGLU FFN with Meta's hidden size
rule, no biases, optionally tied input/output embeddings, and minititan's initialisation.
The code is what torchtitan's eager Llama does (complex RoPE, repeat_kv + SDPA), so the eager and
torch.compile numbers are those of the usual PyTorch implementation; for torch.compile, RoPE in
real arithmetic (complex_rope=False: inductor generates no code for complex ops).

Also here: the parameter count and the training FLOPs per token with the same formula as
models/llama/model_args.cpp (flops_per_token), so MFU numbers are comparable.
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ModelArgs:  # models/llama/model_args.h
    dim: int = 2048
    n_layers: int = 16
    n_heads: int = 32
    n_kv_heads: int = 8
    vocab_size: int = 128256
    multiple_of: int = 256
    ffn_dim_multiplier: Optional[float] = 1.5
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_factor: Optional[float] = 32.0  # Llama 3.1 scaling; None: no scaling
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    max_seq_len: int = 2048
    tie_embeddings: bool = True
    depth_init: bool = True

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    @property
    def ffn_hidden_dim(self):  # ModelArgs::ffn_hidden_dim
        hidden = 2 * (4 * self.dim) // 3
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


def count_parameters(a: ModelArgs):  # count_parameters: unique parameters (tied counted once)
    kv_dim = a.n_kv_heads * a.head_dim
    per_layer = 2 * a.dim * a.dim + 2 * a.dim * kv_dim + 3 * a.dim * a.ffn_hidden_dim + 2 * a.dim
    embedding = a.vocab_size * a.dim
    return embedding + a.n_layers * per_layer + a.dim + (0 if a.tie_embeddings else embedding)


def flops_per_token(a: ModelArgs, seq_len: int):
    """6 N + 12 L H D T; N = parameters less the embedding table, plus the output projection's
    vocab x dim even when tied (torchtitan's convention, as model_args.cpp)."""
    embedding = a.vocab_size * a.dim
    n = count_parameters(a) - embedding + (embedding if a.tie_embeddings else 0)
    return 6.0 * n + 12.0 * a.n_layers * a.n_heads * a.head_dim * seq_len


def rope_freqs_cis(a: ModelArgs):
    """[max_seq_len, head_dim / 2] complex64 exp(i p freq_k): f64, then f32 (runtime/ops/rope.h)."""
    hd = a.head_dim
    freqs = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if a.rope_factor is not None:
        low_wavelen = a.rope_original_max_position / a.rope_low_freq_factor
        high_wavelen = a.rope_original_max_position / a.rope_high_freq_factor
        wavelen = 2 * math.pi / freqs
        smooth = (a.rope_original_max_position / wavelen - a.rope_low_freq_factor) / (
            a.rope_high_freq_factor - a.rope_low_freq_factor)
        mid = (1 - smooth) * freqs / a.rope_factor + smooth * freqs
        freqs = torch.where(wavelen < high_wavelen, freqs,
                            torch.where(wavelen > low_wavelen, freqs / a.rope_factor, mid))
    angles = torch.outer(torch.arange(a.max_seq_len, dtype=torch.float64), freqs)
    return torch.polar(torch.ones_like(angles).float(), angles.float())


def apply_rope(x, freqs_cis):  # x [B, T, H, D]; pairs (x[2i], x[2i+1]) rotated, in f32
    """torchtitan's complex multiplication: the fewest kernels in eager; torch.compile cannot
    generate code for complex ops (it falls back), so compiled runs use apply_rope_real."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, -1))
    return out.flatten(3).type_as(x)


def apply_rope_real(x, cos_sin):  # the same rotation in real arithmetic (fuses when compiled)
    xr = x.float().reshape(*x.shape[:-1], -1, 2)  # cos_sin: view_as_real(freqs_cis), f32
    x1, x2 = xr[..., 0], xr[..., 1]
    f = cos_sin[: x.shape[1]].view(1, x.shape[1], 1, -1, 2)
    c, s = f[..., 0], f[..., 1]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(3).type_as(x)


def causal_attention(q, k, v):  # [B, H, T, D]
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: flash / cuDNN kernels
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]  # torch 1.13 (Debian 12's python3-torch), for CPU smoke tests only
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if hasattr(F, "rms_norm"):  # torch >= 2.4
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, a: ModelArgs, rope):
        super().__init__()
        self.rope = rope
        self.n_heads, self.n_kv, self.hd = a.n_heads, a.n_kv_heads, a.head_dim
        self.wq = nn.Linear(a.dim, a.n_heads * self.hd, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(a.n_heads * self.hd, a.dim, bias=False)

    def forward(self, x, freqs_cis):
        B, T, _ = x.shape
        q = self.rope(self.wq(x).view(B, T, self.n_heads, self.hd), freqs_cis)
        k = self.rope(self.wk(x).view(B, T, self.n_kv, self.hd), freqs_cis)
        v = self.wv(x).view(B, T, self.n_kv, self.hd)
        if self.n_kv != self.n_heads:  # torchtitan's repeat_kv
            rep = self.n_heads // self.n_kv
            k = k[:, :, :, None, :].expand(B, T, self.n_kv, rep, self.hd).reshape(B, T, -1, self.hd)
            v = v[:, :, :, None, :].expand(B, T, self.n_kv, rep, self.hd).reshape(B, T, -1, self.hd)
        out = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id, a: ModelArgs, rope):
        super().__init__()
        self.attention = Attention(a, rope)
        self.feed_forward = FeedForward(a.dim, a.ffn_hidden_dim)
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.out_std = 0.02 / math.sqrt(2 * ((layer_id + 1) if a.depth_init else a.n_layers))

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self):  # models/llama/model.cpp: std 0.02, wo/w2/w3 depth-scaled
        for w, std in ((self.attention.wq, 0.02), (self.attention.wk, 0.02),
                       (self.attention.wv, 0.02), (self.attention.wo, self.out_std),
                       (self.feed_forward.w1, 0.02), (self.feed_forward.w2, self.out_std),
                       (self.feed_forward.w3, self.out_std)):
            nn.init.trunc_normal_(w.weight, 0.0, std, -2.0, 2.0)


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs, complex_rope=True):
        super().__init__()
        self.args = a
        rope = apply_rope if complex_rope else apply_rope_real
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(TransformerBlock(i, a, rope) for i in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        if a.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        freqs = rope_freqs_cis(a)
        freqs = freqs if complex_rope else torch.view_as_real(freqs).contiguous()
        self.register_buffer("freqs_cis", freqs, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        out_std = 1.0 / math.sqrt(self.args.dim)
        if self.args.tie_embeddings:
            nn.init.trunc_normal_(self.tok_embeddings.weight, 0.0, out_std, -3 * out_std,
                                  3 * out_std)
        else:
            nn.init.normal_(self.tok_embeddings.weight)
            nn.init.trunc_normal_(self.output.weight, 0.0, out_std, -3 * out_std, 3 * out_std)
        for layer in self.layers:
            layer.init_weights()

    def forward(self, tokens):  # [B, T] -> logits [B, T, vocab] in f32, as minititan returns
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h)).float()
