#!/usr/bin/env bash
# GPU training throughput, one run: Llama 3 1B (Llama 3.2 1B shapes, configs/llama3_1b_bench.toml)
# trained by minititan's `train`, then the same architecture, shapes, batch and optimizer in
# PyTorch eager and with torch.compile (bench/gpu_llama_bench.py); prints one table of tokens/s,
# step time, MFU and peak memory. Random tokens (bench/make_bench_data.py), no activation
# checkpointing, bf16 compute with float32 master weights. On the GPU machine, with `train`
# bundled into .device/ (../shared/tools/device-bundle .device build-X/train/train):
#
#   source .device/device-env.sh && bash bench/gpu_llama_bench.sh
#
# minititan logs (and so reads its loss on the host, waiting for the GPU) every LOG_FREQ steps,
# by default the largest period with a line at the end of the warm-up and at the last step: the
# PyTorch runs time their steps back to back and read the loss once, after the last. LOG_FREQ=1
# makes minititan wait for every step.
#
# Environment (defaults): BATCH (4), SEQ (2048), WARMUP (10 untimed steps), STEPS (20 timed), TRAIN
# (.device/bin/train), PYTHON (python3, with torch >= 2.0, numpy, h5py), BENCH_DIR
# (out/gpu_llama_bench), MODES ("eager compile"; MODES="" runs minititan's rows alone), and time
# limits in seconds per run: MT_TIMEOUT (240), EAGER_TIMEOUT (120), COMPILE_TIMEOUT (240, each
# compile* mode); MT_BASELINE (0; 1: a second minititan row that waits for every step and runs
# deterministic kernels); MT_FLOAT8 (0; 1: a row "minititan float8", dump folder
# BENCH_DIR/minititan_float8, trained with --quantize.linear.float8.enable=true: the tensorwise
# recipe, filter_fqns ["output"]; its MFU is the one `train` reports, meant in bf16 FLOPs against
# the bf16 peak as torchtitan counts; MT_FLOAT8_ROWWISE=1 adds a row "minititan float8 rowwise", the
# same with recipe_name = rowwise; MT_FLOAT8_FSDP=1 adds "minititan float8 fsdp-fp8-ag", tensorwise
# with enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp: the weights go
# from their f32 shards to FP8 codes before FSDP's gather, as torchtitan's float8 recipe runs;
# MT_FLOAT8_OUTPUT=1 adds "minititan float8 +output", tensorwise with filter_fqns [] (the output
# projection in FP8 too: outside the issue's recipe, to size what the bf16 output layer costs;
# with compile_float8 in MODES, a row "pytorch compile float8 +output" converts it in torchao too);
# TRAIN_ARGS and TORCH_ARGS: more flags for `train` (e.g.
# --activation_checkpoint.mode=full) and for gpu_llama_bench.py (every mode).
# MODES may also name eager_float8 and compile_float8: the PyTorch model with torchao's
# convert_to_float8_training (tensorwise, the output projection left in bf16), rows "pytorch eager
# float8" and "pytorch compile float8", MFU in bf16 FLOPs like the others. torchao is not on the
# GPU machine's image: carry its wheel (.whl, see /work/.library/device/README.md) and install it
# first, else those rows say torchao is missing. bf16 and float8, both frameworks, in one run:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   source .device/device-env.sh && MT_FLOAT8=1 MODES="compile compile_float8" \
#     bash bench/gpu_llama_bench.sh
# minititan's numbers are its own metrics (BENCH_DIR/minititan/metrics.jsonl, the steps after
# WARMUP), not measured again here. The logs are BENCH_DIR/*.log; to bring them back from the
# device machine: cp BENCH_DIR/*.log BENCH_DIR/rows.jsonl "$OUT"/ afterwards.
set -uo pipefail
cd "$(dirname "$0")/.."
BATCH=${BATCH:-4} SEQ=${SEQ:-2048} WARMUP=${WARMUP:-10} STEPS=${STEPS:-20}
TRAIN=${TRAIN:-.device/bin/train} PYTHON=${PYTHON:-python3}
BENCH_DIR=${BENCH_DIR:-out/gpu_llama_bench}  # removed and made again; not $OUT, which it leaves be
MODES=${MODES-eager compile}  # set but empty: no PyTorch rows
gcd() { local a=$1 b=$2; while [ "$b" -ne 0 ]; do set -- "$b" $((a % b)); a=$1 b=$2; done; echo "$a"; }
LOG_FREQ=${LOG_FREQ:-$(gcd "$WARMUP" "$STEPS")}
shape=(--preset 1b --batch "$BATCH" --seq "$SEQ" --warmup "$WARMUP" --steps "$STEPS" ${TORCH_ARGS:-})

# Python without the bundle's libraries (.device/lib: this build machine's zlib, HDF5, ... could
# shadow the newer ones that torch and h5py were built against).
py_libs=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep -v '/\.device/lib$' | paste -sd: -)
py() { LD_LIBRARY_PATH=$py_libs "$PYTHON" "$@"; }

rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR" || exit 1
rows=$BENCH_DIR/rows.jsonl
error_row() {  # NAME MESSAGE: a failed run's row for the table
  py -c 'import json, sys; print(json.dumps({"name": sys.argv[1], "error": sys.argv[2]}))' \
    "$1" "$2" >>"$rows"
}
last_error() {  # the log's last error line, else its last line
  { grep -iE 'error|out of memory' "$1" || tail -1 "$1"; } | tail -1 | cut -c1-200
}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "$(date -u +%Y-%m-%dT%H:%MZ)  ${gpu:-no nvidia-smi}"
echo "torch $(py -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)"
echo "batch $BATCH x seq $SEQ, $WARMUP warm-up + $STEPS timed steps; minititan logs every $LOG_FREQ"

