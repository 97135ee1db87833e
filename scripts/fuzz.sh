#!/usr/bin/env bash
# Runs every decoder fuzz target for a set time: scripts/fuzz.sh [seconds per target, default 60].
# Needs cargo-fuzz (installed here when missing) and libFuzzer's sanitizer flags, which the stable
# toolchain accepts with RUSTC_BOOTSTRAP=1. Crashes are kept under services/codec/fuzz/artifacts.
set -euo pipefail
cd "$(dirname "$0")/../services/codec/fuzz"
secs="${1:-60}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
for target in $(cargo fuzz list); do
  echo "fuzz: $target for ${secs}s" >&2
  cargo fuzz run "$target" --release -- -max_total_time="$secs" -max_len=65536 2>&1 | tail -n 3
done
echo "fuzz: every target ran ${secs}s without a crash" >&2
