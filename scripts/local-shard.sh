#!/usr/bin/env bash
# The README's main job for now: builds, starts one durable shard on 127.0.0.1:7070, runs the
# SDK example against it (a softmax regression on Fashion-MNIST when the data is installed, a
# synthetic problem otherwise), then stops the shard with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --data
cargo build --release --workspace --bins --examples
data=$(mktemp -d)
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
./target/release/ps-server --data-dir "$data" --listen 127.0.0.1:7070 --metrics-listen 127.0.0.1:9100 &
pid=$!
./target/release/examples/train_softmax --endpoints http://127.0.0.1:7070 "$@"
