#!/usr/bin/env bash
# Runs every fuzz target (the payload decoders, the bulk stream's frame parser, the shard's
# request validators, the job validator) for a set time: scripts/fuzz.sh [seconds per target,
# default 60]. Each prints the executions it ran; a crash fails the script.
# Needs cargo-fuzz (installed here when missing) and libFuzzer's sanitizer flags, which the stable
# toolchain accepts with RUSTC_BOOTSTRAP=1. Crashes are kept under services/codec/fuzz/artifacts.
set -euo pipefail
cd "$(dirname "$0")/../services/codec/fuzz"
secs="${1:-60}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
for target in $(cargo fuzz list); do
  echo "fuzz: $target for ${secs}s" >&2
  if ! out=$(cargo fuzz run "$target" --release -- -max_total_time="$secs" -max_len=65536 2>&1); then
    echo "$out" | tail -n 40 >&2
    echo "fuzz: $target failed; the input is under services/codec/fuzz/artifacts/$target" >&2
    exit 1
  fi
  echo "$out" | tail -n 1 >&2
done
echo "fuzz: every target ran ${secs}s without a crash" >&2
