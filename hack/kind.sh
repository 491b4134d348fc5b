#!/usr/bin/env bash
# A kind cluster with gVisor and NetworkPolicy, the second cluster the e2e
# suite runs on (the first is hack/local-cluster.sh): one node, or with
# KIND_WORKERS=N a control-plane node and N gVisor workers (the suite's
# multi-node specs, make test-e2e-nodes).
#
#   hack/kind.sh up          # Docker engine if none answers, node image, cluster "warmpool"
#   hack/kind.sh load        # load dist/*.tar (make images) into the node
#   hack/kind.sh down        # delete the cluster; stop the engine if `up` started it
#   hack/kind.sh e2e         # up, load, the e2e suite, down (make test-e2e-kind)
#   hack/kind.sh restart-apiserver  # a fault for the e2e chaos spec
#   hack/kind.sh stop-node NODE     # a fault for the multi-node specs: NODE's container frozen
#   hack/kind.sh start-node NODE    # ...and thawed
#   hack/kind.sh kubeconfig  # print the kubeconfig path
#   hack/kind.sh node        # print the node container's name (for docker exec)
#   hack/kind.sh steps       # how many numbered steps `up` prints (make demo counts them)
#
# `up` numbers its steps (hack/lib/progress.sh): kubectl (built from Go modules
# unless KUBECTL names one), the engine, the node image's steps (hack/kind-node.sh),
# gVisor, the cluster. Go's output goes to ~/.cache/warmpool/logs.
#
# Two worlds:
# - By default the node image is built here from Debian packages and Go modules
#   (hack/kind-node.sh), with the same runsc and shim as the local cluster
#   (hack/gvisor.sh: containerd 1.6, as in the node), kube-router as the
#   NetworkPolicy enforcer and CoreDNS answering cluster.local only. No
#   registry is needed; this is what CI runs.
# - KIND_NODE_IMAGE=kindest/node:v1.34.0 (say) uses a stock node: containerd 2
#   and kindnetd, which enforces NetworkPolicy. Its runsc and shim are gVisor
#   release $GVISOR_RELEASE, downloaded once and checked against the release's
#   SHA-512 files (or GVISOR_DIR=/dir/with/both). This needs a registry and
#   the internet, which our machines lack: it is written from kind's and
#   gVisor's documentation and not run here.
#
# Host quirks are detected, and worked around only where found:
# - root without CAP_SYS_RESOURCE (these VMs): kind's privileged node container
#   cannot start under plain runc, so a dockerd started here runs containers
#   through hack/kind/runc-without-sys-resource, and the node's containerd
#   restricts oom_score_adj as the local cluster's does.
# - cgroup v1: kind bind-mounts the kubelet's cgroups onto themselves, which
#   runsc mistook for hierarchies; hack/gvisor.sh's runsc carries the fix, so
#   gVisor pods keep their cgroup limits.
#
# A Docker engine started here listens on the default socket, keeps its data
# under the cache (the node image survives `down`), and touches neither
# iptables, ip_forward nor a docker0 bridge; `down` stops it by PID and
# checks that links, iptables rules and ip_forward are as `up` found them.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=hack/lib/progress.sh
source "$ROOT/hack/lib/progress.sh"
# shellcheck source=hack/lib/cni.sh
source "$ROOT/hack/lib/cni.sh"
CACHE_ROOT=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}
STATE=${KIND_STATE_DIR:-$CACHE_ROOT/kind/state}
KIND=${KIND:-$ROOT/bin/kind}
# Unset: `up` builds kubectl from Go modules (hack/k8s-binaries.sh), as the Makefile does.
KUBECTL=${KUBECTL:-}
CLUSTER=${KIND_CLUSTER:-warmpool}
NODE=$CLUSTER-control-plane
# Workers besides the control-plane node (which then keeps its NoSchedule
# taint, so pools' pods go to the workers).
WORKERS=${KIND_WORKERS:-0}
# How long a silent kubelet's node stays Ready on a multi-node cluster: the
# node-loss spec waits for it (kube-controller-manager's default is 50 s).
NODE_MONITOR_GRACE=${KIND_NODE_MONITOR_GRACE:-20s}
POD_SUBNET=10.244.0.0/16
# The gVisor release a stock node runs (KIND_NODE_IMAGE): one built for containerd 2.
GVISOR_RELEASE=${GVISOR_RELEASE:-20250715.0}
DOCKER_SOCK=/var/run/docker.sock

