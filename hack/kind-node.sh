#!/usr/bin/env bash
# Builds a kind node image without any registry: kind's own `build node-image`
# pulls etcd, CoreDNS, pause and kindnetd images, and kindest/node comes from
# Docker Hub, neither of which our CI machines reach. Prints the image name.
#
#   hack/kind-node.sh          # build once (cached in Docker), print the image
#   hack/kind-node.sh steps    # how many numbered steps it prints (hack/kind.sh counts them)
#
# Its steps are numbered (hack/lib/progress.sh): the root file system, each
# binary (built from Go modules once, then cached), the image; Go's output and
# debootstrap's go to ~/.cache/warmpool/logs.
#
# What goes in, all from Debian packages and Go modules:
# - a Debian bookworm root file system (debootstrap, with the host's mirror)
#   with systemd, containerd and runc, the CNI plugins, iptables and ipset,
#   cached as a tarball;
# - kind's base files (entrypoint, systemd units, containerd config) from the
#   sigs.k8s.io/kind module of $KIND_VERSION, laid out as its base image does;
# - kubeadm, kubelet and kubectl (hack/k8s-binaries.sh);
# - the control plane's images, written by hack/imgbuild from the same
#   binaries (etcd 3.6, which kubeadm 1.34 needs), CoreDNS (hack/coredns.sh),
#   pause (hack/pause), and one Debian-based image with iptables and ipset
#   for kube-proxy and kube-router (hack/kube-router.sh), the NetworkPolicy
#   enforcer the local cluster runs too. They are imported into the node's
#   containerd at build time by the host's containerd (the same Debian
#   release), so kubeadm finds them without pulling.
# The Pod network is the same bridge the local cluster uses (baked CNI config,
# one node); hack/kind.sh creates the cluster with kind's default CNI off.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_ROOT=${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}
K8S_VERSION=${K8S_VERSION:-v1.34.10}
KIND_ETCD_VERSION=${KIND_ETCD_VERSION:-v3.6.5}
KIND_VERSION=${KIND_VERSION:-v0.30.0}
DEBIAN_SUITE=bookworm
# Bump when what goes into the root file system changes.
ROOTFS_REV=1
ROOTFS=$CACHE_ROOT/kind/rootfs-$DEBIAN_SUITE-r$ROOTFS_REV.tar
PACKAGES=(systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod libseccomp2
  pigz bash ca-certificates curl jq procps containerd runc containernetworking-plugins ipset)
# The one node's Pod network: the local cluster's bridge addresses.
POD_CIDR=10.244.0.0/24
POD_GATEWAY=10.244.0.1

