#!/bin/bash
# Set up everything rlfarm needs on a fresh Debian machine: system packages (as root), a venv,
# torch (the CPU build where no GPU is present: an unpinned torch would pull a multi-GB CUDA build),
# then the project with its test and report extras.
set -euo pipefail
PYTHON=${1:-python3}
VENV=${2:-.venv}

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  # EGL/Mesa for headless MuJoCo rendering; ffmpeg comes from PyPI (imageio-ffmpeg).
  for pkg in libegl1 libgl1 libgles2 libegl-mesa0; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q "torch==2.13.0"
fi
"$VENV/bin/pip" install -q -e ".[test,report]"
# SAPIEN (a ~51 MB wheel, ~20 s) for the physics-only VLA envs; best effort: rlfarm works without it and its
# tests skip, so a platform without a wheel still gets a working install.
"$VENV/bin/pip" install -q -e ".[sim]" || echo "warning: SAPIEN did not install; the SAPIEN envs and their tests are skipped" >&2
echo "installed into $VENV"
