#!/usr/bin/env bash
# Prints the path of a python3 that has what the Python client and its tests
# need (the kubernetes client, pytest, and pip with setuptools and wheel to
# install the client from its pyproject.toml as a user would; matplotlib for
# the rich results the agents' tests draw; cloudpickle and zstandard for
# the snapshots of Sessions): Debian's, with
# the python3-* packages installed as root when missing (PyPI may be out of
# reach; Debian's packages are not). Not root: says what to install.
set -euo pipefail
# shellcheck source=hack/lib/progress.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/progress.sh"
py=${WARMPOOL_PYTHON:-/usr/bin/python3}
has_deps() { "$py" -c 'import kubernetes, pytest, setuptools, wheel, matplotlib, cloudpickle, zstandard' 2>/dev/null && "$py" -m pip --version >/dev/null 2>&1; }
progress_plan 1
if has_deps; then step "Python packages for the client's tests ($py): present"; echo "$py"; exit 0; fi
pkgs=(python3 python3-kubernetes python3-pytest python3-pip python3-setuptools python3-wheel python3-matplotlib python3-cloudpickle python3-zstandard)
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null || [[ $py != /usr/bin/python3 ]]; then
  step "Python packages for the client's tests ($py): missing"
  echo "the Python client's tests need $py with the kubernetes client, pytest, pip, setuptools and wheel: apt-get install ${pkgs[*]} (or set WARMPOOL_PYTHON)" >&2
  exit 1
fi
step "installing the Python client's test packages from Debian with apt-get: ${pkgs[*]} (a few minutes)"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null \
  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null; }
has_deps && echo "$py"
