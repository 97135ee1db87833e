#!/usr/bin/env bash
# Validates the Kubernetes manifests (deploy/k8s) against a pinned Kubernetes version with
# kubernetes-validate from PyPI (strict: unknown fields are errors) and checks that the
# kustomize base lists every manifest. Installs kubernetes-validate into a virtual environment
# under target/ when missing. (The scrape configuration in prometheus.yaml uses Kubernetes
# service discovery, which Debian's promtool is built without, so promtool cannot check it.)
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION="${K8S_VERSION:-1.30.0}"
venv=target/k8s-validate
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "kubernetes-validate==1.37.0"
fi
cd deploy/k8s
manifests=$(ls *.yaml | grep -v '^kustomization.yaml$')
"../../$venv/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" $manifests
# Every manifest is in the base, and the base names no missing file.
"../../$venv/bin/python" - $manifests <<'PY'
import sys, yaml
listed = set(yaml.safe_load(open("kustomization.yaml"))["resources"])
present = set(sys.argv[1:])
if listed != present:
    sys.exit(f"k8s: kustomization.yaml lists {sorted(listed)} but the folder holds {sorted(present)}")
PY
echo "k8s: $(echo $manifests | wc -w) manifests valid against Kubernetes $K8S_VERSION (strict)" >&2
# The TLS overlay (deploy/k8s-tls), rendered by kubectl's kustomize, validated the same way.
cd ../..
if command -v kubectl >/dev/null 2>&1; then
  kubectl kustomize deploy/k8s-tls >target/k8s-tls.yaml
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" target/k8s-tls.yaml
  echo "k8s: the TLS overlay renders and is valid against Kubernetes $K8S_VERSION (strict)" >&2
else
  echo "k8s: WARNING: no kubectl to render deploy/k8s-tls with; the overlay was not validated" >&2
fi
