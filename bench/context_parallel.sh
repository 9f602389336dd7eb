#!/usr/bin/env bash
# Context parallelism: peak memory and tokens/s per rank of the Llama debug model at a long
# sequence, with cp = 1, 2 and 4 (the same global batch: one sequence of SEQ tokens per step),
# by both rotate methods (allgather, alltoall = the ring), through the `train` binary. Builds nothing: needs build/train/train.
#   SEQ=8192 STEPS=4 bench/context_parallel.sh
# One thread per rank. cp 4 on a 2-core machine puts 2 ranks on each core: its tokens/s include
# time-slicing; its memory is unaffected. The loss column is step STEPS's: the same run on every
# degree (to float reduction order).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/train/train
[[ -x $bin ]] || { echo "needs $bin: cmake --build build --target train" >&2; exit 1; }
seq=${SEQ:-8192}
steps=${STEPS:-4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# mpirun refuses root without these (containers run as root).
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
echo "$(date -u +%Y-%m-%dT%H:%MZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores"
echo "Llama debugmodel (GPT-2 vocab), seq_len $seq, 1 sequence per step, float32, step $steps"
echo
echo "| cp | rotate method | tokens per rank | peak memory per rank (MiB) | tokens/s per rank | loss |"
echo "| --- | --- | --- | --- | --- | --- |"
for run in 1:allgather 2:allgather 2:alltoall 4:allgather 4:alltoall; do
  cp=${run%%:*} method=${run#*:}
  mpirun -np "$cp" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
    -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x OMP_WAIT_POLICY \
    "$bin" --config configs/debug_model.toml --training.seq_len="$seq" \
    --training.local_batch_size=1 --training.steps="$steps" --metrics.log_freq=1 \
    --validation.enable=false --checkpoint.enable=false --lr_scheduler.warmup_steps=1 \
    --parallelism.context_parallel_degree="$cp" \
    --parallelism.context_parallel_rotate_method="$method" \
    --job.dump_folder="$out/$cp-$method" > "$out/$cp-$method.log"
  python3 - "$out/$cp-$method/metrics.jsonl" "$cp" "$seq" "$method" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
cp, seq, method = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print(f"| {cp} | {method if cp > 1 else '-'} | {seq // cp} | "
      f"{last['mem_peak_bytes'] / 2**20:.0f} | {last['tokens_per_sec']:.0f} | {last['loss']:.5f} |")
PY
done
