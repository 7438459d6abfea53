"""The on-policy roles synced by broadcast (gloo between CPU actors here; NCCL when both hold a GPU): after
each sync the engine holds exactly the learner's weights and version."""
import time

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


def test_a_broadcast_enters_a_generation_in_flight_between_decode_steps(ray_cpu):
    """Partial rollouts: `receive_weights` in the engine's "sync" thread meets the learner's broadcast while a long
    generation runs; every sample's tokens start under the old version and end under the new one."""
    ray = ray_cpu
    cfg = GRPOConfig(prompts_per_step=4, group_size=2, max_new_tokens=400, seed=0)
    learner = ray.remote(concurrency_groups=WATCH)(LMLearner).remote(cfg)
    engine = ray.remote(concurrency_groups={**WATCH, "sync": 1})(EngineRole).remote(
        cfg, engine={"synthetic_lengths": {"median_frac": 0.99, "p99_frac": 1.0}})  # every sample near the cap
    address = ray.get(learner.open_sync.remote("broadcast"))
    ray.get([learner.join_sync.remote(), engine.open_sync.remote("broadcast", address)])
    generated, _ = engine.generate_with_stats.options(num_returns=2).remote()
    # a few blocks of decode steps in (a sync that came before the first pause point would precede every token)
    pauses = engine.__ray_call__.options(concurrency_group="watch")
    while ray.get(pauses.remote(lambda self: self.engine.pauses)) < 3:
        time.sleep(0.01)
    published = learner.publish.remote()
    assert ray.get(engine.receive_weights.options(concurrency_group="sync").remote([published])) == 1
    rollout, _ = ray.get(generated)
    valid = rollout.response_mask.bool()
    last = valid.sum(dim=1) - 1
    versions = rollout.token_versions
    assert rollout.weight_version == 0 and (versions[:, 0] == 0).all()
    assert (versions.gather(1, last[:, None]) == 1).all()  # the swap landed mid-generation, in every sample
    assert ((versions[:, 1:] >= versions[:, :-1]) | ~valid[:, 1:]).all()  # one swap: old, then new
