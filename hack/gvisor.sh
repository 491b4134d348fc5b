#!/usr/bin/env bash
# Builds gVisor's runsc and its containerd shim (containerd-shim-runsc-v1) from
# Go modules and caches them by version outside the clone; prints their dir.
#
#   hack/gvisor.sh            # build once, then print the cached dir
#
# Why this exact snapshot and toolchain:
# - Debian's runsc (2022) ships no containerd shim and only the ptrace platform.
# - Newer snapshots' shims speak containerd 2's bootstrap protocol; Debian 12 has
#   containerd 1.6.
# - gVisor hard-codes Go runtime struct offsets of its era: built with a newer Go
#   it panics at random, so the go command fetches the toolchain it was made for.
# - The shim raises its own OOM protection (oom_score_adj -999), which fails on
#   hosts where root lacks CAP_SYS_RESOURCE (these VMs). It is built from a copy of
#   the module source where that failure is ignored; on a normal host the call
#   still succeeds and nothing changes.
# - runsc finds its own cgroups by reading /proc/self/mountinfo, and on cgroup v1
#   it takes every mount of a controller as that controller's hierarchy. A kind
#   node bind-mounts /sys/fs/cgroup/<controller>/kubelet (and kubelet.slice) onto
#   themselves, so runsc rebased its path on those and failed ("Rel: can't make
#   ../system.slice/containerd.service relative to /kubelet.slice"); the only
#   way past that was to run gVisor pods without cgroups, i.e. without memory
#   and process limits. The copy only reads a controller's hierarchy from the
#   mount at /sys/fs/cgroup/<controller>; hosts without such bind mounts (the
#   local cluster, most machines) see no difference.
# - The systrap platform's fast-path monitor wakes every 400 µs even in an idle
#   sandbox; the copy backs it off while the sandbox is idle (see the patch step).
set -euo pipefail

GVISOR_VERSION=${GVISOR_VERSION:-v0.0.0-20240916094835-a174eb65023f}
GVISOR_GO=${GVISOR_GO:-go1.23.12}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hack/lib/progress.sh
source "$HERE/lib/progress.sh"
CACHE_ROOT=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}
# Bump PATCH when the source patch below changes, so cached builds are redone.
PATCH=7
OUT=$CACHE_ROOT/gvisor/$GVISOR_VERSION-p$PATCH

log() { printf '[gvisor] %s\n' "$*" >&2; }
die() { printf '[gvisor] ERROR: %s\n' "$*" >&2; exit 1; }

progress_plan 1
if [[ -x $OUT/runsc && -x $OUT/containerd-shim-runsc-v1 ]]; then
  step "gVisor runsc and containerd-shim-runsc-v1 ($GVISOR_VERSION, patched): cached"
  echo "$OUT"; exit 0
fi

command -v go >/dev/null || die "go is not on PATH"
export GOTOOLCHAIN=$GVISOR_GO GOFLAGS=-mod=mod
ws=$CACHE_ROOT/build/gvisor-$GVISOR_VERSION

