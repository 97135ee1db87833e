#!/usr/bin/env bash
# Fault drills through the real container engine: builds the images (scripts/images.sh, from
# the release build), runs docker-compose.yml's cluster on the drill job in a project of its own
# (ports picked free on 127.0.0.1), and, while it trains, kills a shard, restarts the scheduler,
# cuts a worker off its network and restarts every container; then checks that the job finished
# and that no acknowledged push was lost (scripts/compose_drills.py says how). Everything it
# started is removed at the end, volumes included, whatever happened.
#
#   scripts/compose-test.sh              # the report: target/compose-test/report.json
#   COMPOSE_TEST_TIMEOUT=900 scripts/compose-test.sh
#
# Needs Docker and docker-compose (1.29); the test command (scripts/test.sh) runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in docker docker-compose python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "compose-test: $tool is missing (the fault drills need Docker and docker-compose)" >&2
    exit 1
  fi
done
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "compose-test: /usr/share/datasets/fashion-mnist is missing: run scripts/setup.sh --data" >&2
  exit 1
fi
./scripts/images.sh
# The alerting rules Prometheus loads (promtool comes with Debian's prometheus, which
# images.sh installs).
promtool check rules deploy/compose/alerts.yml
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' deploy/grafana/parameter-server.json

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-psdrill$$}"
export PS_JOB=drill PS_JOB_FILE=drill.toml
PS_SCHEDULER_PORT="$(free_port)"
PS_PROMETHEUS_PORT="$(free_port)"
export PS_SCHEDULER_PORT PS_PROMETHEUS_PORT
log_dir=target/compose-test
mkdir -p "$log_dir"

teardown() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "compose-test: failed ($rc); the services' last lines (all in $log_dir/services.log):" >&2
  fi
  docker-compose logs --no-color --timestamps >"$log_dir/services.log" 2>&1 || true
  if [ "$rc" -ne 0 ]; then
    tail -n 80 "$log_dir/services.log" >&2 || true
    # Last, so that a log's tail shows them: each container's state (a worker that exited and
    # its status), and the drills' own last lines, the reason they failed among them.
    echo "compose-test: the containers at the failure:" >&2
    docker-compose ps >&2 || true
    echo "compose-test: the drills' last lines (all in $log_dir/drills.log):" >&2
    tail -n 25 "$log_dir/drills.log" >&2 || true
  fi
  docker-compose down -v --remove-orphans -t 10 >/dev/null 2>&1 || true
  exit "$rc"
}
trap teardown EXIT

# The whole drill within COMPOSE_TEST_TIMEOUT seconds (default 15 minutes).
timeout --signal=TERM --kill-after=30 "${COMPOSE_TEST_TIMEOUT:-900}" \
  python3 -u scripts/compose_drills.py 2>&1 | tee "$log_dir/drills.log"
