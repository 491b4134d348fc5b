#!/usr/bin/env bash
# The one-command tour (make demo): a cluster with gVisor, warmpool deployed,
# the sample pool warm, one sample Execution run, and its output printed.
#
# The cluster: kind when Docker runs here (hack/kind.sh), else the local
# single-node cluster (hack/local-cluster.sh, needs root). Set KUBECONFIG to use
# a cluster of your own instead (images loaded by you).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=hack/lib/progress.sh
source "$ROOT/hack/lib/progress.sh"
NS=${DEMO_NAMESPACE:-warmpool-demo}
t0=$SECONDS
# The demo stores no snapshots: no SeaweedFS image (the e2e suite's S3 store) to build.
export SEAWEEDFS_IMAGE=${SEAWEEDFS_IMAGE-}

log() { printf '\n[demo] %s\n' "$*" >&2; }
k() { "$KUBECTL" "$@"; }

# Which cluster, and so how many numbered steps: kubectl, the cluster's own steps
# (hack/kind.sh or hack/local-cluster.sh counts them), deploy, pool, Execution.
if [[ -n ${KUBECONFIG:-} && $KUBECONFIG != "$("$ROOT/hack/local-cluster.sh" kubeconfig)" ]]; then
  mode=own
  progress_plan 5 "make demo on the cluster in KUBECONFIG=$KUBECONFIG (images loaded by you)"
elif docker info >/dev/null 2>&1; then
  mode=kind cluster_steps=$("$ROOT/hack/kind.sh" steps)
  progress_plan $((1 + 1 + cluster_steps + 1 + 4)) "make demo: a kind cluster with gVisor (Docker runs here). Cold, it first builds kubectl, the node image, gVisor and the images from Debian packages and Go modules: about 12 min on 2 cores, and 2 min for the cluster's first start (docs/kind.md). With the cluster up: about 40 s"
else
  mode=local cluster_steps=$("$ROOT/hack/local-cluster.sh" steps)
  progress_plan $((1 + cluster_steps + 4)) "make demo: the local single-node cluster (no Docker here; needs root). Cold, it first builds Kubernetes, gVisor, kube-router, CoreDNS and the images from Go modules: 20 min on 2 cores in docs/performance.md, 45 min reported on a fresh machine. Later runs: under a minute"
fi

if [[ -n ${KUBECTL:-} ]]; then
  step "kubectl: $KUBECTL"
else
  substeps_to kubectl_dir 1 "$ROOT/hack/k8s-binaries.sh" build kubectl
  KUBECTL=$kubectl_dir/kubectl
fi
export KUBECTL

case $mode in
  own) ;;
  kind)
    step "kind and the images without Docker (make kind images: the manager, agent and pause binaries, dist/*.tar; a few minutes cold)"
    run_logged "$(progress_log demo-kind-images)" make -C "$ROOT" --no-print-directory kind images
    step_done "kind and the images ready"
    substeps "$cluster_steps" env KIND="$ROOT/bin/kind" "$ROOT/hack/kind.sh" up
    step "loading the images into the kind node (hack/kind.sh load)"
    KIND="$ROOT/bin/kind" "$ROOT/hack/kind.sh" load
    export KUBECONFIG=$("$ROOT/hack/kind.sh" kubeconfig)
    ;;
  local)
    substeps "$cluster_steps" "$ROOT/hack/local-cluster.sh" up
    export KUBECONFIG=$("$ROOT/hack/local-cluster.sh" kubeconfig)
    ;;
esac

step "deploying warmpool (make deploy), then restarting its two Deployments on the images just loaded (waits up to 180 s each)"
run_logged "$(progress_log demo-deploy)" make -C "$ROOT" --no-print-directory deploy
# Same image tag, maybe a new build: make the controllers and the data plane run the image just loaded.
k -n warmpool-system rollout restart deployment/warmpool-controller-manager deployment/warmpool-data-plane >/dev/null
k -n warmpool-system rollout status deployment/warmpool-controller-manager --timeout=180s >/dev/null
k -n warmpool-system rollout status deployment/warmpool-data-plane --timeout=180s >/dev/null
step_done "warmpool deployed"

step "sample pool 'python' in namespace $NS: 3 warm gVisor sandboxes (waits up to 180 s)"
k create namespace "$NS" --dry-run=client -o yaml | k apply -f - >/dev/null
k -n "$NS" apply -f "$ROOT/config/samples/sandbox_v1alpha1_sandboxpool.yaml"
k -n "$NS" wait --for=jsonpath='{.status.idleReplicas}'=3 sandboxpool/python --timeout=180s >/dev/null

step "running the sample Execution 'hello' (waits up to 120 s)"
# An Execution runs once: start from a fresh one on every demo.
k -n "$NS" delete execution hello --ignore-not-found >/dev/null
k -n "$NS" apply -f "$ROOT/config/samples/sandbox_v1alpha1_execution.yaml"
k -n "$NS" wait --for=jsonpath='{.status.phase}'=Succeeded execution/hello --timeout=120s >/dev/null
k -n "$NS" get execution hello
printf '\n--- stdout ---\n%s\n--- result ---\n%s\n' \
  "$(k -n "$NS" get execution hello -o jsonpath='{.status.stdout}')" \
  "$(k -n "$NS" get execution hello -o jsonpath='{.status.result}')"

step "a chart back from the data-science pool 'python-data' (pandas and matplotlib preloaded) through a Session: kubectl warmpool run --save-results (waits up to 240 s)"
k -n "$NS" apply -f "$ROOT/config/samples/sandbox_v1alpha1_sandboxpool_data.yaml" >/dev/null
(cd "$ROOT" && go build -o bin/kubectl-warmpool ./cmd/kubectl-warmpool)
k -n "$NS" wait --for=jsonpath='{.status.idleReplicas}'=2 sandboxpool/python-data --timeout=240s >/dev/null
"$ROOT/bin/kubectl-warmpool" -n "$NS" run --pool python-data --save-results "$ROOT/demo-results" -c '
import pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"day": range(1, 8), "runs": [3, 5, 4, 8, 13, 21, 34]})
print(df.describe().loc[["mean", "max"]])
df.plot(x="day", y="runs", title="runs per day")'
step_done "the chart is $ROOT/demo-results/result-1.png (and the table's repr above)"

progress_end
log "done in $((SECONDS - t0)) s. Try: kubectl -n $NS get sandboxpools,executions (KUBECONFIG=$KUBECONFIG)"
