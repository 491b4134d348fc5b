#!/usr/bin/env bash
# A real single-node Kubernetes (v1.34.10) with gVisor on a Linux machine that
# has no Docker and no systemd: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kube-proxy built from Go modules
# (hack/k8s-binaries.sh), containerd/runc/CNI plugins from Debian, gVisor's runsc
# and shim built from Go modules (hack/gvisor.sh), kube-router's NetworkPolicy
# controller (hack/kube-router.sh) and CoreDNS (hack/coredns.sh) built from Go
# modules and run as host processes, and the project's images built without
# Docker (make images) and imported into containerd.
#
#   hack/local-cluster.sh up        # idempotent: starts what is not running
#   hack/local-cluster.sh down      # stops what `up` started (by PID), undoes host changes
#   hack/local-cluster.sh status
#   hack/local-cluster.sh kubeconfig  # prints the kubeconfig path
#   hack/local-cluster.sh load      # re-imports dist/*.tar (after `make images`)
#   hack/local-cluster.sh restart-apiserver  # a fault for the e2e chaos spec
#   hack/local-cluster.sh steps     # how many numbered steps `up` prints (make demo counts them)
#
# `up` numbers its steps (hack/lib/progress.sh): host packages, each binary it
# builds from Go modules (cached after the first run), the images, the start.
# Go's output goes to ~/.cache/warmpool/logs, `make images`' to $LOCAL_CLUSTER_DIR/logs.
#
# Needs root. Every daemon's state, logs and PID file live in $LOCAL_CLUSTER_DIR
# (default ~/.cache/warmpool/local-cluster); the kubeconfig is
# $LOCAL_CLUSTER_DIR/kubeconfig. Pods get addresses from 10.244.0.0/24 on the
# bridge warmpool0 and a default route via the bridge address, as on a real
# cluster: what keeps a pod from this host's addresses is NetworkPolicy
# (enforced by kube-router), not a missing route. Nothing a pod sends leaves
# the machine: anything routed from the bridge to another interface is dropped.
# The control plane listens on loopback, but for the API server and the cluster
# DNS (CoreDNS, for cluster.local only; every other name is refused), which
# listen on the bridge address only: for this host and for pods, and the
# kubelet, which listens on every address as on a kubeadm node (client
# certificates of this cluster's CA only), so that the isolation tests attack
# the port a real node exposes.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=hack/lib/progress.sh
source "$ROOT/hack/lib/progress.sh"
CACHE_ROOT=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}
STATE=${LOCAL_CLUSTER_DIR:-$CACHE_ROOT/local-cluster}
K8S_VERSION=${K8S_VERSION:-v1.34.10}
ETCD_VERSION=${ETCD_VERSION:-v3.5.35}
export K8S_VERSION ETCD_VERSION

