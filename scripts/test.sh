#!/usr/bin/env bash
# The README's test command: set-up, lint, then every test of the workspace in one release build.
set -euo pipefail
cd "$(dirname "$0")/.."
# --data: the loader tests read Fashion-MNIST (Debian's dataset-fashion-mnist).
./scripts/setup.sh --data
if [ "${CI:-}" = "true" ]; then
  # A CI checkout is built once: incremental caches would only take disk (they roughly double
  # the workspace crates' share of target/), and a full disk fails the RocksDB-backed tests.
  export CARGO_INCREMENTAL=0
fi
echo "test: $(df -h --output=avail . | tail -1 | tr -d ' ') free on the build disk, $(df -h --output=avail "${TMPDIR:-/tmp}" | tail -1 | tr -d ' ') in ${TMPDIR:-/tmp}" >&2
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi
# The cross-service tests start the services' binaries (scheduler, ps-server, worker).
cargo build --release --workspace --bins
cargo test --release --workspace --doc
# Every fuzz target (decoders, the bulk frame parser, the request and job validators) for a
# bounded time: FUZZ_SECONDS each (default 20; 0 skips them).
# The Kubernetes manifests against a pinned Kubernetes version (kubernetes-validate, PyPI).
./scripts/k8s-validate.sh
# The OTLP collector the tracing test sends spans to (rotel, PyPI).
PS_ROTEL_AGENT="$(./scripts/rotel.sh)"
export PS_ROTEL_AGENT
if [ "${FUZZ_SECONDS:-20}" != "0" ]; then
  ./scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
fi
# The fault drills through Docker: the compose cluster from the images of this build, a shard
# killed, the scheduler restarted, a worker cut off its network, every container restarted;
# no acknowledged push lost (within COMPOSE_TEST_TIMEOUT, default 15 minutes; COMPOSE_TEST=0
# skips them).
if [ "${COMPOSE_TEST:-1}" != "0" ]; then
  ./scripts/compose-test.sh
fi
# The Python SDK (sdk/python): pytest against real shards, schedulers and workers from this
# build, interoperating with the Rust SDK (pip, from PyPI, into target/py-sdk).
./scripts/python-sdk.sh
# NVRTC alone (PyPI's wheel; no GPU needed) for the test that compiles the CUDA kernels.
LD_LIBRARY_PATH="$(./scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH PS_REQUIRE_NVRTC=1
# Last, so that its summary (tests run, passed, failed) is the last line of the run.
echo "test: $(df -h --output=avail . | tail -1 | tr -d ' ') free on the build disk before the tests" >&2
cargo nextest run --release --workspace --no-fail-fast
