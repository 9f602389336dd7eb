"""PyTorch peer of minititan's GPU training benchmark: the Llama of bench/llama_torch_model.py
(minititan's architecture) trained with random tokens in PyTorch eager and with torch.compile,
printing tokens/s, step time, MFU and peak memory per mode. bench/gpu_llama_bench.sh runs it
beside minititan's `train` and prints one table of all three.

    python3 bench/gpu_llama_bench.py --preset 1b --seq 2048 --batch 4 --mode both
    python3 bench/gpu_llama_bench.py --preset tiny --device cpu --seq 64 --batch 2   # smoke test
    python3 bench/gpu_llama_bench.py --mode compile_float8          # torchao float8 + compile
    python3 bench/gpu_llama_bench.py --preset tiny --device cpu --seq 64 --batch 2 \
        --mode eager_float8 --float8-emulate                         # float8 smoke test (CPU)

The training step matches minititan's: float32 master weights, bf16 compute (torch.autocast),
f32 logits and cross-entropy, gradient clipping to max_norm, AdamW (fused on CUDA; betas 0.9,
0.95, eps 1e-8, weight decay 0.1). Timed with CUDA events over --steps steps after --warmup
steps (torch.compile compiles during the first one). MFU = flops_per_token x tokens/s / peak,
with minititan's FLOP formula and its peak table (H100 SXM: 989 TFLOP/s bf16 dense).

Float8 modes (eager_float8, compile_float8; rows "pytorch eager float8", "pytorch compile
float8"): the same model with its linears converted by torchao's convert_to_float8_training
(torchao.float8, Float8LinearConfig's default: the tensorwise recipe, dynamic per-tensor scales,
e4m3 inputs and weights, e5m2 gradients), skipping the linears whose name contains one of
--float8-filter-fqns (default "output", as torchtitan's filter_fqns) or whose dimensions are not
multiples of 16, as torchtitan's float8 converter does; then torch.compile for compile_float8. MFU
still counts bf16 FLOPs with the same formula and peak (torchtitan's convention), so float8
rows compare by tokens/s. torchao is not on the GPU machine's image: carry its wheel (.whl, see
/work/.library/device/README.md) and install it first; without torchao (or on a GPU before
sm_89) the mode writes an error row instead of training. gpu_llama_bench.sh runs them with
MODES="eager compile compile_float8".

--results FILE appends each mode's row as a JSON line; --table FILE prints the rows of FILE as a
table, with a row per minititan run (--minititan NAME DUMP LOG: the dump folder's metrics.jsonl,
and the log, for the parameter count and the assumed peak).
"""
import argparse
import gc
import json
import os
import re
import sys
import time

PRESETS = {  # minititan flavors (models/llama/model_args.cpp); "tiny" is for smoke tests only
    "1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
               multiple_of=256, ffn_dim_multiplier=1.5, tie_embeddings=True, rope_factor=32.0),
    "debugmodel": dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, vocab_size=2000,
                       multiple_of=256, ffn_dim_multiplier=None, tie_embeddings=False,
                       rope_factor=8.0),
    "tiny": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32,
                 ffn_dim_multiplier=1.5, tie_embeddings=True, rope_factor=32.0),
}

# train/metrics/peak_flops.cpp: dense bf16 peaks, matched by substrings of the device name.
PEAKS_BF16 = [("H200", "", 989e12), ("H100", "NVL", 835e12), ("H100", "PCIe", 756e12),
              ("H100", "", 989e12), ("B200", "", 2.25e15), ("A100", "", 312e12),
              ("L40S", "", 362e12), ("MI300X", "", 1307e12)]


def peak_flops(device_name, override_tflops=None):
    if override_tflops:
        return override_tflops * 1e12
    for part, variant, bf16 in PEAKS_BF16:
        if part in device_name and variant in device_name:
            return bf16
    env = os.environ.get("MT_CPU_PEAK_FLOPS")
    return float(env) if env and device_name == "cpu" else None


def fmt_row_line(row):
    keys = ("name", "error", "tokens_per_s", "step_ms", "mfu", "peak_mem_bytes", "loss_first", "loss_last",
            "first_step_s")
    return " ".join(f"{k}={row[k]:.6g}" if isinstance(row[k], float) else f"{k}={row[k]}"
                    for k in keys if row.get(k) is not None)


# ---- the PyTorch runs -----------------------------------------------------------------------

