"""Where runners render (issue 36, item 1): off the learner's GPU by default where the topology leaves a GPU
without one, the user's `env.render_gpus` kept with one warning line when it shares a learner's GPU, and the same
layout shown by `rlfarm plan`."""
import logging
import os

import pytest

from helpers import placement_probe
from rlfarm.commands.plan import render_column
from rlfarm.config import compose
from rlfarm.envs.rendering import spread_rendering
from rlfarm.families import OFFPOLICY
from rlfarm.topology import PlacedTopology, plan_topology, render_gpus_beside, render_layout, role_gpu_ids


def test_unset_render_gpus_default_to_the_gpus_without_a_learner():
    assert render_layout(None, 4, {0}) == ([1, 2, 3], None)  # split_1_3
    assert render_layout(None, 4, {0, 1}) == ([2, 3], None)  # two learner ranks (split_2_2)
    assert render_layout(None, 1, {0}) == (None, None)  # colocated: every GPU holds the learner, all render
    assert render_layout(None, 4, set()) == (None, None)  # a learner on CPU


def test_render_gpus_on_a_learner_gpu_are_kept_with_one_warning_line():
    gpus, warning = render_layout([0], 4, {0})
    assert gpus == [0]
    assert "\n" not in warning and "env.render_gpus=[0]" in warning and "GPU 0" in warning
    assert warning.endswith("leave env.render_gpus unset to render on GPUs 1,2,3")
    assert render_layout([1, 2], 4, {0}) == ([1, 2], None)
    assert render_layout([0], 1, {0}) == ([0], None)  # no GPU without a learner: nothing better to suggest


def test_render_gpus_on_the_learner_gpu_beside_gpu_labelers_say_what_the_trade_buys():
    """Where the GPUs it spares hold the labelers, rendering on the learner's GPU keeps the renderers off the farm's
    (split_1_1, CLIP: 1.07x the bare tower against 0.82x): the line says both sides and when it pays."""
    gpus, warning = render_layout([0], 2, {0}, labeler_gpus={1})
    assert gpus == [0] and "\n" not in warning
    assert "learner's GPU 0, which slows its updates" in warning and "labelers' GPU 1:" in warning
    assert "reward model sets the pace" in warning and warning.endswith("unset, runners render on GPU 1")
    _, warning = render_layout([0], 4, {0}, labeler_gpus={1, 2})  # only the labelers' GPUs are named as spared
    assert "labelers' GPUs 1,2:" in warning and warning.endswith("unset, runners render on GPUs 1,2,3")
    _, warning = render_layout([0, 1], 2, {0}, labeler_gpus={1})  # renders beside the labelers too: spares nothing
    assert "labelers'" not in warning and warning.endswith("leave env.render_gpus unset to render on GPU 1")
    assert render_layout(None, 2, {0}, labeler_gpus={1}) == ([1], None)  # the default is unchanged


def test_a_node_without_nvidia_devices_renders_in_software_whatever_render_gpus_says(monkeypatch):
    if any(name.startswith("nvidia") and name[6:].isdigit() for name in os.listdir("/dev")):
        pytest.skip("a machine with NVIDIA devices")
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.delenv("MUJOCO_EGL_DEVICE_ID", raising=False)
    spread_rendering(1, [1, 2, 3])  # the default a run on declared GPUs hands its runners
    assert "MUJOCO_EGL_DEVICE_ID" not in os.environ


def test_the_learner_probe_finds_the_gpu_the_learner_gets_and_plan_shows_runners_elsewhere(ray_cpu, caplog):
    """split_1_3 on 4 declared GPUs: the probe reads the learner bundle's GPU before the learner starts; an actor
    placed as the learner afterwards holds that GPU; runners render on the other three, as `rlfarm plan` shows."""
    ray = ray_cpu
    plan = plan_topology(compose("train", ["topology=split_1_3"]).topology, OFFPOLICY)
    placed = PlacedTopology(plan)
    try:
        probed = role_gpu_ids(placed, timeout_s=60)
        assert len(probed) == 1
        learner = ray.remote(placement_probe()).options(**placed.options(plan.of("learner")[0])).remote()
        assert {int(gpu) for gpu in ray.get(learner.where.remote())["gpu_ids"]} == probed
    finally:
        placed.remove()
    free = sorted({0, 1, 2, 3} - probed)
    assert render_gpus_beside(None, probed) == (free, None)
    rows = [{"role": "learner", "index": 0, "gpu_ids": [str(gpu) for gpu in probed]},
            *({"role": "env_runner", "index": i, "gpu_ids": []} for i in range(4)),
            {"role": "labeler", "index": 0, "gpu_ids": [str(free[0])]}]
    assert render_column(None, rows) == ["-", *(f"GPU {free[i % 3]}" for i in range(4)), "-"]
    with caplog.at_level(logging.WARNING, logger="rlfarm"):
        on_learner = render_column(sorted(probed), rows)  # env.render_gpus=[<the learner's GPU>]
    assert on_learner[1:5] == [f"GPU {min(probed)}"] * 4
    warned = [record.getMessage() for record in caplog.records if "env.render_gpus" in record.getMessage()]
    assert warned and all(f"labelers' GPU {free[0]}:" in message for message in warned)  # the labeler's GPU only
