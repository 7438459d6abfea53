"""Any torch module or file that maps frames to rewards: the hook for users' own VLMs and learned rewards.

One of three (conf/reward/model.yaml):
- `module`: a Hydra `_target_` node (reward.module._target_=my_rewards.BarReward, its arguments with
  +reward.module.<arg>=...), built in the labeler on its device, optionally loading a state_dict from `checkpoint`;
- `model`: a TorchScript file (torch.jit.save), or a fitted-reward file written by `rlfarm fit-reward` (it names
  its module, frame size and weights: rlfarm/rewards/fitted.py);
- `checkpoint` alone: a TorchScript file (the older spelling of `model`).
The module is called with one tensor per key in `needs`, in that order, each on the labeler's device with its numpy
dtype kept (frames: [n, H, W, 3] uint8), and must return [n] or [n, 1] finite floating-point rewards: `setup`
checks that on a probe batch of frames before the first bus (`probe`), and the driver does once before any role
starts (rlfarm/config/probes.py).
"""

import os
import zipfile

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlfarm.rewards.base import OnDevice, Pending, RewardModel, RewardModelError
from rlfarm.rewards.staging import StagedUpload, as_parts, sub_batches
from rlfarm.rewards.fitted import build_fitted, read_fitted

NOTHING_CHOSEN = ("reward=model names no reward model; set reward.module._target_=<module.Class> (a torch module) "
                  "or reward.model=<a TorchScript file, or one from rlfarm fit-reward>")
PROBE_SIZE = 2  # frames in the probe batch


def is_torchscript(path: str) -> bool:
    """Whether `path` is an archive torch.jit.save wrote (it holds code/ and constants.pkl; torch.save's do not)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/constants.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


class BrightnessReward(torch.nn.Module):
    """Example reward module: scale · mean pixel brightness. frames [n, H, W, 3] uint8 → [n] in [0, scale]."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(float(scale)))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.scale * frames.float().mean(dim=(1, 2, 3)) / 255


