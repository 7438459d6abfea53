"""The on-policy roles synced by broadcast (gloo between CPU actors here; NCCL when both hold a GPU): after
each sync the engine holds exactly the learner's weights and version."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.roles.llm import EngineRole, LMLearner, TextLabeler


def weights(role, attribute: str):
    return role.__ray_call__.remote(lambda self: {name: t.detach().cpu().clone() for name, t in
                                                  getattr(self, attribute).model.named_parameters()})


def test_broadcast_sync_gives_the_engine_the_learners_weights_each_round(ray_cpu):
    ray = ray_cpu
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, seed=0)
    learner = ray.remote(LMLearner).remote(cfg)
    engine = ray.remote(EngineRole).remote(GRPOConfig(prompts_per_step=4, group_size=4, seed=7))  # other weights
    scorer = ray.remote(TextLabeler).remote(cfg)
    address = ray.get(learner.open_sync.remote("broadcast"))
    ray.get([learner.join_sync.remote(), engine.open_sync.remote("broadcast", address)])
    assert ray.get([learner.device.remote(), engine.device.remote()]) == ["cpu", "cpu"]
    before = ray.get(weights(engine, "engine"))
    for round_ in (1, 2):
        generated = engine.generate.remote()
        metrics = ray.get(learner.update.remote(generated, scorer.score.remote(generated)))
        assert np.isfinite(metrics["reward"])
        published = learner.publish.remote()
        assert ray.get(engine.receive.remote([published])) == round_
        learned = ray.get(learner.__ray_call__.remote(lambda self: {name: t.detach().cpu().clone() for name, t in
                                                                    self.model.named_parameters()}))
        synced = ray.get(weights(engine, "engine"))
        assert set(synced) == set(learned)
        assert all(torch.equal(synced[name], learned[name]) for name in learned)
    assert not all(torch.equal(before[name], synced[name]) for name in synced)
    rollout, _ = ray.get(engine.generate.remote())
    assert rollout.weight_version == 2


@pytest.mark.slow
def test_grpo_loop_runs_with_broadcast_sync_to_two_engines_generating_ahead(tmp_path):
    """One broadcast group (learner + 2 engines, gloo here) and asynchronous rollouts: the learner's publish waits
    for the engines to finish the step they are generating, and each step is trained on one version late."""
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "rlfarm.cli", "train", "experiment=grpo_digits", f"hydra.run.dir={run_dir}",
                          "run.live=false", "algo.max_updates=4", "algo.prompts_per_step=4", "algo.weight_sync=broadcast",
                          "topology.roles.engine.count=2", "algo.max_staleness=1", "ray.num_cpus=4"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "weight sync learner → 2 engine(s): broadcast" in out.stdout + out.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["staleness"] for row in rows] == [0, 1, 1, 1]
