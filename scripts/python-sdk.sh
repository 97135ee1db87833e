#!/usr/bin/env bash
# The Python SDK's tests (sdk/python): installs the package with its test extra into a virtual
# environment under target/ (pip, from PyPI) and runs pytest against real shards, schedulers
# and workers started from this build's release binaries (cargo build --release --workspace
# --bins first). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-sdk
if [ ! -x "$venv/bin/pytest" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
fi
# Reinstalled every run (a few seconds): the tests exercise the package as pip installs it,
# not the source tree.
"$venv/bin/pip" install --quiet "./sdk/python[test]"
PS_BIN_DIR="$PWD/target/release" "$venv/bin/python" -m pytest -q -p no:cacheprovider sdk/python/tests "$@"