class ModuleReward(RewardModel):
    """Rewards from a user's torch module.

    model: a TorchScript file, or a fitted-reward file (rlfarm fit-reward), which supplies the module, weights and
        frame size.
    module: Hydra node with `_target_` building an nn.Module (built in setup, on the labeler's device); a node
        whose `_target_` is null is none.
    checkpoint: state_dict for `module` (torch.load, weights_only), or a TorchScript file when module is None.
    frame_size: frames the runners render (used only when "frames" is in needs).
    needs: chunk keys passed to the module as positional tensors.
    dtype: autocast dtype on CUDA; CPU runs float32.
    max_batch: transitions per forward pass.
    """

    def __init__(
        self,
        module: dict | None = None,
        checkpoint: str | None = None,
        frame_size: int = 84,
        needs: list[str] | tuple[str, ...] = ("frames",),
        dtype: str = "bfloat16",
        max_batch: int = 512,
        model: str | None = None,
    ):
        self.model = model
        if module is not None and module.get("_target_") is None:
            module = None  # conf/reward/model.yaml's empty node: no module chosen
        if model is not None and (checkpoint is not None or module is not None):
            raise RewardModelError("reward=model names several models; set one of reward.model (a file), "
                                   "reward.module._target_ or reward.checkpoint")
        if model is not None and is_torchscript(model):
            model, checkpoint = None, model  # a TorchScript file: built as reward.checkpoint alone is
        elif model is not None:
            fitted = read_fitted(model)  # small: a head or a small CNN; the driver needs its frame size
            module, frame_size, needs = fitted["module"], fitted["frame_size"], ("frames",)
            self.frame_stack = int(fitted.get("frame_stack", 1))
        elif module is None and checkpoint is None:
            raise RewardModelError(NOTHING_CHOSEN)
        self.model = model
        # A plain dict pickles small and free of the parent config when Ray ships this object to labelers.
        self.module = OmegaConf.to_container(module, resolve=True) if isinstance(module, DictConfig) else module
        self.checkpoint = checkpoint
        self.needs = tuple(needs)
        self.takes_parts = self.needs  # every input goes through StagedUpload: one host copy, from the chunks
        self.frame_size = frame_size if "frames" in self.needs else None
        self.dtype = dtype
        self.max_batch = max_batch
        self.name = model or (self.module.get("_target_", "<no _target_>") if module is not None else checkpoint)
        self._net = None

    def setup(self, device: str) -> None:
        self._device = torch.device(device)
        self._autocast_dtype = getattr(torch, self.dtype)
        self._net = self._build().to(self._device).eval()
        self._upload = StagedUpload(self._device, self.max_batch, self.stages)
        self.probe()

    def probe(self) -> None:
        """Run the built module once on a probe batch of frames and check what it returns: [n] or [n, 1] floats.
        A module that returns anything else would have every bus quarantined; this says so in one line instead.
        (Models that read other keys than frames are checked on their first bus.)"""
        if self.needs != ("frames",):
            return
        size = self.frame_size or 84
        frames = np.random.default_rng(0).integers(0, 256, (PROBE_SIZE, size, size, 3 * self.frame_stack), np.uint8)
        with torch.inference_mode(), torch.autocast(self._device.type, dtype=self._autocast_dtype,
                                                    enabled=self._device.type == "cuda"):
            output = self._net(torch.from_numpy(frames).to(self._device))
        shape = list(output.shape) if isinstance(output, torch.Tensor) else None
        if shape not in ([PROBE_SIZE], [PROBE_SIZE, 1]) or not output.is_floating_point():
            what = f"shape {shape} ({output.dtype})" if shape is not None else f"a {type(output).__name__}"
            raise RewardModelError(
                f"reward module {self.name} returned {what} for a probe batch of frames {list(frames.shape)} uint8; "
                f"it must return [n] or [n, 1] floats, one reward per frame")

    def _build(self) -> torch.nn.Module:
        if self.model is not None:
            return build_fitted(read_fitted(self.model))
        if self.checkpoint is not None and not os.path.isfile(self.checkpoint):
            raise RewardModelError(
                f"reward module {self.name}: no checkpoint at {self.checkpoint!r}; set reward.checkpoint=/path/to/file"
            )
        if self.module is None:
            if not is_torchscript(self.checkpoint):
                raise RewardModelError(f"reward module {self.name} is not a TorchScript file; write one with "
                                       "torch.jit.save(torch.jit.script(module), path), or set "
                                       "reward.module._target_=<module.Class> for a state_dict")
            return torch.jit.load(self.checkpoint, map_location="cpu")
        net = instantiate(self.module)
        if self.checkpoint is not None:
            net.load_state_dict(torch.load(self.checkpoint, map_location="cpu", weights_only=True))
        return net

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return self.start(batch).result()

    @torch.inference_mode()
    def start(self, batch: dict[str, np.ndarray]) -> Pending:
        """Queue every sub-batch on the device (inputs through `StagedUpload`) and return without waiting (on CUDA):
        the labeler gathers its next bus meanwhile. Non-finite rewards raise when the result is taken."""
        if self._net is None:
            raise RewardModelError(f"reward module {self.name}: setup(device) must run before labeling")
        columns = [list(sub_batches(as_parts(batch[key]), self.max_batch)) for key in self.needs]
        rewards = []
        for index, pieces in enumerate(zip(*columns)):
            inputs = [self._upload(piece, key, index % 2) for key, piece in zip(self.needs, pieces)]
            with torch.autocast(self._device.type, dtype=self._autocast_dtype, enabled=self._device.type == "cuda"):
                output = self._net(*inputs)
            rewards.append(self._shaped(output, len(inputs[0])))
        rewards = torch.cat(rewards)
        return _Finite(OnDevice(rewards) if rewards.is_cuda else Pending(rewards.numpy()), self.name)

    def _shaped(self, output, n: int) -> torch.Tensor:
        """output [n] or [n, 1] → [n] float32, or RewardModelError naming the module."""
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        if shape not in ((n,), (n, 1)):
            raise RewardModelError(f"reward module {self.name} returned {shape} for {n} inputs; expected [n] or [n, 1]")
        return output.reshape(n).float()


class _Finite(Pending):
    """A module's rewards, checked for NaN/inf when taken (checking on the device would wait for it)."""

    def __init__(self, inner: Pending, name: str):
        self.inner, self.name = inner, name

    def ready(self) -> bool:
        return self.inner.ready()

    def result(self) -> np.ndarray:
        rewards = self.inner.result()
        bad = int((~np.isfinite(rewards)).sum())
        if bad:
            raise RewardModelError(f"reward module {self.name} returned {bad} NaN/inf rewards out of {len(rewards)}")
        return rewards