log() { printf '[kind-node] %s\n' "$*" >&2; }
die() { printf '[kind-node] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=hack/lib/progress.sh
source "$ROOT/hack/lib/progress.sh"
# shellcheck source=hack/lib/cni.sh
source "$ROOT/hack/lib/cni.sh"
# The Kubernetes binaries that go in (hack/k8s-binaries.sh), one numbered step each.
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl kubeadm)
# The steps: the root file system, K8S_BINS, etcd, CoreDNS, kube-router, the image.
STEPS=$((1 + ${#K8S_BINS[@]} + 4))
if [[ ${1:-} == steps ]]; then echo "$STEPS"; exit 0; fi

[[ $(id -u) == 0 ]] || die "needs root (debootstrap, chroot, file ownership in the image)"
docker info >/dev/null 2>&1 || die "no Docker engine answers (hack/kind.sh up starts one)"

# The tag names everything the image is made of, so a change to any input
# builds a new one instead of reusing a stale image.
key=$(cat "${BASH_SOURCE[0]}" "$ROOT/hack/lib/cni.sh" "$ROOT/hack/imgbuild/main.go" "$ROOT/hack/coredns.sh" "$ROOT/hack/kube-router.sh" \
  <(echo "$K8S_VERSION $KIND_ETCD_VERSION $KIND_VERSION $ROOTFS_REV") | sha256sum | cut -c1-12)
IMAGE=warmpool.local/kind-node:$K8S_VERSION-$key
progress_plan "$STEPS" "hack/kind-node.sh: the kind node image $IMAGE, from Debian packages and Go modules (about a minute once the binaries are cached: README)"
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  step_skip "$STEPS" "node image $IMAGE: cached in Docker"
  echo "$IMAGE"; exit 0
fi

start=$SECONDS
work=$(mktemp -d "$CACHE_ROOT/kind-node-build.XXXXXX")
containerd_pid=
cleanup() {
  [[ -n $containerd_pid ]] && kill "$containerd_pid" 2>/dev/null && wait "$containerd_pid" 2>/dev/null
  for m in proc sys dev; do umount -l "$work/rootfs/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

debian_host() { [[ -r /etc/os-release ]] && (. /etc/os-release && [[ $ID == debian ]]); }

mirror() { # the Debian mirror apt already uses here; Debian's own elsewhere (an Ubuntu CI runner, say)
  local u=
  if debian_host; then
    u=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1)
    [[ -n $u ]] || u=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  fi
  echo "${DEBIAN_MIRROR:-${u:-http://deb.debian.org/debian}}"
}

build_rootfs() {
  if [[ -f $ROOTFS ]]; then step "Debian $DEBIAN_SUITE root file system for the node: cached"; return; fi
  local r=$work/rootfs m keyring=() dlog alog
  m=$(mirror)
  # docs/kind.md: 30-34 s.
  step "Debian $DEBIAN_SUITE root file system for the node: debootstrap and ${#PACKAGES[@]} packages from $m (about 30 s; cached after)"
  command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install debootstrap"
  dlog=$(progress_log kind-node-debootstrap) alog=$(progress_log kind-node-apt)
  if ! debian_host; then
    [[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] || die "Debian's archive keys missing: apt-get install debian-archive-keyring"
    keyring=(--keyring /usr/share/keyrings/debian-archive-keyring.gpg)
  fi
  log "debootstrap $DEBIAN_SUITE from $m"
  debootstrap --variant=minbase "${keyring[@]}" "$DEBIAN_SUITE" "$r" "$m" >"$dlog" 2>&1 \
    || { tail -n 30 "$dlog" >&2; die "debootstrap failed; its output: $dlog"; }
  # A Debian host's apt sources (security updates included) rather than the bare mirror.
  if debian_host && [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    rm -f "$r/etc/apt/sources.list"
    cp /etc/apt/sources.list.d/debian.sources "$r/etc/apt/sources.list.d/"
  fi
  mount -t proc proc "$r/proc"; mount --rbind /sys "$r/sys"; mount --rbind /dev "$r/dev"
  cp /etc/resolv.conf "$r/etc/resolv.conf"
  log "installing ${#PACKAGES[@]} packages"
  chroot "$r" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${PACKAGES[*]}" \
    >"$alog" 2>&1 || { tail -n 30 "$alog" >&2; die "apt-get install in the root file system failed; its output: $alog"; }
  chroot "$r" apt-get clean
  for m in proc sys dev; do umount -l "$r/$m"; done
  rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/* "$r"/var/log/* "$r/etc/resolv.conf"
  : >"$r/etc/resolv.conf"
  mkdir -p "$(dirname "$ROOTFS")"
  tar -C "$r" --numeric-owner -cf "$ROOTFS.tmp" .
  mv "$ROOTFS.tmp" "$ROOTFS"
  rm -rf "$r"
  step_done "root file system built ($(du -h "$ROOTFS" | cut -f1))"
}

# binaries: what goes into the node, one numbered step each, cached after their first build.
binaries() {
  substeps_to K8S_BIN ${#K8S_BINS[@]} env K8S_VERSION="$K8S_VERSION" "$ROOT/hack/k8s-binaries.sh" build "${K8S_BINS[@]}"
  substeps 1 env ETCD_VERSION="$KIND_ETCD_VERSION" "$ROOT/hack/k8s-binaries.sh" build etcd >/dev/null
  ETCD_DIR=$CACHE_ROOT/etcd/$KIND_ETCD_VERSION
  substeps_to COREDNS_DIR 1 "$ROOT/hack/coredns.sh"
  substeps_to KUBE_ROUTER_DIR 1 "$ROOT/hack/kube-router.sh"
  # Named for what they are (hack/kind.sh points kubeadm at the CoreDNS tag).
  COREDNS_TAG=$(basename "$COREDNS_DIR" | sed 's/-p[0-9]*$//')
  KUBE_ROUTER_IMAGE=warmpool.local/kube-router:$(basename "$KUBE_ROUTER_DIR")
}

# Image tarballs for what kubeadm starts, and the tools image.
build_images() {
  local k8s=$K8S_BIN etcd=$ETCD_DIR coredns=$COREDNS_DIR kr=$KUBE_ROUTER_DIR imgbuild=$work/imgbuild pause=$work/pause
  (cd "$ROOT" && go build -o "$imgbuild" ./hack/imgbuild && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$pause" ./hack/pause)
  mkdir -p "$work/images"
  local c
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    "$imgbuild" -o "$work/images/$c.tar" -tag "registry.k8s.io/$c:$K8S_VERSION" \
      -add "$k8s/$c:/usr/local/bin/$c" -entrypoint "/usr/local/bin/$c" >&2
  done
  "$imgbuild" -o "$work/images/etcd.tar" -tag "registry.k8s.io/etcd:${KIND_ETCD_VERSION#v}-0" \
    -add "$etcd/etcd:/usr/local/bin/etcd" -entrypoint /usr/local/bin/etcd >&2
  "$imgbuild" -o "$work/images/coredns.tar" -tag "registry.k8s.io/coredns/coredns:$COREDNS_TAG" \
    -add "$coredns/coredns:/coredns" -entrypoint /coredns >&2
  # kind's containerd config names pause 3.10; kubeadm 1.34 expects 3.10.1.
  "$imgbuild" -o "$work/images/pause.tar" -tag registry.k8s.io/pause:3.10 -tag registry.k8s.io/pause:3.10.1 \
    -add "$pause:/pause" -entrypoint /pause -user 65535:65535 >&2
  "$imgbuild" -o "$work/images/tools.tar" -base "$ROOTFS" \
    -tag "registry.k8s.io/kube-proxy:$K8S_VERSION" -tag "$KUBE_ROUTER_IMAGE" \
    -add "$k8s/kube-proxy:/usr/local/bin/kube-proxy" -add "$kr/kube-router:/usr/local/bin/kube-router" >&2
}

build_node_rootfs() {
  local r=$work/node kind_src
  kind_src=$(cd "$ROOT" && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  local f=$kind_src/images/base/files
  [[ -d $f ]] || die "kind's base files are not in sigs.k8s.io/kind@$KIND_VERSION"
  mkdir -p "$r"
  tar -C "$r" -xf "$ROOTFS"
  # kind's base image, from its Dockerfile: its files with those modes, the
  # systemd units it enables, none of the distribution's.
  install -m 0755 "$f"/usr/local/bin/* "$r/usr/local/bin/"
  mkdir -p "$r/kind/bin" "$r/etc/containerd" "$r/etc/default" "$r/etc/sysctl.d" \
    "$r/etc/systemd/system/kubelet.service.d" "$r/etc/kubernetes/manifests"
  cp -r "$f"/kind/. "$r/kind/"; chmod 0755 "$r/kind/bin" "$r"/kind/bin/*
  install -m 0644 "$f"/etc/crictl.yaml "$r/etc/"
  install -m 0644 "$f"/etc/containerd/* "$r/etc/containerd/"
  install -m 0644 "$f"/etc/default/* "$r/etc/default/"
  install -m 0644 "$f"/etc/sysctl.d/* "$r/etc/sysctl.d/"
  find "$f/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 -t "$r/etc/systemd/system/" {} +
  install -m 0644 "$f"/etc/systemd/system/kubelet.service.d/* "$r/etc/systemd/system/kubelet.service.d/"
  find "$r/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$r"/lib/systemd/system/multi-user.target.wants/* "$r"/etc/systemd/system/*.wants/* \
    "$r"/lib/systemd/system/local-fs.target.wants/* "$r"/lib/systemd/system/sockets.target.wants/*udev* \
    "$r"/lib/systemd/system/sockets.target.wants/*initctl* "$r"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >>"$r/etc/systemd/journald.conf"
  ln -sf /lib/systemd/systemd "$r/sbin/init"
  chroot "$r" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
  chroot "$r" systemctl mask systemd-binfmt.service >/dev/null 2>&1
  # Debian's containerd, runc and CNI plugins where kind's units and config expect them.
  local b
  for b in containerd ctr containerd-shim-runc-v2; do ln -sf "/usr/bin/$b" "$r/usr/local/bin/$b"; done
  mkdir -p "$r/opt/cni/bin"
  for b in "$r"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/$(basename "$b")" "$r/opt/cni/bin/"; done
  ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
    | jq 'del(.process.rlimits)' >"$r/etc/containerd/cri-base.json"
  # kind's node image proper: the Kubernetes binaries and the version kind reads.
  install -m 0755 "$K8S_BIN/kubeadm" "$K8S_BIN/kubelet" "$K8S_BIN/kubectl" "$r/usr/bin/"
  echo "$K8S_VERSION" >"$r/kind/version"
  # One node's Pod network: the local cluster's bridge (kube-router enforces
  # NetworkPolicy on it the same way).
  mkdir -p "$r/etc/cni/net.d"
  kind_node_conflist "$POD_CIDR" "$POD_GATEWAY" >"$r/etc/cni/net.d/10-warmpool.conflist"
}

import_images() {
  local r=$work/node s=$work/containerd
  mkdir -p "$s"
  cat >"$s/config.toml" <<EOF
version = 2
root = "$r/var/lib/containerd"
state = "$s/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$s/c.sock"
EOF
  containerd --config "$s/config.toml" >"$s/log" 2>&1 &
  containerd_pid=$!
  # This runs in run_logged's subshell: the script's cleanup does not see containerd_pid.
  trap '[[ -n $containerd_pid ]] && kill "$containerd_pid" 2>/dev/null && wait "$containerd_pid" 2>/dev/null' EXIT
  local i
  for ((i = 0; i < 50; i++)); do ctr --address "$s/c.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
  local t name
  for t in "$work"/images/*.tar; do
    ctr --address "$s/c.sock" -n k8s.io images import --no-unpack "$t" >&2
  done
  # Pinned, as kind pins the images it bakes in: the kubelet's image GC
  # must not delete what the control plane needs to restart.
  for name in $(ctr --address "$s/c.sock" -n k8s.io images ls -q); do
    ctr --address "$s/c.sock" -n k8s.io images label "$name" io.cri-containerd.pinned=pinned >/dev/null
  done
  kill "$containerd_pid"; wait "$containerd_pid" 2>/dev/null || true; containerd_pid=
}

# assemble: the image from what the steps before made; run by run_logged, its output in the log.
assemble() {
  build_images
  build_node_rootfs
  import_images
  log "importing the node's file system into Docker as $IMAGE"
  tar -C "$work/node" --numeric-owner -c . | docker import \
    --change 'ENV container=docker' \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' - "$IMAGE-stage" >/dev/null
  # docker import takes no STOPSIGNAL; systemd stops cleanly on SIGRTMIN+3.
  # The labels tell hack/kind.sh which CoreDNS and kube-router images it holds.
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\nLABEL dev.warmpool.coredns-version=%s dev.warmpool.kube-router-image=%s\n' \
    "$IMAGE-stage" "$COREDNS_TAG" "$KUBE_ROUTER_IMAGE" | DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE" - >/dev/null
  docker rmi "$IMAGE-stage" >/dev/null
}

build_rootfs
binaries
# docs/kind.md: 23 s with the root file system and the binaries cached.
step "assembling the node image: control-plane images (hack/imgbuild), kind's base files, the node's containerd image store, docker import (about 25 s)"
run_logged "$(progress_log kind-node-image)" assemble
step_done "node image $IMAGE built"
progress_end
log "node image $IMAGE: $((SECONDS - start)) s in all"
echo "$IMAGE"
