#!/usr/bin/env bash
# Builds minititan and runs its test suite with CTest.
#   scripts/test.sh             Release build in build/, all CPU tests
#   MT_SANITIZE=1 scripts/test.sh   ASan + UBSan build in build-asan/
# Extra arguments go to ctest (e.g. -R Tensor, -L cpu). Needs the packages of scripts/setup.sh.
# After ctest it prints every skipped test with its reason (scripts/check_skips.py, from ctest's
# JUnit report); with CI=true a skipped test that is not labelled gpu fails the run unless it is
# on tests/skip_allowlist.txt. ctest's own failure always wins the exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
if [ "${MT_SANITIZE:-0}" = 1 ]; then
  dir=build-asan
  # -O1 -g1 (line tables for the sanitizers' stack traces): compiles in about half the time of
  # RelWithDebInfo's -O2 -g under the sanitizers, which was most of CI's time.
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMT_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DMT_BUILD_BENCH=OFF -DMT_CUDA=OFF >/dev/null
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
else
  dir=build
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$dir" -j "$jobs"
# OpenBLAS and OpenMP threads: two ctest jobs of one thread each keep the 2-core machines busy
# without oversubscription; tests that check thread-count independence set their own counts.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-16}  # OpenBLAS threads: short spins too
# Every test's temporary files go under one folder removed when this run ends: a test that dies
# before its clean-up cannot leave files that pile up over runs until the disk is full.
tmp_root=$(mktemp -d "${TMPDIR:-/tmp}/mt-test.XXXXXX")
trap 'rm -rf "$tmp_root"' EXIT
export TMPDIR="$tmp_root"
junit="$PWD/$dir/ctest-junit.xml"
rm -f "$junit"
rc=0
ctest --test-dir "$dir" --output-on-failure -j "$jobs" --output-junit "$junit" "$@" || rc=$?
skips_rc=0
python3 scripts/check_skips.py "$junit" --build-dir "$dir" || skips_rc=$?
if [ "$rc" -eq 0 ]; then rc=$skips_rc; fi
exit "$rc"
