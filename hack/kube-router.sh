#!/usr/bin/env bash
# Builds kube-router (used only for its NetworkPolicy controller: iptables +
# ipset) from Go modules and caches it by version outside the clone; prints the
# directory holding the binary.
#
#   hack/kube-router.sh        # build once, then print the cached dir
#
# Why it is built this way:
# - v2.1.0 is the only kube-router release the Go module proxy serves us, and
#   sum.golang.org has no entry for it (`verifying go.mod ... 404`). So the
#   checksum database is skipped for this one module (GONOSUMDB) and its hashes
#   are pinned here instead: they are written into the build module's go.sum
#   before anything is downloaded, so a zip or go.mod that differs from what we
#   checked fails the build with a checksum mismatch. Every other dependency is
#   still verified through the checksum database as usual.
# - kube-router's own go.mod is fine for `go get` (no directory replaces), but a
#   throwaway module keeps its dependencies out of the project's go.mod.
set -euo pipefail
# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"

KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
# What `go mod download -json github.com/cloudnativelabs/kube-router/v2@v2.1.0`
# reported for a download into an empty module cache (2026-11-22).
KUBE_ROUTER_ZIP_SUM=h1:xWsptKtmZ44L+NjwFKoFAFlVdxCz8fka9A/eYJe95Ok=
KUBE_ROUTER_MOD_SUM=h1:JU/k2Qqcph0myF1cRDLidz1SZdoSrPczuYcGxYRSP0A=
# Go 1.26 builds v2.1.0 (and its 2024 dependencies) as it is, CGO off. Should a
# later Go not, KUBE_ROUTER_GO=go1.22.12 makes the go command fetch that one.
KUBE_ROUTER_GO=${KUBE_ROUTER_GO:-local}
CACHE_ROOT=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}
MOD=github.com/cloudnativelabs/kube-router/v2
OUT=$CACHE_ROOT/kube-router/$KUBE_ROUTER_VERSION

log() { printf '[kube-router] %s\n' "$*" >&2; }
die() { printf '[kube-router] ERROR: %s\n' "$*" >&2; exit 1; }

progress_plan 1
if [[ -x $OUT/kube-router ]]; then
  step "kube-router $KUBE_ROUTER_VERSION (NetworkPolicy): cached"
  echo "$OUT"; exit 0
fi
[[ $KUBE_ROUTER_VERSION == v2.1.0 ]] \
  || die "only v2.1.0's hashes are pinned in $0; add the new version's go.sum lines first"

command -v go >/dev/null || die "go is not on PATH"
export GOTOOLCHAIN=$KUBE_ROUTER_GO
export GONOSUMDB=github.com/cloudnativelabs/kube-router
ws=$CACHE_ROOT/build/kube-router-$KUBE_ROUTER_VERSION

# build: run through run_logged, its output in the log.
build() {
  log "building kube-router $KUBE_ROUTER_VERSION in $ws"
  rm -rf "$ws"; mkdir -p "$ws" "$OUT"
  cd "$ws"
  printf 'module warmpool.local/kuberouterbuild\n\ngo 1.21\n' >go.mod
  pinned="$MOD $KUBE_ROUTER_VERSION $KUBE_ROUTER_ZIP_SUM
$MOD $KUBE_ROUTER_VERSION/go.mod $KUBE_ROUTER_MOD_SUM"
  echo "$pinned" >go.sum
  go get "$MOD/cmd/kube-router@$KUBE_ROUTER_VERSION" \
    || die "go get $MOD@$KUBE_ROUTER_VERSION failed (a checksum mismatch means the upstream module changed)"
  # go get only ever adds to go.sum; make sure nothing replaced our pins.
  while read -r line; do
    grep -qxF "$line" go.sum || die "go.sum lost the pinned line: $line"
  done <<<"$pinned"
  grep -q "^require $MOD $KUBE_ROUTER_VERSION\$\|^	$MOD $KUBE_ROUTER_VERSION\( \|\$\)" go.mod \
    || die "go get moved $MOD off $KUBE_ROUTER_VERSION"

  CGO_ENABLED=0 go build -trimpath -o "$OUT/kube-router.tmp" -ldflags "-s -w \
    -X $MOD/pkg/version.Version=$KUBE_ROUTER_VERSION \
    -X $MOD/pkg/version.BuildDate=module-proxy" "$MOD/cmd/kube-router"
  mv "$OUT/kube-router.tmp" "$OUT/kube-router"
}

# The script said ~1-2 min; docs/kind.md measured 68 s.
step "building kube-router $KUBE_ROUTER_VERSION from Go modules, the NetworkPolicy enforcer (about 1-2 min cold on 2 cores; cached after)"
run_logged "$(progress_log "kube-router-$KUBE_ROUTER_VERSION")" build
step_done "built kube-router $KUBE_ROUTER_VERSION with $(go env GOVERSION)"
echo "$OUT"
