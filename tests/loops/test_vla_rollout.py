"""The VLA rollout worker and learner in one process (no Ray): GRPO groups, exact logprobs, pipelining."""
import numpy as np
import pytest
import torch

pytest.importorskip("sapien", reason="SAPIEN is an optional extra: pip install -e .[sim]")

from rlfarm.algos.vla import VLAConfig, group_signal  # noqa: E402
from rlfarm.roles.vla import VLALearner, VLARolloutWorker  # noqa: E402

CFG = VLAConfig(groups_per_update=2, group_size=4, model={"width": 32}, seed=3)


@pytest.fixture(scope="module")
def worker():
    worker = VLARolloutWorker(CFG, groups=2)
    yield worker
    worker.close()


def test_groups_share_their_initial_state_and_instruction(worker):
    batch, stats = worker.collect(seeds=[11, 12])
    first = batch["image"][:, 0]
    words = batch["words"][:, 0]
    for group in (slice(0, 4), slice(4, 8)):
        assert (first[group] == first[group][:1]).all() and (words[group] == words[group][:1]).all()
    assert not (first[0] == first[4]).all() or not (words[0] == words[4]).all()
    assert batch["called"][:, 0].all() and batch["tokens"].shape == (8, 4, 8) and batch["tokens"].max() < 256
    # an episode's calls are a prefix, and its steps fit them: K per call, fewer only in the last call
    calls = batch["called"].sum(1)
    assert (batch["called"] == (np.arange(4) < calls[:, None])).all()
    assert ((batch["steps"] > 4 * (calls - 1)) & (batch["steps"] <= 4 * calls)).all()
    assert ((batch["success"] == 1) | (batch["steps"] == 16)).all()  # an episode ends by success or time limit
    assert stats["episodes"] == 8 and stats["env_steps"] == batch["steps"].sum()


def test_rollout_logprobs_equal_the_learners(worker):
    learner = VLALearner(CFG)
    with torch.no_grad():  # move away from the uniform start so that the comparison means something
        for p in learner.model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    worker.receive_weights(learner.publish())
    batch, _ = worker.collect(seeds=[5, 6])
    rows = batch["called"]
    model = learner.model
    image, words, proprio = (torch.as_tensor(batch[k][rows]) for k in ("image", "words", "proprio"))
    recomputed = model.token_logprobs(image, words, proprio, torch.as_tensor(batch["tokens"][rows]), CFG.temperature)
    old = torch.as_tensor(batch["logprobs"][rows])
    assert (recomputed - old).abs().max() < 1e-4 and old.std() > 0.01


def test_under_lora_the_learner_sends_only_adapters_and_the_worker_then_matches_it(tmp_path):
    """An HF VLA with LoRA: the sync carries the adapters only, and they are all the worker needs to agree."""
    from rlfarm.models.lm_factory import save_random_llava

    cfg = VLAConfig(groups_per_update=1, group_size=2, seed=3, model={
        "source": str(save_random_llava(tmp_path / "llava")),
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}})
    learner, worker = VLALearner(cfg), VLARolloutWorker(cfg, groups=1)
    try:
        with torch.no_grad():  # LoRA's B starts at zero: move the adapters so that syncing them matters
            for name, p in learner.model.named_parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.5)
        (state,), version = learner.publish()
        assert state and all("lora_" in name for name in state) and version == 1
        assert sum(t.numel() for t in state.values()) < sum(p.numel() for p in learner.model.parameters()) / 10
        worker.receive_weights(([state], version))
        batch, _ = worker.collect(seeds=[5])
    finally:
        worker.close()
    rows = batch["called"]
    image, words, proprio = (torch.as_tensor(batch[k][rows]) for k in ("image", "words", "proprio"))
    with torch.no_grad():
        recomputed = learner.model.token_logprobs(image, words, proprio, torch.as_tensor(batch["tokens"][rows]),
                                                  cfg.temperature)
    assert (recomputed - torch.as_tensor(batch["logprobs"][rows])).abs().max() < 1e-4
    with pytest.raises(KeyError, match="no tensor"):
        worker.receive_weights(([{"not_a_weight": torch.zeros(1)}], version + 1))


@pytest.mark.parametrize("pipeline", [True, False])
def test_breakdown_is_reported(pipeline):
    worker = VLARolloutWorker(VLAConfig(groups_per_update=2, group_size=4, model={"width": 32}, pipeline=pipeline),
                              groups=2)
    _, stats = worker.collect(seeds=[1, 2])
    worker.close()
    assert stats["env_s"] > 0 and stats["infer_s"] > 0 and stats["overlap_s"] >= 0
    assert stats["env_s"] + stats["infer_s"] - stats["overlap_s"] <= stats["rollout_s"] + 1e-6
    # pipelined: two env groups take turns, so twice the inference calls of the sequential loop per env step
    assert stats["inference_calls"] >= (5 if pipeline else 1)


