# Sourced by the GPU-machine scripts: unpack the GL/Vulkan loaders (.gl), put the staged packages on the path
# (.devpkgs) and render headless through the NVIDIA EGL driver. Sets OUT (the device tool's result folder).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
source .devpkgs/setup.sh
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl
[ -f /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json ] && \
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
