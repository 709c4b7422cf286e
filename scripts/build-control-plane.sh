#!/usr/bin/env bash
# Build the real Kubernetes control plane the end-to-end tests run against, from the Go module proxy:
# kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes at a pinned release, its staging
# modules replaced by their published versions) and etcd (go.etcd.io/etcd/server at the version Kubernetes pins).
# Binaries are cached outside git; a second run with the same versions does nothing.
set -euo pipefail
# The tests find the cache through Python's Path.home(), which falls back to the password database: so do we.
HOME=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
export HOME
K8S_VERSION=${K8S_VERSION:-1.34.2}
STAGING_VERSION=0.${K8S_VERSION#1.}
CACHE=${KOORD_E2E_CACHE:-$HOME/.cache/koord-recommender}/control-plane-v$K8S_VERSION
BIN=$CACHE/bin
VPA_MODULE=k8s.io/autoscaler/vertical-pod-autoscaler@v1.5.1
KOORDINATOR_MODULE=github.com/koordinator-sh/koordinator@v1.6.0
CRDS=$CACHE/crds
if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/etcd" ] \
   && [ -s "$CRDS/vpa-v1-crd-gen.yaml" ] && [ -s "$CRDS/analysis.koordinator.sh_recommendations.yaml" ]; then
  echo "$BIN"
  exit 0
fi
# shellcheck source=scripts/setup-lib.sh
. "$(dirname "$0")/setup-lib.sh"
start_go_build 1.24 "the control plane" "$CACHE"
SRC=$CACHE/src
mkdir -p "$SRC/etcd" "$BIN"
cd "$SRC"
{
  echo "module koord-recommender/control-plane"
  echo
  echo "go 1.24.0"
  echo
  echo "require k8s.io/kubernetes v$K8S_VERSION"
  echo
  for module in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider \
      cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client \
      csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator \
      kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils \
      pod-security-admission sample-apiserver sample-cli-plugin sample-controller; do
    echo "replace k8s.io/$module => k8s.io/$module v$STAGING_VERSION"
  done
} > go.mod
cat > etcd/main.go <<'GO'
// etcd, built from the etcd server module at the version Kubernetes itself requires.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
export GOFLAGS=-mod=mod
echo "control plane: resolving k8s.io/kubernetes v$K8S_VERSION from the Go module proxy (log: $log)" >&2
quiet go get "k8s.io/kubernetes@v$K8S_VERSION"
# etcd at exactly the version Kubernetes requires, so nothing else in the build list moves.
ETCD_VERSION=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3 2>>"$log")
quiet go get "go.etcd.io/etcd/server/v3/etcdmain@$ETCD_VERSION"
echo "control plane: building kube-apiserver, kube-controller-manager, kube-scheduler, etcd (takes a while once)" >&2
quiet env CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$BIN/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
quiet env CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$BIN/etcd" ./etcd
echo "control plane: fetching the VPA and Koordinator CRDs from their Go modules" >&2
mkdir -p "$CRDS"
vpa_dir=$(go mod download -json "$VPA_MODULE" 2>>"$log" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
koord_dir=$(go mod download -json "$KOORDINATOR_MODULE" 2>>"$log" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
cp "$vpa_dir/deploy/vpa-v1-crd-gen.yaml" "$CRDS/"
cp "$koord_dir/config/crd/bases/analysis.koordinator.sh_recommendations.yaml" "$CRDS/"
cp "$koord_dir/config/crd/bases/config.koordinator.sh_clustercolocationprofiles.yaml" "$CRDS/"
echo "$BIN"
