#!/usr/bin/env bash
# Build helm, which the chart's tests (tests/e2e/test_chart.py, tests/unit/test_chart.py) run, from the Go module
# proxy at a pinned release, with the same version stamps as helm's own Makefile; and fetch the published CRDs of the
# kinds the chart may render that the control plane cache lacks (cert-manager's Certificate and Issuer, the
# Prometheus Operator's ServiceMonitor), so the tests can validate them by their real schemas.
# Cached outside git beside the control plane; a second run with the same versions does nothing.
# Prints the helm binary's path. Exit 3: no Go here (the tests then say so and skip).
set -euo pipefail
HOME=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
export HOME
HELM_VERSION=${HELM_VERSION:-3.21.4}
CERT_MANAGER_MODULE=github.com/cert-manager/cert-manager@v1.21.2
PROMETHEUS_OPERATOR_MODULE=github.com/prometheus-operator/prometheus-operator@v0.85.0
CACHE=${KOORD_E2E_CACHE:-$HOME/.cache/koord-recommender}/helm-v$HELM_VERSION
BIN=$CACHE/bin
CRDS=$CACHE/crds
if [ -x "$BIN/helm" ] && [ -s "$CRDS/cert-manager.io_certificates.yaml" ] && [ -s "$CRDS/cert-manager.io_issuers.yaml" ] && [ -s "$CRDS/monitoring.coreos.com_servicemonitors.yaml" ]; then
  echo "$BIN/helm"
  exit 0
fi
# shellcheck source=scripts/setup-lib.sh
. "$(dirname "$0")/setup-lib.sh"
start_go_build 1.26 "helm" "$CACHE"
mkdir -p "$BIN" "$CRDS"
export GOFLAGS=-mod=mod
echo "helm: fetching helm.sh/helm/v3@v$HELM_VERSION from the Go module proxy (log: $log)" >&2
src=$(go mod download -json "helm.sh/helm/v3@v$HELM_VERSION" 2>>"$log" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
work=$CACHE/src
rm -rf "$work"
cp -r "$src" "$work"
chmod -R u+w "$work"
cd "$work"
# helm's Makefile stamps the Kubernetes version its lint and capabilities default to from its client-go version.
client_go=$(go list -m -f '{{.Version}}' k8s.io/client-go 2>>"$log")
minor=$(echo "$client_go" | cut -d. -f2)
major=$(( $(echo "${client_go#v}" | cut -d. -f1) + 1 ))
ldflags="-w -s -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v3/internal/version.metadata="
ldflags="$ldflags -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags="$ldflags -X helm.sh/helm/v3/$pkg.k8sVersionMajor=$major -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
done
echo "helm: building v$HELM_VERSION (takes a few minutes once)" >&2
quiet env CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$BIN/helm" ./cmd/helm
cd "$CACHE"
rm -rf "$work"
echo "helm: fetching the cert-manager and Prometheus Operator CRDs from their Go modules" >&2
cm_dir=$(go mod download -json "$CERT_MANAGER_MODULE" 2>>"$log" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
po_dir=$(go mod download -json "$PROMETHEUS_OPERATOR_MODULE" 2>>"$log" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
cp "$po_dir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" "$CRDS/"
cp "$cm_dir/deploy/crds/cert-manager.io_certificates.yaml" "$cm_dir/deploy/crds/cert-manager.io_issuers.yaml" "$CRDS/"
quiet "$BIN/helm" version
echo "$BIN/helm"
