#!/usr/bin/env bash
# Every GPU check and benchmark in one device-machine call, most important first, each stage under
# its own time limit so that one hang cannot eat the lease:
#   llama    the Llama 1B throughput table against PyTorch eager and torch.compile
#            (gpu_llama_bench.sh, with MT_BASELINE=1: a second minititan row as before the host
#            ran ahead of the GPU and attention's backward could be non-deterministic)
#   tests    the GPU tests (bench/gpu_check.sh, PARTS=tests)
#   profile  Llama 1B's 4th step through the op profiler: where the step's time goes
#   kernels  the kernel table (gpu_kernels_bench)
#   train    the debug models and the DLRM trained on the CPU and the GPU (gpu_check.sh,
#            PARTS=train)
#   float8   float8_gpu_test (the FP8 kernels against the CPU reference) and the kernel table's
#            float8 rows (gpu_kernels_bench --float8-only); for the float8 training rows, the llama
#            stage with MT_FLOAT8=1 and MODES="compile compile_float8"
# Pack the bundle here first (bash bench/gpu_bundle.sh), then there (carry [".device"]):
#   bash bench/gpu_all.sh "$OUT"
# All logs come back as OUT/logs.tgz (a call returns at most 8 files); the summary prints last.
# Environment: STAGES ("llama tests profile kernels train", run in that order), ALL_TIMEOUT
# (440 s for all stages), PROFILE_TIMEOUT (120 s), and the variables of the scripts it calls
# (TEST_TIMEOUT, TRAIN_TIMEOUT, STEPS, MT_TIMEOUT, ...).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_all.sh OUT_DIR}
work=$(mktemp -d)
[ -d .device/bin ] || tar xJf .device/bundle.tar.xz -C .device || exit 1
stages=${STAGES:-llama tests profile kernels train}
run_stage() {
  case $1 in
    tests)
      PARTS=tests TEST_TIMEOUT=${TEST_TIMEOUT:-60} bash bench/gpu_check.sh "$work/check" |
        tee "$work/tests_summary.txt"
      grep -h '^\[  FAILED  \] [A-Z]' "$work"/check/*_gpu_test.log | sort -u ;;
    kernels)
      (source .device/device-env.sh && timeout 90 .device/bin/gpu_kernels_bench) \
        >"$work/kernels.txt" 2>&1
      echo "gpu_kernels_bench rc=$?" ;;
    float8)
      (source .device/device-env.sh && timeout 60 .device/bin/float8_gpu_test) \
        >"$work/float8_gpu_test.txt" 2>&1
      echo "float8_gpu_test rc=$?"
      grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$work/float8_gpu_test.txt" | sort -u
      (source .device/device-env.sh && timeout 60 .device/bin/gpu_kernels_bench --float8-only) \
        >"$work/float8_kernels.txt" 2>&1
      echo "gpu_kernels_bench --float8-only rc=$?" ;;
    llama)
      (source .device/device-env.sh && BENCH_DIR=$work/llama MT_TIMEOUT=${MT_TIMEOUT:-150} \
        EAGER_TIMEOUT=${EAGER_TIMEOUT:-90} COMPILE_TIMEOUT=${COMPILE_TIMEOUT:-180} \
        WARMUP=${WARMUP:-15} STEPS=${LLAMA_STEPS:-15} MT_BASELINE=${MT_BASELINE:-1} \
        bash bench/gpu_llama_bench.sh) \
        >"$work/llama.txt" 2>&1
      echo "gpu_llama_bench rc=$?" ;;
    profile)  # Llama 1B: 4 steps, the 4th recorded (the llama stage's data if it ran first)
      (source .device/device-env.sh
       data=$work/llama/data
       [ -f "$data/tokens.h5" ] || { data=$work/profile_data
         python3 bench/make_bench_data.py --out "$data" >/dev/null || exit 1; }
       timeout "${PROFILE_TIMEOUT:-120}" .device/bin/train --config configs/llama3_1b_bench.toml \
         --job.dump_folder="$work/profile" --model.tokenizer_path="$data/tokenizer" \
         --training.dataset_path="$data/tokens.h5" --training.steps=4 \
         --profiling.enable=true --profiling.profile_freq=4) >"$work/profile.txt" 2>&1
      echo "profile rc=$?" ;;
    train)
      PARTS=train STEPS=${STEPS:-20} TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-60} \
        bash bench/gpu_check.sh "$work/check" >"$work/train.txt" 2>&1
      echo "gpu_check train rc=$?" ;;
    *) echo "gpu_all: unknown stage '$1' (tests, kernels, llama, train, profile, float8)" ;;
  esac
}
run_stages() { for s in $stages; do run_stage "$s"; done; }
export -f run_stages run_stage
export stages work
timeout "${ALL_TIMEOUT:-440}" bash -c run_stages
echo "stages rc=$?"
tar czf "$out/logs.tgz" --exclude="*.h5" --exclude="*.bin" -C "$work" . && ls -la "$out"
for f in float8_kernels.txt kernels.txt llama.txt train.txt profile.txt; do
  [ -f "$work/$f" ] && { echo "==== $f"; tail -40 "$work/$f"; }
done
