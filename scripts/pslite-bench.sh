#!/usr/bin/env bash
# ps-lite beside ps-bench, in one run: builds ps-lite twice (as shipped, and with its idle
# receive threads sleeping; see below) and bench/pslite/pslite_dense.cc (its side of the dense
# cases) against each, into target/pslite/, then runs target/release/ps-bench with one
# `--pslite` per build and the arguments given here, e.g.
#
#   cargo build --release -p ps-bench -p ps-server
#   scripts/pslite-bench.sh --floats 1048576 --layouts 1x1,2x2 --no-sparse --seconds 3
#
# ps-lite's source: PSLITE_SRC=DIR (a checkout of dmlc/ps-lite or a fork with the same API),
# or else the copy BytePS ships (BytePS 0.2.5.post15's source package from PyPI, fetched once
# with pip, in a virtual environment, into target/pslite/; its 3rdparty/ps-lite is ByteDance's
# fork of dmlc/ps-lite, whose ZeroMQ van is the same as dmlc/ps-lite's master). Built against
# Debian's ZeroMQ (libzmq3-dev, g++ and iperf3 are installed with apt-get when missing).
# `--build-only` stops after the build and prints the two programs' paths.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/pslite
mkdir -p "$OUT"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=()
command -v g++ >/dev/null 2>&1 || need+=(g++)
[ -e /usr/include/zmq.h ] || need+=(libzmq3-dev)
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
if [ ${#need[@]} -gt 0 ]; then
  echo "pslite-bench: installing ${need[*]} with apt-get" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
SRC="${PSLITE_SRC:-}"
if [ -z "$SRC" ]; then
  PKG=byteps-0.2.5.post15
  if [ ! -d "$OUT/$PKG/3rdparty/ps-lite" ]; then
    [ -x "$OUT/venv/bin/pip" ] || python3 -m venv "$OUT/venv"
    "$OUT/venv/bin/pip" download -q --no-deps --no-binary :all: -d "$OUT" "byteps==0.2.5.post15" >&2
    tar -xzf "$OUT/$PKG.tar.gz" -C "$OUT" "$PKG/3rdparty/ps-lite"
  fi
  SRC="$OUT/$PKG/3rdparty/ps-lite"
fi
SRC="$(cd "$SRC" && pwd)"
if [ ! -e "$SRC/build/libps.a" ]; then
  echo "pslite-bench: building ps-lite in $SRC" >&2
  make -C "$SRC" ps DEPS_PATH=/usr -j"$(nproc)" >"$OUT/build.log" 2>&1 \
    || { tail -20 "$OUT/build.log" >&2; exit 1; }
fi
# A second build whose receive threads sleep when idle. ps-lite's ZeroMQ van (dmlc/ps-lite's
# master and BytePS's alike) polls each socket without blocking, in a loop that never sleeps:
# every process keeps one core busy per receive thread even when idle, which on a host of few
# cores starves the threads doing the work. This variant spins 100 empty polls, then sleeps
# between polls (1 us more each time, up to 50 us); nothing else changes.
IDLE="$OUT/ps-lite-idle"
if [ ! -e "$IDLE/build/libps.a" ] || [ "$SRC/src/zmq_van.h" -nt "$IDLE/build/libps.a" ]; then
  rm -rf "$IDLE" && cp -r "$SRC" "$IDLE" && rm -rf "$IDLE/build"
  python3 - "$IDLE/src/zmq_van.h" <<'PY'
import sys
path = sys.argv[1]
src = open(path).read()
old = "        while (true) {\n          std::lock_guard<std::mutex> lk(mu_);\n"
new = ("        for (int idle = 0;; ++idle) {\n"
       "          if (idle > 100) std::this_thread::sleep_for(\n"
       "              std::chrono::microseconds(std::min(idle - 100, 50)));\n"
       "          std::lock_guard<std::mutex> lk(mu_);\n")
if src.count(old) != 1:
    sys.exit("pslite-bench: the receive loop of " + path + " is not the one this patch knows")
open(path, "w").write("#include <algorithm>\n#include <chrono>\n" + src.replace(old, new))
PY
  make -C "$IDLE" ps DEPS_PATH=/usr -j"$(nproc)" >"$OUT/build-idle.log" 2>&1 \
    || { tail -20 "$OUT/build-idle.log" >&2; exit 1; }
fi
for v in "pslite-dense:$SRC" "pslite-dense-idle:$IDLE"; do
  bin="$OUT/${v%%:*}" lib="${v#*:}"
  if [ ! -e "$bin" ] || [ bench/pslite/pslite_dense.cc -nt "$bin" ] || [ "$lib/build/libps.a" -nt "$bin" ]; then
    g++ -std=c++14 -O3 -msse2 -I"$lib/include" -I"$lib/src" bench/pslite/pslite_dense.cc \
      "$lib/build/libps.a" -lzmq -pthread -lrt -o "$bin"
  fi
done
[ "${1:-}" = "--build-only" ] && { echo "$OUT/pslite-dense $OUT/pslite-dense-idle"; exit 0; }
[ -x target/release/ps-bench ] || { echo "pslite-bench: build ps-bench first (cargo build --release -p ps-bench -p ps-server)" >&2; exit 1; }
exec target/release/ps-bench --pslite "$OUT/pslite-dense" --pslite "$OUT/pslite-dense-idle" "$@"
