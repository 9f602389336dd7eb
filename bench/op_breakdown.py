#!/usr/bin/env python3
"""Per-op time of one CPU training step: minititan against PyTorch eager and torch.compile.

Runs llama_train_step_bench --profile 1 and bench/llama_train_step_torch.py --profile (eager, and
--compile, where inductor's C++ kernels are profiled one by one), maps every op or kernel to a
part of the step (GEMMs, attention, RMSNorm, RoPE, SwiGLU, cross-entropy, optimizer, adds and
casts) and prints a markdown table of milliseconds per part, with the step's wall time. Inductor
fuses across those parts (e.g. the residual add into the next RMSNorm, casts into everything); a
fused kernel is counted once, under the first part its name matches, in the order of PARTS.

  bench/op_breakdown.py --model 20M --dtype bf16 [--threads 2] [--python /venv/bin/python]

Each profile is of the last of a few steps, so numbers vary by some per cent between runs: use
them for where the time goes, bench/compare_train_step.sh for throughput.
"""
import argparse
import os
import re
import subprocess
import sys

# (part, regex over minititan op names, regex over PyTorch op / inductor kernel names)
PARTS = [
    ("GEMMs (linear layers)", r"^matmul$", r"^aten::(mm|addmm|bmm)$"),
    ("attention forward", r"^scaled_dot_product_attention$",
     r"^aten::_scaled_dot_product_\w+attention\w*(?<!backward)$"),
    ("attention backward", r"^scaled_dot_product_attention_backward$",
     r"^aten::_scaled_dot_product_\w+attention\w*backward$"),
    ("RoPE", r"^apply_rope$", r"cpp_fused.*(stack|select_backward|slice_backward)|^aten::(cat|neg)$"),
    ("RMSNorm (inductor: + residual add)", r"^rms_norm(_backward)?$",
     r"cpp_fused.*(rsqrt|pow)|^aten::(pow|rsqrt|mean)$"),
    ("SwiGLU", r"^swiglu(_backward)?$", r"cpp_fused.*silu|^aten::silu(_backward)?$"),
    ("cross-entropy", r"^cross_entropy(_backward)?$", r"cpp_fused.*(log_softmax|nll)|^aten::(_log_softmax|_log_softmax_backward_data|nll_loss\w*)$"),
    ("optimizer (AdamW)", r"^adamw\w*$", r"^aten::_fused_adamw_$|^aten::_foreach\w*$"),
    ("embedding", r"^embedding(_backward)?$", r"cpp_fused.*embedding|^aten::embedding\w*$"),
    ("adds, muls, casts, fills", r"^(binary|binary_scalar|copy_|fill_|sum|clamp)$",
     r"cpp_fused|^aten::(add_?|mul|div|sub|sum|copy_|fill_|zero_|_to_copy|to)$"),
]

UNIT = {"s": 1e3, "ms": 1.0, "us": 1e-3}


def ours(exe, a):
    cmd = [exe, "--model", a.model, "--dtype", a.dtype, "--steps", "3", "--warmup", "2",
           "--profile", "1"]
    out = run(cmd, a.threads)
    ops = {}
    for line in out.splitlines():
        m = re.match(r"\s+(\S+)\s+\d+ calls\s+([\d.]+) ms", line)
        if m:
            ops[m.group(1)] = float(m.group(2))
    step = float(re.search(r"step_ms=([\d.]+)", out).group(1))
    return ops, step


def peer(python, a, compiled):
    script = os.path.join(os.path.dirname(__file__), "llama_train_step_torch.py")
    cmd = [python, script, "--model", a.model, "--dtype", a.dtype, "--steps", "3", "--warmup",
           "2", "--threads", str(a.threads), "--profile"] + (["--compile"] if compiled else [])
    out = run(cmd, a.threads)
    ops = {}
    for line in out.splitlines():
        # Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg, # of Calls
        m = re.match(r"\s*(.+?)\s+[\d.]+%\s+([\d.]+)(s|ms|us)\s+[\d.]+%", line)
        if m:
            ops[m.group(1)] = ops.get(m.group(1), 0.0) + float(m.group(2)) * UNIT[m.group(3)]
    step = float(re.search(r"step_ms=([\d.]+)", out).group(1))
    return ops, step


def run(cmd, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def by_part(ops, column):
    parts = {name: 0.0 for name, _, _ in PARTS}
    for op, ms in ops.items():
        for name, *patterns in PARTS:
            if re.search(patterns[column], op):
                parts[name] += ms
                break
    return parts


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="20M", choices=("debugmodel", "20M", "88M"))
    p.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--python", default=os.environ.get("PYTHON", sys.executable),
                   help="a Python with torch (default: $PYTHON, else this one)")
    p.add_argument("--exe", default="build/bench/llama_train_step_bench")
    a = p.parse_args()
    ops, step = ours(a.exe, a)
    columns = [("minititan", (by_part(ops, 0), step))]
    for compiled in (False, True):
        ops, step = peer(a.python, a, compiled)
        columns.append(("PyTorch compile" if compiled else "PyTorch eager", (by_part(ops, 1), step)))
    print(f"model {a.model}, {a.dtype}, {a.threads} threads: ms per step by part")
    print("| part | " + " | ".join(name for name, _ in columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    for name, _, _ in PARTS:
        print(f"| {name} | " + " | ".join(f"{parts[name]:.1f}" for _, (parts, _) in columns) + " |")
    print("| step (wall) | " + " | ".join(f"{step:.1f}" for _, (_, step) in columns) + " |")


if __name__ == "__main__":
    main()
