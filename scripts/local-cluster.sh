#!/usr/bin/env bash
# The README's main job: installs what the build and the data need, builds the workspace, then
# `psctl local`: a scheduler, two ps-server shards and two workers as child processes on
# 127.0.0.1 train an MLP on Fashion-MNIST to the end, with a progress bar, and print the test
# accuracy and the run directory. Extra arguments go to `psctl local` (see `psctl local --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --data
cargo build --release --workspace --bins
exec ./target/release/psctl local "$@"