APISERVER_PORT=${APISERVER_PORT:-6443}
ETCD_PORT=${ETCD_PORT:-12379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-12380}
POD_CIDR=10.244.0.0/24
GATEWAY=10.244.0.1
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
BRIDGE=warmpool0
NODE=localhost
COMPONENTS=(etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet kube-proxy kube-router coredns)
# What `up` builds with hack/k8s-binaries.sh, one numbered step each.
K8S_BINS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
# up's steps: host packages, K8S_BINS, gVisor, kube-router, CoreDNS, the images, the start.
UP_STEPS=$((1 + ${#K8S_BINS[@]} + 5))
COREDNS_READY_PORT=${COREDNS_READY_PORT:-18181}
KUBE_ROUTER_METRICS_PORT=${KUBE_ROUTER_METRICS_PORT:-20245}

# Host paths that containerd, the CNI plugins and the kubelet create outside
# our state dir. `up` records which of them already existed; `down` removes the
# others, so the host is left as it was found.
HOST_PATHS=(/run/containerd /var/run/netns /var/lib/cni /var/log/pods /var/log/containers /run/runsc /var/run/runsc)
# The kubelet's root is where every node has it: gVisor's containerd shim
# finds a pod's volumes below /var/lib/kubelet/pods and nowhere else. It may
# exist already (a mount point on some machines): `up` records what is in it,
# `down` removes the rest.
KUBELET_DIR=/var/lib/kubelet
CGROUP_ROOT=/sys/fs/cgroup

log() { printf '[local-cluster] %s\n' "$*" >&2; }
die() { printf '[local-cluster] ERROR: %s\n' "$*" >&2; exit 1; }

pidfile() { echo "$STATE/run/$1.pid"; }
running() { local f; f=$(pidfile "$1"); [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null; }

kubectl() { "$K8S_DIR/kubectl" --kubeconfig "$STATE/kubeconfig" "$@"; }

since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f s", b - a}'; }

wait_for() { # wait_for DESCRIPTION SECONDS CMD...
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      die "$what not ready after ${secs}s; logs in $STATE/logs"
    fi
    sleep 0.5
  done
}

# start NAME CMD... runs a daemon in its own session, logs to logs/NAME.log and
# records its PID, unless it is already running.
start() {
  local name=$1; shift
  if running "$name"; then log "$name already running (pid $(cat "$(pidfile "$name")"))"; return; fi
  log "starting $name"
  setsid "$@" >>"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$(pidfile "$name")"
}

# write FILE writes stdin to FILE only when the content differs: kube-proxy exits
# when its configuration file is rewritten, even with the same content.
write() {
  local tmp; tmp=$(mktemp "$1.XXXX")
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

stop() {
  local name=$1 f pid
  f=$(pidfile "$name")
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

preflight() {
  [[ $(id -u) == 0 ]] || die "run as root: containerd, the kubelet and the CNI plugins need it"
  [[ $(uname -s) == Linux ]] || die "Linux only"
}

host_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v ipset >/dev/null || missing+=(ipset)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  if ((${#missing[@]})); then
    command -v apt-get >/dev/null || { step "host packages: missing ${missing[*]}"; die "missing packages: ${missing[*]}"; }
    step "installing ${missing[*]} from Debian with apt-get (a few minutes)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } \
      || die "apt-get install ${missing[*]} failed"
  else
    step "host packages (containerd, runc, CNI plugins, iptables, ipset, conntrack, ...): present"
  fi
  modprobe overlay 2>/dev/null || true
  modprobe br_netfilter 2>/dev/null || true
}

# binaries: one numbered step per binary, each cached after its first build.
binaries() {
  substeps_to K8S_DIR ${#K8S_BINS[@]} "$ROOT/hack/k8s-binaries.sh" build "${K8S_BINS[@]}"
  ETCD_BIN=$CACHE_ROOT/etcd/$ETCD_VERSION/etcd
  substeps_to GVISOR_DIR 1 "$ROOT/hack/gvisor.sh"
  substeps_to KUBE_ROUTER_DIR 1 "$ROOT/hack/kube-router.sh"
  substeps_to COREDNS_DIR 1 "$ROOT/hack/coredns.sh"
}

record_host_state() {
  local h=$STATE/host
  mkdir -p "$h"
  # Recorded one by one, so that a cluster brought up by an older version of
  # this script still gets them recorded before anything changes them.
  [[ -f $h/bridge-nf-call-iptables ]] \
    || cat /proc/sys/net/bridge/bridge-nf-call-iptables >"$h/bridge-nf-call-iptables" 2>/dev/null || true
  [[ -f $h/ipsets ]] || { ipset list -n 2>/dev/null || true; } | sort >"$h/ipsets"
  [[ -f $h/nft-tables ]] || { nft list tables 2>/dev/null || true; } >"$h/nft-tables"
  [[ -f $h/kubelet-dir ]] || { if [[ -d $KUBELET_DIR ]]; then ls -A "$KUBELET_DIR"; else echo "<absent>"; fi; } >"$h/kubelet-dir"
  [[ -f $h/recorded ]] && return
  cat /proc/sys/net/ipv4/ip_forward >"$h/ip_forward"
  : >"$h/paths"
  for p in "${HOST_PATHS[@]}"; do [[ -e $p ]] && echo "$p" >>"$h/paths"; done
  : >"$h/cgroups"
  for c in "$CGROUP_ROOT"/*/kubepods; do [[ -d $c ]] && echo "$c" >>"$h/cgroups"; done
  ls /var/run/netns 2>/dev/null >"$h/netns" || true
  kube_chains >"$h/iptables-chains"
  touch "$h/recorded"
}

# pki writes a CA, serving and client certificates, the service-account key
# pair, static tokens for each component, and their kubeconfigs.
pki() {
  local d=$STATE/pki
  if [[ ! -f $d/done ]]; then
    log "writing certificates, tokens and kubeconfigs to $d"
    rm -rf "$d"; mkdir -p "$d"; chmod 700 "$d"
    (
      cd "$d"
      openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
        -subj /CN=warmpool-local-ca 2>/dev/null
      cert() { # cert NAME SUBJECT EXTENDED_KEY_USAGE [SANS]
        openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
        {
          echo "basicConstraints=CA:FALSE"
          echo "keyUsage=critical,digitalSignature,keyEncipherment"
          echo "extendedKeyUsage=$3"
          if [[ -n ${4:-} ]]; then echo "subjectAltName=$4"; fi
        } >"$1.ext"
        openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
          -extfile "$1.ext" -out "$1.crt" 2>/dev/null
        rm -f "$1.csr" "$1.ext"
      }
      cert apiserver /CN=kube-apiserver serverAuth \
        "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$SERVICE_IP,IP:$GATEWAY"
      cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
      cert kubelet "/CN=$NODE" serverAuth "DNS:$NODE,IP:127.0.0.1"
      openssl genrsa -out sa.key 2048 2>/dev/null
      openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
      : >tokens.csv
      chmod 600 ./*.key tokens.csv
      touch done
    )
  fi
  # The aggregation layer's front proxy (kubeadm's layout: a CA of its own and
  # a client certificate named front-proxy-client), for aggregated APIs such as
  # warmpool's data plane. Added to clusters made before it, with a restart of
  # the API server to take the new flags.
  local added=()
  if [[ ! -f $d/front-proxy-client.crt ]]; then
    (
      cd "$d"
      openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 3650 \
        -subj /CN=warmpool-local-front-proxy-ca 2>/dev/null
      openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr \
        -subj /CN=front-proxy-client 2>/dev/null
      printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >fp.ext
      openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial \
        -days 3650 -extfile fp.ext -out front-proxy-client.crt 2>/dev/null
      rm -f front-proxy-client.csr fp.ext
      chmod 600 ./*.key
    )
    added+=("front-proxy-client")
  fi
  # Users are added one by one, so a newer version of this script can add one
  # to a cluster that is already up; the API server reads the token file only
  # when it starts, so it is restarted then.
  local user groups tok
  while read -r user groups; do
    [[ -f $d/$user.kubeconfig ]] && continue
    tok=$(openssl rand -hex 24)
    echo "$tok,$user,$user,\"$groups\"" >>"$d/tokens.csv"
    (umask 077; cat >"$d/$user.kubeconfig.tmp") <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://$GATEWAY:$APISERVER_PORT
    certificate-authority: $d/ca.crt
users:
- name: $user
  user:
    token: $tok
contexts:
- name: local
  context: {cluster: local, user: $user}
current-context: local
EOF
    mv "$d/$user.kubeconfig.tmp" "$d/$user.kubeconfig"
    added+=("$user")
  done <<EOF
admin system:masters
system:kube-controller-manager system:authenticated
system:kube-scheduler system:authenticated
system:node:$NODE system:nodes
system:kube-proxy system:authenticated
system:kube-router system:authenticated
system:coredns system:authenticated
EOF
  if ((${#added[@]})) && running kube-apiserver; then
    log "new credentials ${added[*]}: restarting kube-apiserver to read them"
    stop kube-apiserver
  fi
  install -m 600 "$d/admin.kubeconfig" "$STATE/kubeconfig"
}

start_etcd() {
  start etcd "$ETCD_BIN" --name local --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync
  wait_for etcd 60 curl -sf "http://127.0.0.1:$ETCD_PORT/health"
}

start_apiserver() {
  local p=$STATE/pki
  # The endpoint reconciler publishes the bridge address as the `kubernetes`
  # Service's endpoint, so pods reach the API server through kube-proxy.
  start kube-apiserver "$K8S_DIR/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$GATEWAY" --secure-port "$APISERVER_PORT" --advertise-address "$GATEWAY" \
    --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
    --client-ca-file "$p/ca.crt" --token-auth-file "$p/tokens.csv" \
    --authorization-mode Node,RBAC --anonymous-auth=false \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
    --kubelet-client-certificate "$p/apiserver-kubelet-client.crt" --kubelet-client-key "$p/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$p/ca.crt" \
    --kubelet-preferred-address-types Hostname,InternalIP \
    --requestheader-client-ca-file "$p/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$p/front-proxy-client.crt" --proxy-client-key-file "$p/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    --allow-privileged=false --profiling=false
  wait_for kube-apiserver 120 kubectl get --raw /readyz
}

write_containerd_config() {
  local pause; pause=$(image_tag "$ROOT/dist/pause.tar")
  mkdir -p "$STATE/containerd" "$STATE/cni/net.d" "$STATE/cni/ipam"
  write "$STATE/runsc.toml" <<EOF
binary_name = "$GVISOR_DIR/runsc"
[runsc_config]
  platform = "systrap"
EOF
  write "$STATE/containerd/config.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$STATE/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"
  # Root here lacks CAP_SYS_RESOURCE: the pause container's oom_score_adj -998
  # would make every pod fail with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      # The sandbox pods' dev.gvisor.spec.mount.* annotations (their
      # /workspace and /tmp as sized filesystems) must reach the shim. Only
      # those: the other dev.gvisor.* annotations (rootfs hints, ...) would let
      # anyone who can create a pod change how runsc builds its sandbox.
      pod_annotations = ["dev.gvisor.spec.mount.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$STATE/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
  # A default route via the bridge, as on a real cluster: a pod's packets to
  # this host's addresses arrive (and NetworkPolicy decides), packets to
  # anywhere else are dropped when routed off the bridge (see network).
  write "$STATE/cni/net.d/10-warmpool.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "warmpool",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0", "gw": "$GATEWAY"}],
        "dataDir": "$STATE/cni/ipam"
      }
    }
  ]
}
EOF
}

image_tag() { tar -xOf "$1" manifest.json | sed -n 's/.*"RepoTags":\["\([^"]*\)".*/\1/p'; }

ctr_() { ctr --address "$STATE/containerd/containerd.sock" --namespace k8s.io "$@"; }

start_containerd() {
  write_containerd_config
  # The runsc shim is found on PATH by its name, containerd-shim-runsc-v1.
  start containerd env PATH="$GVISOR_DIR:$PATH" containerd --config "$STATE/containerd/config.toml"
  wait_for containerd 60 ctr_ version
}

load_images() {
  local t
  for t in "$ROOT"/dist/*.tar; do
    log "importing $(image_tag "$t") from ${t#"$ROOT"/}"
    ctr_ images import --no-unpack=false "$t" >/dev/null
  done
}

start_controllers() {
  local p=$STATE/pki
  start kube-controller-manager "$K8S_DIR/kube-controller-manager" \
    --kubeconfig "$p/system:kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$p/system:kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$p/system:kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --controllers '*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle' \
    --service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
    --use-service-account-credentials --cluster-cidr "$POD_CIDR" --service-cluster-ip-range "$SERVICE_CIDR"
  start kube-scheduler "$K8S_DIR/kube-scheduler" \
    --kubeconfig "$p/system:kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$p/system:kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$p/system:kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false
}

start_kubelet() {
  local p=$STATE/pki
  if pgrep -x kubelet >/dev/null && ! running kubelet; then
    die "another kubelet runs on this machine (and would share $KUBELET_DIR)"
  fi
  mkdir -p "$KUBELET_DIR" "$STATE/pod-logs"
  write "$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $p/ca.crt}
# Only the API server holds a client certificate of this CA.
authorization: {mode: AlwaysAllow}
tlsCertFile: $p/kubelet.crt
tlsPrivateKeyFile: $p/kubelet.key
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$STATE/containerd/containerd.sock
failSwapOn: false
podLogsDir: $STATE/pod-logs
# Images are imported, not pulled: garbage-collecting one would break pods.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
serializeImagePulls: false
clusterDomain: cluster.local
clusterDNS: [$GATEWAY]
EOF
  start kubelet "$K8S_DIR/kubelet" --config "$STATE/kubelet.yaml" \
    --kubeconfig "$p/system:node:$NODE.kubeconfig" --root-dir "$KUBELET_DIR" \
    --hostname-override "$NODE"
  wait_for "node $NODE" 90 kubectl get node "$NODE"
  kubectl wait --for=condition=Ready "node/$NODE" --timeout=90s >/dev/null \
    || die "node $NODE not Ready; see $STATE/logs/kubelet.log"
}

start_proxy() {
  write "$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $STATE/pki/system:kube-proxy.kubeconfig
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the host's conntrack and route_localnet sysctls alone.
conntrack: {maxPerCore: 0, min: 0}
iptables: {localhostNodePorts: false}
EOF
  start kube-proxy "$K8S_DIR/kube-proxy" --config "$STATE/kube-proxy.yaml"
  wait_for kube-proxy 60 curl -sf http://127.0.0.1:10256/healthz
}

# addon_rbac lets kube-router and CoreDNS read what they watch, nothing more.
# kube-router is used for NetworkPolicy only, but v2.1.0 starts its informers
# for Services, Endpoints and EndpointSlices whatever runs, and exits when they
# cannot sync; it gets no leases, no services/status, no writes at all.
# CoreDNS' role is upstream's (coredns/deployment) without Endpoints, which
# CoreDNS 1.15 no longer reads.
addon_rbac() {
  kubectl apply --server-side --force-conflicts --field-manager=local-cluster -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "local-cluster:kube-router"}
rules:
- apiGroups: [""]
  resources: [pods, namespaces]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [services, endpoints]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "local-cluster:kube-router"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "local-cluster:kube-router"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:kube-router"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "local-cluster:coredns"}
rules:
- apiGroups: [""]
  resources: [services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "local-cluster:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "local-cluster:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}]
EOF
}

# kube_router_synced: the process has finished a full NetworkPolicy sync. Its
# rules cannot tell: they outlive a kube-router that stopped.
kube_router_synced() {
  curl -sf "http://127.0.0.1:$KUBE_ROUTER_METRICS_PORT/metrics" \
    | grep -Eq '^kube_router_controller_iptables_sync_time_count [1-9]'
}

# kube-router runs only its NetworkPolicy controller: pod networking stays with
# the bridge plugin and Services with kube-proxy. Its health port would listen
# on every interface (it takes no address), so it is off; its metrics can be
# bound to loopback and tell when the first sync is done.
start_kube_router() {
  local t0=$EPOCHREALTIME
  start kube-router "$KUBE_ROUTER_DIR/kube-router" \
    --kubeconfig "$STATE/pki/system:kube-router.kubeconfig" \
    --hostname-override "$NODE" \
    --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --health-port 0 --metrics-addr 127.0.0.1 --metrics-port "$KUBE_ROUTER_METRICS_PORT"
  wait_for kube-router 90 kube_router_synced
  log "kube-router enforcing NetworkPolicy ($(since "$t0"))"
}

# CoreDNS answers cluster.local (and reverse lookups of cluster addresses) from
# the API and nothing else: with no server block for other zones it REFUSES
# them, and the binary has no plugin that could forward (hack/coredns.sh).
start_coredns() {
  local t0=$EPOCHREALTIME
  mkdir -p "$STATE/coredns"
  write "$STATE/coredns/Corefile" <<EOF
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $GATEWAY
    errors
    ready 127.0.0.1:$COREDNS_READY_PORT
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/pki/system:coredns.kubeconfig
    }
}
EOF
  start coredns "$COREDNS_DIR/coredns" -conf "$STATE/coredns/Corefile"
  wait_for coredns 60 curl -sf "http://127.0.0.1:$COREDNS_READY_PORT/ready"
  log "coredns serving cluster.local on $GATEWAY:53 ($(since "$t0"))"
}

# network makes the pods' bridge before anything starts (the CNI plugin adopts
# it), so the API server can listen on the bridge address alone: reachable from
# this host and from pods, not from other machines.
#
# Pods have a default route, so the guard that keeps their packets on this
# machine sits in the mangle table's FORWARD chain: kube-router puts its own
# jump first in the filter FORWARD chain on every sync and ACCEPTs there
# whatever NetworkPolicy allows, so a filter rule alone would no longer be
# reached. The filter rule stays for the time before kube-router runs and for
# hosts where someone runs the cluster without it.
# Pod-to-pod traffic crosses the bridge without being routed; the bridge must
# hand it to iptables for NetworkPolicy to see it (bridge-nf-call-iptables).
network() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$GATEWAY/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local t
  for t in mangle filter; do
    iptables -t "$t" -C FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP 2>/dev/null \
      || iptables -t "$t" -I FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  done
  [[ -w /proc/sys/net/bridge/bridge-nf-call-iptables ]] || modprobe br_netfilter 2>/dev/null || true
  [[ -w /proc/sys/net/bridge/bridge-nf-call-iptables ]] \
    || die "no /proc/sys/net/bridge/bridge-nf-call-iptables (br_netfilter): NetworkPolicy could not see pod-to-pod traffic"
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
}

cluster_objects() {
  kubectl apply --server-side -f "$ROOT/config/runtimeclass/runtimeclass.yaml" >/dev/null
  wait_for "default service account" 60 kubectl -n default get serviceaccount default
}

up() {
  local t0=$SECONDS
  preflight
  progress_plan "$UP_STEPS" "hack/local-cluster.sh up: a single-node Kubernetes $K8S_VERSION with gVisor. Cold, it first builds the binaries below from Go modules (20 min or more on 2 cores: docs/performance.md); later runs take under a minute"
  host_packages
  mkdir -p "$STATE"/{run,logs}
  binaries
  # No estimate for a cold `make images` is written down anywhere yet.
  step "building the images without Docker (make images: the manager, agent and pause binaries, dist/*.tar; a few minutes cold, rebuilt on every run)"
  run_logged "$STATE/logs/images.log" make -C "$ROOT" --no-print-directory images \
    || die "make images failed; see $STATE/logs/images.log"
  step_done "images built"
  # docs/performance.md: 21-28 s from a stopped cluster with the binaries cached.
  step "starting the cluster: etcd, kube-apiserver, containerd (the images imported), the controllers, CoreDNS, the kubelet, kube-proxy, kube-router (about 30 s; logs in $STATE/logs)"
  record_host_state
  pki
  network
  start_etcd
  start_apiserver
  addon_rbac
  start_containerd
  load_images
  start_controllers
  start_coredns
  start_kubelet
  start_proxy
  start_kube_router
  cluster_objects
  step_done "cluster started"
  progress_end
  log "cluster up in $((SECONDS - t0)) s; export KUBECONFIG=$STATE/kubeconfig"
}

# drain deletes every pod through the API so the kubelet tears each sandbox down
# properly (CNI DEL, netns, shims); controllers are stopped first so nothing
# comes back.
drain() {
  running kube-apiserver && running kubelet || return 0
  stop kube-controller-manager
  stop kube-scheduler
  log "deleting all pods"
  kubectl delete pods --all --all-namespaces --grace-period=1 --wait=false >/dev/null 2>&1 || true
  local deadline=$((SECONDS + 90))
  while ((SECONDS < deadline)); do
    [[ -z $(ctr_ tasks ls -q 2>/dev/null) ]] && [[ -z $(kubectl get pods -A -o name 2>/dev/null) ]] && return 0
    # Pods created meanwhile (by the operator) are unscheduled: delete them too.
    kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    sleep 1
  done
  log "pods still running after 90 s; killing their containers directly"
}

down() {
  [[ $(id -u) == 0 ]] || die "run as root"
  [[ -d $STATE ]] || { log "nothing to stop ($STATE does not exist)"; return 0; }
  K8S_DIR=$CACHE_ROOT/k8s/$K8S_VERSION
  drain
  local c
  for c in kube-router coredns kube-proxy kubelet kube-controller-manager kube-scheduler; do stop "$c"; done
  [[ -x $K8S_DIR/kube-proxy ]] && "$K8S_DIR/kube-proxy" --cleanup >/dev/null 2>&1 || true
  # Whatever is left of the sandboxes: kill tasks, then their shims (they run
  # with our containerd's socket path on their command line).
  if running containerd; then
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  fi
  for c in containerd kube-apiserver etcd; do stop "$c"; done
  local pid
  for pid in $(pgrep -f -- "$STATE/containerd" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  cleanup_host
  log "cluster down"
}

# kube_chains lists "TOOL TABLE CHAIN" for every KUBE-* chain on the host.
kube_chains() {
  local tool table
  for tool in iptables ip6tables; do
    command -v "$tool-save" >/dev/null || continue
    for table in filter nat mangle; do
      "$tool-save" -t "$table" 2>/dev/null | sed -n "s/^:\(KUBE-[^ ]*\) .*/$tool $table \1/p"
    done
  done
}

# remove_kube_chains deletes the KUBE-* chains that kubelet, kube-proxy and
# kube-router (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*) made, those not
# there when `up` first ran, and the rules that jump to them; kube-router
# leaves all of them behind when it stops.
remove_kube_chains() {
  local tool table chain rule
  kube_chains | while read -r tool table chain; do
    grep -qxF "$tool $table $chain" "$STATE/host/iptables-chains" 2>/dev/null && continue
    { "$tool-save" -t "$table" | grep -E "^-A [^ ]+ .*-j $chain( |\$)" | grep -v '^-A KUBE-' || true; } | while read -r rule; do
      # shellcheck disable=SC2086 # the rule is a list of iptables arguments
      eval "$tool -t $table -D ${rule#-A }" 2>/dev/null || true
    done
    "$tool" -t "$table" -F "$chain" 2>/dev/null || true
  done
  kube_chains | while read -r tool table chain; do
    grep -qxF "$tool $table $chain" "$STATE/host/iptables-chains" 2>/dev/null && continue
    "$tool" -t "$table" -X "$chain" 2>/dev/null || true
  done
}

# remove_ipsets destroys the sets kube-router made for NetworkPolicy (KUBE-SRC-*,
# KUBE-DST-*, and TMP-* if it died while swapping), once no rule uses them.
remove_ipsets() {
  [[ -f $STATE/host/ipsets ]] && command -v ipset >/dev/null || return 0
  local set
  { ipset list -n 2>/dev/null || true; } | { grep -E '^(inet6:)?(KUBE-|TMP-)' || true; } | while read -r set; do
    grep -qxF "$set" "$STATE/host/ipsets" && continue
    ipset destroy "$set" 2>/dev/null || log "ipset $set is still in use; left in place"
  done
}

# remove_empty_nft_tables deletes the nftables tables that iptables-nft made for
# our components (filter, nat, mangle of ip and ip6) when they were not there
# before `up` and nothing is left in them but empty built-in chains.
remove_empty_nft_tables() {
  [[ -f $STATE/host/nft-tables ]] && command -v nft >/dev/null || return 0
  local family name
  { nft list tables 2>/dev/null || true; } | while read -r _ family name; do
    [[ $family == ip || $family == ip6 ]] || continue
    [[ $name == filter || $name == nat || $name == mangle ]] || continue
    grep -qxF "table $family $name" "$STATE/host/nft-tables" && continue
    nft list table "$family" "$name" 2>/dev/null \
      | grep -qvE '^[[:space:]]*(table .* \{|chain [A-Z]+ \{|type .* policy accept;|\}|)$' && continue
    nft delete table "$family" "$name" 2>/dev/null || true
  done
}

cleanup_host() {
  local t
  for t in mangle filter; do
    iptables -t "$t" -D FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP 2>/dev/null || true
  done
  if [[ -f $STATE/host/recorded ]]; then remove_kube_chains; fi
  remove_ipsets
  remove_empty_nft_tables
  if [[ -s $STATE/host/bridge-nf-call-iptables ]]; then
    cat "$STATE/host/bridge-nf-call-iptables" >/proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || true
  fi
  ip link del "$BRIDGE" 2>/dev/null || true
  local m
  # Leftover network namespaces of our pods (created after up recorded the list).
  if [[ -d /var/run/netns ]]; then
    for m in /var/run/netns/cni-*; do
      [[ -e $m ]] || continue
      grep -qxF "$(basename "$m")" "$STATE/host/netns" 2>/dev/null && continue
      umount "$m" 2>/dev/null || true; rm -f "$m"
    done
  fi
  # Mounts below our state dir (container rootfs) and the kubelet's (pod
  # volumes), deepest first.
  awk -v s="$STATE/" -v k="$KUBELET_DIR/" 'index($2, s) == 1 || index($2, k) == 1 {print $2}' /proc/self/mounts \
    | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  remove_kubelet_dir
  if [[ -f $STATE/host/recorded ]]; then
    cat "$STATE/host/ip_forward" >/proc/sys/net/ipv4/ip_forward
    for c in "$CGROUP_ROOT"/*/kubepods; do
      [[ -d $c ]] || continue
      grep -qxF "$c" "$STATE/host/cgroups" && continue
      find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    for m in "${HOST_PATHS[@]}"; do
      [[ -e $m ]] || continue
      grep -qxF "$m" "$STATE/host/paths" || rm -rf "$m"
    done
  fi
  if awk -v s="$STATE/" 'index($2, s) == 1' /proc/self/mounts | grep -q .; then
    log "some mounts below $STATE are still busy; leaving the directory in place"
  else
    rm -rf "$STATE"
  fi
}

# remove_kubelet_dir removes the kubelet's root, or what the kubelet added to
# it when it was there before `up`.
remove_kubelet_dir() {
  local list=$STATE/host/kubelet-dir e
  [[ -f $list && -d $KUBELET_DIR ]] || return 0
  # A kubelet root that is a mount point of the host's (some VMs give one to
  # the kubelet) stays; what the kubelet put in it goes below.
  if grep -qxF "<absent>" "$list" && ! mountpoint -q "$KUBELET_DIR"; then
    rm -rf "$KUBELET_DIR"
    return
  fi
  for e in "$KUBELET_DIR"/* "$KUBELET_DIR"/.[!.]*; do
    [[ -e $e ]] || continue
    grep -qxF "$(basename "$e")" "$list" || rm -rf "$e"
  done
}

status() {
  local c rc=0
  K8S_DIR=$CACHE_ROOT/k8s/$K8S_VERSION
  for c in "${COMPONENTS[@]}"; do
    if running "$c"; then printf '%-24s running (pid %s)\n' "$c" "$(cat "$(pidfile "$c")")"
    else printf '%-24s stopped\n' "$c"; rc=1; fi
  done
  if running kube-apiserver; then
    echo "kubeconfig: $STATE/kubeconfig"
    kubectl get nodes -o wide 2>/dev/null || true
  fi
  return $rc
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  kubeconfig) echo "$STATE/kubeconfig" ;;
  steps) echo "$UP_STEPS" ;;
  load) load_images ;;
  # For fault tests (test/e2e chaos spec): the API server goes away and comes back.
  restart-apiserver)
    K8S_DIR=$CACHE_ROOT/k8s/$K8S_VERSION
    running kube-apiserver || die "kube-apiserver is not running"
    stop kube-apiserver; start_apiserver ;;
  *) die "usage: $0 up|down|status|kubeconfig|steps|load|restart-apiserver" ;;
esac
