#!/usr/bin/env bash
# One device-machine call that checks the CUDA build end to end: every GPU test (label gpu),
# then the dense and the MoE debug models and the synthetic-Criteo DLRM trained 40 steps on the
# CPU and on the GPU from the same seed, with the two loss columns side by side. Packed here by bench/gpu_bundle.sh into
# .device/bundle.tar.xz (binaries, their libraries and the test data); there (carry [".device"]):
#   bash bench/gpu_check.sh "$OUT/check"
# Logs go to RESULT_DIR (default out/gpu_check); the last lines printed are the summary.
# Environment (defaults): PARTS ("tests train": which halves to run), TEST_TIMEOUT (180 s per test
# binary), TRAIN_TIMEOUT (300 s per training run), STEPS (40), TRAIN_CONFIGS ("debug_model moe_debug
# dlrm_criteo_synthetic": which configs the training half runs).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-out/gpu_check}
mkdir -p "$dir"
if [ ! -d .device/bin ] && [ -f .device/bundle.tar.xz ]; then tar xJf .device/bundle.tar.xz -C .device; fi
# shellcheck disable=SC1091
source .device/device-env.sh
# The CPU runs: spinning OpenMP threads fight OpenBLAS's own threads (docs/training.md), the
# likely reason the first H200 run's CPU debug model managed only 683 tokens/s on 16 cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-16}  # OpenBLAS threads: short spins too
# The tests that read shared data (tinyshakespeare: the replay of a traced GPU step) find the
# bundle's copy.
export MT_SHARED_DATA=${MT_SHARED_DATA:-$PWD/.device/data}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
summary=()
parts=${PARTS:-tests train}
[[ " $parts " == *" tests "* ]] && for t in .device/bin/*_gpu_test; do
  name=$(basename "$t")
  timeout "${TEST_TIMEOUT:-180}" "$t" >"$dir/$name.log" 2>&1
  rc=$?
  summary+=("$name rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]' "$dir/$name.log" | tr '\n' ' ')")
done
data=.device/data
steps=${STEPS:-40}
common=(--training.steps="$steps" --lr_scheduler.warmup_steps=$((steps / 4)) --metrics.log_freq=1 --validation.enable=false
        --metrics.plot=false --training.dataset_path=$data/tinyshakespeare.txt
        --model.tokenizer_path=$data/gpt2/tokenizer.json)
# Trains configs/$1.toml (then its extra flags) on the CPU and on the GPU, prints both loss columns.
train_both() {
  local cfg=$1 dev
  shift
  for dev in cpu cuda; do
    timeout "${TRAIN_TIMEOUT:-300}" .device/bin/train --config "configs/$cfg.toml" "$@" --training.device=$dev \
      --job.dump_folder="$dir/${cfg}_$dev" >"$dir/${cfg}_$dev.log" 2>&1
    summary+=("train $cfg $dev rc=$?")
  done
  echo "---- $cfg losses (cpu | cuda)"
  paste <(grep -oE 'loss[ =:]+[0-9.]+' "$dir/${cfg}_cpu.log" | head -40) \
        <(grep -oE 'loss[ =:]+[0-9.]+' "$dir/${cfg}_cuda.log" | head -40) | awk 'NR%5==1'
  tail -3 "$dir/${cfg}_cuda.log"
}
# The dense debug model and the MoE one (router + grouped experts on cuBLAS) on tinyshakespeare;
# DLRM on synthetic Criteo-like data (no files needed): tables, row optimizers and MLPs.
[[ " $parts " == *" train "* ]] &&
  for cfg in ${TRAIN_CONFIGS:-debug_model moe_debug dlrm_criteo_synthetic}; do
    if [[ $cfg == dlrm* ]]; then
      train_both "$cfg" --training.steps="$steps" --metrics.log_freq=1 --validation.freq="$steps" \
        --metrics.plot=false
    else
      train_both "$cfg" "${common[@]}"
    fi
  done
echo "---- summary"
printf '%s\n' "${summary[@]}"
