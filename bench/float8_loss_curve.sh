#!/usr/bin/env bash
# Float8 numerics, end to end: a debug model (CONFIG, default configs/debug_model.toml: Llama 3
# debugmodel on tinyshakespeare, GPT-2 tokenizer, AdamW, seed 0, deterministic kernels) trained
# STEPS steps three ways from the same seed and data order, then one table of their losses and
# how far the float8 curve is from the others (issue 32: within 1% of bf16's over 300 steps):
#   f32     training.mixed_precision_param = "float32" (the config's own)
#   bf16    training.mixed_precision_param = "bfloat16" (bf16 compute, f32 master weights)
#   float8  --quantize.linear.float8.enable=true (tensorwise, filter_fqns ["output"]) with
#           mixed_precision_param = F8_PARAM (bfloat16: the rest of the step in bf16, as in the
#           bf16 run, so the two differ only in the float8 linears); on the CPU also
#           --quantize.linear.float8.emulate=true (the exact CPU reference: e4m3/e5m2 codes, an
#           f32 GEMM on their values)
#
#   bash bench/float8_loss_curve.sh                       # all three, 300 steps each (CPU)
#   VARIANTS=float8 bash bench/float8_loss_curve.sh       # only float8 again; the table reads
#                                                         #   the f32 and bf16 runs left before
#   DEVICE=cuda TRAIN=.device/bin/train DATA=.device/data bash bench/float8_loss_curve.sh  # GPU
#   CONFIG=configs/moe_debug.toml F8_EXTRA="--quantize.grouped_mm.float8.fqns=experts \
#     --quantize.grouped_mm.float8.emulate=true" bash bench/float8_loss_curve.sh  # MoE, float8
#                                                         #   experts and linears
#
# Each run logs every step (--metrics.log_freq=1, validation off); its loss curve is
# OUT_DIR/<variant>/metrics.jsonl (one JSON line per logged step: "step", "loss", ...), its output
# OUT_DIR/<variant>.log. The table: the loss at a few steps, then over the last WINDOW steps the
# largest per-step relative difference |a - b| / b and the relative difference of the window means,
# float8 against bf16 and f32 and, for scale, bf16 against f32. STRICT=1: exit 3 when float8's
# largest per-step difference from bf16 is over TOL.
#
# Environment (defaults): STEPS (300), VARIANTS ("f32 bf16 float8": the runs to make; the table
# uses every variant whose metrics.jsonl has STEPS steps), CONFIG (configs/debug_model.toml),
# F8_EXTRA (more flags for the float8 run), TRAIN (build/train/train), DEVICE (cpu),
# DATA (../shared/data: tinyshakespeare.txt, gpt2/tokenizer.json), OUT_DIR
# (out/float8_loss_curve; a variant's folder is removed before it runs), F8_PARAM (bfloat16),
# WINDOW (100), TOL (0.01), STRICT (0), RUN_TIMEOUT (3600 s per run), TRAIN_ARGS (more flags for
# every run), PYTHON (python3, standard library only).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
STEPS=${STEPS:-300} VARIANTS=${VARIANTS:-f32 bf16 float8} TRAIN=${TRAIN:-build/train/train}
DEVICE=${DEVICE:-cpu} DATA=${DATA:-../shared/data} OUT_DIR=${OUT_DIR:-out/float8_loss_curve}
F8_PARAM=${F8_PARAM:-bfloat16} WINDOW=${WINDOW:-100} TOL=${TOL:-0.01} STRICT=${STRICT:-0}
PYTHON=${PYTHON:-python3} CONFIG=${CONFIG:-configs/debug_model.toml}

[ -x "$TRAIN" ] || { echo "float8_loss_curve: no executable $TRAIN (build it first)" >&2; exit 2; }
mkdir -p "$OUT_DIR" || exit 2
common=(--config "$CONFIG" --training.steps="$STEPS" --training.device="$DEVICE"
        --training.dataset_path="$DATA/tinyshakespeare.txt"
        --model.tokenizer_path="$DATA/gpt2/tokenizer.json" --metrics.log_freq=1
        --metrics.save_jsonl=true --metrics.plot=false --validation.enable=false)
