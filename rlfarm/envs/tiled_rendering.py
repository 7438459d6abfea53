"""Batched MuJoCo rendering (`env.batch_render`): gymnasium gives each sub-env its own GL context and reads its RGB
and depth back after every frame, so a GPU switches between a dozen contexts per frame. `TiledRenderer` instead
draws all of a process's sub-envs as tiles of one offscreen buffer in one GL context, with gymnasium's cameras,
and reads the RGB back once per vector step."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlfarm.envs.rendering import mujoco_renderer


class TiledRenderer:
    """MuJoCo sub-envs (one env id) drawn as tiles of one offscreen buffer in one GL context: per vector step one
    scene update and draw per sub-env, then one read of the RGB pixels (no depth) for all of them.

    The cameras are those gymnasium's OffScreenViewer sets up (`_gymnasium_camera`), created at the first render
    as gymnasium creates its viewer, so the frames are the per-env path's. One MjrContext (textures, meshes)
    serves every sub-env: their models are separate objects of equal content, built from the same env id."""

    def __init__(self, envs: list[gym.Env], size: int):
        import mujoco

        self.mujoco, self.size = mujoco, size
        self.models = [env.unwrapped.model for env in envs]
        self.datas = [env.unwrapped.data for env in envs]
        self.renderers = [mujoco_renderer(env) for env in envs]
        _check_same_layout(self.models)
        self.columns = int(np.ceil(np.sqrt(len(envs))))
        tile_rows = -(-len(envs) // self.columns)
        width, height = self.columns * size, tile_rows * size
        model = self.models[0]
        # The offscreen buffer is sized from the model when the MjrContext is made.
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        # The context is current only while in use (as_current): a threaded Ray actor builds its env on one
        # thread and steps it on another, and EGL refuses a context still current on a different thread.
        self.gl = mujoco.GLContext(width, height)
        with self.gl.as_current():
            self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        first = self.renderers[0]
        self.scene = mujoco.MjvScene(model, first.max_geom)  # filled and drawn per sub-env in turn
        self.option, self.perturb = mujoco.MjvOption(), mujoco.MjvPerturb()
        for flag, value in first._vopt.items():
            self.option.flags[flag] = value
        self.cameras: list | None = None
        self.viewport = mujoco.MjrRect(0, 0, width, height)
        self.pixels = np.empty((height, width, 3), np.uint8)

    def render(self, frames: np.ndarray) -> None:
        """Write frames [count, size, size, 3] of the sub-envs' current states."""
        mujoco, size = self.mujoco, self.size
        if self.cameras is None:
            self.cameras = [_gymnasium_camera(r, m, d) for r, m, d in zip(self.renderers, self.models, self.datas)]
        with self.gl.as_current():
            for j, (model, data, camera) in enumerate(zip(self.models, self.datas, self.cameras)):
                mujoco.mjv_updateScene(model, data, self.option, self.perturb, camera, mujoco.mjtCatBit.mjCAT_ALL,
                                       self.scene)
                mujoco.mjr_render(mujoco.MjrRect(*self._origin(j), size, size), self.scene, self.context)
            mujoco.mjr_readPixels(self.pixels, None, self.viewport, self.context)
        for j in range(len(frames)):
            x, y = self._origin(j)
            frames[j] = self.pixels[y : y + size, x : x + size][::-1]  # OpenGL's rows go bottom-up

    def _origin(self, j: int) -> tuple[int, int]:
        """Bottom-left pixel of tile j."""
        return (j % self.columns) * self.size, (j // self.columns) * self.size

    def close(self) -> None:
        with self.gl.as_current():
            self.context.free()
        self.gl.free()


def _gymnasium_camera(renderer, model, data):
    """The MjvCamera gymnasium's MujocoRenderer renders an env's rgb_array frames with: OffScreenViewer's free
    camera looking at the median geom position, then the env's default_camera_config, then its camera id."""
    import mujoco

    camera = mujoco.MjvCamera()
    camera.type, camera.fixedcamid = mujoco.mjtCamera.mjCAMERA_FREE, -1
    camera.lookat[:] = np.median(data.geom_xpos, axis=0)
    camera.distance = model.stat.extent
    for key, value in (renderer.default_cam_config or {}).items():
        if isinstance(value, np.ndarray):
            getattr(camera, key)[:] = value
        else:
            setattr(camera, key, value)
    if renderer.camera_id is not None:
        fixed = renderer.camera_id != -1
        camera.type = mujoco.mjtCamera.mjCAMERA_FIXED if fixed else mujoco.mjtCamera.mjCAMERA_FREE
        camera.fixedcamid = renderer.camera_id
    return camera


def _check_same_layout(models: list) -> None:
    """One MjrContext draws every model: they must be the same model (one env id and kwargs)."""
    fields = ("nbody", "ngeom", "nmesh", "nmat", "ntex", "nskin", "nflex", "ncam", "nlight", "nhfield")
    first = {field: getattr(models[0], field) for field in fields}
    for model in models[1:]:
        other = {field: getattr(model, field) for field in fields}
        if other != first:
            raise ValueError(f"batch_render needs sub-envs of one model layout: {first} vs {other}")
