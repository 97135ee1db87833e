#!/usr/bin/env bash
# Installs NVIDIA's NVRTC (the CUDA runtime compiler, from PyPI's nvidia-cuda-nvrtc-cu12 wheel)
# into a virtual environment under target/ when missing, and prints the folder that holds
# libnvrtc.so.12. The test command puts it on LD_LIBRARY_PATH so that a test compiles the CUDA
# kernels on machines without a GPU (NVRTC needs none).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/nvrtc-venv
dest=target/nvrtc
lib="$dest/nvidia/cuda_nvrtc/lib"
if [ ! -e "$lib/libnvrtc.so.12" ]; then
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-deps --no-cache-dir --target "$dest" \
    "nvidia-cuda-nvrtc-cu12==12.9.86" >&2
  # The wheel carries a second build of each library (.alt); the loader wants only these.
  rm -f "$lib"/*.alt.*
fi
echo "$(pwd)/$lib"
