#!/usr/bin/env bash
# Installs the system packages the build needs on Debian or Ubuntu, when they are missing:
# a C++ compiler, clang and libclang (RocksDB's C++ build and its bindings). With --data it
# also installs Debian's dataset-fashion-mnist package for the training examples.
# Uses apt-get (as root, or through sudo).
set -euo pipefail
need=()
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v clang >/dev/null 2>&1 || need+=(clang)
compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null || compgen -G "/usr/lib/*/libclang*.so*" >/dev/null || need+=(libclang-dev)
if [ "${1:-}" = "--data" ] && [ ! -e /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  need+=(dataset-fashion-mnist)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]} with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: no apt-get here; install ${need[*]} with your package manager" >&2
    exit 1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
