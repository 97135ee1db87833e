#!/usr/bin/env bash
# Builds the project's container image from the release build and local files only (no
# registry is reached): `FROM scratch` with the binaries, stripped, and the shared libraries
# they load (glibc, libstdc++ and libgcc_s, read from `ldd`). One image holds every binary
# (ps-server, scheduler, worker, psctl, ps-probe): they share those libraries and most of
# their code, a compose file or a manifest picks the command, and there is one thing to
# build, tag and ship. It runs as user 10001 with /data (owned by it) for state.
#
#   scripts/images.sh            # builds ps:<version> and tags it ps:latest
#   PS_IMAGE=ps:dev scripts/images.sh
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag="${PS_IMAGE:-ps:$version}"
bins=(ps-server scheduler worker psctl ps-probe)
cargo build --release --bins -p ps-server -p ps-scheduler -p ps-worker -p ps-cli -p ps-runtime
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/rootfs"
mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/etc" "$stage/state/data"
for b in "${bins[@]}"; do
  strip -o "$root/usr/local/bin/$b" "target/release/$b"
done
# The libraries every binary loads, and the loader itself, at the paths they were found.
for lib in $(for b in "${bins[@]}"; do ldd "target/release/$b"; done \
    | awk '/=> \// { print $3 } /^[ \t]*\/lib/ { print $1 }' | sort -u); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
printf 'root:x:0:0:root:/:/usr/local/bin/ps-probe\nps:x:10001:10001:ps:/data:/usr/local/bin/ps-probe\n' \
  > "$root/etc/passwd"
printf 'root:x:0:\nps:x:10001:\n' > "$root/etc/group"
chmod 1777 "$root/tmp"
cat > "$stage/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
# The state directory itself, owned by the service's user (COPY copies a folder's contents).
COPY --chown=10001:10001 state/ /
ENV PATH=/usr/local/bin RUST_LOG=info NO_COLOR=1
USER 10001
WORKDIR /data
CMD ["ps-server", "--help"]
DOCKERFILE
docker build -q -t "$tag" -t ps:latest "$stage" >/dev/null
size=$(docker image inspect -f '{{.Size}}' "$tag")
echo "images: built $tag ($((size / 1048576)) MiB): ${bins[*]}" >&2
