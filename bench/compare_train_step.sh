#!/usr/bin/env bash
# Side-by-side CPU training-step throughput: minititan against a current PyTorch, eager and
# torch.compile, same Llama architecture, shapes, batch and optimizer (AdamW), in one run.
# Per model and thread count the three run in alternating rounds (ours, eager, compile; R rounds)
# and the table gives each one's median tokens/s and step time over the rounds, the ratios
# ours/eager and ours/compile, and the peak RSS (getrusage ru_maxrss, MiB; compile's includes
# its compilation). Each round's numbers are printed above the table's row.
#
#   bench/compare_train_step.sh [threads ...]        (default: 1 2)
#
# Needs a build (build/bench/llama_train_step_bench). The peer (bench/llama_train_step_torch.py)
# runs under PYTHON=/path/to/python (any torch; >= 2.5 for every feature it uses), or by default
# from a venv this script makes under ~/.cache (python3 -m venv, then pip install torch from the
# CPU index https://download.pytorch.org/whl/cpu). Settings, all optional:
#   ROUNDS=3                   rounds per model and thread count
#   MODELS="debugmodel 20M 88M"
#   BF16_MODELS="20M"          models also run with bf16 parameters (ours and eager; "" for none)
#   BF16_THREADS="2"           thread counts for the bf16 rows
#   BF16_ROUNDS=2              rounds for the bf16 rows (PyTorch's bf16 GEMMs crawl on CPUs
#                              without AVX512_BF16: ~60 s a step of the ~20M model on AVX2 Zen 3)
#   COMPILE=1                  0 leaves torch.compile out
#   COMPILE_MODE=default       torch.compile's mode (max-autotune: inductor's C++ GEMM templates
#                              are tuned too)
#   TORCH_VENV=~/.cache/minititan/torch-cpu-venv
#   PEER_OMP_WAIT_POLICY       the peer's OMP_WAIT_POLICY (default: unset, libgomp's own)
# Shapes (batch x seq, timed steps after warm-up steps; compile warms up >= 2 steps):
#   debugmodel 8 x 256, 8 after 2; 20M 8 x 256, 6 after 2; 88M 4 x 512, 3 after 1;
#   bf16 rows: 2 after 1.
# A full run (3 models x 2 thread counts x 3 rounds + bf16 20M) takes about 40 minutes on a
# 2-core AMD EPYC (Zen 3) VM: 88M at 1 thread and the bf16 rows are half of it; run a few models
# at a time with MODELS=... BF16_MODELS="" to check the machine stays quiet in between.
set -euo pipefail
cd "$(dirname "$0")/.."
threads_list=${*:-1 2}
rounds=${ROUNDS:-3}
models=${MODELS-debugmodel 20M 88M}
bf16_models=${BF16_MODELS-20M}
bf16_threads=${BF16_THREADS:-2}
bf16_rounds=${BF16_ROUNDS:-2}
compile=${COMPILE:-1}
compile_mode=${COMPILE_MODE:-default}
bench=./build/bench/llama_train_step_bench
[[ -x $bench ]] || { echo "needs $bench: cmake --build build --target llama_train_step_bench" >&2; exit 1; }

if [[ -n ${PYTHON:-} ]]; then
  python=$PYTHON
else
  venv=${TORCH_VENV:-$HOME/.cache/minititan/torch-cpu-venv}
  if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "making $venv with torch from https://download.pytorch.org/whl/cpu" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip >&2
    "$venv/bin/pip" install --quiet torch --index-url https://download.pytorch.org/whl/cpu >&2 || {
      echo "pip could not install torch into $venv; give a python with torch as PYTHON=..." >&2
      exit 1
    }
  fi
  python=$venv/bin/python
fi
"$python" -c "import torch" 2>/dev/null || { echo "$python cannot import torch" >&2; exit 1; }

# minititan under train's thread-pool settings (train/main.cpp) unless set; the peer under its own
# defaults (libgomp) unless PEER_OMP_WAIT_POLICY says otherwise.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-16}
peer_wait=${PEER_OMP_WAIT_POLICY:-}

spec_of() {  # model -> batch seq steps warmup
  case $1 in
    debugmodel) echo "8 256 8 2" ;;
    20M) echo "8 256 6 2" ;;
    88M) echo "4 512 3 1" ;;
    *) echo "unknown model $1" >&2; exit 1 ;;
  esac
}
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p" | head -1; }
median() {  # numbers on stdin ("-" and empty lines skipped) -> median, or "-"
  awk '$1 != "-" && NF' | sort -g | awk '{v[NR]=$1} END {if (!NR) print "-"; else if (NR%2) print v[(NR+1)/2];
    else printf "%.2f\n", (v[NR/2]+v[NR/2+1])/2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if (a=="-"||b=="-"||b==0) print "-"; else printf "%.2fx", a/b}'; }

