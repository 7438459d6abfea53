"""The random streams a resume must continue, as plain values a checkpoint holds (`torch.load(weights_only=True)`
reads them back): an engine role's prompt stream (its task's numpy generator) and its sampling stream (the engine's
torch generator, which gives each call its noise seed, `rlfarm.engines.noise`); and a learner's torch generators
(its minibatch permutation draws from them). Restored, a resumed run draws what the uninterrupted run drew next, so
with no rollout in flight at the checkpoint (`algo.max_staleness=0`) its updates are the uninterrupted run's."""
from __future__ import annotations

import numpy as np
import torch


def _prompt_rng(task) -> np.random.Generator:
    """The generator a task draws its prompts from: a digit task's own, or its prompt file's."""
    return getattr(task, "dataset", task)._rng


def engine_streams(task, engine) -> dict:
    """{"prompts": the task's generator state, "sampling": the engine's generator state}."""
    return {"prompts": _prompt_rng(task).bit_generator.state, "sampling": engine.sampling_state()}


def set_engine_streams(task, engine, streams: int | dict) -> None:
    """New streams from a seed (as a task and an engine built with it draw), or both continued from what
    `engine_streams` returned."""
    if isinstance(streams, dict):
        _prompt_rng(task).bit_generator.state = streams["prompts"]
        engine.set_sampling_state(streams["sampling"])
    else:
        _prompt_rng(task).bit_generator.state = np.random.default_rng(streams).bit_generator.state
        engine.reseed(streams)


def torch_streams(device: torch.device | str) -> dict:
    """The process's torch generators: the CPU one, and the CUDA one of `device` when it is a GPU."""
    device = torch.device(device)
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_torch_streams(streams: dict | None, device: torch.device | str) -> None:
    """Continue what `torch_streams` returned (None: a checkpoint written without them, nothing to restore)."""
    if streams is None:
        return
    device = torch.device(device)
    torch.set_rng_state(streams["cpu"])
    if device.type == "cuda" and streams.get("cuda") is not None:
        torch.cuda.set_rng_state(streams["cuda"], device)
