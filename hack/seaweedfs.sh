#!/usr/bin/env bash
# Builds SeaweedFS's `weed` (Apache-2.0) from Go modules and caches it by
# version outside the clone: the S3-compatible object store the suites keep
# the snapshots of suspended Sessions in (a real server, not a mock).
# Prints the binary's path, and nothing else on stdout.
#
# Built in the module's own directory, where its go.mod (and its one
# replace directive) apply: `go install weed@version` refuses a module with
# replace directives.
set -euo pipefail
# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"
SEAWEEDFS_VERSION=${SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}
CACHE_ROOT=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}
out=$CACHE_ROOT/bin/weed-$SEAWEEDFS_VERSION
progress_plan 1
if [[ -x $out ]]; then step "SeaweedFS $SEAWEEDFS_VERSION (the suites' S3 store): cached"; echo "$out"; exit 0; fi
step "building SeaweedFS $SEAWEEDFS_VERSION from Go modules, the suites' S3 store (about 7 min on 2 cores, once)"
mkdir -p "$CACHE_ROOT/bin" "$CACHE_ROOT/logs"
log=$CACHE_ROOT/logs/seaweedfs-$SEAWEEDFS_VERSION.log
dir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json "github.com/seaweedfs/seaweedfs@$SEAWEEDFS_VERSION" 2>>"$log" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d $dir ]] || { echo "[seaweedfs] could not download github.com/seaweedfs/seaweedfs@$SEAWEEDFS_VERSION (see $log)" >&2; exit 1; }
(cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$out.tmp" ./weed) >>"$log" 2>&1 \
  || { echo "[seaweedfs] build failed (see $log)" >&2; tail -20 "$log" >&2; exit 1; }
mv "$out.tmp" "$out"
echo "$out"