def mode_row_name(mode, float8_filter_fqns="output"):
    """"compile_float8" -> "pytorch compile float8"; a float8 mode that converts the output
    projection too (no filter_fqns entry matches "output") gets " +output", as minititan's row."""
    name = "pytorch " + mode.replace("_", " ")
    filters = [f for f in float8_filter_fqns.split(",") if f]
    if mode.endswith("_float8") and not any(f in "output" for f in filters):
        name += " +output"
    return name


def float8_unavailable(a, device):
    """Why a float8 mode cannot run here (None when it can): torchao missing, or a GPU without
    FP8 tensor cores (compute capability < 8.9) unless --float8-emulate."""
    import torch
    try:
        import torchao
        from torchao.float8 import convert_to_float8_training, Float8LinearConfig  # noqa: F401
    except Exception as e:  # ImportError, or a torchao built for another torch failing to load
        return (f"torchao is not importable ({type(e).__name__}: {e}); carry its wheel "
                "(.whl) and install it with pip --target, PYTHONPATH=that folder")
    if device.type == "cuda" and not a.float8_emulate:
        cap = torch.cuda.get_device_capability(device)
        if cap < (8, 9):
            return (f"float8 needs FP8 tensor cores (compute capability >= 8.9); "
                    f"{torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}")
    return None


def convert_float8(model, a):
    """torchtitan's float8 converter (tensorwise): torchao's convert_to_float8_training with
    Float8LinearConfig's defaults, skipping linears whose FQN contains a filter_fqns entry or
    whose weight dimensions are not multiples of 16. Returns the converted FQNs."""
    import torch.nn as nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    filter_fqns = [f for f in a.float8_filter_fqns.split(",") if f]
    converted = []

    def module_filter_fn(mod, fqn):
        if not isinstance(mod, nn.Linear) or any(f in fqn for f in filter_fqns):
            return False
        if mod.weight.shape[0] % 16 or mod.weight.shape[1] % 16:
            print(f"float8: {fqn} stays high precision (weight {tuple(mod.weight.shape)} not "
                  "multiples of 16)")
            return False
        converted.append(fqn)
        return True

    config = Float8LinearConfig(emulate=a.float8_emulate)  # default recipe: tensorwise
    convert_to_float8_training(model, config=config, module_filter_fn=module_filter_fn)
    return converted


def run_mode(mode, margs, a, device):
    import torch
    import torch.nn.functional as F
    from llama_torch_model import Transformer, flops_per_token

    base, float8 = mode.split("_")[0], mode.endswith("_float8")  # eager | compile, float8 or not
    cuda = device.type == "cuda"
    gc.collect()  # a previous mode's model and optimizer are gone before the peak is reset
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(a.seed)
    model = Transformer(margs, complex_rope=base != "compile").to(device)  # f32 master weights
    float8_info = None
    if float8:
        import torchao
        converted = convert_float8(model, a)
        float8_info = dict(recipe="tensorwise", torchao=torchao.__version__,
                           emulate=a.float8_emulate, converted_linears=len(converted),
                           filter_fqns=a.float8_filter_fqns)
        print(f"float8: torchao {torchao.__version__}, {len(converted)} linears converted "
              f"(tensorwise{', emulated' if a.float8_emulate else ''}), filter_fqns "
              f"{a.float8_filter_fqns!r}", flush=True)
    params = list(model.parameters())
    opt_kw = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = torch.optim.AdamW(params, fused=True, **opt_kw) if cuda else \
        torch.optim.AdamW(params, **opt_kw)

    def loss_fn(inputs, targets):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(inputs)  # f32 logits, as minititan's Transformer returns them
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    step_loss = torch.compile(loss_fn) if base == "compile" else loss_fn
    gen = torch.Generator(device=device).manual_seed(a.seed)
    batches = []
    for _ in range(4):  # a few random batches on the device, reused
        t = torch.randint(0, margs.vocab_size, (a.batch, a.seq + 1), device=device, generator=gen)
        batches.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))

    def step(i):
        loss = step_loss(*batches[i % len(batches)])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, a.max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    loss_first = step(0).item()
    first_step_s = time.perf_counter() - t0
    for i in range(1, a.warmup):
        step(i)
    sync()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss = step(a.warmup + i)
    if cuda:
        end.record()
        sync()
        seconds = start.elapsed_time(end) / 1e3
    else:
        seconds = time.perf_counter() - t0
    loss_last = loss.item()

    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = peak_flops(device_name, a.peak_tflops)
    fpt = flops_per_token(margs, a.seq)
    tps = a.batch * a.seq * a.steps / seconds
    row = dict(name=mode_row_name(mode, a.float8_filter_fqns),
               framework=f"pytorch-{torch.__version__}",
               device_name=device_name, params=sum(p.numel() for p in params),
               flops_per_token=fpt, batch=a.batch, seq=a.seq, steps=a.steps, warmup=a.warmup,
               tokens_per_s=tps, step_ms=1e3 * seconds / a.steps,
               mfu=fpt * tps / peak if peak else None, peak_flops=peak,
               peak_mem_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
               loss_first=loss_first, loss_last=loss_last, first_step_s=first_step_s)
    if float8_info:
        row["float8"] = float8_info
    return row


