#!/usr/bin/env bash
# The main job until the `train` binary exists: builds minititan and trains a small model with
# the runtime, printing falling losses. Arguments go to mt_demo_train (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target mt_demo_train
exec ./build/tools/mt_demo_train "$@"