# build: everything below runs through run_logged, its output in the log.
build() {
  log "building gVisor $GVISOR_VERSION with $GVISOR_GO in $ws"
  rm -rf "$ws"; mkdir -p "$ws" "$OUT"
  cd "$ws"
  printf 'module warmpool.local/gvisorbuild\n\ngo 1.23\n' > go.mod
  go get "gvisor.dev/gvisor@$GVISOR_VERSION"
  src=$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)
  [[ -d $src ]] || die "gvisor.dev/gvisor@$GVISOR_VERSION did not download"

  cp -r "$src" gvisor-src && chmod -R u+w gvisor-src
  svc=gvisor-src/pkg/shim/service.go
  grep -q 'return "", fmt.Errorf("failed to set OOM Score on shim: %w", err)' "$svc" \
    || die "the shim's SetScore call moved in $GVISOR_VERSION; update the patch in $0"
  # Not even a log line: the shim's stdout is where containerd reads its address.
  sed -i 's|return "", fmt.Errorf("failed to set OOM Score on shim: %w", err)|_ = err // host refuses a negative oom_score_adj; run unprotected|' "$svc"
  cg=gvisor-src/runsc/cgroup/cgroup.go
  grep -q $'^\t\tcase cgroupv1FsName:$' "$cg" && grep -q $'^\t\t\t\t\trootDir := fields\\[3\\]$' "$cg" \
    || die "runsc's cgroup v1 mount discovery moved in $GVISOR_VERSION; update the patch in $0"
  sed -i $'s|^\t\tcase cgroupv1FsName:$|&\\n\t\t\t// warmpool: only the hierarchy mount tells where paths are rooted, not bind mounts of its subdirectories.\\n\t\t\tif filepath.Dir(fields[4]) != cgroupRoot {\\n\t\t\t\tcontinue\\n\t\t\t}|' "$cg"
  # The systrap fast-path monitor wakes every 400 µs in every sandbox, idle or not
  # (about 4 % of a core per idle sandbox here; gVisor parks it when idle from
  # mid-2026 on). The copy backs it off while nothing happens (hack/gvisor/testdata/warmpool_idle.go).
  fp=gvisor-src/pkg/sentry/platform/systrap/metrics.go
  grep -q $'^\t\ttime.Sleep(recordingPeriod)$' "$fp" && grep -q $'^\t\tfastpath.curState(&fastpath)$' "$fp" \
    || die "systrap's controlFastPath moved in $GVISOR_VERSION; update the patch in $0"
  sed -i $'s|^\t\ttime.Sleep(recordingPeriod)$|\t\ttime.Sleep(idleAwarePeriod) // warmpool: hack/gvisor/testdata/warmpool_idle.go|; s|^\t\tfastpath.curState(&fastpath)$|\t\tnextRecordingPeriod()\\n&\\n\t\tstateConsumed()|' "$fp"
  cp "$HERE/gvisor/testdata/warmpool_idle.go" gvisor-src/pkg/sentry/platform/systrap/
  go mod edit -replace gvisor.dev/gvisor=./gvisor-src
  # The patch's test (the mount tables of a kind node and of a nested container)
  # runs in the patched package before anything is built from it.
  cp "$HERE/gvisor/testdata/cgroup_mounts_test.go" gvisor-src/runsc/cgroup/
  go test gvisor.dev/gvisor/runsc/cgroup || die "the cgroup patch's test failed"
  cp "$HERE/gvisor/testdata/warmpool_idle_test.go" gvisor-src/pkg/sentry/platform/systrap/
  go test -run TestIdleBacksOffWithLeftoverLatencies gvisor.dev/gvisor/pkg/sentry/platform/systrap \
    || die "the systrap idle patch's test failed"
  go get "gvisor.dev/gvisor/runsc@$GVISOR_VERSION" "gvisor.dev/gvisor/shim@$GVISOR_VERSION"
  grep -q "gvisor.dev/gvisor $GVISOR_VERSION" go.mod || die "go get moved gvisor.dev/gvisor off $GVISOR_VERSION"

  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/runsc.tmp" gvisor.dev/gvisor/runsc
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/containerd-shim-runsc-v1.tmp" gvisor.dev/gvisor/shim
  mv "$OUT/runsc.tmp" "$OUT/runsc"
  mv "$OUT/containerd-shim-runsc-v1.tmp" "$OUT/containerd-shim-runsc-v1"
}

# docs/kind.md measured 65 s, docs/performance.md 164 s (next to the Kubernetes builds); the
# first build also fetches the $GVISOR_GO toolchain.
step "building gVisor's runsc and containerd shim from Go modules with $GVISOR_GO, patched and the patches tested (about 1-3 min cold on 2 cores; cached after)"
run_logged "$(progress_log "gvisor-$GVISOR_VERSION-p$PATCH")" build
step_done "built runsc and containerd-shim-runsc-v1"
echo "$OUT"
