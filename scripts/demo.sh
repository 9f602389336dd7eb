#!/usr/bin/env bash
# The main job: trains a Llama 3 "debugmodel" on the text of Debian's `fortunes` package
# (/usr/share/games/fortunes, installed by scripts/setup.sh) with the `train` binary and
# configs/fortunes_debug.toml: a few hundred steps in a few minutes on 2 CPU cores, printing
# falling losses and ending with a generated sample.
#   1. builds minititan (Release, in build/);
#   2. trains a 2048-token BPE tokenizer on the fortunes (each fortune is a document) into
#      build/demo/tokenizer, writing the documents to build/demo/fortunes.jsonl (skipped when
#      both are there);
#   3. tokenizes them into build/demo/fortunes.h5 with mt_prepare_dataset (skipped when newer
#      than the tokenizer);
#   4. runs build/train/train --config configs/fortunes_debug.toml, plus this script's arguments
#      (e.g. --training.steps=50); metrics.jsonl, loss.svg and config.toml go to
#      outputs/fortunes_debug/.
# MT_FORTUNES_DIR overrides the fortunes folder.
set -euo pipefail
cd "$(dirname "$0")/.."
fortunes=${MT_FORTUNES_DIR:-/usr/share/games/fortunes}
if [ ! -d "$fortunes" ]; then
  echo "demo: $fortunes not found; install Debian's fortunes package" \
    "(bash scripts/setup.sh as root, or apt-get install fortunes)" >&2
  exit 1
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target train mt_train_tokenizer mt_prepare_dataset
demo=build/demo
if [ ! -f "$demo/tokenizer/tokenizer.json" ] || [ ! -f "$demo/fortunes.jsonl" ]; then
  ./build/tools/mt_train_tokenizer --input "$fortunes" --format fortune --vocab-size 2048 \
    --output "$demo/tokenizer" --documents "$demo/fortunes.jsonl"
fi
if [ ! -f "$demo/fortunes.h5" ] || [ "$demo/tokenizer/tokenizer.json" -nt "$demo/fortunes.h5" ]; then
  ./build/tools/mt_prepare_dataset --tokenizer "$demo/tokenizer" --output "$demo/fortunes.h5" \
    "$demo/fortunes.jsonl"
fi
# OpenMP threads sleep instead of spinning while they wait: on a busy machine spinning threads
# steal the cores the working ones need (3x slower steps measured on a loaded 2-core machine).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-16}  # OpenBLAS threads: short spins too
exec ./build/train/train --config configs/fortunes_debug.toml "$@"
