#!/usr/bin/env bash
# The one-command tour (make demo): a cluster with gVisor, warmpool deployed,
# the sample pool warm, one sample Execution run, and its output printed.
#
# The cluster: kind when Docker runs here (hack/kind.sh), else the local
# single-node cluster (hack/local-cluster.sh, needs root). Set KUBECONFIG to use
# a cluster of your own instead (images loaded by you).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KUBECTL=${KUBECTL:-$("$ROOT/hack/k8s-binaries.sh" build kubectl)/kubectl}
export KUBECTL
NS=${DEMO_NAMESPACE:-warmpool-demo}
t0=$SECONDS

log() { printf '\n[demo] %s\n' "$*" >&2; }
k() { "$KUBECTL" "$@"; }

if [[ -n ${KUBECONFIG:-} && $KUBECONFIG != "$("$ROOT/hack/local-cluster.sh" kubeconfig)" ]]; then
  log "using the cluster in KUBECONFIG=$KUBECONFIG"
elif docker info >/dev/null 2>&1; then
  log "Docker runs here: kind cluster with gVisor"
  make -C "$ROOT" --no-print-directory kind images
  KIND="$ROOT/bin/kind" "$ROOT/hack/kind.sh" up
  KIND="$ROOT/bin/kind" "$ROOT/hack/kind.sh" load
  export KUBECONFIG=$("$ROOT/hack/kind.sh" kubeconfig)
else
  log "no Docker: the local single-node cluster (containerd + gVisor, built from source; first run ~20 min)"
  "$ROOT/hack/local-cluster.sh" up
  export KUBECONFIG=$("$ROOT/hack/local-cluster.sh" kubeconfig)
fi

log "deploying warmpool (make deploy)"
make -C "$ROOT" --no-print-directory deploy >/dev/null
# Same image tag, maybe a new build: make the controllers and the data plane run the image just loaded.
k -n warmpool-system rollout restart deployment/warmpool-controller-manager deployment/warmpool-data-plane >/dev/null
k -n warmpool-system rollout status deployment/warmpool-controller-manager --timeout=180s >/dev/null
k -n warmpool-system rollout status deployment/warmpool-data-plane --timeout=180s >/dev/null

log "sample pool 'python' (3 warm gVisor sandboxes) in namespace $NS"
k create namespace "$NS" --dry-run=client -o yaml | k apply -f - >/dev/null
k -n "$NS" apply -f "$ROOT/config/samples/sandbox_v1alpha1_sandboxpool.yaml"
k -n "$NS" wait --for=jsonpath='{.status.idleReplicas}'=3 sandboxpool/python --timeout=180s >/dev/null

log "running the sample Execution 'hello'"
# An Execution runs once: start from a fresh one on every demo.
k -n "$NS" delete execution hello --ignore-not-found >/dev/null
k -n "$NS" apply -f "$ROOT/config/samples/sandbox_v1alpha1_execution.yaml"
k -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded execution/hello --timeout=120s >/dev/null
k -n "$NS" get execution hello
printf '\n--- stdout ---\n%s\n--- result ---\n%s\n' \
  "$(k -n "$NS" get execution hello -o jsonpath='{.status.stdout}')" \
  "$(k -n "$NS" get execution hello -o jsonpath='{.status.result}')"

log "done in $((SECONDS - t0)) s. Try: kubectl -n $NS get sandboxpools,executions (KUBECONFIG=$KUBECONFIG)"
