#!/usr/bin/env bash
# Packs what the GPU checks need into .device/ (git-ignored: add `/.device/` to
# .git/info/exclude) as ONE compressed archive, since the device machine lacks HDF5, MPI and
# OpenBLAS and a call carries at most 64 MiB (the unpacked bundle is about 90 MiB):
#   train, every *_gpu_test and gpu_kernels_bench from BUILD (default build/), or the executables
#   EXES names (paths, space-separated: what one call needs, when building everything would take
#   too long), with the shared libraries they need (../shared/tools/device-bundle), and the test
#   data (tinyshakespeare, the GPT-2 tokenizer files) from ../shared/data.
# Then, in one device call (carry [".device"]):
#   tar xJf .device/bundle.tar.xz -C .device && source .device/device-env.sh && bash bench/gpu_check.sh "$OUT/check"
# (gpu_check.sh unpacks the archive itself when .device/bin is missing.)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
shared=${SHARED:-../shared}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
if [ -n "${EXES:-}" ]; then
  read -r -a exes <<<"$EXES"
else
  exes=("$build/train/train" "$build"/tests/*_gpu_test "$build/bench/gpu_kernels_bench")
fi
for e in "${exes[@]}"; do
  [ -x "$e" ] || { echo "gpu_bundle: $e is missing: build with nvcc first (cmake -DMT_CUDA=ON)" >&2; exit 2; }
done
"$shared/tools/device-bundle" "$stage" "${exes[@]}"
mkdir -p "$stage/data/gpt2"
cp "$shared/data/tinyshakespeare.txt" "$stage/data/"
cp "$shared/data/gpt2/"*.json "$stage/data/gpt2/"  # tokenizer_config.json names the EOS token
mkdir -p .device
tar cJf .device/bundle.tar.xz -C "$stage" .
echo "gpu_bundle: .device/bundle.tar.xz ($(du -h .device/bundle.tar.xz | cut -f1))"
