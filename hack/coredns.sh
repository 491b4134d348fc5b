#!/usr/bin/env bash
# Builds CoreDNS, the local cluster's DNS server, from Go modules and caches it
# by version outside the clone; prints the directory holding the binary.
#
#   hack/coredns.sh            # build once, then print the cached dir
#
# Only the plugins the local cluster's Corefile uses are compiled in (the same
# way CoreDNS' plugin.cfg selects them, but from a throwaway main package):
# the full plugin set drags in the Azure, AWS, GCP, DataDog and etcd SDKs,
# which would triple the build and add code that could forward queries off the
# machine. Plugins a Corefile names but the binary lacks fail at start, so a
# Corefile cannot quietly grow a `forward`.
set -euo pipefail
# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"

# v1.15.0 requires Go >= 1.26.0 (its go.mod), which is what we build with; all
# its dependencies are in the checksum database.
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
# Bump when PLUGINS changes, so cached builds are redone.
PLUGINS_REV=2
# health: the kind node runs this binary as kubeadm's CoreDNS Deployment,
# whose liveness probe asks /health.
PLUGINS=(bind ready health errors kubernetes)
CACHE_ROOT=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}
OUT=$CACHE_ROOT/coredns/$COREDNS_VERSION-p$PLUGINS_REV

log() { printf '[coredns] %s\n' "$*" >&2; }
die() { printf '[coredns] ERROR: %s\n' "$*" >&2; exit 1; }

progress_plan 1
if [[ -x $OUT/coredns ]]; then
  step "CoreDNS $COREDNS_VERSION (cluster DNS): cached"
  echo "$OUT"; exit 0
fi

command -v go >/dev/null || die "go is not on PATH"
ws=$CACHE_ROOT/build/coredns-$COREDNS_VERSION

# build: run through run_logged, its output in the log.
build() {
  log "building coredns $COREDNS_VERSION (plugins: ${PLUGINS[*]}) in $ws"
  rm -rf "$ws"; mkdir -p "$ws" "$OUT"
  cd "$ws"
  printf 'module warmpool.local/corednsbuild\n\ngo 1.26.0\n' >go.mod
  {
    echo 'package main'
    echo
    echo 'import ('
    echo '	"github.com/coredns/coredns/core/dnsserver"'
    echo '	"github.com/coredns/coredns/coremain"'
    for p in "${PLUGINS[@]}"; do echo "	_ \"github.com/coredns/coredns/plugin/$p\""; done
    echo ')'
    echo
    # Plugin order inside a server block is this list's order, not the
    # Corefile's; it follows upstream plugin.cfg.
    printf 'func init() { dnsserver.Directives = []string{'
    printf '"%s", ' "${PLUGINS[@]}"
    echo '} }'
    echo
    echo 'func main() { coremain.Run() }'
  } >main.go
  gofmt -w main.go
  go get "github.com/coredns/coredns@$COREDNS_VERSION"
  go mod tidy
  grep -q "github.com/coredns/coredns $COREDNS_VERSION\$" go.mod || die "go mod tidy moved coredns off $COREDNS_VERSION"
  CGO_ENABLED=0 go build -trimpath -o "$OUT/coredns.tmp" -ldflags "-s -w \
    -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" .
  mv "$OUT/coredns.tmp" "$OUT/coredns"
}

# The script said ~2 min; docs/kind.md measured 62 s.
step "building CoreDNS $COREDNS_VERSION from Go modules, the cluster DNS, with plugins ${PLUGINS[*]} only (about 1-2 min cold on 2 cores; cached after)"
run_logged "$(progress_log "coredns-$COREDNS_VERSION")" build
step_done "built coredns $COREDNS_VERSION"
echo "$OUT"
