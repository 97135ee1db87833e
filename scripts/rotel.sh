#!/usr/bin/env bash
# Installs rotel (PyPI: an OpenTelemetry collector whose wheel carries its binary) into a virtual
# environment under target/rotel, when missing; prints the agent's path. The tracing test
# (tests/tests/tracing.rs) sends the services' spans to it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/rotel
agent() { ls "$PWD/$venv"/lib/python3*/site-packages/rotel/rotel-agent 2>/dev/null | head -1; }
if [ -z "$(agent)" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "rotel==0.0.1a15"
fi
agent
