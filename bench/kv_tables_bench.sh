#!/usr/bin/env bash
# Kv-backed embedding tables (issue 30): runs bench/kv_tables_bench (see its header) with the
# machine it ran on. Extra arguments go to the bench, e.g. --max-rows 100000 for a quick run.
#
#   bash bench/kv_tables_bench.sh                 # build/bench/kv_tables_bench
#   BUILD=build-bench bash bench/kv_tables_bench.sh --kv-dir /local_ssd/kv
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN="$BUILD/bench/kv_tables_bench"
[[ -x "$BIN" ]] || { echo "no $BIN: build it first (ninja -C $BUILD kv_tables_bench)" >&2; exit 2; }

echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
echo "machine: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores," \
  "$(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
KV_DIR=/tmp/mt_kv_tables_bench
for ((i = 1; i <= $#; ++i)); do
  if [[ "${!i}" == "--kv-dir" ]]; then j=$((i + 1)); KV_DIR="${!j}"; fi
done
mkdir -p "$(dirname "$KV_DIR")"
echo "kv stores under $KV_DIR: $(df -hT "$(dirname "$KV_DIR")" | awk 'NR == 2 {print $1 " (" $2 "), " $5 " free"}')"
echo

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
start=$(date +%s)
"$BIN" "$@"
echo
echo "wall time: $(($(date +%s) - start)) s; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
