#!/usr/bin/env bash
# Installs, as root on Debian 12, the system packages minititan builds against (only the missing
# ones; non-interactive). Safe to run again. CUDA is optional and not installed here: the CUDA
# targets are built when nvcc is found (e.g. /usr/local/cuda/bin/nvcc); then the cuDNN frontend
# headers are installed with pip. Also the small Python test oracles (h5py, numpy): from Debian
# for /usr/bin/python3 and, when the python3 on PATH is another one (e.g. pyenv's), with pip for it.
set -euo pipefail
# ocl-icd-opencl-dev: Debian's oneDNN CMake config (dnnl-config.cmake) requires OpenCL; it is only a
# Recommends of libdnnl-dev, which --no-install-recommends skips.
packages=(
  build-essential cmake ninja-build pkg-config ccache
  libabsl-dev libtoml11-dev libhdf5-dev openmpi-bin libopenmpi-dev librocksdb-dev
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  fortunes python3-h5py python3-numpy
)
# The CUDA backend's fused attention needs the header-only cuDNN frontend, from PyPI (--no-deps:
# only its headers are used). Quiet and non-fatal: without it bf16 attention uses a slower kernel.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps nvidia-cudnn-frontend \
    2>/dev/null || echo "setup: could not install nvidia-cudnn-frontend; bf16 attention on CUDA" \
    "will use the reference kernel instead of cuDNN"
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
elif [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}; run this script as root (or install them with apt)" >&2
  exit 1
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The tests run their Python oracles with `python3` first, then /usr/bin/python3
# (tests/testing/python_env.cpp). Where `python3` is not Debian's, give it h5py and numpy too (from
# PyPI; quiet). Non-fatal: the tests fall back to /usr/bin/python3, and in CI a skip fails anyway.
if command -v python3 >/dev/null 2>&1 &&
   [ "$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))' 2>/dev/null)" != \
     "$(realpath /usr/bin/python3 2>/dev/null)" ] &&
   ! python3 -c 'import h5py, numpy' >/dev/null 2>&1; then
  echo "setup: installing h5py and numpy for $(command -v python3)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
    h5py numpy || echo "setup: could not install h5py/numpy for python3; the tests use" \
    "/usr/bin/python3's"
fi
