#!/usr/bin/env bash
# Makes sure the Debian packages the sandbox image is built from are here:
# python3 (the image's interpreter), unless NUMPY_FOR_IMAGE is empty
# python3-numpy (pools that preload numpy), python3-cloudpickle and
# python3-zstandard (Session snapshots), and bash, ripgrep and
# busybox-static (the sandbox's shell), and for the data-science image
# repl-data python3-pandas, -matplotlib, -scipy and -sklearn. Installs them as root, else says
# what to install: an image built without them would leave such pools
# warming forever.
set -euo pipefail
missing=()
[[ -x ${PYTHON_FOR_IMAGE:-/usr/bin/python3} ]] || missing+=(python3)
if [[ -n ${NUMPY_FOR_IMAGE-/usr/lib/python3/dist-packages/numpy} && ! -d ${NUMPY_FOR_IMAGE:-/usr/lib/python3/dist-packages/numpy} ]]; then
  missing+=(python3-numpy)
fi
# Snapshots of a Session's namespace: cloudpickle and zstandard (pkg/snapshot).
[[ -d /usr/lib/python3/dist-packages/cloudpickle ]] || missing+=(python3-cloudpickle)
[[ -d /usr/lib/python3/dist-packages/zstandard ]] || missing+=(python3-zstandard)
# The sandbox's shell: bash, ripgrep and busybox's applets.
[[ -x /usr/bin/bash ]] || missing+=(bash)
[[ -x /usr/bin/rg ]] || missing+=(ripgrep)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
# repl-data, the data-science image (DATA_IMAGE= skips it).
if [[ -n ${DATA_IMAGE-1} ]]; then
  for pkg in pandas matplotlib scipy sklearn; do
    [[ -d /usr/lib/python3/dist-packages/$pkg ]] || missing+=("python3-$pkg")
  done
fi
((${#missing[@]})) || exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "the sandbox image needs the Debian packages ${missing[*]}: apt-get install ${missing[*]}" >&2
  echo "(or build without numpy: make images NUMPY_FOR_IMAGE=)" >&2
  exit 1
fi
echo "[image-deps] apt-get install ${missing[*]}" >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
