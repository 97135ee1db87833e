#!/usr/bin/env bash
# The README's test command: set-up, lint, then every test of the workspace in one release build.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi
# The cross-service tests start the services' binaries (scheduler, ps-server, worker).
cargo build --release --workspace --bins
cargo test --release --workspace --doc
# Last, so that its summary (tests run, passed, failed) is the last line of the run.
cargo nextest run --release --workspace --no-fail-fast
