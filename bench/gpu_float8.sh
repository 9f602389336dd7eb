#!/usr/bin/env bash
# Float8 on the GPU (issue 32), one device call, most important first, each part under its own
# time limit: float8_gpu_test (the FP8 kernels against the CPU reference), the kernel table's
# float8 rows (gpu_kernels_bench --float8-only), the Llama 3 1B throughput table with minititan in
# bf16 and float8 and PyTorch + torchao float8 + torch.compile (gpu_llama_bench.sh, MT_FLOAT8=1),
# and the debug model's loss curves in f32, bf16 and float8 (float8_loss_curve.sh, DEVICE=cuda).
# Here: bash bench/gpu_bundle.sh, and torchao's wheel in .whl/ (bench/gpu_llama_bench.sh says
# how); there (carry [".device", ".whl"]): bash bench/gpu_float8.sh "$OUT"
# Environment: GPU_TESTS (the test binaries of the bundle to run first, default
# float8_gpu_test; e.g. "float8_gpu_test fused_ops_gpu_test replay_gpu_test"), MODES (PyTorch
# rows, default "compile_float8"; add compile for bf16 compile; "" for none),
# WARMUP (10), STEPS (20), LOSS_STEPS (300; 0 skips the loss curves).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_float8.sh OUT_DIR}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
[ -d .device/bin ] || tar xJf .device/bundle.tar.xz -C .device || exit 1
# shellcheck disable=SC1091
source .device/device-env.sh || exit 1
export PYTHONUNBUFFERED=1

for t in ${GPU_TESTS:-float8_gpu_test}; do
  [ -x ".device/bin/$t" ] || { echo "$t: not in the bundle"; continue; }
  timeout 90 ".device/bin/$t" >"$out/$t.txt" 2>&1
  echo "$t rc=$?"
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$out/$t.txt" | sort -u
done
if [ -x .device/bin/gpu_kernels_bench ]; then
  timeout 60 .device/bin/gpu_kernels_bench --float8-only >"$out/float8_kernels.txt" 2>&1
  echo "gpu_kernels_bench --float8-only rc=$?"
fi

BENCH_DIR=/tmp/llama MT_FLOAT8=1 MT_FLOAT8_ROWWISE=1 MT_FLOAT8_FSDP=1 MT_FLOAT8_OUTPUT=1 MODES=${MODES-compile_float8} WARMUP=${WARMUP:-10} \
  STEPS=${STEPS:-20} MT_TIMEOUT=120 COMPILE_TIMEOUT=200 bash bench/gpu_llama_bench.sh \
  >"$out/llama.txt" 2>&1
echo "gpu_llama_bench rc=$?"
tar czf "$out/llama_logs.tgz" -C /tmp/llama --exclude=data --exclude="*.h5" . 2>/dev/null

if [ "${LOSS_STEPS:-300}" -gt 0 ]; then
  DEVICE=cuda TRAIN=.device/bin/train DATA=.device/data STEPS=${LOSS_STEPS:-300} \
    OUT_DIR=/tmp/loss RUN_TIMEOUT=60 timeout 200 bash bench/float8_loss_curve.sh \
    >"$out/loss_curve.txt" 2>&1
  echo "float8_loss_curve rc=$?"
fi

[ -f "$out/float8_kernels.txt" ] && cat "$out/float8_kernels.txt"
tail -25 "$out/llama.txt"
if [ -f "$out/loss_curve.txt" ]; then tail -20 "$out/loss_curve.txt"; fi
