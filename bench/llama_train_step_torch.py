"""PyTorch peer of bench/llama_train_step_bench.cpp: the same Llama 3 architecture (interleaved
RoPE, SwiGLU with multiple_of 256, RMSNorm, untied output), shapes, batch and optimizer (AdamW) on
the CPU, written as a current PyTorch user would write it for speed; prints one `key=value` line
(parsed by bench/compare_train_step.sh).

    python bench/llama_train_step_torch.py --model 20M --batch 8 --seq 256 --steps 8 --warmup 2
    python bench/llama_train_step_torch.py --model 20M --compile            # torch.compile
    python bench/llama_train_step_torch.py --dim 512 --layers 8 --heads 8 --kv-heads 2 --dtype bf16

Best effort, each feature used where the installed torch has it (the line says which were used):
- F.rms_norm (torch >= 2.4), else the usual x * rsqrt(mean(x^2) + eps) * w composition;
- F.scaled_dot_product_attention (torch >= 2.0), with enable_gqa (torch >= 2.5) rather than
  repeating k and v when n_kv_heads < n_heads; torch 1.13 gets the eager matmul-softmax-matmul;
- torch.optim.AdamW(fused=True) where this torch's fused AdamW runs on the CPU for the parameter
  dtype (checked with a one-step probe), else foreach=True, else the for-loop;
- --compile: torch.compile of the model together with its cross-entropy (one graph: inductor may
  fuse the loss into the output projection's epilogue); the warm-up steps (at least 2 with
  --compile) absorb compilation and are not timed; --compile-mode max-autotune also lets inductor
  tune its C++ GEMM templates (AVX-512 micro-kernels) against ATen's GEMMs;
- --dtype bf16: bf16 parameters (model.to(bfloat16)), as the C++ bench's --dtype bf16. The optimizer
  state then follows torch's convention (bf16 like the parameters) where minititan keeps f32 state.

Memory: peak_rss_mib is getrusage's ru_maxrss over the whole process (with --compile it includes
Dynamo/Inductor's compilation); step_peak_rss_mib is the same after resetting the high-water mark
(/proc/self/clear_refs "5", Linux) at the end of the warm-up, i.e. the peak of the timed steps
with parameters, gradients and optimizer state resident.
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # dim, n_layers, n_heads, n_kv_heads (same as the C++ bench's --model shorthands)
    "debugmodel": (256, 6, 16, 16),
    "20M": (384, 10, 6, 6),
    "88M": (768, 12, 12, 12),
}

HAS_RMS_NORM = hasattr(F, "rms_norm")  # torch >= 2.4
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0


def _sdpa_has_gqa():
    if not HAS_SDPA:
        return False
    try:  # torch >= 2.5
        q, kv = torch.zeros(1, 2, 2, 4), torch.zeros(1, 1, 2, 4)
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


HAS_GQA = _sdpa_has_gqa()


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


def attention(q, k, v):  # [B, H, T, D] (k, v [B, H_kv, T, D]), causal
    if HAS_SDPA:
        if q.shape[1] != k.shape[1]:
            if HAS_GQA:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if q.shape[1] != k.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
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
        if HAS_RMS_NORM:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
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


class WithLoss(nn.Module):  # the model and its token cross-entropy: what --compile compiles
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs, targets):
        logits = self.model(inputs)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def make_adamw(params, dtype, lr):
    """AdamW(fused=True) when this torch runs it on the CPU for `dtype`, else foreach, else the
    for-loop; returns (optimizer, name)."""
    probe = torch.zeros(4, dtype=dtype, requires_grad=True)
    probe.grad = torch.ones_like(probe)
    for kind in ("fused", "foreach"):
        try:
            opt = torch.optim.AdamW([probe], lr=lr, **{kind: True})
            opt.step()
            return torch.optim.AdamW(params, lr=lr, **{kind: True}), kind
        except (TypeError, RuntimeError, ValueError):
            continue
    return torch.optim.AdamW(params, lr=lr), "forloop"


def reset_peak_rss():  # Linux: the VmHWM (and so ru_maxrss) restarts from the current RSS
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=SHAPES, default="debugmodel",
                   help="shorthand for --dim/--layers/--heads/--kv-heads")
    p.add_argument("--dim", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model and its loss")
    p.add_argument("--compile-mode", default="default",
                   choices=("default", "reduce-overhead", "max-autotune"),
                   help="torch.compile's mode (max-autotune also tunes inductor's C++ GEMM "
                        "templates against ATen's on the CPU)")
    p.add_argument("--profile", action="store_true",
                   help="print the op profile (self CPU time per op or inductor kernel) of the "
                        "last step, to compare with llama_train_step_bench --profile 1")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dim, n_layers, n_heads, n_kv = SHAPES[a.model]
    dim = a.dim or dim
    n_layers = a.layers or n_layers
    n_heads = a.heads or n_heads
    n_kv = a.kv_heads or (n_heads if a.heads else n_kv)
    shape_name = a.model if (dim, n_layers, n_heads, n_kv) == SHAPES[a.model] else "custom"
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    warmup = max(a.warmup, 2) if a.compile else a.warmup

    torch.manual_seed(0)
    model = Llama(a.vocab, dim, n_layers, n_heads, n_kv, a.seq).to(dtype)
    step_fn = WithLoss(model)
    if a.compile:
        if a.profile:  # each inductor C++ kernel becomes a profiler record
            import torch._inductor.config as inductor_config
            inductor_config.cpp.enable_kernel_profile = True
        step_fn = torch.compile(step_fn, mode=None if a.compile_mode == "default" else a.compile_mode)
    opt, opt_kind = make_adamw(model.parameters(), dtype, 1e-4)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    seconds, warmup_s, step_peak = 0.0, 0.0, float("nan")
    profiler = None
    for step in range(warmup + a.steps):
        if step == warmup and reset_peak_rss():
            step_peak = 0.0
        if a.profile and step + 1 == warmup + a.steps:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.__enter__()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_fn(inputs, targets)
        loss.backward()
        opt.step()
        value = loss.item()
        dt = time.perf_counter() - t0
        if profiler is not None:
            profiler.__exit__(None, None, None)
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=30,
                                                max_name_column_width=70))
        if step >= warmup:
            seconds += dt
        else:
            warmup_s += dt
    if step_peak == 0.0:
        step_peak = peak_rss_mib()
    params = sum(p.numel() for p in model.parameters())
    features = ",".join(f for f, on in (("rms_norm", HAS_RMS_NORM), ("sdpa", HAS_SDPA),
                                        ("gqa", HAS_GQA and n_kv != n_heads)) if on)
    print(f"framework=pytorch-{torch.__version__}{'-compile' if a.compile else '-eager'}"
          f"{'-' + a.compile_mode if a.compile and a.compile_mode != 'default' else ''} "
          f"model={shape_name} dim={dim} layers={n_layers} heads={n_heads} kv_heads={n_kv} "
          f"dtype={a.dtype} params={params} batch={a.batch} seq={a.seq} "
          f"tokens_per_s={a.batch * a.seq * a.steps / seconds:.1f} "
          f"step_ms={1e3 * seconds / a.steps:.2f} loss={value:.4f} "
          f"threads={torch.get_num_threads()} adamw={opt_kind} features={features or 'none'} "
          f"warmup_s={warmup_s:.1f} peak_rss_mib={peak_rss_mib():.1f} "
          f"step_peak_rss_mib={step_peak:.1f}")


if __name__ == "__main__":
    main()