log() { printf '[kind] %s\n' "$*" >&2; }
die() { printf '[kind] ERROR: %s\n' "$*" >&2; exit 1; }

kubectl_() { "$KUBECTL" --kubeconfig "$STATE/kubeconfig" "$@"; }

wait_for() { # wait_for DESCRIPTION SECONDS CMD...
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$what not ready after ${secs}s"
    sleep 1
  done
}

# CAP_SYS_RESOURCE is capability 24.
lacks_sys_resource() {
  local bnd; bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  (((16#$bnd >> 24 & 1) == 0))
}

# host_snapshot: what a Docker engine changes on a host, for `down` to compare.
host_snapshot() {
  ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
  echo "ip_forward=$(cat /proc/sys/net/ipv4/ip_forward)"
  local t
  for t in filter nat mangle raw; do
    iptables -t "$t" -S 2>/dev/null | sed "s/^/iptables $t: /"
  done
}

engine_up() {
  if docker info >/dev/null 2>&1; then
    step "Docker engine: the running one"
    if lacks_sys_resource && [[ $(docker info -f '{{.DefaultRuntime}}') != warmpool-runc ]]; then
      die "root lacks CAP_SYS_RESOURCE here, so kind's privileged node cannot start under this engine's runc; stop it (this script then starts one of its own), or start dockerd with --add-runtime warmpool-runc=$ROOT/hack/kind/runc-without-sys-resource --default-runtime warmpool-runc"
    fi
    return
  fi
  command -v dockerd >/dev/null || die "no Docker engine answers and dockerd is not installed (apt-get install docker.io)"
  step "starting Debian's dockerd (data in $CACHE_ROOT/docker, log $STATE/dockerd.log; waits up to 60 s)"
  mkdir -p "$STATE"
  host_snapshot >"$STATE/host.before"
  [[ -e $DOCKER_SOCK ]] && die "$DOCKER_SOCK exists but no engine answers on it; remove it or start your engine"
  local args=(--data-root "$CACHE_ROOT/docker" --exec-root "$STATE/docker-run" --pidfile "$STATE/dockerd.pid"
    -H "unix://$DOCKER_SOCK" --iptables=false --ip-forward=false --ip-masq=false --bridge=none)
  if lacks_sys_resource; then
    command -v jq >/dev/null || die "jq is needed for the runc wrapper on this host (apt-get install jq)"
    log "root lacks CAP_SYS_RESOURCE here: containers run through hack/kind/runc-without-sys-resource"
    args+=(--add-runtime "warmpool-runc=$ROOT/hack/kind/runc-without-sys-resource" --default-runtime warmpool-runc)
  fi
  setsid dockerd "${args[@]}" >"$STATE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$STATE/dockerd.started"
  wait_for "dockerd" 60 docker info
}

engine_down() {
  [[ -f $STATE/dockerd.started ]] || return 0
  local pid; pid=$(cat "$STATE/dockerd.started")
  docker network rm kind >/dev/null 2>&1 || true
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping the dockerd this script started (pid $pid)"
    kill "$pid"
    local i
    for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { log "dockerd still running after 30 s: SIGKILL"; kill -9 "$pid"; }
  fi
  rm -f "$STATE/dockerd.started" "$DOCKER_SOCK"
  if [[ -f $STATE/host.before ]]; then
    if ! diff <(cat "$STATE/host.before") <(host_snapshot) >"$STATE/host.diff"; then
      cat "$STATE/host.diff" >&2
      die "the host differs from before 'up' (above: < before, > now)"
    fi
    rm -f "$STATE/host.before" "$STATE/host.diff"
    log "host as found: links, iptables rules and ip_forward unchanged"
  fi
}

kind_config() { # kind_config IMAGE GVISOR_DIR LOCAL_NODE
  local image=$1 gv=$2 local_node=$3
  cat >"$STATE/runsc.toml" <<EOF
[runsc_config]
  platform = "systrap"
EOF
  cat <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  podSubnet: $POD_SUBNET
  serviceSubnet: 10.96.0.0/16
EOF
  $local_node && echo "  disableDefaultCNI: true"
  cat <<EOF
nodes:
EOF
  local i name role
  for ((i = 0; i <= WORKERS; i++)); do
    role=worker name=$CLUSTER-worker$i
    ((i == 1)) && name=$CLUSTER-worker
    ((i == 0)) && role=control-plane name=$NODE
    cat <<EOF
- role: $role
  image: $image
  extraMounts:
  - {hostPath: $gv/runsc, containerPath: /usr/local/bin/runsc, readOnly: true}
  - {hostPath: $gv/containerd-shim-runsc-v1, containerPath: /usr/local/bin/containerd-shim-runsc-v1, readOnly: true}
  - {hostPath: $STATE/runsc.toml, containerPath: /etc/containerd/runsc.toml, readOnly: true}
EOF
    # Many nodes: each node's Pod network is its own podCIDR, written by
    # node_networks once the cluster has assigned them; until then this empty
    # directory hides the image's one-node configuration.
    if $local_node && ((WORKERS > 0)); then
      mkdir -p "$STATE/cni/$name" && rm -f "$STATE/cni/$name"/*
      echo "  - {hostPath: $STATE/cni/$name, containerPath: /etc/cni/net.d}"
    fi
  done
  cat <<EOF
# The cgroupfs driver, as on the local cluster: runsc then gets plain cgroup
# paths it creates and limits itself.
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  cgroupDriver: cgroupfs
EOF
  if $local_node; then
    cat <<EOF
- |
  kind: ClusterConfiguration
  dns:
    imageTag: $(image_label "$image" coredns-version)
EOF
  fi
  # The runtime is registered under both section names: containerd 1.x
  # (grpc.v1.cri) and containerd 2 (cri.v1.runtime) read different ones.
  local sec
  echo "containerdConfigPatches:"
  for sec in '"io.containerd.grpc.v1.cri"' '"io.containerd.cri.v1.runtime"'; do
    cat <<EOF
- |-
  [plugins.$sec.containerd.runtimes.runc.options]
    SystemdCgroup = false
  [plugins.$sec.containerd.runtimes.runsc]
    runtime_type = "io.containerd.runsc.v1"
    pod_annotations = ["dev.gvisor.spec.mount.*"]
  [plugins.$sec.containerd.runtimes.runsc.options]
    TypeUrl = "io.containerd.runsc.v1.options"
    ConfigPath = "/etc/containerd/runsc.toml"
EOF
  done
  if lacks_sys_resource; then
    cat <<EOF
- |-
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
EOF
  fi
}

# gvisor_release: runsc and its shim from gVisor's release bucket, for a stock
# node's containerd 2 (the build of hack/gvisor.sh is for containerd 1.6).
gvisor_release() {
  local dir=$CACHE_ROOT/gvisor-release/$GVISOR_RELEASE f
  local url=https://storage.googleapis.com/gvisor/releases/release/$GVISOR_RELEASE/$(uname -m)
  if [[ ! -x $dir/runsc || ! -x $dir/containerd-shim-runsc-v1 ]]; then
    mkdir -p "$dir"
    for f in runsc containerd-shim-runsc-v1; do
      log "downloading $url/$f"
      curl -fsSL -o "$dir/$f" "$url/$f" && curl -fsSL -o "$dir/$f.sha512" "$url/$f.sha512" \
        || die "cannot download gVisor $GVISOR_RELEASE (no internet? set GVISOR_DIR)"
    done
    (cd "$dir" && sha512sum -c runsc.sha512 containerd-shim-runsc-v1.sha512 >&2) || die "gVisor $GVISOR_RELEASE: checksum mismatch"
    chmod 0755 "$dir/runsc" "$dir/containerd-shim-runsc-v1"
  fi
  echo "$dir"
}

image_label() { docker image inspect -f "{{index .Config.Labels \"dev.warmpool.$2\"}}" "$1"; }

# local_addons: what the stock node's kindnetd and CoreDNS provide, for the
# node built here. CoreDNS gets the local cluster's Corefile (cluster.local
# and reverse lookups from the API, every other name refused: the binary has
# no plugin that could forward); kube-router enforces NetworkPolicy; pods'
# packets routed off the node are dropped, as on the local cluster (the
# mangle table, because kube-router ACCEPTs in filter FORWARD first).
local_addons() {
  local image=$1 corefile
  corefile=$(cat <<'EOF'
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
    }
}
EOF
)
  kubectl_ -n kube-system create configmap coredns --dry-run=client -o yaml --from-literal=Corefile="$corefile" \
    | kubectl_ apply -f - >/dev/null
  kubectl_ -n kube-system rollout restart deployment coredns >/dev/null
  sed "s|KUBE_ROUTER_IMAGE|$(image_label "$image" kube-router-image)|" "$ROOT/hack/kind/kube-router.yaml" \
    | kubectl_ apply -f - >/dev/null
  local n
  for n in $(nodes); do
    docker exec "$n" sh -c 'iptables -t mangle -C FORWARD -i warmpool0 ! -o warmpool0 -j DROP 2>/dev/null \
      || iptables -t mangle -I FORWARD -i warmpool0 ! -o warmpool0 -j DROP'
    if ((WORKERS > 0)); then
      # Many nodes: pods reach the other nodes' pods, and kube-apiserver (the
      # kubernetes Service, DNATed to the control-plane node) from any node;
      # nothing else off their node.
      docker exec "$n" sh -c "iptables -t mangle -I FORWARD -i warmpool0 -d $POD_SUBNET -j RETURN &&
        iptables -t mangle -I FORWARD -i warmpool0 -d $(node_ip "$NODE") -p tcp --dport 6443 -j RETURN"
    fi
    wait_for "kube-router's first NetworkPolicy sync on $n" 120 docker exec "$n" sh -c \
      "curl -sf http://127.0.0.1:20245/metrics | grep -Eq '^kube_router_controller_iptables_sync_time_count [1-9]'"
  done
  kubectl_ -n kube-system rollout status deployment coredns --timeout 120s >/dev/null
}

nodes() { "$KIND" get nodes --name "$CLUSTER"; }
has_pod_cidr() { [[ -n $(kubectl_ get node "$1" -o jsonpath='{.spec.podCIDR}') ]]; }
node_ip() { docker inspect -f '{{.NetworkSettings.Networks.kind.IPAddress}}' "$1"; }

# node_networks: many nodes' Pod network, as kindnetd would make it: each
# node's bridge serves the podCIDR the cluster assigned it, and each node
# routes the other nodes' podCIDRs to them over kind's Docker network. The
# nodes become Ready once their CNI configuration is there.
node_networks() {
  local n m
  declare -A cidrs ips
  for n in $(nodes); do
    wait_for "a podCIDR for $n" 60 has_pod_cidr "$n"
    cidrs[$n]=$(kubectl_ get node "$n" -o jsonpath='{.spec.podCIDR}')
    ips[$n]=$(node_ip "$n")
    [[ ${cidrs[$n]} == *.0/24 ]] || die "node $n has podCIDR ${cidrs[$n]}, not the /24 this script expects"
  done
  for n in "${!cidrs[@]}"; do
    docker exec "$n" sysctl -qw net.ipv4.ip_forward=1
    for m in "${!cidrs[@]}"; do
      [[ $m == "$n" ]] || docker exec "$n" ip route replace "${cidrs[$m]}" via "${ips[$m]}"
    done
    kind_node_conflist "${cidrs[$n]}" "${cidrs[$n]%.0/24}.1" >"$STATE/cni/$n/10-warmpool.conflist.tmp"
    mv "$STATE/cni/$n/10-warmpool.conflist.tmp" "$STATE/cni/$n/10-warmpool.conflist"
    log "node $n: pods in ${cidrs[$n]}, reached at ${ips[$n]}"
  done
  # A kubelet that stops posting its status is marked silent after this long.
  # Rewritten in place, not with sed -i, whose temporary file in the
  # manifests' directory the kubelet would read as one more static pod.
  local m=/etc/kubernetes/manifests/kube-controller-manager.yaml
  docker exec "$NODE" sh -c "sed '/- --node-monitor-grace-period=/d; s|^\\( *\\)- kube-controller-manager\$|&\\n\\1- --node-monitor-grace-period=$NODE_MONITOR_GRACE|' $m >/tmp/kcm.yaml && cat /tmp/kcm.yaml >$m"
  kubectl_ wait --for=condition=Ready node --all --timeout=120s >/dev/null
}

# up's steps: kubectl, the engine, the node image's (hack/kind-node.sh), gVisor, the cluster.
node_steps() { "$ROOT/hack/kind-node.sh" steps; }
up_steps() { echo $((4 + $(node_steps))); }

up() {
  [[ -x $KIND ]] || die "no kind at $KIND: run 'make kind' (or set KIND)"
  local node_steps
  node_steps=$(node_steps)
  progress_plan "$(up_steps)" "hack/kind.sh up: kind cluster $CLUSTER with gVisor. Cold, the node image and gVisor are built first (docs/kind.md: about 12 min on 2 cores, and 2 min for the cluster's first start)"
  if [[ -z $KUBECTL ]]; then
    local kubectl_dir
    substeps_to kubectl_dir 1 "$ROOT/hack/k8s-binaries.sh" build kubectl
    KUBECTL=$kubectl_dir/kubectl
  else
    step "kubectl: $KUBECTL"
  fi
  engine_up
  mkdir -p "$STATE"
  if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    step_skip $((node_steps + 2)) "cluster $CLUSTER exists: no node image, gVisor or cluster to make"
  else
    local image local_node=false gv
    if [[ -n ${KIND_NODE_IMAGE:-} ]]; then
      image=$KIND_NODE_IMAGE
      step_skip "$node_steps" "node image $image (KIND_NODE_IMAGE): nothing to build"
      if [[ -n ${GVISOR_DIR:-} ]]; then
        step "gVisor: runsc and its shim from GVISOR_DIR=$GVISOR_DIR"
        gv=$GVISOR_DIR
      else
        step "gVisor release $GVISOR_RELEASE for a stock node: runsc and its shim, downloaded once, SHA-512 checked"
        gv=$(gvisor_release)
      fi
    else
      substeps_to image "$node_steps" "$ROOT/hack/kind-node.sh"
      local_node=true
      if [[ -n ${GVISOR_DIR:-} ]]; then
        step "gVisor: runsc and its shim from GVISOR_DIR=$GVISOR_DIR"
        gv=$GVISOR_DIR
      else
        substeps_to gv 1 "$ROOT/hack/gvisor.sh"
      fi
    fi
    kind_config "$image" "$gv" "$local_node" >"$STATE/kind.yaml"
    # docs/kind.md: 119 s the first time, 59 s warm, up to kube-router's first sync.
    step "creating cluster $CLUSTER ($image, runsc from $gv) and its add-ons (about 1-2 min)"
    # Many nodes are not Ready before node_networks, so kind cannot wait for them.
    local wait=(--wait 120s)
    ((WORKERS > 0)) && $local_node && wait=()
    "$KIND" create cluster --name "$CLUSTER" --config "$STATE/kind.yaml" --kubeconfig "$STATE/kubeconfig" "${wait[@]}"
    if ((WORKERS > 0)) && $local_node; then node_networks; fi
    # Pods applied right after create can fail with 'serviceaccount "default" not found'.
    wait_for "the default ServiceAccount" 60 kubectl_ get serviceaccount default
    if $local_node; then local_addons "$image"; fi
    step_done "cluster $CLUSTER up"
  fi
  "$KIND" get kubeconfig --name "$CLUSTER" >"$STATE/kubeconfig"
  kubectl_ apply --server-side -f "$ROOT/config/runtimeclass/runtimeclass.yaml" >/dev/null
  progress_end
  log "ready: export KUBECONFIG=$STATE/kubeconfig; then 'make kind-load deploy'"
}

# KIND_IMAGES: the images `load` loads (dist/NAME.tar); the previous
# release's are loaded too when all are.
load() {
  local t all=false
  [[ -z ${KIND_IMAGES:-} ]] && all=true
  for t in ${KIND_IMAGES:-repl repl-data manager seaweedfs}; do
    t=$ROOT/dist/$t.tar
    [[ -f $t ]] || die "$t missing: run 'make images' (repl-data: without DATA_IMAGE=; seaweedfs: without SEAWEEDFS_IMAGE=)"
    log "loading ${t#"$ROOT"/}"
    "$KIND" load image-archive --name "$CLUSTER" "$t"
  done
  $all || return 0
  # The previous release's images, for the upgrade specs (PREVIOUS_IMAGES= skips them).
  for t in "$ROOT"/dist/previous-manager.tar "$ROOT"/dist/previous-repl.tar; do
    [[ -f $t ]] || continue
    log "loading ${t#"$ROOT"/}"
    "$KIND" load image-archive --name "$CLUSTER" "$t"
  done
}

down() {
  if docker info >/dev/null 2>&1 && [[ -x $KIND ]]; then
    "$KIND" delete cluster --name "$CLUSTER" --kubeconfig "$STATE/kubeconfig"
  fi
  engine_down
  rm -f "$STATE/kubeconfig" "$STATE/kubeconfig.node" "$STATE/kind.yaml" "$STATE/runsc.toml"
  rm -rf "$STATE/cni"
}

# stop_node, start_node: a node that stops answering, for the multi-node
# specs. Its container is frozen (kubelet, containerd and pods alike): it
# neither answers nor posts its status, as a node whose power or network
# is cut; thawed, it carries on where it stopped.
stop_node() { docker pause "${1:?usage: stop-node NODE}" >/dev/null && log "node $1 frozen"; }
start_node() {
  [[ $(docker inspect -f '{{.State.Paused}}' "${1:?usage: start-node NODE}") == true ]] || return 0
  docker unpause "$1" >/dev/null && log "node $1 thawed"
}

# restart_apiserver: a fault for the e2e chaos spec. kube-apiserver is a static
# pod: its process is killed, as a crash would end it, and the kubelet starts
# the container again; this returns once the new one serves.
restart_apiserver() {
  local old pid
  old=$(docker exec "$NODE" pgrep -x kube-apiserver) || die "no kube-apiserver process on $NODE"
  docker exec "$NODE" kill -KILL "$old"
  local deadline=$((SECONDS + 120))
  while :; do
    pid=$(docker exec "$NODE" pgrep -x kube-apiserver 2>/dev/null || true)
    if [[ -n $pid && $pid != "$old" ]] && docker exec "$NODE" curl -skf https://127.0.0.1:6443/readyz >/dev/null 2>&1; then
      break
    fi
    ((SECONDS < deadline)) || die "kube-apiserver not serving again 120 s after it was killed"
    sleep 0.5
  done
  log "kube-apiserver killed (pid $old) and serving again (pid $pid)"
}

# e2e: the e2e suite (test/e2e, the one the local cluster runs) on a fresh kind
# cluster, which is deleted afterwards (KIND_KEEP=1 keeps it).
#
# The suite attacks pod and node addresses directly (a sandbox's agent port,
# the kubelet, a listener of its own on the node's address, the metadata
# address on loopback) and scrapes the manager's pod with Prometheus: on the
# local cluster it runs on the node itself. Here it runs in the kind node's
# network namespace (nsenter), with the host's files and tools: the same view
# of the cluster, with the API server on the node's loopback.
e2e() {
  [[ $(id -u) == 0 ]] || die "e2e needs root (nsenter into the node's network namespace)"
  if [[ -z ${KIND_KEEP:-} ]]; then trap 'down' EXIT; fi
  up
  load
  sed 's|server: https://.*|server: https://127.0.0.1:6443|' "$STATE/kubeconfig" >"$STATE/kubeconfig.node"
  # Built here, where the Go module proxy is reachable; the node's network reaches
  # nothing outside the node, so the suite's own go builds must find everything cached.
  (cd "$ROOT" && go test -c -tags e2e -o "$STATE/e2e.test" ./test/e2e/ && go build -o /dev/null ./cmd/kubectl-warmpool ./hack/monitoring)
  # The TypeScript client packed and installed into a project of its own, as
  # internal/testing/nodejs does, here where the npm registry is reachable.
  local ts="$STATE/tsclient" nodedir
  nodedir=$("$ROOT/hack/node.sh")
  rm -rf "$ts" && mkdir -p "$ts"
  (export PATH="$nodedir:$PATH" npm_config_update_notifier=false
    cd "$ROOT/clients/typescript" && npm ci --prefer-offline --no-audit --no-fund >/dev/null &&
      npm pack --silent --pack-destination "$ts" >/dev/null &&
      cd "$ts" && printf '{"name": "tssdk-user", "private": true, "type": "module"}\n' >package.json &&
      npm install --prefer-offline --no-audit --no-fund ./warmpool-*.tgz >/dev/null && cp -r "$ROOT/clients/typescript/test" "$ts/test")
  local pid
  pid=$(docker inspect -f '{{.State.Pid}}' "$NODE")
  log "running the e2e suite in $NODE's network namespace"
  (cd "$ROOT/test/e2e" && nsenter --net="/proc/$pid/ns/net" env KUBECONFIG="$STATE/kubeconfig.node" \
    E2E_APISERVER_RESTART="$ROOT/hack/kind.sh restart-apiserver" GOPROXY=off GOFLAGS=-mod=readonly \
    E2E_WORKERS="$WORKERS" E2E_NODE_STOP="$ROOT/hack/kind.sh stop-node" E2E_NODE_START="$ROOT/hack/kind.sh start-node" \
    WARMPOOL_TS_PROJECT="$ts" WARMPOOL_NODE_DIR="$nodedir" \
    "$STATE/e2e.test" -test.v -test.timeout "${E2E_TIMEOUT:-40m}" -ginkgo.v ${E2E_ARGS:-})
}

case ${1:-} in
  up) up ;;
  load) load ;;
  down) down ;;
  e2e) e2e ;;
  restart-apiserver) restart_apiserver ;;
  stop-node) stop_node "${2:-}" ;;
  start-node) start_node "${2:-}" ;;
  kubeconfig) echo "$STATE/kubeconfig" ;;
  node) echo "$NODE" ;;
  steps) up_steps ;;
  *) die "usage: $0 up|load|down|e2e|restart-apiserver|stop-node|start-node|kubeconfig|node|steps" ;;
esac
