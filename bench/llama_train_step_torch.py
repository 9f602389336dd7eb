"""PyTorch eager peer of bench/llama_train_step_bench.cpp: the same Llama 3 architecture, shapes,
batch, optimizer (AdamW) and f32 on the CPU; prints one `key=value` line with tokens/s.

    python3 bench/llama_train_step_torch.py --model debugmodel --batch 8 --seq 256 --steps 10
Uses Debian's python3-torch (apt-get install python3-torch) or any torch >= 1.13.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # dim, n_layers, n_heads, n_kv_heads (same as the C++ bench)
    "debugmodel": (256, 6, 16, 16),
    "20M": (384, 10, 6, 6),
}


def ffn_hidden(dim, multiple_of=256):
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def rope_tables(head_dim, seq, theta=500000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).double() / head_dim))
    angles = torch.outer(torch.arange(seq).double(), freqs)
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rope(x, cos, sin):  # x [B, T, H, D], interleaved pairs as Meta's Llama
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


def attention(q, k, v):  # [B, H, T, D], causal
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]  # torch 1.13 (Debian 12): the usual eager composition
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.hd, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(n_heads * self.hd, dim, bias=False)
        hidden = ffn_hidden(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = apply_rope(self.wq(h).view(B, T, self.n_heads, self.hd), cos, sin)
        k = apply_rope(self.wk(h).view(B, T, self.n_kv, self.hd), cos, sin)
        v = self.wv(h).view(B, T, self.n_kv, self.hd)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        a = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab, dim, n_layers, n_heads, n_kv_heads, seq):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads, n_kv_heads) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(dim // n_heads, seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=SHAPES, default="debugmodel")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dim, n_layers, n_heads, n_kv = SHAPES[a.model]
    model = Llama(a.vocab, dim, n_layers, n_heads, n_kv, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    seconds = 0.0
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))
        loss.backward()
        opt.step()
        value = loss.item()
        if step >= a.warmup:
            seconds += time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    print(f"framework=pytorch-{torch.__version__} model={a.model} params={params} batch={a.batch} "
          f"seq={a.seq} tokens_per_s={a.batch * a.seq * a.steps / seconds:.1f} "
          f"step_ms={1e3 * seconds / a.steps:.2f} loss={value:.4f} threads={torch.get_num_threads()}")


if __name__ == "__main__":
    main()
