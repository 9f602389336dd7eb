#!/usr/bin/env bash
# Side-by-side CPU training-step throughput: minititan vs PyTorch eager, same Llama architecture,
# shapes, batch and optimizer, in one run. Needs a build (build/bench/llama_train_step_bench) and
# Debian's python3-torch (apt-get install python3-torch).
#   bench/compare_train_step.sh [threads]     (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
# Both frameworks under the same thread-pool settings: train's (train/main.cpp) unless set.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-16}
python=${PYTHON:-/usr/bin/python3}
"$python" -c "import torch" 2>/dev/null || { echo "needs torch: apt-get install python3-torch" >&2; exit 1; }
echo "threads=$threads OMP_WAIT_POLICY=$OMP_WAIT_POLICY" \
  "OPENBLAS_THREAD_TIMEOUT=$OPENBLAS_THREAD_TIMEOUT"
echo "$(date -u +%Y-%m-%dT%H:%MZ)  $(lscpu | sed -n 's/^Model name: *//p')"
printf '%-11s %-22s %12s %10s %12s\n' model framework tokens/s step_ms ratio
for spec in "debugmodel 8 256" "20M 8 256"; do
  set -- $spec
  ours=$(./build/bench/llama_train_step_bench --model "$1" --batch "$2" --seq "$3" --steps 8 --warmup 2)
  peer=$("$python" bench/llama_train_step_torch.py --model "$1" --batch "$2" --seq "$3" --steps 8 --warmup 2 --threads "$threads")
  field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }
  o=$(field tokens_per_s "$ours"); p=$(field tokens_per_s "$peer")
  printf '%-11s %-22s %12s %10s %12s\n' "$1" minititan "$o" "$(field step_ms "$ours")" \
    "$(awk -v a="$o" -v b="$p" 'BEGIN{printf "%.2fx", a/b}')"
  printf '%-11s %-22s %12s %10s\n' "$1" "$(field framework "$peer")" "$p" "$(field step_ms "$peer")"
done
