#!/usr/bin/env bash
# Makes a token per process of the compose cluster (deploy/compose/tls.yml) with `psctl token`,
# and the tokens file the services check them against:
#
#   scripts/compose-tokens.sh DIR [JOB]     # DIR/<holder>.token, DIR/tokens.toml
#
# Holders: scheduler and operator (operators, every job), shards (shard), workers (worker, JOB
# only; default fmnist). Existing tokens are kept (delete DIR to make new ones).
set -euo pipefail
dir=${1:?usage: compose-tokens.sh DIR [JOB]}
job=${2:-fmnist}
psctl=${PSCTL:-$(dirname "$0")/../target/release/psctl}
mkdir -p "$dir"
if [ ! -s "$dir/tokens.toml" ]; then
  entries=$(mktemp)
  for holder in scheduler:operator:'*' operator:operator:'*' shards:shard:'*' workers:worker:"$job"; do
    IFS=: read -r name role jobs <<<"$holder"
    rm -f "$dir/$name.token"
    "$psctl" token --name "$name" --role "$role" --jobs "$jobs" --out "$dir/$name.token" >>"$entries"
  done
  mv "$entries" "$dir/tokens.toml"
fi
# The services run as another user in their containers.
chmod 644 "$dir"/*.token "$dir/tokens.toml"
echo "compose-tokens: tokens in $dir" >&2
