#!/usr/bin/env bash
# Pipeline parallelism: bubble per rank (measured, simulated, theory) and activation memory per
# rank, for every schedule at pp 2 and pp 4 (bench/pipeline_bench.cpp says what each column is).
# Builds nothing: needs build/bench/pipeline_bench. Extra arguments go to every run, e.g.
#   bench/pipeline_bench.sh --steps 5 --microbatches 16
# One thread per rank. pp 4 on a 2-core machine puts 2 ranks on each core: its timings include
# time-slicing (a rank's busy time stretches while its core runs another rank), so read its
# bubbles with that in mind; its memory numbers are unaffected.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bench/pipeline_bench
[[ -x $bin ]] || { echo "needs $bin: cmake --build build --target pipeline_bench" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# mpirun refuses root without these (containers run as root).
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
echo "$(date -u +%Y-%m-%dT%H:%MZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores"
for pp in 2 4; do
  echo
  # yield_when_idle: a rank waiting in MPI_Waitall calls sched_yield between polls, giving its
  # core to a rank that computes (it matters when ranks share cores, pp 4 here).
  mpirun -np "$pp" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
    -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$bin" "$@"
done