# ---- minititan's row, from its run ----------------------------------------------------------

def minititan_row(name, dump, log_path, batch, seq, warmup, margs):
    """Aggregates the metrics lines of steps > warmup (metrics.jsonl: one line per logged step;
    a line's tokens_per_sec covers the steps since the previous logged line)."""
    from llama_torch_model import count_parameters, flops_per_token
    lines = []
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        for text in f:
            m = json.loads(text)
            if "tokens_per_sec" in m:
                lines.append(m)
    steps, inv_tps, mfu_per_tps, prev = 0, 0.0, None, 0
    for m in lines:
        n = m["step"] - prev
        if prev >= warmup and m["tokens_per_sec"] > 0:
            steps += n
            inv_tps += n / m["tokens_per_sec"]
            if m.get("mfu") is not None:
                mfu_per_tps = m["mfu"] / m["tokens_per_sec"]
        prev = m["step"]
    if steps == 0:
        raise ValueError(f"{dump}/metrics.jsonl has no metrics line after step {warmup}")
    tps = steps / inv_tps
    log = open(log_path, errors="replace").read() if log_path else ""
    params = re.search(r"model: \S+ \S+, (\d+) parameters", log)
    peak_line = re.search(r"^.*peak.*(?:FLOP|flop).*$", log, re.M)
    fpt = flops_per_token(margs, seq)
    peaks = [m["mem_peak_bytes"] for m in lines if m.get("mem_peak_bytes") is not None]
    return dict(name=name, framework="minititan", device_name=None,
                params=int(params.group(1)) if params else count_parameters(margs),
                flops_per_token=fpt, batch=batch, seq=seq, steps=steps, warmup=warmup,
                tokens_per_s=tps, step_ms=1e3 * batch * seq / tps,
                mfu=mfu_per_tps * tps if mfu_per_tps is not None else None,
                peak_mem_bytes=max(peaks) if peaks else None,
                loss_first=lines[0]["loss"], loss_last=lines[-1]["loss"],
                peak_note=peak_line.group(0).strip() if peak_line else None)


