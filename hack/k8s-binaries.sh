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
# Progress goes to stderr, one numbered step per binary (hack/lib/progress.sh); Go's
# output goes to ~/.cache/warmpool/logs/BINARY-VERSION.log. The only thing on stdout is
# the resulting directory, so callers can do: KUBEBUILDER_ASSETS=$(hack/k8s-binaries.sh envtest).
set -euo pipefail
# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"

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
K8S_WS=$CACHE_ROOT/build/k8s-$K8S_VERSION
prepare_k8s_workspace() {
  local ws=$K8S_WS
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
}

# Cold build times on 2 cores, as measured in docs/kind.md and docs/performance.md
# (module downloads included): the faster and the slower session are the two ends.
k8s_estimate() {
  case $1 in
    kube-apiserver) echo "about 4-10 min" ;;
    kubelet) echo "about 1-3 min" ;;
    kube-controller-manager) echo "about 0.5-2 min" ;;
    kubectl) echo "about 20-50 s" ;;
    kube-proxy) echo "about 10-20 s" ;;
    kube-scheduler) echo "about 10 s" ;;
    kubeadm) echo "about 15 s" ;;
    *) echo "a few minutes" ;;
  esac
}

go_build_k8s() { # go_build_k8s CMD: run by run_logged, in a subshell, output to the log
  local cmd=$1 out=$K8S_DIR/$1 minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local pkg=k8s.io/kubernetes/cmd/$cmd
  if [[ ! -f $K8S_WS/.ready ]]; then prepare_k8s_workspace; fi
  mkdir -p "$K8S_DIR"
  cd "$K8S_WS"
  go get "$pkg@$K8S_VERSION"
  CGO_ENABLED=0 go build -trimpath -o "$out.tmp" -ldflags "-s -w \
    -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 \
    -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/component-base/version.gitTreeState=clean \
    -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" "$pkg"
  mv "$out.tmp" "$out"
}

build_k8s() {
  local cmd=$1 out=$K8S_DIR/$1 first=
  if [[ -x $out ]]; then step "$cmd $K8S_VERSION: cached"; return; fi
  [[ -f $K8S_WS/.ready ]] || first="; this first Kubernetes binary also fetches k8s.io/kubernetes' modules, a few minutes more"
  step "building $cmd $K8S_VERSION from Go modules ($(k8s_estimate "$cmd") cold on 2 cores$first; cached after)"
  run_logged "$(progress_log "$cmd-$K8S_VERSION")" go_build_k8s "$cmd"
  step_done "built $cmd $K8S_VERSION"
}

go_build_etcd() { # run by run_logged, in a subshell, output to the log
  local out=$ETCD_DIR/etcd ws=$CACHE_ROOT/build/etcd-$ETCD_VERSION
  rm -rf "$ws"; mkdir -p "$ws" "$ETCD_DIR"
  cd "$ws"
  go mod init warmpool.local/etcdbuild >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" go.etcd.io/etcd/server/v3
  mv "$out.tmp" "$out"
}

build_etcd() {
  local est
  if [[ -x $ETCD_DIR/etcd ]]; then step "etcd $ETCD_VERSION: cached"; return; fi
  # docs/kind.md and docs/performance.md: etcd 3.5 23-202 s, 3.6.5 20 s (after a 3.5 build).
  case $ETCD_VERSION in
    v3.5.*) est="about 0.5-3.5 min cold on 2 cores" ;;
    *) est="about 20 s cold on 2 cores after an etcd 3.5 build, a few minutes without" ;;
  esac
  step "building etcd $ETCD_VERSION from Go modules ($est; cached after)"
  run_logged "$(progress_log "etcd-$ETCD_VERSION")" go_build_etcd
  step_done "built etcd $ETCD_VERSION"
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
    progress_plan 2
    build_etcd
    build_k8s kube-apiserver
    assets=$CACHE_ROOT/envtest/$K8S_VERSION-etcd-$ETCD_VERSION
    mkdir -p "$assets"
    ln -sf "$K8S_DIR/kube-apiserver" "$assets/kube-apiserver"
    ln -sf "$ETCD_DIR/etcd" "$assets/etcd"
    progress_end
    echo "$assets"
    ;;
  build)
    shift
    [[ $# -gt 0 ]] || die "usage: $0 build CMD..."
    for c in "$@"; do
      case $c in
        etcd|kube-apiserver|kubelet|kube-controller-manager|kube-scheduler|kubectl|kube-proxy|kubeadm) ;;
        *) die "unknown binary '$c'" ;;
      esac
    done
    progress_plan $#
    for c in "$@"; do build_one "$c"; done
    progress_end
    echo "$K8S_DIR"
    ;;
  *) die "usage: $0 envtest | build CMD..." ;;
esac
