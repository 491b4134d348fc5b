#!/usr/bin/env bash
# Builds the previous release's manager and agent binaries from its commit
# (PREVIOUS_RELEASE, in this clone's history), once, into a cache outside the
# clone, and copies its Helm chart to dist/previous-chart: what the upgrade
# specs of the e2e suite install and upgrade from (docs/upgrades.md). Prints
# the directory that holds the binaries (manager, agent).
#
#   PREVIOUS_RELEASE=<commit> PREVIOUS_VERSION=v0.1.0 hack/previous-release.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
: "${PREVIOUS_RELEASE:?the previous release's commit}"
: "${PREVIOUS_VERSION:?the previous release's version}"
GO=${GO:-go}
CACHE=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}/previous/$PREVIOUS_RELEASE
die() { echo "previous-release: $*" >&2; exit 1; }

if [[ ! -x $CACHE/manager || ! -x $CACHE/agent || ! -d $CACHE/src/charts/warmpool ]]; then
  if ! git -C "$ROOT" cat-file -e "$PREVIOUS_RELEASE^{commit}" 2>/dev/null; then
    # A shallow clone: ask its origin for the commit.
    git -C "$ROOT" fetch --quiet origin "$PREVIOUS_RELEASE" >&2 2>/dev/null \
      || git -C "$ROOT" fetch --quiet --unshallow origin >&2 2>/dev/null || true
    git -C "$ROOT" cat-file -e "$PREVIOUS_RELEASE^{commit}" 2>/dev/null \
      || die "commit $PREVIOUS_RELEASE (release $PREVIOUS_VERSION) is not in this clone, nor could it be fetched: clone with its history (not --depth)"
  fi
  echo "previous-release: building $PREVIOUS_VERSION ($PREVIOUS_RELEASE) into $CACHE" >&2
  rm -rf "$CACHE.tmp" && mkdir -p "$CACHE.tmp/src"
  git -C "$ROOT" archive "$PREVIOUS_RELEASE" | tar -x -C "$CACHE.tmp/src"
  ldflags="-s -w -X github.com/warmpool/warmpool/internal/version.Version=$PREVIOUS_VERSION -X github.com/warmpool/warmpool/internal/version.Commit=$PREVIOUS_RELEASE"
  (cd "$CACHE.tmp/src" \
    && CGO_ENABLED=0 "$GO" build -trimpath -ldflags="$ldflags" -o "$CACHE.tmp/agent" ./cmd/agent \
    && CGO_ENABLED=0 "$GO" build -trimpath -ldflags="$ldflags" -o "$CACHE.tmp/manager" ./cmd/manager) >&2
  rm -rf "$CACHE" && mv "$CACHE.tmp" "$CACHE"
fi
rm -rf "$ROOT/dist/previous-chart" && mkdir -p "$ROOT/dist"
cp -r "$CACHE/src/charts/warmpool" "$ROOT/dist/previous-chart"
echo "$CACHE"