variant_args() {
  case $1 in
    f32) echo --training.mixed_precision_param=float32 ;;
    bf16) echo --training.mixed_precision_param=bfloat16 ;;
    float8)
      echo --training.mixed_precision_param="$F8_PARAM" --quantize.linear.float8.enable=true \
        "${F8_EXTRA:-}"
      if [ "$DEVICE" = cpu ]; then echo --quantize.linear.float8.emulate=true; fi ;;
    *) return 1 ;;
  esac
}

echo "$(date -u +%Y-%m-%dT%H:%MZ)  $CONFIG, $STEPS steps on $DEVICE; runs: $VARIANTS"
failed=0
for v in $VARIANTS; do
  args=$(variant_args "$v") || { echo "float8_loss_curve: unknown variant '$v'" >&2; exit 2; }
  dir=$OUT_DIR/$v
  rm -rf "$dir"
  echo "$v: $TRAIN ... $(tr '\n' ' ' <<<"$args")(log: $dir.log)"
  start=$SECONDS
  # shellcheck disable=SC2086  # $args and TRAIN_ARGS: one flag a word
  timeout "${RUN_TIMEOUT:-3600}" "$TRAIN" "${common[@]}" $args --job.dump_folder="$dir" \
    ${TRAIN_ARGS:-} >"$dir.log" 2>&1
  rc=$?
  echo "  exit $rc after $((SECONDS - start)) s; $(grep -E '^step +[0-9]+ ' "$dir.log" | tail -1)"
  if [ $rc -ne 0 ]; then
    failed=1
    tail -5 "$dir.log" | sed 's/^/  | /'
  fi
done

"$PYTHON" - "$OUT_DIR" "$STEPS" "$WINDOW" "$TOL" "$STRICT" <<'EOF'
import json, os, sys

out_dir, steps, window, tol, strict = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    float(sys.argv[4]), sys.argv[5] == "1"
curves = {}
for v in ("f32", "bf16", "float8"):
    path = os.path.join(out_dir, v, "metrics.jsonl")
    if not os.path.exists(path):
        print(f"{v}: no {path}")
        continue
    c = {}
    with open(path) as f:
        for line in f:
            m = json.loads(line)
            if "loss" in m:
                c[m["step"]] = m["loss"]
    missing = [s for s in range(1, steps + 1) if s not in c]
    if missing:
        print(f"{v}: {path} lacks {len(missing)} of steps 1..{steps} (first {missing[0]}): "
              "left out")
        continue
    curves[v] = c
if not curves:
    sys.exit("float8_loss_curve: no complete run to compare")

names = list(curves)
show = sorted({s for s in (1, 10, 25, 50, 100, 150, 200, 250, 300, steps) if s <= steps})
print()
print(f"{'step':>6} " + " ".join(f"{n:>10}" for n in names))
for s in show:
    print(f"{s:>6} " + " ".join(f"{curves[n][s]:>10.4f}" for n in names))

w = min(window, steps)
lo = steps - w + 1
print(f"\nlast {w} steps ({lo}..{steps}): max |a - b| / b per step, and (mean a - mean b) / mean b")
worst = None
for a, b in (("float8", "bf16"), ("float8", "f32"), ("bf16", "f32")):
    if a not in curves or b not in curves:
        continue
    ca, cb = curves[a], curves[b]
    rel = [(abs(ca[s] - cb[s]) / abs(cb[s]), s) for s in range(lo, steps + 1)]
    mx, at = max(rel)
    ma, mb = (sum(c[s] for s in range(lo, steps + 1)) / w for c in (ca, cb))
    print(f"  {a:>6} vs {b:<5} max {100 * mx:7.3f}% (step {at}), "
          f"means {100 * (ma - mb) / mb:+7.3f}%")
    if (a, b) == ("float8", "bf16"):
        worst = mx
if worst is not None:
    ok = worst <= tol
    print(f"float8 vs bf16: {'within' if ok else 'NOT within'} {100 * tol:g}% at every one of "
          f"the last {w} steps")
    if strict and not ok:
        sys.exit(3)
EOF
rc=$?
[ $rc -ne 0 ] && exit $rc
exit $failed