def print_table(rows, peak_tflops, margs, batch, seq, gpu_name=None):
    from llama_torch_model import count_parameters, flops_per_token
    gib = 1024.0 ** 3
    by_name = {r["name"]: r for r in rows}
    devices = sorted({r["device_name"] for r in rows if r.get("device_name")})
    devices = devices or ([gpu_name] if gpu_name else [])
    peak = peak_flops(devices[0], peak_tflops) if devices else None
    print(f"GPU: {', '.join(devices) or 'unknown'}; MFU against "
          + (f"{peak / 1e12:.0f} TFLOP/s bf16 dense" if peak else "an unknown peak")
          + " (train/metrics/peak_flops.cpp's table)")
    for r in rows:
        if r.get("peak_note"):
            print(f"{r['name']} log: {r['peak_note']}")
    print(f"model: {count_parameters(margs) / 1e6:,.1f}M parameters, "
          f"{flops_per_token(margs, seq) / 1e9:.2f} GFLOP/token; batch {batch} x seq {seq}; "
          "timed steps after warm-up")
    note = None
    w = max([24] + [len(r["name"]) for r in rows])  # the name column
    head = (f"{'framework':<{w}} {'tokens/s':>10} {'step ms':>9} {'MFU':>7} {'peak mem':>10} "
            f"{'loss first->last':>18} {'params':>12}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<{w}} failed: {r['error']}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        if r.get("mfu") is None and peak:  # the run knew no peak: the same formula, here
            mfu = f"{100 * r['flops_per_token'] * r['tokens_per_s'] / peak:.1f}%*"
            note = "*: MFU computed here (the run reported none)"
        mem = f"{r['peak_mem_bytes'] / gib:.1f} GiB" if r.get("peak_mem_bytes") else "n/a"
        loss = f"{r['loss_first']:.3f}->{r['loss_last']:.3f}"
        print(f"{r['name']:<{w}} {r['tokens_per_s']:>10.0f} {r['step_ms']:>9.1f} {mfu:>7} "
              f"{mem:>10} {loss:>18} {r['params']:>12}")
    if note:
        print(note)
    for r in rows:  # every MFU is bf16 FLOPs against the bf16 peak, float8 rows too
        if "error" not in r and r.get("mfu") is not None and peak:
            bf16 = r["flops_per_token"] * r["tokens_per_s"] / peak
            if abs(r["mfu"] - bf16) > 0.02 * bf16:
                print(f"WARNING: {r['name']} reported MFU {100 * r['mfu']:.1f}%, not the "
                      f"{100 * bf16:.1f}% of bf16 FLOPs / {peak / 1e12:.0f} TFLOP/s")
    for mine, peer in (("minititan", "pytorch eager"), ("minititan", "pytorch compile"),
                       ("minititan float8", "minititan"),
                       ("minititan float8", "pytorch compile float8"),
                       ("minititan float8", "pytorch compile"),
                       ("minititan float8 +output", "minititan"),
                       ("minititan float8 +output", "pytorch compile float8 +output"),
                       ("pytorch compile float8", "pytorch compile"),
                       ("pytorch eager float8", "pytorch eager")):
        ours, other = by_name.get(mine), by_name.get(peer)
        if ours and other and "error" not in ours and "error" not in other:
            print(f"{mine} / {peer}: {ours['tokens_per_s'] / other['tokens_per_s']:.2f}x "
                  "tokens/s")
    params = {r["params"] for r in rows if "error" not in r}
    if len(params) > 1:
        print(f"WARNING: the runs' parameter counts differ: {sorted(params)}")


def model_args(a):
    from llama_torch_model import ModelArgs
    kw = dict(PRESETS[a.preset])
    for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size"):
        if getattr(a, k) is not None:
            kw[k] = getattr(a, k)
    return ModelArgs(max_seq_len=a.seq, **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=PRESETS, default="1b")
    for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size"):
        p.add_argument("--" + k.replace("_", "-"), dest=k, type=int, default=None)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (>= 1)")
    p.add_argument("--mode", choices=("eager", "compile", "both", "eager_float8",
                                      "compile_float8"), default="both",
                   help="both: eager, then compile; *_float8: torchao float8 (tensorwise)")
    p.add_argument("--float8-filter-fqns", default="output",
                   help="float8 modes: comma-separated; linears whose name contains one stay "
                        "high precision (torchtitan's filter_fqns)")
    p.add_argument("--float8-emulate", action="store_true",
                   help="float8 modes: torchao's emulation (no FP8 GEMMs: CPU smoke tests)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--max-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-tflops", type=float, default=None, help="override the peak table")
    p.add_argument("--results", help="append each mode's row to this JSON-lines file")
    p.add_argument("--table", help="print the rows of this JSON-lines file (no training)")
    p.add_argument("--minititan", nargs=3, action="append", default=[],
                   metavar=("NAME", "DUMP", "LOG"),
                   help="with --table: a row NAME from a minititan run's dump folder and log")
    p.add_argument("--gpu-name", help="with --table: the GPU, when no PyTorch row names it")
    a = p.parse_args()
    a.warmup = max(a.warmup, 1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    margs = model_args(a)

    if a.table:
        rows = []
        for name, dump, log in a.minititan:
            try:
                rows.append(minititan_row(name, dump, log, a.batch, a.seq, a.warmup, margs))
            except (OSError, ValueError, KeyError) as e:
                rows.append(dict(name=name, error=str(e)))
        if os.path.exists(a.table):
            with open(a.table) as f:
                rows += [json.loads(line) for line in f if line.strip()]
        if not rows:
            sys.exit(f"no rows in {a.table}")
        print_table(rows, a.peak_tflops, margs, a.batch, a.seq, a.gpu_name)
        return

    import torch
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_llama_bench: no CUDA device (use --device cpu for a smoke test)")
    modes = ["eager", "compile"] if a.mode == "both" else [a.mode]
    rows = []
    for mode in modes:
        why = None
        if mode.startswith("compile") and not hasattr(torch, "compile"):
            why = f"torch {torch.__version__} has no compile"
        elif mode.endswith("_float8"):
            why = float8_unavailable(a, device)
        name = mode_row_name(mode, a.float8_filter_fqns)
        row = dict(name=name, error=why) if why else run_mode(mode, margs, a, device)
        rows.append(row)
        print(fmt_row_line(row), flush=True)
        if a.results:
            with open(a.results, "a") as f:
                f.write(json.dumps(row) + "\n")
    print_table(rows, a.peak_tflops, margs, a.batch, a.seq)


if __name__ == "__main__":
    main()
