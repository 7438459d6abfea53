#!/bin/bash
# Set up everything rlfarm needs on a fresh Debian machine: system packages (as root), a venv,
# torch (the CPU build where no GPU is present: an unpinned torch would pull a multi-GB CUDA build),
# then the project with its test and report extras.
set -euo pipefail
PYTHON=${1:-python3}
VENV=${2:-.venv}

mesa_vulkan_ok() {  # mesa-vulkan-drivers >= 23 and the Vulkan loader are installed
  local version
  version=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null) || return 1
  dpkg --compare-versions "$version" ge 23 && dpkg -s libvulkan1 >/dev/null 2>&1
}

install_vulkan() {
  mesa_vulkan_ok && return 0
  local target=()
  if [ "$(. /etc/os-release && echo "${VERSION_CODENAME:-}")" = bookworm ]; then
    if ! apt-get indextargets --no-release-info 'Release: bookworm-backports' 2>/dev/null | grep -q .; then
      # the mirror this machine already uses, signed by Debian's archive keyring like the main suite
      local mirror
      mirror=$(apt-get indextargets --no-release-info --format '$(REPO_URI)' 'Release: bookworm' | sort -u | head -n1)
      [ -n "$mirror" ] || return 1
      printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' \
        "$mirror" /usr/share/keyrings/debian-archive-keyring.gpg > /etc/apt/sources.list.d/bookworm-backports.sources
    fi
    target=(-t bookworm-backports)
  fi
  apt-get update -qq || return 1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${target[@]}" mesa-vulkan-drivers libvulkan1 >/dev/null || return 1
  mesa_vulkan_ok
}

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  # EGL/Mesa for headless MuJoCo rendering; ffmpeg comes from PyPI (imageio-ffmpeg).
  for pkg in libegl1 libgl1 libgles2 libegl-mesa0; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  # Vulkan for SAPIEN cameras and ManiSkill3: on a CPU machine Mesa's lavapipe renders, and SAPIEN refuses
  # Mesa < 23 (Debian 12 ships 22.3), so Debian 12 takes Mesa from bookworm-backports; a GPU's own driver brings
  # its Vulkan ICD and only needs the loader. Best effort: rlfarm works without it and the camera envs' tests skip.
  install_vulkan || echo "warning: Vulkan (Mesa >= 23 lavapipe) did not install; the ManiSkill3 camera envs and their tests are skipped" >&2
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q "torch==2.13.0"
fi
"$VENV/bin/pip" install -q -e ".[test,report]"
# SAPIEN (a ~51 MB wheel) for the physics-only VLA envs and ManiSkill3 (~100 MB wheel with its robot assets, ~30
# small deps) for the camera envs; best effort: rlfarm works without them and their tests skip, so a platform
# without a wheel still gets a working install. Quick when already installed (pip only checks).
if ! "$VENV/bin/pip" install -q -e ".[sim]"; then
  echo "warning: mani_skill did not install; the ManiSkill3 envs and their tests are skipped" >&2
  "$VENV/bin/pip" install -q "sapien==3.0.3" || echo "warning: SAPIEN did not install; the SAPIEN envs and their tests are skipped" >&2
fi
echo "installed into $VENV"
