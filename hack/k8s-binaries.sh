#!/usr/bin/env bash
# Builds Kubernetes and etcd binaries from Go modules (no release downloads are
# reachable from our CI machines) and caches them by version outside the clone.
#
#   hack/k8s-binaries.sh envtest           # kube-apiserver + etcd, prints the KUBEBUILDER_ASSETS dir
#   hack/k8s-binaries.sh build CMD...      # any of kube-apiserver kubelet kube-controller-manager
#                                          # kube-scheduler kubectl kube-proxy kubeadm etcd; prints their dir
#                                          # (ETCD_VERSION=v3.6.5 for the kind node: kubeadm 1.34
#                                          # passes etcd flags 3.5 rejects)
#
# Progress goes to stderr; the only thing on stdout is the resulting directory,
# so callers can do: KUBEBUILDER_ASSETS=$(hack/k8s-binaries.sh envtest).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.10}
ETCD_VERSION=${ETCD_VERSION:-v3.5.35}
CACHE_ROOT=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}
K8S_DIR=$CACHE_ROOT/k8s/$K8S_VERSION
ETCD_DIR=$CACHE_ROOT/etcd/$ETCD_VERSION

log() { printf '[k8s-binaries] %s\n' "$*" >&2; }
die() { printf '[k8s-binaries] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH; install Go 1.26+ first"

# A throwaway module is needed because k8s.io/kubernetes' own go.mod replaces its
# staging modules with local directories, which makes `go install pkg@version` fail.
k8s_workspace() {
  local ws=$CACHE_ROOT/build/k8s-$K8S_VERSION
  if [[ -f $ws/.ready ]]; then echo "$ws"; return; fi
  log "preparing build module for k8s.io/kubernetes $K8S_VERSION in $ws"
  rm -rf "$ws"; mkdir -p "$ws"
  local minor=${K8S_VERSION#v1.}; local staging=v0.$minor
  (
    cd "$ws"
    go mod init warmpool.local/k8sbuild >/dev/null 2>&1
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
    [[ -f $gomod ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy"
    # Every `k8s.io/X => ./staging/src/k8s.io/X` in kubernetes' go.mod becomes a
    # replace to the published module of the same release.
    local mods
    mods=$(grep -oE 'k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" | awk '{print $1}' | sort -u)
    [[ -n $mods ]] || die "found no staging replaces in $gomod"
    for m in $mods; do go mod edit -replace "$m=$m@$staging"; done
    log "$(echo "$mods" | wc -l) staging modules pinned to $staging"
    go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
  )
  touch "$ws/.ready"
  echo "$ws"
}

build_k8s() {
  local cmd=$1 out=$K8S_DIR/$1
  if [[ -x $out ]]; then log "$cmd $K8S_VERSION cached at $out"; return; fi
  local ws; ws=$(k8s_workspace)
  log "building $cmd $K8S_VERSION (cold: kube-apiserver ~8 min, others 10 s-1.5 min on 2 cores)"
  local start=$SECONDS minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local pkg=k8s.io/kubernetes/cmd/$cmd
  mkdir -p "$K8S_DIR"
  (
    cd "$ws"
    go get "$pkg@$K8S_VERSION" >&2
    CGO_ENABLED=0 go build -trimpath -o "$out.tmp" -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$minor \
      -X k8s.io/component-base/version.gitTreeState=clean \
      -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" "$pkg" >&2
  ) || die "building $cmd failed (see the go output above)"
  mv "$out.tmp" "$out"
  log "built $cmd in $((SECONDS - start)) s"
}

build_etcd() {
  local out=$ETCD_DIR/etcd
  if [[ -x $out ]]; then log "etcd $ETCD_VERSION cached at $out"; return; fi
  local ws=$CACHE_ROOT/build/etcd-$ETCD_VERSION
  log "building etcd $ETCD_VERSION (cold ~1.5 min)"
  local start=$SECONDS
  rm -rf "$ws"; mkdir -p "$ws" "$ETCD_DIR"
  (
    cd "$ws"
    go mod init warmpool.local/etcdbuild >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" go.etcd.io/etcd/server/v3 >&2
  ) || die "building etcd failed (see the go output above)"
  mv "$out.tmp" "$out"
  log "built etcd in $((SECONDS - start)) s"
}

build_one() {
  case $1 in
    etcd) build_etcd ;;
    kube-apiserver|kubelet|kube-controller-manager|kube-scheduler|kubectl|kube-proxy|kubeadm) build_k8s "$1" ;;
    *) die "unknown binary '$1'" ;;
  esac
}

case ${1:-envtest} in
  envtest)
    build_etcd
    build_k8s kube-apiserver
    assets=$CACHE_ROOT/envtest/$K8S_VERSION-etcd-$ETCD_VERSION
    mkdir -p "$assets"
    ln -sf "$K8S_DIR/kube-apiserver" "$assets/kube-apiserver"
    ln -sf "$ETCD_DIR/etcd" "$assets/etcd"
    echo "$assets"
    ;;
  build)
    shift
    [[ $# -gt 0 ]] || die "usage: $0 build CMD..."
    for c in "$@"; do build_one "$c"; done
    echo "$K8S_DIR"
    ;;
  *) die "usage: $0 envtest | build CMD..." ;;
esac
