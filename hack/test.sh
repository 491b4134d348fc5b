#!/usr/bin/env bash
# make test, in numbered steps (hack/lib/progress.sh): code generation, go vet, the
# Python client's packages, etcd and kube-apiserver for envtest (built from Go modules
# on the first run: about 14 minutes on 2 cores), then the tests, whose output is
# shown as it comes. Go's output of the steps before goes to ~/.cache/warmpool/logs.
#
#   GO=go K8S_VERSION=v1.34.10 ETCD_VERSION=v3.5.35 hack/test.sh   # what `make test` runs
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=hack/lib/progress.sh
source "$ROOT/hack/lib/progress.sh"
GO=${GO:-go}
export K8S_VERSION=${K8S_VERSION:-v1.34.10} ETCD_VERSION=${ETCD_VERSION:-v3.5.35}
cd "$ROOT"

progress_plan 8 "make test: unit and envtest integration tests, with the Python and TypeScript clients' suites. The first run builds etcd, kube-apiserver and SeaweedFS from Go modules (about 21 min on 2 cores); later runs take about 4 min"

step "generating CRDs, RBAC and DeepCopy code (make manifests generate; the first run also builds controller-gen and kustomize from Go modules: a few minutes)"
run_logged "$(progress_log test-generate)" make --no-print-directory manifests generate
step_done "code generated"

step "go vet ./..., the e2e suite included (make vet; with a cold Go cache it downloads and compiles the project's modules: a few minutes)"
run_logged "$(progress_log test-vet)" make --no-print-directory vet
step_done "vet passed"

# As before: the tests run without it (the Python suite then fails and says what to install).
python=
substeps_to python 1 hack/python-deps.sh || true
nodedir=
substeps_to nodedir 1 hack/node.sh || true
# ripgrep where the agents of envtest run: the BashKit suite checks the sandbox's rgPath.
if ! command -v rg >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ripgrep >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ripgrep >/dev/null; } || true
fi
substeps_to assets 2 hack/k8s-binaries.sh envtest
# The S3-compatible store the snapshots of suspended Sessions are kept in (SeaweedFS, built once).
seaweedfs=
substeps_to seaweedfs 1 hack/seaweedfs.sh || true

step "go test ./...: unit, envtest integration and the Python and TypeScript clients' suites (about 5 min once the builds above are cached)"
# The python3 with the test packages first on PATH: the agents of envtest, the
# interpreter tests and the TypeScript client's native backend run `python3`, and
# their rich-result tests draw with its matplotlib (a pyenv shim would hide Debian's).
pypath=$PATH
[[ -n $python ]] && pypath="$(dirname "$python"):$PATH"
# The cache mutation detector (client-go) panics when code writes to an object the
# informers hold: the pool reconciler lists its pods without copying them.
KUBE_CACHE_MUTATION_DETECTOR=true PATH="$pypath" WARMPOOL_PYTHON="$python" WARMPOOL_NODE_DIR="$nodedir" WARMPOOL_SEAWEEDFS="$seaweedfs" KUBEBUILDER_ASSETS="$assets" "$GO" test ./... -coverprofile cover.out
progress_end
