#!/usr/bin/env bash
# Installs the system packages the build needs on Debian or Ubuntu, when they are missing:
# a C++ compiler, clang and libclang (RocksDB's C++ build and its bindings), and Python with
# venv (the manifests' check). With --data it
# also installs Debian's dataset-fashion-mnist package for the training examples (if that
# fails, the examples say how to get the data and fall back to synthetic data).
# Uses apt-get (as root, or through sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
updated=""
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: no apt-get here; install $* with your package manager" >&2
    return 1
  fi
  if [ -z "$updated" ]; then
    $SUDO apt-get update -qq
    updated=1
  fi
  echo "setup: installing $* with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

need=()
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v clang >/dev/null 2>&1 || need+=(clang)
# The bindings generator loads libclang.so or libclang-<version>.so: the unversioned names that
# only libclang-dev installs (libclang-cpp.so.N and libclang.so.N do not count).
compgen -G "/usr/lib/llvm-*/lib/libclang.so" >/dev/null || compgen -G "/usr/lib/llvm-*/lib/libclang-*.so" >/dev/null \
  || compgen -G "/usr/lib/*/libclang.so" >/dev/null || compgen -G "/usr/lib/*/libclang-*.so" >/dev/null \
  || need+=(libclang-dev)
# The manifests' check (scripts/k8s-validate.sh) installs kubernetes-validate into a venv.
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1 \
  && need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  apt_install "${need[@]}"
fi
if [ "${1:-}" = "--data" ] && [ ! -e /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  apt_install dataset-fashion-mnist || echo "setup: dataset-fashion-mnist not installed; the example will say how to get the data" >&2
fi
