#!/usr/bin/env bash
# Prints the path of a python3 that has what the Python client and its tests
# need (the kubernetes client, pytest): Debian's, with python3-kubernetes and
# python3-pytest installed as root when missing (PyPI may be out of reach;
# Debian's packages are not). Not root: says what to install.
set -euo pipefail
py=${WARMPOOL_PYTHON:-/usr/bin/python3}
if "$py" -c 'import kubernetes, pytest' 2>/dev/null; then echo "$py"; exit 0; fi
pkgs=(python3 python3-kubernetes python3-pytest)
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null || [[ $py != /usr/bin/python3 ]]; then
  echo "the Python client's tests need $py with the kubernetes client and pytest: apt-get install ${pkgs[*]} (or set WARMPOOL_PYTHON)" >&2
  exit 1
fi
echo "[python-deps] apt-get install ${pkgs[*]}" >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null \
  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null; }
"$py" -c 'import kubernetes, pytest' && echo "$py"