def test_dynamic_sampling_keeps_groups_strictly_inside_the_bounds():
    success = np.array([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0], np.float32)  # 0, 0.25, 1, 0.75
    advantages, keep = group_signal(success, VLAConfig(group_size=4))
    assert keep.tolist() == [False, True, False, True]
    assert advantages[:4].abs().max() == 0 and advantages[4] > 0 > advantages[5]
    _, keep = group_signal(success, VLAConfig(group_size=4, accuracy_low=0.3, accuracy_high=0.9))
    assert keep.tolist() == [False, False, False, True]


def test_learner_updates_only_on_groups_with_signal():
    learner, worker = VLALearner(CFG), VLARolloutWorker(CFG, groups=2)  # a fresh pair: both at version 0
    assert worker.receive_weights(learner.publish()) == 1
    batch, _ = worker.collect(seeds=[21, 22])
    worker.close()
    before = [p.detach().clone() for p in learner.model.parameters()]
    batch["success"] = np.zeros(8, np.float32)  # no signal anywhere: no step
    metrics = learner.update(batch)
    stats = learner.stats()  # what the driver's deadline on an update asks (from the learner's watch thread)
    assert stats["updates"] == 1 and stats["policy_version"] == 1 and stats["stage_s"]["update"] > 0
    assert metrics["kept_groups"] == 0 and "loss" not in metrics
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    batch["success"] = np.array([1, 0, 0, 0, 1, 1, 1, 1], np.float32)  # group 0 has signal, group 1 none
    metrics = learner.update(batch)
    assert metrics["kept_groups"] == 0.5 and metrics["policy_calls"] == batch["called"][:4].sum()
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    # the winner's tokens became more likely, the losers' less likely
    rows = torch.as_tensor(batch["called"][:4])
    fields = [torch.as_tensor(batch[k][:4][rows]) for k in ("image", "words", "proprio", "tokens")]
    after = learner.model.token_logprobs(*fields, temperature=CFG.temperature).sum(1)
    owner = torch.arange(4)[:, None].expand(4, 4)[rows]
    old = torch.as_tensor(batch["logprobs"][:4][rows]).sum(1)
    assert (after - old)[owner == 0].mean() > 0 > (after - old)[owner != 0].mean()


def test_the_inference_server_batches_concurrent_calls_and_its_logprobs_equal_the_learners(worker):
    """Two workers' calls arriving together are one forward; what the server sampled, with the learner's published
    weights, has the log-probs the learner recomputes; every answer names the weight version that sampled it."""
    import threading

    from rlfarm.roles.vla_server import VLAInferenceServer

    learner = VLALearner(CFG)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    server = VLAInferenceServer(CFG, worker.shapes(), max_batch=8, max_wait_ms=5000)  # fires at 8 observations
    assert server.receive_weights(learner.publish()) == 1
    batch, _ = worker.collect(seeds=[5, 6])
    calls = [tuple(batch[k][part, 0] for k in ("image", "words", "proprio")) for part in (slice(0, 4), slice(4, 8))]
    answers = [None, None]

    def ask(i):
        answers[i] = server.sample(*calls[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stats = server.stats()
    assert stats["batches"] == 1 and stats["requests"] == 2 and stats["observations"] == 8  # 4 + 4 obs: one forward
    for (image, words, proprio), (tokens, logprobs, version) in zip(calls, answers):
        assert version == 1 and tokens.shape == (4, 8)
        recomputed = learner.model.token_logprobs(torch.as_tensor(image), torch.as_tensor(words),
                                                  torch.as_tensor(proprio), torch.as_tensor(tokens), CFG.temperature)
        assert (recomputed - torch.as_tensor(logprobs)).abs().max() < 1e-4


def test_stats_mid_rollout_say_how_long_the_rollout_has_not_moved(worker):
    """What the driver's deadline on a hung worker reads (`stalled_s`, answered from the actor's watch thread while
    collect runs): it grows while an env step hangs, and is 0 again once the rollout is over."""
    import threading
    import time

    release, entered = threading.Event(), threading.Event()
    env = worker.envs[5]
    real_step = env.step

    def hanging_step(action):
        entered.set()
        release.wait(30)
        return real_step(action)

    env.step = hanging_step
    try:
        rollout = threading.Thread(target=worker.collect, args=([11, 12],))
        rollout.start()
        assert entered.wait(30)
        time.sleep(0.5)
        hung = worker.stats()
        assert hung["stalled_s"] >= 0.4 and not hung["in_server_call"], hung
        release.set()
        rollout.join(30)
        assert not rollout.is_alive()
    finally:
        release.set()
        del env.step  # the env's own step again
    done = worker.stats()
    assert done["stalled_s"] == 0.0 and done["warm"], done
