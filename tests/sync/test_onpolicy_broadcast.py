"""The on-policy roles synced by broadcast (gloo between CPU actors here; NCCL when both hold a GPU): after
each sync the engine holds exactly the learner's weights and version."""
import numpy as np
import torch

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.loops.deadlines import WATCH
from rlfarm.roles.llm import EngineRole, LMLearner, TextLabeler


def weights(role, attribute: str):
    return role.__ray_call__.remote(lambda self: {name: t.detach().cpu().clone() for name, t in
                                                  getattr(self, attribute).model.named_parameters()})


def test_broadcast_sync_gives_the_engine_the_learners_weights_each_round(ray_cpu):
    ray = ray_cpu
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, seed=0)
    learner = ray.remote(concurrency_groups=WATCH)(LMLearner).remote(cfg)
    engine = ray.remote(concurrency_groups=WATCH)(EngineRole).remote(GRPOConfig(prompts_per_step=4, group_size=4, seed=7))  # other weights
    scorer = ray.remote(concurrency_groups=WATCH)(TextLabeler).remote(cfg)
    address = ray.get(learner.open_sync.remote("broadcast"))
    ray.get([learner.join_sync.remote(), engine.open_sync.remote("broadcast", address)])
    assert ray.get([learner.device.remote(), engine.device.remote()]) == ["cpu", "cpu"]
    before = ray.get(weights(engine, "engine"))
    for round_ in (1, 2):
        generated = engine.generate.remote()
        metrics = ray.get(learner.update.remote(generated, scorer.score.remote(generated)))
        assert np.isfinite(metrics["reward"])
        published = learner.publish.remote()
        assert ray.get(engine.receive_weights.remote([published])) == round_
        learned = ray.get(learner.__ray_call__.remote(lambda self: {name: t.detach().cpu().clone() for name, t in
                                                                    self.model.named_parameters()}))
        synced = ray.get(weights(engine, "engine"))
        assert set(synced) == set(learned)
        assert all(torch.equal(synced[name], learned[name]) for name in learned)
    assert not all(torch.equal(before[name], synced[name]) for name in synced)
    rollout, _ = ray.get(engine.generate.remote())
    assert rollout.weight_version == 2