py bench/make_bench_data.py --out "$BENCH_DIR/data" || exit 1

# minititan: its train log's metrics (run_minititan NAME FOLDER ARGS...: a row named NAME).
mt_rows=()
run_minititan() {
  local name=$1 dir=$BENCH_DIR/$2 rc
  shift 2
  echo "$name: $TRAIN (log: $dir.log)"
  if [ ! -x "$TRAIN" ]; then
    error_row "$name" "no executable $TRAIN (bundle it with ../shared/tools/device-bundle)"
    return
  fi
  timeout "${MT_TIMEOUT:-240}" "$TRAIN" --config configs/llama3_1b_bench.toml \
    --job.dump_folder="$dir" --model.tokenizer_path="$BENCH_DIR/data/tokenizer" \
    --training.dataset_path="$BENCH_DIR/data/tokens.h5" --training.local_batch_size="$BATCH" \
    --training.seq_len="$SEQ" --training.steps=$((WARMUP + STEPS)) "$@" ${TRAIN_ARGS:-} \
    >"$dir.log" 2>&1
  rc=$?
  grep -E '^(model|note|step +[0-9]+ )' "$dir.log" | sed -n '1,3p;$p'
  if [ $rc -eq 0 ]; then
    mt_rows+=(--minititan "$name" "$dir" "$dir.log")
  else
    tail -5 "$dir.log"
    error_row "$name" "exit $rc$([ $rc -eq 124 ] && echo ' (timed out)'): $(last_error "$dir.log")"
  fi
}
run_minititan minititan minititan --metrics.log_freq="$LOG_FREQ"
# MT_BASELINE=1: again as before the host ran ahead and attention's backward could be
# non-deterministic: a wait for every step, cuDNN's deterministic backward.
if [ "${MT_BASELINE:-0}" = 1 ]; then
  run_minititan "minititan (sync, det.)" minititan_baseline --metrics.log_freq=1 \
    --training.deterministic=true
fi
# MT_FLOAT8=1: float8 linears (tensorwise), as in the issue's goal against the bf16 row above.
if [ "${MT_FLOAT8:-0}" = 1 ]; then
  run_minititan "minititan float8" minititan_float8 --metrics.log_freq="$LOG_FREQ" \
    --quantize.linear.float8.enable=true
fi
if [ "${MT_FLOAT8_ROWWISE:-0}" = 1 ]; then
  run_minititan "minititan float8 rowwise" minititan_float8_rowwise \
    --metrics.log_freq="$LOG_FREQ" --quantize.linear.float8.enable=true \
    --quantize.linear.float8.recipe_name=rowwise
fi
if [ "${MT_FLOAT8_FSDP:-0}" = 1 ]; then
  run_minititan "minititan float8 fsdp-fp8-ag" minititan_float8_fsdp \
    --metrics.log_freq="$LOG_FREQ" --quantize.linear.float8.enable=true \
    --quantize.linear.float8.enable_fsdp_float8_all_gather=true \
    --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp=true
fi
if [ "${MT_FLOAT8_OUTPUT:-0}" = 1 ]; then
  run_minititan "minititan float8 +output" minititan_float8_output \
    --metrics.log_freq="$LOG_FREQ" --quantize.linear.float8.enable=true \
    "--quantize.linear.float8.filter_fqns=[]"
fi

# PyTorch: one process per row, so each peak memory is its own. run_peer MODE NAME [ARGS...]
run_peer() {
  local mode=$1 name=$2 limit log rc
  shift 2
  case $mode in compile*) limit=${COMPILE_TIMEOUT:-240} ;; *) limit=${EAGER_TIMEOUT:-120} ;; esac
  log=$BENCH_DIR/torch_${name#pytorch }.log
  log=${log// +/_} log=${log// /_}
  echo "$name (log: $log)"
  LD_LIBRARY_PATH=$py_libs timeout "$limit" "$PYTHON" bench/gpu_llama_bench.py "${shape[@]}" \
    --mode "$mode" --results "$rows" "$@" >"$log" 2>&1
  rc=$?
  grep -E '^(name=|float8:)' "$log"
  if [ $rc -ne 0 ]; then
    tail -5 "$log"
    grep -q "\"$name\"" "$rows" 2>/dev/null ||
      error_row "$name" "exit $rc$([ $rc -eq 124 ] && echo ' (timed out)'): $(last_error "$log")"
  fi
}
for mode in $MODES; do
  run_peer "$mode" "pytorch ${mode//_/ }"  # gpu_llama_bench.py's row name for the mode
done
# MT_FLOAT8_OUTPUT=1 beside compile_float8: the peer with its output projection in FP8 too.
if [ "${MT_FLOAT8_OUTPUT:-0}" = 1 ] && [[ " $MODES " == *" compile_float8 "* ]]; then
  run_peer compile_float8 "pytorch compile float8 +output" --float8-filter-fqns=
fi

echo
py bench/gpu_llama_bench.py "${shape[@]}" --table "$rows" "${mt_rows[@]}" --gpu-name "$gpu"
