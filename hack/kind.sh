#!/usr/bin/env bash
# kind with gVisor, for machines that run Docker (it cannot run on our CI
# machines, which have no Docker engine; there hack/local-cluster.sh is used).
#
#   hack/kind.sh up      # cluster "warmpool" with runsc registered, RuntimeClass gvisor
#   hack/kind.sh load    # load dist/*.tar (make images) into the nodes
#   hack/kind.sh down
#
# runsc and its containerd shim are mounted into every node from the host
# (hack/gvisor.sh builds them; set GVISOR_DIR to use others, e.g. a current
# gVisor release: kind nodes run containerd 2, which a current shim expects).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KIND=${KIND:-$ROOT/bin/kind}
KUBECTL=${KUBECTL:-kubectl}
CLUSTER=${KIND_CLUSTER:-warmpool}
NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.34.0}

log() { printf '[kind] %s\n' "$*" >&2; }
die() { printf '[kind] ERROR: %s\n' "$*" >&2; exit 1; }

[[ -x $KIND ]] || die "no kind at $KIND: run 'make kind' (or set KIND)"
docker info >/dev/null 2>&1 || die "kind needs a running Docker engine; without one use 'make cluster-up'"

up() {
  if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "cluster $CLUSTER exists"
  else
    local gv=${GVISOR_DIR:-$("$ROOT/hack/gvisor.sh")}
    local cfg; cfg=$(mktemp --suffix .yaml)
    # The runtime is registered under both section names: containerd 1.x
    # (grpc.v1.cri) and containerd 2 (cri.v1.runtime) nodes.
    cat >"$cfg" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
  extraMounts:
  - {hostPath: $gv/runsc, containerPath: /usr/local/bin/runsc}
  - {hostPath: $gv/containerd-shim-runsc-v1, containerPath: /usr/local/bin/containerd-shim-runsc-v1}
containerdConfigPatches:
- |-
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
    runtime_type = "io.containerd.runsc.v1"
    pod_annotations = ["dev.gvisor.spec.mount.*"]
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc]
    runtime_type = "io.containerd.runsc.v1"
    pod_annotations = ["dev.gvisor.spec.mount.*"]
EOF
    log "creating cluster $CLUSTER ($NODE_IMAGE) with runsc from $gv"
    "$KIND" create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config "$cfg" --wait 120s
    rm -f "$cfg"
  fi
  "$KUBECTL" --context "kind-$CLUSTER" apply --server-side -f "$ROOT/config/runtimeclass/runtimeclass.yaml"
  log "ready: kubectl --context kind-$CLUSTER; then 'make kind-load deploy'"
}

load() {
  local t
  for t in "$ROOT"/dist/repl.tar "$ROOT"/dist/manager.tar; do
    [[ -f $t ]] || die "$t missing: run 'make images'"
    log "loading ${t#"$ROOT"/}"
    "$KIND" load image-archive --name "$CLUSTER" "$t"
  done
}

case ${1:-} in
  up) up ;;
  load) load ;;
  down) "$KIND" delete cluster --name "$CLUSTER" ;;
  *) die "usage: $0 up|load|down" ;;
esac
