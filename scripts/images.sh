#!/usr/bin/env bash
# Builds the deployment's container images from local files only (no registry is reached),
# each `FROM scratch` with its binaries, stripped, and the shared libraries they load (read
# from `ldd`):
#   ps:<version> (and ps:latest)  every binary of the project: ps-server, scheduler, worker,
#       psctl, ps-probe. One image rather than one per service: they share their libraries and
#       most of their code, a compose file or a manifest picks the command, and there is one
#       thing to build, tag and ship. User 10001, state under /data.
#   ps-prometheus:latest  Debian's prometheus (installed with apt when missing), its web UI,
#       and ps-probe.
#   ps-otel:latest        the rotel OTLP collector, from its PyPI wheel (which carries the
#       binary), and ps-probe.
#
#   scripts/images.sh                 # all three
#   PS_IMAGE=ps:dev scripts/images.sh
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag="${PS_IMAGE:-ps:$version}"
# The workspace build the test command makes too (the same features: nothing is rebuilt).
cargo build --release --workspace --bins
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# scratch_image TAG CMD BINARY... : an image of BINARY (stripped, in /usr/local/bin), the
# libraries they load, the folders EXTRA names (links followed) less those PRUNE names, a user
# 10001 owning /data, and CMD (a JSON array) as its command.
scratch_image() {
  local image="$1" cmd="$2"
  shift 2
  local stage="$work/$image" b lib
  local root="$stage/rootfs"
  mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/etc" "$stage/state/data"
  for b in "$@"; do
    strip -o "$root/usr/local/bin/$(basename "$b")" "$b"
    chmod 755 "$root/usr/local/bin/$(basename "$b")"
  done
  # The libraries every binary loads, and the loader itself, at the paths they were found.
  for lib in $(for b in "$@"; do ldd "$b"; done \
      | awk '/=> \// { print $3 } /^[ \t]*\/lib/ { print $1 }' | sort -u); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  for d in ${EXTRA:-}; do
    mkdir -p "$root$(dirname "$d")"
    cp -rL "$d" "$root$d"
  done
  for d in ${PRUNE:-}; do
    rm -rf "${root:?}$d"
  done
  printf 'root:x:0:0:root:/:/usr/local/bin/ps-probe\nps:x:10001:10001:ps:/data:/usr/local/bin/ps-probe\n' \
    > "$root/etc/passwd"
  printf 'root:x:0:\nps:x:10001:\n' > "$root/etc/group"
  chmod 1777 "$root/tmp"
  cat > "$stage/Dockerfile" <<DOCKERFILE
FROM scratch
COPY rootfs/ /
# The state directory itself, owned by the service's user (COPY copies a folder's contents).
COPY --chown=10001:10001 state/ /
ENV PATH=/usr/local/bin RUST_LOG=info NO_COLOR=1
USER 10001
WORKDIR /data
CMD $cmd
DOCKERFILE
  docker build -q -t "$image" "$stage" >/dev/null
  echo "images: built $image ($(($(docker image inspect -f '{{.Size}}' "$image") / 1048576)) MiB): $*" >&2
}

bins=()
for b in ps-server scheduler worker psctl ps-probe; do bins+=("target/release/$b"); done
scratch_image "$tag" '["ps-server", "--help"]' "${bins[@]}"
docker tag "$tag" ps:latest

if ! command -v prometheus >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus >/dev/null
fi
# With its web UI's templates and scripts (Debian keeps them apart from the binary), less the
# time-zone database in its every source form (214 MiB; the UI loads one bundled script).
EXTRA=/usr/share/prometheus/web PRUNE=/usr/share/prometheus/web/static/moment-timezone/data \
  scratch_image ps-prometheus:latest '["prometheus", "--help"]' \
  "$(command -v prometheus)" "$(command -v promtool)" target/release/ps-probe

wheel="$work/rotel-wheel"
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheel" rotel
python3 -m zipfile -e "$wheel"/rotel-*.whl "$wheel/x"
scratch_image ps-otel:latest '["rotel-agent", "--help"]' \
  "$wheel/x/rotel/rotel-agent" target/release/ps-probe
