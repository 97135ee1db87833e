#!/usr/bin/env bash
# Makes a development CA and certificates for TLS and mutual TLS (openssl, EC P-256):
#
#   scripts/dev-certs.sh DIR [--name DNS]... [--client NAME]... [--days N]
#
# DIR/ca.pem, ca.key       the CA (keep ca.key away from the services)
# DIR/server.pem, .key     the services' certificate: DNS localhost, IP 127.0.0.1 and ::1, and
#                          every --name (the compose services, Kubernetes service names); it
#                          serves and, for mutual TLS, identifies the services to each other
# DIR/NAME.pem, .key       a client certificate per --client, DNS name NAME: a tokens file
#                          entry with cert_name = "NAME" authenticates it without a token
#
# An existing CA in DIR is reused (so new certificates chain to the one clients trust);
# certificates are made again. Rotation: run it again and the services pick the new files up
# within a second, without a restart.
set -euo pipefail
if [ $# -lt 1 ]; then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
dir=$1
shift
names=()
clients=()
days=825
while [ $# -gt 0 ]; do
  case $1 in
    --name) names+=("$2"); shift 2 ;;
    --client) clients+=("$2"); shift 2 ;;
    --days) days=$2; shift 2 ;;
    *) echo "dev-certs: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
cd "$dir"
umask 077
if [ ! -s ca.pem ] || [ ! -s ca.key ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
    -out ca.pem -days "$days" -subj "/CN=parameter-server dev CA $(date +%s%N)" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

# issue NAME SAN EKU: NAME.pem and NAME.key signed by the CA.
issue() {
  local out=$1 san=$2 eku=$3
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$out.key.new" \
    -out "$out.csr" -subj "/CN=$out" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
    "$eku" "$san" >"$out.ext"
  openssl x509 -req -in "$out.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$out.ext" -out "$out.pem.new" 2>/dev/null
  # The key and the certificate change together (a reader never sees a new key with an old
  # certificate for long: the services reload both on the next change they see).
  mv "$out.key.new" "$out.key"
  mv "$out.pem.new" "$out.pem"
  rm -f "$out.csr" "$out.ext"
}

san="DNS:localhost,IP:127.0.0.1,IP:::1"
for n in "${names[@]}"; do
  san="$san,DNS:$n"
done
issue server "$san" "serverAuth,clientAuth"
for c in "${clients[@]}"; do
  issue "$c" "DNS:$c" "clientAuth"
done
# The services run as other users in containers: certificates and keys readable (the CA key
# stays private).
chmod 644 ./*.pem
chmod 644 server.key "${clients[@]/%/.key}" 2>/dev/null || true
chmod 600 ca.key
echo "dev-certs: CA and certificates in $(pwd)" >&2