run_ours() {  # threads model dtype batch seq steps warmup
  OMP_NUM_THREADS=$1 OPENBLAS_NUM_THREADS=$1 "$bench" --model "$2" --dtype "$3" --batch "$4" \
    --seq "$5" --steps "$6" --warmup "$7" 2>/dev/null || true
}
run_peer() {  # threads model dtype batch seq steps warmup [--compile]
  local t=$1 wait=(-u OMP_WAIT_POLICY)
  [[ -n $peer_wait ]] && wait=(OMP_WAIT_POLICY="$peer_wait")
  env "${wait[@]}" OMP_NUM_THREADS="$t" MKL_NUM_THREADS="$t" "$python" bench/llama_train_step_torch.py \
    --model "$2" --dtype "$3" --batch "$4" --seq "$5" --steps "$6" --warmup "$7" --threads "$t" \
    "${@:8}" 2>/dev/null || true
}

cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' | sort -u | xargs)
echo "$(date -u +%Y-%m-%dT%H:%MZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
  "flags: ${cpu_flags:-none of avx2 avx512f avx512_bf16 amx_bf16}"
echo "minititan $(git rev-parse --short HEAD 2>/dev/null || echo '?'):" \
  "OMP_WAIT_POLICY=$OMP_WAIT_POLICY OPENBLAS_THREAD_TIMEOUT=$OPENBLAS_THREAD_TIMEOUT;" \
  "peer: $("$python" -c 'import torch; print("torch", torch.__version__)')," \
  "OMP_WAIT_POLICY=${peer_wait:-default}, compile mode $compile_mode; $rounds alternating rounds (bf16 rows: $bf16_rounds); load: $(cut -d' ' -f1-3 /proc/loadavg)"

med() { printf '%s\n' "$@" | median; }

rows=()
measure() {  # model dtype threads
  local model=$1 dtype=$2 t=$3 b s n w
  read -r b s n w <<<"$(spec_of "$model")"
  local rounds=$rounds
  [[ $dtype == bf16 ]] && { n=2; w=1; rounds=$bf16_rounds; }
  local o_tps=() e_tps=() c_tps=() o_ms=() e_ms=() c_ms=() o_rss=() e_rss=() c_rss=() peer_line=""
  for ((r = 1; r <= rounds; r++)); do
    local o e c="" cw=$((w > 2 ? w : 2))
    o=$(run_ours "$t" "$model" "$dtype" "$b" "$s" "$n" "$w")
    e=$(run_peer "$t" "$model" "$dtype" "$b" "$s" "$n" "$w")
    [[ $compile == 1 && $dtype == f32 ]] && c=$(run_peer "$t" "$model" "$dtype" "$b" "$s" "$n" "$cw" --compile --compile-mode "$compile_mode")
    [[ -n $e ]] && peer_line=$e
    o_tps+=("$(field tokens_per_s "$o")"); e_tps+=("$(field tokens_per_s "$e")"); c_tps+=("$(field tokens_per_s "$c")")
    o_ms+=("$(field step_ms "$o")"); e_ms+=("$(field step_ms "$e")"); c_ms+=("$(field step_ms "$c")")
    o_rss+=("$(field peak_rss_mib "$o")"); e_rss+=("$(field peak_rss_mib "$e")"); c_rss+=("$(field peak_rss_mib "$c")")
    printf '  %s %s %s threads, round %d: minititan %s tok/s (%s MiB), eager %s (%s MiB), compile %s (%s MiB); load %s\n' \
      "$model" "$dtype" "$t" "$r" "${o_tps[-1]:--}" "${o_rss[-1]:--}" "${e_tps[-1]:--}" "${e_rss[-1]:--}" \
      "${c_tps[-1]:--}" "${c_rss[-1]:--}" "$(cut -d' ' -f1 /proc/loadavg)"
  done
  [[ -n $peer_line ]] && echo "  peer: adamw=$(field adamw "$peer_line") features=$(field features "$peer_line")" \
    "params=$(field params "$peer_line")"
  local ot et ct
  ot=$(med "${o_tps[@]}"); et=$(med "${e_tps[@]}"); ct=$(med "${c_tps[@]}")
  rows+=("$(printf '| %s | %s | %s | %s x %s | %s | %s | %s | %s / %s / %s | %s | %s | %s / %s / %s |' \
    "$model" "$dtype" "$t" "$b" "$s" "$ot" "$et" "$ct" "$(med "${o_ms[@]}")" "$(med "${e_ms[@]}")" \
    "$(med "${c_ms[@]}")" "$(ratio "$ot" "$et")" "$(ratio "$ot" "$ct")" "$(med "${o_rss[@]}")" \
    "$(med "${e_rss[@]}")" "$(med "${c_rss[@]}")")")
  echo "${rows[-1]}"
}

for model in $models; do
  for t in $threads_list; do measure "$model" f32 "$t"; done
done
for model in $bf16_models; do
  for t in $bf16_threads; do measure "$model" bf16 "$t"; done
done

echo
echo "| model | dtype | threads | batch x seq | minititan tok/s | eager tok/s | compile tok/s |" \
  "step ms (ours / eager / compile) | ours / eager | ours / compile | peak RSS MiB (ours / eager / compile) |"
echo "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"
printf '%s\n' "${rows[@]}"
